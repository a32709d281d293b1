"""MiA-RAG over a real collection: Eq. 4 as one search, the two graphs end to end, bad questions.

(a) E2's single interpolated vector search must rank exactly like scoring Eq. 4 over every chunk
    vector of the collection (the reason the design searches the whole collection, not the K0 pool).
(b) Both question graphs answer from the embedded models and cite the book holding the answer.
(c) Bad questions and settings end as one line naming the problem and the fix, exit code 2.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from mia.nodes.context import MiaRagSettings, RagSettings
from mia.nodes.signature_init import select_signature
from mia.nodes.retrieval import Fusion, dual_signal, query_only, signature_ranking, signature_vector
from mia.stores.chroma import MindscapeError
from mia.stores.units import Level
from tests.conftest import requires_data, story_text, write_stories

pytestmark = requires_data

QUESTIONS = (
    "What did the little old grey man ask the eldest son for?",
    "Why did the fox trick the wolf?",
    "Who stole the lovely Rose-Red?",
)
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _all_chunks(store: Any) -> tuple[list[str], np.ndarray]:
    got = store.chunks.get(include=["embeddings"])
    return list(got["ids"]), np.asarray(got["embeddings"], dtype=np.float64)


def _signature(store: Any, embedder: Any, question: str, strategy: str = "centroid") -> tuple[np.ndarray, np.ndarray]:
    """The query vector and e_σ exactly as the mia_rag graph builds them (coverage-aware σ0)."""
    ctx = MiaRagSettings(collection=store.name, signature_init="coverage")
    query_vec = embedder.embed_query(question)
    step0 = query_only(store, query_vec, ctx.k0)
    picks = select_signature(store, question, query_vec, step0, ctx)
    assert len(picks) == ctx.k_sum
    return query_vec, signature_vector(strategy, store, embedder, question, [p["id"] for p in picks])


def _exact_ranking(ids: list[str], vectors: np.ndarray, query_vec: np.ndarray, sig_vec: np.ndarray, alpha: float) -> tuple[list[str], np.ndarray]:
    scores = (1.0 - alpha) * (vectors @ query_vec) + alpha * (vectors @ sig_vec)
    order = np.argsort(-scores, kind="stable")
    return [ids[i] for i in order], scores[order]


# ---------------------------------------------------------------------------------------------
# (a) one interpolated search == exact Eq. 4 over all chunks


@pytest.mark.parametrize("question", QUESTIONS)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_interpolated_search_ranks_like_exact_eq4(tiny_collection, minilm, question: str, alpha: float) -> None:
    store = tiny_collection.store
    ids, vectors = _all_chunks(store)
    query_vec, sig_vec = _signature(store, minilm, question)
    expected_ids, expected_scores = _exact_ranking(ids, vectors, query_vec, sig_vec, alpha)
    # Fewest candidates possible (k itself): the search alone must already find the exact top k.
    for k in (1, 5, 10):
        hits = dual_signal(store, query_vec, sig_vec, alpha, k=k, candidates=k)
        assert [h.id for h in hits] == expected_ids[:k]
        np.testing.assert_allclose([h.score for h in hits], expected_scores[:k], atol=1e-5)
    # The whole collection, ranked: every position agrees, not just the top.
    hits = dual_signal(store, query_vec, sig_vec, alpha, k=len(ids), candidates=1)
    assert [h.id for h in hits] == expected_ids
    for h in hits[:10]:
        i = ids.index(h.id)
        assert h.s_qry == pytest.approx(float(vectors[i] @ query_vec), abs=1e-5)
        assert h.s_sig == pytest.approx(float(vectors[i] @ sig_vec), abs=1e-5)


def test_query_only_search_is_exact(tiny_collection, minilm) -> None:
    store = tiny_collection.store
    ids, vectors = _all_chunks(store)
    query_vec = minilm.embed_query(QUESTIONS[1])
    expected_ids, expected_scores = _exact_ranking(ids, vectors, query_vec, query_vec, 0.0)
    hits = query_only(store, query_vec, len(ids))
    assert [h.id for h in hits] == expected_ids
    np.testing.assert_allclose([h.score for h in hits], expected_scores, atol=1e-5)


@pytest.mark.parametrize("graph", ["rag", "mia_rag"])
def test_graphs_retrieve_what_the_exact_scores_say(graph: str, tiny_collection, minilm, cli) -> None:
    """Through the CLI and the compiled graph (retrieval only, no LLM): the final ranking is Eq. 4
    (the centroid strategy; the trained one is checked in test_signature_head and test_hybrid)."""
    question = QUESTIONS[0]
    centroid = ["--set", "sig_strategy=centroid"] if graph == "mia_rag" else []
    result = cli("ask", question, "--collection", tiny_collection.name, "--graph", graph, "--json",
                 "--set", "retrieval_only=true", "--set", "top_k=8", "--set", "retriever=dense", *centroid)
    assert result.code == 0, result.err
    state = json.loads(result.out)
    assert state["answer"] in ("", None) and state["usage"].get("llm_calls", 0) == 0
    store = tiny_collection.store
    ids, vectors = _all_chunks(store)
    query_vec = minilm.embed_query(question)
    if graph == "rag":
        assert state["signature"] == [] and state["step0"] == []
        sig_vec, alpha = query_vec, 0.0
    else:
        assert len(state["step0"]) == min(MiaRagSettings().k0, len(ids))
        signature = [s["id"] for s in state["signature"]]
        step0_summaries = {r["summary_id"] for r in store.chunk_records([r["id"] for r in state["step0"]], documents=False)}
        assert len(signature) == MiaRagSettings().k_sum and set(signature) <= step0_summaries
        sig_vec = signature_vector("centroid", store, minilm, question, signature)
        alpha = MiaRagSettings().alpha
    expected_ids, _ = _exact_ranking(ids, vectors, query_vec, sig_vec, alpha)
    assert [r["id"] for r in state["retrieved"]] == expected_ids[:8]


def test_mia_rag_embeds_each_question_once(tiny_collection, minilm, cli, monkeypatch) -> None:
    """Step 0 and E2 both need the query vector; computing it twice would double the dominant
    cost of retrieval on a CPU (see ``mia bench retrieval``)."""
    calls: list[str] = []
    model_type = type(minilm.model)
    original = model_type.embed_query

    def counting(self: Any, text: str) -> list[float]:
        calls.append(text)
        return original(self, text)

    monkeypatch.setattr(model_type, "embed_query", counting)
    question = "Which animal did the fox meet first, and where?"
    result = cli("ask", question, "--collection", tiny_collection.name, "--graph", "mia_rag", "--json",
                 "--set", "retrieval_only=true")
    assert result.code == 0, result.err
    assert calls == [question]


class _CallLog:
    """Counts the Chroma reads made through the Mindscape instances built while it is installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from mia.stores import mindscape

        self.opened = 0
        self.calls: list[str] = []
        original = mindscape.Mindscape.__init__
        log = self

        def opening(store: Any, *args: Any, **kwargs: Any) -> None:
            original(store, *args, **kwargs)
            log.opened += 1
            log.watch(store)

        monkeypatch.setattr(mindscape.Mindscape, "__init__", opening)

    def watch(self, store: Any) -> None:
        for part in ("books", "chunks", "summaries", "texts"):
            collection = getattr(store, part)
            for method in ("get", "query", "count"):
                setattr(collection, method, self._logged(f"{part}.{method}", getattr(collection, method)))

    def _logged(self, name: str, call: Any) -> Any:
        def logged(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return call(*args, **kwargs)
        return logged


@pytest.mark.parametrize("retriever", ["hybrid", "dense"])
def test_e2_reads_nothing_on_step_zeros_snapshot(retriever: str, tiny_collection, monkeypatch) -> None:
    """E2 on the snapshot step 0 shared reads no book rows, no count and no vectors, and searches
    in memory: no Chroma call at all. Against a Chroma server each read is a round trip (`mia bench
    scale`). It ranks exactly as E2 on a fresh instance does."""
    from langgraph.runtime import Runtime

    from mia.nodes import resources
    from mia.nodes.qa import init_signature, retrieve_with_signature

    runtime = Runtime(context=MiaRagSettings(collection=tiny_collection.name, retriever=retriever))
    state: dict[str, Any] = {"question": QUESTIONS[2]}
    init_signature(state, runtime)  # builds the BM25 index, if no test did yet, outside the count
    log = _CallLog(monkeypatch)
    state |= init_signature(state, runtime)
    assert log.opened == 1 and state["snapshot"]
    step0_reads, log.calls = log.calls, []
    shared = retrieve_with_signature(state, runtime)["retrieved"]
    assert log.opened == 1, "E2 opened the collection again instead of using step 0's snapshot"
    assert log.calls == [], log.calls
    assert "books.get" in step0_reads
    e2_reads, log.calls = log.calls, []
    fresh = retrieve_with_signature({**state, "snapshot": ""}, runtime)["retrieved"]
    assert log.opened == 2 and "books.get" in log.calls and len(log.calls) > len(e2_reads), log.calls
    assert shared == fresh
    # A token this process does not hold (another worker, a resumed run) reads afresh.
    assert resources.mindscape(runtime.context, state["snapshot"]) is not None and log.opened == 2
    assert resources.mindscape(runtime.context, "not-a-token") is not None and log.opened == 3


def test_shared_snapshots_are_bounded(tiny_collection) -> None:
    """Tokens of finished runs are forgotten oldest first; a token of another collection is not used."""
    from mia.nodes import resources
    from mia.stores.mindscape import Mindscape

    ctx = RagSettings(collection=tiny_collection.name)
    tokens = [resources.share(Mindscape(tiny_collection.name)) for _ in range(resources.SHARED_SNAPSHOTS + 1)]
    assert resources.mindscape(ctx, tokens[0]) is not resources.mindscape(ctx, tokens[0])
    assert resources.mindscape(ctx, tokens[1]) is resources.mindscape(ctx, tokens[1])
    with pytest.raises(resources.MindscapeError, match="unknown collection 'other-name'"):
        resources.mindscape(RagSettings(collection="other-name"), tokens[1])


@pytest.mark.parametrize("for_signature", [False, True])
def test_searches_ask_chroma_nothing(tiny_collection, minilm, monkeypatch, for_signature: bool) -> None:
    """Once a collection's vectors are in memory, E1 reads only the book rows: the search, the
    cosines and the vectors come from memory, and the cosines equal the stored vectors' (BM25-only
    hits too)."""
    store = tiny_collection.store
    ids, vectors = _all_chunks(store)
    query_vec = minilm.embed_query(QUESTIONS[1])
    query_only(store, query_vec, 8, text=QUESTIONS[1], fusion=Fusion(), depth=10)  # vectors and BM25 into memory
    log = _CallLog(monkeypatch)
    fresh = type(store)(store.name)
    hits = query_only(fresh, query_vec, 8, text=QUESTIONS[1], fusion=Fusion(), depth=10, for_signature=for_signature)
    assert log.calls == ["books.get"], log.calls
    assert len(hits) == 8
    for h in hits:
        stored = vectors[ids.index(h.id)]
        assert h.cosine == pytest.approx(float(stored @ query_vec), abs=1e-5)
        if for_signature:
            np.testing.assert_allclose(h.vector, stored, atol=1e-6)
            assert h.summary_id


def test_dense_search_is_exact(tiny_collection, minilm, monkeypatch) -> None:
    """The search is brute force over every committed chunk: its hits' cosines are the stored
    vectors' and are the k largest of all chunks', best first, for every k; and a new instance with
    nothing in memory (as in a new process) returns the same ids in the same order."""
    from mia.stores import vector_index

    store = tiny_collection.store
    ids, vectors = _all_chunks(store)
    for question in QUESTIONS:
        query_vec = minilm.embed_query(question)
        cosine = vectors @ query_vec / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(query_vec))
        best = np.sort(cosine)[::-1]
        for k in (1, 7, len(ids), len(ids) + 5):
            hits = store.search_chunks(query_vec, k)
            assert len({h.id for h in hits}) == len(hits) == min(k, len(ids))
            assert [h.score for h in hits] == pytest.approx([float(cosine[ids.index(h.id)]) for h in hits], abs=1e-5)
            assert [h.score for h in hits] == pytest.approx(list(best[:k]), abs=1e-5)
            monkeypatch.setattr(vector_index, "_HELD", type(vector_index._HELD)())
            assert [h.id for h in hits] == [h.id for h in type(store)(store.name).search_chunks(query_vec, k)]
    assert store.search_chunks(minilm.embed_query(QUESTIONS[0]), 0) == []


