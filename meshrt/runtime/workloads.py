"""Serving workloads: requests, synthetic generators, a JSONL loader, and the
static-batching padding metric.

No real trace is bundled. ``chat_like`` and ``reasoning_like`` are
*synthetic* generators whose length distributions imitate the published shape
of ShareGPT chat traces and of long reasoning traces (OpenThoughts-style);
they are not those datasets and reproduce none of their content. Users with a
real trace convert it to the JSONL format read by :func:`load_jsonl`.

Length semantics
----------------
``max_new_tokens`` is the serving cap a request was submitted with;
``output_len`` (<= cap) is where its response actually ends, i.e. the serving
loop forces the request to finish there (random-weight models do not emit EOS
at realistic points). Static batching runs a batch until its longest request
is done, which is what :func:`padding_fraction` measures.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshrt.limits import JSONInputError, parse_json
from meshrt.output import atomic_file

__all__ = [
    "CHAT_OUTPUT",
    "CHAT_PROMPT",
    "REASONING_OUTPUT",
    "REASONING_PROMPT",
    "WORKLOADS",
    "LengthDist",
    "Request",
    "WorkloadError",
    "chat_like",
    "get_workload",
    "load_jsonl",
    "padding_fraction",
    "reasoning_like",
    "synthetic",
    "write_jsonl",
]


class WorkloadError(Exception):
    """Bad workload input. ``str(err)`` is one line,
    ``PATH:LINE: error: <what is wrong>`` for a problem on a line of a file,
    ``PATH: error: <what>`` for a file-level problem (unreadable, empty), and
    ``error: <what>`` otherwise (e.g. an unknown workload name)."""

    def __init__(self, reason: str, path: str | None = None, line: int | None = None):
        self.reason, self.path, self.line = reason, path, line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}error: {reason}")


@dataclass
class Request:
    """One serving request. ``prompt_len == len(prompt)`` and
    ``1 <= output_len <= max_new_tokens`` always hold."""

    id: int | str
    arrival: float  # seconds since the start of the run
    prompt: list[int]
    prompt_len: int
    max_new_tokens: int
    output_len: int
    # Prefill done elsewhere: the request arrives with the KV cache of its first positions
    # (`meshrt.runtime.kv_cache`), from a workload file's "kv" (the .npz's path) or made
    # in memory (`kv`: a `reference.KVState`; `kv_cache.attach` loads a file into it).
    kv_file: str | None = None
    kv: Any = None

    @property
    def kv_len(self) -> int:
        """Positions of the prompt the arriving KV cache holds (0: none, prefill on chip)."""
        return 0 if self.kv is None else self.kv.length

    def __post_init__(self) -> None:
        if self.prompt_len != len(self.prompt):
            raise ValueError(f"request {self.id}: prompt_len {self.prompt_len} != len(prompt) {len(self.prompt)}")
        if self.prompt_len < 1:
            raise ValueError(f"request {self.id}: empty prompt")
        if not 1 <= self.output_len <= self.max_new_tokens:
            raise ValueError(
                f"request {self.id}: need 1 <= output_len ({self.output_len}) <= max_new_tokens ({self.max_new_tokens})"
            )
        if not (math.isfinite(self.arrival) and self.arrival >= 0):
            raise ValueError(f"request {self.id}: arrival must be finite and >= 0")


# --------------------------------------------------------------------------
# Synthetic generators
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class LengthDist:
    """Clipped log-normal token-length distribution:
    ``clip(round(median * exp(sigma * N(0,1))), 1, cap)``. Its median is
    ``median`` (while ``median < cap``) and its mean about
    ``median * exp(sigma**2 / 2)`` less what the cap removes."""

    median: float
    sigma: float
    cap: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raw = self.median * np.exp(self.sigma * rng.standard_normal(n))
        return np.clip(np.rint(raw), 1, self.cap).astype(np.int64)


# ShareGPT-like chat. Sources: the vLLM paper (Kwon et al., SOSP'23, Fig. 11)
# reports ShareGPT first-turn means of 161 prompt / 338 output tokens (OPT
# tokenizer), both heavily right-skewed with a tail to ~2k; vLLM's
# benchmark_serving on 1000 sampled ShareGPT prompts (prompt <= 1024, total
# <= 2048, Llama-3 tokenizer) totals ~215k input and ~198k output tokens,
# i.e. means ~215 / ~198. The output parameters below give median 210, mean
# ~325, p99 ~2k; the prompt parameters give median 90, mean ~160.
CHAT_OUTPUT = LengthDist(median=210.0, sigma=1.0, cap=2048)
CHAT_PROMPT = LengthDist(median=90.0, sigma=1.1, cap=1024)

# Reasoning traces (OpenThoughts-like: distilled long chains of thought on
# math/code/science problems). Shape only: median ~4k output tokens, mean
# ~5.5k, p99 ~25k, capped at 32k (a common reasoning max_tokens); short problem
# statements as prompts (median 200). No published per-request statistics
# were available to fit these numerically.
REASONING_OUTPUT = LengthDist(median=4000.0, sigma=0.8, cap=32768)
REASONING_PROMPT = LengthDist(median=200.0, sigma=0.8, cap=4096)


def _scaled(lengths: np.ndarray, scale: float, cap: int | None) -> np.ndarray:
    out = np.maximum(1, np.rint(lengths * scale)).astype(np.int64)
    return np.minimum(out, cap) if cap is not None else out


def synthetic(
    n: int,
    seed: int,
    rate: float | None,
    output_dist: LengthDist,
    prompt_dist: LengthDist,
    *,
    scale: float = 1.0,
    vocab: int = 32000,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
) -> list[Request]:
    """Draw ``n`` requests. Lengths are drawn at full size, multiplied by
    ``scale`` (rounded, at least 1), then clamped to ``max_prompt_len`` /
    ``max_output_len`` (in scaled tokens). ``max_new_tokens`` is the scaled
    distribution cap (or ``max_output_len`` if smaller). Arrivals are a
    Poisson process of ``rate`` requests/s (``None``: all at t=0). Prompt
    tokens are uniform in ``[0, vocab)``.

    Lengths, arrivals and tokens come from independent streams of ``seed``,
    so changing ``rate`` or ``vocab`` does not change the lengths."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if not scale > 0:
        raise ValueError("scale must be > 0")
    if vocab < 1:
        raise ValueError("vocab must be >= 1")
    if rate is not None and not rate > 0:
        raise ValueError("rate must be > 0 (or None for all-at-once)")
    for name, cap in (("max_prompt_len", max_prompt_len), ("max_output_len", max_output_len)):
        if cap is not None and cap < 1:
            raise ValueError(f"{name} must be >= 1")
    len_rng, arr_rng, tok_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    out_full = output_dist.sample(len_rng, n)
    prompt_full = prompt_dist.sample(len_rng, n)
    out_len = _scaled(out_full, scale, max_output_len)
    prompt_len = _scaled(prompt_full, scale, max_prompt_len)
    cap = int(_scaled(np.array([output_dist.cap]), scale, max_output_len)[0])
    if rate is None:
        arrivals = np.zeros(n)
    else:
        arrivals = np.cumsum(arr_rng.exponential(1.0 / rate, n))
    reqs = []
    for i in range(n):
        prompt = tok_rng.integers(0, vocab, int(prompt_len[i])).tolist()
        reqs.append(Request(i, float(arrivals[i]), prompt, len(prompt), cap, int(min(out_len[i], cap))))
    return reqs


