"""Output targets (`-t NAME`) meshrt adds to xdsl-opt / meshrt-opt."""

from collections.abc import Callable

from xdsl.utils.target import Target


def get_all_targets() -> dict[str, Callable[[], type[Target]]]:
    # Filled in by the CSL backend (published as `meshrt-csl`, not `csl`).
    return {}
