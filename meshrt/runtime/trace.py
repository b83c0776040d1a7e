"""Chrome trace / Perfetto export of a mesh simulation run.

`write_trace(result, path)` writes the JSON object format
(`{"traceEvents": [...], "displayTimeUnit": "ns"}`) that chrome://tracing and
ui.perfetto.dev open: one "X" (complete) event per simulated span, with
`ts` / `dur` in microseconds of simulated time (cycles / clock), `pid` =
wafer and `tid` = core (one track per core) or, with `by_class=True`, one
track per core class (spans of all its cores overlap on that track). "M"
metadata events name the processes and threads. The run must have been made
with `trace=True` (`MeshSim(..., trace=True)`).
"""

from __future__ import annotations

import json
from typing import Any

from meshrt.output import atomic_file


def trace_events(result, *, by_class: bool = False) -> dict[str, Any]:
    if result.spans is None:
        raise ValueError("the run recorded no spans: simulate with trace=True")
    us = 1e6 / result.clock_hz
    cores = result.cores
    class_names: list[str] = []
    class_idx: dict[str, int] = {}
    for _, cname in cores:
        if cname not in class_idx:
            class_idx[cname] = len(class_names)
            class_names.append(cname)
    events: list[dict[str, Any]] = []
    wafers = sorted({pos[0] for pos, _ in cores})
    for w in wafers:
        events.append({"name": "process_name", "ph": "M", "pid": w, "tid": 0,
                       "args": {"name": f"wafer {w}"}})
    if by_class:
        seen: set[tuple[int, int]] = set()
        for pos, cname in cores:
            key = (pos[0], class_idx[cname])
            if key not in seen:
                seen.add(key)
                events.append({"name": "thread_name", "ph": "M", "pid": pos[0], "tid": key[1],
                               "args": {"name": f"@{cname}"}})
    else:
        for i, (pos, cname) in enumerate(cores):
            events.append({"name": "thread_name", "ph": "M", "pid": pos[0], "tid": i,
                           "args": {"name": f"({pos[1]}, {pos[2]}) @{cname}"}})
    for core, _cls, name, start, end in result.spans:
        pos, cname = cores[core]
        events.append({
            "name": name,
            "cat": name.split(" ", 1)[0],
            "ph": "X",
            "ts": start * us,
            "dur": max(end - start, 0) * us,
            "pid": pos[0],
            "tid": class_idx[cname] if by_class else core,
            "args": {"core": [pos[1], pos[2]], "class": cname, "cycles": [start, end]},
        })
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"seed": result.seed, "safe": result.safe, "cycles": result.cycles,
                      "steps": result.steps,
                      "reports": [str(r) for r in result.reports]},
    }


def write_trace(result, path: str, *, by_class: bool = False) -> None:
    with atomic_file(path) as fh:
        json.dump(trace_events(result, by_class=by_class), fh)
