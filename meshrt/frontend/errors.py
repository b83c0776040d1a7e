"""Frontend diagnostics: one located line, never a traceback.

Every error a user can cause with a spec, a config.json, a target file or a
mapping choice is a `FrontendError` (a `meshrt.diagnostics.MeshrtError`
located in a file); its `str` is the whole message the CLI
prints: `FILE:LINE:COL: error: ...` when the position is known, otherwise
`FILE: error: ...`.
"""

from __future__ import annotations

from meshrt.diagnostics import FrontendError, Loc

__all__ = ["FrontendError", "Loc", "locate_text"]


def locate_text(text: str, needle: str, start: int = 0) -> tuple[int, int]:
    """(line, col) of the first `needle` in `text` at or after `start`; (0, 0) if absent."""
    i = text.find(needle, start)
    if i < 0:
        return 0, 0
    line = text.count("\n", 0, i) + 1
    col = i - (text.rfind("\n", 0, i) + 1) + 1
    return line, col
