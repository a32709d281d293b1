// MiA's web page: chat over a mindscape through the LangGraph API, with what each answer's
// retrieval did drawn beside it. Plain script, no build step, nothing fetched from outside the
// server. Every text that comes from a document is set with textContent: documents are data.
"use strict";

const GENERATING_NODES = new Set(["generate", "answer"]);
const PANEL_SETTINGS = ["top_k", "alpha", "k_sum", "retriever", "answer_inputs", "k0", "max_new_tokens",
                        "max_steps", "step_k", "signature_init", "bm25_weight", "bm25_stemming", "hypothetical_passage"];
const RANKING_ROWS = 20;

const state = {
  key: sessionStorage.getItem("mia-key") || "",
  collections: [],
  schemas: {},           // graph -> {setting name -> {type, choices, default, description}}: what that graph reads
  overrides: {},         // settings the user changed from the server's defaults, kept across graphs
  thread: null,          // {id, collection, graph}
};
window.miaTimings = [];  // per answer: ms from the model's first token to it being on screen

// ---- helpers -------------------------------------------------------------------------------------
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name === "style") node.setAttribute("style", value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

class HttpError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

function authHeaders(extra = {}) {
  return state.key ? {...extra, Authorization: `Bearer ${state.key}`} : {...extra};
}

async function failure(response) {
  let detail = response.statusText;
  try {
    const body = await response.json();
    detail = body.detail || (body.error && body.error.message) || JSON.stringify(body);
  } catch (_) { /* not JSON */ }
  return new HttpError(response.status, detail);
}

async function api(path, options = {}) {
  const response = await fetch(path, {...options, headers: authHeaders(options.headers || {})});
  if (!response.ok) throw await failure(response);
  return response.json();
}

const postJson = (path, body) => api(path, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
const enc = encodeURIComponent;
const fmt = (n) => Number(n).toLocaleString("en");

function status(text, kind = "") {
  const node = $("status");
  node.textContent = text;
  node.className = kind;
}

function showError(error) {
  if (error instanceof HttpError && (error.status === 401 || error.status === 403)) {
    $("app").hidden = true;
    $("error-page").hidden = false;
    $("error-title").textContent = error.status === 401 ? "401 — Unauthorized" : "403 — Forbidden";
    $("error-detail").textContent = error.message;
    $("key-input").value = "";
    $("key-input").focus();
    return;
  }
  status(error.message || String(error), "error");
}

function chunkLabel(id, info) {
  if (!info) return id;
  return `${info.book} · chunk ${info.index}`;
}

// ---- start-up, key and hash parameters ----------------------------------------------------------
function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has("key")) {
    state.key = params.get("key");
    sessionStorage.setItem("mia-key", state.key);
    params.delete("key");
    history.replaceState(null, "", `${location.pathname}${location.search}${params.toString() ? "#" + params : ""}`);
  }
  return params;
}

async function boot() {
  const params = readHash();
  try {
    if (params.get("graph")) $("graph").value = params.get("graph");
    const [listed] = await Promise.all([api("/mia/api/collections"), settingsOf($("graph").value)]);
    state.collections = listed.collections;
    const wanted = params.get("collection");
    if (wanted) await api(`/mia/api/collections/${enc(wanted)}`);  // 403 / 404 for a collection the key may not use
    await renderSettings();
    $("error-page").hidden = true;
    $("app").hidden = false;
    renderCollections(wanted);
    status(listed.auth ? "signed in with an API key" : "no API keys on this server (loopback use)");
  } catch (error) {
    showError(error);
  }
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.key = $("key-input").value.trim();
  sessionStorage.setItem("mia-key", state.key);
  state.thread = null;
  boot();
});
$("change-key").addEventListener("click", () => {
  showError(new HttpError(401, "Enter the API key to use (MIA_API_KEYS on the server)."));
});

