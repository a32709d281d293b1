"""Project Gutenberg front and back matter: where a book's own text starts and ends.

Every Project Gutenberg file wraps the book in a licence header and a long licence footer. Ingested
as book text, they become chunks that compete in every ranking, and the first session summary
summarises the licence. The markers Gutenberg has used over the years are recognised here and the
text outside them is left out of chunks and summaries. The stored book text stays the original file,
so every chunk offset still points into it.
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
    return Body(start, end, len(text))
