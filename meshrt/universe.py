"""meshrt's plugin for xDSL: plain `xdsl-opt` sees our dialects and passes.

Published under the `xdsl.universe` entry point (pyproject.toml). Names must
not clash with xDSL's own: xDSL already owns `csl`, `csl_wrapper`,
`csl_stencil` and the `-t csl` target, so meshrt's CSL target is published
as `meshrt-csl` (meshrt-opt also accepts `-t csl` for it).
"""

from __future__ import annotations

from xdsl.universe import Universe

from meshrt.backend.targets import get_all_targets
from meshrt.dialects import get_all_dialects
from meshrt.passes import get_all_passes

MESHRT_UNIVERSE = Universe(
    all_dialects=get_all_dialects(),
    all_passes=get_all_passes(),
    all_targets=get_all_targets(),
)
