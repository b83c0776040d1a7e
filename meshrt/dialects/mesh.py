"""The `mesh` dialect: attributes shared by every meshrt dialect.

Nothing here is an op. These are the vocabulary of the mapped computation:

- `#mesh.rect<x, y, w, h>` a rectangle of cores, optionally strided
  (`#mesh.rect<x, y, w, h step sx, sy>` = cores (x + i*sx, y + j*sy)).
- `#mesh.cores<(x, y, w, h), (x, y, w, h step 2, 1)>` a core set: a union of
  rects. Core classes and kernel regions are core sets, so IR size never
  depends on how many cores a set holds.
- `#mesh.res<colors = 3, iq = 1, sram = 4096>` a resource vector, used both
  for per-role demand and for per-core budgets.
- `#mesh.dyn<moe_routing>` a kind of runtime dynamism.
- `#mesh.color<5>` a routing colour.
"""

from __future__ import annotations

from enum import StrEnum

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import ArrayAttr, IntAttr, StringAttr
from xdsl.ir import Attribute, Dialect, ParametrizedAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

# ---------------------------------------------------------------------------
# Rectangles and core sets
# ---------------------------------------------------------------------------


@irdl_attr_definition
class RectAttr(ParametrizedAttribute):
    """A rectangle of cores: w x h cores starting at (x, y), spaced sx, sy apart."""

    name = "mesh.rect"

    x: IntAttr
    y: IntAttr
    w: IntAttr
    h: IntAttr
    sx: IntAttr
    sy: IntAttr

    def __init__(self, x: int, y: int, w: int, h: int, sx: int = 1, sy: int = 1):
        super().__init__(*(IntAttr(v) for v in (x, y, w, h, sx, sy)))

    # -- Python view -------------------------------------------------------
    @property
    def tuple(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.x.data,
            self.y.data,
            self.w.data,
            self.h.data,
            self.sx.data,
            self.sy.data,
        )

    @property
    def count(self) -> int:
        return self.w.data * self.h.data

    @property
    def extent(self) -> tuple[int, int, int, int]:
        """Bounding box (x0, y0, x1, y1), exclusive upper bounds."""
        x, y, w, h, sx, sy = self.tuple
        return x, y, x + (w - 1) * sx + 1, y + (h - 1) * sy + 1

    def contains(self, cx: int, cy: int) -> bool:
        x, y, w, h, sx, sy = self.tuple
        dx, dy = cx - x, cy - y
        return (
            0 <= dx < w * sx and 0 <= dy < h * sy and dx % sx == 0 and dy % sy == 0
        )

    def is_unit_step(self) -> bool:
        return self.sx.data == 1 and self.sy.data == 1

    def cores(self) -> Iterator[tuple[int, int]]:
        x, y, w, h, sx, sy = self.tuple
        for j in range(h):
            for i in range(w):
                yield x + i * sx, y + j * sy

    def __str__(self) -> str:
        x, y, w, h, sx, sy = self.tuple
        step = f" step {sx}, {sy}" if (sx, sy) != (1, 1) else ""
        return f"({x}, {y}, {w}, {h}{step})"

    # -- assembly ----------------------------------------------------------
    @staticmethod
    def parse_body(parser: AttrParser) -> list[Attribute]:
        vals = [parser.parse_integer(allow_boolean=False)]
        for _ in range(3):
            parser.parse_punctuation(",")
            vals.append(parser.parse_integer(allow_boolean=False))
        sx = sy = 1
        if parser.parse_optional_keyword("step") is not None:
            sx = parser.parse_integer(allow_boolean=False)
            parser.parse_punctuation(",")
            sy = parser.parse_integer(allow_boolean=False)
        return [IntAttr(v) for v in (*vals, sx, sy)]

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        with parser.in_angle_brackets():
            return cls.parse_body(parser)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{str(self)[1:-1]}>")

    def verify(self) -> None:
        x, y, w, h, sx, sy = self.tuple
        if x < 0 or y < 0:
            raise VerifyException(f"rect {self} has a negative origin")
        if w <= 0 or h <= 0:
            raise VerifyException(f"rect {self} is empty: width and height must be > 0")
        if sx <= 0 or sy <= 0:
            raise VerifyException(f"rect {self} has a non-positive step")