// ---- collections --------------------------------------------------------------------------------
function renderCollections(preferred) {
  const select = $("collection");
  const current = preferred || select.value;
  select.replaceChildren(...state.collections.map((c) => el("option", {value: c.collection}, c.collection)));
  if (state.collections.some((c) => c.collection === current)) select.value = current;
  $("add-collection").value = $("add-collection").value || select.value || "";
  const list = $("collection-list");
  list.replaceChildren();
  if (!state.collections.length) list.append(el("li", {class: "muted"}, "No collections yet: add a book below."));
  for (const c of state.collections) {
    const books = el("ol", {class: "books"}, c.books.map((b) =>
      el("li", {}, el("span", {class: "book-name"}, b.book),
         el("span", {class: "muted"}, ` ${fmt(b.chunks)} chunks · ${fmt(b.summaries)} summaries · ${fmt(b.tokens)} tokens`),
         b.card_text ? el("details", {class: "card"}, el("summary", {}, `card, made by ${b.card.method}`), el("pre", {}, b.card_text)) : null)));
    list.append(el("li", {class: "collection", "data-collection": c.collection},
      el("div", {class: "collection-head"},
        el("button", {type: "button", class: "link", onclick: () => { select.value = c.collection; newThread(); }}, c.collection),
        el("button", {type: "button", class: "delete", title: `Delete ${c.collection}`, onclick: () => removeCollection(c.collection)}, "Delete")),
      el("div", {class: "stats"}, `${c.books.length} book(s) · ${fmt(c.chunks)} chunks · ${fmt(c.summaries)} summaries · ${fmt(c.tokens)} tokens`),
      c.unfinished && c.unfinished.chunks ? el("div", {class: "warning"}, `unfinished ingestion: ${fmt(c.unfinished.chunks)} chunks not committed`) : null,
      el("details", {}, el("summary", {}, "books"), books)));
  }
}

async function refreshCollections() {
  const listed = await api("/mia/api/collections");
  state.collections = listed.collections;
  renderCollections();
}

async function removeCollection(name) {
  if (!confirm(`Delete collection "${name}" with all its books, chunks and summaries? This cannot be undone.`)) return;
  try {
    await api(`/mia/api/collections/${enc(name)}`, {method: "DELETE"});
    status(`removed ${name}`);
    if (state.thread && state.thread.collection === name) newThread();
    await refreshCollections();
  } catch (error) { showError(error); }
}

$("add-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const collection = $("add-collection").value.trim();
  const summarizer = $("add-summarizer").value;
  const mode = document.querySelector("input[name=add-mode]:checked").value;
  $("add-result").textContent = "";
  $("add-result").className = "";
  $("add-submit").disabled = true;
  try {
    const input = {collection, summarizer};
    if (mode === "upload") {
      const file = $("add-file").files[0];
      if (!file) throw new Error("choose a .txt or .md file to upload");
      const response = await fetch(`/mia/api/collections/${enc(collection)}/upload?filename=${enc(file.name)}`,
                                   {method: "PUT", headers: authHeaders({"Content-Type": "application/octet-stream"}), body: file});
      if (!response.ok) throw await failure(response);
      input.uploads = [(await response.json()).upload];
    } else {
      const path = $("add-path").value.trim();
      if (!path) throw new Error("give a path relative to the server's ingest root");
      input.paths = [path];
    }
    await ingestRun(input);
  } catch (error) {
    if (error instanceof HttpError && error.status === 401) showError(error);
    else $("add-result").textContent = `Not ingested: ${error.message}`;
  } finally {
    $("add-submit").disabled = false;
  }
});

function showProgress(progress, finished) {
  const books = progress.books_total ? `book ${Math.min(progress.books_done + 1, progress.books_total)} of ${progress.books_total} · ` : "";
  const bar = $("add-bar");
  bar.max = Math.max(progress.total, 1);
  bar.value = finished ? bar.max : progress.done;
  $("add-stage").textContent = `${books}${progress.stage}${progress.total ? ` ${fmt(progress.done)}/${fmt(progress.total)}` : ""}`;
}

