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
        "param tx_dst: dsr_dest; // DSR pair of sends",
        "param tx_src: dsr_src1;",
        "",
        'const tile_config = @import_module("<tile_config>");',
        "",
        "// Transfers: the fabric DSD is loaded with .async; its completion activates step_id.",
        "// One wavelet per element (f32 or f16) or per 32-bit metainfo word.",
    ]
    for name, op in (("recv_f32", "@fmovs"), ("recv_f16", "@fmovh"), ("recv_words", "@mov32")):
        out += [f"fn {name}(dst: mem1d_dsd, src: fabin_dsd) void {{",
                "  @load_to_dsr(rx_dst, dst);",
                "  @load_to_dsr(rx_src, src, .{ .async = true, .activate = step_id });",
                f"  {op}(rx_dst, rx_src);", "}"]
    for name, op in (("send_f32", "@fmovs"), ("send_f16", "@fmovh"), ("send_words", "@mov32")):
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
        "// Run-time route change of this core's own router. Config word: rx bits RAMP 0x200,",
        "// N 0x100, S 0x080, E 0x040, W 0x020; tx bits RAMP 0x010, N 0x008, S 0x004, E 0x002,",
        "// W 0x001 (the upper, non-routing bits are kept).",
        "fn set_route(comptime c: color, io: u16) void {",
        "  const addr = tile_config.color_config.get_color_config_addr(c);",
        "  @set_config(addr, (@get_config(addr) & 0xfc00) | io);",
        "}",
        "",
        "// Queue <-> colour bindings are comptime (@initialize_queue); a segment boundary that",
        "// hands a drained queue to another colour rewrites the binding. ASSUMPTION",
        "// (unchecked, see docs/csl-backend.md): the colour is the low 5 bits of the queue's",
        "// configuration word.",
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


def idle_program() -> str:
    return "\n".join([
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
        "",
        "fn start() void {",
        "  sys_mod.unblock_cmd_stream();",
        "}",
        "",
        "comptime {",
        "  @export_symbol(start);",
        "}",
        "",
    ])
