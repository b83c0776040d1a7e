"""Files beside the CSL: compile.sh (cslc), run.py (SdkRuntime sketch), report.txt."""

from __future__ import annotations

from meshrt.backend.csl.alloc import ClassAlloc, Limits, format_table
from meshrt.backend.csl.model import Program

# memcpy adds a halo around the program rectangle: 4 columns west, 3 east,
# one row north and south (the SDK examples' --fabric-offsets=4,1).
HALO_W, HALO_H, OFF_X, OFF_Y = 7, 2, 4, 1


def compile_sh(program: Program, arch: str, rects: dict[int, tuple[int, int]], target_dims) -> str:
    out = [
        "#!/usr/bin/env bash",
        f"# Compile program @{program.name} with the Cerebras SDK (cslc, SDK 1.4) for {arch}.",
        "# Written by meshrt, not run by it: meshrt checks the syntax of the CSL and the",
        "# resource limits, it does not have cslc. Fabric dims = program rectangle plus",
        f"# memcpy's halo ({HALO_W} columns, {HALO_H} rows), offsets {OFF_X},{OFF_Y}.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
    ]
    tw, th = target_dims
    for wafer in sorted(rects):
        w, h = rects[wafer]
        fw, fh = w + HALO_W, h + HALO_H
        where = f"wafer{wafer}/" if program.wafers > 1 else ""
        if fw > tw or fh > th:
            out.append(f"# NOTE: {fw} x {fh} exceeds the {tw} x {th} fabric of target "
                       f"{program.target}: runs on the simulator, not on one system as is.")
        out.append(f"cslc --arch={arch} ./{where}layout.csl --fabric-dims={fw},{fh} "
                   f"--fabric-offsets={OFF_X},{OFF_Y} --memcpy --channels=1 -o out{wafer if program.wafers > 1 else ''}")
    return "\n".join(out) + "\n"


def run_py(program: Program, allocs: list[ClassAlloc], elem: str, rects: dict[int, tuple[int, int]]) -> str:
    classes = []
    for a in allocs:
        c = a.cls
        classes.append(f"    ({c.wafer}, {c.name!r}, {[(b[0], b[1], b[2] - b[0], b[3] - b[1]) for b in c.boxes]!r}),")
    dtype = "np.float32" if elem == "f32" else "np.float16"
    lines = [
        "#!/usr/bin/env cs_python",
        f'"""Host driver sketch for program @{program.name} (SdkRuntime + memcpy).',
        "",
        "Written by meshrt, not run by it. It shows the host's part: load each wafer's",
        "compiled program, copy every class's resident weights / KV tiles in with",
        "memcpy_h2d, launch `start`, then serve: push waiting requests into `req`, read",
        "sampled tokens from `tok`, and relay cross-wafer messages (`xout_*` -> `xin_*`).",
        "Weights here are zeros; a real driver reads them from the checkpoint in the",
        "tiling the report describes.",
        '"""',
        "",
        "import argparse",
        "",
        "import numpy as np",
        "from cerebras.sdk.runtime.sdkruntimepybind import (  # pylint: disable=no-name-in-module",
        "    MemcpyDataType,",
        "    MemcpyOrder,",
        "    SdkRuntime,",
        ")",
        "",
        f"WAFERS = {program.wafers}",
        f"RECTANGLES = {dict(sorted(rects.items()))!r}  # wafer -> (width, height)",
        "# (wafer, core class, rectangles (x, y, w, h) of its cores)",
        "CLASSES = [",
        *classes,
        "]",
        "",
        "",
        "def load_weights(runner, wafer):",
        '    """memcpy every class\'s resident state (symbol `w`) onto its cores."""',
        "    for w, name, rects in CLASSES:",
        "        if w != wafer:",
        "            continue",
        "        for x, y, width, height in rects:",
        "            try:",
        '                sym = runner.get_id("w")',
        "            except Exception:  # classes without resident state export no `w`",
        "                return",
        f"            data = np.zeros(width * height, dtype={dtype})",
        "            runner.memcpy_h2d(sym, data.view(np.uint16 if data.dtype == np.float16 else np.uint32),",
        "                              x, y, width, height, 1, streaming=False,",
        "                              order=MemcpyOrder.ROW_MAJOR,",
        "                              data_type=MemcpyDataType.MEMCPY_32BIT, nonblock=False)",
        "",
        "",
        "def main():",
        "    parser = argparse.ArgumentParser()",
        '    parser.add_argument("--name", default="out", help="cslc output directory (prefix per wafer)")',
        '    parser.add_argument("--cmaddr", help="IP:port of the CS system; omit for the simulator")',
        "    args = parser.parse_args()",
        "    runners = []",
        "    for wafer in range(WAFERS):",
        '        name = args.name + (str(wafer) if WAFERS > 1 else "")',
        "        runner = SdkRuntime(name, cmaddr=args.cmaddr)",
        "        runner.load()",
        "        runner.run()",
        "        load_weights(runner, wafer)",
        '        runner.launch("start", nonblock=False)',
        "        runners.append(runner)",
        "    # Serving loop (sketch): requests in, tokens out, wafer-link relays.",
        "    for runner in runners:",
        "        runner.stop()",
        "",
        "",
        'if __name__ == "__main__":',
        "    main()",
    ]
    return "\n".join(lines) + "\n"


