// RUN: meshrt compile %examples/tiny_moe.mrt --target test32 | meshrt-opt -p 'place-experts{policy=eplb profile="%S/Inputs/tiny_moe_profile.json"},lower-to-mesh-kernels' | filecheck %s --check-prefix=EPLB
// RUN: meshrt compile %examples/tiny_moe.mrt --target test32 | meshrt-opt -p 'place-experts{policy=eplb profile="%S/Inputs/tiny_moe_profile.json"},lower-to-mesh-kernels,synthesize-schedules' | filecheck %s --check-prefix=SCHEDULE
// RUN: meshrt compile %examples/tiny_moe.mrt --target test32 | meshrt-opt -p 'place-experts{policy=vibe profile="%S/Inputs/tiny_moe_profile.json" spread=0.07}' | filecheck %s --check-prefix=VIBE

// tiny_moe has one expert per region, so every placement has the same token
// balance; eplb hands regions out hottest expert first (40 -> r0, 25 -> r1,
// 12 -> r2, ...). The placement is kept by lowering, and the schedule
// synthesis accepts it.
// EPLB: mesh_kernel.expert_ffn @l0_moe.experts{{.*}}placement = array<i64: 0, 5, 3, 7, 1, 6, 2, 4>
// EPLB: mesh_kernel.expert_ffn @l1_moe.experts{{.*}}placement = array<i64: 0, 5, 3, 7, 1, 6, 2, 4>
// SCHEDULE: event.schedule @tiny_moe

// vibe with a 7 % spread of region speeds: in layer 0 region 4 is the fastest
// (slowdowns 1.04 1.01 1.05 1.02 1.00 1.03 1.07 1.06), in layer 1 region 5
// (1.03 1.06 1.01 1.05 1.07 1.00 1.04 1.02); the hottest expert (0) goes there
// and the coldest (3) to the slowest region.
// VIBE: graph.moe_experts @l0_moe{{.*}}placement = array<i64: 4, 2, 5, 6, 1, 7, 3, 0>, placement_policy = "vibe"
// VIBE: graph.moe_experts @l1_moe{{.*}}placement = array<i64: 5, 3, 0, 4, 2, 1, 7, 6>, placement_policy = "vibe"
