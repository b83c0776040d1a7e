"""Metainfo resolvers and producers of a class's program (Algorithm 1's injected code).

Continuous batching: the sampler produces (request id, finished?) per slot;
every stage resolves it into its request descriptor table, and the first
stage admits a waiting request (pushed by the host into `req`) into a freed
slot: it feeds the request's first token in place of the sampled one (the
embed's ids are patched as they arrive) and forwards the payload rewritten
to (the request's id, admitted), so every later stage starts the slot's
context at 0 with the same request. MoE routing: the gate produces (expert id << 16 | fp16 weight) per
(token, choice); relays and expert cores resolve it into the routing table
and mark the tokens of their expert region.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.program import ProgramWriter

CF_WORDS_PER_SLOT = 2  # continuous batching: (request id, status) per slot
# status 0: running, 1: finished (the slot is free), ADMITTED: a request the first stage
# admitted into the slot this step (its first token, at position 0)
ADMITTED = 2


class MetaCode:
    """Resolvers and producers of the class's metainfo kinds."""

    def __init__(self, w: ProgramWriter, admits: bool, emits_tokens: bool):
        self.w = w
        self.admits = admits
        self.emits_tokens = emits_tokens

    def lines(self) -> list[str]:
        w = self.w
        out: list[str] = []
        resolves = {e.name for seg in w.cls.segments for e in seg.events() if e.kind == "resolve"}
        produces = {e.name for seg in w.cls.segments for e in seg.events() if e.kind == "produce"}
        if not resolves and not produces:
            return out
        out.append("// ---- metainfo resolvers (before the kernel's compute) and producers")
        b, k = w.b, w.top_k
        if "continuous_batching" in resolves:
            out += [
                "// (request id, status) per slot of the micro-batch: update the RDT; a finished",
                "// request frees its slot" + (", and a waiting request is admitted into it." if self.admits else "."),
                "fn resolve_continuous_batching() void {",
                "  // the micro-batch this step serves, advanced first: the kernels after the",
                "  // resolver read it (from 0, every class's first step serves micro-batch 1)",
                f"  mb[0] = (mb[0] + 1) % {w.groups};",
                f"  for (@range(u16, {b})) |j| {{",
                f"    const slot = @as(u16, mb[0]) * {b} + j;",
                f"    const id = meta_in_continuous_batching[j * {CF_WORDS_PER_SLOT}];",
                f"    const status = meta_in_continuous_batching[j * {CF_WORDS_PER_SLOT} + 1];",
                "    rdt[slot * 4] = @as(i32, id);",
                "    rdt[slot * 4 + 1] = @as(i32, status);",
            ]
            if self.admits:
                out.append("    admit_tok[j] = -1;")
            out += [
                "    if (status == 1) {",
                "      rdt[slot * 4 + 2] = 0; // finished: the slot is free",
            ]
            if self.admits:
                out += [
                    "      if (req[slot * 2] != 0) {",
                    "        // admit the waiting request: its first token is fed instead of the",
                    "        // finished one's, and the stages after this one learn of it from the",
                    "        // payload this stage forwards (status 2: admitted, context 0)",
                    "        rdt[slot * 4] = @as(i32, req[slot * 2]);",
                    "        rdt[slot * 4 + 1] = 0;",
                    "        admit_tok[j] = @as(i32, req[slot * 2 + 1]);",
                    f"        meta_in_continuous_batching[j * {CF_WORDS_PER_SLOT}] = req[slot * 2];",
                    f"        meta_in_continuous_batching[j * {CF_WORDS_PER_SLOT} + 1] = {ADMITTED};",
                    "        req[slot * 2] = 0;",
                    "      }",
                ]
            else:
                out += [
                    f"    }} else if (status == {ADMITTED}) {{",
                    "      rdt[slot * 4 + 1] = 0; // admitted at the first stage: its first token, position 0",
                    "      rdt[slot * 4 + 2] = 0;",
                ]
            out += [
                "    } else {",
                "      rdt[slot * 4 + 2] += 1; // one more token of context",
                "    }",
                "  }",
                "}",
            ]
        if "moe_routing" in resolves:
            out += [
                "// (expert id << 16 | 16-bit gate weight) per (token, choice): fill the routing",
                "// table and mark the tokens whose expert is this core's region.",
                "fn resolve_moe_routing() void {",
                f"  for (@range(u16, {b})) |t| {{",
                "    mine[t] = 0;",
                f"    for (@range(u16, {k})) |c| {{",
                f"      const wv = meta_in_moe_routing[t * {k} + c];",
                f"      rt_expert[t * {k} + c] = @as(i32, wv >> 16);",
                f"      rt_weight[t * {k} + c] = @as(f32, @bitcast({w.sh.half}, @as(u16, wv & 0xffff)));",
                "      if (@as(i16, wv >> 16) == region) {",
                "        mine[t] = 1;",
                "      }",
                "    }",
                "  }",
                "}",
            ]
        if "continuous_batching" in produces:
            n = w.meta_out_words.get("continuous_batching", b * CF_WORDS_PER_SLOT)
            tokens, done = w.token_arrays()
            out += [
                "// The sampler's control-flow payload: (request id, finished?) per slot, from its",
                "// eos_check; it rides the token send back to the first stage. The host reads",
                "// the tokens too.",
                "fn produce_continuous_batching() void {",
                f"  for (@range(u16, {min(b, n // CF_WORDS_PER_SLOT) or 1})) |j| {{",
                f"    const slot = @as(u16, mb[0]) * {b} + j;",
                f"    meta_out_continuous_batching[j * {CF_WORDS_PER_SLOT}] = @as(u32, rdt[slot * 4]);",
                f"    meta_out_continuous_batching[j * {CF_WORDS_PER_SLOT} + 1] = @as(u32, {done}[j]);",
            ]
            if self.emits_tokens:
                out += [
                    "    tok[slot * 2] = @as(u32, rdt[slot * 4]);",
                    f"    tok[slot * 2 + 1] = @as(u32, {tokens}[j]);",
                ]
            out += ["  }", "}"]
        if "moe_routing" in produces:
            out += [
                f"// The gate's routing metainfo: (expert id << 16 | {w.sh.half} weight) per (token, choice),",
                "// prepended to the token data on the dispatch send.",
                "fn produce_moe_routing() void {",
                f"  for (@range(u16, {b * k})) |i| {{",
                f"    const h = @bitcast(u16, @as({w.sh.half}, rt_weight[i]));",
                "    meta_out_moe_routing[i] = (@as(u32, rt_expert[i]) << 16) | @as(u32, h);",
                "  }",
                "}",
            ]
        return out