REPORT_COLUMNS = ("class", "wafer", "cores", "segs", "colours", "iq", "oq", "data tids",
                  "local tid", "ctrl tid", "DSRs", "SRAM", "rebinds", "switch", "teardown", "handshakes")


def report_table(allocs: list[ClassAlloc], lim: Limits) -> list[str]:
    rows = [REPORT_COLUMNS]
    for a in allocs:
        c = a.cls
        peak_col = max((len(x) for x in a.colors_per_segment), default=0)
        rows.append((
            c.name, str(c.wafer), str(c.cores), str(len(c.segments)),
            f"{peak_col}/{len(lim.user_colors)}", f"{a.iq.peak}/{len(lim.iq)}", f"{a.oq.peak}/{len(lim.oq)}",
            ",".join(map(str, sorted(a.data_tasks.values()))) or "-", str(a.step_task),
            "-" if a.marker_task is None else str(a.marker_task), "2/2",
            f"{a.sram_bytes}/{lim.target.usable_sram_bytes}"
            + (" !" if a.sram_bytes > lim.target.usable_sram_bytes else ""),
            str(a.iq.rebind_count + a.oq.rebind_count), ",".join(map(str, a.switched)) or "-",
            ",".join(map(str, a.teardown)) or "-", str(c.handshakes),
        ))
    return format_table([r + ("",) for r in rows])


def report_txt(program: Program, arch: str, lim: Limits, allocs: list[ClassAlloc], stats, files: list[str]) -> str:
    t = lim.target
    out = [
        f"meshrt CSL backend report: program @{program.name}, arch {arch}, target {t.name}",
        "",
        "Checked when these files were written: the per-class resource limits below (an",
        "over-allocation is a compile error) and that each program runs its class's event",
        "table, the one the reference interpreter executes. Checked by meshrt's tests for",
        "every bundled example and config: CSL syntax (meshrt csl-lint; run it on these",
        "files too); on a wavelet-level model of routers with switch positions and teardown,",
        "that the switch chains and relays deliver every message whole.",
        "Not checked: compilation by cslc, timing, or execution on a simulator or a system;",
        "the run-time queue rebinds (wse3) use a register the SDK does not document",
        "(UNVERIFIED). The assumptions are in docs/csl-backend.md.",
        "",
        f"limits per core: {len(lim.user_colors)} user colours (reserved {', '.join(map(str, program.op.reserved))}),"
        f" input queues {', '.join(map(str, lim.iq))}, output queues {', '.join(map(str, lim.oq))},",
        f"task IDs 0..{t.task_ids - 1} minus {', '.join(map(str, t.reserved_task_ids))}, "
        f"{t.usable_sram_bytes} SRAM bytes for buffers and state",
        "",
        f"{len(allocs)} core class(es), {len(files)} file(s)",
        "transports: " + ", ".join(f"{n} {k}" for k, n in sorted(stats.schemes.items()))
        + " flow(s) (tree: one sender; shift: disjoint paths; chain: senders serialised by",
        "        switch positions; relay: receivers that are senders relay along a line)",
        f"routes: {stats.boxes} router boxes; one input direction per colour and position everywhere;",
        f"        {stats.switched} switch-chain router(s), {stats.relayed} relay router(s), {stats.phased} router(s)"
        " switch phases at run time",
        f"route handshakes emitted: {sum(a.cls.handshakes for a in allocs)} (drains as end-of-flow teardowns,"
        " notify as the colour's",
        f"        teardown exit at the install, await held by the fabric; {stats.frozen} router(s) start in"
        " teardown)",
    ]
    over = [a for a in allocs if a.sram_bytes > t.usable_sram_bytes]
    if over:
        out.append(f"SRAM: {len(over)} class(es) marked ! keep more array bytes than the IR's per-core "
                   f"budget ({t.usable_sram_bytes}): the IR counts one message buffer, a program keeps")
        out.append("      input, output and partner buffers; above SRAM minus the program image "
                   f"({t.sram_bytes - t.reserved_sram_bytes}) it is a compile error")
    out += [
        "",
    ]
    out += report_table(allocs, lim)
    return "\n".join(out) + "\n"