async function ingestRun(input) {
  // An ordinary run of the ingest graph on its own thread, like a question's: the server's threads
  // API shows it, and its custom "ingest_progress" events drive the bar.
  const progress = {stage: "starting", done: 0, total: 0, books_done: 0, books_total: 0};
  $("add-progress").hidden = false;
  showProgress(progress, false);
  const started = performance.now();
  const thread = await postJson("/threads", {metadata: {collection: input.collection, graph: "ingest", client: "mia-web"}});
  let report = {};
  try {
    for await (const event of runEvents(thread.thread_id, {assistant_id: "ingest", input, stream_mode: ["custom", "values"]})) {
      if (event.name === "custom" && event.data && event.data.event === "ingest_progress") {
        const {stage, done, total} = event.data;
        if (stage === "books") Object.assign(progress, {books_done: done, books_total: total});
        else Object.assign(progress, {stage, done, total});
        showProgress(progress, false);
      } else if (event.name === "values") {
        report = event.data || {};
      }
    }
  } catch (error) {
    if (!(error instanceof RunError)) throw error;
    $("add-result").textContent = `Failed: ${error.message}`;
    $("add-result").className = "error";
    return;
  }
  if (!report.books_written) throw new Error("the ingestion run ended without its report; see the server log");
  showProgress(progress, true);
  const seconds = (performance.now() - started) / 1000;
  $("add-result").className = "ok";
  $("add-result").textContent = `${input.collection}: ${report.books_written.length} book(s) written, ${report.books_unchanged.length} unchanged; `
    + `${fmt(report.chunks)} chunks, ${fmt(report.summaries)} summaries in ${seconds.toFixed(1)} s`;
  await refreshCollections();
  $("collection").value = input.collection;
}

// ---- settings panel -----------------------------------------------------------------------------
async function settingsOf(graph) {
  // Each graph reads its own settings; the server says which (once per graph and page load).
  if (!state.schemas[graph]) {
    const schema = await api(`/mia/api/settings?graph=${enc(graph)}`);
    state.schemas[graph] = Object.fromEntries(schema.settings.map((setting) => [setting.name, setting]));
  }
  return state.schemas[graph];
}

async function renderSettings() {
  const schema = await settingsOf($("graph").value);
  const box = $("settings");
  box.replaceChildren();
  for (const name of PANEL_SETTINGS) {
    const setting = schema[name];
    if (!setting) continue;
    const value = name in state.overrides ? state.overrides[name] : setting.default;
    let input;
    if (setting.type === "choice") {
      input = el("select", {}, setting.choices.map((c) => el("option", {value: c, selected: c === value}, c)));
    } else if (setting.type === "bool") {
      input = el("input", {type: "checkbox", checked: Boolean(value)});
    } else {
      input = el("input", {type: "number", step: setting.type === "float" ? "0.05" : "1", value: String(value)});
    }
    input.id = `setting-${name}`;
    input.addEventListener("change", () => {
      const raw = setting.type === "bool" ? input.checked : input.value;
      const parsed = setting.type === "int" ? parseInt(raw, 10) : setting.type === "float" ? parseFloat(raw) : raw;
      if (parsed === setting.default || Number.isNaN(parsed)) delete state.overrides[name];
      else state.overrides[name] = parsed;
    });
    box.append(el("div", {class: "setting"},
      el("label", {for: input.id}, el("code", {}, name), " ", input),
      el("div", {class: "description"}, setting.description)));
  }
}

$("reset-settings").addEventListener("click", () => { state.overrides = {}; renderSettings().catch(showError); });

// ---- chat ---------------------------------------------------------------------------------------
function newThread() {
  state.thread = null;
  $("thread-label").textContent = "";
  $("messages").replaceChildren();
}

$("new-thread").addEventListener("click", newThread);
$("collection").addEventListener("change", newThread);
$("graph").addEventListener("change", () => { newThread(); renderSettings().catch(showError); });

$("question").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("ask-form").requestSubmit();
  }
});

$("ask-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  $("question").value = "";
  ask(question).catch(showError);
});

class RunError extends Error {}

