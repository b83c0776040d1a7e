"""The CSL backend's host side: loop-carried flows are primed from host-loaded
buffers (as the interpreter's host primes them), and the run.py driver sketch
loads them, pushes requests, reads tokens and relays wafer-link messages —
exercised against a fake SdkRuntime (meshrt has no Cerebras SDK)."""

from __future__ import annotations

import json
import re
import runpy
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from meshrt.backend.csl import emit_csl
from meshrt.backend.csl.model import read_program, segment_programs
from meshrt.analysis.liveness import host_primed
from meshrt.passes.pipeline import lower_to
from meshrt.driver import load_model

REPO = Path(__file__).resolve().parents[2]
_LOWERED: dict[tuple[str, str], object] = {}


def lowered(model: str, target: str):
    if (model, target) not in _LOWERED:
        _LOWERED[(model, target)] = lower_to(load_model(str(REPO / model), target), "csl")
    return _LOWERED[(model, target)]


@pytest.mark.parametrize("model,target", [("examples/tiny_moe.mrt", "test32"),
                                          ("examples/tiny_dense.mrt", "test32"),
                                          ("examples/tiny_moe.mrt", "test16")])
def test_primed_receives_take_host_messages_first(model, target):
    module = lowered(model, target)
    op = segment_programs(module)[0]
    primed = host_primed(op)
    assert primed == {("embed", "embed.tokens")}  # the sampled tokens back to the first stage
    program = read_program(op)
    out = emit_csl(module)
    receivers = [c for c in program.classes
                 if any(e.primed and e.kind == "recv" for s in c.segments for e in s.events())]
    assert receivers
    groups = program.slots // program.micro_batch
    for c in receivers:
        text = next(t for n, t in out.files.items() if n.endswith(c.file))
        assert f"var prime_left_embed_tokens: u16 = {groups};" in text
        # the resolver and the data receive both branch on it; the data uses the message up
        assert text.count("if (prime_left_embed_tokens > 0) {") >= 2
        assert text.count("prime_left_embed_tokens -= 1;") == 1
        # from the fabric the state waits for the transfer, primed it goes on at once
        assert ("return primed;" in text) == (not program.flows["embed.tokens"].cross)
    # nothing else is primed
    others = [t for n, t in out.files.items() if n.endswith(".csl") and "prime_left" in t]
    assert len(others) == len(receivers)


# ---------------------------------------------------------------------------
# run.py against a fake SdkRuntime


