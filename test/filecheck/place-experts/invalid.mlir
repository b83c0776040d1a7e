// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=bogus}' | filecheck %s --check-prefix=POLICY
// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=eplb}' | filecheck %s --check-prefix=NO-PROFILE
// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=eplb profile="%S/Inputs/no_such_profile.json"}' | filecheck %s --check-prefix=MISSING
// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=eplb profile="%S/Inputs/profile_bad_json.json"}' | filecheck %s --check-prefix=BAD-JSON
// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=eplb profile="%S/Inputs/profile_negative.json"}' | filecheck %s --check-prefix=NEGATIVE
// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=eplb profile="%S/Inputs/profile_wrong_count.json"}' | filecheck %s --check-prefix=COUNT
// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=eplb profile="%S/Inputs/profile_other_layer.json"}' | filecheck %s --check-prefix=LAYER
// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=vibe profile="%S/Inputs/profile.json"}' | filecheck %s --check-prefix=NO-MODELS
// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=vibe profile="%S/Inputs/profile.json" models="%S/Inputs/models.json" spread=0.1}' | filecheck %s --check-prefix=BOTH
// RUN: meshrt-opt %s --verify-diagnostics -p 'place-experts{policy=vibe profile="%S/Inputs/profile.json" models="%S/Inputs/models_wrong_regions.json"}' | filecheck %s --check-prefix=REGIONS
// RUN: meshrt-opt %s --verify-diagnostics -p 'lower-to-mesh-kernels,synthesize-schedules,place-experts' | filecheck %s --check-prefix=LEVEL

// Every error is one line, located in the file that is wrong: the IR for bad
// options, the profile or models file (line:column) for a bad file.
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {} {
  %x = graph.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(8, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(9, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(10, 0, 2, 2)>, #mesh.cores<(10, 2, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}

// POLICY: invalid.mlir:15:1: error: 'graph.model' op pass 'place-experts': option 'policy': unknown policy 'bogus', expected one of contiguous, eplb, vibe
// NO-PROFILE: invalid.mlir:15:1: error: 'graph.model' op place-experts: policy=eplb needs profile="FILE" (an expert-activation profile)
// MISSING: Inputs/no_such_profile.json: error: no such expert profile file
// BAD-JSON: Inputs/profile_bad_json.json:4:3: error: expert profile is not valid JSON: Expecting property name enclosed in double quotes
// NEGATIVE: Inputs/profile_negative.json:3:5: error: layer 0: load of expert 1 must be a non-negative number, got -6
// COUNT: Inputs/profile_wrong_count.json:4:5: error: layer 0 lists 3 experts, but @l0.moe routes among 4
// LAYER: Inputs/profile_other_layer.json:2:3: error: the profile has no entry for MoE layer 0 (@l0.moe) and no "default"
// NO-MODELS: invalid.mlir:15:1: error: 'graph.model' op place-experts: policy=vibe needs region models: models="FILE", or spread=S for synthetic region speeds (spread=0: all regions alike)
// BOTH: invalid.mlir:15:1: error: 'graph.model' op place-experts: give models="FILE" or spread=S, not both
// REGIONS: Inputs/models_wrong_regions.json:4:5: error: layer 0 has 3 region models, but @l0.moe has 2 expert regions
// LEVEL: invalid.mlir:15:1: error: '{{event\.[a-z_]+}}' op place-experts needs graph or mesh_kernel IR (a 'graph.model' or 'mesh_kernel.program'), found {{event\.[a-z_]+}}{{$}}
