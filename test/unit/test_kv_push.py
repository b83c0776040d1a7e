"""Requests that arrive with their prompt's KV cache (prefill done elsewhere): the host
writes it into the slot's tiles, the mesh decodes from there, and the tokens are NumPy's
for that cache (`meshrt.runtime.kv_cache`)."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt import driver
from meshrt.runtime import kv_cache, reference as ref
from meshrt.runtime.serving import reference_shape, serve
from meshrt.runtime.workloads import Request, WorkloadError, load_jsonl, write_jsonl
from meshrt.targets import load_target
from meshrt.tools.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "test" / "data" / "hf"

# Asynchrony seeds: the first two in the suite, all twenty by hand (`-m slow`).
SEEDS = [pytest.param(s, marks=() if s < 2 else pytest.mark.slow) for s in range(20)]
# (prompt_len, output_len, arrival µs): staggered, so pushed requests take freed slots
SPEC = [(3, 4, 0.0), (1, 5, 0.0), (6, 2, 20.0), (4, 3, 40.0), (5, 4, 60.0)]


@cache
def program(model: str, static: bool = False):
    return driver.segment_program(f"examples/{model}.mrt", "test32", dynamism=() if static else None)


def requests(vocab: int = 256, seed: int = 7) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(i, a * 1e-6, rng.integers(2, vocab, p).tolist(), p, o, o)
            for i, (p, o, a) in enumerate(SPEC)]


def random_cache(shape: ref.RefShape, n: int, seed: int) -> ref.KVState:
    """A cache of n positions that no prefill computed: random keys, values and states."""
    rng = np.random.default_rng(seed)
    c = ref.KVState(shape, capacity=n)
    for i in range(shape.layers):
        if shape.is_linear_layer(i):
            c.conv[i] = rng.standard_normal(c.conv[i].shape).astype(np.float32)
            c.rec[i] = (0.3 * rng.standard_normal(c.rec[i].shape)).astype(np.float32)
        else:
            dims = (n, shape.kv_heads, shape.head_dim)
            c._write(i, 0, (2 * rng.standard_normal(dims)).astype(np.float32),
                     rng.standard_normal(dims).astype(np.float32))
    c.length = n
    return c


def _served(prog, reqs, seed=0, weights=None):
    res = serve(prog, load_target("test32"), reqs, seed=seed, weights=weights)
    s = res.summary()
    assert s["reports"] == [] and s["requests_completed"] == len(reqs), s["reports"]
    return res


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_prefilled_elsewhere_requests_decode_numpys_tokens(model, seed):
    """Every request with a prompt of two or more tokens arrives with the cache of all but its
    last token: the tokens are NumPy's (and those of the same requests prefilled on chip)."""
    prog = program(model)
    shape = reference_shape(prog)
    weights = ref.Weights.random(shape, 0)
    reqs = requests()
    kv_cache.prefilled_elsewhere(reqs, ref.ReferenceModel(shape, weights))
    assert [r.kv_len for r in reqs] == [p - 1 for p, _, _ in SPEC]
    res = _served(prog, reqs, seed, weights)
    assert res.outputs_match_reference and res.mismatches == []
    assert res.summary()["requests_pushed_kv"] == 4


def test_a_pushed_cache_is_what_the_mesh_attends_and_it_saves_the_prefill():
    """Caches no prefill computed (random keys and values): the interpreter's tokens are
    NumPy's decoding from those caches, not from the prompt (so the mesh read them); and
    pushed caches of the real prefill reach the first token sooner than prefilling on chip."""
    prog = program("tiny_dense")
    shape = reference_shape(prog)
    weights = ref.Weights.random(shape, 0)
    model = ref.ReferenceModel(shape, weights)
    reqs = requests()
    for r in reqs[2:]:
        r.kv = random_cache(shape, r.prompt_len - 1, r.id)
    res = _served(prog, reqs, 1, weights)
    assert res.outputs_match_reference
    got = {r.id: r.tokens for r in res.records}
    assert any(got[r.id] != model.generate(r.prompt, r.output_len) for r in reqs[2:])

    plain = _served(prog, requests(), 1, weights)
    pushed = requests()
    kv_cache.prefilled_elsewhere(pushed, model)
    fast = _served(prog, pushed, 1, weights)
    assert {r.id: r.tokens for r in fast.records} == {r.id: r.tokens for r in plain.records}
    ttft = {r.id: r.ttft for r in plain.records}
    for r in fast.records:  # the long prompts: writing the cache beats len - 1 decode steps
        if len(r.prompt) >= 5:
            assert r.ttft < ttft[r.id], r.id


