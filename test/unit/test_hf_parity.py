"""Parity with transformers on committed checkpoints (no torch needed).

`bench/hf_parity.py` made each fixture under test/data/hf/ with transformers'
own model code and recorded its greedy tokens and teacher-forced logits; here
each checkpoint goes through `meshrt run`'s path (`driver.load_spec` on the
directory, `checkpoint.load_checkpoint`) into the NumPy reference, which must
give the same tokens and logits within 1e-4, and into the interpreter on
test32, whose tokens must equal the reference's (one asynchrony seed here;
`python bench/hf_parity.py --check --interpreter` runs five).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from meshrt import driver
from meshrt.runtime import reference as ref
from meshrt.frontend.hf_config import SUPPORTED_TYPES
from meshrt.runtime.checkpoint import load_checkpoint, tensor_names
from meshrt.shape import HParams
from meshrt.tools.cli import main

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "test" / "data" / "hf"
FIXTURES = sorted(p.name for p in DATA.iterdir() if (p / "expected.json").is_file())

_spec = importlib.util.spec_from_file_location("hf_parity", REPO / "bench" / "hf_parity.py")
hf_parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_parity)


def test_every_supported_type_but_gpt_oss_has_a_fixture():
    types = {json.loads((DATA / n / "expected.json").read_text())["model_type"] for n in FIXTURES}
    assert types == set(SUPPORTED_TYPES)
    assert set(FIXTURES) == set(hf_parity.FIXTURES)
    for n in FIXTURES:  # small enough to commit
        assert sum(f.stat().st_size for f in (DATA / n).iterdir()) < 500_000


@pytest.fixture(scope="module")
def reference():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = hf_parity.reference_outputs(DATA / name)
        return cache[name]

    return get


@pytest.mark.parametrize("name", FIXTURES)
def test_reference_equals_transformers(name, reference):
    exp = json.loads((DATA / name / "expected.json").read_text())
    _, tokens, logits = reference(name)
    assert tokens == exp["tokens"]
    want = np.load(DATA / name / "logits.npy")
    assert logits.shape == want.shape
    assert np.max(np.abs(logits - want)) <= 1e-4


SHARED = [n for n in FIXTURES if driver.load_spec(DATA / n).shape.shared_experts]


# On the interpreter, in the suite: one dense, one DeltaNet, and the MoE kinds (top-k
# renormalised, gpt_oss's biased clamped experts, shared experts); the rest by hand (`-m slow`).
FAST_INTERPRETER = {"llama", "qwen3_moe", "gpt_oss", "qwen3_5", "qwen3_5_moe"}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=() if n in FAST_INTERPRETER else pytest.mark.slow) for n in FIXTURES])
def test_interpreter_equals_reference_on_test32(name, reference):
    _, want, _ = reference(name)
    got, result = hf_parity.interpreter_tokens(DATA / name, seed=0)
    assert result.outputs_match_reference and not result.sim.reports
    assert got == want


def test_experts_held_decoded_or_packed_give_the_same_tokens(reference):
    """Where decoded expert tiles fit (the tiny gpt_oss on test32), the mapper holds them
    decoded: no dequant events, 16-bit floats of SRAM. The same graph IR without `decoded`
    holds them packed and decodes them each step; both give the reference's tokens."""
    from meshrt.runtime.checkpoint import load_checkpoint
    from meshrt.runtime.serving import reference_shape, serve
    from meshrt.runtime.workloads import Request
    from xdsl.printer import Printer

    d = DATA / "gpt_oss_mxfp4"
    graph_ir = hf_parity.f32_activations(driver.compile(d, "test32", "graph"))
    text = io.StringIO()
    Printer(stream=text).print_op(graph_ir)
    assert text.getvalue().count('weights = "mxfp4", decoded,') == 2  # both MoE layers
    _, want, _ = reference("gpt_oss_mxfp4")
    exp = json.loads((d / "expected.json").read_text())
    held = {}
    for how, ir in (("decoded", text.getvalue()),
                    ("packed", text.getvalue().replace('weights = "mxfp4", decoded,',
                                                       'weights = "mxfp4",'))):
        program = driver.segment_program(driver.parse_ir(ir), "test32")
        ops = {e.op.data for e in program.walk() if e.name == "event.compute"}
        assert ("dequant_mxfp4" in ops) == (how == "packed"), how
        held[how] = max(s.demand.sram.data for s in program.walk()
                        if s.name == "event.sub" and s.kernel.root_reference.data == "l0_moe.experts")
        weights = load_checkpoint(d, reference_shape(program))
        reqs = [Request(i, 0.0, list(p), len(p), hf_parity.NEW_TOKENS, hf_parity.NEW_TOKENS)
                for i, p in enumerate(exp["prompts"])]
        res = serve(program, driver.load_target("test32"), reqs, seed=0, weights=weights)
        assert res.outputs_match_reference and not res.sim.reports, how
        assert [r.tokens for r in sorted(res.records, key=lambda r: r.id)] == want, how
    assert held["decoded"] > held["packed"]  # 16-bit floats take more SRAM than 4-bit codes