def test_dense_search_breaks_ties_by_row_also_at_the_cut(monkeypatch) -> None:
    """Equal cosines (the same passage in two books) rank by row, whichever rows the cut leaves out."""
    from mia.stores.vector_index import LevelVectors, nearest

    a, b = np.array([1.0, 0.0], dtype=np.float32), np.array([0.6, 0.8], dtype=np.float32)
    matrix = np.stack([b, a, b, a, a])
    held = LevelVectors((), ["r0", "r1", "r2", "r3", "r4"], {}, matrix, np.linalg.norm(matrix, axis=1), {})
    assert [n for n, _ in nearest(held, a, 2)] == [1, 3]
    assert [n for n, _ in nearest(held, 2 * a, 4)] == [1, 3, 4, 0]
    assert [cosine for _, cosine in nearest(held, a, 5)] == pytest.approx([1, 1, 1, 0.6, 0.6])


def test_dense_search_names_a_wrong_embedder(tiny_collection) -> None:
    with pytest.raises(MindscapeError, match="384-dimensional vectors of embedder .*the query has 3"):
        tiny_collection.store.search_chunks(np.ones(3, dtype=np.float32), 5)


# ---------------------------------------------------------------------------------------------
# (b) end to end with the embedded models


@pytest.mark.slow
@pytest.mark.parametrize("graph", ["rag", "mia_rag"])
def test_graph_answers_and_cites_the_right_book(graph: str, tiny_collection, embedded_model_file, cli) -> None:
    result = cli("ask", QUESTIONS[0], "--collection", tiny_collection.name, "--graph", graph, "--json",
                 "--set", "top_k=5", "--set", "max_new_tokens=48")
    assert result.code == 0, result.err
    state = json.loads(result.out)
    assert state["answer"].strip()
    assert state["citations"], "an answer must come with its sources"
    assert {c["book"] for c in state["citations"]} == {"golden-goose"}
    for c in state["citations"]:
        text = tiny_collection.texts[c["book"]]
        assert text[c["start"] : c["end"]] == tiny_collection.store.chunk_records([c["id"]])[0]["text"]
    usage = state["usage"]
    assert usage["llm_calls"] == 1 and usage["input_tokens"] > 100 and 0 < usage["output_tokens"] <= 48


