"""Files beside the CSL: compile.sh (cslc), run.py (SdkRuntime sketch), report.txt."""

from __future__ import annotations

import inspect

from meshrt.activations import bf16_to_float32, float32_to_bf16
from meshrt.backend.csl.alloc import ClassAlloc, Limits, format_table
from meshrt.backend.csl.metainfo import HAVE_WORDS, PROMPT_DONE, REQ_WORDS, TOK_WORDS
from meshrt.backend.csl.model import Program

# memcpy adds a halo around the program rectangle: 4 columns west, 3 east,
# one row north and south (the SDK examples' --fabric-offsets=4,1).
HALO_W, HALO_H, OFF_X, OFF_Y = 7, 2, 4, 1


def compile_sh(program: Program, arch: str, rects: dict[int, tuple[int, int]], target_dims,
               elem: str) -> str:
    """`elem`: the program's activation type; a bf16 program selects cslc's bf16 format
    (every 16-bit float operation and `@fp16()` then work in bf16)."""
    fp16 = " --fp16-format=bf16" if elem == "bf16" else ""
    out = [
        "#!/usr/bin/env bash",
        f"# Compile program @{program.name} with the Cerebras SDK (cslc, SDK 1.4) for {arch}.",
        "# Written by meshrt, not run by it: meshrt checks the syntax of the CSL and the",
        "# resource limits, it does not have cslc. Fabric dims = program rectangle plus",
        f"# memcpy's halo ({HALO_W} columns, {HALO_H} rows), offsets {OFF_X},{OFF_Y}.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
    ]
    tw, th = target_dims  # the cores a program may use: the fabric minus memcpy's halo
    for wafer in sorted(rects):
        w, h = rects[wafer]
        fw, fh = w + HALO_W, h + HALO_H
        where = f"wafer{wafer}/" if program.wafers > 1 else ""
        if w > tw or h > th:
            out.append(f"# NOTE: the {w} x {h} program exceeds the {tw} x {th} cores of target "
                       f"{program.target} (a {tw + HALO_W} x {th + HALO_H} fabric with memcpy's "
                       "halo): runs on the simulator, not on one system as is.")
        out.append(f"cslc --arch={arch} ./{where}layout.csl --fabric-dims={fw},{fh} "
                   f"--fabric-offsets={OFF_X},{OFF_Y}{fp16} --memcpy --channels=1 -o out{wafer if program.wafers > 1 else ''}")
    return "\n".join(out) + "\n"


