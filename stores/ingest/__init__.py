"""Ingestion: text files → a mindscape, one builder per level of the memory (``stores/units.py``).

``pipeline`` is the one way in (the CLI, the server's ``ingest`` graph, the harness and the tests);
it calls ``chunks`` (passages), ``sessions`` (a summary per window of chunks) and, once the books are
committed, ``story`` (the written tree above written sessions: parts, then the whole book's plot),
``books`` (a unit over each whole book: its card) and ``names`` (who is who in it). Adding a
level is adding a builder.
"""

from mia.stores.ingest.options import (EMBED_BATCH, LLM_SUMMARIZERS, SUMMARIZERS, IngestOptions, IngestReport,
                                       ProgressHook, Summarizer)
from mia.stores.ingest.pipeline import ingest, ingest_sources
from mia.stores.ingest.sources import SUPPORTED_SUFFIXES, InputError, Source, book_id, collect_sources, decode_text

__all__ = ["EMBED_BATCH", "LLM_SUMMARIZERS", "SUMMARIZERS", "SUPPORTED_SUFFIXES", "IngestOptions", "IngestReport",
           "InputError", "ProgressHook", "Source", "Summarizer", "book_id", "collect_sources", "decode_text", "ingest",
           "ingest_sources"]
