// RUN: meshrt-opt %s -p lower-to-mesh-kernels --split-input-file | filecheck %s

// A matmul becomes a tiled GEMV and the column AllReduce that completes it;
// norms and adds become elementwise kernels on the same regions. The embedding
// too is completed by an AllReduce, along the rows: in each row the core holding a
// token's row contributes its slice and the others zeros.
graph.model @dense target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %n = graph.rmsnorm @l0.norm(%x) on <(4, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<32>
  %y = graph.matmul @l0.up(%n) on <(4, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<64>
  %a = graph.elementwise @l0.act(%y) on <(4, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, kind = "silu_mul"} : !graph.act<64> -> !graph.act<32>
  %r = graph.add @l0.add(%a, %x) on <(4, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32>
}
// CHECK:      mesh_kernel.program @dense target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [] hparams {} {
// CHECK-NEXT:   %[[E:.*]] = mesh_kernel.embed @embed on <(0, 0, 4, 4)>
// CHECK-NEXT:   %[[X:.*]] = mesh_kernel.allreduce @embed.reduce(%[[E]]) on <(0, 0, 4, 4)> {{{.*}}axis = "row"{{.*}}} : !graph.act<32> -> !graph.act<32>
// CHECK-NEXT:   %[[N:.*]] = mesh_kernel.elementwise "rmsnorm" @l0.norm(%[[X]]) on <(4, 0, 2, 4)>
// CHECK-NEXT:   %[[P:.*]] = mesh_kernel.gemv @l0.up(%[[N]]) on <(4, 0, 2, 4)> {{.*}} : !graph.act<32> -> !graph.act<64>
// CHECK-NEXT:   %[[Y:.*]] = mesh_kernel.allreduce @l0.up.reduce(%[[P]]) on <(4, 0, 2, 4)> {{{.*}}axis = "col"{{.*}}} : !graph.act<64> -> !graph.act<64>
// CHECK-NEXT:   %[[A:.*]] = mesh_kernel.elementwise "silu_mul" @l0.act(%[[Y]])
// CHECK-NEXT:   mesh_kernel.elementwise "add" @l0.add(%[[A]], %[[X]]) on <(4, 0, 2, 4)> {{.*}} : !graph.act<32>, !graph.act<32> -> !graph.act<32>
// CHECK-NEXT: }

// -----

// Consecutive GEMVs on one region alternate orientations: one whose input lies
// over the columns of its own region (the previous GEMV's result there) is
// transposed (input over the columns, partials reduced along the rows), and an
// add of values held over the rows takes the rows layout.
graph.model @alternating target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %n = graph.rmsnorm @l0.norm(%x) on <(2, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<32>
  %u = graph.matmul @l0.up(%n) on <(2, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<64>
  %a = graph.elementwise @l0.act(%u) on <(2, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, kind = "silu_mul"} : !graph.act<64> -> !graph.act<32>
  %d = graph.matmul @l0.down(%a) on <(2, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<32>
  %r = graph.add @l0.add(%n, %d) on <(2, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32>
}
// CHECK:      mesh_kernel.program @alternating
// CHECK-NEXT:   mesh_kernel.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
// CHECK-NEXT:   mesh_kernel.allreduce @embed.reduce
// CHECK-NEXT:   mesh_kernel.elementwise "rmsnorm" @l0.norm
// CHECK-NEXT:   mesh_kernel.gemv @l0.up({{.*}}) on <(2, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, blocks = array<i64: 32, 32>} :
// CHECK-NEXT:   mesh_kernel.allreduce @l0.up.reduce({{.*}}axis = "col"
// CHECK-NEXT:   mesh_kernel.elementwise "silu_mul" @l0.act({{.*}}) on <(2, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} :
// CHECK-NEXT:   mesh_kernel.gemv @l0.down({{.*}}) on <(2, 0, 4, 4)> {{{.*}}axis = "row"{{.*}}}
// CHECK-NEXT:   mesh_kernel.allreduce @l0.down.reduce({{.*}}axis = "row"
// CHECK-NEXT:   mesh_kernel.elementwise "add" @l0.add({{.*}}) on <(2, 0, 4, 4)> {{{.*}}layout = "rows"{{.*}}}
// CHECK-NEXT: }

// -----

// An MoE layer becomes the dispatch relay, one expert_ffn kernel over all
// expert regions (placement kept), the expert_reduce that sums each region's
// rows into its column facing the corridor (root 0: the corridor is west of
// the regions) and combine on the corridor; attention gets its KV slots
// (micro-batch 2 x 2 stages with pipelining).
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 2 micro_batch 2 dynamism [#mesh.dyn<moe_routing>, #mesh.dyn<micro_batch_pipeline>] hparams {} {
  %x = graph.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %q = graph.matmul @l0.qkv(%x) on <(4, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<64>
  %a = graph.attention @l0.attn(%q) on <(6, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 1 : i64, head_dim = 16 : i64, max_seq = 16 : i64} : !graph.act<64> -> !graph.act<32>
  %g = graph.gate_topk @l0.gate(%a) on <(8, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%a, %g) on <(9, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(10, 0, 2, 2)>, #mesh.cores<(10, 2, 2, 2)>], placement = array<i64: 1, 0, 1, 0>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}
// CHECK:      mesh_kernel.program @moe
// CHECK:        mesh_kernel.attention @l0.attn({{.*}}) on <(6, 0, 2, 4)> {{{.*}}slots = 4 : i64{{.*}}}
// CHECK-NEXT:   %[[G:.*]] = mesh_kernel.topk_gate @l0.gate
// CHECK-NEXT:   %[[D:.*]] = mesh_kernel.dispatch @l0.moe.dispatch(%{{.*}}, %[[G]]) on <(9, 0, 1, 4)> {{{.*}}expert_regions = [#mesh.cores<(10, 0, 2, 2)>, #mesh.cores<(10, 2, 2, 2)>]{{.*}}}
// CHECK-NEXT:   %[[E:.*]] = mesh_kernel.expert_ffn @l0.moe.experts(%[[D]], %[[G]]) on <(10, 0, 2, 2), (10, 2, 2, 2)> {{{.*}}placement = array<i64: 1, 0, 1, 0>{{.*}}}
// CHECK-NEXT:   %[[R:.*]] = mesh_kernel.expert_reduce @l0.moe.reduce(%[[E]]) on <(10, 0, 2, 2), (10, 2, 2, 2)> {{{.*}}root = 0 : i64}
// CHECK-NEXT:   mesh_kernel.combine @l0.moe.combine(%[[G]], %[[R]]) on <(9, 0, 1, 4)>
// CHECK-NEXT: }

// -----

// A corridor east of full-height expert regions (three columns wide): each
// region's rows reduce into its east column (root 2).
graph.model @moe_east target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [#mesh.dyn<moe_routing>] hparams {} {
  %x = graph.embed @embed on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(8, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<2, 1>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(7, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(1, 0, 3, 4)>, #mesh.cores<(4, 0, 3, 4)>], placement = array<i64: 0, 1>} : !graph.act<32>, !graph.routing<2, 1> -> !graph.act<32>
}
// CHECK:      mesh_kernel.expert_reduce @l0.moe.reduce(%{{.*}}) on <(1, 0, 3, 4), (4, 0, 3, 4)> {{{.*}}root = 2 : i64}

// -----

// An attention on the columns of the GEMV that produces its q | k | v reads it
// in place: the GEMV lays its output out blocked per column (each column's
// part of q, then of k, then of v) and the attention says so. One on other
// columns gathers its share of the plain vector instead. (Two columns for one KV
// head split head_dim: the blocked layout is the head split's, `out_heads`.)
graph.model @in_place target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %q = graph.matmul @l0.qkv(%x) on <(2, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<64>
  %a = graph.attention @l0.attn(%q) on <(2, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 1 : i64, head_dim = 16 : i64, max_seq = 8 : i64} : !graph.act<64> -> !graph.act<32>
  %q1 = graph.matmul @l1.qkv(%a) on <(4, 0, 2, 4)> {layer = 1 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<64>
  %a1 = graph.attention @l1.attn(%q1) on <(6, 0, 2, 4)> {layer = 1 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 1 : i64, head_dim = 16 : i64, max_seq = 8 : i64} : !graph.act<64> -> !graph.act<32>
}
// CHECK-LABEL: mesh_kernel.program @in_place
// CHECK:       mesh_kernel.gemv @l0.qkv({{.*}}) on <(2, 0, 2, 4)> {{{.*}}blocks = array<i64: 32, 16, 16>, out_heads = array<i64: 2, 1, 16, 2>}
// CHECK:       mesh_kernel.attention @l0.attn({{.*}}) on <(2, 0, 2, 4)> {{{.*}}qkv_in_place}
// CHECK:       mesh_kernel.gemv @l1.qkv({{.*}}) on <(4, 0, 2, 4)> {layer = 1 : i64, stage = 0 : i64, wafer = 0 : i64, in_heads = array<i64: 2, 1, 16, 2>} :
// CHECK:       mesh_kernel.attention @l1.attn
// CHECK-NOT:   qkv_in_place

// -----

// Weights stored quantized: the GEMV keeps its matmul's stored format, the reduction
// that completes it does not have one.
graph.model @fp8 target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {linear_quant = "fp8"} {
  %x = graph.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %y = graph.matmul @l0.o(%x) on <(4, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, weights = "fp8"} : !graph.act<32> -> !graph.act<32>
}
// CHECK-LABEL: mesh_kernel.program @fp8
// CHECK:       mesh_kernel.gemv @l0.o(%{{.*}}) on <(4, 0, 2, 4)> {{{.*}}weights = "fp8"{{.*}}}
// CHECK-NEXT:  mesh_kernel.allreduce @l0.o.reduce
// CHECK-NOT:   weights
// CHECK:       }

// -----

// An attention wider than its KV heads splits head_dim over each KV head's group of
// columns: the qkv GEMV that it reads in place lays q | k | v out in the head split's
// units (`out_heads`) and the o projection reads the attention's output in that order
// (`in_heads`), both naming [heads, kv_heads, head_dim, columns].
graph.model @split target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %qkv = graph.matmul @l0_qkv(%x) on <(1, 0, 5, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<64>
  %a = graph.attention @l0_attn(%qkv) on <(1, 0, 5, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 4 : i64, kv_heads = 2 : i64, head_dim = 8 : i64, max_seq = 8 : i64} : !graph.act<64> -> !graph.act<32>
  %o = graph.matmul @l0_o(%a) on <(1, 0, 5, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<32>
}
// CHECK:      mesh_kernel.gemv @l0_qkv({{.*}}) on <(1, 0, 5, 4)> {{{.*}}blocks = array<i64: 32, 16, 16>, out_heads = array<i64: 4, 2, 8, 5>} : !graph.act<32> -> !graph.act<64>
// CHECK:      mesh_kernel.attention @l0_attn({{.*}}) on <(1, 0, 5, 4)> {{{.*}}qkv_in_place}
// CHECK:      mesh_kernel.gemv @l0_o({{.*}}) on <(1, 0, 5, 4)> {{{.*}}axis = "row", in_heads = array<i64: 4, 2, 8, 5>} : !graph.act<32> -> !graph.act<32>

// -----

// Columns that hold whole KV heads (2 of 4 a column) need neither.
graph.model @whole target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %qkv = graph.matmul @l0_qkv(%x) on <(1, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<96>
  %a = graph.attention @l0_attn(%qkv) on <(1, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 4 : i64, kv_heads = 4 : i64, head_dim = 8 : i64, max_seq = 8 : i64} : !graph.act<96> -> !graph.act<32>
  %o = graph.matmul @l0_o(%a) on <(1, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<32>
}
// CHECK-LABEL: mesh_kernel.program @whole
// CHECK:       mesh_kernel.gemv @l0_qkv({{.*}}) on <(1, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, blocks = array<i64: 32, 32, 32>} : !graph.act<32> -> !graph.act<96>
// CHECK:       mesh_kernel.gemv @l0_o({{.*}}) on <(1, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row"} : !graph.act<32> -> !graph.act<32>

// -----

// A projection the model gives a bias keeps it on its GEMV (the cores of its first
// input rows hold it, so it is added once); its allreduce does not carry it.
graph.model @biased target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %y = graph.matmul @l0.o(%x) on <(2, 0, 4, 4)> {bias, layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<32>
}
// CHECK-LABEL: mesh_kernel.program @biased
// CHECK:       mesh_kernel.gemv @l0.o({{.*}}) on <(2, 0, 4, 4)> {{{.*}}bias{{.*}}} : !graph.act<32> -> !graph.act<32>
// CHECK-NEXT:  mesh_kernel.allreduce @l0.o.reduce({{.*}}) on <(2, 0, 4, 4)> {{{[^b]*}}} : !graph.act<32> -> !graph.act<32>
