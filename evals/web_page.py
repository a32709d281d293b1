"""The web page driven in a real browser: shared by its tests, its benchmark and its screenshots.

Headless Chromium through Selenium, with Debian's ``chromium`` and ``chromium-driver`` (the
paths are given to Selenium, so it never looks for a driver to download). A served collection is
ingested in a child process before the server starts: the embedded Chroma is not process-safe,
and the server is then its one writer. Every wait is bounded.

``mia bench web`` asks with ``rag`` and ``mia_rag`` on the page and prints how long each answer's
first token took to reach the screen after the model produced it (goal ≤ 1 s) and the size of
the page's own assets (goal ≤ 1 MB); ``--screenshots DIR`` also saves the chat with the signature
panel and a citation in its book context, as the README shows them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from mia.graph.server import Server, ingest_elsewhere, start_server
from mia.graph.web_api import ASSETS

BROWSER_PACKAGES = "chromium chromium-driver"
WAIT_S = 300.0
"""Longest wait for one page event: an answer from the embedded model on two busy cores."""

def browser_missing() -> str | None:
    """Why the browser cannot run here (naming the Debian packages to install), or None."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found: install Debian's {BROWSER_PACKAGES} (apt-get install {BROWSER_PACKAGES})"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: python -m pip install -e '.[test]'"
    return None


@contextlib.contextmanager
def chromium(width: int = 1560, height: int = 980) -> Iterator[Any]:
    """A headless Chromium (Selenium WebDriver), closed on exit."""
    reason = browser_missing()
    if reason:
        raise RuntimeError(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                 "--disable-extensions", "--disable-background-networking", "--disable-sync", "--mute-audio",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, condition: Callable[[Any], Any], timeout: float = WAIT_S, what: str = "the page") -> Any:
    """``condition(driver)`` once it is truthy, polling; a timeout names what was awaited and the page's status line."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition)
    except TimeoutException:
        status = driver.execute_script("const s = document.getElementById('status'); return s ? s.textContent : '';")
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; page status: {status!r}") from None


def open_page(driver: Any, server: Server, key: str | None = None, **hash_params: str) -> None:
    """Load the page with the key (kept in the tab's session storage, dropped from the URL) and
    hash parameters such as ``collection`` and ``graph``."""
    from urllib.parse import urlencode

    params = {**({"key": key} if key else {}), **hash_params}
    driver.get("about:blank")  # a new hash alone would not reload the page
    driver.get(f"{server.url}/mia/" + (f"#{urlencode(params)}" if params else ""))
    wait_for(driver, lambda d: d.execute_script(
        "return !document.getElementById('app').hidden || !document.getElementById('error-page').hidden;"), 60, "the page to load")


def choose(driver: Any, element_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", element_id)).select_by_value(value)


def set_setting(driver: Any, name: str, value: Any) -> None:
    """Change a side-panel setting the way a user does (type, then leave the field)."""
    driver.execute_script("document.getElementById('settings-panel').open = true;")
    field = driver.find_element("id", f"setting-{name}")
    if field.tag_name == "select":
        choose(driver, field.get_attribute("id"), str(value))
    else:
        field.clear()
        field.send_keys(str(value))
    driver.execute_script("arguments[0].dispatchEvent(new Event('change'));", field)


def ask(driver: Any, question: str, timeout: float = WAIT_S) -> Any:
    """Type a question, send it, and return the answer's message element once it is finished."""
    before = len(driver.find_elements("css selector", ".message.assistant"))
    box = driver.find_element("id", "question")
    box.send_keys(question)
    driver.find_element("id", "ask").click()
    wait_for(driver, lambda d: len(d.find_elements("css selector", ".message.assistant")) > before, 30, "the answer to start")
    message = driver.find_elements("css selector", ".message.assistant")[before]
    wait_for(driver, lambda d: "pending" not in message.get_attribute("class"), timeout, f"the answer to {question!r}")
    return message


def asset_bytes() -> dict[str, int]:
    """Bytes of each file the page loads from the server (all of its own assets)."""
    return {p.name: p.stat().st_size for p in sorted(ASSETS.iterdir()) if p.is_file()}


# ---- mia bench web ------------------------------------------------------------------------------------
DEMO_BOOKS = ("a_study_in_scarlet.txt", "the_sign_of_the_four.txt")
DEMO_COLLECTION = "holmes-web"
DEMO_QUESTION = "In which country was Dr. Watson wounded while serving as an army surgeon?"
DEMO_SETTINGS = {"top_k": 5, "max_new_tokens": 48}


@dataclass(frozen=True)
class WebRun:
    graph: str
    answer: str
    first_token_s: float
    screen_after_model_s: float | None


def measure(work: Path, screenshots: Path | None, books_dir: Path) -> dict[str, Any]:
    """Serve two Holmes novels, ask once with rag and once with mia_rag on the page, time the first
    token's way to the screen, and optionally save the two screenshots."""
    chroma = work / "chroma"
    books = [books_dir / name for name in DEMO_BOOKS]
    ingest_elsewhere({DEMO_COLLECTION: books}, chroma)
    runs: list[WebRun] = []
    with start_server(env={"MIA_CHROMA_PATH": str(chroma), "MIA_INGEST_ROOT": str(books_dir)}, state_dir=work / "server") as server, \
            chromium() as driver:
        open_page(driver, server, collection=DEMO_COLLECTION)
        for name, value in DEMO_SETTINGS.items():
            set_setting(driver, name, value)
        for graph in ("rag", "mia_rag"):
            choose(driver, "graph", graph)
            message = ask(driver, DEMO_QUESTION)
            timing = driver.execute_script("return window.miaTimings[window.miaTimings.length - 1] || null;")
            runs.append(WebRun(graph, message.find_element("css selector", ".body").text,
                               float(timing["first_token_s"]) if timing else float("nan"),
                               timing.get("screen_after_model_s") if timing else None))
        wait_for(driver, lambda d: d.find_elements("css selector", "#signature-panel .sig-row"), 60, "the signature panel")
        if screenshots is not None:
            screenshots.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(screenshots / "web-chat-signature.png"))
            driver.find_elements("css selector", ".message.assistant .citation")[0].click()
            wait_for(driver, lambda d: d.find_element("id", "passage").get_attribute("open") is not None, 30, "the passage")
            time.sleep(0.5)  # the mark scrolls into view
            driver.save_screenshot(str(screenshots / "web-citation.png"))
    latencies = [r.screen_after_model_s for r in runs if r.screen_after_model_s is not None]
    return {
        "collection": DEMO_COLLECTION, "books": list(DEMO_BOOKS), "question": DEMO_QUESTION, "settings": DEMO_SETTINGS,
        "runs": [r.__dict__ for r in runs],
        "screen_after_model_s_max": max(latencies) if latencies else None,
        "screen_after_model_s_median": statistics.median(latencies) if latencies else None,
        "assets_bytes": asset_bytes(), "assets_total_bytes": sum(asset_bytes().values()),
    }


