// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s
// RUN: meshrt-opt %s -p 'lower-to-mesh-kernels,synthesize-schedules{target=wse3}' | filecheck %s --check-prefix=ROW

// An attention five columns wide for two KV heads splits head_dim: KV head 0 takes
// columns 1-2, KV head 1 columns 3-4 (w // kv_heads each), column 5 holds no heads;
// each column its units (RoPE pairs) of its head's 8 features. Every core computes its
// partial q . k scores (qk), which are summed along its group's row (2 heads x 2 rows
// of scores, 2 + 1 sums of squares for q/k norm: 28 bytes) and relayed back, then the
// softmax, the weighted sum of its V features and the merge down the column as usual.
// The qkv reduction carries the fullest column's units (2 q heads, k, v: 4 features
// each, 64 bytes). On test32, whose roles bind 3 input queues, one chain per group
// into its end (a two-column group has no core receiving on both).
graph.model @dense target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 4 : i64} {
  %x = graph.embed @embed on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %qkv = graph.matmul @l0_qkv(%x) on <(1, 0, 5, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<64>
  %a = graph.attention @l0_attn(%qkv) on <(1, 0, 5, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 4 : i64, kv_heads = 2 : i64, head_dim = 8 : i64, max_seq = 8 : i64} : !graph.act<64> -> !graph.act<32>
  %o = graph.matmul @l0_o(%a) on <(1, 0, 5, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<32>
}

// CHECK:      event.flow @l0_qkv.reduce.down kernel @l0_qkv.reduce role "down" wafer 0 from <(1, 0, 5, 3)> to <(1, 1, 5, 3)> pattern "shift" by 0, 1 bytes 64 streams
// CHECK:      event.flow @l0_attn.scores.down kernel @l0_attn role "down" wafer 0 from <(1, 0, 1, 4), (3, 0, 1, 4)> to <(2, 0, 1, 4), (4, 0, 1, 4)> pattern "shift" by 1, 0 bytes 28 streams
// CHECK-NEXT: event.flow @l0_attn.scores.up kernel @l0_attn role "up" wafer 0 from <(2, 0, 1, 4), (4, 0, 1, 4)> to <(1, 0, 1, 4), (3, 0, 1, 4)> pattern "shift" by -1, 0 bytes 28 streams
// CHECK-NEXT: event.flow @l0_o.reduce.down

// A group's first column on a row between the column's ends: it sends its partial
// scores to its group's other column, gets the sums back, then sends its softmax
// partial down the column (the qkv reduction's colour, shared).
// CHECK:      event.sub @l0_attn "edge_scores_edge" after [@l0_qkv.reduce] demand <colors = 4, iq = 2, oq = 2, {{.*}}> collective {
// CHECK-NEXT:   event.compute "qk" work 16
// CHECK-NEXT:   event.send @l0_attn.scores.down bytes 28 meta 0
// CHECK-NEXT:   event.recv @l0_attn.scores.up bytes 28 meta 0
// CHECK-NEXT:   event.compute "exp" work 4
// CHECK-NEXT:   event.compute "av" work 16
// CHECK-NEXT:   event.send @l0_qkv.reduce.down bytes 48 meta 0
// CHECK-NEXT:   event.recv @l0_qkv.reduce.up bytes 48 meta 0
// CHECK-NEXT: }
// The column past the groups joins only the column's merge.
// CHECK:      event.sub @l0_attn "edge_idle"
// CHECK-NEXT:   event.compute "qk" work 16
// CHECK-NEXT:   event.compute "exp" work 4
// CHECK-NEXT:   event.compute "av" work 16
// CHECK-NEXT:   event.send @l0_qkv.reduce.down bytes 48 meta 0
// The column's root in a group's last column: adds its row's partials, relays the
// sums back, then merges and normalizes.
// CHECK:      event.sub @l0_attn "root_scores_root"
// CHECK-NEXT:   event.compute "qk" work 16
// CHECK-NEXT:   event.recv @l0_attn.scores.down bytes 28 meta 0
// CHECK-NEXT:   event.compute "score_add" work 7
// CHECK-NEXT:   event.send @l0_attn.scores.up bytes 28 meta 0
// CHECK-NEXT:   event.compute "exp" work 4
// CHECK-NEXT:   event.compute "av" work 16
// CHECK:        event.compute "softmax_merge" work 12
// CHECK:        event.compute "normalize" work 8

// Where roles bind four input queues (wse3): one chain along each whole row into its
// end, segmented by group, relayed back; it takes the route of the o projection's
// chain along the same rows, so the two share one flow (the larger message's bytes).
// ROW:      event.flow @l0_attn.scores.down kernel @l0_attn role "down" wafer 0 from <(1, 0, 4, 4)> to <(2, 0, 4, 4)> pattern "shift" by 1, 0 bytes 32 streams
// ROW-NEXT: event.flow @l0_attn.scores.up kernel @l0_attn role "up" wafer 0 from <(2, 0, 4, 4)> to <(1, 0, 4, 4)> pattern "shift" by -1, 0 bytes 28 streams
// ROW-NEXT: event.flow @l0_o.reduce.up
// ROW-NOT:  event.flow @l0_o.reduce.down
// ROW:      event.sub @l0_attn "edge_scores_mid"
// ROW-NEXT:   event.compute "qk" work 16
// ROW-NEXT:   event.recv @l0_attn.scores.down bytes 28 meta 0
// ROW-NEXT:   event.compute "score_add" work 7
// ROW-NEXT:   event.send @l0_attn.scores.down bytes 28 meta 0
// ROW-NEXT:   event.recv @l0_attn.scores.up bytes 28 meta 0
// ROW-NEXT:   event.send @l0_attn.scores.up bytes 28 meta 0
// ROW-NEXT:   event.compute "exp" work 4
// ROW:      event.sub @l0_o.reduce "mid"
// ROW-NEXT:   event.recv @l0_attn.scores.down bytes 32