def test_a_static_batch_with_pushed_caches_decodes_numpys_tokens():
    """The static baseline, whose host writes a batch's caches while refilling it."""
    prog = program("tiny_moe", static=True)
    shape = reference_shape(prog)
    weights = ref.Weights.random(shape, 0)
    reqs = requests()
    kv_cache.prefilled_elsewhere(reqs, ref.ReferenceModel(shape, weights))
    res = _served(prog, reqs, 0, weights)
    assert res.outputs_match_reference and res.static


def test_deltanet_state_and_gated_attention_caches_are_pushed():
    """The qwen3_5 fixture (DeltaNet layers beside a gated full-attention layer): random
    conv and recurrent states and KV, then NumPy's tokens from them; a request of the same
    slot after it starts from zero state again."""
    from meshrt.runtime.checkpoint import load_checkpoint

    d = DATA / "qwen3_5"
    prog = driver.segment_program(d, "test32")
    shape = reference_shape(prog)
    assert shape.linear_layers
    weights = load_checkpoint(d, shape)
    rng = np.random.default_rng(2)
    reqs = [Request(i, 0.0, rng.integers(0, 128, 3 + i % 3).tolist(), 3 + i % 3, 3, 3)
            for i in range(8)]
    for r in reqs[::2]:
        r.kv = random_cache(shape, r.prompt_len - 1, 10 + r.id)
    res = _served(prog, reqs, 0, weights)
    assert res.outputs_match_reference


def test_a_head_split_attention_takes_a_pushed_cache(tmp_path):
    """Two KV heads on five columns (head_dim split, `attention/layout.py`), q/k norm,
    partial rotary, sinks, a sliding window: each column keeps its features of the cache."""
    import importlib.util

    spec_ = importlib.util.spec_from_file_location("split", Path(__file__).parent / "test_attention_split.py")
    split = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(split)
    (tmp_path / "m.mrt").write_text((REPO / "examples" / "tiny_dense.mrt").read_text()
                                    .replace("kv_heads    = 4", "kv_heads    = 2"))
    spec = driver.load_spec(tmp_path / "m.mrt")
    shape = dataclasses.replace(spec.shape, attn_sinks=True, sliding_window=5, window_layers=(1,),
                                qk_norm=True, rope_partial=0.5)
    prog = split._split_program(dataclasses.replace(spec, shape=shape), 5, "test32")
    rshape = reference_shape(prog)
    reqs = requests()
    for r in reqs[2:]:
        r.kv = random_cache(rshape, r.prompt_len - 1, r.id)
    res = _served(prog, reqs, 0)
    assert res.outputs_match_reference


def test_a_bf16_model_caches_are_pushed(tmp_path):
    """A bf16 model: its attention computes as the kind's numerics (not PE bodies)."""
    (tmp_path / "m.mrt").write_text((REPO / "examples" / "tiny_dense.mrt").read_text()
                                    .replace("dtype_bytes = 4", "dtype_bytes = 2"))
    prog = driver.segment_program(tmp_path / "m.mrt", "test32")
    shape = reference_shape(prog)
    assert shape.act_format == "bf16"
    reqs = requests()
    for r in reqs[2:]:
        r.kv = random_cache(shape, r.prompt_len - 1, r.id)
    assert _served(prog, reqs, 0).outputs_match_reference


# -- the file format ----------------------------------------------------------------


def _shape(**kw) -> ref.RefShape:
    base = dict(layers=3, hidden=16, heads=4, kv_heads=2, head_dim=4, vocab=32, ffn=24)
    return ref.RefShape(**(base | kw))


