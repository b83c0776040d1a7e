"""meshrt's passes, one module each; `get_all_passes` is their registry."""

from collections.abc import Callable

from xdsl.passes import ModulePass


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    # Filled in as passes land; keys are the names used in `-p`.
    return {}