def print_result(result: dict[str, Any]) -> None:
    print(f"web page, collection {result['collection']} ({', '.join(result['books'])}), MiniLM + embedded Qwen2.5-0.5B, "
          f"settings {result['settings']}")
    print(f"question: {result['question']}")
    print("| graph | first token on screen after asking (s) | on screen after the model produced it (s) | answer |")
    print("|---|---|---|---|")
    for r in result["runs"]:
        after = "n/a" if r["screen_after_model_s"] is None else f"{r['screen_after_model_s']:.3f}"
        print(f"| {r['graph']} | {r['first_token_s']:.2f} | {after} | {r['answer'][:60]} |")
    worst = result["screen_after_model_s_max"]
    print(f"first token on screen after the model's first token: max {worst if worst is None else f'{worst:.3f}'} s (goal ≤ 1 s)")
    print(f"page assets: {result['assets_total_bytes']:,} bytes ({', '.join(f'{k} {v:,}' for k, v in result['assets_bytes'].items())}) "
          "(goal ≤ 1 MB)")


def cmd_web_bench(args: argparse.Namespace) -> int:
    import tempfile

    from mia.stores.settings import data_root

    reason = browser_missing()
    if reason:
        print(f"mia: error: {reason}", file=sys.stderr)
        return 2
    books_dir = data_root() / "books" / "holmes"
    if not all((books_dir / name).is_file() for name in DEMO_BOOKS):
        print(f"mia: error: the Holmes books are not under {books_dir}: set MIA_DATA to the shared data folder", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mia-web-bench-") as work:
        result = measure(Path(work), args.screenshots, books_dir)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_result(result)
    return 0


def add_web_bench(benches: Any) -> argparse.ArgumentParser:
    p = benches.add_parser("web", help="the web page in headless Chromium: first token's time to the screen (goal ≤ 1 s), asset size (≤ 1 MB)")
    p.add_argument("--screenshots", type=Path, default=None, help="also save the chat and citation screenshots into this folder (e.g. docs)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_web_bench)
    return p
