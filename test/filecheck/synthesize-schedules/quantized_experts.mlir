// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules --split-input-file | filecheck %s

// MXFP4 experts held packed: each core of a 2 x 2 region holds its tiles of two experts,
// 2 x 3 x 32 x 16 = 3,072 weights at 17 / 32 bytes (1,632 B; sram adds 128 B of
// buffers). Micro-batch 1, top-2: a region runs up to two (token, expert) pairs,
// one pass each (`expert_passes`), and a pass decodes the tiles of its pair's
// expert before each fmac.
// (Activations in fp32, act_format = "f32", so the message sizes are the fp32 ones.)
graph.model @packed target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [#mesh.dyn<moe_routing>] hparams {dtype_bytes = 2.0 : f64, expert_dtype_bytes = 0.53125 : f64, expert_quant = "mxfp4", top_k = 2 : i64, act_format = "f32"} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<64>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, weights = "mxfp4", expert_ffn = 32 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 2)>, #mesh.cores<(4, 2, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<64>, !graph.routing<4, 2> -> !graph.act<64>
}
// CHECK-LABEL: event.schedule @packed
// CHECK:       event.sub @l0.moe.experts "edge" after [@l0.moe.dispatch, @l0.gate] demand <{{.*}}sram = 1760, ctrl = 16> collective {
// CHECK-NEXT:    event.meta_resolve "moe_routing"
// CHECK-NEXT:    event.recv @l0.moe.experts.in0 bytes 64 meta 16
// CHECK-NEXT:    event.compute "dequant_mxfp4" work 1024
// CHECK-NEXT:    event.compute "fmac" work 1024
// CHECK:         event.recv @l0.moe.experts.up
// CHECK-NEXT:    event.compute "dequant_mxfp4" work 512
// CHECK-NEXT:    event.compute "fmac_down" work 512
// CHECK-NEXT:    event.compute "dequant_mxfp4" work 1024
// CHECK-NEXT:    event.compute "fmac" work 1024
// CHECK:         event.recv @l0.moe.experts.up
// CHECK-NEXT:    event.compute "dequant_mxfp4" work 512
// CHECK-NEXT:    event.compute "fmac_down" work 512
// CHECK-NEXT:  }

// -----

// The same experts `decoded` (what the mapper picks where it fits): the tiles are
// decoded once, when installed, into the model's 2-byte floats (6,144 B + 128 B), and
// no step decodes anything.
graph.model @decoded target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [#mesh.dyn<moe_routing>] hparams {dtype_bytes = 2.0 : f64, expert_dtype_bytes = 0.53125 : f64, expert_quant = "mxfp4", top_k = 2 : i64, act_format = "f32"} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<64>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, weights = "mxfp4", decoded, expert_ffn = 32 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 2)>, #mesh.cores<(4, 2, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<64>, !graph.routing<4, 2> -> !graph.act<64>
}
// CHECK-LABEL: event.schedule @decoded
// CHECK:       event.sub @l0.moe.experts "edge" after [@l0.moe.dispatch, @l0.gate] demand <{{.*}}sram = 6272, ctrl = 16> collective {
// CHECK-NEXT:    event.meta_resolve "moe_routing"
// CHECK-NEXT:    event.recv @l0.moe.experts.in0 bytes 64 meta 16
// CHECK-NEXT:    event.compute "fmac" work 1024
// CHECK-NOT:     dequant
// CHECK:       event.sub @l0.moe.reduce
