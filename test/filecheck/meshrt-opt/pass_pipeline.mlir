// -p takes spaces after its commas, and mlir-opt's --pass-pipeline (or -p)
// 'builtin.module(...)' runs the same passes.
// RUN: meshrt-opt %s -p 'lower-to-mesh-kernels, synthesize-schedules' | filecheck %s
// RUN: meshrt-opt %s -p 'lower-to-mesh-kernels,synthesize-schedules' | filecheck %s
// RUN: meshrt-opt %s --pass-pipeline='builtin.module(lower-to-mesh-kernels, synthesize-schedules)' | filecheck %s
// RUN: meshrt-opt %s --pass-pipeline 'builtin.module( lower-to-mesh-kernels , synthesize-schedules{target="test32"} )' | filecheck %s
// RUN: meshrt-opt %s -p 'builtin.module(lower-to-mesh-kernels,synthesize-schedules)' | filecheck %s
// RUN: meshrt-opt %s --pass-pipeline='builtin.module()' | filecheck %s --check-prefix=NONE

graph.model @cb target "test32" mesh 32 x 32 wafers 1 stages 2 micro_batch 2 dynamism [#mesh.dyn<continuous_batching>, #mesh.dyn<micro_batch_pipeline>] hparams {dtype_bytes = 4 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 2)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %h = graph.handoff @h0(%x) on <(1, 0, 1, 2)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, to_stage = 1 : i64, to_wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
  %n = graph.rmsnorm @l0.norm(%h) on <(4, 0, 1, 2)> {layer = 0 : i64, stage = 1 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
  %q = graph.matmul @l0.qkv(%n) on <(4, 0, 1, 2)> {layer = 0 : i64, stage = 1 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<48>
  %a = graph.attention @l0.attn(%q) on <(5, 0, 2, 2)> {layer = 0 : i64, stage = 1 : i64, wafer = 0 : i64, heads = 1 : i64, kv_heads = 1 : i64, head_dim = 16 : i64, max_seq = 8 : i64} : !graph.act<48> -> !graph.act<16>
  %l = graph.matmul @lm_head(%a) on <(7, 0, 2, 2)> {layer = -1 : i64, stage = 1 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<32>
  %t = graph.sample @sample(%l) on <(7, 0, 2, 2)> {layer = -1 : i64, stage = 1 : i64, wafer = 0 : i64, eos = 1 : i64} : !graph.act<32> -> !graph.tokens
}

// CHECK:      event.schedule @cb {{.*}}inflight_slots = 4 : i64
// CHECK:      event.sub @sample "root" after [@lm_head.reduce]
// NONE:       graph.model @cb
