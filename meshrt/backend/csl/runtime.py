"""Fixed CSL files: the helpers module every program imports, the idle program."""

from __future__ import annotations


def runtime_module() -> str:
    """meshrt_rt.csl: the helpers every program of a directory imports."""
    out = [
        "// meshrt CSL backend: helpers every core class's program imports (meshrt_rt.csl).",
        "// Generated; checked for CSL syntax (meshrt csl-lint), not compiled by cslc.",
        "",
        "param step_id: local_task_id; // re-activated when an asynchronous transfer completes",
        "param rx_dst: dsr_dest; // DSR pair of receives (explicitly allocated per program)",
        "param rx_src: dsr_src1;",
        "param rx_acc: dsr_src0; // the running sum of a receive that adds (recv_add_*)",
        "param tx_dst: dsr_dest; // DSR pair of sends",
        "param tx_src: dsr_src1;",
        "",
        'const tile_config = @import_module("<tile_config>");',
        'const ctrl = @import_module("<control>");',
        "",
        "// Transfers: the fabric DSD is loaded with .async; its completion activates step_id.",
        "// One wavelet per element (f32, or the 16-bit format cslc --fp16-format selects: fp16)",
        "// or per 32-bit metainfo word.",
    ]
    for name, op in (("recv_f32", "@fmovs"), ("recv_fp16", "@fmovh"), ("recv_words", "@mov32")):
        out += [f"fn {name}(dst: mem1d_dsd, src: fabin_dsd) void {{",
                "  @load_to_dsr(rx_dst, dst);",
                "  @load_to_dsr(rx_src, src, .{ .async = true, .activate = step_id });",
                f"  {op}(rx_dst, rx_src);", "}"]
    out += ["// Receives that add the message to dst as its wavelets arrive (the gathers and",
            "// relays that sum their senders' contributions)."]
    for name, op in (("recv_add_f32", "@fadds"), ("recv_add_fp16", "@faddh")):
        out += [f"fn {name}(dst: mem1d_dsd, src: fabin_dsd) void {{",
                "  @load_to_dsr(rx_dst, dst);",
                "  @load_to_dsr(rx_acc, dst);",
                "  @load_to_dsr(rx_src, src, .{ .async = true, .activate = step_id });",
                f"  {op}(rx_dst, rx_acc, rx_src);", "}"]
    for name, op in (("send_f32", "@fmovs"), ("send_fp16", "@fmovh"), ("send_words", "@mov32")):
        out += [f"fn {name}(dst: fabout_dsd, src: mem1d_dsd) void {{",
                "  @load_to_dsr(tx_dst, dst, .{ .async = true, .activate = step_id });",
                "  @load_to_dsr(tx_src, src);",
                f"  {op}(tx_dst, tx_src);", "}"]
    out += [
        "fn copy_words(dst: [*]u32, src: [*]u32, n: u16) void {",
        "  for (@range(u16, n)) |i| {",
        "    dst[i] = src[i];",
        "  }",
        "}",
        "",
        "// Control-wavelet payloads (<control> library, SDK docs): none reaches a CE (ce_ignore).",
        "// A switch-chained sender ends its message with adv_own_next: command 0 is taken by its",
        "// own router (back to forwarding its predecessor), command 1 by the next chain router",
        "// (to its own ramp); the chain's head has no next chain router and sends adv_own.",
        "const adv_own: u32 = ctrl.encode_single_payload(ctrl.opcode.SWITCH_ADV, true, {}, 0);",
        "const adv_own_next: u32 = ctrl.encode_payload(2, [2]ctrl.opcode{ ctrl.opcode.SWITCH_ADV, "
        "ctrl.opcode.SWITCH_ADV }, [2]bool{ true, true }, true, {});",
        "// End of flow: a teardown wavelet behind a sender's last message of a drained flow;",
        "// every router it passes enters teardown for the colour (its teardown handler counts it).",
        "const end_of_flow: u32 = ctrl.encode_single_payload(ctrl.opcode.TEARDOWN, true, {}, 0);",
        "",
        "// Clear every input and output direction of colour c at this router (a released",
        "// route no drain froze): <tile_config>'s color_config.clear_io_direction.",
        "fn clear_routes(c: color) void {",
        *(f"  tile_config.color_config.clear_io_direction(c, tile_config.color_config.fabric_io.{d});"
          for d in ("TX_WEST", "TX_EAST", "TX_SOUTH", "TX_NORTH", "TX_RAMP",
                    "RX_WEST", "RX_EAST", "RX_SOUTH", "RX_NORTH", "RX_RAMP")),
        "}",
        "",
        "// wse3 only: a segment boundary that hands a drained queue to another colour rewrites",
        "// the binding. UNVERIFIED: the SDK documents no run-time queue binding; the register",
        "// address (tile_config.addresses.INPUT_QUEUE_CONFIG / OUTPUT_QUEUE_CONFIG) and the colour",
        "// in its low 5 bits are assumptions (docs/csl-backend.md). wse2 needs none: there the",
        "// fabric DSD names the colour.",
        "fn rebind_input_queue(comptime q: u16, comptime c: u16) void {",
        "  const addr = tile_config.addresses.INPUT_QUEUE_CONFIG + q * tile_config.word_size;",
        "  @set_config(addr, (@get_config(addr) & 0xffe0) | c);",
        "}",
        "fn rebind_output_queue(comptime q: u16, comptime c: u16) void {",
        "  const addr = tile_config.addresses.OUTPUT_QUEUE_CONFIG + q * tile_config.word_size;",
        "  @set_config(addr, (@get_config(addr) & 0xffe0) | c);",
        "}",
    ]
    return "\n".join(out) + "\n"


def idle_program(td_colors: list[int] | None = None) -> str:
    """idle.csl: memcpy, pass-through routes, and a teardown handler per colour
    whose end-of-flow teardowns pass idle routers (they only let it run on)."""
    td_colors = sorted(td_colors or [])
    out = [
        "// meshrt CSL backend: program of the cores no core class uses.",
        "// They run memcpy (it routes through every core of the rectangle) and route the",
        "// flows that pass through them; their routers are configured by the layout.",
        "",
        "param memcpy_params: comptime_struct;",
        "param px: i16;",
        "param py: i16;",
        "param region: i16;",
        "",
        'const sys_mod = @import_module("<memcpy/memcpy>", memcpy_params);',
    ]
    if td_colors:
        out.append('const tc = @import_module("<tile_config>");')
    out += ["", "fn start() void {", "  sys_mod.unblock_cmd_stream();", "}", ""]
    for c in td_colors:
        out += [f"// colour {c}: an end-of-flow teardown passed; let the colour run on",
                f"fn td_{c}() void {{", f"  tc.teardown.exit(@get_color({c}));", "}", ""]
    out += ["comptime {", "  @export_symbol(start);"]
    for c in td_colors:
        out.append(f"  @set_teardown_handler(td_{c}, @get_color({c}));")
    out += ["}", ""]
    return "\n".join(out)