async function* runEvents(threadId, body) {
  // A run streamed on its thread (the LangGraph API, as Studio and the SDK use it): its events,
  // and a RunError for the error event a failed run ends with.
  const response = await fetch(`/threads/${enc(threadId)}/runs/stream`, {
    method: "POST",
    headers: authHeaders({"Content-Type": "application/json", Accept: "text/event-stream"}),
    body: JSON.stringify(body),
  });
  if (!response.ok) throw await failure(response);
  for await (const event of sseEvents(response)) {
    if (event.name === "error") throw new RunError(event.data.message || event.data.error || JSON.stringify(event.data));
    yield event;
  }
}

async function* sseEvents(response) {
  // The LangGraph API streams server-sent events: "event: NAME" and "data: JSON" lines, blank-line separated.
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      let name = "message";
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (!data.length) continue;
      let parsed;
      try { parsed = JSON.parse(data.join("\n")); } catch (_) { parsed = data.join("\n"); }
      yield {name, data: parsed};
    }
  }
}

function addMessage(role, text) {
  const body = el("div", {class: "body"}, text);
  const node = el("div", {class: `message ${role}`}, el("div", {class: "role"}, role === "user" ? "You" : "MiA"), body);
  $("messages").append(node);
  node.scrollIntoView({block: "end"});
  return node;
}

async function ask(question) {
  const collection = $("collection").value;
  const graph = $("graph").value;
  if (!collection) throw new Error("choose a collection first (or add a book)");
  // Only the settings this graph reads: its context holds no others.
  const schema = await settingsOf(graph);
  const context = Object.fromEntries(Object.entries(state.overrides).filter(([name]) => name in schema));
  if (!state.thread || state.thread.collection !== collection || state.thread.graph !== graph) {
    const created = await postJson("/threads", {metadata: {collection, graph, client: "mia-web"}});
    state.thread = {id: created.thread_id, collection, graph};
    $("messages").replaceChildren();
  }
  $("thread-label").textContent = `thread ${state.thread.id.slice(0, 8)}`;
  addMessage("user", question);
  const message = addMessage("assistant", "");
  message.classList.add("pending");
  const answerNode = message.querySelector(".body");
  const run = {graph, collection, question, step0: null, signature0: null, retrievals: [], steps: [], values: {},
               started: performance.now(), firstToken: null};
  $("ask").disabled = true;
  status(`${graph} is working…`);
  try {
    const events = runEvents(state.thread.id, {
      assistant_id: graph,
      input: {messages: [{role: "user", content: question}]},
      context: {...context, collection},
      stream_mode: ["messages-tuple", "updates", "custom", "values"],
    });
    let streamed = "";
    for await (const event of events) {
      if (event.name === "messages") {
        const [chunk, meta] = event.data;
        const text = typeof chunk.content === "string" ? chunk.content : "";
        if (!text || !GENERATING_NODES.has(meta.langgraph_node) || !String(chunk.type).endsWith("Chunk")) continue;
        streamed += text;
        answerNode.textContent = streamed;
        if (run.firstToken === null) markFirstToken(run, chunk);
      } else if (event.name === "updates") {
        collectUpdate(run, event.data);
      } else if (event.name === "custom") {
        if (event.data && String(event.data.event || "").endsWith("_step")) run.steps.push(event.data);
      } else if (event.name === "values") {
        run.values = event.data;
      }
    }
    run.elapsed = (performance.now() - run.started) / 1000;
    finishMessage(message, run);
    status(`${graph} answered in ${run.elapsed.toFixed(1)} s`);
  } catch (error) {
    message.classList.add("failed");
    answerNode.textContent = `Error: ${error.message}`;
    if (error instanceof HttpError && (error.status === 401 || error.status === 403)) showError(error);
    else status(error.message, "error");
  }
  // Drawn once the answer is final, so a failed lookup cannot turn a good answer into an error;
  // the message stays "pending" until then, which is what scripts driving the page wait for.
  if (!message.classList.contains("failed")) await renderInspector(run).catch(showError);
  message.classList.remove("pending");
  $("ask").disabled = false;
}

