// RUN: echo old > %t && not meshrt-opt %s --split-input-file --verify-diagnostics -o %t 2>&1 | filecheck %s
// RUN: filecheck %s --check-prefix=OUT --input-file=%t

// With `expected-*` comments, --verify-diagnostics fails (exit 1) on every
// expectation that was not produced and every diagnostic that was not
// expected, each one located line on stderr, and goes on with the next chunk.

// The error is on another line than expected.
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  // expected-error @+2 {{stage 3 is not in 0..0}}
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 3 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// CHECK: verify_diagnostics_invalid.mlir:11:3: error: unexpected error: 'graph.embed' op kernel @embed: stage 3 is not in 0..0
// CHECK-NEXT: verify_diagnostics_invalid.mlir:10:6: error: expected error "stage 3 is not in 0..0" was not produced

// -----

// Another message than expected.
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  // expected-error @+1 {{stage 4 is not in 0..0}}
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 3 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// CHECK-NEXT: verify_diagnostics_invalid.mlir:21:3: error: unexpected error: 'graph.embed' op kernel @embed: stage 3 is not in 0..0
// CHECK-NEXT: verify_diagnostics_invalid.mlir:20:6: error: expected error "stage 4 is not in 0..0" was not produced

// -----

// No error at all; a warning and a note are expected alike (meshrt emits
// neither today).
graph.model @ok target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  // expected-warning @+2 {{a warning}}
  // expected-note @+1 {{a note}}
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// CHECK-NEXT: verify_diagnostics_invalid.mlir:31:6: error: expected warning "a warning" was not produced
// CHECK-NEXT: verify_diagnostics_invalid.mlir:32:6: error: expected note "a note" was not produced
// (this chunk transforms fine, but the run fails: -o keeps its old content)

// -----

// An error in a chunk that expects none.
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 20, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}
// CHECK-NEXT: verify_diagnostics_invalid.mlir:43:3: error: unexpected error: 'graph.embed' op kernel @embed: region (0, 0, 20, 1) spans columns 0..19 and rows 0..0, outside the 16 x 16 mesh
// CHECK-NOT: error

// A failed run leaves -o as it was (outputs are replaced only on success).
// OUT: old
// OUT-NOT: graph.model