# ---------------------------------------------------------------------------------------------
# (c) bad questions and settings


def _one_error_line(result) -> str:
    assert result.code == 2, result
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mia: error: "), result.err
    return lines[0]


@pytest.mark.parametrize("question", ["", "   \n\t"])
@pytest.mark.parametrize("graph", ["rag", "mia_rag"])
def test_empty_question(question: str, graph: str, tiny_collection, cli) -> None:
    line = _one_error_line(cli("ask", question, "--collection", tiny_collection.name, "--graph", graph))
    assert "empty question" in line and "non-empty `question`" in line


@pytest.mark.parametrize("graph", ["rag", "mia_rag"])
def test_unknown_collection(graph: str, tiny_collection, cli) -> None:
    line = _one_error_line(cli("ask", QUESTIONS[0], "--collection", "no-such-shelf", "--graph", graph))
    assert "unknown collection 'no-such-shelf'" in line and tiny_collection.name in line
    assert "`mia ingest PATH --collection no-such-shelf`" in line


def test_two_levels_offer_book_units_that_e2_leaves_to_the_reader(tmp_path, minilm, tiny_collection, cli) -> None:
    """signature_levels=sessions+books: ingestion gives each book a unit (its card as text, embedded
    by the collection's embedder, kept out of the session matrix); step-0 chunks are covered by their
    session and their book's unit; E2 ranks by the signature's sessions alone. A collection without
    units (ingested without cards) is refused with the fix."""
    from mia.stores.book_card import BookCard
    from mia.stores.mindscape import Mindscape

    paths = write_stories(tmp_path / "stories")
    assert cli("ingest", *map(str, paths), "--collection", "two-levels", "--cards", "names", "--quiet").code == 0
    store = Mindscape("two-levels")
    books = store.commits.ordered()
    units = store.book_units(books)
    assert sorted(units) == sorted(books)
    unit = units[books[0]]
    card = BookCard.from_json(unit.card).text()
    assert unit.text == card  # the card's one rendering is what the unit holds
    record = store.summary_records([unit.id])[0]
    assert (record["text"], record["level"]) == (card, Level.BOOK)
    np.testing.assert_allclose(store.vectors("summaries", [unit.id])[0], minilm.embed_documents([card])[0], atol=1e-6)
    rows, _ = store.vector_rows(Level.SESSION)
    assert rows and {r["level"] for r in store.summary_records(list(rows))} == {Level.SESSION}

    def signature_of(*settings: str) -> tuple[list[dict], list[str]]:
        result = cli("ask", QUESTIONS[0], "--collection", "two-levels", "--graph", "mia_rag", "--json",
                     "--set", "retrieval_only=true", *settings)
        assert result.code == 0, result.err
        state = json.loads(result.out)
        return state["signature"], [r["id"] for r in state["retrieved"]]

    without_units = cli("ask", QUESTIONS[0], "--collection", tiny_collection.name, "--set", "retrieval_only=true",
                        "--graph", "mia_rag", "--set", "signature_levels=sessions+books")
    assert without_units.code == 2 and "needs book units" in without_units.err and "--cards" in without_units.err
    sessions_only, _ = signature_of()
    assert {s["level"] for s in sessions_only} == {"session"}
    signature, retrieved = signature_of("--set", "signature_levels=sessions+books", "--set", "sig_strategy=centroid")
    assert "book" in {s["level"] for s in signature}
    assert {s["id"] for s in signature if s["level"] == "book"} <= {u.id for u in units.values()}
    ctx = MiaRagSettings(collection="two-levels", sig_strategy="centroid")
    sessions = [s["id"] for s in signature if s["level"] == "session"]
    expected = signature_ranking(ctx, Mindscape("two-levels"), minilm, QUESTIONS[0], minilm.embed_query(QUESTIONS[0]),
                                 sessions, ctx.top_k)
    assert retrieved == [h.id for h in expected]
    assert cli("rm", "two-levels").code == 0


