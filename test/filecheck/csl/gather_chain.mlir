// RUN: meshrt-opt %s -t csl | filecheck %s

// Several senders on one colour: twelve cores of @s gather into the column
// @r (pattern all). Their streams would interleave wavelet by wavelet where
// they meet, and WSE-3 takes a colour from one input side only, so the senders
// are serialised along a switch chain: a snake through @s (rows alternate, so
// its loops step by two) whose routers forward their predecessor in switch
// position 0 and take their own ramp in position 1; the head multicasts the
// one stream to @r.

segment.program @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.kernel @k "allreduce" on <(0, 0, 4, 4)> inputs [] params {}
  event.flow @g kernel @k role "input" operand 0 wafer 0 from <(0, 0, 3, 4)> to <(3, 0, 1, 4)> pattern "all" bytes 16
  segment.core_class @s wafer 0 cores <(0, 0, 3, 4)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@g] {
      event.sub @k "src" after [] demand <colors = 1, oq = 1> {
        event.send @g bytes 16 meta 0
      }
    }
  }
  segment.core_class @r wafer 0 cores <(3, 0, 1, 4)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@g] {
      event.sub @k "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @g bytes 16 meta 0
        event.compute "add" work 4
      }
    }
  }
  segment.route @g color 0 via <(0, 0, 4, 4)>
}

// CHECK-LABEL: // ----- FILE: layout.csl
// CHECK:       const chain_switches = .{ .pos1 = .{ .rx = RAMP }, .ring_mode = true, .pop_mode = .{ .pop_on_advance = true } };
// CHECK:       // @g: colour 0, pattern all, chain
// CHECK-NEXT:  // 12 senders switch-chained: first (2, 0), head (2, 3)
// Row starts and ends alternate sides: loops over every other row.
// CHECK:       for (@range(i16, 0, 3, 2)) |y| {
// CHECK-NEXT:    @set_color_config(1, y, @get_color(0), .{ .routes = .{ .rx = .{ EAST }, .tx = .{ WEST } }, .switches = chain_switches });
// CHECK:       for (@range(i16, 1, 4, 2)) |y| {
// CHECK-NEXT:    @set_color_config(0, y, @get_color(0), .{ .routes = .{ .rx = .{ NORTH }, .tx = .{ EAST } }, .switches = chain_switches });
// The head feeds the receivers' column; the first sender has no predecessor.
// CHECK:       @set_color_config(2, 3, @get_color(0), .{ .routes = .{ .rx = .{ WEST }, .tx = .{ EAST } }, .switches = chain_switches });
// CHECK:       @set_color_config(2, 0, @get_color(0), .{ .routes = .{ .rx = .{ RAMP }, .tx = .{ WEST } }, .switches = chain_switches });
// One input per router and position everywhere, also on the tree.
// CHECK:       @set_color_config(3, 3, @get_color(0), .{ .routes = .{ .rx = .{ WEST }, .tx = .{ RAMP, NORTH } } });
// CHECK-NOT:   .rx = .{ {{[A-Z]+}}, {{[A-Z]+}} }
// CHECK:       // ---- host-visible symbols

// A sender: its message, then the control wavelet that advances its own router
// (back to forwarding) and the next chain router (to its ramp); the head has no
// next chain router.
// CHECK-LABEL: // ----- FILE: c_s.csl
// CHECK:       //   switch colours        1     6  ids 0 (switch-chained senders)
// CHECK:       const adv_g: u32 = if (px == 2 and py == 3) rt.adv_own else rt.adv_own_next;
// CHECK:       const foc_g_s0 = @get_dsd(fabout_dsd, .{ .extent = 1, .output_queue = oq_{{[0-9]}}, .control = true });
// CHECK:         rt.send_f32(fo_g_s0, m_y_4);
// CHECK:         // [{{[0-9]+}}] @g: advance this router (back to forwarding) and the next chain router (to its own ramp)
// CHECK-NEXT:    if (pc == {{[0-9]+}}) {
// CHECK-NEXT:      @mov32(foc_g_s0, adv_g);

// The receiver takes one message per sender, each into its slot of x.
// CHECK-LABEL: // ----- FILE: c_r.csl
// The receiver adds the 12 messages into its input as their wavelets arrive:
// one message of buffer, not one slot per sender.
// CHECK:       var x = @zeros([4]f32);
// CHECK:       const rt = @import_module("meshrt_rt.csl", .{ {{.*}}.rx_acc = rx_acc{{.*}} });
// CHECK:         // [{{[0-9]+}}] {{.*}}@g: 12 senders serialised by the switch chain; their messages are summed into x as they arrive
// CHECK-NEXT:    if (pc == {{[0-9]+}}) {
// CHECK-NEXT:      @fmovs(m_x_4, 0.0);
// CHECK:         // [{{[0-9]+}}] receive @g: 12 message(s) of 16 B, one per sender
// CHECK:           if (lp_i >= 12) {
// CHECK:           rt.recv_add_f32(m_x_4, fi_g_s0);
// CHECK-NEXT:      lp_i += 1;

// CHECK-LABEL: // ----- FILE: meshrt_rt.csl
// CHECK:       param rx_acc: dsr_src0;
// CHECK:       fn recv_add_f32(dst: mem1d_dsd, src: fabin_dsd) void {
// CHECK-NEXT:    @load_to_dsr(rx_dst, dst);
// CHECK-NEXT:    @load_to_dsr(rx_acc, dst);
// CHECK-NEXT:    @load_to_dsr(rx_src, src, .{ .async = true, .activate = step_id });
// CHECK-NEXT:    @fadds(rx_dst, rx_acc, rx_src);
// CHECK:       const adv_own_next: u32 = ctrl.encode_payload(2, [2]ctrl.opcode{ ctrl.opcode.SWITCH_ADV, ctrl.opcode.SWITCH_ADV }, [2]bool{ true, true }, true, {});
