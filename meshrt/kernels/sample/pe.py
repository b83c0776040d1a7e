"""The sample kernel's compute bodies at the PE-program level (see meshrt.kernels.pe).

The logits are split over the w columns of the sampler's row: the core in
column i holds entries [i * n, (i + 1) * n) of the vocabulary (n = ceil(V /
w), fewer on the last), `x` slot by slot (B slots); its column is its `px`
less the tile's first column. A candidate is two 32-bit words per slot in
`cand`: the logit's bits (`@bitcast`) and its token id (i32), so a candidate
travels as one message of words and the id is exact for any vocabulary.

- argmax:       cand[j] = (largest valid logit of slot j, its id); the first
                of equal ones (a strict `>` in vocabulary order), as
                `np.argmax` takes it
- argmax_merge: keep, per slot, the larger of cand and cand_in (a
                neighbour's, received); of equal logits the lower id
- eos_check:    tokens[j] = cand[j]'s id; done[j] = 1 where it is one of the
                model's EOS tokens
"""

from __future__ import annotations

from xdsl.dialects.builtin import IndexType, f32, i32

from meshrt.kernels.pe import Bodies, Body, Buffer, activation_elem

LOWEST = -3.4028234663852886e38  # the lowest float32: any logit beats a core's empty candidate


def eos_tokens(hp) -> tuple[int, ...]:
    """The model's end-of-sequence token ids (none: only a request's length ends it)."""
    eos = hp.int("eos_token", -1)
    return () if eos < 0 else (eos, *hp.ints("eos_more"))


def bodies_for(info, micro_batch: int, hp, tile: tuple[int, int, int, int]) -> Bodies:
    vocab = info.param("in_widths")[0]
    ends = eos_tokens(hp)
    return sample_bodies(info.kernel_name, micro_batch, vocab, tile[0], tile[2], ends,
                         activation_elem(hp.act_format))


def sample_bodies(kernel: str, b: int, vocab: int, x0: int, w: int, ends: tuple[int, ...],
                  elem: str = "f32") -> Bodies:
    """The bodies of sampler `kernel`: `b` slots, vocabulary `vocab` over the `w` columns
    from mesh column `x0`; `ends`: the EOS token ids (none: only a request's length
    ends it); `elem`: the logits' type (the program's activations: a 16-bit logit is
    compared as its exact float32 value, without a float32 copy of them all)."""
    n = -(-vocab // w)
    out = Bodies(kernel, [Buffer("x", b * n, elem), Buffer("cand", 2 * b, "i32"), Buffer("cand_in", 2 * b, "i32"),
                          Buffer("tokens", b, "i32"), Buffer("done", b, "i32")])

    body = out.body("argmax")
    # this core's first token id: its column of the row times n
    px = body.param("px")
    first = body.mul(body.cast(body.subi(px, body.const(x0, px.type)), IndexType()), n)

    def slot(bd: Body, j) -> None:
        def step(bd2: Body, i, best, at):
            tok = bd2.add(first, i)
            v = bd2.widen(bd2.load("x", bd2.add(bd2.mul(j, n), i)))
            take = bd2.both(bd2.cmpi(tok, bd2.const(vocab), "slt"), bd2.cmpf(v, best, "ogt"))
            return [bd2.select(take, v, best), bd2.select(take, bd2.cast(tok, i32), at)]

        best, at = bd.fold(n, [bd.scalar(LOWEST), bd.cast(first, i32)], step)
        bd.store(bd.bitcast(best, i32), "cand", bd.mul(j, 2))
        bd.store(at, "cand", bd.plus(bd.mul(j, 2), 1))

    body.each(b, slot)
    out.add("argmax", body)

    body = out.body("argmax_merge")

    def merge(bd: Body, j) -> None:
        v, k = bd.mul(j, 2), bd.plus(bd.mul(j, 2), 1)
        mine, theirs = bd.bitcast(bd.load("cand", v), f32), bd.bitcast(bd.load("cand_in", v), f32)
        mi, ti = bd.load("cand", k), bd.load("cand_in", k)
        take = bd.either(bd.cmpf(theirs, mine, "ogt"),
                         bd.both(bd.cmpf(theirs, mine, "oeq"), bd.cmpi(ti, mi, "slt")))
        bd.when(take, lambda bd2: (bd2.store(bd2.load("cand_in", v), "cand", v),
                                   bd2.store(bd2.load("cand_in", k), "cand", k)))

    body.each(b, merge)
    out.add("argmax_merge", body)

    body = out.body("eos_check")

    def check(bd: Body, j) -> None:
        tok = bd.load("cand", bd.plus(bd.mul(j, 2), 1))
        bd.store(tok, "tokens", j)
        hit = None
        for t in ends:
            eq = bd.cmpi(tok, bd.const(t, i32), "eq")
            hit = eq if hit is None else bd.either(hit, eq)
        done = bd.const(0, i32) if hit is None else bd.select(hit, bd.const(1, i32), bd.const(0, i32))
        bd.store(done, "done", j)

    body.each(b, check)
    out.add("eos_check", body)
    return out
