"""The lower bound of a build's decode step (meshrt.runtime.lower_bound), pinned by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrt.driver import parse_ir, program_of, segment_program
from meshrt.runtime.cost_model import estimate
from meshrt.runtime.lower_bound import lower_bound
from meshrt.targets import load_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Layer 0: a gemv @a on 2 x 2 cores, its reduction @r down the columns (2 cores
# along it), a hand-off @h to wafer 1. Layer 1, fed by @a too: an elementwise
# @c reducing along its row of 3 cores, and an attention @att whose 2 cores
# merge (2 heads of head_dim 16 = 36 elements).
PROGRAM = """builtin.module {
  segment.program @lb target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
    event.kernel @a "gemv" on <(0, 0, 2, 2)> inputs [] params {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64}
    event.kernel @r "allreduce" on <(0, 0, 2, 2)> inputs [@a] params {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64}
    event.kernel @h "handoff" on <(2, 0, 1, 1)> inputs [@r] params {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, to_wafer = 1 : i64}
    event.kernel @c "elementwise" on <(4, 0, 3, 1)> inputs [@a] params {layer = 1 : i64, stage = 0 : i64, wafer = 0 : i64}
    event.kernel @att "attention" on <(8, 0, 1, 2)> inputs [@c] params {layer = 1 : i64, stage = 0 : i64, wafer = 0 : i64, head_dim = 16 : i64}
    event.flow @r.down kernel @r role "down" wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "shift" by 0, 1 bytes 8
    event.flow @c.down kernel @c role "down" wafer 0 from <(4, 0, 2, 1)> to <(5, 0, 2, 1)> pattern "shift" by 1, 0 bytes 8
    segment.core_class @ca wafer 0 cores <(0, 0, 2, 2)> {
      segment.segment 0 use <colors = 0> {
        event.sub @a "tile" after [] demand <colors = 0> {
          event.compute "fmac" work 400
        }
        event.sub @r "edge" after [@a] demand <colors = 0> {
          event.compute "add" work 8
        }
      }
    }
    segment.core_class @cc wafer 0 cores <(4, 0, 3, 1)> {
      segment.segment 0 use <colors = 0> {
        event.sub @c "mid" after [] demand <colors = 0> {
          event.compute "exp" work 3
        }
      }
    }
    segment.core_class @catt wafer 0 cores <(8, 0, 1, 2)> {
      segment.segment 0 use <colors = 0> {
        event.sub @att "root" after [] demand <colors = 0> {
          event.compute "softmax_merge" work 36
        }
      }
    }
  }
}
"""


def test_bound_by_hand():
    """test32: fmac = add = mul = 0.25, exp 20, argmax 1, hop 1 cycle, wafer link 1,750."""
    b = lower_bound(program_of(parse_ir(PROGRAM)), load_target("test32"))
    l0, l1 = b.layers
    # layer 0: 4 cores x (400 x 0.25 + 8 x 0.25) over its 5 cores (@a's 4 and @h's 1)
    assert (l0.layer, l0.kernels, l0.cores, l0.work_cycles) == (0, ("a", "r", "h"), 5, 408.0)
    assert l0.compute_cycles == pytest.approx(81.6)
    # layer 1: 3 cores x 3 exps x 20, plus 2 cores x one merge of 2 heads:
    # 2 x (1 + 2 x 20) + 34 x (0.25 + 0.25) = 99; over 3 + 2 cores
    assert (l1.layer, l1.cores, l1.work_cycles) == (1, 5, 180.0 + 198.0)
    assert b.compute_cycles == pytest.approx(81.6 + 75.6)
    # @r reduces along 2 cores (1 hop), @c along 3 (2 hops); @h crosses to wafer 1.
    # The chains a -> r -> h (1 hop + 1,750) and a -> c -> att (2 hops) run in
    # parallel: the bound takes the longer one, not their sum.
    assert b.collectives == {"r": 2, "c": 3}
    assert b.chain == ("r", "h")
    assert (b.hop_cycles, b.wafer_cycles) == (1.0, 1750.0)
    assert b.cycles == pytest.approx(157.2 + 1751.0)


def test_bound_follows_the_target():
    """Twice the SIMD width halves the FMAC part (the gemv's and the merge's); the hops stay."""
    p = program_of(parse_ir(PROGRAM))
    t = load_target("test32")
    wide = t.with_overrides(costs={**t.costs, "fmac": 0.125})
    assert lower_bound(p, t).compute_cycles - lower_bound(p, wide).compute_cycles == \
        pytest.approx(4 * 400 * 0.125 / 5 + 2 * 34 * 0.125 / 5)
    assert lower_bound(p, wide).hop_cycles == 1.0


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_bound_is_below_the_cost_model(model):
    p = segment_program(str(EXAMPLES / f"{model}.mrt"), "test32")
    t = load_target("test32")
    b, est = lower_bound(p, t), estimate(p, t)
    assert 0 < b.cycles < est.latency.cycles_per_step
    assert b.hop_cycles > 0 and len(b.chain) > 1
    # every kernel's region is in some layer's cores, every layer's work is counted
    assert sum(len(layer.kernels) for layer in b.layers) == len(p.kernels())
