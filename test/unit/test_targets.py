"""Target descriptions: bundled figures, budgets, user files, located errors."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from meshrt.dialects.mesh import Resources
from meshrt.frontend.errors import FrontendError
from meshrt.targets import (
    _FLOAT_FIELDS,
    _ID_LIST_FIELDS,
    _INT_FIELDS,
    COST_KEYS,
    TARGET_DIR,
    available_targets,
    load_target,
)


def test_bundled_targets_exist():
    assert {"wse3", "wse2", "test32", "test16"} <= set(available_targets())


def test_wse3_figures():
    t = load_target("wse3")
    assert (t.width, t.height) == (755, 1170)  # the 762 x 1172 fabric minus memcpy's halo
    assert t.sram_bytes == 48 * 1024
    assert t.colors == 24 and t.reserved_colors == (21, 22, 23)
    assert t.user_colors == tuple(range(21))
    assert t.input_queues == 8 and t.reserved_input_queues == (0, 1)
    assert t.user_input_queues == tuple(range(2, 8))
    assert t.switch_positions == 4
    # switches on colours 0-9, 12, 13, 16, 17, 20, 21 only; 21 is memcpy's
    assert [c for c in t.user_colors if c in t.switch_colors] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 20]
    assert 31 in t.reserved_task_ids
    # memcpy's task IDs (the SDK's task ID maps): its colours' 21-23 and 27, 28, 30
    assert {21, 22, 23, 27, 28, 30} <= set(t.reserved_task_ids)
    assert 0 < t.usable_sram_bytes < t.sram_bytes


def test_wse2_figures():
    t = load_target("wse2")
    assert (t.width, t.height) == (750, 994)  # the 757 x 996 fabric minus memcpy's halo
    assert t.reserved_colors == (21, 22, 23)
    assert t.switch_colors == tuple(range(t.colors))
    assert {21, 22, 23, 27, 28, 30, 31} <= set(t.reserved_task_ids)  # memcpy's, and no 31



def test_switch_colours_outside_the_colours_are_a_located_error(tmp_path):
    text = (TARGET_DIR / "test32.toml").read_text()
    text = re.sub(r"^switch_colors = .*$", "switch_colors = [0, 9]", text, flags=re.MULTILINE)
    path = tmp_path / "t.toml"
    path.write_text(text)
    line = text[:text.index("switch_colors =")].count("\n") + 1
    with pytest.raises(FrontendError, match=rf"t.toml:{line}:1: error: target key 'switch_colors': "
                       r"id 9 is outside 0..7 \(colors = 8\)"):
        load_target(path)


@pytest.mark.parametrize("name", ["test32", "test16"])
def test_test_targets_are_tight(name):
    t, wse = load_target(name), load_target("wse3")
    assert t.cores <= 32 * 32
    assert 1 <= len(t.reserved_colors) <= 2 and t.colors <= 8
    assert len(t.user_input_queues) <= 3 and t.route_entries < wse.route_entries
    assert t.usable_sram_bytes < wse.usable_sram_bytes


def test_budget_is_per_core_capacity():
    t = load_target("wse3")
    b = t.budget()
    assert isinstance(b, Resources)
    assert b == Resources(colors=21, iq=6, oq=len(t.user_output_queues), routes=t.route_entries,
                          switches=4, sram=t.usable_sram_bytes, ctrl=t.control_bytes)
    assert t.usable_sram_bytes == t.sram_bytes - t.reserved_sram_bytes - t.control_bytes
    assert Resources(colors=22).exceeded(b) == [("colors", 22, 21)]


def test_costs_complete_and_documented():
    for name in available_targets():
        t = load_target(name)
        assert set(t.costs) == set(COST_KEYS)
        assert all(v >= 0 for v in t.costs.values())
        text = (TARGET_DIR / f"{name}.toml").read_text()
        costs = text.split("[costs]", 1)[1]
        for key in COST_KEYS:
            line = re.search(rf"^{key}\s*=.*$", costs, re.MULTILINE)
            assert line, (name, key)


@pytest.mark.parametrize("name", ["wse3", "wse2"])
def test_every_hardware_figure_names_its_source(name):
    """Each figure of the hardware targets cites a public source (a tag the file's header
    defines) or says it is an assumption, on its line or in the comment block right above
    its group of lines."""
    text = (TARGET_DIR / f"{name}.toml").read_text()
    header = text.split("\nname =", 1)[0]
    tags = set(re.findall(r"^#\s+\[(\w+)\]", header, re.MULTILINE))
    if name == "wse2":  # cites wse3.toml's tags too
        tags |= set(re.findall(r"^#\s+\[(\w+)\]", (TARGET_DIR / "wse3.toml").read_text(), re.MULTILINE))
    block, checked, after_key = "", 0, False  # a comment block covers the keys right below it
    for line in text.splitlines():
        if not line.strip():
            block = ""
        elif line.startswith("#"):
            block = (block if not after_key else "") + line + "\n"
            after_key = False
        elif "=" in line and not line.startswith("["):
            key = line.split("=", 1)[0].strip()
            if key not in ("name", "description"):
                said = block + line
                assert "assumption" in said.lower() or any(f"[{t}]" in said for t in tags), (name, key)
                for tag in re.findall(r"\[(\w+)\]", line.split("#", 1)[-1] if "#" in line else ""):
                    assert tag in tags, (name, key, tag)
                checked += 1
            after_key = True
    schema = len(_INT_FIELDS) + len(_ID_LIST_FIELDS) + len(_FLOAT_FIELDS) + len(COST_KEYS)
    assert checked == schema  # every key of the schema but name / description


def test_with_overrides():
    t = load_target("test32")
    u = t.with_overrides(width=8, reserved_colors=[7], costs={"exp": 5.0})
    assert u.width == 8 and u.reserved_colors == (7,) and u.costs["exp"] == 5.0
    assert u.costs["fmac"] == t.costs["fmac"] and t.width == 32  # original untouched
    with pytest.raises(FrontendError, match="width"):
        t.with_overrides(width=0)
    with pytest.raises(FrontendError, match="unknown field"):
        t.with_overrides(colours=3)
    with pytest.raises(FrontendError, match="reserves every one"):
        t.with_overrides(reserved_colors=list(range(8)))


def test_frozen_and_hashable():
    t = load_target("wse3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.width = 3  # type: ignore[misc]
    assert t == load_target("wse3")
    hash(t)


def test_user_target_file(tmp_path: Path):
    text = (TARGET_DIR / "test32.toml").read_text().replace('name = "test32"', 'name = "mine"')
    p = tmp_path / "mine.toml"
    p.write_text(text.replace("width = 32", "width = 20"))
    t = load_target(str(p))
    assert t.name == "mine" and t.width == 20 and t.source == str(p)


def _write(tmp_path: Path, old: str, new: str) -> Path:
    text = (TARGET_DIR / "test32.toml").read_text()
    assert old in text
    p = tmp_path / "t.toml"
    p.write_text(text.replace(old, new))
    return p


def test_unknown_key_is_located(tmp_path: Path):
    p = _write(tmp_path, "colors = 8", "colors = 8\ncolours = 8")
    with pytest.raises(FrontendError) as e:
        load_target(str(p))
    line = (TARGET_DIR / "test32.toml").read_text().splitlines().index("colors = 8") + 2
    assert str(e.value).startswith(f"{p}:{line}:1: error: unknown target key 'colours'")


def test_missing_key(tmp_path: Path):
    p = _write(tmp_path, "speed_spread = 0.02\n", "")
    with pytest.raises(FrontendError, match=rf"^{re.escape(str(p))}: error: .*speed_spread"):
        load_target(str(p))


def test_missing_cost(tmp_path: Path):
    p = _write(tmp_path, "marker_hop = 2.0", "")
    with pytest.raises(FrontendError, match="missing marker_hop"):
        load_target(str(p))


def test_toml_syntax_error_is_located(tmp_path: Path):
    p = _write(tmp_path, "height = 32", "height = ")
    with pytest.raises(FrontendError, match=rf"^{re.escape(str(p))}:\d+:\d+: error: invalid TOML"):
        load_target(str(p))


def test_unknown_target_name():
    with pytest.raises(FrontendError, match="unknown target 'wse9'.*test16, test32, wse2, wse3"):
        load_target("wse9")


def test_seconds():
    t = load_target("wse3")
    assert t.seconds(t.clock_hz) == pytest.approx(1.0)


# -- identity: what IR records to find its target again ------------------------


def test_digest_is_the_figures_not_the_name(tmp_path: Path):
    bundled = load_target("test32")
    renamed = load_target(_write(tmp_path, 'name = "test32"', 'name = "mine"'))
    assert renamed.digest == bundled.digest
    assert load_target(_write(tmp_path, "route_entries = 8", "route_entries = 7")).digest != bundled.digest
    assert bundled.with_overrides(costs={"add": 0.5}).digest != bundled.digest
    assert len({load_target(n).digest for n in ("wse3", "wse2", "test32", "test16")}) == 4


def test_identity_records_nothing_for_a_bundled_target_only(tmp_path: Path):
    for name in ("wse3", "test32"):
        assert load_target(name).identity() == (None, None)
    # a copy of test32 under its own name, with the same figures, is test32
    same = _write(tmp_path, "speed_spread = 0.02", "speed_spread = 0.020")
    assert load_target(same).identity() == (None, None)
    # keeping the name but changing a figure, or renaming, records file and digest
    changed = load_target(_write(tmp_path, "colors = 8", "colors = 9"))
    assert changed.identity() == (str((tmp_path / "t.toml").resolve()), changed.digest)
    renamed = load_target(_write(tmp_path, 'name = "test32"', 'name = "mine"'))
    assert renamed.identity() == (str((tmp_path / "t.toml").resolve()), renamed.digest)
    # a target changed in memory has no file holding its figures to record
    tweaked = load_target("test32").with_overrides(route_entries=7)
    assert tweaked.identity() == (None, tweaked.digest)
