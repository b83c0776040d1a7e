// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules --split-input-file | filecheck %s

// Two expert regions of four experts each (8 experts, top-2, micro-batch 2).
// A region computes its step's (token, expert) pairs two at a time (a pass:
// the column reduction of x . W_gate|up, silu * up at the root, the relay
// back, the local down projection), so its partials and activations are
// buffered for one token set: with routing a region gets at most
// 2 slots x min(4, top-2) = 4 pairs, two passes.
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {dtype_bytes = 4 : i64, top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<8, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 4)>, #mesh.cores<(6, 0, 2, 4)>], placement = array<i64: 0, 0, 0, 0, 1, 1, 1, 1>} : !graph.act<32>, !graph.routing<8, 2> -> !graph.act<32>
}

// A pass's chain message is 2 pairs x (gate | up) x the column's 8-wide slice
// of fp32, its relay back the activations (half that); the output partials of all 4 pairs
// (8 rows each) go on to expert_reduce in one message.
// CHECK:      event.flow @l0.moe.experts.down kernel @l0.moe.experts role "down" wafer 0 from <{{.*}}> to <{{.*}}> pattern "shift" by 0, 1 bytes 128 streams
// CHECK:      event.flow @l0.moe.reduce.down_r kernel @l0.moe.reduce role "down" {{.*}} bytes 128 streams
// CHECK:      event.sub @l0.moe.experts "edge"
// CHECK-NEXT:   event.meta_resolve "moe_routing"
// CHECK-NEXT:   event.recv @l0.moe.experts.in0
// CHECK-NEXT:   event.compute "fmac" work 256
// CHECK-NEXT:   event.send @l0.moe.experts.down bytes 128
// CHECK-NEXT:   event.recv @l0.moe.experts.up bytes 64
// CHECK-NEXT:   event.compute "fmac_down" work 128
// CHECK-NEXT:   event.compute "fmac" work 256
// CHECK-NEXT:   event.send @l0.moe.experts.down bytes 128
// CHECK-NEXT:   event.recv @l0.moe.experts.up bytes 64
// CHECK-NEXT:   event.compute "fmac_down" work 128
// CHECK-NEXT: }

// -----

// The same regions without routing (the static build): every token on every
// expert of the region, 2 x 4 pairs, four passes of the same size; the
// buffers stay those of one pass, only the output partials grow (8 pairs).
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [] hparams {dtype_bytes = 4 : i64, top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<8, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 4)>, #mesh.cores<(6, 0, 2, 4)>], placement = array<i64: 0, 0, 0, 0, 1, 1, 1, 1>} : !graph.act<32>, !graph.routing<8, 2> -> !graph.act<32>
}

// CHECK:      event.flow @l0.moe.experts.down kernel @l0.moe.experts role "down" wafer 0 from <{{.*}}> to <{{.*}}> pattern "shift" by 0, 1 bytes 128 streams
// CHECK:      event.flow @l0.moe.reduce.down_r kernel @l0.moe.reduce role "down" {{.*}} bytes 256 streams
// CHECK:      event.sub @l0.moe.experts "edge"
// CHECK-NEXT:   event.recv @l0.moe.experts.in0
// CHECK-COUNT-4: event.compute "fmac" work 256
// CHECK-NOT:    event.compute "fmac" work 256
// CHECK:      }