@pytest.mark.parametrize("name, change, drop", [
    ("llama", {"rope_type": "default"}, ()),  # the llama3 scaling
    ("llama", {"qkv_bias": False, "o_bias": False, "mlp_bias": False},
     ("bq", "bk", "bv", "bo", "dense.b_gate", "dense.b_up", "dense.b_down")),
    ("qwen3", {"rope_type": "default", "rope_factor": 1.0}, ()),  # yarn
    ("qwen3", {"qk_norm": False}, ("q_norm", "k_norm")),
    ("qwen3_moe", {"rope_type": "default", "rope_factor": 1.0}, ()),  # linear
    ("qwen2", {"sliding_window": 0, "window_layers": ()}, ()),
    ("mixtral", {"rope_theta": 1e6}, ()),
    ("mixtral", {"sliding_window": 0, "window_layers": ()}, ()),
    ("qwen3_moe_mixed", {"norm_topk": True}, ()),
    ("qwen3_moe_mixed", {"rms_eps": 1e-6}, ()),  # its rms_norm_eps is 0.5
    ("gpt_oss", {"attn_sinks": False}, ("sinks",)),
    ("gpt_oss", {"swiglu_limit": 0.0}, ()),
    ("gpt_oss", {"router_bias": False}, ("moe.router_bias",)),
    ("gpt_oss", {"expert_bias": False}, ("moe.b_gate", "moe.b_up", "moe.b_down")),
    ("gpt_oss", {"sliding_window": 0, "window_layers": ()}, ()),
    ("qwen3_5", {"attn_gate": False}, ("wg",)),
    ("qwen3_5", {"rope_partial": 1.0}, ()),
    ("qwen3_5_moe", {"rope_partial": 1.0}, ()),
    ("qwen3_5_moe", {"shared_expert_gate": False}, ("moe.shared_scale",)),
])
def test_the_fixtures_exercise_each_feature(name, change, drop):
    """The same weights with one feature switched off (its arrays dropped) are
    far from transformers: the parity tests above could fail."""
    d = DATA / name
    full = ref.RefShape.of(driver.load_spec(d).shape)
    shape = dataclasses.replace(full, **change)
    weights = load_checkpoint(d, full)
    weights.shape = shape
    for lw in weights.layers:
        for path in drop:
            *outer, attr = path.split(".")
            owner = getattr(lw, outer[0]) if outer else lw
            if owner is not None:
                setattr(owner, attr, None)
    model = ref.ReferenceModel(shape, weights)
    exp = json.loads((d / "expected.json").read_text())
    want = np.load(d / "logits.npy")
    rows = []
    for p, t in zip(exp["prompts"], exp["tokens"]):
        st = model.new_state()
        rows += [model.forward([(st, [tok])])[0] for tok in p + t[:-1]]
    assert np.max(np.abs(np.stack(rows) - want)) > 1e-3


