// RUN: meshrt-opt %s | filecheck %s
// RUN: meshrt-opt %s --print-op-generic | meshrt-opt | filecheck %s

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<continuous_batching>, #mesh.dyn<moe_routing>] hparams {layers = 1 : i64} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %p = mesh_kernel.gemv @l0.qkv(%x) on <(0, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<32>
  %q = mesh_kernel.allreduce @l0.qkv.reduce(%p) on <(0, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row"} : !graph.act<32> -> !graph.act<32>
  %a = mesh_kernel.attention @l0.attn(%q) on <(4, 1, 4, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 1 : i64, head_dim = 8 : i64, max_seq = 16 : i64, slots = 2 : i64} : !graph.act<32> -> !graph.act<16>
  %n = mesh_kernel.elementwise "rmsnorm" @l0.norm(%a) on <(4, 1, 4, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
  %r = mesh_kernel.elementwise "add" @l0.add(%n, %x) on <(4, 1, 4, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16>, !graph.act<16> -> !graph.act<16>
  %g = mesh_kernel.topk_gate @l0.gate(%r) on <(8, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<2, 1>
  %d = mesh_kernel.dispatch @l0.dispatch(%r, %g) on <(8, 2, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 2, 2)>, #mesh.cores<(9, 4, 2, 2)>]} : !graph.act<16>, !graph.routing<2, 1> -> !graph.act<16>
  %e = mesh_kernel.expert_ffn @l0.experts(%d, %g) on <(9, 2, 2, 2), (9, 4, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 2, 2)>, #mesh.cores<(9, 4, 2, 2)>], placement = array<i64: 0, 1>, expert_ffn = 8 : i64} : !graph.act<16>, !graph.routing<2, 1> -> !graph.act<16>
  %c = mesh_kernel.combine @l0.combine(%g, %e) on <(8, 2, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.routing<2, 1>, !graph.act<16> -> !graph.act<16>
  %t = mesh_kernel.sample @sample(%c) on <(0, 6, 4, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, eos = 1 : i64} : !graph.act<16> -> !graph.tokens
}

// CHECK:      mesh_kernel.program @m target "t" mesh 16 x 16
// CHECK-NEXT:   mesh_kernel.embed @embed on <(0, 0, 4, 1)>
// CHECK-NEXT:   mesh_kernel.gemv @l0.qkv(%{{.*}}) on <(0, 1, 4, 4)> {{{.*}}} : !graph.act<16> -> !graph.act<32>
// CHECK-NEXT:   mesh_kernel.allreduce @l0.qkv.reduce(%{{.*}}) on <(0, 1, 4, 4)> {{{.*}}axis = "row"{{.*}}}
// CHECK-NEXT:   mesh_kernel.attention @l0.attn(%{{.*}}) on <(4, 1, 4, 2)> {{{.*}}slots = 2 : i64{{.*}}}
// CHECK-NEXT:   mesh_kernel.elementwise "rmsnorm" @l0.norm(%{{.*}}) on <(4, 1, 4, 2)>
// CHECK-NEXT:   mesh_kernel.elementwise "add" @l0.add(%{{.*}}, %{{.*}}) on <(4, 1, 4, 2)> {{{.*}}} : !graph.act<16>, !graph.act<16> -> !graph.act<16>
// CHECK-NEXT:   mesh_kernel.topk_gate @l0.gate(%{{.*}}) on <(8, 1, 2, 1)> {{{.*}}} : !graph.act<16> -> !graph.routing<2, 1>
// CHECK-NEXT:   mesh_kernel.dispatch @l0.dispatch(%{{.*}}, %{{.*}}) on <(8, 2, 1, 4)> {{{.*}}expert_regions = [#mesh.cores<(9, 2, 2, 2)>, #mesh.cores<(9, 4, 2, 2)>]{{.*}}}
// CHECK-NEXT:   mesh_kernel.expert_ffn @l0.experts(%{{.*}}, %{{.*}}) on <(9, 2, 2, 2), (9, 4, 2, 2)> {{{.*}}placement = array<i64: 0, 1>{{.*}}}
// CHECK-NEXT:   mesh_kernel.combine @l0.combine(%{{.*}}, %{{.*}}) on <(8, 2, 1, 4)> {{{.*}}} : !graph.routing<2, 1>, !graph.act<16> -> !graph.act<16>
// CHECK-NEXT:   mesh_kernel.sample @sample(%{{.*}}) on <(0, 6, 4, 1)> {{{.*}}eos = 1 : i64{{.*}}} : !graph.act<16> -> !graph.tokens
// CHECK-NEXT: }