DELTA = dict(linear_layers=(0, 2), linear_k_heads=1, linear_v_heads=2, linear_k_dim=4,
             linear_v_dim=4, linear_conv=4)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), delta=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_a_saved_cache_loads_back_exactly(n, delta, seed, tmp_path_factory):
    shape = _shape(**(DELTA if delta else {}))
    c = random_cache(shape, n, seed)
    path = tmp_path_factory.mktemp("kv") / "c.npz"
    kv_cache.save_kv(path, c)
    got = kv_cache.load_kv(path, shape)
    assert got.length == n
    for i in range(shape.layers):
        if shape.is_linear_layer(i):
            assert np.array_equal(got.conv[i], c.conv[i]) and np.array_equal(got.rec[i], c.rec[i])
        else:
            assert np.array_equal(got.keys(i), c.keys(i)) and np.array_equal(got.values(i), c.values(i))


def test_transformers_layouts_load(tmp_path):
    """A leading batch of one, and a conv state of linear_conv columns (the oldest unused)."""
    shape = _shape(**DELTA)
    c = random_cache(shape, 3, 0)
    arrays = {"length": np.asarray(3)}
    for i in range(3):
        if shape.is_linear_layer(i):
            arrays[f"conv.{i}"] = np.concatenate([np.full((c.conv[i].shape[0], 1), 9.0), c.conv[i]], 1)[None]
            arrays[f"rec.{i}"] = c.rec[i][None].astype(np.float16).astype(np.float64)
        else:
            arrays[f"k.{i}"] = c.keys(i).transpose(1, 0, 2)[None]
            arrays[f"v.{i}"] = c.values(i).transpose(1, 0, 2)[None]
    np.savez(tmp_path / "hf.npz", **arrays)
    got = kv_cache.load_kv(tmp_path / "hf.npz", shape)
    assert np.array_equal(got.conv[0], c.conv[0]) and np.array_equal(got.keys(1), c.keys(1))
    assert np.allclose(got.rec[2], c.rec[2], rtol=1e-3)


def _arrays(shape, n=2):
    c = random_cache(shape, n, 0)
    return {"length": np.asarray(n), **{f"{kv}.{i}": (c.keys(i) if kv == "k" else c.values(i)).transpose(1, 0, 2)
                                        for i in range(shape.layers) for kv in "kv"}}


@pytest.mark.parametrize("edit, needle", [
    (lambda a: a.pop("length"), "no 'length' array"),
    (lambda a: a.update(length=np.asarray([2])), "'length' must be a 0-d integer"),
    (lambda a: a.update(length=np.asarray(2.0)), "'length' must be a 0-d integer"),
    (lambda a: a.update(length=np.asarray(0)), "length 0 outside"),
    (lambda a: a.pop("v.1"), "missing array 'v.1'"),
    (lambda a: a.update({"q.0": a["k.0"]}), "unknown array 'q.0'"),
    (lambda a: a.update({"k.2": a["k.2"][:, :1]}), "array 'k.2' has shape (2, 1, 4), this model needs (2, 2, 4)"),
    (lambda a: a.update({"k.0": a["k.0"].astype(np.int32)}), "array 'k.0' must hold floats"),
    (lambda a: a["v.0"].__setitem__((0, 0, 0), np.nan), "array 'v.0' holds a value that is not finite"),
    (lambda a: a.update({"k.1": np.zeros((2, 2000, 4))}),
     "array 'k.1' has shape (2, 2000, 4), this model needs (2, 2, 4)"),
    (lambda a: a.update({"k.1": np.asarray([object()] * 16).reshape(2, 2, 4)}),
     "array 'k.1' holds Python objects"),
])
def test_a_bad_cache_file_is_one_line_naming_it(edit, needle, tmp_path):
    shape = _shape()
    a = _arrays(shape)
    edit(a)
    path = tmp_path / "bad.npz"
    np.savez(path, **a)
    with pytest.raises(WorkloadError) as e:
        kv_cache.load_kv(path, shape)
    msg = str(e.value)
    assert msg.startswith(f"{path}: error: ") and needle in msg and "\n" not in msg


