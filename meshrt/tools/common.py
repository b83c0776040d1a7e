"""What the console tools share: the one-line failure, the bench's error, and
the largest target the interpreter simulates beside a model."""

from __future__ import annotations

import sys

INTERPRETER_MAX_CORES = 64 * 64  # targets the interpreter simulates beside the model


class BenchError(Exception):
    """Bad input or a configuration that cannot be built: one line for stderr."""


def fail(line: str) -> int:
    """Print `line` as one line on stderr (an error with no file gets `meshrt:`); exit code 1."""
    if line.startswith("error:"):  # a FrontendError with no file to blame
        line = f"meshrt: {line}"
    print(" ".join(line.split()), file=sys.stderr)
    return 1
