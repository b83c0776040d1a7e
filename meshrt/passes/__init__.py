"""meshrt's passes, one module each; `get_all_passes` is their registry."""

from collections.abc import Callable

from xdsl.passes import ModulePass


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Pass name (as used in `-p`) -> factory; imports stay lazy."""

    def place_experts():
        from meshrt.passes.place_experts import PlaceExperts

        return PlaceExperts

    def lower_to_mesh_kernels():
        from meshrt.passes.lower_to_mesh_kernels import LowerToMeshKernels

        return LowerToMeshKernels

    def synthesize_schedules():
        from meshrt.passes.synthesize_schedules import SynthesizeSchedules

        return SynthesizeSchedules

    def materialize_segments():
        from meshrt.passes.materialize_segments import MaterializeSegments

        return MaterializeSegments

    def color_routes():
        from meshrt.passes.color_routes import ColorRoutes

        return ColorRoutes

    def insert_route_handshakes():
        from meshrt.passes.insert_route_handshakes import InsertRouteHandshakes

        return InsertRouteHandshakes

    def check_segments():
        from meshrt.passes.check_segments import CheckSegments

        return CheckSegments

    def lower_to_pe():
        from meshrt.passes.lower_to_pe import LowerToPe

        return LowerToPe

    return {
        "place-experts": place_experts,
        "lower-to-mesh-kernels": lower_to_mesh_kernels,
        "synthesize-schedules": synthesize_schedules,
        "materialize-segments": materialize_segments,
        "color-routes": color_routes,
        "insert-route-handshakes": insert_route_handshakes,
        "check-segments": check_segments,
        "lower-to-pe": lower_to_pe,
    }