@irdl_attr_definition
class CoreSetAttr(ParametrizedAttribute):
    """A set of cores as a union of (possibly strided) rectangles."""

    name = "mesh.cores"

    rects: ArrayAttr[RectAttr]

    def __init__(self, rects: Sequence[RectAttr] | RectAttr):
        if isinstance(rects, RectAttr):
            rects = [rects]
        super().__init__(ArrayAttr(rects))

    @staticmethod
    def of(x: int, y: int, w: int, h: int, sx: int = 1, sy: int = 1) -> CoreSetAttr:
        return CoreSetAttr(RectAttr(x, y, w, h, sx, sy))

    @property
    def count(self) -> int:
        """Number of cores (rects of one set are disjoint by construction)."""
        return sum(r.count for r in self.rects)

    @property
    def extent(self) -> tuple[int, int, int, int]:
        boxes = [r.extent for r in self.rects]
        return (
            min(b[0] for b in boxes),
            min(b[1] for b in boxes),
            max(b[2] for b in boxes),
            max(b[3] for b in boxes),
        )

    def contains(self, x: int, y: int) -> bool:
        return any(r.contains(x, y) for r in self.rects)

    def cores(self) -> Iterator[tuple[int, int]]:
        for r in self.rects:
            yield from r.cores()

    def fits_mesh(self, width: int, height: int) -> bool:
        _, _, x1, y1 = self.extent
        return x1 <= width and y1 <= height

    def is_dense(self) -> bool:
        return all(r.is_unit_step() for r in self.rects)

    def intersection_count(self, other: CoreSetAttr) -> int:
        """Cores in both sets (dense rects; the rects of one set are disjoint)."""
        n = 0
        for a in self.rects:
            ax0, ay0, ax1, ay1 = a.extent
            for b in other.rects:
                bx0, by0, bx1, by1 = b.extent
                n += max(0, min(ax1, bx1) - max(ax0, bx0)) * max(0, min(ay1, by1) - max(ay0, by0))
        return n

    def covers(self, other: CoreSetAttr) -> bool:
        """Whether every core of `other` is in this set (dense rects only)."""
        return self.intersection_count(other) == other.count

    def overlaps(self, other: CoreSetAttr) -> bool:
        """Whether two core sets share a core (exact for dense rects)."""
        for a in self.rects:
            ax0, ay0, ax1, ay1 = a.extent
            for b in other.rects:
                bx0, by0, bx1, by1 = b.extent
                if ax0 < bx1 and bx0 < ax1 and ay0 < by1 and by0 < ay1:
                    if a.is_unit_step() and b.is_unit_step():
                        return True
                    if _strided_overlap(a, b):
                        return True
        return False

    def __str__(self) -> str:
        return ", ".join(str(r) for r in self.rects)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        def parse_rect() -> RectAttr:
            parser.parse_punctuation("(")
            params = RectAttr.parse_body(parser)
            parser.parse_punctuation(")")
            return RectAttr.new(params)

        with parser.in_angle_brackets():
            rects = parser.parse_comma_separated_list(parser.Delimiter.NONE, parse_rect)
        return [ArrayAttr(rects)]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self}>")

    def verify(self) -> None:
        if not self.rects.data:
            raise VerifyException("core set is empty")


def _strided_overlap(a: RectAttr, b: RectAttr) -> bool:
    # Strided rects are small in count of distinct rows/cols only when the
    # stride is large, so an exact check over the intersection box is bounded
    # by the smaller rect's row and column counts, not by area.
    xs_a = {a.x.data + i * a.sx.data for i in range(a.w.data)}
    xs_b = {b.x.data + i * b.sx.data for i in range(b.w.data)}
    ys_a = {a.y.data + j * a.sy.data for j in range(a.h.data)}
    ys_b = {b.y.data + j * b.sy.data for j in range(b.h.data)}
    return bool(xs_a & xs_b) and bool(ys_a & ys_b)


# ---------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------

RESOURCE_FIELDS: tuple[str, ...] = (
    "colors",  # routable colours bound at once
    "iq",  # input queues
    "oq",  # output queues
    "routes",  # router table entries (colour x direction configurations)
    "switches",  # switch positions used by one colour
    "sram",  # bytes of buffers
    "ctrl",  # bytes of local control state (RDT, routing tables, counters)
)

RESOURCE_NAMES = {
    "colors": "colours",
    "iq": "input queues",
    "oq": "output queues",
    "routes": "route entries",
    "switches": "switch positions",
    "sram": "SRAM bytes",
    "ctrl": "control-state bytes",
}


@dataclass(frozen=True)
class Resources:
    """Plain-Python resource vector; `ResourceAttr` is its IR form."""

    colors: int = 0
    iq: int = 0
    oq: int = 0
    routes: int = 0
    switches: int = 0
    sram: int = 0
    ctrl: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(*(getattr(self, f) + getattr(other, f) for f in RESOURCE_FIELDS))

    def peak(self, other: Resources) -> Resources:
        return Resources(
            *(max(getattr(self, f), getattr(other, f)) for f in RESOURCE_FIELDS)
        )

    def exceeded(self, budget: Resources) -> list[tuple[str, int, int]]:
        """(resource, demand, capacity) for every field over budget.

        `switches` is a per-colour limit, not a sum, so it is compared as is.
        """
        return [
            (f, getattr(self, f), getattr(budget, f))
            for f in RESOURCE_FIELDS
            if getattr(self, f) > getattr(budget, f)
        ]

    def attr(self) -> ResourceAttr:
        return ResourceAttr(self)