def chat_like(
    n: int,
    seed: int = 0,
    rate: float | None = None,
    *,
    scale: float = 1.0,
    vocab: int = 32000,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
) -> list[Request]:
    """Synthetic chat workload with the length *shape* of ShareGPT traces (not
    the dataset). Output: log-normal, median 210, sigma 1.0, capped at 2048
    (mean ~325, p99 ~2k). Prompt: log-normal, median 90, sigma 1.1, capped at
    1024 (mean ~160). See ``CHAT_OUTPUT`` / ``CHAT_PROMPT`` for the sources.
    Other arguments as in :func:`synthetic`."""
    return synthetic(
        n, seed, rate, CHAT_OUTPUT, CHAT_PROMPT,
        scale=scale, vocab=vocab, max_prompt_len=max_prompt_len, max_output_len=max_output_len,
    )


def reasoning_like(
    n: int,
    seed: int = 0,
    rate: float | None = None,
    *,
    scale: float = 1.0,
    vocab: int = 32000,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
) -> list[Request]:
    """Synthetic reasoning workload with the length *shape* of long reasoning
    traces such as OpenThoughts (not the dataset). Output: log-normal, median
    4000, sigma 0.8, capped at 32768 (mean ~5.5k, p99 ~25k). Prompt:
    log-normal, median 200, sigma 0.8, capped at 4096. Other arguments as in
    :func:`synthetic`."""
    return synthetic(
        n, seed, rate, REASONING_OUTPUT, REASONING_PROMPT,
        scale=scale, vocab=vocab, max_prompt_len=max_prompt_len, max_output_len=max_output_len,
    )


