"""Output targets (`-t NAME`) meshrt adds to xdsl-opt / meshrt-opt."""

from collections.abc import Callable

from xdsl.utils.target import Target


def get_all_targets() -> dict[str, Callable[[], type[Target]]]:
    # xDSL owns `csl`; meshrt-opt maps `-t csl` to `meshrt-csl`.
    def meshrt_csl():
        from meshrt.backend.csl import CslTarget

        return CslTarget

    return {"meshrt-csl": meshrt_csl}