def run_py(program: Program, allocs: list[ClassAlloc], elem: str, rects: dict[int, tuple[int, int]],
           eos: tuple[int, ...] = ()) -> str:
    """The host driver sketch: the tables it needs (classes, their rectangles and
    host-visible arrays) followed by the fixed driver code (`_DRIVER`)."""
    classes = []
    for a in allocs:
        c = a.cls
        rect_list = [(b[0], b[1], b[2] - b[0], b[3] - b[1]) for b in c.boxes]
        classes.append(f"    ({c.wafer}, {c.name!r}, {rect_list!r}, {dict(sorted(a.symbols.items()))!r}),")
    head = [
        "#!/usr/bin/env cs_python",
        f'"""Host driver sketch for program @{program.name} (SdkRuntime + memcpy).',
        "",
        "Written by meshrt, not run by it (meshrt has no Cerebras SDK). It does the host's",
        "part of the design: load each wafer's program, copy every class's resident",
        "weights / KV tiles in (memcpy_h2d: the <class>.<symbol>.npy arrays of shape",
        "(cores, elements) in --weights DIR, by default weights/ beside this file, which",
        "`meshrt compile --emit csl --weights` writes; zeros where there is none), prime the loop-carried",
        "flows (the first message of each micro-batch in flight, as the interpreter's host",
        "does), put the first requests into `req`, launch `start`, then serve: refill",
        "`req`, keep each live request's next prompt tokens in the ring `prm` (the first",
        "stage pauses a slot whose next token is not there yet), read sampled tokens from",
        "`tok` (those of a request's outputs: fed at its last prompt position or later), relay",
        "cross-wafer messages (`xout_*` -> `xin_*`). The chip ends a request on an EOS or",
        "after its max_new_tokens. `tok` holds each slot's last few samples (position p at",
        "p mod the ring's depth): a poll slower than that many steps misses tokens (the",
        "request is then reported unfinished, with the positions missed); a production",
        "driver would stream them.",
        '"""',
        "",
        "import argparse",
        "import json",
        "import os",
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
        f"ELEM = {elem!r}  # activations on the fabric",
        f"MICRO_BATCH = {max(1, program.micro_batch)}  # slots per micro-batch",
        f"SLOTS = {program.slots}  # request slots in flight",
        f"GROUPS = {program.groups}  # micro-batches in flight: each loop-carried flow is primed once per group",
        f"EOS = {tuple(eos)!r}  # end-of-sequence token ids",
        "# words a slot takes in the request arrays (meshrt.backend.csl.metainfo)",
        f"REQ_WORDS, HAVE_WORDS, TOK_WORDS = {REQ_WORDS}, {HAVE_WORDS}, {TOK_WORDS}",
        f"PROMPT_DONE = {PROMPT_DONE}  # in prm_have: the prompt ends where the ring's tokens end",
        "# (wafer, core class, rectangles (x, y, w, h), host-visible arrays: symbol -> (elements per core, CSL type))",
        "CLASSES = [",
        *classes,
        "]",
    ]
    return "\n".join(head) + "\n" + _BF16 + _DRIVER


# The host rounds to bf16 as the interpreter does: the same functions' source.
_BF16 = "\n\n" + "\n\n".join(inspect.getsource(f) for f in (float32_to_bf16, bf16_to_float32))

