// RUN: not meshrt-opt %s --split-input-file 2>%t.err | filecheck %s
// RUN: filecheck %s --check-prefix=ERR --input-file=%t.err

// --split-input-file goes on after a failing chunk: every chunk is processed,
// each failure is reported at its line in the file (stderr), the outputs are
// separated by `// -----`, and the exit code is 1 when any chunk failed.

graph.model @first target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 3 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// ERR: split_input_file.mlir:9:3: error: 'graph.embed' op kernel @embed: stage 3 is not in 0..0

// -----
graph.model @second target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}

// -----
graph.model @third target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.bogus<16>
}
// ERR-NEXT: split_input_file.mlir:20:129: error: 'graph.bogus' is not registered

// -----
graph.model @fourth target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 20, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// ERR-NEXT: split_input_file.mlir:26:3: error: 'graph.embed' op kernel @embed: region (0, 0, 20, 1) spans columns 0..19 and rows 0..0, outside the 16 x 16 mesh
// ERR-NOT: error

// -----
// An empty chunk is an empty module, as in mlir-opt.

// CHECK:      // -----
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   graph.model @second
// CHECK:      // -----
// CHECK-NEXT: // -----
// CHECK-NEXT: // -----
// CHECK-NEXT: builtin.module {
// CHECK-NEXT: }
// CHECK-NOT:  graph.model