# --------------------------------------------------------------------------
# JSONL
# --------------------------------------------------------------------------

_FIELDS = ("id", "arrival", "prompt", "prompt_len", "max_new_tokens", "output_len", "kv")
# Bounds a request file may ask for: beyond them a number is an error, not an
# allocation or an overflow (a year of arrivals; a million tokens, 8x the longest
# context any model here has).
MAX_ARRIVAL_S = 86_400.0 * 365
MAX_REQUEST_TOKENS = 1 << 20


def _short(v: int | float) -> str:
    """A number for a one-line message (a 400-digit integer is cut)."""
    text = repr(v)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_line(obj: Any, vocab: int, lineno: int, err: Callable[[str], WorkloadError],
                base: str = "") -> Request:
    if not isinstance(obj, dict):
        raise err(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(_FIELDS))
    if unknown:
        raise err(f"unknown field {unknown[0]!r} (allowed: {', '.join(_FIELDS)})")

    def need_int(name: str, minimum: int, maximum: int = MAX_REQUEST_TOKENS) -> int:
        v = obj[name]
        if not _is_int(v):
            raise err(f"{name} must be an integer, got {json.dumps(v)}")
        if v < minimum:
            what = "negative" if v < 0 else "too small"
            raise err(f"{name} is {what}: {v} (must be >= {minimum})")
        if v > maximum:
            raise err(f"{name} is too large: {_short(v)} (at most {maximum})")
        return v

    if "arrival" not in obj:
        raise err("missing field 'arrival'")
    arrival = obj["arrival"]
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)):
        raise err(f"arrival must be a number of seconds, got {json.dumps(arrival)}")
    if isinstance(arrival, float) and not math.isfinite(arrival):
        raise err("arrival must be finite")
    if arrival < 0:
        raise err(f"arrival is negative: {_short(arrival)}")
    if arrival > MAX_ARRIVAL_S:
        raise err(f"arrival is too late: {_short(arrival)} s (at most {MAX_ARRIVAL_S:.0f} s)")

    if "max_new_tokens" not in obj:
        raise err("missing field 'max_new_tokens'")
    max_new = need_int("max_new_tokens", 1)

    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, list):
            raise err(f"prompt must be a list of token ids, got {type(prompt).__name__}")
        if not prompt:
            raise err("prompt is empty")
        for j, t in enumerate(prompt):
            if not _is_int(t):
                raise err(f"prompt[{j}] must be an integer token id, got {json.dumps(t)}")
            if not 0 <= t < vocab:
                raise err(f"prompt[{j}] = {t} is out of vocab (0..{vocab - 1})")
        if "prompt_len" in obj:
            plen = need_int("prompt_len", 1)
            if plen != len(prompt):
                raise err(f"prompt_len {plen} does not match the {len(prompt)} prompt tokens")
    elif "prompt_len" in obj:
        plen = need_int("prompt_len", 1)
        # Deterministic per line so reloading a file gives the same tokens.
        prompt = np.random.default_rng((0x6D657368, lineno)).integers(0, vocab, plen).tolist()
    else:
        raise err("missing field 'prompt' or 'prompt_len'")

    output_len = max_new
    if "output_len" in obj:
        output_len = need_int("output_len", 1)
        if output_len > max_new:
            raise err(f"output_len {output_len} exceeds max_new_tokens {max_new}")

    rid = obj.get("id", lineno)
    if isinstance(rid, bool) or not isinstance(rid, (int, str)):
        raise err(f"id must be a string or an integer, got {json.dumps(rid)}")
    kv_file = None
    if "kv" in obj:
        kv_file = obj["kv"]
        if not isinstance(kv_file, str) or not kv_file:
            raise err(f"kv must be the path of a .npz KV cache, got {json.dumps(kv_file)[:40]}")
        kv_file = os.path.join(base, kv_file)
        if not os.path.isfile(kv_file):
            raise err(f"kv: no such file {kv_file}")
    return Request(rid, float(arrival), [int(t) for t in prompt], len(prompt), max_new, output_len,
                   kv_file)


