// RUN: meshrt-opt %s -p 'place-experts{policy=contiguous}' | filecheck %s --check-prefix=CONTIG
// RUN: meshrt-opt %s -p 'place-experts{policy=eplb profile="%S/Inputs/profile.json"}' | filecheck %s --check-prefix=EPLB
// RUN: meshrt-opt %s -p 'place-experts{policy=eplb profile="%S/Inputs/profile.json" refine=false}' | filecheck %s --check-prefix=EPLB
// RUN: meshrt-opt %s -p 'place-experts{policy=vibe profile="%S/Inputs/profile.json" models="%S/Inputs/models.json"}' | filecheck %s --check-prefix=VIBE
// RUN: meshrt-opt %s -p 'place-experts{policy=vibe profile="%S/Inputs/profile.json" spread=1}' | filecheck %s --check-prefix=VIBE-SPREAD
// RUN: meshrt-opt %s -p 'place-experts{policy=vibe profile="%S/Inputs/profile.json" spread=0}' | filecheck %s --check-prefix=EPLB-VIBE
// RUN: meshrt-opt %s -p 'lower-to-mesh-kernels,place-experts{policy=vibe profile="%S/Inputs/profile.json" models="%S/Inputs/models.json"}' | filecheck %s --check-prefix=KERNELS

// Four experts on two regions of two slots; the hand-built profile routes
// tokens 8 : 6 : 2 : 1 (Inputs/profile.json).
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {} {
  %x = graph.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(8, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(9, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(10, 0, 2, 2)>, #mesh.cores<(10, 2, 2, 2)>], placement = array<i64: 1, 0, 1, 0>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}

// contiguous: expert e on region e / 2, whatever the routing.
// CONTIG: graph.moe_experts @l0.moe{{.*}}placement = array<i64: 0, 0, 1, 1>, placement_policy = "contiguous"

// eplb: 8 -> r0, 6 -> r1, 2 -> r1 (the lighter), 1 -> r0: 9 : 8 tokens, the
// optimum (contiguous has 14 : 3). No swap improves it, so refine=false agrees.
// EPLB: graph.moe_experts @l0.moe{{.*}}placement = array<i64: 0, 1, 1, 0>, placement_policy = "eplb"

// vibe with region 0 twice as slow per token (Inputs/models.json): eplb's
// placement would take 2 x 9 = 18; vibe gives the slow region 6 + 1 tokens
// (2 x 7 = 14) and the fast one 8 + 2 (10): 14 is the optimum.
// VIBE: graph.moe_experts @l0.moe{{.*}}placement = array<i64: 1, 0, 1, 0>, placement_policy = "vibe"

// Synthetic speeds, spread=1: slowdowns 1 and 2 in seeded order, here region 1
// is the slow one, so the mirror image of the models.json case.
// VIBE-SPREAD: graph.moe_experts @l0.moe{{.*}}placement = array<i64: 0, 1, 0, 1>, placement_policy = "vibe"

// All regions alike: vibe is eplb.
// EPLB-VIBE: graph.moe_experts @l0.moe{{.*}}placement = array<i64: 0, 1, 1, 0>, placement_policy = "vibe"

// After lowering, the pass rewrites the expert_ffn kernel's placement.
// KERNELS: mesh_kernel.expert_ffn @l0.moe.experts{{.*}}placement = array<i64: 1, 0, 1, 0>
