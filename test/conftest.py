"""Hypothesis profiles for the property tests (test/unit/test_properties.py).

    python -m pytest test/unit/test_properties.py                                  # ci: few, fixed
    python -m pytest test/unit/test_properties.py --hypothesis-profile=thorough    # by hand: many

`ci` (the default) is derandomized, so the suite runs the same examples every
time and stays fast; `thorough` draws fresh random examples and many more of
them (expect tens of minutes).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)

settings.register_profile("ci", max_examples=10, derandomize=True, database=None, **_COMMON)
settings.register_profile("thorough", max_examples=300, **_COMMON)
settings.load_profile("ci")


@pytest.fixture
def test32_with(tmp_path):
    """A copy of the bundled test32 target with lines of its .toml replaced: call with the
    new name and (old line, new line) pairs; returns the .toml's path."""

    def make(name: str, *edits: tuple[str, str]) -> Path:
        toml = (Path(__file__).resolve().parents[1] / "meshrt" / "targets" / "test32.toml").read_text()
        for old, new in (('name = "test32"', f'name = "{name}"'), *edits):
            assert old in toml, old
            toml = toml.replace(old, new)
        path = tmp_path / f"{name}.toml"
        path.write_text(toml)
        return path

    return make