def load_jsonl(path: str | os.PathLike, vocab: int) -> list[Request]:
    """Read a workload: one JSON object per line with ``arrival`` (seconds,
    >= 0), ``prompt`` (list of token ids in [0, vocab)) or ``prompt_len``
    (int >= 1; tokens are then drawn deterministically from the line number),
    ``max_new_tokens`` (int >= 1), optional ``id`` (string or int, default the
    line number, unique), optional ``output_len`` (1..max_new_tokens, default
    max_new_tokens). Blank lines are skipped. Arrivals need not be monotonic;
    requests are returned sorted by arrival (stable). Any problem raises
    :class:`WorkloadError` naming the file and line."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            raw_lines = f.read().split(b"\n")
    except OSError as e:
        raise WorkloadError(f"cannot read file: {e.strerror or e}", p) from None
    reqs: list[Request] = []
    seen: dict[int | str, int] = {}
    for lineno, raw in enumerate(raw_lines, start=1):

        def err(reason: str, _ln: int = lineno) -> WorkloadError:
            return WorkloadError(reason, p, _ln)

        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise err("line is not valid UTF-8") from None
        if not text.strip():
            continue
        try:
            obj = parse_json(text)
        except JSONInputError as e:
            raise err(f"invalid JSON: {e.msg}" + (f" (column {e.col})" if e.col else "")) from None
        req = _parse_line(obj, vocab, lineno, err, os.path.dirname(p))
        if req.id in seen:
            raise err(f"duplicate id {json.dumps(req.id)} (first on line {seen[req.id]})")
        seen[req.id] = lineno
        reqs.append(req)
    if not reqs:
        raise WorkloadError("file contains no requests", p)
    reqs.sort(key=lambda r: r.arrival)
    return reqs


def write_jsonl(path: str | os.PathLike, requests: Iterable[Request]) -> None:
    """Write requests in the format :func:`load_jsonl` reads (a request's KV cache as the
    file it came from: one made in memory must be saved first, `kv_cache.save_kv`)."""
    requests = list(requests)
    for r in requests:
        if r.kv is not None and r.kv_file is None:
            raise ValueError(f"request {r.id} holds a KV cache made in memory: save it "
                             "(kv_cache.save_kv) and set its kv_file first")
    with atomic_file(path) as f:
        for r in requests:
            rec = {
                "id": r.id,
                "arrival": r.arrival,
                "prompt": r.prompt,
                "max_new_tokens": r.max_new_tokens,
                "output_len": r.output_len,
            }
            if r.kv_file is not None:
                rec["kv"] = os.path.relpath(os.path.abspath(r.kv_file),
                                            os.path.dirname(os.path.abspath(path)))
            f.write(json.dumps(rec) + "\n")


# --------------------------------------------------------------------------
# Padding under static batching
# --------------------------------------------------------------------------


def padding_fraction(output_lens: Sequence[int] | Sequence[Request], batch_size: int) -> float:
    """Fraction of decode slots wasted on padding under static batching.

    Requests are grouped in the given (arrival) order into consecutive
    batches of ``batch_size``; each batch runs until its longest member
    finishes, so a request of length L in a batch with maximum M occupies M
    slots of which M - L are padding. A short final batch is padded only
    among the requests it holds (empty seats are not counted). Returns
    padded / occupied slots, 0.0 for no work. Accepts lengths or Requests
    (their ``output_len``)."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    lens = np.asarray([getattr(x, "output_len", x) for x in output_lens], dtype=np.int64)
    if lens.size and lens.min() < 0:
        raise ValueError("output lengths must be >= 0")
    occupied = useful = 0
    for i in range(0, lens.size, batch_size):
        b = lens[i : i + batch_size]
        occupied += int(b.max()) * b.size
        useful += int(b.sum())
    return 0.0 if occupied == 0 else (occupied - useful) / occupied


