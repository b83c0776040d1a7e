// RUN: meshrt-opt %s --split-input-file --verify-diagnostics | filecheck %s

// mlir-opt's --verify-diagnostics: every diagnostic is expected by an
// `expected-*` comment on its line, so the run succeeds (exit 0) and prints
// the IR of the chunks without errors, separated by `// -----`.

// @+N: N lines below the comment.
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  // expected-error @+1 {{'graph.embed' op kernel @embed: stage 3 is not in 0..0}}
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 3 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}

// -----

// @-N: N lines above; a part of the message is enough.
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 20, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  // expected-error @-1 {{outside the 16 x 16 mesh}}
}

// -----

// No designator: the diagnostic is on the comment's own line.
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 3 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64} : !graph.act<16> -> !graph.act<12> // expected-error {{heads 3 is not a multiple of kv_heads 2}}
}

// -----

// @N: an absolute line of the file; -re: {{regex}} parts.
// expected-error-re @35 {{kernel @attn: input (q, k, v) has width {{[0-9]+}}, expected 24}}
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
  %q = graph.attention @attn(%x) on <(0, 1, 2, 2)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, heads = 2 : i64, kv_heads = 2 : i64, head_dim = 4 : i64, max_seq = 8 : i64} : !graph.act<16> -> !graph.act<8>
}

// -----

// A parse error, and @below (the next line).
graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  // expected-error @below {{'graph.bogus' is not registered}}
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.bogus<16>
}

// -----

// A chunk without errors is printed.
graph.model @ok target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>
}

// CHECK:      // -----
// CHECK-NEXT: // -----
// CHECK-NEXT: // -----
// CHECK-NEXT: // -----
// CHECK-NEXT: // -----
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   graph.model @ok target "t"
// CHECK-NOT:  error
