// RUN: meshrt-opt %s -p synthesize-schedules --split-input-file | filecheck %s

// A GEMV whose weights are stored as fp8 (e4m3, a scale per 16 x 16 block) decodes
// its tile where it computes: a dequant_fp8 of the tile's 4 x 4 weights before
// the fmac. Its tile is 16 weights at fp8's 1 + 4 / 256 bytes (a code each, a 4-byte
// scale per 256): 16 bytes, 16 fewer than the 16-bit weights below take (sram counts
// the input and output buffers too).
mesh_kernel.program @fp8 target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 2.0 : f64, linear_quant = "fp8", quant_block_in = 16 : i64, quant_block_out = 16 : i64} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<16>
  %g = mesh_kernel.gemv @g(%x) on <(0, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, weights = "fp8"} : !graph.act<16> -> !graph.act<16>
}
// CHECK-LABEL: event.kernel @g "gemv" on <(0, 0, 4, 4)> inputs [@embed] params {{.*}}weights = "fp8"
// CHECK:       event.sub @g "tile" after [@embed] demand <{{.*}}sram = 32>
// CHECK-NEXT:    event.recv
// CHECK-NEXT:    event.compute "dequant_fp8" work 16
// CHECK-NEXT:    event.compute "fmac" work 16

// -----

// The same GEMV with 16-bit weights has no dequant.
mesh_kernel.program @plain target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 2.0 : f64} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<16>
  %g = mesh_kernel.gemv @g(%x) on <(0, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
}
// CHECK-LABEL: event.kernel @g "gemv"
// CHECK:       event.sub @g "tile" after [@embed] demand <{{.*}}sram = 48>
// CHECK-NOT:     dequant
// CHECK:         event.compute "fmac" work 16