# --------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------

WORKLOADS: dict[str, Callable[..., list[Request]]] = {
    "chat": chat_like,
    "reasoning": reasoning_like,
}


def check_workload(name: str) -> None:
    """Fail fast (WorkloadError) on a workload that is neither bundled nor an
    existing .jsonl file, before any work is done for it."""
    if str(name).endswith(".jsonl"):
        if not os.path.isfile(name):
            raise WorkloadError("no such workload file" if not os.path.exists(name) else "not a file",
                                str(name))
    elif name not in WORKLOADS:
        raise WorkloadError(f"unknown workload {name!r}: expected one of {', '.join(WORKLOADS)} "
                            "or a path ending in .jsonl")


def get_workload(
    name: str,
    n: int | None = None,
    seed: int = 0,
    rate: float | None = None,
    *,
    scale: float = 1.0,
    vocab: int = 32000,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
) -> list[Request]:
    """``"chat"`` / ``"reasoning"`` (synthetic; ``n`` defaults to 1000) or a
    path ending in ``.jsonl`` (``n`` if given keeps the first n requests by
    arrival; a file carries its own arrivals and lengths, so ``seed`` is
    unused and a ``rate`` or ``scale`` is an error; ``max_prompt_len`` /
    ``max_output_len`` are checked, not clamped)."""
    if str(name).endswith(".jsonl"):
        if rate is not None or scale != 1.0:
            raise WorkloadError("rate and scale apply only to synthetic workloads, not to a .jsonl file")
        reqs = load_jsonl(name, vocab)
        if max_prompt_len is not None or max_output_len is not None:
            for r in reqs:
                if max_prompt_len is not None and r.prompt_len > max_prompt_len:
                    raise WorkloadError(f"request {r.id} has prompt_len {r.prompt_len} > {max_prompt_len}", str(name))
                if max_output_len is not None and r.max_new_tokens > max_output_len:
                    raise WorkloadError(
                        f"request {r.id} has max_new_tokens {r.max_new_tokens} > {max_output_len}", str(name)
                    )
        return reqs if n is None else reqs[:n]
    gen = WORKLOADS.get(name)
    if gen is None:
        raise WorkloadError(f"unknown workload {name!r}: expected one of {', '.join(WORKLOADS)} or a path ending in .jsonl")
    try:
        return gen(
            1000 if n is None else n, seed, rate,
            scale=scale, vocab=vocab, max_prompt_len=max_prompt_len, max_output_len=max_output_len,
        )
    except ValueError as e:
        raise WorkloadError(str(e)) from None
