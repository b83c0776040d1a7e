// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s

// Continuous batching over two pipeline stages. The sampler's root detects
// EOS and produces the CF payload (request id + status, 8 bytes per slot)
// onto the token send it already makes; the first stage's embed resolves it
// (frees and refills slots); the second stage's entry kernel and attention
// resolve the payload that rides the hidden state; the handoff forwards it
// with the embedding it holds in place (the embedding's row sums end in its
// column, so nothing flows into it). No other metainfo. The sampler merges
// its columns' candidates along the bottom row, whose last core sends.
graph.model @cb target "test32" mesh 32 x 32 wafers 1 stages 2 micro_batch 2 dynamism [#mesh.dyn<continuous_batching>, #mesh.dyn<micro_batch_pipeline>] hparams {dtype_bytes = 4 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 2)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %h = graph.handoff @h0(%x) on <(1, 0, 1, 2)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, to_stage = 1 : i64, to_wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
  %n = graph.rmsnorm @l0.norm(%h) on <(4, 0, 1, 2)> {layer = 0 : i64, stage = 1 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
  %q = graph.matmul @l0.qkv(%n) on <(4, 0, 1, 2)> {layer = 0 : i64, stage = 1 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<48>
  %a = graph.attention @l0.attn(%q) on <(5, 0, 2, 2)> {layer = 0 : i64, stage = 1 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 8 : i64, max_seq = 8 : i64} : !graph.act<48> -> !graph.act<16>
  %l = graph.matmul @lm_head(%a) on <(7, 0, 2, 2)> {layer = -1 : i64, stage = 1 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<32>
  %t = graph.sample @sample(%l) on <(7, 0, 2, 2)> {layer = -1 : i64, stage = 1 : i64, wafer = 0 : i64, eos = 1 : i64} : !graph.act<32> -> !graph.tokens
}

// CHECK:      event.schedule @cb {{.*}}inflight_slots = 4 : i64
// CHECK-NOT:  event.flow @h0.in0
// CHECK:      event.flow @embed.tokens kernel @embed role "tokens" wafer 0 from <(8, 1, 1, 1)> to <(0, 0, 2, 2)> pattern "all" bytes 8
// CHECK:      event.sub @embed "token" after [] demand <{{.*}}>
// CHECK-NEXT:   event.meta_resolve "continuous_batching" from @embed.tokens bytes 16
// CHECK-NEXT:   event.recv @embed.tokens bytes 8 meta 16
// CHECK:      event.sub @h0 "egress" after [@embed.reduce]
// CHECK-NEXT:   event.send @l0.norm.in0 bytes 64 meta 16
// CHECK:      event.sub @l0.norm "edge" after [@h0] demand <{{.*}}> collective {
// CHECK-NEXT:   event.meta_resolve "continuous_batching" from @l0.norm.in0 bytes 16
// CHECK:      event.sub @l0.attn "edge" after [@l0.qkv.reduce] demand <{{.*}}> collective {
// CHECK-NEXT:   event.meta_resolve "continuous_batching" from @l0.attn.in0 bytes 16
// CHECK:      event.sub @sample "root" after [@lm_head.reduce] demand <{{.*}}> collective {
// CHECK:        event.compute "eos_check" work 2
// CHECK-NEXT:   event.meta_produce "continuous_batching" onto @embed.tokens bytes 16
// CHECK-NEXT:   event.send @embed.tokens bytes 8 meta 16
// CHECK-NEXT: }