def _teacher_forced_error(d: Path, weights: ref.Weights) -> float:
    model = ref.ReferenceModel(weights.shape, weights)
    exp = json.loads((d / "expected.json").read_text())
    rows = []
    for p, t in zip(exp["prompts"], exp["tokens"]):
        st = model.new_state()
        rows += [model.forward([(st, [tok])])[0] for tok in p + t[:-1]]
    return float(np.max(np.abs(np.stack(rows) - np.load(d / "logits.npy"))))


@pytest.mark.parametrize("name, fmt", [("qwen3_fp8", "fp8"), ("qwen3_moe_fp8", "fp8"),
                                       ("gpt_oss_mxfp4", "mxfp4")])
@pytest.mark.parametrize("wrong", ["no scales", "nibbles swapped"])
def test_the_quantized_fixtures_exercise_their_format(name, fmt, wrong):
    """The stored codes read without their block scales, or mxfp4's two codes per byte
    taken in the other order, are far from transformers: decoding is tested."""
    from meshrt import quant

    if wrong == "nibbles swapped" and fmt != "mxfp4":
        pytest.skip("fp8 stores one code per byte")
    d = DATA / name
    shape = ref.RefShape.of(driver.load_spec(d).shape)
    weights = load_checkpoint(d, shape)
    assert {p.fmt for p in weights.packed.values()} == {fmt}
    for key, p in weights.packed.items():
        codes = p.codes
        if wrong == "nibbles swapped":  # the even element is the low nibble
            pairs = np.swapaxes(codes, -1, -2).reshape(*codes.shape[:-2], codes.shape[-1], -1, 2)
            codes = np.swapaxes(pairs[..., ::-1].reshape(*pairs.shape[:-2], -1), -1, -2)
            bad = dataclasses.replace(p, codes=np.ascontiguousarray(codes)).decode()
        else:
            bad = (quant.E2M1 if fmt == "mxfp4" else quant.E4M3)[codes]
        weights.set_packed(key, p)
        *path, last = key.split(".")
        obj = weights
        for part in path:
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        setattr(obj, last, bad)
    assert _teacher_forced_error(d, weights) > 1e-3


def _run(*args) -> tuple[int, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["run", *map(str, args)])
    return rc, err.getvalue().splitlines()


@pytest.mark.parametrize("name", SHARED)
def test_the_shared_experts_change_the_tokens_and_the_interpreter_follows(name, reference):
    """Without its shared expert (down projection zeroed) the fixture gives other tokens,
    so the parity test above needs the interpreter's shared experts; it follows the
    change too: its routing carries the shared expert (and its sigmoid gate) as one
    more choice per token, which its region computes for every token."""
    from meshrt.runtime.checkpoint import load_checkpoint
    from meshrt.runtime.serving import reference_shape, serve
    from meshrt.runtime.workloads import Request

    d = DATA / name
    _, want, _ = reference(name)
    program = driver.segment_program(d, "test32")
    weights = load_checkpoint(d, reference_shape(program))
    for lw in weights.layers:
        if lw.moe is not None:
            lw.moe.shared_down[...] = 0.0
    exp = json.loads((d / "expected.json").read_text())
    reqs = [Request(i, 0.0, list(p), len(p), hf_parity.NEW_TOKENS, hf_parity.NEW_TOKENS)
            for i, p in enumerate(exp["prompts"])]
    res = serve(program, driver.load_target("test32"), reqs, seed=1, weights=weights)
    got = [r.tokens for r in sorted(res.records, key=lambda r: r.id)]
    assert res.outputs_match_reference and not res.sim.reports
    assert got != want


def test_meshrt_run_on_a_sharded_checkpoint_directory():
    d = DATA / "qwen3_moe_mixed"
    assert (d / "model.safetensors.index.json").is_file()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["run", str(d), "--requests", "2", "--json"])
    assert rc == 0
    assert json.loads(out.getvalue())["outputs_match_reference"]