_DRIVER = '''

# The NumPy type of each CSL element type the host moves, and the words memcpy moves it in
# (bf16, which NumPy lacks: its bit patterns, converted by the functions below).
_TYPES = {"f32": np.float32, "u32": np.uint32, "i32": np.int32, "f16": np.float16, "u16": np.uint16,
          "bf16": np.uint16}


def _bits(typ):
    return 8 * np.dtype(_TYPES[typ]).itemsize


def _words(values, typ):
    """Values as the 32-bit words memcpy moves (16-bit types in the low half)."""
    if typ == "bf16":
        a = np.ascontiguousarray(float32_to_bf16(values))
    else:
        a = np.ascontiguousarray(np.asarray(values).astype(_TYPES[typ]))
    if _bits(typ) == 32:
        return a.view(np.uint32), 32
    return a.view(np.uint16).astype(np.uint32), 16


def _fit(values, n):
    """values cut or zero-padded to n elements."""
    out = np.zeros(n, dtype=np.asarray(values).dtype)
    k = min(n, len(values))
    out[:k] = values[:k]
    return out


def h2d(runner, symbol, per_core, rect, typ):
    """Copy per_core (cores of the rectangle row-major x elements) into `symbol`."""
    x, y, w, h = rect
    data, bits = _words(np.asarray(per_core).reshape(w * h, -1), typ)
    runner.memcpy_h2d(runner.get_id(symbol), data.ravel(), x, y, w, h, data.shape[1], streaming=False,
                      order=MemcpyOrder.ROW_MAJOR, nonblock=False,
                      data_type=MemcpyDataType.MEMCPY_32BIT if bits == 32 else MemcpyDataType.MEMCPY_16BIT)


def d2h(runner, symbol, rect, n, typ):
    """`symbol` (n elements) of every core of the rectangle, row-major."""
    x, y, w, h = rect
    out = np.zeros(w * h * n, dtype=np.uint32)
    bits = _bits(typ)
    runner.memcpy_d2h(out, runner.get_id(symbol), x, y, w, h, n, streaming=False,
                      order=MemcpyOrder.ROW_MAJOR, nonblock=False,
                      data_type=MemcpyDataType.MEMCPY_32BIT if bits == 32 else MemcpyDataType.MEMCPY_16BIT)
    if typ == "bf16":
        return bf16_to_float32(out.astype(np.uint16)).reshape(w * h, n)
    if bits == 16:
        return out.astype(np.uint16).view(_TYPES[typ]).reshape(w * h, n)
    return out.view(_TYPES[typ]).reshape(w * h, n)


def arrays(wafer=None, name=None, prefix=None):
    """(wafer, class, rectangles, symbol, n, type) of every host-visible array
    called `name` (or whose name starts with `prefix`), on `wafer` or any."""
    for w, cls, rects, symbols in CLASSES:
        if wafer is not None and w != wafer:
            continue
        for sym, (n, typ) in symbols.items():
            if sym == name or (prefix is not None and sym.startswith(prefix)):
                yield w, cls, rects, sym, n, typ


def load_weights(runner, wafer, weights_dir):
    """Every class's resident state (`w`, `wq`): <class>.<symbol>.npy or zeros."""
    for _, name, rects, sym, n, typ in [*arrays(wafer, "w"), *arrays(wafer, "wq")]:
        path = os.path.join(weights_dir or "", f"{name}.{sym}.npy")
        cores = sum(r[2] * r[3] for r in rects)
        data = np.load(path) if weights_dir and os.path.exists(path) else np.zeros((cores, n))
        at = 0
        for rect in rects:
            k = rect[2] * rect[3]
            h2d(runner, sym, data[at:at + k], rect, typ)
            at += k


class Requests:
    """The workload's requests: those waiting, those refused (with why), the handles the
    programs see (0 = no request) and each one's outputs by the position whose step
    sampled them."""

    def __init__(self, lines):
        self.waiting, self.rejected = [], []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                self.rejected.append((f"line {i + 1}", "not valid JSON"))
                continue
            why = _invalid(r)
            if why:
                self.rejected.append((r.get("id") if isinstance(r, dict) else f"line {i + 1}", why))
            else:
                self.waiting.append(r)
        self.handle = {}  # handle -> request
        self.outputs = {}  # handle -> {position fed: token sampled}

    def take(self):
        """The next waiting request as a `req` entry: (handle, prompt length, output budget,
        first token); zeros when none waits."""
        if not self.waiting:
            return 0, 0, 0, 0
        r = self.waiting.pop(0)
        h = len(self.handle) + 1
        self.handle[h] = r
        self.outputs[h] = {}
        return h, len(r["prompt"]), _budget(r), int(r["prompt"][0])

    def first_output(self, h):
        """The position whose step samples handle h's first output: its last prompt token's."""
        return len(self.handle[h]["prompt"]) - 1

    def tokens(self, h):
        """Handle h's outputs in order, up to the first EOS."""
        got, first = self.outputs[h], self.first_output(h)
        out = []
        for pos in range(first, first + _budget(self.handle[h])):
            if pos not in got:
                break
            out.append(got[pos])
            if got[pos] in EOS:
                break
        return out

    def finished(self, h):
        out = self.tokens(h)
        return len(out) >= _budget(self.handle[h]) or bool(out and out[-1] in EOS)

    def missed(self, h):
        """Positions below the latest one read whose token was overwritten in `tok` first."""
        got = self.outputs[h]
        return [p for p in range(self.first_output(h), max(got, default=0)) if p not in got]

    def done(self):
        return not self.waiting and all(self.finished(h) for h in self.handle)


def _budget(r):
    return int(r.get("max_new_tokens", 1))


def _invalid(r):
    """Why request r (a parsed line) cannot be served, or None."""
    if not isinstance(r, dict):
        return "not a JSON object"
    p = r.get("prompt")
    if not isinstance(p, list) or not p or not all(isinstance(t, int) and 0 <= t < 2 ** 31 for t in p):
        return "prompt must be a non-empty list of token ids"
    n = r.get("max_new_tokens", 1)
    if not isinstance(n, int) or not 1 <= n < 2 ** 30:
        return "max_new_tokens must be a positive integer"
    return None


def first_step(requests):
    """The first requests, one per slot, as `req` entries (handle, prompt length, output
    budget, first token), and the first message of every micro-batch on the loop-carried
    flows: each slot's first token and (0, status 1 = free), so the first stage admits
    from `req`."""
    req = np.zeros(SLOTS * REQ_WORDS, dtype=np.uint32)
    tokens = np.zeros(SLOTS, dtype=np.int64)
    for s in range(SLOTS):
        entry = requests.take()
        req[REQ_WORDS * s:REQ_WORDS * (s + 1)] = entry
        tokens[s] = entry[3]
    meta = np.tile(np.array([0, 1], dtype=np.uint32), SLOTS)
    return req, tokens, meta


def prime_loop_carried(runner, wafer, tokens, meta):
    """Load `prime_*` (data: tokens of each micro-batch; `prime_meta_*`: its
    continuous-batching metainfo) on the receivers of every loop-carried flow."""
    for _, _, rects, sym, n, typ in arrays(wafer, prefix="prime_"):
        src = meta if sym.startswith("prime_meta_") else tokens
        per_msg = n // GROUPS
        msgs = [src[g * len(src) // GROUPS:(g + 1) * len(src) // GROUPS] for g in range(GROUPS)]
        one = np.concatenate([_fit(m, per_msg) for m in msgs])
        for rect in rects:
            h2d(runner, sym, np.tile(one, (rect[2] * rect[3], 1)), rect, typ)


def push_requests(runner, wafer, requests):
    """Fill the free `req` entries (handle 0: the program admitted it) of the first stage."""
    for _, _, rects, sym, n, typ in arrays(wafer, "req"):
        cur = d2h(runner, sym, rects[0], n, typ)[0].copy()
        for s in range(n // REQ_WORDS):
            if cur[REQ_WORDS * s] == 0 and requests.waiting:
                cur[REQ_WORDS * s:REQ_WORDS * (s + 1)] = requests.take()
        for rect in rects:
            h2d(runner, sym, np.tile(cur, (rect[2] * rect[3], 1)), rect, typ)


def feed_prompts(runner, wafer, requests):
    """Keep the next prompt tokens of every live request in the first stage's ring `prm`
    (its depth: the array's words a slot), from the position its RDT says it fed last: the
    ring first, then `prm_have` (the prompt below that position is in the ring, | PROMPT_DONE
    where that is the prompt's end; and for which handle), so the stage never takes a token
    the ring does not hold yet (it pauses the slot instead)."""
    for w, _, rects, symbols in CLASSES:
        if w != wafer or "prm" not in symbols:
            continue
        rdt = d2h(runner, "rdt", rects[0], *symbols["rdt"])[0]
        depth = symbols["prm"][0] // SLOTS
        ring = np.zeros(SLOTS * depth, dtype=np.int32)
        have = np.zeros(SLOTS * HAVE_WORDS, dtype=np.int32)
        for s in range(SLOTS):
            h, pos = int(rdt[4 * s]), int(rdt[4 * s + 2])
            r = requests.handle.get(h)
            if r is None:
                continue
            prompt = r["prompt"]
            want = min(len(prompt), pos + 1 + depth)
            for p in range(max(0, want - depth), want):
                ring[s * depth + p % depth] = prompt[p]
            have[HAVE_WORDS * s:HAVE_WORDS * (s + 1)] = want | (PROMPT_DONE if want == len(prompt) else 0), h
        for sym, data in (("prm", ring), ("prm_have", have)):  # in this order: see above
            for rect in rects:
                h2d(runner, sym, np.tile(data, (rect[2] * rect[3], 1)), rect, symbols[sym][1])


def read_tokens(runner, wafer, requests):
    """New (handle, position fed, token) entries in `tok` of the sampler root (a ring of
    each slot's last samples: more steps than its depth between two reads miss some): a
    request's outputs are the tokens sampled at its last prompt position and after."""
    for _, _, rects, sym, n, typ in arrays(wafer, "tok"):
        cur = d2h(runner, sym, rects[0], n, typ)[0]
        for s in range(n // TOK_WORDS):
            h, pos, t = (int(v) for v in cur[TOK_WORDS * s:TOK_WORDS * (s + 1)])
            if h in requests.handle and pos >= requests.first_output(h):
                requests.outputs[h].setdefault(pos, t)


def relay_wafer_links(runners, sent):
    """Copy every new cross-wafer message (`xout_k`, `xout_meta_k`) to the next
    wafer's `xin_k`, `xin_meta_k` and launch `xin_k_ready`: sender core i (in class
    order, row-major) feeds receiver core i (cycling when the counts differ)."""
    for w, _, rects, sym, _, typ in [*arrays(prefix="xout_seq_")]:
        k = sym[len("xout_seq_"):]
        seq = int(d2h(runners[w], sym, rects[0], 1, typ)[0, 0])
        if seq == sent.get(k, 0):
            continue
        for part in (f"xout_{k}", f"xout_meta_{k}"):
            msgs = [m for _, _, rs, _, n1, t1 in arrays(w, part) for r in rs
                    for m in d2h(runners[w], part, r, n1, t1)]
            dst = part.replace("xout", "xin", 1)
            i = 0
            for w2, _, rects2, _, n2, t2 in arrays(name=dst):
                for rect in rects2:
                    cores = rect[2] * rect[3]
                    block = [_fit(msgs[(i + c) % len(msgs)], n2) for c in range(cores)]
                    h2d(runners[w2], dst, np.stack(block), rect, t2)
                    i += cores
        for w2 in sorted({ww for ww, *_ in arrays(name=f"xin_{k}")}):
            runners[w2].launch(f"xin_{k}_ready", nonblock=False)
        sent[k] = seq


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="out", help="cslc output directory (prefix per wafer)")
    parser.add_argument("--cmaddr", help="IP:port of the CS system; omit for the simulator")
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")
    parser.add_argument("--weights", default=here if os.path.isdir(here) else None,
                        help="directory of <class>.<symbol>.npy arrays (default: weights/ beside this "
                             "file, written by meshrt compile --emit csl --weights; else zeros)")
    parser.add_argument("--workload", help="JSONL: one request per line with prompt (token ids) and max_new_tokens")
    parser.add_argument("--polls", type=int, default=1000, help="serving-loop iterations at most")
    args = parser.parse_args()
    requests = Requests(open(args.workload).read().splitlines() if args.workload else [])
    req, tokens, meta = first_step(requests)
    runners = []
    for wafer in range(WAFERS):
        name = args.name + (str(wafer) if WAFERS > 1 else "")
        runner = SdkRuntime(name, cmaddr=args.cmaddr)
        runner.load()
        runner.run()
        load_weights(runner, wafer, args.weights)
        prime_loop_carried(runner, wafer, tokens, meta)
        for _, _, rects, sym, n, typ in arrays(wafer, "req"):
            for rect in rects:
                h2d(runner, sym, np.tile(req, (rect[2] * rect[3], 1)), rect, typ)
        runners.append(runner)
    for runner in runners:
        runner.launch("start", nonblock=False)
    sent = {}
    for _ in range(args.polls):
        if requests.done():
            break
        relay_wafer_links(runners, sent)
        for wafer, runner in enumerate(runners):
            push_requests(runner, wafer, requests)
            feed_prompts(runner, wafer, requests)
            read_tokens(runner, wafer, requests)
    for h, r in requests.handle.items():
        line = {"id": r.get("id", h), "tokens": requests.tokens(h), "finished": requests.finished(h)}
        missed = requests.missed(h)
        if missed:
            line["missed_positions"] = missed
        print(json.dumps(line))
    for rid, why in requests.rejected:
        print(json.dumps({"id": rid, "rejected": why}))
    for r in requests.waiting:  # not admitted within --polls
        print(json.dumps({"id": r.get("id"), "tokens": [], "finished": False}))
    for runner in runners:
        runner.stop()


if __name__ == "__main__":
    main()
'''


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
