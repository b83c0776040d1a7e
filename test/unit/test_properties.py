"""Property: a random valid small model compiles through every level and its
tokens on the simulated mesh are NumPy's, or it is refused with one located line.

Models are drawn within test32's limits (layers, hidden, heads, KV heads,
head_dim, experts, top-k, micro-batch, FFN widths, vocabulary, dynamism),
written as `.mrt` specs and driven through the `meshrt` command in-process:
`compile --emit csl` (graph, kernels, events, segments, CSL), then `run`
(the serving loop on the asynchronous mesh, checked against the NumPy
reference). A model the mapper or a pass cannot fit, or whose layout the
interpreter has no numerics for, must say so on one line and exit 1.

    python -m pytest test/unit/test_properties.py                                 # few, fixed
    python -m pytest test/unit/test_properties.py --hypothesis-profile=thorough   # many
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass

from hypothesis import event, example, given, strategies as st

from meshrt.tools.cli import main as cli_main

LOCATED = re.compile(r"^\S+?(:\d+:\d+)?: error: \S")
# What the interpreter may refuse to run (a layout it has no numerics for), after compiling.
INTERPRETER_GAP = "has no numerics in the interpreter"


@dataclass(frozen=True)
class Model:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    max_seq: int
    eos_token: int
    ffn: int = 0
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    dynamism: tuple[str, ...] = ("continuous_batching",)
    micro_batch: int = 1
    experts_per_region: int = 0  # pinned (a divisor of experts); 0: the mapper's choice
    shared_experts: int = 0  # always-on experts, in regions of their own shape

    def spec(self) -> str:
        fields = ["layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "max_seq", "eos_token"]
        fields += ["experts", "top_k", "expert_ffn", "shared_experts"] if self.experts else ["ffn"]
        body = "".join(f"  {k} = {getattr(self, k)}\n" for k in fields)
        return (f"model prop {{\n{body}  dtype_bytes = 4\n}}\n"
                f"runtime {{\n  dynamism = [{', '.join(self.dynamism)}]\n"
                f"  micro_batch = {self.micro_batch}\n}}\n"
                + (f"mapping {{ experts_per_region = {self.experts_per_region} }}\n"
                   if self.experts_per_region else ""))


@st.composite
def models(draw) -> Model:
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([2, 4, 8, 16]))
    # hidden is a multiple of heads; the attention width heads x head_dim may differ
    hidden = heads * draw(st.sampled_from([head_dim, 2, 4, 8, 16]))
    vocab = draw(st.integers(8, 256))
    moe = draw(st.booleans())
    dyn = ["continuous_batching"]
    kw = {}
    if moe:
        experts = draw(st.integers(2, 8))
        kw = dict(experts=experts, top_k=draw(st.integers(1, min(experts, 3))),
                  expert_ffn=draw(st.integers(1, 128)),
                  # several experts a region run their pairs in passes (expert_passes)
                  experts_per_region=draw(st.sampled_from(
                      [0] + [g for g in range(1, experts + 1) if experts % g == 0])),
                  shared_experts=draw(st.integers(0, 1)))
        if draw(st.booleans()):
            dyn.append("moe_routing")
    else:
        kw = dict(ffn=draw(st.integers(1, 160)))
    if draw(st.booleans()):
        dyn.append("micro_batch_pipeline")
    return Model(layers=draw(st.integers(1, 3)), heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                 hidden=hidden, vocab=vocab, max_seq=draw(st.integers(8, 32)),
                 eos_token=draw(st.integers(0, vocab - 1)), dynamism=tuple(dyn),
                 micro_batch=draw(st.integers(1, 3)), **kw)


def _cli(argv: list[str]) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(argv)
    return rc, out.getvalue(), err.getvalue().splitlines()


def _refused(rc: int, out: str, err: list[str]) -> bool:
    """Exit 1 with exactly one located line, nothing on stdout; else fails the property."""
    assert rc == 1 and out == "" and len(err) == 1, (rc, out[:300], err[:5])
    assert LOCATED.match(err[0]) and "Traceback" not in err[0] and "internal error" not in err[0], err
    return True


# Regressions the property found (each failed before its fix):
TINY_DENSE = Model(2, 4, 4, 16, 64, 256, 12, 1, ffn=128,
                   dynamism=("continuous_batching", "micro_batch_pipeline"), micro_batch=2)
# o_proj on one core beside its residual add: the one-row allreduce had no value there
ONE_ROW_ALLREDUCE = Model(2, 2, 2, 16, 32, 256, 8, 1, ffn=128,
                          dynamism=("continuous_batching", "micro_batch_pipeline"), micro_batch=2)
# a one-core combine corridor only routed: the residual add found no expert sum
ONE_CORE_COMBINE = Model(3, 2, 1, 16, 32, 256, 8, 1, experts=8, top_k=2, expert_ffn=32, micro_batch=2)
# FFN 64 over 3 columns: the up gemv split 128 columns evenly, silu_mul read gate/up pairs
UNEVEN_UP_COLUMNS = Model(1, 8, 4, 4, 32, 128, 16, 1, ffn=64, micro_batch=2)
# pipelined 3-layer MoE, one request per micro-batch, on 4 stages of one-core classes: deadlocked
# while a marker sync waited for messages of flows its boundary does not rebind
PIPELINED_MOE_DEADLOCK = Model(3, 2, 2, 8, 16, 64, 16, 1, experts=4, top_k=1, expert_ffn=32,
                               dynamism=("continuous_batching", "moe_routing",
                                         "micro_batch_pipeline"), micro_batch=1)
# hidden 32 over a 10-row corridor (ceil split: rows 8 and 9 hold no values): combine
# demanded every routed expert's output on those rows too
EMPTY_CORRIDOR_ROWS = Model(3, 4, 1, 8, 32, 69, 28, 50, experts=8, top_k=1, expert_ffn=83,
                            dynamism=("continuous_batching", "micro_batch_pipeline"),
                            micro_batch=1)

# four experts a region, top-2, micro-batch 2: the regions run their pairs in two passes
MERGED_REGIONS_IN_PASSES = Model(2, 4, 2, 16, 64, 256, 16, 1, experts=8, top_k=2, expert_ffn=64,
                                 dynamism=("continuous_batching", "moe_routing"), micro_batch=2,
                                 experts_per_region=4)

# and a shared expert beside them, in a region of its own (narrower) shape: one pass
SHARED_REGION_OF_ITS_OWN = Model(2, 4, 2, 16, 64, 256, 16, 1, experts=8, top_k=2,
                                 expert_ffn=64, dynamism=("continuous_batching", "moe_routing"),
                                 micro_batch=2, experts_per_region=4, shared_experts=1)


@given(model=models(), seed=st.integers(0, 2**16))
@example(model=SHARED_REGION_OF_ITS_OWN, seed=5)
@example(model=MERGED_REGIONS_IN_PASSES, seed=3)
@example(model=EMPTY_CORRIDOR_ROWS, seed=6747)
@example(model=TINY_DENSE, seed=0)
@example(model=ONE_ROW_ALLREDUCE, seed=0)
@example(model=ONE_CORE_COMBINE, seed=1)
@example(model=UNEVEN_UP_COLUMNS, seed=2)
@example(model=PIPELINED_MOE_DEADLOCK, seed=0)
def test_valid_model_compiles_and_matches_numpy_or_is_refused(model, seed, tmp_path_factory):
    d = tmp_path_factory.mktemp("prop")
    spec = d / "m.mrt"
    spec.write_text(model.spec())
    rc, out, err = _cli(["compile", str(spec), "--target", "test32", "--emit", "csl",
                         "-o", str(d / "csl")])
    if rc != 0 and _refused(rc, out, err):
        assert str(spec) in err[0]
        event("refused by the compiler")
        return
    assert (d / "csl").is_dir() and any((d / "csl").iterdir())
    rc, out, err = _cli(["run", str(spec), "--target", "test32", "--requests", "3", "--json",
                         "--seed", str(seed), "--workload-seed", str(seed)])
    if rc == 1 and not out:
        _refused(rc, out, err)
        assert INTERPRETER_GAP in err[0], err  # it compiled: only the interpreter may refuse
        event("refused by the interpreter")
        return
    s = json.loads(out)
    assert s["reports"] == [] and not s["deadlock"] and not s["corruption"], s["reports"][:1]
    assert s["outputs_match_reference"] and rc == 0
    assert s["requests_completed"] + s["requests_rejected"] == 3
    event("matches NumPy")
