// RUN: meshrt-opt %s --split-input-file --verify-diagnostics | filecheck %s

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<4>
  %p = mesh_kernel.gemv @qkv(%x) on <(0, 1, 2, 8)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<4> -> !graph.act<32>
}
// CHECK: mesh_kernel_invalid.mlir:5:3: error: 'mesh_kernel.gemv' op kernel @qkv: a 2 x 8 grid is too large for a 4 x 32 matrix: every core needs at least one row and column

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %p = mesh_kernel.gemv @qkv(%x) on <(0, 1, 2, 2), (4, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<32>
}
// CHECK: error: 'mesh_kernel.gemv' op kernel @qkv: needs one dense rectangle as its region, got (0, 1, 2, 2), (4, 1, 2, 2)

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %q = mesh_kernel.allreduce @r(%x) on <(0, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "diagonal"} : !graph.act<16> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.allreduce' op kernel @r: axis must be 'row' or 'col', got 'diagonal'

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %q = mesh_kernel.gemv @qkv(%x) on <(0, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, blocks = array<i64: 16, 8, 4>} : !graph.act<16> -> !graph.act<32>
}
// CHECK: error: 'mesh_kernel.gemv' op kernel @qkv: blocks [16, 8, 4] do not add up to the output width 32

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %g = mesh_kernel.topk_gate @gate(%x) on <(8, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<2, 1>
  %e = mesh_kernel.expert_ffn @e(%x, %g) on <(9, 2, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 2, 2)>], placement = array<i64: 0, 5>, expert_ffn = 8 : i64} : !graph.act<16>, !graph.routing<2, 1> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.expert_ffn' op kernel @e: placement names expert regions [5], but only 1 hold routed experts

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %g = mesh_kernel.topk_gate @gate(%x) on <(8, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<2, 1>
  %e = mesh_kernel.expert_ffn @e(%x, %g) on <(9, 2, 2, 2), (9, 4, 3, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 2, 2)>, #mesh.cores<(9, 4, 3, 2)>], placement = array<i64: 0, 1>, expert_ffn = 8 : i64} : !graph.act<16>, !graph.routing<2, 1> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.expert_ffn' op kernel @e: the routed experts' regions must share one shape, got [(2, 2), (3, 2)]

// -----

// A shared expert's region may have a shape of its own, but not a height of its own, and the
// placement may not put a routed expert on it.
mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %g = mesh_kernel.topk_gate @gate(%x) on <(8, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<2, 1>
  %e = mesh_kernel.expert_ffn @e(%x, %g) on <(9, 2, 2, 2), (11, 2, 1, 3)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 2, 2)>, #mesh.cores<(11, 2, 1, 3)>], placement = array<i64: 0, 0>, expert_ffn = 8 : i64, shared_experts = 1 : i64} : !graph.act<16>, !graph.routing<2, 1> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.expert_ffn' op kernel @e: expert regions must share one height (their rows hold the same slices of the output)

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %g = mesh_kernel.topk_gate @gate(%x) on <(8, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<2, 1>
  %e = mesh_kernel.expert_ffn @e(%x, %g) on <(9, 2, 2, 2), (11, 2, 1, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 2, 2)>, #mesh.cores<(11, 2, 1, 2)>], placement = array<i64: 0, 1>, expert_ffn = 8 : i64, shared_experts = 1 : i64} : !graph.act<16>, !graph.routing<2, 1> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.expert_ffn' op kernel @e: placement names expert regions [1], but only 1 hold routed experts

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %g = mesh_kernel.topk_gate @gate(%x) on <(8, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<2, 1>
  %e = mesh_kernel.expert_ffn @e(%x, %g) on <(9, 2, 2, 2), (11, 2, 1, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 2, 2)>, #mesh.cores<(11, 2, 1, 2)>], placement = array<i64: 0, 0>, expert_ffn = 8 : i64, shared_experts = 2 : i64} : !graph.act<16>, !graph.routing<2, 1> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.expert_ffn' op kernel @e: 2 shared experts need as many of the 2 expert regions (the last ones) and leave none for the routed

// -----

// expert_reduce's root is a column at an end of the rows (the side facing the corridor).
mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %g = mesh_kernel.topk_gate @gate(%x) on <(8, 1, 2, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.routing<2, 1>
  %e = mesh_kernel.expert_ffn @e(%x, %g) on <(9, 2, 3, 2), (9, 4, 3, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 3, 2)>, #mesh.cores<(9, 4, 3, 2)>], placement = array<i64: 0, 1>, expert_ffn = 8 : i64} : !graph.act<16>, !graph.routing<2, 1> -> !graph.act<16>
  %r = mesh_kernel.expert_reduce @r(%e) on <(9, 2, 3, 2), (9, 4, 3, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 3, 2)>, #mesh.cores<(9, 4, 3, 2)>], root = 1 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.expert_reduce' op kernel @r: root must be column 0 or 2 of the 3-wide expert regions, got 1

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %r = mesh_kernel.expert_reduce @r(%x) on <(9, 2, 3, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_regions = [#mesh.cores<(9, 2, 3, 2)>, #mesh.cores<(9, 4, 3, 2)>], root = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.expert_reduce' op kernel @r: region must be the union of the expert regions

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %n = mesh_kernel.elementwise "add" @add(%x) on <(0, 1, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.elementwise' op kernel @add: 'add' takes 2 operands, got 1

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %a = mesh_kernel.attention @attn(%x) on <(4, 1, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 1 : i64, kv_heads = 1 : i64, head_dim = 8 : i64, max_seq = 0 : i64, slots = 2 : i64} : !graph.act<16> -> !graph.act<8>
}
// CHECK: error: 'mesh_kernel.attention' op kernel @attn: max_seq must be > 0, got 0

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %a = mesh_kernel.handoff @h(%x) on <(4, 1, 1, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, to_stage = 2 : i64, to_wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.handoff' op kernel @h: hands off from stage 0 to stage 2; a handoff must go to the next stage

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
}
// CHECK: error: 'mesh_kernel.program' op program @m may only hold mesh kernels, found 'graph.embed'

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<32>
  %d = mesh_kernel.deltanet @delta(%x) on <(4, 1, 8, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, k_heads = 2 : i64, v_heads = 4 : i64, k_dim = 2 : i64, v_dim = 2 : i64, conv = 4 : i64, slots = 2 : i64} : !graph.act<32> -> !graph.act<8>
}
// CHECK: error: 'mesh_kernel.deltanet' op kernel @delta: 4 value heads cannot be tiled over 8 columns

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 2 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<32>
  %d = mesh_kernel.deltanet @delta(%x) on <(4, 1, 8, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, k_heads = 2 : i64, v_heads = 4 : i64, k_dim = 2 : i64, v_dim = 2 : i64, conv = 4 : i64, slots = 2 : i64, groups = 3 : i64} : !graph.act<32> -> !graph.act<8>
}
// CHECK: error: 'mesh_kernel.deltanet' op kernel @delta: 8 columns do not split into 3 equal token groups

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 2 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<32>
  %d = mesh_kernel.deltanet @delta(%x) on <(4, 1, 12, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, k_heads = 2 : i64, v_heads = 4 : i64, k_dim = 2 : i64, v_dim = 2 : i64, conv = 4 : i64, slots = 2 : i64, groups = 2 : i64} : !graph.act<32> -> !graph.act<8>
}
// CHECK: error: 'mesh_kernel.deltanet' op kernel @delta: 4 value heads cannot be tiled over 6 columns (one of 2 token groups of 12 columns)

// -----

// Token groups split the micro-batch: two groups cannot share one token.
mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<32>
  %d = mesh_kernel.deltanet @delta(%x) on <(4, 1, 8, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, k_heads = 2 : i64, v_heads = 4 : i64, k_dim = 2 : i64, v_dim = 2 : i64, conv = 4 : i64, slots = 2 : i64, groups = 2 : i64} : !graph.act<32> -> !graph.act<8>
}
// CHECK: error: 'mesh_kernel.deltanet' op kernel @delta: 2 token groups do not divide micro-batch 1

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<32>
  %d = mesh_kernel.deltanet @delta(%x) on <(4, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, k_heads = 2 : i64, v_heads = 4 : i64, k_dim = 2 : i64, v_dim = 2 : i64, conv = 1 : i64, slots = 2 : i64} : !graph.act<32> -> !graph.act<8>
}
// CHECK: error: 'mesh_kernel.deltanet' op kernel @delta: the conv needs at least 2 taps, got 1

// -----

// Three columns for four KV heads: neither whole heads a column nor a head_dim split.
mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<96>
  %a = mesh_kernel.attention @attn(%x) on <(4, 1, 3, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 4 : i64, kv_heads = 4 : i64, head_dim = 8 : i64, max_seq = 8 : i64, slots = 2 : i64} : !graph.act<96> -> !graph.act<32>
}
// CHECK: error: 'mesh_kernel.attention' op kernel @attn: 3 columns split 4 KV heads unevenly: the width must divide kv_heads (whole heads a column) or exceed it (head_dim split)