@pytest.fixture
def broken(tmp_path):
    """A copy of the llama fixture whose one safetensors file `edit` rewrites."""
    d = tmp_path / "llama"
    shutil.copytree(DATA / "llama", d)
    f = d / "model.safetensors"

    def edit(fn):
        tensors = load_file(str(f))
        fn(tensors)
        save_file(tensors, str(f))
        return d, f

    return edit


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.pop("model.norm.weight"), "checkpoint has no tensor 'model.norm.weight'"),
    (lambda t: t.update({"model.layers.1.self_attn.k_proj.weight": np.zeros((16, 64), np.float32)}),
     "tensor 'model.layers.1.self_attn.k_proj.weight' has shape (16, 64), the config makes it (32, 64)"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.bias": np.zeros(64, np.int32)}),
     "tensor 'model.layers.0.mlp.up_proj.bias' is I32; meshrt loads F32, F16, BF16, F64"),
    (lambda t: t.update({"model.layers.0.self_attn.q_norm.weight": np.ones(8, np.float32)}),
     "tensor 'model.layers.0.self_attn.q_norm.weight' is not a weight of this llama config"),
])
def test_a_wrong_checkpoint_is_one_located_line(broken, edit, needle):
    d, f = broken(edit)
    rc, lines = _run(d, "--requests", "1")
    assert rc == 1 and len(lines) == 1, lines
    where = d if "no tensor" in needle else f
    assert lines[0].startswith(f"{where}: error: ") and needle in lines[0], lines[0]