@pytest.mark.parametrize("content", [b"", b"not a zip", b"PK\x03\x04" + b"\0" * 40])
def test_a_file_that_is_no_archive_is_one_line(content, tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(content)
    with pytest.raises(WorkloadError, match=r"x\.npz: error: not a \.npz KV cache"):
        kv_cache.load_kv(path, _shape())


def test_an_array_declaring_a_huge_shape_is_refused_before_anything_is_allocated(tmp_path):
    """A .npy header may declare any shape; numpy would allocate it before reading the data."""
    import io

    shape = _shape()
    a = _arrays(shape)
    a.pop("k.1")
    path = tmp_path / "bomb.npz"
    np.savez(path, **a)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False,
                                                "shape": (2, 10**12, 4)})
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("k.1.npy", head.getvalue() + b"\0" * 64)
    with pytest.raises(WorkloadError, match=r"array 'k.1' has shape \(2, 1000000000000, 4\)"):
        kv_cache.load_kv(path, shape)


@pytest.mark.parametrize("spoil, needle", [
    (lambda z: z.writestr("notes.txt", "hello"), "member 'notes.txt' is not a .npy array"),
    (lambda z: z.writestr("v.7.npy", b"\x93NUMPY"), "array 'v.7' cannot be read"),
])
def test_an_archive_member_that_is_no_array_is_one_line(spoil, needle, tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, **_arrays(_shape()))
    with zipfile.ZipFile(path, "a") as z:
        spoil(z)
    with pytest.raises(WorkloadError) as e:
        kv_cache.load_kv(path, _shape())
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_an_archive_behind_other_bytes_is_one_line(tmp_path):
    """zipfile finds an archive behind leading junk; numpy does not, and must not unpickle."""
    path = tmp_path / "x.npz"
    np.savez(path, **_arrays(_shape()))
    path.write_bytes(b"junk" + path.read_bytes())
    with pytest.raises(WorkloadError, match=r"x\.npz: error: not a \.npz KV cache"):
        kv_cache.load_kv(path, _shape())


