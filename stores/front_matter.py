"""Project Gutenberg front and back matter: where a book's own text starts and ends.

Every Project Gutenberg file wraps the book in a licence header and a long licence footer. Ingested
as book text, they become chunks that compete in every ranking, and the first session summary
summarises the licence. The markers Gutenberg has used over the years are recognised here and the
text outside them is left out of chunks and summaries. So is a table of contents and the title page
before it: a list of every chapter's title matches questions about any of them, and was retrieved
and cited in place of the passage that answers ("Afghanistan [1]" citing "CHAPTER I. MR. SHERLOCK
HOLMES. ..."). The stored book text stays the original file, so every chunk offset still points
into it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Header ends: "*** START OF THE PROJECT GUTENBERG EBOOK X ***" (and THIS, E-BOOK, ETEXT, no spaces),
# or the 1990s small print's last line "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*...".
_START = re.compile(
    r"^[ \t]*\*{3}[ \t]*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*$"
    r"|^[ \t]*\*+[ \t]*END[ \t*]*THE SMALL PRINT[^\n]*$",
    re.IGNORECASE | re.MULTILINE,
)
# Footer starts: "*** END OF THE PROJECT GUTENBERG EBOOK X ***", or the line before it in older files,
# "End of the Project Gutenberg EBook of X" / "End of Project Gutenberg's X" / "End of The Project Gutenberg Etext".
_END = re.compile(
    r"^[ \t]*\*{3}[ \t]*END OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*$"
    r"|^[ \t]*End of (?:the )?Project Gutenberg(?:'s|’s)?[ \t][^\n]*$",
    re.IGNORECASE | re.MULTILINE,
)


@dataclass(frozen=True)
class Body:
    """The book's own text is ``text[start:end]``; everything else is front or back matter."""

    start: int
    end: int
    total: int

    @property
    def left_out(self) -> int:
        """Characters of front and back matter, what ``mia ls`` reports."""
        return self.total - (self.end - self.start)


def find_body(text: str) -> Body:
    """The span between the Gutenberg header and footer; the whole text where there are none.

    A header without a footer (a truncated file) keeps everything after the header, and a footer
    without a header keeps everything before it. Markers that would leave no text at all are
    ignored, so a file that only mentions them is never emptied.
    """
    start, end = 0, len(text)
    header = _START.search(text)
    if header:
        start = header.end()
    footer = _END.search(text, start)
    if footer:
        end = footer.start()
    if not text[start:end].strip():
        return Body(0, len(text), len(text))
    return Body(contents_end(text, start, end) or start, end, len(text))


_PUNCTUATION = re.compile(r"[^\w\s]")
_CONTENTS = re.compile(r"^[ \t]*(?:table of )?contents\.?[ \t]*$", re.IGNORECASE | re.MULTILINE)
CONTENTS_WITHIN = 1_500
"""How far into the book a table of contents may start (characters): a title page is cut with it,
a preface or an introduction before it is not, so a later table is left alone."""
MAX_ENTRIES = 200


def contents_end(text: str, start: int, end: int) -> int | None:
    """Where the text after a table of contents starts, or None when ``text[start:end]`` opens with
    none. A table is a line that says "Contents" within the first ``CONTENTS_WITHIN`` characters,
    then at least three lines (its entries, and any list that follows, such as illustrations); it
    ends at the first line that repeats the start of an entry (the first chapter's own heading,
    "CHAPTER I." after "CHAPTER I. I GO TO STYLES"). Wrapped prose before that repeat (a line
    running on into one that starts in lower case) means the heading named something else, and
    nothing is cut; so does a table whose end is not found."""
    heading = _CONTENTS.search(text, start, min(end, start + CONTENTS_WITHIN))
    if heading is None:
        return None
    entries: list[str] = []
    at, previous = heading.end(), ""
    for line in text[heading.end():end].splitlines(keepends=True):
        stripped = line.strip()
        if previous and stripped[:1].islower() or len(entries) > MAX_ENTRIES:
            return None
        key = " ".join(_PUNCTUATION.sub(" ", line).split()).upper()
        if key:
            if len(entries) >= 3 and any(e == key or e.startswith(key + " ") for e in entries):
                return at
            entries.append(key)
        at, previous = at + len(line), stripped
    return None