class FakeRuntime:
    """Per-core memory of the exported arrays and, once started, a model of the chip's
    request protocol (the emitted first-stage resolver, `meshrt.backend.csl.metainfo`, and
    the sampler's `tok` ring), written here as the test's oracle: every read of `tok`
    runs a decode step of every slot (and `steps_per_read` - 1 more of the slots still
    feeding their prompts, or of every slot with `outrun`), each slot's sampled token
    1000 + the position it fed (a token in `eos` ends its request)."""

    instances: list[FakeRuntime] = []
    steps_per_read = 1
    outrun = False  # the extra steps run every slot (the host polls slower than the chip)
    eos: tuple[int, ...] = ()

    def __init__(self, name, cmaddr=None):
        self.name = name
        self.mem: dict[tuple[str, int, int], np.ndarray] = {}
        self.calls: list[tuple] = []
        self.started = False
        self.reads = 0
        self.slot: dict[int, dict] = {}  # slot -> the live request's state on the chip
        self.fed: dict[int, list[int]] = {}  # handle -> the tokens the first stage fed it
        self.pauses = 0
        self.first_write: dict[str, np.ndarray] = {}
        self.tok = self.rdt = None
        FakeRuntime.instances.append(self)

    @staticmethod
    def _array(sym):
        """(the runner holding array `sym` (any wafer's), its first core's copy, its keys)."""
        for r in FakeRuntime.instances:
            keys = [k for k in r.mem if k[0] == sym]
            if keys:
                return r, r.mem[keys[0]], keys
        return None, None, []

    def _step(self, g, in_prompt_only=False):
        """One decode step of every slot (`in_prompt_only`: of the slots whose step samples
        no output yet: the chip outrunning the host while it feeds prompts)."""
        first, req, req_keys = self._array("req")
        _, prm, prm_keys = self._array("prm")
        _, have, _ = self._array("prm_have")
        if req is None:
            return
        rw, hw, done_bit = g["REQ_WORDS"], g["HAVE_WORDS"], g["PROMPT_DONE"]
        ring = len(prm) // g["SLOTS"]
        if self.tok is None:  # as long as the program declares it: a ring a slot
            self.tok = np.zeros(len(next(v for k, v in self.mem.items() if k[0] == "tok")), np.uint32)
        tok = self.tok
        depth = len(tok) // (g["SLOTS"] * g["TOK_WORDS"])
        self.tok_depth = depth
        if self.rdt is None:
            self.rdt = np.zeros(g["SLOTS"] * 4, np.int32)
        rdt = self.rdt
        for s in range(g["SLOTS"]):
            st = self.slot.get(s)
            if in_prompt_only and (st is None or st["pos"] + 2 >= st["len"]):
                continue
            mine = st is not None and have[s * hw + 1] == st["h"]
            upto = int(have[s * hw]) & (done_bit - 1)
            ended = mine and bool(int(have[s * hw]) & done_bit)
            if st is not None and st["running"] and (st["pos"] >= st["last"] or (
                    st["eos"] and ended and st["pos"] + 1 >= upto)):
                st = self.slot[s] = None  # done: the slot is free
                rdt[4 * s:4 * s + 4] = 0
            if st is None:
                if req[s * rw] == 0:
                    continue
                h, n, budget, tok0 = (int(v) for v in req[s * rw:(s + 1) * rw])
                st = self.slot[s] = {"h": h, "len": n, "last": n + budget - 2, "pos": 0, "running": True}
                self.ring_depth = ring
                for k in req_keys:
                    first.mem[k][s * rw] = 0
                fed = tok0
            else:
                nxt = st["pos"] + 1
                st["running"] = True
                if mine and nxt < upto:
                    fed = int(prm[s * ring + nxt % ring])
                elif ended:
                    fed = st["sampled"]
                else:
                    st["running"] = False  # paused
                    self.pauses += 1
                if st["running"]:
                    st["pos"] = nxt
            rdt[4 * s:4 * s + 3] = st["h"], 0 if st["running"] else 3, st["pos"]
            if st["running"]:
                self.fed.setdefault(st["h"], []).append(fed)
                st["sampled"] = 1000 + st["pos"]
                st["eos"] = st["sampled"] in self.eos
                e = (s * depth + st["pos"] % depth) * 3
                tok[e:e + 3] = st["h"], st["pos"], st["sampled"]
        for _, x, y in prm_keys:  # the first stage's RDT, which the host reads
            first.mem[("rdt", x, y)] = rdt.view(np.uint32).copy()
        for k in [k for k in self.mem if k[0] == "tok"]:
            self.mem[k] = tok.copy()

    def load(self):
        self.calls.append(("load",))

    def run(self):
        self.calls.append(("run",))

    def stop(self):
        self.calls.append(("stop",))

    def get_id(self, symbol):
        return symbol

    def launch(self, fn, nonblock=False):
        self.calls.append(("launch", fn))
        self.started |= fn == "start"

    def _cores(self, x, y, w, h):
        return [(x + i % w, y + i // w) for i in range(w * h)]

    def memcpy_h2d(self, sym, data, x, y, w, h, n, streaming=False, order=None, nonblock=False, data_type=None):
        a = np.asarray(data, dtype=np.uint32).reshape(w * h, n)
        self.first_write.setdefault(sym, a[0].copy())
        for i, (cx, cy) in enumerate(self._cores(x, y, w, h)):
            self.mem[(sym, cx, cy)] = a[i].copy()
        self.calls.append(("h2d", sym, x, y, w, h, n))

    def memcpy_d2h(self, out, sym, x, y, w, h, n, streaming=False, order=None, nonblock=False, data_type=None):
        if sym == "tok" and self.started:
            self.reads += 1
            if (sym, x, y) not in self.mem:
                for cx, cy in self._cores(x, y, w, h):
                    self.mem[(sym, cx, cy)] = np.zeros(n, np.uint32)
            self._step(self.globals)
            for _ in range(self.steps_per_read - 1):
                self._step(self.globals, in_prompt_only=not self.outrun)
        if sym.startswith("xout_seq_") and self.started:
            self.mem[(sym, x, y)] = np.array([1], np.uint32)
        for i, (cx, cy) in enumerate(self._cores(x, y, w, h)):
            out[i * n:(i + 1) * n] = self.mem.get((sym, cx, cy), np.zeros(n, np.uint32))[:n]
        self.calls.append(("d2h", sym, x, y, w, h, n))


def run_driver(files: dict[str, str], tmp_path, requests: list[dict]) -> tuple[list[FakeRuntime], list[dict], dict]:
    script = tmp_path / "run.py"
    script.write_text(files["run.py"])
    wl = tmp_path / "wl.jsonl"
    wl.write_text("".join(json.dumps(r) + "\n" for r in requests))
    fake = types.ModuleType("cerebras.sdk.runtime.sdkruntimepybind")
    fake.SdkRuntime = FakeRuntime
    fake.MemcpyDataType = types.SimpleNamespace(MEMCPY_32BIT=32, MEMCPY_16BIT=16)
    fake.MemcpyOrder = types.SimpleNamespace(ROW_MAJOR=0, COL_MAJOR=1)
    mods = {n: types.ModuleType(n) for n in ("cerebras", "cerebras.sdk", "cerebras.sdk.runtime")}
    mods[fake.__name__] = fake
    FakeRuntime.instances = []
    old_argv, old_mods = sys.argv, {n: sys.modules.get(n) for n in mods}
    sys.modules.update(mods)
    sys.argv = ["run.py", "--workload", str(wl), "--polls", "50"]
    printed: list[str] = []
    try:
        g = runpy.run_path(str(script), run_name="not_main")
        g["main"].__globals__["print"] = printed.append  # one JSON line per request
        FakeRuntime.globals = g["main"].__globals__
        g["main"]()
    finally:
        sys.argv = old_argv
        for n, m in old_mods.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return FakeRuntime.instances, [json.loads(x) for x in printed], g


@pytest.mark.parametrize("target", ["test32", "test16"])
def test_driver_primes_loads_and_serves(tmp_path, target):
    module = lowered("examples/tiny_moe.mrt", target)
    out = emit_csl(module)
    # as many requests as slots, up to 5: the fake sampler keeps slot s on request s + 1
    n = min(5, read_program(segment_programs(module)[0]).slots)
    reqs = [{"id": f"r{i}", "prompt": [10 + i, 3], "max_new_tokens": 3} for i in range(n)]
    runners, results, g = run_driver(out.files, tmp_path, reqs)
    assert len(runners) == g["WAFERS"]
    slots, groups, b = g["SLOTS"], g["GROUPS"], g["MICRO_BATCH"]
    # Before `start`: weights, the primed first messages and the first requests are in.
    for r in runners:
        first_launch = next(i for i, c in enumerate(r.calls) if c[0] == "launch")
        before = {c[1] for c in r.calls[:first_launch] if c[0] == "h2d"}
        assert r.calls[first_launch] == ("launch", "start")
        for w, _, rects, symbols in g["CLASSES"]:
            if runners[w] is not r:
                continue
            for sym in symbols:
                if sym in ("w", "prime_embed_tokens", "prime_meta_embed_tokens", "req"):
                    assert sym in before
    embed = [c for c in g["CLASSES"] if "prime_embed_tokens" in c[3]]
    assert embed
    for w, _, rects, symbols in embed:
        x, y, _, _ = rects[0]
        mem = runners[w].mem
        data = mem[("prime_embed_tokens", x, y)].view(np.int32)  # token ids: 32-bit integers
        meta = mem[("prime_meta_embed_tokens", x, y)]
        per = symbols["prime_embed_tokens"][0] // groups
        # micro-batch m's message carries the first tokens of slots m*b .. m*b+b-1
        firsts = [10 + i for i in range(n)] + [0] * (slots - n)
        assert [list(data[m * per:m * per + b]) for m in range(groups)] == \
               [firsts[m * b:(m + 1) * b] for m in range(groups)]
        assert list(meta[:2 * b]) == [0, 1] * b  # every slot free: the first stage admits from req
        req = runners[w].first_write["req"]
        # (request number, prompt length, output budget, first prompt token) of each request
        assert list(req[:4 * n]) == [v for i in range(n) for v in (i + 1, 2, 3, 10 + i)]
    # Serving: every request gets its 3 tokens, those sampled at positions 1, 2, 3 (its
    # last prompt position on); the loop stops.
    assert [r["id"] for r in results] == [f"r{i}" for i in range(n)]
    assert all(r["tokens"] == [1001, 1002, 1003] and r["finished"] for r in results)
    if g["WAFERS"] > 1:  # wafer-link messages were relayed and announced
        launched = {c[1] for r in runners for c in r.calls if c[0] == "launch"}
        assert any(f.startswith("xin_") and f.endswith("_ready") for f in launched)
        assert any(c[0] == "h2d" and c[1].startswith("xin_") for r in runners for c in r.calls
                   if c[0] == "h2d")


def test_prompts_longer_than_the_ring_are_fed_whole_and_requests_end_on_chip(tmp_path, monkeypatch):
    """The first stage is fed each request's whole prompt in order from the ring the host
    refills (the chip outruns the host here, three steps a poll while prompts are fed: slots
    pause instead of taking a token not written yet); tokens sampled inside the prompt are not outputs; a
    request ends after max_new_tokens or on an EOS (the chip frees its slot, the next
    request is admitted); bad request lines are rejected and reported, not dropped."""
    out = emit_csl(lowered("examples/tiny_moe.mrt", "test32"))
    files = dict(out.files)
    files["run.py"] = re.sub(r"(?m)^EOS = .*$", "EOS = (1014,)", files["run.py"])
    monkeypatch.setattr(FakeRuntime, "steps_per_read", 3)
    monkeypatch.setattr(FakeRuntime, "eos", (1014,))
    prompts = [list(range(100 + 20 * i, 120 + 20 * i)) for i in range(3)]  # 20 tokens, ring 8
    reqs = [{"id": "a", "prompt": prompts[0], "max_new_tokens": 3},
            {"id": "b", "prompt": [7] * 12, "max_new_tokens": 9},  # EOS sampled at 14: its 4th
            {"id": "c", "prompt": prompts[2], "max_new_tokens": 1},
            {"id": "bad", "prompt": [], "max_new_tokens": 2},
            {"id": "zero", "prompt": [1], "max_new_tokens": 0}]
    runners, results, g = run_driver(files, tmp_path, reqs)
    assert "EOS = (1014,)" in files["run.py"]
    by_id = {r["id"]: r for r in results}
    assert by_id["a"]["tokens"] == [1019, 1020, 1021] and by_id["a"]["finished"]
    assert by_id["b"]["tokens"] == [1011, 1012, 1013, 1014] and by_id["b"]["finished"]
    assert by_id["c"]["tokens"] == [1019] and by_id["c"]["finished"]
    assert by_id["bad"]["rejected"].startswith("prompt must be")
    assert by_id["zero"]["rejected"].startswith("max_new_tokens must be")
    chip = next(r for r in runners if r.fed)
    assert chip.pauses > 0 and chip.ring_depth < 20
    for prompt in (prompts[0], [7] * 12, prompts[2]):
        assert any(f[:len(prompt)] == prompt for f in chip.fed.values()), prompt


@pytest.mark.parametrize("steps, complete", [(3, True), (12, False)])
def test_a_host_polling_slower_than_the_chip_reads_the_token_ring(tmp_path, monkeypatch, steps, complete):
    """The sampler keeps each slot's last samples in a ring (`tok`, position p at p mod its
    depth, 8 on tiny_moe's test32 sampler root): a host reading every 3 steps gets every
    output (with one entry a slot, it read only every third); one reading every 12 steps
    misses some and reports them, the request unfinished."""
    out = emit_csl(lowered("examples/tiny_moe.mrt", "test32"))
    monkeypatch.setattr(FakeRuntime, "steps_per_read", steps)
    monkeypatch.setattr(FakeRuntime, "outrun", True)
    reqs = [{"id": f"r{i}", "prompt": [10 + i, 3], "max_new_tokens": 20} for i in range(2)]
    runners, results, g = run_driver(out.files, tmp_path, reqs)
    chip = next(r for r in runners if r.fed)
    assert chip.tok_depth == 8 and "p mod 8" in out.files["c_sample_root.csl"]
    for r in results:
        if complete:
            assert r["finished"] and r["tokens"] == [1000 + p for p in range(1, 21)], r
        else:
            assert not r["finished"] and r["missed_positions"], r
            got = set(r["tokens"])
            assert all(1000 + p not in got for p in r["missed_positions"])


@pytest.mark.parametrize("name, fabric", [("wse3", (762, 1172)), ("wse2", (757, 996))])
def test_a_program_filling_the_target_fits_its_fabric_with_memcpys_halo(name, fabric):
    """The hardware targets give the cores a program may use beside memcpy, so a
    program as large as the target compiles for exactly the published fabric (the
    SDK's examples: fabric offsets 4, 1 and a fabric of width + 7 by height + 2)."""
    from meshrt.backend.csl.host import compile_sh
    from meshrt.targets import load_target

    t = load_target(name)
    program = types.SimpleNamespace(name="m", wafers=1, target=name)
    text = compile_sh(program, name, {0: (t.width, t.height)}, (t.width, t.height), "f32")
    assert f"--fabric-dims={fabric[0]},{fabric[1]} --fabric-offsets=4,1" in text
    assert "NOTE" not in text
    text = compile_sh(program, name, {0: (t.width + 1, t.height)}, (t.width, t.height), "f32")
    assert "NOTE: the" in text and f"a {fabric[0]} x {fabric[1]} fabric" in text


def test_emitted_weights_hold_the_models_tiles_and_reach_their_cores(tmp_path):
    """--emit csl --weights: each class's `w`, per core, holds what its kernels' PE bodies
    keep resident, from the model's weights: the o projection's tiles hold every weight of
    W_o once (the rest of a tile is padding), each row of the first norm's cores its gains
    (one copy per column of the norm's region); run.py loads each core its own row."""
    from meshrt.runtime import reference as ref
    from meshrt.runtime.serving import reference_shape

    module = lowered("examples/tiny_dense.mrt", "test32")
    program = segment_programs(module)[0]
    weights = ref.Weights.random(reference_shape(program), 3)
    out = emit_csl(module, weights=weights)
    assert out.arrays, "no class got weight tiles"
    got: dict[str, list[np.ndarray]] = {}
    for cls, regions in out.regions.items():
        w = out.arrays.get(f"weights/{cls}.w.npy")
        for kernel, array, off, n in regions:
            if array == "w" and w is not None:
                got.setdefault(kernel, []).append(w[:, off:off + n])
    wo = weights.layers[0].wo
    o = np.concatenate([a.ravel() for a in got["l0_o"]])
    assert np.count_nonzero(o) == wo.size
    assert np.array_equal(np.sort(o[o != 0]), np.sort(wo.ravel()))
    gain = weights.layers[0].attn_norm
    norm = [k for k in program.kernels() if k.kernel_name == "l0_norm1"][0]
    cols = norm.region.rects.data[0].tuple[2]
    g = np.concatenate([a.ravel() for a in got["l0_norm1"]])
    assert np.array_equal(np.sort(g[g != 0]), np.sort(np.repeat(gain, cols)))
    # run.py hands each core its row
    for name, array in out.arrays.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp_path / name, array)
    n = min(2, read_program(program).slots)
    runners, _, g_ = run_driver(out.files, tmp_path, [{"id": "r0", "prompt": [5, 3], "max_new_tokens": 2}][:n])
    for wafer, cls, rects, symbols in g_["CLASSES"]:
        w = out.arrays.get(f"weights/{cls}.w.npy")
        if w is None:
            continue
        row = 0
        for x, y, rw, rh in rects:
            for cy in range(y, y + rh):
                for cx in range(x, x + rw):
                    loaded = runners[wafer].mem[("w", cx, cy)].view(np.float32)
                    assert np.array_equal(loaded[:w.shape[1]], w[row])
                    row += 1


BF16_MODEL = "test/filecheck/csl/Inputs/qwen3_bf16_config.json"


def test_a_bf16_model_runs_in_bf16_on_the_chip(tmp_path):
    """A bf16 checkpoint's program computes in bf16, as the interpreter and the reference
    round (not IEEE f16, whose range ends at 65504 and whose small values lose bits):
    its 16-bit arrays are bf16, cslc selects bf16 (so every 16-bit operation and <math>'s
    `_f16` functions work in it, and no runtime value is of another 16-bit type), and
    run.py writes each core's weights as the bf16 bit patterns of the model's values."""
    import re

    from meshrt.activations import float32_to_bf16
    from meshrt.runtime import reference as ref
    from meshrt.runtime.serving import reference_shape

    module = lowered(BF16_MODEL, "test32")
    program = segment_programs(module)[0]
    weights = ref.Weights.random(reference_shape(program), 5)
    out = emit_csl(module, weights=weights)
    assert "--fp16-format=bf16" in out.files["compile.sh"]
    csl = {n: t for n, t in out.files.items() if n.endswith(".csl")}
    assert any("]bf16)" in t for t in csl.values())
    for name, text in csl.items():
        assert not re.search(r"\bf16\b", text), name  # a runtime f16 does not compile under bf16
        assert "_bf16(" not in text, name  # <math> names its @fp16() functions _f16
    assert any("math.exp_f16(" in t for t in csl.values())
    for name, array in out.arrays.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp_path / name, array)
    runners, _, g = run_driver(out.files, tmp_path, [{"id": "r0", "prompt": [5, 3], "max_new_tokens": 2}])
    assert g["ELEM"] == "bf16"
    loaded = 0
    for wafer, cls, rects, symbols in g["CLASSES"]:
        w = out.arrays.get(f"weights/{cls}.w.npy")
        if w is None:
            continue
        assert symbols["w"][1] == "bf16"
        x, y, _, _ = rects[0]
        words = runners[wafer].mem[("w", x, y)]  # 16-bit values in the low half of a word
        assert np.array_equal(words[:w.shape[1]], float32_to_bf16(w[0]).astype(np.uint32))
        loaded += np.count_nonzero(w[0])
    assert loaded
