"""Metainfo resolvers and producers of a class's program (Algorithm 1's injected code).

Continuous batching: the sampler produces (request id, EOS?) per slot; the
first stage decides whether the request is done (an EOS once its prompt is fed,
which the host's `prm_have` says, or the position of its last output, which the
stage keeps in its RDT's fourth word), frees the slot and admits a waiting
request (pushed by the host into `req`) into it: it feeds the request's tokens
in place of the sampled ones while its prompt lasts (the first from `req`, the
rest from the ring `prm` the host keeps filled; a slot whose next prompt token
the host has not written yet pauses a step) and forwards the payload rewritten
to (the request's id, its status this step), so every later stage keeps the
slot's context with it. MoE routing: the gate produces, per (token, choice),
the expert id (i32) and its gate weight (f32 bits): two words, the routing
table's entries as the gate's body computed them; relays and expert cores
resolve it into their routing table and mark the tokens of their expert region.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrt.kernels.interface import ROUTE_BYTES_PER_CHOICE

if TYPE_CHECKING:
    from meshrt.backend.csl.program import ProgramWriter

CF_WORDS_PER_SLOT = 2  # continuous batching: (request id, status) per slot
# MoE routing: (expert id, gate weight's bits) per (token, choice)
ROUTE_WORDS_PER_CHOICE = ROUTE_BYTES_PER_CHOICE // 4
# status 0: running, 1: finished (the slot is free), ADMITTED: a request the first stage
# admitted into the slot this step (its first token, at position 0), PAUSED: the slot
# waits for its next prompt token (no stage moves its context)
RUNNING, FREE, ADMITTED, PAUSED = 0, 1, 2, 3
# The first stage's request arrays (the host's side: `meshrt.backend.csl.host`), words a slot:
REQ_WORDS = 4  # req: a waiting request: handle (0: none), prompt length, output budget, first token
HAVE_WORDS = 2  # prm_have: the ring holds the prompt below this position (| PROMPT_DONE), whose handle
PROMPT_DONE = 1 << 30  # in prm_have: the prompt ends at that position (no later prompt token)
PROMPT_RING = 8  # prm: prompt token p of the slot's request at p mod the ring's depth: at most
# this deep, less where the first stage's SRAM does not leave room (`ProgramWriter.prompt_ring`)
TOK_WORDS = 3  # tok (the sampler's, for the host): request handle, position fed, token sampled
TOKEN_RING = 8  # tok: a slot's sample at position p in entry p mod the ring's depth, so a host
# reading every few steps misses none: at most this deep, less where the sampler's SRAM does
# not leave room (`ProgramWriter.fit_rings`)


def request_words(admits: bool, emits_tokens: bool, ring: int, tok_ring: int) -> int:
    """32-bit words a request slot takes in a class's request arrays: the first stage's
    (`admits`: req, prm of depth `ring`, prm_have), the sampler's (`emits_tokens`: tok of
    depth `tok_ring`)."""
    return (REQ_WORDS + ring + HAVE_WORDS if admits else 0) + (TOK_WORDS * tok_ring if emits_tokens else 0)


class MetaCode:
    """Resolvers and producers of the class's metainfo kinds."""

    def __init__(self, w: ProgramWriter):
        self.w = w
        self.admits = w.admits
        self.emits_tokens = w.emits_tokens

    def _head(self, b: int) -> list[str]:
        w = self.w
        return [
            "  // the micro-batch this step serves, advanced first: the kernels after the",
            "  // resolver read it (from 0, every class's first step serves micro-batch 1)",
            f"  mb[0] = (mb[0] + 1) % {w.groups};",
            f"  for (@range(u16, {b})) |j| {{",
            f"    const slot = @as(u16, mb[0]) * {b} + j;",
        ]

    def first_stage(self, b: int) -> list[str]:
        """The first stage's resolver: it owns the request lifecycle (see the module)."""
        c, p, hw = CF_WORDS_PER_SLOT, self.w.prompt_ring, HAVE_WORDS
        return [
            "// The sampler's (request id, EOS?) per slot of the micro-batch: the request that",
            "// step served is done on an EOS past its prompt, or after its last output; a free",
            "// slot admits a waiting request; a live one is fed its next prompt token (or the",
            "// sampled one's ids arrive), or pauses while the host has not written it.",
            "fn resolve_continuous_batching() void {",
            *self._head(b),
            f"    const eos = meta_in_continuous_batching[j * {c} + 1];",
            "    var status = rdt[slot * 4 + 1];",
            "    var pos = rdt[slot * 4 + 2];",
            "    // the host's ring holds this request's prompt below `have` (and says where it ends)",
            f"    const mine = prm_have[slot * {hw} + 1] == rdt[slot * 4];",
            f"    const have = prm_have[slot * {hw}] & {PROMPT_DONE - 1};",
            f"    const ended = mine and (prm_have[slot * {hw}] & {PROMPT_DONE}) != 0;",
            "    admit_tok[j] = -1;",
            f"    if (rdt[slot * 4] != 0 and status == {RUNNING}) {{",
            "      if ((eos == 1 and ended and pos + 1 >= have) or pos >= rdt[slot * 4 + 3]) {",
            "        rdt[slot * 4] = 0; // done: the slot is free",
            "      }",
            "    }",
            "    if (rdt[slot * 4] == 0) {",
            f"      status = {FREE};",
            "      pos = 0;",
            f"      if (req[slot * {REQ_WORDS}] != 0) {{",
            "        // admit the waiting request: its first token is fed instead of the",
            "        // finished one's, and the stages after this one learn of it from the",
            "        // payload this stage forwards (admitted: context 0)",
            f"        rdt[slot * 4] = @as(i32, req[slot * {REQ_WORDS}]);",
            f"        rdt[slot * 4 + 3] = @as(i32, req[slot * {REQ_WORDS} + 1] + req[slot * {REQ_WORDS} + 2]) - 2;",
            f"        admit_tok[j] = @as(i32, req[slot * {REQ_WORDS} + 3]);",
            f"        status = {ADMITTED};",
            f"        req[slot * {REQ_WORDS}] = 0;",
            "      }",
            "    } else {",
            "      const next = pos + 1;",
            f"      status = {RUNNING};",
            "      if (mine and next < have) { // a prompt token: from the ring",
            f"        admit_tok[j] = prm[slot * {p} + @as(u16, next) % {p}];",
            "      } else if (!ended) {",
            f"        status = {PAUSED}; // the host has not written it yet: the slot idles this step",
            "      }",
            f"      if (status == {RUNNING}) {{",
            "        pos = next;",
            "      }",
            "    }",
            f"    rdt[slot * 4 + 1] = if (status == {ADMITTED}) {RUNNING} else status;",
            "    rdt[slot * 4 + 2] = pos;",
            f"    meta_in_continuous_batching[j * {c}] = @as(u32, rdt[slot * 4]);",
            f"    meta_in_continuous_batching[j * {c} + 1] = @as(u32, status);",
            "  }",
            "}",
        ]

    def later_stage(self, b: int) -> list[str]:
        """A later stage's resolver: the first stage's verdict, as it forwarded it."""
        c = CF_WORDS_PER_SLOT
        return [
            "// (request id, status) per slot of the micro-batch, as the first stage forwarded it:",
            "// update the RDT (a free slot, an admitted request at context 0, a running one a",
            "// token further, a paused one where it was).",
            "fn resolve_continuous_batching() void {",
            *self._head(b),
            f"    const status = meta_in_continuous_batching[j * {c} + 1];",
            f"    rdt[slot * 4] = @as(i32, meta_in_continuous_batching[j * {c}]);",
            "    rdt[slot * 4 + 1] = @as(i32, status);",
            f"    if (status == {FREE} or status == {ADMITTED}) {{",
            "      rdt[slot * 4 + 2] = 0;",
            f"      rdt[slot * 4 + 1] = if (status == {ADMITTED}) {RUNNING} else {FREE};",
            f"    }} else if (status == {RUNNING}) {{",
            "      rdt[slot * 4 + 2] += 1; // one more token of context",
            "    }",
            "  }",
            "}",
        ]

    def lines(self) -> list[str]:
        w = self.w
        out: list[str] = []
        resolves = {e.name for seg in w.cls.segments for e in seg.events() if e.kind == "resolve"}
        produces = {e.name for seg in w.cls.segments for e in seg.events() if e.kind == "produce"}
        if not resolves and not produces:
            return out
        out.append("// ---- metainfo resolvers (before the kernel's compute) and producers")
        b, k = w.b, w.choices
        if "continuous_batching" in resolves:
            out += self.first_stage(b) if self.admits else self.later_stage(b)
        if "moe_routing" in resolves:
            n = ROUTE_WORDS_PER_CHOICE
            held = w.experts_held()
            out += [
                "// (expert id, gate weight) per (token, choice), 32 bits each: fill the routing",
                "// table" + (" and mark the tokens that chose an expert this core's region holds" if held
                              else "") + ".",
                "fn resolve_moe_routing() void {",
                f"  for (@range(u16, {b})) |t| {{",
                *(["    mine[t] = 0;"] if held else []),
                f"    for (@range(u16, {k})) |c| {{",
                f"      const i = t * {k} + c;",
                f"      rt_expert[i] = @bitcast(i32, meta_in_moe_routing[i * {n}]);",
                f"      rt_weight[i] = @bitcast(f32, meta_in_moe_routing[i * {n} + 1]);",
            ]
            if held:  # a shared expert's region (ids past the routed experts) takes every token
                rs, table, here = held
                out += [
                    f"      if (rt_expert[i] >= {rs.experts}) {{",
                    f"        if (rt_expert[i] - {rs.experts} == @as(i32, {here} - {rs.routed_regions})) {{",
                    "          mine[t] = 1;",
                    "        }",
                    f"      }} else if ({table}[@as(u16, rt_expert[i])] == {here}) {{",
                    "        mine[t] = 1;",
                    "      }",
                ]
            out += ["    }", "  }", "}"]
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
                d = w.token_ring
                out += [
                    f"    if (rdt[slot * 4 + 1] == {RUNNING}) {{ // (a paused or free slot sampled nothing)",
                    f"      // the sample at position p in the slot's entry p mod {d}",
                    f"      const e = (@as(u32, slot) * {d} + @as(u32, rdt[slot * 4 + 2]) % {d}) * {TOK_WORDS};",
                    "      tok[e] = @as(u32, rdt[slot * 4]);",
                    "      tok[e + 1] = @as(u32, rdt[slot * 4 + 2]);",
                    f"      tok[e + 2] = @as(u32, {tokens}[j]);",
                    "    }",
                ]
            out += ["  }", "}"]
        if "moe_routing" in produces:
            n = ROUTE_WORDS_PER_CHOICE
            out += [
                "// The gate's routing metainfo: (expert id, gate weight) per (token, choice), the",
                "// routing table's words as they are, prepended to the token data on the dispatch send.",
                "fn produce_moe_routing() void {",
                f"  for (@range(u16, {b * k})) |i| {{",
                f"    meta_out_moe_routing[i * {n}] = @bitcast(u32, rt_expert[i]);",
                f"    meta_out_moe_routing[i * {n} + 1] = @bitcast(u32, rt_weight[i]);",
                "  }",
                "}",
            ]
        return out
