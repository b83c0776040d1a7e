"""Route handshakes of segment IR as the CSL programs run them.

`insert-route-handshakes` states them (see `meshrt.dialects.segment`):
`drain [@F]` on a reconfigure, `notify [@F]` on the reconfigure that
installs F, `grant [@F]` on segment 0 and `await [@T::@F]` before a class's
first send of F. The backend realises them with the fabric's teardown
mechanism, the one the SDK's own allreduce library uses to reconfigure a
colour between phases:

- End of flow: every sender of a drained flow sends a teardown control
  wavelet (`<control>`'s TEARDOWN opcode) behind its last message of the
  step (a switch-chained flow: its first sender, whose teardown passes
  every chain router after that router's own message). Every router it
  passes enters teardown for the colour after forwarding it, and the
  tile's teardown handler (`@set_teardown_handler`) counts it and lets the
  colour run again (`tile_config.teardown.exit`).
- drain: a router that releases F waits until the count of teardowns of
  the steps it has credited is in (per step: the senders whose stream
  crosses it). The handler does not exit the last one: the colour stays
  in teardown, i.e. it passes nothing, until this class installs the
  colour's next flow.
- notify: the install writes the new route (`color_config.reset_routes`,
  switch positions for a switch chain) while the colour is in teardown and
  then exits teardown: the route opens. That opening is the install
  credit.
- await: no software wait. A sender's first wavelets of F stop at the first
  router of its route that has not opened F yet: that colour there is in
  teardown, unconfigured, or configured for another flow whose input is
  another side. The await is that flow control, so there is no reverse
  route and no extra colour.
- grant: the layout configures segment 0's routes, so a granted flow is
  open at program start. A flow a class holds in segment 0 for the
  previous step's traffic (not granted) starts in teardown
  (`.teardown = true` in its `@set_color_config`) and opens at the class's
  first notify.

The per-router counts are static: credited steps x streams crossing the
router, as the interpreter's drain rule states it.
"""

from __future__ import annotations

from meshrt.backend.csl.model import CoreClass, Program
from meshrt.routing import BoxIndex


def drained_flows(program: Program) -> set[str]:
    """Flows whose senders close every step with a teardown: the ones some class
    drains, and every relayed flow (streams.py), whose cores switch their routers
    between relay passes only once the pass's teardown passed them."""
    from meshrt.backend.csl.streams import RELAY, plans

    out = {f for c in program.classes for b in c.boundaries for f in b.drain}
    out |= {name for name, plan in plans(program).items() if plan.scheme == RELAY}
    return out


def class_drains(cls: CoreClass) -> set[str]:
    return {f for b in cls.boundaries for f in b.drain}


def frozen_at_start(program: Program, cls: CoreClass) -> set[str]:
    """Flows the class holds in segment 0 without a grant: they start in teardown."""
    if not cls.handshakes or not cls.segments:
        return set()
    seg0 = cls.segments[0]
    drains = class_drains(cls)
    return {f for f in seg0.routes if f in drains and f not in seg0.grants}


def teardown_colors(program: Program) -> dict[str, dict[int, list[str]]]:
    """Class name -> colour -> drained flows whose teardowns cross the class's
    routers (they need a teardown handler there). Cached on the program."""
    cached = getattr(program, "_td_colors", None)
    if cached is not None:
        return cached
    from meshrt.backend.csl.streams import plans, sbox_bbox, sbox_clip

    pl = plans(program)
    items = [(b, c) for c in program.classes for b in c.boxes]
    index = BoxIndex(items) if items else None
    out: dict[str, dict[int, list[str]]] = {c.name: {} for c in program.classes}
    for name in sorted(drained_flows(program)):
        plan = pl.get(name)
        if plan is None or index is None:
            continue
        hit: set[str] = set()
        for s, _ in plan.td_counts():
            for i in index.query(sbox_bbox(s)):
                box, cls = items[i]
                if cls.name not in hit and sbox_clip(s, box) is not None:
                    hit.add(cls.name)
        for cname in hit:
            out[cname].setdefault(plan.color, []).append(name)
    program._td_colors = out
    return out
