// RUN: meshrt-opt %s | filecheck %s
// RUN: meshrt-opt %s --print-op-generic | meshrt-opt | filecheck %s
// RUN: meshrt-opt %s --print-op-generic | filecheck %s --check-prefix=GENERIC

graph.model @tiny_moe target "test32" mesh 32 x 32 wafers 2 stages 2 micro_batch 2 dynamism [#mesh.dyn<continuous_batching>, #mesh.dyn<moe_routing>, #mesh.dyn<micro_batch_pipeline>] hparams {layers = 1 : i64, hidden = 64 : i64} {
  %x = graph.embed @embed on <(0, 0, 4, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 128 : i64} : !graph.act<64>
  %n = graph.rmsnorm @l0.attn_norm(%x) on <(0, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64> -> !graph.act<64>
  %qkv = graph.matmul @l0.qkv(%n) on <(0, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64> -> !graph.act<128>
  %a = graph.attention @l0.attn(%qkv) on <(4, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 4 : i64, kv_heads = 2 : i64, head_dim = 16 : i64, max_seq = 64 : i64} : !graph.act<128> -> !graph.act<64>
  %r = graph.add @l0.attn_add(%a, %x) on <(8, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64>
  %g = graph.gate_topk @l0.gate(%r) on <(8, 5, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.experts(%r, %g) on <(8, 6, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 32 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(0, 8, 4, 2)>, #mesh.cores<(4, 8, 4, 2)>, #mesh.cores<(8, 8, 4, 2)>, #mesh.cores<(12, 8, 4, 2)>], placement = array<i64: 0, 1, 2, 3>} : !graph.act<64>, !graph.routing<4, 2> -> !graph.act<64>
  %u = graph.elementwise @l0.act(%qkv) on <(0, 12, 4, 4 step 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, kind = "silu_mul"} : !graph.act<128> -> !graph.act<64>
  %h = graph.handoff @stage0.out(%e) on <(12, 1, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, to_stage = 1 : i64, to_wafer = 1 : i64} : !graph.act<64> -> !graph.act<64>
  %l = graph.matmul @lm_head(%h) on <(0, 20, 8, 4)> {layer = -1 : i64, stage = 1 : i64, wafer = 1 : i64} : !graph.act<64> -> !graph.act<128>
  %t = graph.sample @sample(%l) on <(0, 24, 8, 1)> {layer = -1 : i64, stage = 1 : i64, wafer = 1 : i64, eos = 2 : i64} : !graph.act<128> -> !graph.tokens
}

// CHECK:      graph.model @tiny_moe target "test32" mesh 32 x 32 wafers 2 stages 2 micro_batch 2 dynamism [#mesh.dyn<continuous_batching>, #mesh.dyn<moe_routing>, #mesh.dyn<micro_batch_pipeline>] hparams {{{.*}}} {
// CHECK-NEXT:   %{{.*}} = graph.embed @embed on <(0, 0, 4, 1)> {{{.*}}vocab = 128 : i64{{.*}}} : !graph.act<64>
// CHECK-NEXT:   graph.rmsnorm @l0.attn_norm(%{{.*}}) on <(0, 1, 4, 4)>
// CHECK-NEXT:   graph.matmul @l0.qkv(%{{.*}}) on <(0, 1, 4, 4)> {{{.*}}} : !graph.act<64> -> !graph.act<128>
// CHECK-NEXT:   graph.attention @l0.attn(%{{.*}}) on <(4, 1, 4, 4)> {{{.*}}heads = 4 : i64{{.*}}} : !graph.act<128> -> !graph.act<64>
// CHECK-NEXT:   graph.add @l0.attn_add(%{{.*}}, %{{.*}}) on <(8, 1, 4, 4)> {{{.*}}} : !graph.act<64>
// CHECK-NEXT:   graph.gate_topk @l0.gate(%{{.*}}) on <(8, 5, 4, 1)> {{{.*}}} : !graph.act<64> -> !graph.routing<4, 2>
// CHECK-NEXT:   graph.moe_experts @l0.experts(%{{.*}}, %{{.*}}) on <(8, 6, 4, 1)> {{{.*}}expert_regions = [#mesh.cores<(0, 8, 4, 2)>, #mesh.cores<(4, 8, 4, 2)>, #mesh.cores<(8, 8, 4, 2)>, #mesh.cores<(12, 8, 4, 2)>]{{.*}}placement = array<i64: 0, 1, 2, 3>{{.*}}}
// CHECK-NEXT:   graph.elementwise @l0.act(%{{.*}}) on <(0, 12, 4, 4 step 2, 1)> {{{.*}}kind = "silu_mul"{{.*}}} : !graph.act<128> -> !graph.act<64>
// CHECK-NEXT:   graph.handoff @stage0.out(%{{.*}}) on <(12, 1, 1, 4)> {{{.*}}to_stage = 1 : i64, to_wafer = 1 : i64{{.*}}}
// CHECK-NEXT:   graph.matmul @lm_head
// CHECK-NEXT:   graph.sample @sample(%{{.*}}) on <(0, 24, 8, 1)> {{{.*}}eos = 2 : i64{{.*}}} : !graph.act<128> -> !graph.tokens
// CHECK-NEXT: }

// GENERIC: "graph.model"() <{sym_name = "tiny_moe", target = "test32", width = 32 : i64, height = 32 : i64, wafers = 2 : i64, stages = 2 : i64, micro_batch = 2 : i64, dynamism = [#mesh.dyn<continuous_batching>, #mesh.dyn<moe_routing>, #mesh.dyn<micro_batch_pipeline>]
// GENERIC: "graph.embed"() <{sym_name = "embed", region = #mesh.cores<(0, 0, 4, 1)>
// GENERIC: "graph.elementwise"(%{{.*}}) <{sym_name = "l0.act", region = #mesh.cores<(0, 12, 4, 4 step 2, 1)>
