// RUN: meshrt-opt %s -p lower-to-mesh-kernels --split-input-file --verify-diagnostics | filecheck %s

// A cycle in the kernel graph: the add feeds the norm that feeds it.
graph.model @m target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %n = graph.rmsnorm @l0.norm(%r) on <(4, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<32>
  %r = graph.add @l0.add(%n, %n) on <(4, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32>
}
// CHECK: invalid.mlir:4:1: error: 'graph.model' op kernel graph has a cycle: @l0.norm -> @l0.add -> @l0.norm

// -----

// A kernel with no region is not a mapped kernel.
graph.model @m target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = "graph.embed"() <{sym_name = "embed", layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64}> : () -> !graph.act<8>
}
// CHECK: error: 'graph.embed' op property 'region' expected in operation 'graph.embed'

// -----

// A region that cannot hold one row and one column per core.
graph.model @m target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<8>
  %y = graph.matmul @l0.up(%x) on <(4, 0, 2, 16)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<8> -> !graph.act<64>
}
// CHECK: error: 'mesh_kernel.gemv' op kernel @l0.up: a 2 x 16 grid is too large for a 8 x 64 matrix: every core needs at least one row and column

// -----

// A stored format meshrt.quant does not know.
graph.model @m target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %y = graph.matmul @l0.o(%x) on <(4, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, weights = "int4"} : !graph.act<32> -> !graph.act<32>
}
// CHECK: error: 'graph.matmul' op kernel @l0.o: weights 'int4' is not a stored format (one of mxfp4, fp8)

// -----

// `decoded` says how stored weights are held; without a stored format there is nothing to decode.
graph.model @m target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<64>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, decoded, expert_ffn = 32 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 2)>, #mesh.cores<(4, 2, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<64>, !graph.routing<4, 2> -> !graph.act<64>
}
// CHECK: error: 'graph.moe_experts' op kernel @l0.moe: decoded needs the stored format (weights) it decodes

// -----

// The last `shared_experts` regions hold the shared experts: no routed expert goes there.
graph.model @m target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<64>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 32 : i64, shared_experts = 1 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 2)>, #mesh.cores<(4, 2, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<64>, !graph.routing<4, 2> -> !graph.act<64>
}
// CHECK: error: 'graph.moe_experts' op kernel @l0.moe: expert 2 placed on region 1, which holds shared expert 0 (the last 1 regions)

// -----

// Every region shared: none left for the routed experts.
graph.model @m target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<64>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 32 : i64, shared_experts = 2 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 2)>, #mesh.cores<(4, 2, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<64>, !graph.routing<4, 2> -> !graph.act<64>
}
// CHECK: error: 'graph.moe_experts' op kernel @l0.moe: 2 shared experts need as many of the 2 expert regions (the last ones) and leave none for the routed
