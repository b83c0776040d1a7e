"""`--context N|auto`: the KV positions a request slot holds follow the mapping and the
SRAM (`mapper.with_context`), not a cap."""

from __future__ import annotations

import dataclasses

import pytest

from meshrt import driver
from meshrt.frontend.errors import FrontendError
from meshrt.frontend.mapper import map_model, with_context


@pytest.mark.parametrize("model,target,micro_batch", [("tiny_dense", "test32", 2), ("tiny_moe", "test32", 1),
                                                      ("tiny_dense", "test16", 1)])
def test_auto_context_is_the_most_positions_the_wafers_hold(model, target, micro_batch):
    """The model maps at the chosen context on the wafers it needed at its own, and one
    position more does not fit them."""
    spec, tgt = driver.load_spec(f"examples/{model}.mrt"), driver.load_target(target)
    base = map_model(spec, tgt, micro_batch).ops.first.num_wafers
    fitted, budget = with_context(spec, tgt, micro_batch, None, "auto")
    n = fitted.shape.max_seq
    assert budget == base and n > spec.shape.max_seq
    prog = map_model(fitted, tgt, micro_batch, budget).ops.first
    assert prog.num_wafers == base and prog.hparam("max_seq") == n
    more = dataclasses.replace(fitted, shape=dataclasses.replace(fitted.shape, max_seq=n + 1))
    with pytest.raises(FrontendError):
        map_model(more, tgt, micro_batch, budget)


def test_a_context_past_the_trained_positions_is_refused():
    spec, tgt = driver.load_spec("examples/configs/qwen3-8b.json"), driver.load_target("wse3")
    assert spec.max_positions == 40960
    with pytest.raises(FrontendError, match="exceeds the model's max_position_embeddings"):
        with_context(spec, tgt, 1, None, 40961)
    fitted, budget = with_context(spec, tgt, 1, None, 40960)
    assert fitted.shape.max_seq == 40960 and budget is None
