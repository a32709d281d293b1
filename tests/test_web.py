"""The web page (``mia serve`` at ``/mia/``): its endpoints in-process, then the page in a real browser.

The first half calls the page's own endpoints (``graph/web_api.py``) through Starlette's test
client over the session's tiny collection: keys, exact passages, lookups, uploads with progress,
refusals. The second half starts the real server on 127.0.0.1 and drives headless Chromium
(Debian's ``chromium`` and ``chromium-driver``; without them these tests skip, naming the
packages) through what a person does: list collections, ask with rag and mia_rag, open a
citation, read the signature panel, follow up on the thread, watch an agent's steps, add and
delete a book, and meet the 401 / 403 pages. Assertions are on what the page shows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from starlette.testclient import TestClient

from mia.graph import web_api as web_api
from mia.evals import web_page
from mia.graph.auth import AuthFailure, check_ingest_paths
from mia.graph.http_app import app
from mia.graph.ingest import graph as ingest_graph
from mia.graph.server import Server, ingest_elsewhere, start_server
from mia.graph.registry import settings_read
from mia.stores.chroma import chroma_client, list_mindscapes
from mia.stores.paths import PathError
from tests.conftest import TinyCollection, requires_data, story_text, write_stories

KEYS = {"key-admin": ["*"], "key-tiny": ["tiny", "web-*"], "key-none": ["nothing-*"]}


def _client(key: str | None = None) -> TestClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return TestClient(app, headers=headers)


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_api, "KEYS", KEYS)


def _run_ingest(payload: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, int, int]]]:
    """A run of the ``ingest`` graph in-process, as the page starts one on the server: its output
    and the progress its custom stream events report."""
    output: dict[str, Any] = {}
    progress: list[tuple[str, int, int]] = []
    for mode, chunk in ingest_graph.stream(payload, stream_mode=["custom", "values"]):
        if mode == "custom" and chunk["event"] == "ingest_progress":
            progress.append((chunk["stage"], chunk["done"], chunk["total"]))
        elif mode == "values":
            output = chunk
    return output, progress


# ---- the page's endpoints, in-process ----------------------------------------------------------------
def test_page_and_assets_are_served_and_self_contained() -> None:
    with _client() as client:
        assert client.get("/mia", follow_redirects=False).headers["location"] == "/mia/"
        page = client.get("/mia/")
        assert page.status_code == 200 and "<title>MiA" in page.text
        for asset in ("app.js", "app.css"):
            assert client.get(f"/mia/static/{asset}").status_code == 200
    total = sum(web_page.asset_bytes().values())
    assert total <= 1_000_000, f"the page's assets weigh {total} bytes (goal ≤ 1 MB)"
    # Offline: no asset, font or script is fetched from another host.
    for path in web_api.ASSETS.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), f"{path.name} loads from another host"
        assert not re.search(r"""(url\(|import\s|fetch\()\s*["']?(https?:)?//""", text), f"{path.name} fetches from another host"


def test_settings_panel_describes_every_setting_of_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIA_TOP_K", "7")
    with _client() as client:
        schema = {s["name"]: s for s in client.get("/mia/api/settings?graph=mia_rag").json()["settings"]}
        rag = {s["name"] for s in client.get("/mia/api/settings?graph=rag").json()["settings"]}
        unknown = client.get("/mia/api/settings?graph=nope")
    assert set(schema) == settings_read("mia_rag") and rag == settings_read("rag") and "k0" not in rag
    assert unknown.status_code == 400 and "unknown graph 'nope'" in unknown.json()["detail"]
    assert all(s["description"] for s in schema.values())
    assert schema["top_k"] == {**schema["top_k"], "type": "int", "default": 7}  # the server's effective default
    assert schema["delta"]["type"] == "float" and schema["injection_guard"]["type"] == "bool"
    assert schema["retriever"]["type"] == "choice" and schema["retriever"]["choices"] == ["dense", "hybrid"]


def test_keys_decide_what_the_page_may_read(keys: None, tiny_collection: TinyCollection) -> None:
    chunk_id = tiny_collection.store.chunk_records([f"{next(iter(tiny_collection.texts))}:c000000"])[0]["id"]
    with _client() as anonymous:
        response = anonymous.get("/mia/api/collections")
        assert response.status_code == 401 and "missing API key" in response.json()["detail"]
    with _client("wrong") as wrong:
        assert wrong.get("/mia/api/collections").status_code == 401
    with _client("key-tiny") as allowed:
        listed = allowed.get("/mia/api/collections").json()
        assert listed["auth"] is True and "tiny" in [c["collection"] for c in listed["collections"]]
    with _client("key-none") as other:
        assert other.get("/mia/api/collections").json()["collections"] == []
        for method, path, body in (("GET", "/mia/api/collections/tiny", None),
                                   ("GET", f"/mia/api/collections/tiny/passage?chunk={chunk_id}", None),
                                   ("POST", "/mia/api/collections/tiny/lookup", {"chunks": [chunk_id]}),
                                   ("DELETE", "/mia/api/collections/tiny", None),
                                   ("PUT", "/mia/api/collections/tiny/upload?filename=x.txt", None)):
            response = other.request(method, path, json=body)
            assert response.status_code == 403, (method, path, response.text)
            assert "may not use collection 'tiny'" in response.json()["detail"]


def test_other_sites_pages_cannot_use_the_endpoints(tiny_collection: TinyCollection) -> None:
    """Without keys the server is open on loopback: a page on another site must not read, fill or delete."""
    with _client() as client:
        for method, path in (("GET", "/mia/api/collections"), ("DELETE", "/mia/api/collections/tiny"),
                             ("POST", "/mia/api/collections/tiny/lookup")):
            response = client.request(method, path, headers={"Origin": "http://evil.example"}, json={})
            assert response.status_code == 403 and "cross-site request" in response.json()["detail"]
        same = client.get("/mia/api/collections", headers={"Origin": "http://testserver"})
        assert same.status_code == 200 and "tiny" in [c["collection"] for c in same.json()["collections"]]
        # A form-encoded or plain-text body (which a browser sends cross-site without asking) is not JSON.
        plain = client.post("/mia/api/collections/tiny/lookup", content=b'{"chunks": []}', headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415


def test_passage_is_the_chunk_in_its_book(tiny_collection: TinyCollection) -> None:
    book, text = next(iter(tiny_collection.texts.items()))
    record = tiny_collection.store.chunk_records([f"{book}:c000003"])[0]
    with _client() as client:
        p = client.get(f"/mia/api/collections/tiny/passage?chunk={record['id']}&context=200").json()
    assert p["text"] == text[record["start"]:record["end"]] == record["text"]
    assert p["before"] == text[max(record["start"] - 200, 0):record["start"]]
    assert p["after"] == text[record["end"]:record["end"] + 200]
    assert p["index"] == 3 and p["chunks"] == len(tiny_collection.store.book_chunk_ids(book))
    assert 0 < p["position"] < 1
    with _client() as client:
        missing = client.get("/mia/api/collections/tiny/passage?chunk=nope:c000001")
        assert missing.status_code == 404 and "no committed chunk" in missing.json()["detail"]


def test_lookup_gives_positions_previews_and_summaries(tiny_collection: TinyCollection) -> None:
    book = next(iter(tiny_collection.texts))
    ids = tiny_collection.store.book_chunk_ids(book)[:3]
    summary = f"{book}:s00000"
    with _client() as client:
        looked = client.post("/mia/api/collections/tiny/lookup", json={"chunks": ids, "summaries": [summary]}).json()
    records = {r["id"]: r for r in tiny_collection.store.chunk_records(ids)}
    for chunk_id in ids:
        got, want = looked["chunks"][chunk_id], records[chunk_id]
        assert (got["book"], got["index"], got["start"], got["end"]) == (want["book"], want["index"], want["start"], want["end"])
        assert want["text"].startswith(got["preview"])
    assert looked["summaries"][summary]["text"] == tiny_collection.store.summary_records([summary])[0]["text"]
    assert looked["summaries"][summary]["first_chunk"] == 0
    assert set(looked["books"]) == set(tiny_collection.texts)
    assert looked["books"][book]["body_end"] == len(tiny_collection.texts[book])


@requires_data
def test_an_upload_is_ingested_by_a_run_of_the_ingest_graph_then_deleted(keys: None, isolated_environment: Path) -> None:
    story = story_text("golden-goose", sections=2)
    with _client("key-tiny") as client:
        response = client.put("/mia/api/collections/web-upload/upload?filename=The%20Goose.txt", content=story.encode())
        assert response.status_code == 201, response.text
        assert response.json() == {"collection": "web-upload", "upload": "The_Goose.txt"}
        assert (isolated_environment / "uploads" / "web-upload" / "The_Goose.txt").read_text(encoding="utf-8") == story
        assert client.get("/mia/api/collections/web-upload").status_code == 404  # kept, not ingested: the run does that
        report, progress = _run_ingest({"uploads": ["The_Goose.txt"], "collection": "web-upload", "summarizer": "extractive"})
        assert report["books_written"] == ["the-goose"] and report["chunks"] > 0
        assert progress[-1] == ("book cards", 1, 1)  # written last, once the book is in
        assert ("books", 1, 1) in progress
        stage, done, total = [p for p in progress if p[0] not in ("books", "book cards")][-1]
        assert stage == "embedding summaries the-goose" and done == total > 0
        listed = client.get("/mia/api/collections/web-upload").json()["books"][0]
        assert listed["book"] == "the-goose" and listed["card"]["method"] == "names-v1"  # the page shows it
        assert client.delete("/mia/api/collections/web-upload").json() == {"removed": "web-upload"}
        gone = client.delete("/mia/api/collections/web-upload")
        assert gone.status_code == 404 and "unknown collection" in gone.json()["detail"]


@pytest.mark.parametrize("filename,body,status,message", [
    ("notes.pdf", b"text", 400, ".txt or .md"),
    ("", b"text", 400, ".txt or .md"),
    ("empty.txt", b"  \n", 400, "is empty"),
    ("latin.txt", "café".encode("latin-1"), 400, "not valid UTF-8"),
    ("binary.txt", b"text\x00more", 400, "looks binary"),
])
def test_bad_uploads_are_refused_before_anything_is_written(filename: str, body: bytes, status: int, message: str,
                                                           isolated_environment: Path) -> None:
    with _client() as client:
        response = client.put(f"/mia/api/collections/web-bad/upload?filename={filename}", content=body)
    assert response.status_code == status and message in response.json()["detail"]
    assert not (isolated_environment / "uploads" / "web-bad").exists()


def test_upload_names_cannot_leave_the_upload_folder(isolated_environment: Path) -> None:
    with _client() as client:
        response = client.put("/mia/api/collections/web-safe/upload?filename=../../etc/evil%20name.txt", content=b"story")
    assert response.status_code == 201 and response.json()["upload"] == "evil_name.txt"
    assert list(isolated_environment.rglob("*evil*")) == [isolated_environment / "uploads" / "web-safe" / "evil_name.txt"]
    assert (isolated_environment / "uploads" / "web-safe" / "evil_name.txt").read_text(encoding="utf-8") == "story"


@requires_data
def test_the_ingest_graph_reads_uploads_but_nothing_outside_its_roots(tmp_path: Path, isolated_environment: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Uploads are read from the run's own collection's upload folder, paths from the ingest root;
    every other file is refused by the server's run check (403) and again by the graph itself."""
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("not for callers")
    monkeypatch.setenv("MIA_INGEST_ROOT", str(root))
    mine, theirs = isolated_environment / "uploads" / "web-roots", isolated_environment / "uploads" / "web-theirs"
    mine.mkdir(parents=True), theirs.mkdir(parents=True)
    (mine / "fox.txt").write_text(story_text("fox-and-wolf", sections=1), encoding="utf-8")
    (mine / "escape.txt").symlink_to(tmp_path / "secret.txt")
    (theirs / "theirs.txt").write_text("another collection's upload")
    refused = [
        ({"paths": ["../secret.txt"]}, "'..'"),
        ({"paths": [str(tmp_path / "secret.txt")]}, "absolute"),
        ({"paths": ["missing.txt"]}, "no such file"),
        ({"uploads": ["../web-theirs/theirs.txt"]}, "'..'"),
        ({"uploads": [str(mine / "fox.txt")]}, "absolute"),
        ({"uploads": ["escape.txt"]}, "symlink"),
        ({"uploads": ["fox.txt"], "collection": "web-nothing"}, "has no uploaded files"),
    ]
    for payload, reason in refused:
        run = {"collection": "web-roots", "summarizer": "extractive", **payload}
        with pytest.raises(AuthFailure, match=reason) as failure:
            check_ingest_paths({"input": run})
        assert failure.value.status == 403
        with pytest.raises(PathError, match=reason):
            ingest_graph.invoke(run)
    with pytest.raises(PathError, match="no ingest paths"):
        ingest_graph.invoke({"collection": "web-roots", "summarizer": "extractive"})
    assert "web-roots" not in list_mindscapes(chroma_client())
    accepted = {"input": {"uploads": ["fox.txt"], "collection": "web-roots", "summarizer": "extractive"}}
    check_ingest_paths(accepted)
    report, _ = _run_ingest(accepted["input"])
    assert report["books_written"] == ["fox"] and report["chunks"] > 0


def test_ingest_reports_progress_per_stage(tmp_path: Path, minilm: Any) -> None:
    from mia.stores.ingest import IngestOptions, ingest

    paths = write_stories(tmp_path / "stories", ("golden-goose", "fox-and-wolf"), sections=2)
    seen: list[tuple[str, int, int]] = []
    ingest(paths, "web-progress", minilm, options=IngestOptions(chunk_size=100, window=2, summarizer="extractive"),
           progress=False, on_progress=lambda stage, done, total: seen.append((stage, done, total)))
    books = [s for s in seen if s[0] == "books"]
    assert books == [("books", 0, 2), ("books", 1, 2), ("books", 2, 2)]
    stages = list(dict.fromkeys(s[0] for s in seen if s[0] != "books"))
    assert stages == ["embedding golden-goose", "summarising golden-goose", "embedding summaries golden-goose",
                      "embedding fox-and-wolf", "summarising fox-and-wolf", "embedding summaries fox-and-wolf"]
    for stage in stages:
        counts = [(d, t) for s, d, t in seen if s == stage]
        assert counts[-1][0] == counts[-1][1] and all(a[0] < b[0] for a, b in zip(counts, counts[1:]))


# ---- the page in a real browser, against the real server ------------------------------------------------
BROWSER = web_page.browser_missing()
needs_browser = pytest.mark.skipif(BROWSER is not None, reason=f"browser tests: {BROWSER}")
STORIES = ("self-did-it", "the-miserly-farmer")
BROWSER_KEYS = {"key-admin": ["*"], "key-fairy": ["fairy", "web-*"]}
SMALL = {"top_k": 3, "max_new_tokens": 16, "k0": 10, "k_sum": 2, "max_steps": 1, "step_k": 3}
QUESTION = "Who had carted pears to market?"
FOLLOW_UP = "What did the bonze plant?"


@dataclass(frozen=True)
class Site:
    server: Server
    data: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if BROWSER is not None:
        pytest.skip(f"browser tests: {BROWSER}")
    base = tmp_path_factory.mktemp("web")
    data = base / "data"
    paths = write_stories(data / "stories", STORIES)
    ingest_elsewhere({"fairy": paths, "other": paths[:1]}, base / "chroma", chunk_size=100, window=2)
    env = {"MIA_CHROMA_PATH": str(base / "chroma"), "MIA_INGEST_ROOT": str(data), "MIA_API_KEYS": json.dumps(BROWSER_KEYS)}
    with start_server(env=env, state_dir=base / "server", timeout=180) as server:
        yield Site(server, data)


@pytest.fixture(scope="module")
def browser(site: Site) -> Iterator[Any]:
    with web_page.chromium() as driver:
        yield driver


def _visible(driver: Any, element_id: str) -> bool:
    return driver.execute_script(f"return !document.getElementById('{element_id}').hidden;")


def _collections_listed(driver: Any) -> list[str]:
    # Read in one script: the list is redrawn after every change, which would stale element handles.
    return driver.execute_script(
        "return [...document.querySelectorAll('#collection-list li.collection')].map((li) => li.dataset.collection);")


def _ask_afresh(site: Site, driver: Any, graph: str) -> Any:
    """Open the page on ``fairy`` with ``graph`` and small settings, ask QUESTION, return the answer."""
    web_page.open_page(driver, site.server, key="key-fairy", collection="fairy", graph=graph)
    for name, value in SMALL.items():
        if name in settings_read(graph):  # the panel shows the graph's own settings
            web_page.set_setting(driver, name, value)
    return web_page.ask(driver, QUESTION)


@needs_browser
def test_wrong_key_shows_the_401_page_and_a_good_key_opens_the_app(site: Site, browser: Any) -> None:
    web_page.open_page(browser, site.server, key="not-a-key")
    assert _visible(browser, "error-page") and not _visible(browser, "app")
    assert "401" in browser.find_element("id", "error-title").text
    assert "invalid API key" in browser.find_element("id", "error-detail").text
    assert "not-a-key" not in browser.current_url  # the key leaves the address bar
    browser.find_element("id", "key-input").send_keys("key-fairy")
    browser.find_element("css selector", "#key-form button").click()
    web_page.wait_for(browser, lambda d: _visible(d, "app"), 30, "the app after a good key")
    assert _collections_listed(browser) == ["fairy"]  # key-fairy may not see "other"


@needs_browser
def test_a_collection_the_key_may_not_use_shows_the_403_page(site: Site, browser: Any) -> None:
    web_page.open_page(browser, site.server, key="key-fairy", collection="other")
    assert _visible(browser, "error-page")
    assert "403" in browser.find_element("id", "error-title").text
    assert "may not use collection 'other'" in browser.find_element("id", "error-detail").text


@needs_browser
def test_collections_are_listed_with_their_counts(site: Site, browser: Any) -> None:
    web_page.open_page(browser, site.server, key="key-admin")
    assert _collections_listed(browser) == ["fairy", "other"]
    stats = browser.find_element("css selector", "li[data-collection=fairy] .stats").text
    assert re.fullmatch(r"2 book\(s\) · \d+ chunks · \d+ summaries · [\d,]+ tokens", stats), stats
    cards = browser.execute_script(  # each book's card, folded under it (textContent: a closed <details> hides it)
        "return [...document.querySelectorAll('li[data-collection=fairy] .books details.card')]"
        ".map((d) => [d.querySelector('summary').textContent, d.querySelector('pre').textContent]);")
    with httpx.Client(base_url=site.server.url, headers={"Authorization": "Bearer key-admin"}, timeout=30) as http:
        stored = {b["card_text"] for b in http.get("/mia/api/collections/fairy").json()["books"]}
    assert len(cards) == 2 and all(label == "card, made by names-v1" for label, _ in cards), cards
    assert {text for _, text in cards} == stored  # the card's one rendering, as stored


@pytest.mark.slow
@needs_browser
def test_ask_with_rag_then_open_a_citation_in_its_book(site: Site, browser: Any, embedded_model_file: Path) -> None:
    message = _ask_afresh(site, browser, "rag")
    assert "failed" not in message.get_attribute("class")
    assert message.find_element("css selector", ".body").text.strip()
    timing = browser.execute_script("return window.miaTimings[window.miaTimings.length - 1];")
    assert timing["graph"] == "rag" and timing["first_token_s"] > 0  # tokens arrived as a stream
    header = browser.find_element("css selector", "#rankings-panel th:nth-child(2)").text
    assert header == "Ranking (query only)" and not browser.find_elements("css selector", "#signature-panel .sig-row")
    citation = message.find_elements("css selector", ".citation")[0]
    citation.click()
    web_page.wait_for(browser, lambda d: d.find_element("id", "passage").get_attribute("open") is not None, 30, "the passage")
    mark = browser.find_element("id", "passage-mark")
    book, start, end = mark.get_attribute("data-book"), int(mark.get_attribute("data-start")), int(mark.get_attribute("data-end"))
    source = (site.data / "stories" / f"{book}.txt").read_text(encoding="utf-8")
    assert " ".join(mark.text.split()) == " ".join(source[start:end].split()) and mark.text.strip()
    support = mark.find_element("css selector", ".support")  # the sentence that supports the answer
    s_start, s_end = int(support.get_attribute("data-start")), int(support.get_attribute("data-end"))
    assert start <= s_start < s_end <= end and " ".join(support.text.split()) == " ".join(source[s_start:s_end].split())
    assert citation.get_attribute("data-chunk") == f"{book}:c{int(citation.text.rsplit('chunk ', 1)[1]):06d}"
    assert re.search(r"\d+(\.\d)?% into the book", browser.find_element("id", "passage-where").text)
    browser.find_element("id", "passage-close").click()


@pytest.mark.slow
@needs_browser
def test_the_panel_shows_and_sends_the_chosen_graphs_settings(site: Site, browser: Any, embedded_model_file: Path) -> None:
    """A setting changed for mia_rag stays out of rag's panel and rag's runs (rag's settings hold no
    k_sum), and is there again back on mia_rag."""
    web_page.open_page(browser, site.server, key="key-fairy", collection="fairy", graph="mia_rag")
    for name, value in {"k_sum": 2, "top_k": 3, "max_new_tokens": 16}.items():
        web_page.set_setting(browser, name, value)
    web_page.choose(browser, "graph", "rag")
    web_page.wait_for(browser, lambda d: not d.find_elements("id", "setting-k_sum"), 30, "rag's settings panel")
    assert browser.find_element("id", "setting-top_k").get_attribute("value") == "3"
    browser.find_element("id", "setting-hypothetical_passage").click()  # a checkbox: the bool settings
    browser.execute_script("""
        window.sentContexts = [];
        const send = window.fetch;
        window.fetch = (url, options) => {
          if (String(url).endsWith("/runs/stream")) window.sentContexts.push(JSON.parse(options.body).context);
          return send(url, options);
        };""")
    message = web_page.ask(browser, QUESTION)
    assert "failed" not in message.get_attribute("class"), message.text
    assert browser.execute_script("return window.sentContexts;") == [
        {"top_k": 3, "max_new_tokens": 16, "hypothetical_passage": True, "collection": "fairy"}]
    searched = browser.find_element("id", "search-panel")  # the inspector shows what retrieval searched with
    assert "the passage the model wrote" in searched.text and searched.find_element("css selector", "p").text.strip()
    web_page.choose(browser, "graph", "mia_rag")
    web_page.wait_for(browser, lambda d: d.find_elements("id", "setting-k_sum"), 30, "mia_rag's settings panel")
    assert browser.find_element("id", "setting-k_sum").get_attribute("value") == "2"


@pytest.mark.slow
@needs_browser
def test_mia_rag_draws_the_signature_and_follows_up_on_its_thread(site: Site, browser: Any, embedded_model_file: Path) -> None:
    _ask_afresh(site, browser, "mia_rag")
    rows = browser.find_elements("css selector", "#signature-panel .sig-row")
    assert len(rows) == SMALL["k_sum"]
    for row in rows:
        bars = row.find_elements("css selector", ".bars .bar")
        assert [b.get_attribute("class") for b in bars] == ["bar relevance", "bar coverage", "bar diversity"]
        assert float(row.find_element("css selector", ".bar.relevance").get_attribute("data-value")) > 0
    first = rows[0].find_element("css selector", ".sig-head").text
    assert re.match(r"1\. (self-did-it|the-miserly-farmer), chunks \d+–\d+ gain \d\.\d{3}", first), first
    assert browser.find_element("css selector", "#rankings-panel th:nth-child(2)").text == "Step 0 (query only)"
    assert len(browser.find_elements("css selector", "#rankings-panel tbody tr")) == SMALL["top_k"]
    assert browser.find_elements("css selector", "#strip-panel .strip .mark.window")
    assert browser.find_elements("css selector", "#strip-panel .strip .mark.step0")
    thread = browser.find_element("id", "thread-label").text
    web_page.ask(browser, FOLLOW_UP)
    assert browser.find_element("id", "thread-label").text == thread
    assert len(browser.find_elements("css selector", ".message.assistant")) == 2
    assert len(browser.find_elements("css selector", ".message.user")) == 2


@pytest.mark.slow
@needs_browser
def test_agent_steps_and_infmem_memory_are_drawn(site: Site, browser: Any, embedded_model_file: Path) -> None:
    _ask_afresh(site, browser, "mia_agent")
    steps = browser.find_elements("css selector", "#steps-panel .step")
    assert len(steps) == SMALL["max_steps"]
    assert re.match(r"Step 1 · decision (continue|answer)", steps[0].find_element("css selector", ".step-head").text)
    assert "query Who had carted pears to market?" in steps[0].text
    assert "First-K" in browser.find_element("id", "signature-panel").text
    web_page.choose(browser, "graph", "infmem")
    web_page.ask(browser, QUESTION)
    rows = browser.find_elements("css selector", "#steps-panel table.memory-steps tbody tr")
    assert rows, "no streamed-chunk rows for infmem"
    cells = rows[0].find_elements("css selector", "td")
    assert cells[0].text == "1" and cells[2].text in ("SEARCH", "STOP") and re.fullmatch(r"\d+", cells[5].text.strip())


@needs_browser
def test_add_a_book_with_a_live_progress_bar_then_delete_it(site: Site, browser: Any, tmp_path: Path) -> None:
    web_page.open_page(browser, site.server, key="key-fairy")
    book = tmp_path / "fox-and-wolf.txt"
    book.write_text(story_text("fox-and-wolf", sections=2), encoding="utf-8")
    browser.find_element("css selector", "#add-book summary").click()
    name = browser.find_element("id", "add-collection")
    name.clear()
    name.send_keys("web-added")
    browser.find_element("id", "add-file").send_keys(str(book))
    browser.find_element("id", "add-submit").click()
    web_page.wait_for(browser, lambda d: d.find_element("id", "add-result").text, 120, "the ingestion to finish")
    assert re.match(r"web-added: 1 book\(s\) written, 0 unchanged; \d+ chunks, \d+ summaries", browser.find_element("id", "add-result").text)
    bar = browser.find_element("id", "add-bar")
    assert bar.get_attribute("value") == bar.get_attribute("max")
    assert "book 1 of 1 · book cards 1/1" in browser.find_element("id", "add-stage").text  # the cards come last
    # The upload was ingested by an ordinary run of the ingest graph, on a thread the key can read back.
    with httpx.Client(base_url=site.server.url, headers={"Authorization": "Bearer key-fairy"}, timeout=30) as http:
        threads = http.post("/threads/search", json={"metadata": {"graph": "ingest", "collection": "web-added"}}).json()
    assert [t["values"]["books_written"] for t in threads] == [["fox-and-wolf"]]
    web_page.wait_for(browser, lambda d: "web-added" in _collections_listed(d), 30, "the new collection in the list")
    browser.find_element("css selector", "li[data-collection=web-added] button.delete").click()
    alert = browser.switch_to.alert
    assert 'Delete collection "web-added"' in alert.text
    alert.accept()
    web_page.wait_for(browser, lambda d: "web-added" not in _collections_listed(d), 30, "the collection to go")
    assert _collections_listed(browser) == ["fairy"]


@needs_browser
def test_add_a_book_by_its_path_under_the_ingest_root(site: Site, browser: Any) -> None:
    web_page.open_page(browser, site.server, key="key-fairy")
    browser.find_element("css selector", "#add-book summary").click()
    name = browser.find_element("id", "add-collection")
    name.clear()
    name.send_keys("web-path")
    browser.find_element("css selector", "input[name=add-mode][value=path]").click()
    path = browser.find_element("id", "add-path")
    path.send_keys("../outside.txt")  # refused by the server's run check before any run starts
    browser.find_element("id", "add-submit").click()
    web_page.wait_for(browser, lambda d: d.find_element("id", "add-result").text, 30, "the refusal")
    assert browser.find_element("id", "add-result").text.startswith("Not ingested: ingest path '../outside.txt' contains '..'")
    path.clear()
    path.send_keys(f"stories/{STORIES[0]}.txt")
    browser.find_element("id", "add-submit").click()
    web_page.wait_for(browser, lambda d: d.find_element("id", "add-result").text.startswith("web-path:"), 120, "the ingestion to finish")
    assert re.match(r"web-path: 1 book\(s\) written, 0 unchanged; \d+ chunks", browser.find_element("id", "add-result").text)
    assert "book 1 of 1 · book cards 1/1" in browser.find_element("id", "add-stage").text
    with httpx.Client(base_url=site.server.url, headers={"Authorization": "Bearer key-admin"}, timeout=60) as http:
        assert http.delete("/mia/api/collections/web-path").json() == {"removed": "web-path"}