function markFirstToken(run, chunk) {
  // Time from the model producing its first token (its own clock, this machine's) to the token
  // being painted: the page's share of the latency, read by the UI benchmark.
  run.firstToken = performance.now();
  const generatedAt = chunk.response_metadata && chunk.response_metadata.generated_at;
  requestAnimationFrame(() => requestAnimationFrame(() => {
    const painted = Date.now() / 1000;
    window.miaTimings.push({graph: run.graph, first_token_s: (run.firstToken - run.started) / 1000,
                            screen_after_model_s: generatedAt ? painted - generatedAt : null});
  }));
}

function collectUpdate(run, update) {
  for (const [node, value] of Object.entries(update || {})) {
    if (!value || typeof value !== "object") continue;
    if (value.step0 && value.step0.length) run.step0 = value.step0;
    if (node === "init_signature" && value.signature) run.signature0 = value.signature;
    if (node === "retrieve" && value.retrieved) run.retrievals.push(value.retrieved);
  }
}

function finishMessage(message, run) {
  const values = run.values || {};
  const body = message.querySelector(".body");
  if (values.answer) body.textContent = values.answer;
  const citations = values.citations || [];
  if (citations.length) {
    message.append(el("div", {class: "sources"}, "Sources: ",
      citations.map((c) => c.card
        ? el("button", {type: "button", class: "citation", "data-card": c.book, title: `the book's card: “${c.sentences[0].text}”`,
          onclick: () => openCard(run.collection, c.book, c.sentences[0].text)}, `[card] ${c.book}`)
        : c.n === "summary"
        ? el("span", {class: "citation", "data-summary": c.id, title: `a written summary the model was given: “${c.sentences[0].text}”`},
          `[summary] ${c.where}`)
        : el("button", {type: "button", class: "citation", "data-chunk": c.id,
          title: `${c.moved_from ? `holds the answer's words, which [${c.moved_from}] the model cited lacks`
            : c.cited_by_model ? "cited by the model" : "given to the model, which cited none"}: “${((c.sentences || [])[0] || {}).text || ""}”`,
          onclick: () => openPassage(run.collection, c.id, c.sentences || [])}, `[${c.n}] ${c.book}, chunk ${c.chunk}`))));
  }
  const usage = values.usage || {};
  message.append(el("div", {class: "meta muted"},
    `${run.graph} · ${run.elapsed.toFixed(1)} s · ${usage.llm_calls || 0} LLM call(s), ${fmt(usage.input_tokens || 0)} prompt / ${fmt(usage.output_tokens || 0)} generated tokens`,
    " · ", el("button", {type: "button", class: "link", onclick: () => renderInspector(run)}, "show retrieval")));
}

// ---- citations in their book --------------------------------------------------------------------
async function openPassage(collection, chunkId, sentences = []) {
  try {
    const p = await api(`/mia/api/collections/${enc(collection)}/passage?chunk=${enc(chunkId)}`);
    $("passage-title").textContent = `${p.book} — chunk ${p.index} of ${p.chunks}`;
    $("passage-marker").style.left = `${(p.position * 100).toFixed(2)}%`;
    $("passage-where").textContent = `characters ${fmt(p.start)}–${fmt(p.end)}, ${(p.position * 100).toFixed(1)}% into the book`;
    // The sentence that supports the answer stands out inside the cited chunk (book offsets).
    const parts = [];
    let at = 0;
    for (const s of sentences.filter((s) => s.start >= p.start && s.end <= p.end).sort((a, b) => a.start - b.start)) {
      const from = s.start - p.start, to = s.end - p.start;
      if (from < at) continue;
      parts.push(p.text.slice(at, from), el("strong", {class: "support", "data-start": String(s.start), "data-end": String(s.end)}, p.text.slice(from, to)));
      at = to;
    }
    parts.push(p.text.slice(at));
    const mark = el("mark", {id: "passage-mark", "data-book": p.book, "data-start": String(p.start), "data-end": String(p.end)}, parts);
    $("passage-text").replaceChildren(el("span", {class: "context"}, p.before), mark, el("span", {class: "context"}, p.after));
    $("passage").showModal();
    mark.scrollIntoView({block: "center"});
  } catch (error) { showError(error); }
}

// A card citation: the book's whole card (from the collection's listing), the cited line standing out.
async function openCard(collection, book, line) {
  try {
    const stats = await api(`/mia/api/collections/${enc(collection)}`);
    const {card, card_text: text = line} = stats.books.find((b) => b.book === book) || {};
    const at = text.indexOf(line);
    $("passage-title").textContent = `${book} — the book's card`;
    $("passage-where").textContent = card ? `made by ${card.method}` : "";
    const cited = el("strong", {class: "support"}, line);
    $("passage-text").replaceChildren(...(at < 0 ? [cited] : [text.slice(0, at), cited, text.slice(at + line.length)]));
    $("passage").showModal();
  } catch (error) { showError(error); }
}

$("passage-close").addEventListener("click", () => $("passage").close());

// ---- the inspector: signature, book strip, rankings, steps --------------------------------------
async function renderInspector(run) {
  const values = run.values || {};
  const final = values.retrieved || run.retrievals[run.retrievals.length - 1] || [];
  const signature = run.signature0 || values.signature || [];
  const chunkIds = new Set([...(run.step0 || []), ...final, ...run.retrievals.flat()].map((r) => r.id));
  for (const c of values.citations || []) chunkIds.add(c.id);
  const summaryIds = new Set([...signature, ...(values.signature || [])].map((s) => s.id));
  for (const s of run.steps) for (const id of s.signature || []) summaryIds.add(id);
  $("inspector-empty").hidden = true;
  $("inspector-label").textContent = `— ${run.graph}: “${run.question}”`;
  for (const id of ["search-panel", "signature-panel", "strip-panel", "rankings-panel", "steps-panel"]) $(id).replaceChildren();
  if (values.hypothesis) {
    $("search-panel").append(el("h3", {}, "Searched with the question and the passage the model wrote for it"),
      el("p", {class: "muted"}, values.hypothesis));
  }
  let looked = {chunks: {}, summaries: {}, books: {}};
  if (chunkIds.size || summaryIds.size) {
    looked = await postJson(`/mia/api/collections/${enc(run.collection)}/lookup`, {chunks: [...chunkIds], summaries: [...summaryIds]});
  }
  if (signature.length) renderSignature(signature, looked, values.signature || []);
  if (final.length || run.step0) renderStrip(run, final, signature, looked);
  if (final.length) renderRankings(run.step0, final, looked, FINAL_RANKING[run.graph] || "Final ranking");
  if (run.steps.length) renderSteps(run, looked);
}

function renderSignature(signature, looked, finalSignature) {
  // First-K (the agents' default) trades nothing off: its parts are 0 and there are no bars to draw.
  const hasGains = signature.some((s) => (s.relevance || 0) + (s.coverage || 0) + (s.diversity || 0) > 0);
  const panel = $("signature-panel");
  panel.append(el("h3", {}, `Signature (K_sum = ${signature.length})`),
    hasGains ? el("div", {class: "legend"}, el("span", {class: "sw relevance"}), "relevance ",
                  el("span", {class: "sw coverage"}), "coverage ", el("span", {class: "sw diversity"}), "diversity (marginal gains, in selection order)")
             : el("div", {class: "legend"}, "First-K: the sessions of the best-ranked step-0 chunks, in rank order (nothing traded off)."));
  const top = Math.max(...signature.map((s) => (s.relevance || 0) + (s.coverage || 0) + (s.diversity || 0)), 1e-9);
  signature.forEach((s, i) => {
    const info = looked.summaries[s.id];
    const bars = hasGains ? el("div", {class: "bars", title: `gain ${s.gain.toFixed(3)} = ${s.relevance.toFixed(3)} + ${s.coverage.toFixed(3)} + ${s.diversity.toFixed(3)}`},
      ["relevance", "coverage", "diversity"].map((part) => el("span", {class: `bar ${part}`, "data-value": String(s[part]),
        style: `width:${(100 * Math.max(s[part], 0) / top).toFixed(1)}%`}))) : null;
    const where = info ? `${info.book}, chunks ${info.first_chunk}–${info.last_chunk}` : s.id;
    panel.append(el("div", {class: "sig-row", "data-summary": s.id},
      el("div", {class: "sig-head"}, el("b", {}, `${i + 1}. `), where,
         typeof s.gain === "number" ? el("span", {class: "muted"}, hasGains ? ` gain ${s.gain.toFixed(3)}` : ` rank weight ${s.gain.toFixed(3)}`) : null),
      bars,
      el("details", {}, el("summary", {}, "summary"), el("p", {class: "summary-text"}, info ? info.text : "(not found)"))));
  });
  const changed = finalSignature.length && finalSignature.map((s) => s.id).join() !== signature.map((s) => s.id).join();
  if (changed) panel.append(el("p", {class: "muted"}, `The agent refined it to: ${finalSignature.map((s) => s.id).join(", ")}`));
}

function renderStrip(run, final, signature, looked) {
  // One bar per book in series order: where step-0 hits, signature windows and final chunks lie.
  const panel = $("strip-panel");
  const books = Object.entries(looked.books).sort((a, b) => a[1].order - b[1].order);
  const cited = new Set(((run.values || {}).citations || []).map((c) => c.id));
  const marks = {};
  const add = (book, item) => { (marks[book] = marks[book] || []).push(item); };
  for (const s of signature) {
    const info = looked.summaries[s.id];
    if (info) add(info.book, {kind: "window", start: info.start, end: info.end, title: `signature: ${s.id}`});
  }
  for (const r of run.step0 || []) {
    const info = looked.chunks[r.id];
    if (info) add(info.book, {kind: "step0", start: info.start, end: info.end, title: `step 0: ${chunkLabel(r.id, info)}`});
  }
  for (const r of final) {
    const info = looked.chunks[r.id];
    if (info) add(info.book, {kind: cited.has(r.id) ? "final cited" : "final", start: info.start, end: info.end, title: `final: ${chunkLabel(r.id, info)}`});
  }
  const shown = books.filter(([book]) => marks[book]);
  if (!shown.length) return;
  panel.append(el("h3", {}, "Where in the books"),
    el("div", {class: "legend"}, el("span", {class: "sw window"}), "signature window ", el("span", {class: "sw step0"}), "step-0 hit ",
       el("span", {class: "sw final"}), "final chunk ", el("span", {class: "sw cited"}), "cited"));
  const hidden = books.length - shown.length;
  for (const [book, info] of shown) {
    const span = Math.max(info.body_end - info.body_start, 1);
    const strip = el("div", {class: "strip", "data-book": book});
    for (const m of marks[book]) {
      const left = 100 * (m.start - info.body_start) / span;
      const width = Math.max(100 * (m.end - m.start) / span, 0.4);
      strip.append(el("span", {class: `mark ${m.kind}`, title: m.title, style: `left:${left.toFixed(2)}%;width:${width.toFixed(2)}%`}));
    }
    panel.append(el("div", {class: "strip-row"}, el("div", {class: "strip-label"}, book), strip));
  }
  if (hidden) panel.append(el("p", {class: "muted"}, `${hidden} other book(s) had no hit.`));
}

const FINAL_RANKING = {rag: "Ranking (query only)", mia_rag: "Final (query + signature)",
                       mia_agent: "Last step (q_t + σ_t)", agent: "Last step (q_t)"};

function renderRankings(step0, final, looked, finalLabel) {
  const panel = $("rankings-panel");
  const rows = Math.min(RANKING_ROWS, final.length);
  const before = new Map((step0 || []).map((r, i) => [r.id, i]));
  const cell = (r, moved) => {
    const info = looked.chunks[r.id];
    return el("td", {class: moved, title: info ? info.preview : r.id}, chunkLabel(r.id, info),
              el("span", {class: "score muted"}, ` ${Number(r.score).toFixed(3)}`));
  };
  const head = step0 ? el("tr", {}, el("th", {}, "#"), el("th", {}, "Step 0 (query only)"), el("th", {}, finalLabel), el("th", {}, "moved"))
                     : el("tr", {}, el("th", {}, "#"), el("th", {}, finalLabel));
  const body = [];
  for (let i = 0; i < rows; i++) {
    const r = final[i];
    if (!step0) { body.push(el("tr", {}, el("td", {}, i + 1), cell(r, ""))); continue; }
    const was = before.has(r.id) ? before.get(r.id) : null;
    const moved = was === null ? "new" : was > i ? `↑${was - i}` : was < i ? `↓${i - was}` : "=";
    const left = step0[i];
    body.push(el("tr", {}, el("td", {}, i + 1), left ? cell(left, "") : el("td", {}),
                 cell(r, was === null ? "new" : was > i ? "up" : ""), el("td", {class: "moved"}, was === null ? "new" : moved)));
  }
  panel.append(el("h3", {}, step0 ? "Step-0 ranking beside the final one" : "Ranking"),
               el("table", {class: "rankings"}, el("thead", {}, head), el("tbody", {}, body)));
}

function renderSteps(run, looked) {
  const panel = $("steps-panel");
  const kinds = new Set(run.steps.map((s) => s.event));
  if (kinds.has("agent_step")) {
    panel.append(el("h3", {}, "Agent steps"));
    run.steps.filter((s) => s.event === "agent_step").forEach((s, i) => {
      const retrieved = run.retrievals[i] || [];
      panel.append(el("div", {class: "step", "data-step": String(s.step)},
        el("div", {class: "step-head"}, el("b", {}, `Step ${s.step}`), ` · decision ${s.decision}`, s.failure ? ` · ${s.failure}` : ""),
        el("div", {}, el("span", {class: "muted"}, "query "), s.query),
        s.next_query && s.next_query !== s.query ? el("div", {}, el("span", {class: "muted"}, "next query "), s.next_query) : null,
        s.signature ? el("div", {}, el("span", {class: "muted"}, "signature "), s.signature.join(", ")) : null,
        el("div", {class: "muted"}, `${retrieved.length} chunk(s) retrieved`),
        (s.new_evidence || []).length ? el("ul", {class: "evidence"}, s.new_evidence.map((f) =>
          el("li", {}, f.fact, el("span", {class: "muted"}, ` (${f.chunks.map((id) => chunkLabel(id, looked.chunks[id])).join("; ")})`)))) :
          el("div", {class: "muted"}, "no new evidence")));
    });
  }
  const memory = run.steps.filter((s) => s.event === "infmem_step" || s.event === "memagent_step");
  if (memory.length) {
    const limit = Math.max(...memory.map((s) => s.memory_tokens || 0), 1);
    panel.append(el("h3", {}, run.graph === "infmem" ? "Streamed chunks: PreThink and memory" : "Streamed chunks: memory"),
      el("table", {class: "memory-steps"},
        el("thead", {}, el("tr", {}, ["step", "characters", "decision", "query", "retrieved", "memory tokens"].map((h) => el("th", {}, h)))),
        el("tbody", {}, memory.map((s) => el("tr", {"data-step": String(s.step)},
          el("td", {}, s.step), el("td", {}, `${fmt(s.start)}–${fmt(s.end)}`),
          el("td", {class: s.decision === "STOP" ? "stop" : ""}, s.decision || "write"),
          el("td", {}, s.query ? `${s.query} (top ${s.top_k})` : ""),
          el("td", {}, s.retrieved ? String(s.retrieved.length) : ""),
          el("td", {}, el("span", {class: "membar", style: `width:${(60 * (s.memory_tokens || 0) / limit).toFixed(0)}px`}), ` ${s.memory_tokens}`))))));
  }
}

boot();
