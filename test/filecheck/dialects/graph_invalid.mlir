// RUN: meshrt-opt %s --split-input-file --verify-diagnostics | filecheck %s
// RUN: not meshrt-opt %s 2>&1 | filecheck %s --check-prefix=FIRST

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 20, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// CHECK: graph_invalid.mlir:5:3: error: 'graph.embed' op kernel @embed: region (0, 0, 20, 1) spans columns 0..19 and rows 0..0, outside the 16 x 16 mesh

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 3 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// CHECK: error: 'graph.embed' op kernel @embed: stage 3 is not in 0..0

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 3 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64} : !graph.act<16> -> !graph.act<12>
}
// CHECK: error: 'graph.attention' op kernel @attn: heads 3 is not a multiple of kv_heads 2

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64} : !graph.act<16> -> !graph.act<8>
}
// CHECK: error: 'graph.attention' op kernel @attn: input (q, k, v) has width 16, expected 24

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %g = graph.gate_topk @gate(%x) on <(0, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<2, 3>
}
// CHECK: graph_invalid.mlir:37:{{[0-9]+}}: error: top-k 3 must be in 1..2 (the expert count)
// Without --split-input-file the first error of the file ends the run:
// FIRST-NOT: Traceback
// FIRST: graph_invalid.mlir:37:1: error: top-k 3 must be in 1..2 (the expert count)
// FIRST-NOT: {{.}}

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %g = graph.gate_topk @gate(%x) on <(0, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<2, 1>
  %e = graph.moe_experts @experts(%x, %g) on <(0, 2, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 8 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(0, 4, 4, 4)>, #mesh.cores<(2, 6, 4, 4)>], placement = array<i64: 0, 1>} : !graph.act<16>, !graph.routing<2, 1> -> !graph.act<16>
}
// CHECK: error: 'graph.moe_experts' op kernel @experts: expert regions 0 ((0, 4, 4, 4)) and 1 ((2, 6, 4, 4)) overlap; expert regions must be disjoint

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %g = graph.gate_topk @gate(%x) on <(0, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<3, 1>
  %e = graph.moe_experts @experts(%x, %g) on <(0, 2, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 8 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(0, 4, 4, 4)>], placement = array<i64: 0, 0, 1>} : !graph.act<16>, !graph.routing<3, 1> -> !graph.act<16>
}
// CHECK: error: 'graph.moe_experts' op kernel @experts: expert 2 placed on region 1, but only 1 expert regions exist

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [#mesh.dyn<moe_routing>] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// CHECK: error: 'graph.model' op model @m enables dynamism 'moe_routing' but no kernel produces it (needs a 'graph.gate_topk')

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %t = graph.sample @sample(%x) on <(0, 1, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, eos = 99 : i64} : !graph.act<16> -> !graph.tokens
}
// CHECK: error: 'graph.sample' op kernel @sample: eos token 99 is outside the vocabulary 0..15

// -----

graph.model @m target "t" mesh 16 x 16 wafers 2 stages 2 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %h = graph.handoff @h(%x) on <(0, 1, 1, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, to_stage = 0 : i64, to_wafer = 1 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK: error: 'graph.handoff' op kernel @h: hands off from stage 0 to stage 0; a handoff must go to the next stage

// -----

graph.model @m target "t" mesh 16 x 16 wafers 3 stages 2 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// CHECK: error: 'graph.model' op @m: 3 wafers need at least as many pipeline stages, got 2

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 0, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// CHECK: error: rect (0, 0, 0, 1) is empty: width and height must be > 0

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [#mesh.dyn<teleport>] hparams {} {
}
// CHECK: error: unknown dynamism kind 'teleport'

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %y = graph.matmul @embed(%x) on <(0, 1, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK: error: 'graph.model' op Redefinition of symbol "embed"

// -----

// gated attention: the gate follows q, k, v in the input
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<24>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64, gated = 1 : i64} : !graph.act<24> -> !graph.act<8>
}
// CHECK: error: 'graph.attention' op kernel @attn: input (q, k, v, gate) has width 24, expected 32

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %d = graph.deltanet @delta(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, k_heads = 2 : i64, v_heads = 3 : i64, k_dim = 2 : i64, v_dim = 2 : i64, conv = 4 : i64} : !graph.act<16> -> !graph.act<6>
}
// CHECK: error: 'graph.deltanet' op kernel @delta: v_heads 3 is not a multiple of k_heads 2

// -----

// [q | k | v | z | b | a]: 2*2*2 + 2*4*2 + 2*4 = 32
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %d = graph.deltanet @delta(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, k_heads = 2 : i64, v_heads = 4 : i64, k_dim = 2 : i64, v_dim = 2 : i64, conv = 4 : i64} : !graph.act<16> -> !graph.act<8>
}
// CHECK: error: 'graph.deltanet' op kernel @delta: input (q, k, v, z, b, a) has width 16, expected 32

// -----

// KV spill: its tiles must be shaped like the region, apart from it and from each other,
// hold some of the entries past spill_from, and come with spill_from.
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<24>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64, spill = #mesh.cores<(4, 1, 2, 3)>, spill_from = 4 : i64} : !graph.act<24> -> !graph.act<8>
}
// CHECK: error: 'graph.attention' op kernel @attn: spill tile (4, 1, 2, 3) must have the shape of the region (0, 1, 2, 2)

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<24>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64, spill = #mesh.cores<(1, 1, 2, 2)>, spill_from = 4 : i64} : !graph.act<24> -> !graph.act<8>
}
// CHECK: error: 'graph.attention' op kernel @attn: spill tile (1, 1, 2, 2) overlaps (0, 1, 2, 2)

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<24>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64, spill = #mesh.cores<(4, 1, 2, 2), (5, 1, 2, 2)>, spill_from = 4 : i64} : !graph.act<24> -> !graph.act<8>
}
// CHECK: error: 'graph.attention' op kernel @attn: spill tile (5, 1, 2, 2) overlaps (4, 1, 2, 2)

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<24>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64, spill = #mesh.cores<(4, 1, 2, 2)>, spill_from = 8 : i64} : !graph.act<24> -> !graph.act<8>
}
// CHECK: error: 'graph.attention' op kernel @attn: spill_from 8 must be in 1..7 (max_seq 8)

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<24>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64, spill = #mesh.cores<(4, 1, 2, 2), (6, 1, 2, 2), (8, 1, 2, 2)>, spill_from = 6 : i64} : !graph.act<24> -> !graph.act<8>
}
// CHECK: error: 'graph.attention' op kernel @attn: 3 spill tiles for 2 spilled entries

// -----

graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<24>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64, spill = #mesh.cores<(4, 1, 2, 2)>} : !graph.act<24> -> !graph.act<8>
}
// CHECK: error: 'graph.attention' op kernel @attn: spill and spill_from go together