def test_invalid_collection_name(cli) -> None:
    line = _one_error_line(cli("ask", QUESTIONS[0], "--collection", "Not A Name"))
    assert "invalid collection name 'Not A Name'" in line


def test_collection_without_summaries(tmp_path, tiny_collection, cli) -> None:
    book = tmp_path / "golden-goose.txt"
    book.write_text(story_text("golden-goose", sections=4), encoding="utf-8")
    assert cli("ingest", str(book), "--collection", "no-summaries", "--summarizer", "none", "--quiet").code == 0
    line = _one_error_line(cli("ask", QUESTIONS[0], "--collection", "no-summaries", "--graph", "mia_rag"))
    assert "'no-summaries' has no session summaries" in line and "--summarizer llm or extractive" in line
    # Query-only RAG needs no summaries.
    ok = cli("ask", QUESTIONS[0], "--collection", "no-summaries", "--graph", "rag", "--json", "--set", "retrieval_only=true")
    assert ok.code == 0 and json.loads(ok.out)["retrieved"]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("k0=0", "k0 must be at least 1"),
        ("k0=-3", "k0 must be at least 1"),
        ("top_k=0", "top_k must be at least 1"),
        ("k_sum=0", "k_sum must be at least 1"),
        ("candidates=0", "candidates must be at least 1"),
        ("delta=1.5", "delta must be in [0, 1]"),
        ("delta=-0.1", "delta must be in [0, 1]"),
        ("delta=nan", "delta must be in [0, 1]"),
        ("delta=half", "setting delta='half' is not a valid float"),
        ("k0=ten", "setting k0='ten' is not a valid int"),
        ("retrieval_only=maybe", "setting retrieval_only='maybe' is not one of 1/true/yes/on/0/false/no/off"),
        ("lambda_q=-1", "lambda_q must be non-negative"),
        ("sig_strategy=median", "sig_strategy must be one of trained, centroid, mia"),
        ("sig_strategy=concat", "sig_strategy must be one of trained, centroid, mia"),
        ("signature_init=auto", "signature_init must be one of coverage, first_k"),
        ("kay0=5", "unknown setting(s) kay0"),
        ("alpha", "--set 'alpha' is not KEY=VALUE"),
    ],
)
def test_settings_out_of_range(setting: str, message: str, tiny_collection, cli) -> None:
    line = _one_error_line(cli("ask", QUESTIONS[0], "--collection", tiny_collection.name, "--set", setting))
    assert message in line
