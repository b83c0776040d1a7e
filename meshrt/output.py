"""Writing outputs atomically: a failed run never truncates or half-writes a file.

Every file meshrt writes (`compile -o`, `meshrt-opt -o`, `--emit csl -o DIR`,
`run --trace`, bench and viz outputs, saved profiles and workloads) goes
through this module:

- `atomic_file(path, mode)` yields a file object on a new temporary file in
  the same directory (`.NAME.XXXXXXXX.tmp`, so the rename cannot cross file
  systems). On a normal exit it is flushed, synced and renamed onto `path`
  (`os.replace`, atomic on POSIX); on any exception (a failed write: disk
  full, `ulimit -f`; a failing pass; Ctrl-C) it is removed and an existing
  `path` is left as it was. A new file gets the permissions `open` would
  give it (0o666 less the umask), a replaced one keeps its own. A symlink is
  followed (its target is replaced, the link stays). A `path` that exists and
  is not a regular file (`/dev/null`, `/dev/stdout`, a pipe) cannot be renamed
  over and has nothing to truncate: it is written in place.
- `write_text`, `write_bytes`, `save_figure` write one file that way.
- `atomic_directory(path)` yields a new temporary directory beside `path` to
  fill. On success it becomes `path`: renamed onto it when `path` does not
  exist or is an empty directory; moved into it file by file (each with
  `os.replace`) when `path` is a directory that holds files already, so that
  files the new output does not have stay, as when writing into the
  directory. On failure it is removed. Either way no file of the output is
  ever partial.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

TEMP_SUFFIX = ".tmp"


def _temp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def _create_temp(target: Path, named: str | os.PathLike) -> tuple[int, Path]:
    """A new file beside `target`, opened for writing: (fd, path); errors name `named`."""
    while True:
        tmp = _temp_name(target)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as e:  # report the file the user named, not the temporary one
            e.filename = os.fspath(named)
            raise


def _regular_or_missing(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return True


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", *,
                encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """A file object whose content replaces `path` only if the block completes."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes whole files ('w' or 'wb'), not mode {mode!r}")
    text_kw = {} if "b" in mode else {"encoding": encoding}
    target = Path(os.path.realpath(path))
    if not _regular_or_missing(target):
        with open(target, mode, **text_kw) as f:
            yield f
        return
    fd, tmp = _create_temp(target, path)
    try:
        with open(fd, mode, **text_kw) as f:
            yield f
            if not f.closed:  # a caller (xdsl-opt's driver) may close it first
                f.flush()
                os.fsync(f.fileno())
        with suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(tmp, target)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


@contextmanager
def output_stream(path: str | os.PathLike | None) -> Iterator[IO[str]]:
    """`atomic_file(path)`, or stdout when `path` is None."""
    if path is None:
        yield sys.stdout
        return
    with atomic_file(path) as f:
        yield f


def write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> None:
    with atomic_file(path, encoding=encoding) as f:
        f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_file(path, "wb") as f:
        f.write(data)


def save_figure(fig, path: str | os.PathLike, **kwargs) -> None:
    """`fig.savefig(path, **kwargs)` (matplotlib), atomically; the format from the suffix."""
    kwargs.setdefault("format", Path(path).suffix[1:].lower() or None)
    with atomic_file(path, "wb") as f:
        fig.savefig(f, **kwargs)


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A directory to fill that becomes `path` only if the block completes."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)  # as writing `path/NAME` made them
    while True:
        tmp = _temp_name(target)
        try:
            os.mkdir(tmp, 0o777)  # the umask applies, as for a directory made with mkdir
            break
        except FileExistsError:
            continue
        except OSError as e:
            e.filename = os.fspath(path)
            raise
    try:
        yield tmp
        if target.is_dir() and any(target.iterdir()):
            _move_into(tmp, target)
            shutil.rmtree(tmp)
        else:
            if target.is_dir():
                os.rmdir(target)
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_into(src: Path, dst: Path) -> None:
    """Move every file under `src` to the same place under `dst`, each one atomically."""
    for root, _dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            os.replace(Path(root) / name, dst / rel / name)