@irdl_attr_definition
class ResourceAttr(ParametrizedAttribute):
    """`#mesh.res<colors = 2, iq = 1, sram = 4096>`; omitted fields are 0."""

    name = "mesh.res"

    colors: IntAttr
    iq: IntAttr
    oq: IntAttr
    routes: IntAttr
    switches: IntAttr
    sram: IntAttr
    ctrl: IntAttr

    def __init__(self, res: Resources | None = None, **fields: int):
        res = res if res is not None else Resources(**fields)
        super().__init__(*(IntAttr(getattr(res, f)) for f in RESOURCE_FIELDS))

    @property
    def value(self) -> Resources:
        return Resources(*(getattr(self, f).data for f in RESOURCE_FIELDS))

    def __str__(self) -> str:
        v = self.value
        return ", ".join(f"{f} = {getattr(v, f)}" for f in RESOURCE_FIELDS if getattr(v, f))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        vals = dict.fromkeys(RESOURCE_FIELDS, 0)

        def parse_field() -> None:
            key = parser.parse_identifier("resource name")
            if key not in vals:
                parser.raise_error(
                    f"unknown resource '{key}', expected one of {', '.join(RESOURCE_FIELDS)}"
                )
            parser.parse_punctuation("=")
            vals[key] = parser.parse_integer(allow_boolean=False)

        parser.parse_punctuation("<")
        if parser.parse_optional_punctuation(">") is None:
            parser.parse_comma_separated_list(parser.Delimiter.NONE, parse_field)
            parser.parse_punctuation(">")
        return [IntAttr(vals[f]) for f in RESOURCE_FIELDS]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self}>")

    def verify(self) -> None:
        for f in RESOURCE_FIELDS:
            if getattr(self, f).data < 0:
                raise VerifyException(f"resource {f} is negative")


# ---------------------------------------------------------------------------
# Dynamism and colours
# ---------------------------------------------------------------------------

DYNAMISM_KINDS: tuple[str, ...] = (
    "continuous_batching",
    "moe_routing",
    "micro_batch_pipeline",
    "speculative_accept",
    "expert_rebalance",
)


class FlowRole(StrEnum):
    """What a flow carries for its kernel (`event.flow`'s `role`): the closed set."""

    DOWN = "down"  # a reduction's partials, down the chain toward its root
    UP = "up"  # the root's result, relayed back up the chain
    HOP = "hop"  # one step along a dispatch / combine relay corridor
    INPUT = "input"  # a producer's value into operand `operand` of the kernel
    TOKENS = "tokens"  # the sampled tokens back to the first stage's embed
    SPILL = "spill"  # an attention column's q | k | v to its twin on the kernel's spill tile

    @property
    def internal(self) -> bool:
        """A flow of the kernel's own chain or corridor, not a value from another kernel."""
        return self in _INTERNAL_ROLES


_INTERNAL_ROLES = frozenset({FlowRole.DOWN, FlowRole.UP, FlowRole.HOP, FlowRole.SPILL})
FLOW_ROLES = tuple(r.value for r in FlowRole)



@irdl_attr_definition
class DynamismAttr(ParametrizedAttribute):
    """A kind of runtime dynamism: `#mesh.dyn<continuous_batching>`."""

    name = "mesh.dyn"

    kind: StringAttr

    def __init__(self, kind: str):
        super().__init__(StringAttr(kind))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        with parser.in_angle_brackets():
            return [StringAttr(parser.parse_identifier("dynamism kind"))]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.kind.data}>")

    def verify(self) -> None:
        if self.kind.data not in DYNAMISM_KINDS:
            raise VerifyException(
                f"unknown dynamism kind '{self.kind.data}', expected one of "
                + ", ".join(DYNAMISM_KINDS)
            )


@irdl_attr_definition
class ColorAttr(ParametrizedAttribute):
    """A routing colour id: `#mesh.color<5>`."""

    name = "mesh.color"

    id: IntAttr

    def __init__(self, color: int):
        super().__init__(IntAttr(color))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        with parser.in_angle_brackets():
            return [IntAttr(parser.parse_integer(allow_boolean=False))]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.id.data}>")

    def verify(self) -> None:
        if self.id.data < 0:
            raise VerifyException(f"colour {self.id.data} is negative")


Mesh = Dialect("mesh", [], [RectAttr, CoreSetAttr, ResourceAttr, DynamismAttr, ColorAttr])
