// RUN: meshrt-opt %s -p check-segments | filecheck %s
// RUN: meshrt compile %examples/tiny_dense.mrt --target test32 --emit events | meshrt-opt -p materialize-segments,color-routes,check-segments | filecheck %s --check-prefix=TIGHT
// RUN: meshrt compile %examples/tiny_moe.mrt --target test32 --emit events | meshrt-opt -p materialize-segments,color-routes,check-segments | filecheck %s --check-prefix=TIGHTMOE
// RUN: meshrt compile %examples/tiny_dense.mrt --target wse3 --emit events | meshrt-opt -p materialize-segments,color-routes,check-segments | filecheck %s --check-prefix=ROOMY
// RUN: meshrt compile %examples/tiny_moe.mrt --target wse3 --emit events | meshrt-opt -p materialize-segments,color-routes,check-segments | filecheck %s --check-prefix=ROOMY
// RUN: meshrt compile %examples/tiny_dense.mrt --target wse2 --emit events | meshrt-opt -p materialize-segments,color-routes,check-segments | filecheck %s --check-prefix=WSE2
// RUN: meshrt compile %examples/tiny_moe.mrt --target wse2 --emit events | meshrt-opt -p materialize-segments,color-routes,check-segments | filecheck %s --check-prefix=WSE2MOE

// A correct program (color-routes{colors=1} of ../color-routes/color_split.mlir)
// passes the checker untouched.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK:      segment.program @m
// CHECK:      segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
// CHECK:      segment.route @a color 0 via <(0, 0, 3, 1)>
// CHECK-NEXT: segment.route @b color 0 via <(0, 0, 3, 1)>

// The examples on the tight test32 need several segments in some classes,
// with marker syncs at non-collective boundaries; the checker accepts them.
// TIGHT:      segment.program
// TIGHT:      segment.segment 2
// TIGHT:      segment.marker_sync
// TIGHT:      segment.route
// tiny_moe's corridor and expert classes take two segments at most there.
// TIGHTMOE:      segment.program
// TIGHTMOE:      segment.segment 1
// TIGHTMOE-NOT:  segment.segment 2
// TIGHTMOE:      segment.marker_sync
// TIGHTMOE:      segment.route

// On a WSE-3 every class fits one segment.
// A dense layer's region on a WSE-2 receives on five flows (its input, the
// chains down its columns, which its norm, qkv reduction and attention share,
// and the o projection's chains along its rows), more than the four input
// queues left beside memcpy: it takes two segments, the second holding the
// row reduction of the o projection.
// WSE2:      segment.program
// WSE2:      segment.reconfigure 0 to 1 release [@l0_norm1.in0] install [@l0_o.reduce.down, @l0_o.reduce.up]

// On a WSE-2 every class of tiny_moe's layers fits the four input queues
// left beside memcpy: the corridor's cores receive the dispatch hops and the
// expert outputs of their row (combine has no relay of its own), so no class
// needs a second segment.
// WSE2MOE:      segment.program
// WSE2MOE-NOT:  segment.reconfigure
// WSE2MOE:      segment.route

// ROOMY:      segment.program
// ROOMY-NOT:  segment.reconfigure
// ROOMY-NOT:  segment.marker_sync
// ROOMY:      segment.route
