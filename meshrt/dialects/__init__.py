"""meshrt's dialects, one module each: mesh (shared attributes), graph,
mesh_kernel, event, segment, pe."""

from collections.abc import Callable

from xdsl.ir import Dialect


def get_all_dialects() -> dict[str, Callable[[], Dialect]]:
    def mesh():
        from meshrt.dialects.mesh import Mesh

        return Mesh

    def graph():
        from meshrt.dialects.graph import Graph

        return Graph

    def mesh_kernel():
        from meshrt.dialects.mesh_kernel import MeshKernel

        return MeshKernel

    def event():
        from meshrt.dialects.event import Event

        return Event

    def segment():
        from meshrt.dialects.segment import Segment

        return Segment

    def pe():
        from meshrt.dialects.pe import Pe

        return Pe

    return {
        "mesh": mesh,
        "graph": graph,
        "mesh_kernel": mesh_kernel,
        "event": event,
        "segment": segment,
        "pe": pe,
    }


def xdsl_dialects() -> list[Dialect]:
    """xDSL's dialects the PE level (`lower-to-pe`) holds: its programs are `csl.module`s
    whose bodies use memref, arith and scf."""
    from xdsl.dialects import arith, csl, memref, scf

    return [csl.CSL, memref.MemRef, arith.Arith, scf.Scf]
