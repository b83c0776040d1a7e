// RUN: meshrt-opt %s -p synthesize-schedules --split-input-file --verify-diagnostics | filecheck %s

// A region too small for the kernel's tiling: 256 x 256 fp32 weights over
// 4 cores is 64 KiB per core; test32 leaves 8960 bytes.
mesh_kernel.program @m target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 4 : i64} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<256>
  %y = mesh_kernel.gemv @l0.up(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<256> -> !graph.act<256>
}
// CHECK: invalid.mlir:7:3: error: 'mesh_kernel.gemv' op kernel @l0.up role "tile" needs {{[0-9]+}} SRAM bytes per core on region (0, 1, 2, 2), but test32 has 8960: the region is too small for the kernel's tiling

// -----

mesh_kernel.program @m target "no-such-target" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<16>
}
// CHECK: error: 'mesh_kernel.program' op unknown target 'no-such-target': expected one of test16, test32, wse2, wse3 or the path of a target .toml file

// -----

mesh_kernel.program @m target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %a = mesh_kernel.elementwise "add" @a(%b, %b) on <(0, 0, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16>, !graph.act<16> -> !graph.act<16>
  %b = mesh_kernel.elementwise "rmsnorm" @b(%a) on <(0, 0, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK: error: 'mesh_kernel.program' op kernel graph has a cycle: @a -> @b -> @a

// -----

// An activation format meshrt does not have.
mesh_kernel.program @bad target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 2.0 : f64, act_format = "f8"} {
  %x = mesh_kernel.embed @embed on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<16>
  %r = mesh_kernel.allreduce @embed.reduce(%x) on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row"} : !graph.act<16> -> !graph.act<16>
  %n = mesh_kernel.elementwise "rmsnorm" @norm(%r) on <(2, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK: invalid.mlir:29:1: error: 'mesh_kernel.program' op @bad: hparams: act_format must be one of bf16, f16, f32, got 'f8'
