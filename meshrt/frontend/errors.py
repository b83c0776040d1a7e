"""Frontend diagnostics: one located line, never a traceback.

Every error a user can cause with a spec, a config.json, a target file or a
mapping choice is a `FrontendError`; its `str` is the whole message the CLI
prints: `FILE:LINE:COL: error: ...` when the position is known, otherwise
`FILE: error: ...`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Loc:
    """A position in a source file (1-based line and column; 0 = unknown)."""

    file: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        if self.line > 0:
            return f"{self.file}:{self.line}:{max(self.col, 1)}"
        return self.file


class FrontendError(Exception):
    """A user-facing error located in a source file."""

    def __init__(self, message: str, loc: Loc | str | None = None):
        if isinstance(loc, str):
            loc = Loc(loc)
        self.message = " ".join(message.split())  # always one line
        self.loc = loc
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.loc is None:
            return f"error: {self.message}"
        return f"{self.loc}: error: {self.message}"


def locate_text(text: str, needle: str, start: int = 0) -> tuple[int, int]:
    """(line, col) of the first `needle` in `text` at or after `start`; (0, 0) if absent."""
    i = text.find(needle, start)
    if i < 0:
        return 0, 0
    line = text.count("\n", 0, i) + 1
    col = i - (text.rfind("\n", 0, i) + 1) + 1
    return line, col
