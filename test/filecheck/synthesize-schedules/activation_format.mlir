// RUN: meshrt-opt %s -p synthesize-schedules --split-input-file | filecheck %s

// Activations travel in the model's format (meshrt/activations.py): 16-bit weights,
// bf16 values, 2 bytes each. The norm's rows take 4 of the 16 values each from the
// embedding's reduced vector: 8 bytes. The norm's own partial sum (of squares)
// stays fp32: 4 bytes.
mesh_kernel.program @bf16 target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 2.0 : f64} {
  %x = mesh_kernel.embed @embed on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<16>
  %r = mesh_kernel.allreduce @embed.reduce(%x) on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row"} : !graph.act<16> -> !graph.act<16>
  %n = mesh_kernel.elementwise "rmsnorm" @norm(%r) on <(2, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK-LABEL: event.schedule @bf16
// CHECK:       event.flow @norm.down {{.*}} bytes 4 streams
// CHECK:       event.flow @norm.in0 {{.*}} pattern "row" bytes 8

// -----

// A float16 checkpoint's activations are f16: the same 2 bytes.
mesh_kernel.program @f16 target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 2.0 : f64, act_format = "f16"} {
  %x = mesh_kernel.embed @embed on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<16>
  %r = mesh_kernel.allreduce @embed.reduce(%x) on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row"} : !graph.act<16> -> !graph.act<16>
  %n = mesh_kernel.elementwise "rmsnorm" @norm(%r) on <(2, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK-LABEL: event.schedule @f16
// CHECK:       event.flow @norm.in0 {{.*}} pattern "row" bytes 8

// -----

// fp32 activations beside 16-bit weights, when asked for: 4 bytes a value.
mesh_kernel.program @f32 target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 2.0 : f64, act_format = "f32"} {
  %x = mesh_kernel.embed @embed on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<16>
  %r = mesh_kernel.allreduce @embed.reduce(%x) on <(0, 0, 1, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row"} : !graph.act<16> -> !graph.act<16>
  %n = mesh_kernel.elementwise "rmsnorm" @norm(%r) on <(2, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK-LABEL: event.schedule @f32
// CHECK:       event.flow @norm.in0 {{.*}} pattern "row" bytes 16