// -----

// head_dim split over columns keeps each RoPE pair on one column: it must be even.
mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<27>
  %a = mesh_kernel.attention @attn(%x) on <(4, 1, 3, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 1 : i64, kv_heads = 1 : i64, head_dim = 9 : i64, max_seq = 8 : i64, slots = 2 : i64} : !graph.act<27> -> !graph.act<9>
}
// CHECK: error: 'mesh_kernel.attention' op kernel @attn: head_dim 9 split over 3 columns must be even (a column holds whole RoPE pairs)

// -----

mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<16>
  %p = mesh_kernel.gemv @qkv(%x) on <(0, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, out_heads = array<i64: 2, 1, 8, 4>} : !graph.act<16> -> !graph.act<32>
}
// CHECK: error: 'mesh_kernel.gemv' op kernel @qkv: out_heads lays out a blocked q | k | v: it needs blocks

// -----

// Four columns hold four KV heads whole: no head split to name.
mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<32>
  %p = mesh_kernel.gemv @o(%x) on <(0, 1, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row", in_heads = array<i64: 4, 4, 8, 4>} : !graph.act<32> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.gemv' op kernel @o: in_heads must be [heads, kv_heads, head_dim, columns] of an attention wider than its KV heads, got [4, 4, 8, 4]

// -----

// A spilling attention's spill tiles receive each column's q | k | v from its own
// columns: it must read them in place (where the qkv reduction left them).
mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<24>
  %a = mesh_kernel.attention @attn(%x) on <(4, 1, 2, 4), (8, 1, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64, slots = 2 : i64, spill_from = 4 : i64} : !graph.act<24> -> !graph.act<8>
}
// CHECK: error: 'mesh_kernel.attention' op kernel @attn: a spilling attention reads its q | k | v in place (its spill tiles receive each column's share from its own columns)

// -----

// Its region is its own rectangle, then the spill tiles: more than one needs spill_from.
mesh_kernel.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 32 : i64} : !graph.act<24>
  %a = mesh_kernel.attention @attn(%x) on <(4, 1, 2, 4), (8, 1, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64, slots = 2 : i64, qkv_in_place} : !graph.act<24> -> !graph.act<8>
}
// CHECK: error: 'mesh_kernel.attention' op kernel @attn: needs one dense rectangle as its region, got (4, 1, 2, 4), (8, 1, 2, 4)
