"""Serving workloads: synthetic generators, JSONL loading, padding fraction."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt.runtime.workloads import (
    CHAT_OUTPUT,
    REASONING_OUTPUT,
    Request,
    WorkloadError,
    chat_like,
    get_workload,
    load_jsonl,
    padding_fraction,
    reasoning_like,
    write_jsonl,
)


def outs(reqs):
    return np.array([r.output_len for r in reqs])


def prompts(reqs):
    return np.array([r.prompt_len for r in reqs])


# ---- synthetic generators --------------------------------------------------


@pytest.mark.parametrize("gen", [chat_like, reasoning_like])
def test_generators_deterministic_and_consistent(gen):
    a, b, c = gen(200, seed=3, rate=2.0), gen(200, seed=3, rate=2.0), gen(200, seed=4, rate=2.0)
    assert a == b
    assert a != c
    for r in a:
        assert r.prompt_len == len(r.prompt) >= 1
        assert 1 <= r.output_len <= r.max_new_tokens
        assert all(0 <= t < 32000 for t in r.prompt)
    assert [r.id for r in a] == list(range(200))


def test_lengths_do_not_depend_on_rate_or_vocab():
    a = chat_like(300, seed=1, rate=None, vocab=50)
    b = chat_like(300, seed=1, rate=5.0, vocab=32000)
    assert (outs(a) == outs(b)).all() and (prompts(a) == prompts(b)).all()
    assert all(t < 50 for r in a for t in r.prompt)


def test_chat_statistics_in_documented_range():
    r = chat_like(4000, seed=0)
    o, p = outs(r), prompts(r)
    assert 180 <= np.median(o) <= 250  # documented median 210
    assert 280 <= o.mean() <= 370  # vLLM paper: ShareGPT output mean 338
    assert o.max() <= 2048 and np.percentile(o, 99) >= 1500  # tail to ~2k
    assert 70 <= np.median(p) <= 115 and 130 <= p.mean() <= 200  # vLLM paper: input mean 161
    assert p.max() <= 1024
    assert all(x.max_new_tokens == CHAT_OUTPUT.cap for x in r)


def test_reasoning_statistics_in_documented_range():
    r = reasoning_like(4000, seed=0)
    o = outs(r)
    assert 3500 <= np.median(o) <= 4600
    assert 4700 <= o.mean() <= 6200
    assert 16000 <= np.percentile(o, 99) <= 32768 and o.max() <= 32768
    assert np.median(o) > 10 * np.median(outs(chat_like(4000, seed=0)))
    assert all(x.max_new_tokens == REASONING_OUTPUT.cap for x in r)


def test_poisson_arrivals():
    r = chat_like(5000, seed=2, rate=4.0)
    t = np.array([x.arrival for x in r])
    assert (np.diff(t) >= 0).all() and t[0] > 0
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert abs(gaps.mean() - 0.25) < 0.02
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1  # exponential: CV 1
    assert all(x.arrival == 0.0 for x in chat_like(10, seed=2, rate=None))
    with pytest.raises(ValueError):
        chat_like(10, rate=0.0)


def test_scale_and_clamps():
    full = reasoning_like(500, seed=5)
    small = reasoning_like(500, seed=5, scale=0.01)
    assert small[0].max_new_tokens == round(32768 * 0.01)
    for f, s in zip(full, small):
        assert s.output_len == max(1, round(f.output_len * 0.01))
        assert s.prompt_len == max(1, round(f.prompt_len * 0.01))
    capped = chat_like(500, seed=5, scale=0.1, max_prompt_len=8, max_output_len=16)
    assert prompts(capped).max() <= 8 and outs(capped).max() <= 16
    assert all(r.max_new_tokens == 16 for r in capped)
    assert outs(capped).min() >= 1


# ---- padding fraction ------------------------------------------------------


@given(st.integers(1, 5000), st.integers(0, 40), st.integers(1, 16))
def test_padding_of_equal_lengths_is_zero(length, n, batch):
    assert padding_fraction([length] * n, batch) == 0.0


def test_padding_hand_computed():
    # Batches of 2 in order: [1, 3] -> slots 6, useful 4; [2, 2] -> 4, 4;
    # [5] (short last batch) -> 5, 5. Padded 2 of 15.
    assert padding_fraction([1, 3, 2, 2, 5], 2) == pytest.approx(2 / 15)
    # One batch of 4: max 10, slots 40, useful 1+2+3+10=16.
    assert padding_fraction([1, 2, 3, 10], 4) == pytest.approx(24 / 40)
    assert padding_fraction([1, 2, 3, 10], 1) == 0.0
    assert padding_fraction([], 8) == 0.0
    # Order matters: batches are formed in arrival order.
    assert padding_fraction([1, 1, 9, 9], 2) == 0.0
    assert padding_fraction([1, 9, 1, 9], 2) == pytest.approx(16 / 36)
    with pytest.raises(ValueError):
        padding_fraction([1, 2], 0)


def test_padding_accepts_requests_and_grows_with_batch():
    r = chat_like(2000, seed=0)
    fr = [padding_fraction(r, b) for b in (1, 2, 4, 8, 16)]
    assert fr[0] == 0.0
    assert all(a < b for a, b in itertools.pairwise(fr))
    assert fr[3] == padding_fraction([x.output_len for x in r], 8)
    assert 0.4 < fr[3] < 0.8


# ---- JSONL -----------------------------------------------------------------


def write_lines(tmp_path, lines, name="w.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_load_jsonl_valid_and_sorted(tmp_path):
    p = write_lines(
        tmp_path,
        [
            '{"id": "a", "arrival": 1.5, "prompt": [1, 2, 3], "max_new_tokens": 8, "output_len": 4}',
            "",
            '{"arrival": 0.25, "prompt_len": 5, "max_new_tokens": 6}',
            '{"id": 7, "arrival": 1.0, "prompt": [9], "prompt_len": 1, "max_new_tokens": 2}',
        ],
    )
    reqs = load_jsonl(p, vocab=10)
    assert [r.id for r in reqs] == [3, 7, "a"]  # default id is the line number
    assert [r.arrival for r in reqs] == [0.25, 1.0, 1.5]
    a = reqs[2]
    assert a.prompt == [1, 2, 3] and a.prompt_len == 3 and a.max_new_tokens == 8 and a.output_len == 4
    gen = reqs[0]
    assert gen.prompt_len == 5 and all(0 <= t < 10 for t in gen.prompt)
    assert gen.output_len == gen.max_new_tokens == 6
    assert load_jsonl(p, vocab=10)[0].prompt == gen.prompt  # deterministic


def test_jsonl_round_trip(tmp_path):
    reqs = sorted(chat_like(20, seed=1, rate=3.0, scale=0.05, vocab=100), key=lambda r: r.arrival)
    p = tmp_path / "rt.jsonl"
    write_jsonl(p, reqs)
    assert load_jsonl(p, vocab=100) == reqs
    assert get_workload(str(p), vocab=100, n=5) == reqs[:5]


GOOD = '{"arrival": 0, "prompt": [1], "max_new_tokens": 4}'


@pytest.mark.parametrize(
    "bad, needle",
    [
        ('{"arrival": 0, "prompt": [1], "max_new_tokens": 4', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"prompt": [1], "max_new_tokens": 4}', "missing field 'arrival'"),
        ('{"arrival": 0, "prompt": [1]}', "missing field 'max_new_tokens'"),
        ('{"arrival": 0, "max_new_tokens": 4}', "missing field 'prompt' or 'prompt_len'"),
        ('{"arrival": -1, "prompt": [1], "max_new_tokens": 4}', "arrival is negative"),
        ('{"arrival": 0, "prompt": [1], "max_new_tokens": -4}', "max_new_tokens is negative"),
        ('{"arrival": 0, "prompt_len": -2, "max_new_tokens": 4}', "prompt_len is negative"),
        ('{"arrival": 0, "prompt": [1, 99], "max_new_tokens": 4}', "prompt[1] = 99 is out of vocab"),
        ('{"arrival": 0, "prompt": [-1], "max_new_tokens": 4}', "out of vocab"),
        ('{"arrival": 0, "prompt": [1.5], "max_new_tokens": 4}', "must be an integer token id"),
        ('{"arrival": 0, "prompt": [], "max_new_tokens": 4}', "prompt is empty"),
        ('{"arrival": "soon", "prompt": [1], "max_new_tokens": 4}', "arrival must be a number"),
        ('{"arrival": NaN, "prompt": [1], "max_new_tokens": 4}', "finite"),
        ('{"arrival": 0, "prompt": [1], "max_new_tokens": 4.0}', "max_new_tokens must be an integer"),
        ('{"arrival": 0, "prompt": [1], "max_new_tokens": 4, "output_len": 5}', "exceeds max_new_tokens"),
        ('{"arrival": 0, "prompt": [1, 2], "prompt_len": 3, "max_new_tokens": 4}', "does not match"),
        ('{"arrival": 0, "prompt": [1], "max_new_tokens": 4, "max_tokens": 3}', "unknown field 'max_tokens'"),
        ('{"arrival": 0, "prompt": [1], "max_new_tokens": 4, "id": [1]}', "id must be"),
        ('{"arrival": 0, "prompt": [1], "max_new_tokens": 0}', "max_new_tokens is too small"),
        ('{"arrival": 1e300, "prompt": [1], "max_new_tokens": 4}', "arrival is too late"),
        ('{"arrival": ' + "9" * 400 + ', "prompt": [1], "max_new_tokens": 4}', "(400 digits)"),
        ('{"arrival": 0, "prompt_len": 2000000000, "max_new_tokens": 4}', "prompt_len is too large"),
        ('{"arrival": 0, "prompt": [1], "max_new_tokens": 1099511627776}', "max_new_tokens is too large"),
    ],
)
def test_jsonl_errors_are_located(tmp_path, bad, needle):
    p = write_lines(tmp_path, [GOOD, "", bad, GOOD])
    with pytest.raises(WorkloadError) as ei:
        load_jsonl(p, vocab=10)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:3: error: "), msg
    assert needle in msg
    assert "\n" not in msg
    assert ei.value.line == 3 and ei.value.path == str(p)


def test_jsonl_duplicate_id_and_file_level_errors(tmp_path):
    p = write_lines(tmp_path, ['{"id": "x", "arrival": 0, "prompt": [1], "max_new_tokens": 1}'] * 2)
    with pytest.raises(WorkloadError, match=r":2: error: duplicate id \"x\" \(first on line 1\)"):
        load_jsonl(p, vocab=10)
    empty = write_lines(tmp_path, ["", "  "], name="empty.jsonl")
    with pytest.raises(WorkloadError, match=r"empty.jsonl: error: file contains no requests"):
        load_jsonl(empty, vocab=10)
    with pytest.raises(WorkloadError, match=r"missing.jsonl: error: cannot read file"):
        load_jsonl(tmp_path / "missing.jsonl", vocab=10)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(WorkloadError, match=r"bin.jsonl:2: error: line is not valid UTF-8"):
        load_jsonl(binary, vocab=10)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_jsonl_never_raises_anything_but_workload_error(tmp_path_factory, line):
    p = tmp_path_factory.mktemp("fuzz") / "f.jsonl"
    p.write_text(GOOD + "\n" + line + "\n", encoding="utf-8")
    try:
        load_jsonl(p, vocab=10)
    except WorkloadError as e:
        assert "\n" not in str(e)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["id", "arrival", "prompt", "prompt_len", "max_new_tokens", "output_len"]),
        st.one_of(
            st.none(), st.booleans(), st.integers(-5, 20), st.floats(allow_nan=True),
            st.text(max_size=3), st.lists(st.integers(-3, 12), max_size=4),
        ),
    )
)
def test_jsonl_fuzzed_fields(tmp_path_factory, obj):
    p = tmp_path_factory.mktemp("fz") / "f.jsonl"
    p.write_text(json.dumps(obj) + "\n")
    try:
        reqs = load_jsonl(p, vocab=10)
    except WorkloadError as e:
        assert str(e).startswith(f"{p}:1: error: ")
    else:
        assert isinstance(reqs[0], Request)


# ---- registry --------------------------------------------------------------


def test_get_workload_registry(tmp_path):
    assert get_workload("chat", n=10, seed=1) == chat_like(10, seed=1)
    assert get_workload("reasoning", n=10, seed=1, scale=0.01, vocab=64) == reasoning_like(
        10, seed=1, scale=0.01, vocab=64
    )
    assert len(get_workload("chat")) == 1000
    with pytest.raises(WorkloadError, match="unknown workload 'sharegpt'"):
        get_workload("sharegpt")
    with pytest.raises(WorkloadError):
        get_workload("chat", n=5, rate=-1.0)
    p = write_lines(tmp_path, [GOOD])
    with pytest.raises(WorkloadError, match="only to synthetic"):
        get_workload(str(p), scale=0.5, vocab=10)
    with pytest.raises(WorkloadError, match="max_new_tokens 4 > 2"):
        get_workload(str(p), vocab=10, max_output_len=2)
    assert get_workload(str(p), vocab=10)[0].max_new_tokens == 4
