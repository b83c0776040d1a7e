"""Bounds on input, in one place: JSON read with located errors (nesting
depth, finite numbers), and memory asked of this machine, estimated before
it is allocated.

Every reader of a JSON file (config.json, expert profiles, region models,
workload lines) goes through `parse_json`; every allocation that grows with
the input (the NumPy reference, the interpreter's per-core state) is
estimated first and refused with `check_memory` when the machine cannot hold
it, naming the estimate and what to use instead.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from meshrt.diagnostics import FrontendError, Loc

__all__ = ["MAX_JSON_DEPTH", "MAX_JSON_DIGITS", "JSONInputError", "check_memory", "format_bytes",
           "machine_bytes", "parse_json"]

MAX_JSON_DEPTH = 64  # arrays / objects inside each other; real inputs need 4 or 5
MAX_JSON_DIGITS = 40  # digits of an integer; every count meshrt reads fits in 20


class JSONInputError(ValueError):
    """JSON text meshrt does not read: `msg` at 1-based `line`, `col` (0 when unknown)."""

    def __init__(self, msg: str, line: int = 0, col: int = 0):
        super().__init__(msg)
        self.msg, self.line, self.col = msg, line, col

    def loc(self, name: str) -> Loc:
        return Loc(name, self.line, self.col)


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


def _line_col(text: str, i: int) -> tuple[int, int]:
    return text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1


def _check_depth(text: str) -> None:
    depth = 0
    for m in _TOKENS.finditer(text):
        c = m.group(0)
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise JSONInputError(f"nested deeper than {MAX_JSON_DEPTH} arrays or objects",
                                     *_line_col(text, m.start()))
        elif c in "]}":
            depth = max(depth - 1, 0)


def parse_json(text: str) -> Any:
    """`json.loads(text)`, refusing nesting deeper than MAX_JSON_DEPTH (before
    parsing: Python's parser would overflow its stack), NaN and Infinity,
    floats that overflow (1e400) and integers of more than MAX_JSON_DIGITS
    digits; a JSONInputError says what and where."""
    _check_depth(text)

    def where(token: str) -> tuple[int, int]:
        i = text.find(token)
        return _line_col(text, i) if i >= 0 else (0, 0)

    def constant(name: str):
        raise JSONInputError(f"{name} is not a finite number", *where(name))

    def number(s: str) -> float:
        v = float(s)
        if not math.isfinite(v):
            raise JSONInputError(f"number {s} is out of range (not a finite number)", *where(s))
        return v

    def integer(s: str) -> int:
        digits = len(s.lstrip("-"))
        if digits > MAX_JSON_DIGITS:
            raise JSONInputError(f"integer {s[:8]}... ({digits} digits) is out of range", *where(s))
        return int(s)

    try:
        return json.loads(text, parse_constant=constant, parse_float=number, parse_int=integer)
    except json.JSONDecodeError as e:
        raise JSONInputError(e.msg, e.lineno, e.colno) from None
    except RecursionError:  # belt and braces: _check_depth bounds it well below the stack
        raise JSONInputError(f"nested deeper than {MAX_JSON_DEPTH} arrays or objects") from None


# -- memory ---------------------------------------------------------------------
def machine_bytes() -> int:
    """Memory this process can still allocate: MemAvailable of /proc/meminfo
    (else the physical memory), less under an address-space limit (`ulimit
    -v`); the environment variable MESHRT_MEMORY_BYTES overrides it."""
    override = os.environ.get("MESHRT_MEMORY_BYTES")
    if override:
        try:
            v = float(override)
        except ValueError:
            v = math.nan
        if not math.isfinite(v) or v < 0:
            raise FrontendError(f"MESHRT_MEMORY_BYTES must be a number of bytes, got '{override}'")
        return int(v)
    have = _meminfo("MemAvailable")
    if have is None:
        try:
            have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            have = 1 << 62  # unknown: do not refuse
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm", encoding="ascii") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            have = min(have, max(soft - used, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return have


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def format_bytes(n: float) -> str:
    """`n` bytes in decimal units: "16.10 GB"."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def check_memory(needed: float, what: str, instead: str, where: Loc | str | None = None) -> None:
    """Refuse (FrontendError at `where`) when `needed` bytes for `what` exceed
    what this machine has: "needs 16.1 GB for WHAT; this machine has 3.2 GB
    available: INSTEAD"."""
    have = machine_bytes()
    if needed > have:
        raise FrontendError(f"needs {format_bytes(needed)} for {what}; this machine has "
                            f"{format_bytes(have)} available: {instead}", where)