def _raw_tensors(f: Path) -> dict[str, tuple[dict, bytes]]:
    """A safetensors file as {name: (header entry, bytes)} (F8 and BF16, which NumPy lacks)."""
    data = f.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v, data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def _write_raw(f: Path, tensors: dict[str, tuple[dict, bytes]]) -> None:
    header, blobs, offset = {}, [], 0
    for name, (info, b) in sorted(tensors.items()):
        header[name] = {**info, "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    head = json.dumps(header).encode()
    f.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


Q = "model.layers.0.self_attn.q_proj"
GU = "model.layers.1.mlp.experts.gate_up_proj"


def _f32(shape) -> tuple[dict, bytes]:
    return {"dtype": "F32", "shape": list(shape)}, np.ones(shape, "<f4").tobytes()


@pytest.mark.parametrize("name, edit, needle", [
    ("qwen3_fp8", lambda t: t.pop(f"{Q}.weight_scale_inv"),
     f"checkpoint has no tensor '{Q}.weight_scale_inv'"),
    ("qwen3_fp8", lambda t: t[f"{Q}.weight"][0].update(dtype="U8"),
     f"tensor '{Q}.weight' is U8; fp8 codes are F8_E4M3"),
    ("qwen3_fp8", lambda t: t.update({f"{Q}.weight_scale_inv": _f32((3, 2))}),
     f"tensor '{Q}.weight_scale_inv': a 3 x 2 scale grid does not divide the 64 x 64 weight"),
    ("qwen3_fp8", lambda t: t.update({f"{Q}.weight": ({"dtype": "F8_E4M3", "shape": [64, 64]},
                                                       b"\0" * 100)}),
     f"tensor '{Q}.weight' holds 100 bytes, not the (64, 64) its header gives"),
    ("gpt_oss_mxfp4", lambda t: t.update({f"{GU}_scales": ({"dtype": "U8", "shape": [4, 64, 1]},
                                                           bytes(256))}),
     f"tensors '{GU}_blocks' / '{GU}_scales' have shapes (4, 64, 2, 16) / (4, 64, 1)"),
])
def test_a_wrong_quantized_checkpoint_is_one_located_line(tmp_path, name, edit, needle):
    d = tmp_path / name
    shutil.copytree(DATA / name, d)
    f = d / "model.safetensors"
    tensors = _raw_tensors(f)
    edit(tensors)
    _write_raw(f, tensors)
    rc, lines = _run(d, "--requests", "1")
    assert rc == 1 and len(lines) == 1, lines
    where = d if "no tensor" in needle else f
    assert lines[0].startswith(f"{where}: error: ") and needle in lines[0], lines[0]


def test_a_missing_shard_and_seeded_weights_are_refused(tmp_path):
    d = tmp_path / "mixed"
    shutil.copytree(DATA / "qwen3_moe_mixed", d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    (d / index["weight_map"]["model.norm.weight"]).unlink()
    rc, lines = _run(d, "--requests", "1")
    assert rc == 1 and len(lines) == 1 and "which does not exist" in lines[0], lines
    assert lines[0].startswith(f"{d / 'model.safetensors.index.json'}: error: tensor ")
    rc, lines = _run(DATA / "llama", "--weights-seed", "3")
    assert rc == 1 and lines == [f"meshrt run: error: --weights-seed draws random weights; "
                                 f"{DATA / 'llama'} is a checkpoint with its own"]


def test_bfloat16_checkpoints_load_widened(tmp_path):
    """Hub checkpoints are bfloat16, which NumPy lacks: the loader widens the bytes."""
    d = tmp_path / "bf16"
    shutil.copytree(DATA / "llama", d)
    f = d / "model.safetensors"
    tensors = load_file(str(f))
    header = {}
    blobs = []
    offset = 0
    for name, a in sorted(tensors.items()):
        b = (a.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    head = json.dumps(header).encode()
    f.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))
    shape = ref.RefShape.of(driver.load_spec(d).shape)
    w = load_checkpoint(d, shape).named_arrays()
    full = load_checkpoint(DATA / "llama", shape).named_arrays()
    names = tensor_names("llama", shape)
    assert set(w) == set(full) == set(names)
    for k in w:  # bfloat16 keeps 8 bits of mantissa (truncated here)
        assert np.allclose(w[k], full[k], rtol=2 ** -7, atol=0)


def test_the_interpreter_ends_a_request_at_any_eos_of_a_list(tmp_path):
    """eos_token_id [3, 5, 7]: a request that emits 7 (not the first) stops there."""
    from meshrt.runtime.serving import reference_shape, serve
    from meshrt.runtime.workloads import Request

    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 128,
           "intermediate_size": 64, "max_position_embeddings": 32, "eos_token_id": [3, 5, 7],
           "torch_dtype": "float32"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    program = driver.segment_program(p, "test32")
    weights = ref.Weights.random(reference_shape(program), 0)
    want = ref.ReferenceModel(reference_shape(program), weights).generate([34, 105, 32, 52], 12)
    assert want == [63, 76, 7]  # seeded weights: ends early, at the list's last token
    res = serve(program, driver.load_target("test32"), [Request(0, 0.0, [34, 105, 32, 52], 4, 12, 12)],
                weights=weights)
    assert res.outputs_match_reference and [r.tokens for r in res.records] == [want]


@pytest.mark.parametrize("reset", [True, False])
def test_a_reused_slot_starts_deltanet_from_zero_state(reset, monkeypatch):
    """Eight short requests through qwen3_5's four slots: every freed slot is admitted a
    new request, whose DeltaNet state must not carry the previous one's (without the
    reset the interpreter's tokens leave the reference's)."""
    from meshrt.kernels.deltanet.numerics import DeltaNet
    from meshrt.runtime.serving import reference_shape, serve
    from meshrt.runtime.workloads import Request

    if not reset:
        monkeypatch.setattr(DeltaNet, "admit", lambda self, cd, kv: None)
    d = DATA / "qwen3_5"
    program = driver.segment_program(d, "test32")
    assert HParams.of(program).int("kv_slots") == 4  # eight requests: each slot serves two
    weights = load_checkpoint(d, reference_shape(program))
    rng = np.random.default_rng(1)
    reqs = [Request(i, 0.0, rng.integers(0, 128, 3 + i % 3).tolist(), 3 + i % 3, 3, 3)
            for i in range(8)]
    res = serve(program, driver.load_target("test32"), reqs, seed=0, weights=weights)
    assert len(res.records) == 8
    assert res.outputs_match_reference is reset


def _two_value_heads(tmp_path) -> tuple[Path, Path]:
    """The qwen3_5 fixture with one key and two value heads, and test32 with two more user
    colours (8): a DeltaNet narrower than its layer, or token groups whose outputs the
    whole layer gathers, reach the out projection through a relay (`_relayed` in
    synthesize_schedules: the output row's end core gathers it, then multicasts it
    alone), one colour more than test32's six hold beside the layer's other flows."""
    cfg = json.loads((DATA / "qwen3_5" / "config.json").read_text())
    cfg.update(linear_num_key_heads=1, linear_num_value_heads=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    toml = (REPO / "meshrt" / "targets" / "test32.toml").read_text()
    for a, b in (('name = "test32"', 'name = "test32c10"'), ("colors = 8", "colors = 10"),
                 ("reserved_colors = [6, 7]", "reserved_colors = [8, 9]"),
                 ("reserved_task_ids = [6, 7, 15]", "reserved_task_ids = [8, 9, 15]")):
        assert a in toml
        toml = toml.replace(a, b)
    (tmp_path / "test32c10.toml").write_text(toml)
    return tmp_path / "config.json", tmp_path / "test32c10.toml"


def test_a_deltanet_narrower_than_its_layer_computes(tmp_path):
    """Two value heads on a layer four columns wide: the DeltaNet takes two columns of the
    attention rows, the out projection (transposed) reads its heads from there through
    the relay (on test32 itself the mapper gives the layer the DeltaNet's width)."""
    config, target = _two_value_heads(tmp_path)
    program = driver.segment_program(config, target)
    regions = {k.kernel_name: k.region.rects.data[0].tuple[2] for k in program.kernels()}
    assert regions["l0_delta"] == 2 and regions["l0_o"] == 4
    relay = {f.flow_name: f for f in program.flows()}["l0_o.in0.relay"]
    assert relay.src.count == 1 and relay.dst.count == 1
    for seed in ("0", "1"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["run", str(config), "--target", str(target), "--requests", "3",
                       "--seed", seed, "--json"])
        assert rc == 0 and json.loads(out.getvalue())["outputs_match_reference"]


@pytest.mark.parametrize("micro_batch", [2, 4])
def test_deltanet_token_groups_compute(tmp_path, micro_batch):
    """Two value heads on a layer wider than them at micro-batch 2 and 4 (four columns at
    2; eight at 4, where attention's working arrays for four slots widen the layer): the
    DeltaNet takes all its columns as token groups of two columns side by side, each
    running its share of the micro-batch's tokens over its own slots' state. Eight
    requests through the slots (each slot reused), three asynchrony seeds: the
    reference's tokens."""
    from meshrt.runtime.serving import serve
    from meshrt.runtime.workloads import Request

    config, target = _two_value_heads(tmp_path)
    program = driver.segment_program(config, target, micro_batch=micro_batch)
    (delta,) = [k for k in program.kernels() if k.kernel_name == "l0_delta"]
    width = delta.region.rects.data[0].tuple[2]
    assert (width, delta.param("groups")) == ((4, 2) if micro_batch == 2 else (8, 4))
    rng = np.random.default_rng(2)
    reqs = [Request(i, 0.0, rng.integers(0, 128, 2 + i % 3).tolist(), 2 + i % 3, 3, 3)
            for i in range(8)]
    for seed in range(3):
        res = serve(program, driver.load_target(target), reqs, seed=seed)
        assert len(res.records) == 8 and not res.sim.reports
        assert res.outputs_match_reference, seed


@pytest.mark.parametrize("spoil, where, needle", [
    (lambda d: (d / "model.safetensors").write_bytes(b"garbage"), "model.safetensors",
     "not a safetensors file (bad header)"),
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:50_000]),
     "model.safetensors", "cannot read tensor"),
    (lambda d: (d / "model.safetensors").unlink(), "", "no *.safetensors file"),
    (lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": 3}'),
     "model.safetensors.index.json", "must be a JSON object with a 'weight_map' object"),
    (lambda d: (d / "config.json").unlink(), "", "a model directory needs a config.json"),
])
def test_a_broken_checkpoint_file_is_one_located_line(tmp_path, spoil, where, needle):
    d = tmp_path / "ckpt"
    shutil.copytree(DATA / "llama", d)
    spoil(d)
    rc, lines = _run(d, "--requests", "1")
    assert rc == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"{d / where if where else d}: error: ") and needle in lines[0], lines
