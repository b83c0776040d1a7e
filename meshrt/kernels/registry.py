"""KERNELS: the kernel kinds, collected from the folders under meshrt/kernels/.

Every sub-folder of `meshrt/kernels/` with an `__init__.py` is a kind; its
package exports `OP`, the kind's `KernelOp` subclass. Folders outside the
tree are added with the environment variable MESHRT_KERNEL_PATH (directories
holding kind folders, separated by the platform's path separator), so a kind
is added by writing one folder, nothing else.

The registry is built on first use (the dialect and the passes ask it), and
checked then: one kind per name, every compute op declared once, numerics
only for declared compute ops.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from meshrt.diagnostics import MeshrtError
from meshrt.kernels.compute import ComputeOp

if TYPE_CHECKING:
    from meshrt.kernels.interface import KernelOp

PATH_VARIABLE = "MESHRT_KERNEL_PATH"
_BUILTIN = Path(__file__).parent


class KernelRegistryError(MeshrtError):
    """A kind folder that does not describe a kind, or two that clash."""

    unlocated = None  # the message names the folder


class UnknownKernel(Exception):
    """A kernel kind or compute op the registry does not know (its message names both)."""


def _kind_dirs() -> list[tuple[str, Path]]:
    """(module name, folder) of every kind folder, built-in first, in name order."""
    dirs = [(f"meshrt.kernels.{p.name}", p) for p in sorted(_BUILTIN.iterdir())
            if (p / "__init__.py").is_file()]
    for root in os.environ.get(PATH_VARIABLE, "").split(os.pathsep):
        if root and Path(root).is_dir():
            dirs += [(f"meshrt_kernels_ext.{p.name}", p) for p in sorted(Path(root).iterdir())
                     if (p / "__init__.py").is_file()]
    return dirs


def _load(module: str, folder: Path):
    if module.startswith("meshrt.kernels."):
        return importlib.import_module(module)
    spec = importlib.util.spec_from_file_location(module, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None:
        raise KernelRegistryError(f"{folder}: not a Python package")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # a user's folder: its failure is a one-line error, not ours
        del sys.modules[module]
        raise KernelRegistryError(f"{folder}: the kind folder failed to load: "
                                  f"{type(e).__name__}: {e}") from e
    return mod


@cache
def kernels() -> dict[str, type[KernelOp]]:
    """Kind name (the op name after `mesh_kernel.`) -> its op class."""
    from meshrt.kernels.interface import KernelOp

    found: dict[str, type[KernelOp]] = {}
    folders: dict[str, Path] = {}
    for module, folder in _kind_dirs():
        op = getattr(_load(module, folder), "OP", None)
        if not (isinstance(op, type) and issubclass(op, KernelOp)):
            raise KernelRegistryError(f"{folder}: the kind folder exports no OP (a KernelOp subclass)")
        if not op.name.startswith("mesh_kernel."):
            raise KernelRegistryError(f"{folder}: op name '{op.name}' is not in the mesh_kernel dialect")
        kind = op.kernel_kind()
        if kind in found:
            raise KernelRegistryError(f"{folder}: kernel kind '{kind}' is defined twice")
        found[kind] = op
        folders[kind] = folder
    _check(found, folders)
    return found


def _check(found: dict[str, type[KernelOp]], folders: dict[str, Path]) -> None:
    from meshrt.kernels.interface import KernelOp
    from meshrt.targets import COST_KEYS

    seen: dict[str, tuple[ComputeOp, str]] = {}
    for kind, op in found.items():
        where = folders[kind]
        missing = [m for m in ("roles", "input_share", "input_layout", "output_layout")
                   if getattr(op, m) is getattr(KernelOp, m)]
        if missing:
            raise KernelRegistryError(f"{where}: kernel kind '{kind}' does not define {', '.join(missing)}")
        for c in op.COMPUTE:
            if c.price is None and not isinstance(c.cost, str):
                raise KernelRegistryError(
                    f"{where}: kernel kind '{kind}': compute op '{c.name}' names several cost keys "
                    "but no price formula; give one key or a price")
            for key in c.cost_keys():
                if key not in COST_KEYS:
                    raise KernelRegistryError(
                        f"{where}: kernel kind '{kind}': compute op '{c.name}' has cost key '{key}', which "
                        f"is not a target cost (expected one of {', '.join(COST_KEYS)})")
            other = seen.get(c.name)
            if other is not None and other[0] is not c:
                raise KernelRegistryError(
                    f"{where}: compute op '{c.name}' is declared by kernel kinds '{other[1]}' and '{kind}'; "
                    "declare it once (meshrt/kernels/compute.py holds the shared ones)")
            seen[c.name] = (c, kind)
        if op.NUMERICS is not None:
            extra = sorted(op.NUMERICS.OPS - {c.name for c in op.COMPUTE})
            if extra:
                raise KernelRegistryError(
                    f"{where}: kernel kind '{kind}' has numerics for compute ops it does not declare: "
                    + ", ".join(extra))


@cache
def compute_ops() -> dict[str, ComputeOp]:
    """Every declared compute op by name."""
    return {c.name: c for op in kernels().values() for c in op.COMPUTE}


def kind(name: str) -> type[KernelOp]:
    """The op class of kernel kind `name`; UnknownKernel if no folder defines it."""
    op = kernels().get(name)
    if op is None:
        raise UnknownKernel(f"unknown kernel kind \"{name}\", expected one of {', '.join(kernels())}")
    return op


def compute_op(name: str, kind_name: str | None = None) -> ComputeOp:
    """The compute op `name` (of kernel kind `kind_name`, if given: it must declare it)."""
    if kind_name is not None:
        for c in kind(kind_name).COMPUTE:
            if c.name == name:
                return c
        raise UnknownKernel(f"kernel kind \"{kind_name}\" has no compute op \"{name}\"; it declares "
                            + (", ".join(c.name for c in kind(kind_name).COMPUTE) or "none"))
    c = compute_ops().get(name)
    if c is None:
        raise UnknownKernel(f"unknown compute op \"{name}\": no kernel kind declares it")
    return c


def op_classes() -> list[type[KernelOp]]:
    return list(kernels().values())


def lowering_for(graph_op: type) -> type[KernelOp] | None:
    """The kind whose `lower` accepts graph op class `graph_op`."""
    for op in kernels().values():
        if graph_op in op.LOWERS:
            return op
    return None
