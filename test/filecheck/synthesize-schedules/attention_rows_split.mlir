// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s
// RUN: meshrt-opt %s -p 'lower-to-mesh-kernels,synthesize-schedules{target=wse3}' | filecheck %s --check-prefix=ROW

// attention_head_split.mlir's attention (two KV heads on five columns, head_dim 8
// split in units, column 5 idle) with a context of 256: a row's block of 64 entries
// makes the scores the features layout keeps (2 heads x 64) outweigh whole heads'
// vectors, so the group splits its rows instead (`layout.split_layout`). Along each row
// the group first gathers its units into the whole head's q | k | v (2 + 2 heads x 8
// features: 128 bytes), then every core attends with whole heads over every second
// entry of its row's block, 32 rows (qk 32 x 2 heads x 8, exp 32 x 2: half the
// exponentials the features layout's cores each compute), the group merges its partials
// along the row (2 heads x (8 + max, sum): 80 bytes) on the gather's flow, then the merge
// down the column as usual, on the qkv reduction's colour. On test32, whose roles bind 3
// input queues, one chain per group into its end.
graph.model @dense target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 4 : i64} {
  %x = graph.embed @embed on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %qkv = graph.matmul @l0_qkv(%x) on <(1, 0, 5, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<64>
  %a = graph.attention @l0_attn(%qkv) on <(1, 0, 5, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 4 : i64, kv_heads = 2 : i64, head_dim = 8 : i64, max_seq = 256 : i64} : !graph.act<64> -> !graph.act<32>
  %o = graph.matmul @l0_o(%a) on <(1, 0, 5, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<32>
}

// CHECK:      event.flow @l0_qkv.reduce.down kernel @l0_qkv.reduce role "down" wafer 0 from <(1, 0, 5, 3)> to <(1, 1, 5, 3)> pattern "shift" by 0, 1 bytes 80 streams
// CHECK:      event.flow @l0_attn.group.gather.down kernel @l0_attn role "down" wafer 0 from <(1, 0, 1, 4), (3, 0, 1, 4)> to <(2, 0, 1, 4), (4, 0, 1, 4)> pattern "shift" by 1, 0 bytes 128 streams
// CHECK-NEXT: event.flow @l0_attn.group.gather.up kernel @l0_attn role "up" wafer 0 from <(2, 0, 1, 4), (4, 0, 1, 4)> to <(1, 0, 1, 4), (3, 0, 1, 4)> pattern "shift" by -1, 0 bytes 128 streams
// CHECK-NEXT: event.flow @l0_o.reduce.down
// CHECK-NOT:  event.flow @l0_attn

// A group's first column on a row between the column's ends: it sends its units and
// gets the whole head back, attends, sends its partial to its group's other column and
// gets the group's merge back, then sends it down the column.
// CHECK:      event.sub @l0_attn "edge_group_edge" after [@l0_qkv.reduce] demand <colors = 4, iq = 2, oq = 2, {{.*}}> collective {
// CHECK-NEXT:   event.send @l0_attn.group.gather.down bytes 128 meta 0
// CHECK-NEXT:   event.recv @l0_attn.group.gather.up bytes 128 meta 0
// CHECK-NEXT:   event.compute "qk" work 512
// CHECK-NEXT:   event.compute "exp" work 64
// CHECK-NEXT:   event.compute "av" work 512
// CHECK-NEXT:   event.send @l0_attn.group.gather.down bytes 80 meta 0
// CHECK-NEXT:   event.recv @l0_attn.group.gather.up bytes 80 meta 0
// CHECK-NEXT:   event.send @l0_qkv.reduce.down bytes 80 meta 0
// CHECK-NEXT:   event.recv @l0_qkv.reduce.up bytes 80 meta 0
// CHECK-NEXT: }
// The column past the groups joins only the column's merge.
// CHECK:      event.sub @l0_attn "edge_group_idle"
// CHECK-NEXT:   event.compute "qk" work 512
// CHECK-NEXT:   event.compute "exp" work 64
// CHECK-NEXT:   event.compute "av" work 512
// CHECK-NEXT:   event.send @l0_qkv.reduce.down bytes 80 meta 0
// The column's root in a group's last column: completes the gather and relays it back,
// attends, merges its group's partials and relays the merge back, then merges down the
// column and normalizes.
// CHECK:      event.sub @l0_attn "root_group_root"
// CHECK-NEXT:   event.recv @l0_attn.group.gather.down bytes 128 meta 0
// CHECK-NEXT:   event.compute "qkv_gather" work 32
// CHECK-NEXT:   event.send @l0_attn.group.gather.up bytes 128 meta 0
// CHECK-NEXT:   event.compute "qk" work 512
// CHECK-NEXT:   event.compute "exp" work 64
// CHECK-NEXT:   event.compute "av" work 512
// CHECK-NEXT:   event.recv @l0_attn.group.gather.down bytes 80 meta 0
// CHECK-NEXT:   event.compute "group_merge" work 20
// CHECK-NEXT:   event.send @l0_attn.group.gather.up bytes 80 meta 0
// CHECK-NEXT:   event.recv @l0_qkv.reduce.down bytes 80 meta 0
// CHECK-NEXT:   event.compute "softmax_merge" work 20
// CHECK-NEXT:   event.compute "normalize" work 8
// CHECK-NEXT:   event.send @l0_qkv.reduce.up bytes 80 meta 0

// Where roles bind four input queues (wse3): one chain along each whole row into its
// end, segmented by group, relayed back; it takes the route of the o projection's
// chain along the same rows, so the two share one flow (the largest message's bytes).
// ROW:      event.flow @l0_attn.group.gather.down kernel @l0_attn role "down" wafer 0 from <(1, 0, 4, 4)> to <(2, 0, 4, 4)> pattern "shift" by 1, 0 bytes 128 streams
// ROW-NEXT: event.flow @l0_attn.group.gather.up kernel @l0_attn role "up" wafer 0 from <(2, 0, 4, 4)> to <(1, 0, 4, 4)> pattern "shift" by -1, 0 bytes 128 streams
// ROW-NEXT: event.flow @l0_o.reduce.up
// ROW-NOT:  event.flow @l0_o.reduce.down
// ROW:      event.sub @l0_attn "edge_group_mid"
// ROW-NEXT:   event.recv @l0_attn.group.gather.down bytes 128 meta 0
// ROW-NEXT:   event.compute "qkv_gather" work 32
// ROW-NEXT:   event.send @l0_attn.group.gather.down bytes 128 meta 0
// ROW-NEXT:   event.recv @l0_attn.group.gather.up bytes 128 meta 0
// ROW-NEXT:   event.send @l0_attn.group.gather.up bytes 128 meta 0
// ROW-NEXT:   event.compute "qk" work 512
// ROW-NEXT:   event.compute "exp" work 64
// ROW-NEXT:   event.compute "av" work 512
// ROW-NEXT:   event.recv @l0_attn.group.gather.down bytes 80 meta 0
// ROW-NEXT:   event.compute "group_merge" work 20
// ROW-NEXT:   event.send @l0_attn.group.gather.down bytes 80 meta 0
// ROW-NEXT:   event.recv @l0_attn.group.gather.up bytes 80 meta 0
// ROW-NEXT:   event.send @l0_attn.group.gather.up bytes 80 meta 0
// ROW:      event.sub @l0_o.reduce "mid"
// ROW-NEXT:   event.recv @l0_attn.group.gather.down bytes 32
