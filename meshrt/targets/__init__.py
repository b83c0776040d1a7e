"""Target descriptions: mesh size, per-core budgets, timing and kernel costs.

A target is a TOML data file (`wse3.toml`, `wse2.toml`, the tight test
targets `test32.toml` / `test16.toml`, or any user file with the same
schema). Every key is required and no other key is allowed, so a typo is a
located error (`PATH:LINE:COL: error: ...`) rather than a silently ignored
setting. The bundled files document each key.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshrt.dialects.mesh import Resources
from meshrt.frontend.errors import FrontendError, Loc

if TYPE_CHECKING:
    from meshrt.dialects.base import MappedProgramOp

TARGET_DIR = Path(__file__).parent

# Per-kernel cycle costs the cost model and the interpreter read. Each bundled
# TOML explains its figures; a user target must give all of them.
COST_KEYS: dict[str, str] = {
    "fmac": "cycles per multiply-accumulate element at the weight dtype (SIMD folded in)",
    "fmac_f32": "cycles per fp32 multiply-accumulate element",
    "dequant_fp8": "cycles per weight to decode an fp8 (e4m3) code and apply its block scale",
    "dequant_mxfp4": "cycles per weight to decode an mxfp4 (e2m1) code and apply its block's exponent",
    "add": "cycles per element of an add",
    "mul": "cycles per element of a multiply",
    "exp": "cycles per element of exp (software, on the CE)",
    "rsqrt": "cycles per rsqrt or divide",
    "argmax": "cycles per element of an argmax scan",
    "recv_wavelet": "cycles to receive one 32-bit wavelet into memory",
    "send_wavelet": "cycles to send one 32-bit wavelet from memory",
    "task_switch": "cycles to pick and enter a task",
    "meta_resolve_slot": "cycles to resolve metainfo for one batch slot",
    "meta_produce_slot": "cycles to produce metainfo for one batch slot",
    "reconfigure": "fixed cycles of one segment reconfiguration",
    "reconfigure_route": "cycles per route entry rebound in a reconfiguration",
    "marker_hop": "cycles per hop of a marker-sync message",
    "host_roundtrip": "cycles for a decision deferred to the host",
}

_INT_FIELDS = (
    "width", "height", "sram_bytes", "reserved_sram_bytes", "control_bytes", "colors",
    "input_queues", "output_queues", "switch_positions", "route_entries", "task_ids",
    "hop_latency_cycles", "link_bytes_per_cycle", "wafer_link_latency_cycles",
    "wafer_link_bytes_per_cycle",
)
# Upper bounds: ids are enumerated per core and the mesh per row / column, so a
# runaway figure is an error, not an allocation (far above any real chip).
_INT_MAXIMA = {
    "width": 1 << 16, "height": 1 << 16, "colors": 1024, "input_queues": 1024,
    "output_queues": 1024, "switch_positions": 1024, "route_entries": 1 << 16, "task_ids": 1 << 16,
}
_ID_LIST_FIELDS = {  # reserved id list -> the count it indexes
    "reserved_colors": "colors",
    "reserved_input_queues": "input_queues",
    "reserved_output_queues": "output_queues",
    "reserved_task_ids": "task_ids",
    "switch_colors": "colors",  # not reserved ids: the colours whose routers have switches
}
_FLOAT_FIELDS = ("clock_hz", "speed_spread")
_STR_FIELDS = ("name", "description")


@dataclass(frozen=True)
class Target:
    """One wafer of a mesh accelerator, as the compiler and the runtime see it."""

    name: str
    description: str
    width: int  # cores per row
    height: int  # cores per column
    sram_bytes: int  # SRAM per core
    reserved_sram_bytes: int  # program image + runtime, per core
    control_bytes: int  # per-core control state (RDT, routing tables, counters)
    colors: int  # routable colours (virtual channels)
    reserved_colors: tuple[int, ...]
    input_queues: int
    reserved_input_queues: tuple[int, ...]
    output_queues: int
    reserved_output_queues: tuple[int, ...]
    switch_positions: int  # switch positions per colour
    switch_colors: tuple[int, ...]  # colours that have switch positions at all
    route_entries: int  # router configurations one core can hold at once
    task_ids: int
    reserved_task_ids: tuple[int, ...]
    clock_hz: float
    hop_latency_cycles: int
    link_bytes_per_cycle: int
    wafer_link_latency_cycles: int
    wafer_link_bytes_per_cycle: int
    speed_spread: float  # per-core speed variability, as a fraction
    costs: dict[str, float] = field(hash=False)
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _check(self)

    # -- derived ---------------------------------------------------------
    @property
    def cores(self) -> int:
        return self.width * self.height

    @property
    def user_colors(self) -> tuple[int, ...]:
        return tuple(c for c in range(self.colors) if c not in self.reserved_colors)

    @property
    def user_input_queues(self) -> tuple[int, ...]:
        return tuple(q for q in range(self.input_queues) if q not in self.reserved_input_queues)

    @property
    def user_output_queues(self) -> tuple[int, ...]:
        return tuple(q for q in range(self.output_queues) if q not in self.reserved_output_queues)

    @property
    def usable_sram_bytes(self) -> int:
        """Per-core SRAM left for weights, KV cache and buffers."""
        return self.sram_bytes - self.reserved_sram_bytes - self.control_bytes

    def budget(self) -> Resources:
        """Per-core capacity that user kernels may use at one time."""
        return Resources(
            colors=len(self.user_colors),
            iq=len(self.user_input_queues),
            oq=len(self.user_output_queues),
            routes=self.route_entries,
            switches=self.switch_positions,
            sram=self.usable_sram_bytes,
            ctrl=self.control_bytes,
        )

    def with_overrides(self, **fields: Any) -> Target:
        """A copy with some fields replaced (checked like a loaded file)."""
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise FrontendError(
                f"target {self.name}: unknown field(s) {', '.join(unknown)}", self.source or None
            )
        for k in _ID_LIST_FIELDS:
            if k in fields:
                fields[k] = tuple(fields[k])
        if "costs" in fields:
            fields["costs"] = {**self.costs, **fields["costs"]}
        return dataclasses.replace(self, **fields)

    def seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    # -- identity ----------------------------------------------------------
    @functools.cached_property
    def digest(self) -> str:
        """A short hash of every figure (all fields but `name`, `description`
        and `source`): two targets with one digest compile alike."""
        figures = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if f.name not in ("name", "description", "source")}
        figures["costs"] = sorted(self.costs.items())
        text = json.dumps(figures, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def identity(self) -> tuple[str | None, str | None]:
        """What IR compiled for this target records beside its name, to find it
        again: nothing for the bundled target of that name (same figures),
        else (the file it was read from, if that file holds these figures,
        else None; and its digest)."""
        if self.name in available_targets() and _load_bundled(self.name).digest == self.digest:
            return None, None
        file = None
        if self.source and Path(self.source).is_file():
            try:
                if _load_file(Path(self.source)).digest == self.digest:
                    file = str(Path(self.source).resolve())
            except FrontendError:
                pass
        return file, self.digest


def _check(t: Target) -> None:
    """Range checks; raises FrontendError naming the offending key."""
    where = t.source or t.name

    def bad(key: str, msg: str) -> FrontendError:
        return FrontendError(f"target key '{key}': {msg}", _key_loc(where, key))

    for k in _INT_FIELDS:
        v = getattr(t, k)
        minimum = 0 if k in ("hop_latency_cycles", "wafer_link_latency_cycles",
                             "reserved_sram_bytes") else 1
        if v < minimum:
            raise bad(k, f"must be >= {minimum}, got {v}")
        most = _INT_MAXIMA.get(k, 1 << 48)
        if v > most:
            raise bad(k, f"must be <= {most}, got {v}")
    for k, count_key in _ID_LIST_FIELDS.items():
        ids = getattr(t, k)
        n = getattr(t, count_key)
        for i in ids:
            if not 0 <= i < n:
                raise bad(k, f"id {i} is outside 0..{n - 1} ({count_key} = {n})")
        if len(set(ids)) != len(ids):
            raise bad(k, "lists an id twice")
    if t.usable_sram_bytes <= 0:
        raise bad("reserved_sram_bytes",
                  f"reserved_sram_bytes + control_bytes ({t.reserved_sram_bytes} + "
                  f"{t.control_bytes}) leave no SRAM of the {t.sram_bytes} per core")
    for k, count_key in (("reserved_colors", "colors"), ("reserved_input_queues", "input_queues"),
                         ("reserved_output_queues", "output_queues")):
        if len(getattr(t, k)) >= getattr(t, count_key):
            raise bad(k, f"reserves every one of the {getattr(t, count_key)} {count_key}")
    if not (t.clock_hz > 0 and math.isfinite(t.clock_hz)):
        raise bad("clock_hz", f"must be a finite number > 0, got {t.clock_hz}")
    if not 0 <= t.speed_spread < 1:
        raise bad("speed_spread", f"must be a fraction in [0, 1), got {t.speed_spread}")
    missing = [k for k in COST_KEYS if k not in t.costs]
    if missing:
        raise FrontendError(f"target [costs] is missing {', '.join(missing)}", _key_loc(where, "costs"))
    for k, v in t.costs.items():
        if k not in COST_KEYS:
            raise FrontendError(
                f"unknown cost '{k}', expected one of {', '.join(COST_KEYS)}", _key_loc(where, k)
            )
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise bad(k, f"cost must be a number >= 0, got {v!r}")


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def available_targets() -> list[str]:
    return sorted(p.stem for p in TARGET_DIR.glob("*.toml"))


def load_target(name_or_path: str | Path | Target) -> Target:
    """A bundled target by name (`wse3`) or a user target file by path (a
    Target is returned as it is)."""
    if isinstance(name_or_path, Target):
        return name_or_path
    s = str(name_or_path)
    bundled = TARGET_DIR / f"{s}.toml"
    if "/" not in s and not s.endswith(".toml") and bundled.is_file():
        return _load_bundled(s)
    path = Path(s)
    if not path.is_file():
        raise FrontendError(
            f"unknown target '{s}': expected one of {', '.join(available_targets())} "
            "or the path of a target .toml file"
        )
    return _load_file(path)


def target_for(given: Target | str | Path | None, program: MappedProgramOp) -> Target:
    """The target a pass, backend or tool works for on `program` (a program
    op of any level): `given` (a Target as it is, as the compiler driver
    passes it along, or a bundled name or a .toml path), else the target the
    IR records (see `MappedProgramOp.target_file`). A MeshrtError located at
    `program` when that is not a target the IR can be compiled for: a name no
    loader knows, a recorded file gone or changed since, or figures the IR
    exceeds (`check_compiled_for`)."""
    from meshrt.diagnostics import MeshrtError

    try:
        target = load_target(given) if given is not None else _recorded(program)
    except FrontendError as e:
        raise MeshrtError(e.message, program, loc=e.loc) from None
    problem = check_compiled_for(program, target)
    if problem is not None:
        raise MeshrtError(problem, program)
    return target


def _recorded(program: MappedProgramOp) -> Target:
    """The target `program` records: its file if the digest says it is still
    the same, else the bundled one of its name (FrontendError otherwise)."""
    name = program.target.data
    file = None if program.target_file is None else program.target_file.data
    digest = None if program.target_digest is None else program.target_digest.data
    if digest is None:
        return load_target(file or name)
    if name in available_targets() and _load_bundled(name).digest == digest:
        return _load_bundled(name)
    how = "give that target (--target FILE, or target=FILE to a pass)"
    if file is None:
        other = ("not a bundled one" if name not in available_targets()
                 else f"has other figures than the bundled {name}")
        raise FrontendError(f"the IR is compiled for a target '{name}' (digest {digest}) that "
                            f"{other}; {how}")
    if not Path(file).is_file():
        raise FrontendError(f"the IR is compiled for target '{name}' read from {file} "
                            f"(digest {digest}), which no longer exists; {how}")
    found = _load_file(Path(file))
    if found.digest != digest:
        raise FrontendError(f"the IR is compiled for target '{name}' read from {file} "
                            f"(digest {digest}), which now holds other figures (digest "
                            f"{found.digest}); {how}")
    return found


def check_compiled_for(program: MappedProgramOp, target: Target) -> str | None:
    """Why `program` cannot run on `target` (`MappedProgramOp.exceeds`), or None."""
    file, _ = target.identity()
    return program.exceeds(target, f"target '{target.name}'" + (f" ({file})" if file else ""))


@functools.cache
def _load_bundled(name: str) -> Target:
    return _load_file(TARGET_DIR / f"{name}.toml")


def _load_file(path: Path) -> Target:
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FrontendError(f"cannot read target file: {getattr(e, 'strerror', None) or e}", where)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        loc = Loc(where, int(m.group(1)), int(m.group(2))) if m else Loc(where)
        raise FrontendError(f"invalid TOML: {msg}", loc)
    except RecursionError:  # tomllib parses nested arrays recursively
        raise FrontendError(f"invalid TOML: arrays nested more than {MAX_NESTING} deep",
                            _deep_nesting_loc(where, text)) from None
    return target_from_dict(data, where, text)


MAX_NESTING = 100  # no target key nests; the parser would overflow Python's stack long before


def _deep_nesting_loc(where: str, text: str) -> Loc:
    """Where the arrays of `text` first nest more than MAX_NESTING deep (brackets in
    strings and comments aside)."""
    depth, line, col, quote, comment = 0, 1, 0, "", False
    for ch in text:
        col += 1
        if ch == "\n":
            line, col, comment = line + 1, 0, False
        elif comment:
            continue
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            comment = True
        elif ch == "[":
            depth += 1
            if depth > MAX_NESTING:
                return Loc(where, line, col)
        elif ch == "]":
            depth -= 1
    return Loc(where)


def target_from_dict(data: dict[str, Any], where: str = "<target>", text: str = "") -> Target:
    """Build a Target from parsed TOML, with located errors for bad keys."""

    def loc(key: str) -> Loc:
        return _key_loc(where, key, text)

    fields = [f.name for f in dataclasses.fields(Target) if f.name != "source"]
    for key in data:
        if key not in fields:
            raise FrontendError(
                f"unknown target key '{key}', expected one of {', '.join(fields)}", loc(key)
            )
    missing = [k for k in fields if k not in data]
    if missing:
        raise FrontendError(f"target is missing key(s) {', '.join(missing)}", where)

    vals: dict[str, Any] = {}
    for key in _STR_FIELDS:
        if not isinstance(data[key], str):
            raise FrontendError(f"target key '{key}' must be a string", loc(key))
        vals[key] = data[key]
    for key in _INT_FIELDS:
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise FrontendError(f"target key '{key}' must be an integer, got {v!r}", loc(key))
        vals[key] = v
    for key in _FLOAT_FIELDS:
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise FrontendError(f"target key '{key}' must be a number, got {v!r}", loc(key))
        vals[key] = float(v)
    for key in _ID_LIST_FIELDS:
        v = data[key]
        if not isinstance(v, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in v):
            raise FrontendError(f"target key '{key}' must be a list of integer ids", loc(key))
        vals[key] = tuple(v)
    costs = data["costs"]
    if not isinstance(costs, dict):
        raise FrontendError("target key 'costs' must be a table ([costs])", loc("costs"))
    vals["costs"] = {k: (float(v) if isinstance(v, int) and not isinstance(v, bool) else v)
                     for k, v in costs.items()}
    return Target(**vals, source=where)


def _key_loc(where: str, key: str, text: str | None = None) -> Loc:
    """Where `key = ...` (or `[key]`) appears in the file, for error messages."""
    if text is None:
        try:
            text = Path(where).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
    m = re.search(rf"^[ \t]*(\[{re.escape(key)}\]|{re.escape(key)}[ \t]*=)", text, re.MULTILINE)
    if not m:
        return Loc(where)
    line = text.count("\n", 0, m.start(1)) + 1
    col = m.start(1) - (text.rfind("\n", 0, m.start(1)) + 1) + 1
    return Loc(where, line, col)