def test_workload_files_name_their_caches_relative_to_themselves(tmp_path):
    shape = _shape()
    (tmp_path / "kv").mkdir()
    kv_cache.save_kv(tmp_path / "kv" / "r0.npz", random_cache(shape, 2, 0))
    lines = [{"id": "a", "arrival": 0, "prompt": [1, 2, 3], "max_new_tokens": 2, "kv": "kv/r0.npz"},
             {"id": "b", "arrival": 0, "prompt": [4, 5], "max_new_tokens": 2}]
    (tmp_path / "w.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    reqs = load_jsonl(tmp_path / "w.jsonl", 32)
    kv_cache.attach(reqs, shape)
    assert [r.kv_len for r in reqs] == [2, 0]
    out = tmp_path / "again" / "w2.jsonl"
    out.parent.mkdir()
    write_jsonl(out, reqs)
    assert json.loads(out.read_text().splitlines()[0])["kv"] == "../kv/r0.npz"
    assert [r.kv_file for r in load_jsonl(out, 32)][0] == str(out.parent / "../kv/r0.npz")


@pytest.mark.parametrize("kv, needle", [
    ("nowhere.npz", "w.jsonl:1: error: kv: no such file"),
    (7, "w.jsonl:1: error: kv must be the path of a .npz KV cache, got 7"),
    ("", 'w.jsonl:1: error: kv must be the path of a .npz KV cache, got ""'),
])
def test_a_bad_kv_field_is_located_at_its_line(kv, needle, tmp_path):
    (tmp_path / "w.jsonl").write_text(json.dumps({"arrival": 0, "prompt": [1, 2], "max_new_tokens": 2,
                                                  "kv": kv}) + "\n")
    with pytest.raises(WorkloadError) as e:
        load_jsonl(tmp_path / "w.jsonl", 32)
    assert needle in str(e.value)


def test_a_cache_as_long_as_its_prompt_is_refused_before_it_is_read(tmp_path):
    shape = _shape()
    kv_cache.save_kv(tmp_path / "c.npz", random_cache(shape, 3, 0))
    r = Request(0, 0.0, [1, 2, 3], 3, 2, 2, str(tmp_path / "c.npz"))
    with pytest.raises(WorkloadError, match="a KV cache of 3 positions for a 3-token prompt"):
        kv_cache.attach([r], shape)
    r = Request(1, 0.0, [1, 2, 3], 3, 2, 2, kv=random_cache(shape, 3, 0))
    with pytest.raises(WorkloadError, match="request 1: a KV cache of 3 positions"):
        kv_cache.attach([r], shape)


def test_the_write_costs_a_round_trip_and_the_bytes_over_the_system_io():
    t = load_target("wse3")
    s = driver.load_spec(REPO / "examples" / "configs" / "qwen3-8b.json").shape
    one = 2 * s.kv_heads * s.head_dim * s.kv_bytes * s.layers  # bytes of one position, every layer
    assert s.request_state_bytes(4096) == 4096 * one
    assert kv_cache.push_cycles(s, 4096, t) == 7000 + int(np.ceil(4096 * one / 136))


def test_cli_run_with_a_workload_of_pushed_caches(tmp_path, capsys):
    prog = program("tiny_dense")
    shape = reference_shape(prog)
    model = ref.ReferenceModel(shape, ref.Weights.random(shape, 0))
    lines = []
    for r in requests()[:3]:
        line = {"id": r.id, "arrival": r.arrival, "prompt": r.prompt, "max_new_tokens": r.output_len}
        if r.prompt_len > 1:
            c = model.new_state()
            model.forward([(c, r.prompt[:-1])])
            kv_cache.save_kv(tmp_path / f"{r.id}.npz", c)
            line["kv"] = f"{r.id}.npz"
        lines.append(json.dumps(line))
    (tmp_path / "w.jsonl").write_text("\n".join(lines) + "\n")
    assert cli_main(["run", "examples/tiny_dense.mrt", "--workload", str(tmp_path / "w.jsonl"),
                     "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["outputs_match_reference"] and s["requests_pushed_kv"] == 2
    (tmp_path / "0.npz").write_bytes(b"junk")
    assert cli_main(["run", "examples/tiny_dense.mrt", "--workload", str(tmp_path / "w.jsonl")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"{tmp_path / '0.npz'}: error: not a .npz KV cache: File is not a zip file"
    assert cli_main(["run", "examples/tiny_dense.mrt", "--workload", str(tmp_path / "w.jsonl"),
                     "--pushed-kv"]) == 1
    assert "--pushed-kv prefills a synthetic workload" in capsys.readouterr().err


def test_a_sliding_window_layer_keeps_a_ring_of_its_window(tmp_path):
    """tiny_dense with a window of 3 on layer 1: that layer's cache holds 3 entries a slot
    (a ring), the other layer max_seq; prompts and outputs run past the window, some
    requests arrive with caches longer than it: NumPy's tokens."""
    from meshrt.frontend.mapper import map_model

    spec = driver.load_spec(REPO / "examples" / "tiny_dense.mrt")
    spec = dataclasses.replace(spec, shape=dataclasses.replace(spec.shape, sliding_window=3,
                                                               window_layers=(1,)))
    t = load_target("test32")
    prog = driver.segment_program(map_model(spec, t, None, None, None), t)
    caps = {k.kernel_name: k.param("max_seq") for k in prog.kernels() if k.kind.data == "attention"}
    assert caps == {"l0_attn": 12, "l1_attn": 3}
    shape = reference_shape(prog)
    weights = ref.Weights.random(shape, 0)
    rng = np.random.default_rng(5)
    reqs = [Request(i, 0.0, rng.integers(2, 256, p).tolist(), p, o, o)
            for i, (p, o) in enumerate([(6, 5), (2, 7), (5, 4), (7, 3)])]
    model = ref.ReferenceModel(shape, weights)
    for r in reqs[2:]:
        r.kv = model.new_state()
        model.forward([(r.kv, r.prompt[:-1])])
    res = _served(prog, reqs, 0, weights)
    assert res.outputs_match_reference


def test_a_workload_with_a_cache_made_in_memory_is_not_written_without_it(tmp_path):
    r = Request(0, 0.0, [1, 2, 3], 3, 2, 2, kv=random_cache(_shape(), 2, 0))
    with pytest.raises(ValueError, match="request 0 holds a KV cache made in memory"):
        write_jsonl(tmp_path / "w.jsonl", [r])
    assert not (tmp_path / "w.jsonl").exists()
