// RUN: meshrt-opt %s -p 'insert-route-handshakes,check-segments{handshakes=true}' | filecheck %s
// RUN: meshrt-opt %s -p 'insert-route-handshakes,insert-route-handshakes' | filecheck %s
// RUN: meshrt compile %examples/tiny_dense.mrt --target test32 --emit events | meshrt-opt -p 'materialize-segments,color-routes,insert-route-handshakes,check-segments{handshakes=true}' | filecheck %s --check-prefix=DENSE

// insert-route-handshakes (run after color-routes): @b holds @f and @h in
// segment 0 only and @g in segment 1 only, so it notifies what it installs,
// drains what it releases and grants @f and @h at program start (their
// first step's traffic crosses it while the first segment 0 is current);
// every sender of a flow @b takes part in awaits @b's credit on the segment
// of its first send. @c holds everything all step and takes no part. The
// pass is idempotent.
segment.program @race target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @f kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 4096
  event.flow @h kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
  event.flow @g kernel @kb role "input" operand 0 wafer 0 from <(1, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 1, 0 bytes 64
  segment.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] {
      event.sub @ka "src" after [] demand <colors = 2> {
        event.send @h bytes 8 meta 0
        event.send @f bytes 4096 meta 0
      }
    }
  }
  segment.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] {
      event.sub @ka "pass" after [] demand <colors = 2> collective {
        event.recv @h bytes 8 meta 0
        event.compute "add" work 100
      }
    }
    segment.reconfigure 0 to 1 release [@f, @h] install [@g]
    segment.segment 1 use <colors = 1> routes [@g] {
      event.sub @kb "src" after [@ka] demand <colors = 1> collective {
        event.send @g bytes 64 meta 0
      }
    }
    segment.reconfigure 1 to 0 release [@g] install [@f, @h]
  }
  segment.core_class @c wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @g] {
      event.sub @ka "dst" after [] demand <colors = 1> {
        event.recv @f bytes 4096 meta 0
      }
      event.sub @kb "dst" after [@ka] demand <colors = 1> {
        event.recv @g bytes 64 meta 0
      }
    }
  }
  segment.route @f color 0 via <(0, 0, 3, 1)>
  segment.route @h color 1 via <(0, 0, 2, 1)>
  segment.route @g color 2 via <(1, 0, 2, 1)>
}

// CHECK:      segment.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
// CHECK-NEXT:   segment.segment 0 use <colors = 2> routes [@f, @h] await [@b::@f, @b::@h] {
// CHECK:      segment.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
// CHECK-NEXT:   segment.segment 0 use <colors = 2> routes [@f, @h] grant [@f, @h] {
// CHECK:        segment.reconfigure 0 to 1 release [@f, @h] install [@g] notify [@g] drain [@f, @h]
// CHECK-NEXT:   segment.segment 1 use <colors = 1> routes [@g] await [@b::@g] {
// CHECK:        segment.reconfigure 1 to 0 release [@g] install [@f, @h] notify [@f, @h] drain [@g]
// CHECK:      segment.core_class @c wafer 0 cores <(2, 0, 1, 1)> {
// CHECK-NEXT:   segment.segment 0 use <colors = 2> routes [@f, @g] {

// The reduction race of the examples: the first column of layer 0's region
// below its top row (edge of the row reduction of @l0_o.reduce) sends
// .reduce.down only after the install credits of the cores along the row, the
// root column (where the stage's handoff runs) among them, which they send when
// they enter the segment holding it (and their reconfigures drain the flows
// they release).
// DENSE:      segment.core_class @l0_add2.tile.3 wafer
// DENSE:        segment.reconfigure 0 to 1 release [@l0_norm1.in0] install [@l0_o.reduce.down, @l0_o.reduce.up] notify [@l0_o.reduce.down, @l0_o.reduce.up] drain [@l0_norm1.in0]
// DENSE-NEXT:   segment.segment 1 {{.*}} await [{{.*}}@handoff_s1.egress.2::@l0_o.reduce.down{{.*}}] {
// DENSE:      segment.core_class @handoff_s1.egress.2 wafer
// DENSE:        segment.reconfigure 0 to 1 release [@l0_norm1.in0] install [@l0_o.reduce.down, @l0_o.reduce.up] notify [@l0_o.reduce.down, @l0_o.reduce.up] drain [@l0_norm1.in0]
