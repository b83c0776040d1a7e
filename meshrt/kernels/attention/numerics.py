"""What the attention kernel's events do to data in the interpreter."""

from __future__ import annotations

import math

import numpy as np

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.attention.layout import HeadSplit, lays_out, split_by_rows, splits_heads, tile_span
from meshrt.kernels.attention.pe import in_pe
from meshrt.kernels.numerics import F32, F64, DataLayoutError, KernelExec, Vec, block_range, inverse, part
from meshrt.rope import rotary_dim, turn_parts
from meshrt.runtime import reference as ref


def qkv_blocks(heads: int, kv_heads: int, head_dim: int, gated: bool = False) -> tuple[int, ...]:
    """The blocks of the q | k | v (| output gate) vector an attention reads
    (`numerics.block_order`)."""
    hd, kvd = heads * head_dim, kv_heads * head_dim
    return (hd, kvd, kvd, hd) if gated else (hd, kvd, kvd)


def reach(entries: np.ndarray, p: int) -> int:
    """How many of a core's ring `entries` (ascending) a query at position p loops over:
    the ring fills in position order, so the entries up to p (all once the ring wrapped);
    those it does not see there (a window's older ones) are masked, not skipped. The PE
    bodies compute the same count (`pe.attention_bodies`, `reach`)."""
    return int(np.searchsorted(entries, p, side="right"))


class Attention(KernelExec):
    """Heads split over the columns, the sequence over the rows (flash-decoding merge)."""

    OPS = frozenset({"qk", "score_add", "qkv_gather", "exp", "av", "softmax_merge", "group_merge", "normalize"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        p = info.param
        self.heads, self.kvh, self.d = p("heads"), p("kv_heads"), p("head_dim")
        self.max_seq, self.slots = p("max_seq"), p("slots")
        # KV spill: ring entries from spill_from on live on the region's other tiles
        self.spill_from = p("spill_from", None)
        self.gated = bool(p("gated", 0))
        shape = plane.shape
        self.rope, self.eps, self.window = shape.rope, shape.rms_eps, shape.window(self.layer)
        self.q_gain, self.k_gain = plane.qk_gains(self.layer)
        self.sinks = plane.sinks(self.layer)
        # the blocks of its input when it reads a blocked q | k | v in place, else None
        self.blocks = (qkv_blocks(self.heads, self.kvh, self.d, self.gated)
                       if info.param("qkv_in_place") is not None else None)
        _, _, w, _ = self.tiles[0]
        # whole KV heads a column, q | k | v in place, float32: its PE bodies (`pe.py`)
        self.bodies = self.tile_bodies() if in_pe(info, plane.hp) else None
        # wider than its KV heads: head_dim split over groups of columns (`layout`)
        self.split, self.by_rows = None, False
        self._held: dict[tuple[int, int], np.ndarray] = {}  # (i, j) -> its ring entries
        if splits_heads(self.kvh, w):
            self.split = HeadSplit.of(self.heads, self.kvh, self.d, w, self.rope)
            if self.split.problem():
                raise DataLayoutError(f"kernel @{self.name}: {self.split.problem()}")
            self.by_rows = split_by_rows(self.heads, self.kvh, self.d, self.span(0)[1], self.slots,
                                         plane.hp.kv_bytes, self.b, w, self.tiles[0][3])
            # where the output holds each entry of o in its natural order (`positions`)
            self.positions = inverse(self.split.o_order)
        elif not lays_out(self.kvh, w):
            raise DataLayoutError(
                f"kernel @{self.name}: {w} columns split {self.kvh} KV heads unevenly "
                "(a width dividing kv_heads, or wider than kv_heads, has numerics)")

    def _cache(self, cd, rows, *features):
        """K and V rows of every slot this core holds: (2, slots, rows, *features)."""
        c = cd.kv.get(self.name)
        if c is None:
            c = np.zeros((2, self.slots, rows, *features), F32)
            cd.kv[self.name] = c
        return c

    def _table(self, cd, where):
        """The CF payload that rode in with the data, or (static build) the table the
        host installed for this batch."""
        cb = cd.cb if self.plane.cb else self.plane.host.installed_table(cd.step)
        if cb is None or cb.seq != cd.step:
            got = "none" if cb is None else f"the one of step {cb.seq}"
            raise DataLayoutError(f"{where}: step {cd.step} needs its continuous-batching "
                                  f"table, holds {got}")
        return cb

    def _rows(self, p: int, entries: np.ndarray) -> tuple[np.ndarray, int | None]:
        """(the indices of this core's ring `entries` a query at position p attends; the
        index its own key goes to, or None). The cache is a ring of max_seq entries (the
        op's capacity: the window on a sliding-window layer): entry e holds the latest
        position <= p with remainder e, which is seen where one was written (its age
        (p - e) mod max_seq is at most p) within the window."""
        age = (p - entries) % self.max_seq
        seen = age <= p
        if self.window:
            seen &= age < self.window
        own = int(np.searchsorted(entries, p % self.max_seq))  # entries ascend
        held = own < len(entries) and entries[own] == p % self.max_seq
        return np.flatnonzero(seen), (own if held else None)

    def reached(self, cd, op):
        """The KV rows this core holds that the micro-batch's live rows reach, over all it
        holds for them: where attention runs as PE bodies, the count their `qk` left in
        `reach` (what their loops ran); elsewhere the same count, `reach`."""
        t, i, j, _, h = self.grid_pos(cd)
        entries = self._entries(t, i, j, h)
        if not len(entries):
            return 0.0
        if self.bodies is not None:
            rows = self.pe_buffers(cd, self.bodies_at(cd.pos))["reach"]
            return float(rows.sum()) / (self.b * len(entries))
        cb = self._table(cd, self.where(cd))
        return sum(reach(entries, slot.pos) for slot in cb.slots if slot.rid >= 0) / (self.b * len(entries))

    def span(self, t: int) -> tuple[int, int]:
        """(first ring entry, entries) tile t holds (`layout.tile_span`)."""
        return tile_span(self.max_seq, self.spill_from, len(self.tiles), t)

    def _entries(self, t: int, i: int, j: int, h: int) -> np.ndarray:
        """The ring entries core (i, j) of tile t holds, ascending, in its cache's order:
        its row's block of the tile's entries, every c-th of them in a head split by rows
        (`layout.HeadSplit.entries`); worked out once per core."""
        got = self._held.get((t, i, j))
        if got is None:
            first, n = self.span(t)
            r0, r1 = part(n, h, j)
            r0, r1 = r0 + first, r1 + first
            got = self._held[t, i, j] = (self.split.entries(i, r0, r1) if self.split is not None and self.by_rows
                                         else np.arange(r0, r1))
        return got

    def load_pushed(self, cd, kv, state):
        """Slot kv's K and V rows this core holds from a pushed cache, in each layout's
        order: the PE bodies' `kv` buffer, or the numerics' cache (whole heads: of the
        column's heads, or a head split's one)."""
        t, i, j, w, h = self.grid_pos(cd)
        entries = self._entries(t, i, j, h)
        # the positions of its ring entries: the last max_seq of the cache's (`_rows`)
        pos = np.arange(max(0, state.length - self.max_seq), state.length)
        pos = pos[np.isin(pos % self.max_seq, entries)]
        if not len(pos):
            return
        rows = np.searchsorted(entries, pos % self.max_seq)
        keys, vals = state.keys(self.layer)[pos], state.values(self.layer)[pos]
        if self.split is not None and self.by_rows:  # whole rows of its KV head
            kv_head = self.split.group(i)[0]
            cache = self._cache(cd, len(entries), 1, self.d)
            cache[0, kv, rows] = keys[:, kv_head:kv_head + 1]
            cache[1, kv, rows] = vals[:, kv_head:kv_head + 1]
            return
        if self.split is not None:  # its units of its KV head's features
            kv_head, k0, k1, _, _, feats = self.split.column(i)
            cache = self._cache(cd, len(entries), k1 - k0)
            cache[0, kv, rows] = keys[:, kv_head, feats]
            cache[1, kv, rows] = vals.reshape(len(pos), -1)[:, k0:k1]
            return
        hk = self.kvh // w
        if self.bodies is not None:
            per = -(-self.span(t)[1] // h)  # the bodies' rows a core (`pe.attention_bodies`)
            cache = self.pe_buffers(cd, self.bodies_at(cd.pos))["kv"].reshape(2, self.slots, per, hk, self.d)
        else:
            cache = self._cache(cd, len(entries), hk, self.d)
        cache[0, kv, rows] = keys[:, i * hk:(i + 1) * hk]
        cache[1, kv, rows] = vals[:, i * hk:(i + 1) * hk]

    def resident(self, pos):
        """The bodies' resident arrays: the KV cache (empty), RoPE's turns per position, the
        q/k norm gains, the sink logits of the column's heads."""
        if self.bodies is None:
            return None
        _, i, _, w, _ = self.grid_at(pos)
        bodies = self.bodies_at(pos)
        hq = self.heads // w
        values = {  # by buffer: the bodies say which they hold and in what order (`pe.py`)
            "kv": lambda: np.zeros(bodies.buffer("kv").elems, F32),  # the cache: empty
            "rope": lambda: turn_parts(self.rope, rotary_dim(self.rope, self.d)).reshape(-1),
            "q_gain": lambda: self.q_gain.astype(F32),
            "k_gain": lambda: self.k_gain.astype(F32),
            "sinks": lambda: self.sinks[i * hq:(i + 1) * hq].astype(F32),
        }
        return [values[b.name]() for b in bodies.resident]

    def _compute_pe(self, cd, op):
        """The op's PE body on the core's arrays (`pe.py`): its operand, the request table
        and its neighbour's partial staged where the program has them."""
        _, i, _, w, _ = self.grid_pos(cd)
        bodies = self.bodies_at(cd.pos)
        bufs = self.pe_buffers(cd, bodies)
        if op == "qk":
            lo, hi = block_range(self.blocks, w, i)
            bufs["x"][:] = self.input(cd).need(lo, hi, self.where(cd)).astype(F32).reshape(-1)
            cb = self._table(cd, self.where(cd))
            self.apply_pushes(cd, cb)
            if "rows" in bufs:  # a chunked program's row table: each row's KV slot and position
                bufs["rows"][:] = [v for slot in cb.slots
                                   for v in ((slot.kv + 1, slot.pos) if slot.rid >= 0 else (0, 0))]
            else:
                bufs["mb"][0] = cb.slots[0].kv // self.b
                rdt = bufs["rdt"]
                for slot in cb.slots:  # the RDT the continuous-batching payloads keep
                    rdt[4 * slot.kv:4 * slot.kv + 3] = (slot.rid + 1, 0, slot.pos) if slot.rid >= 0 else (0, 1, 0)
        elif op == "softmax_merge":
            (got,) = self.take(cd, FlowRole.DOWN)
            bufs["acc_in"][:] = got
        self.run_body(cd, bodies, op)
        if op == "normalize":
            hq = self.heads // w
            cd.values[self.name] = Vec.of(bufs["y"].reshape(self.b, hq * self.d).copy(), i * hq * self.d,
                                          self.heads * self.d)

    def compute(self, cd, op):
        if self.bodies is not None:
            return self._compute_pe(cd, op)
        if op == "softmax_merge":  # down the column, in every layout the numerics compute
            (got,) = self.take(cd, FlowRole.DOWN)
            cd.acc[self.name] = _merge_softmax(got, cd.acc[self.name])
            return None
        if self.split is not None:
            return self._compute_rows(cd, op) if self.by_rows else self._compute_features(cd, op)
        where = self.where(cd)
        t, i, j, w, h = self.grid_pos(cd)
        if op == "qk":
            cb = self._table(cd, where)
            self.apply_pushes(cd, cb)
            hq, hk = self.heads // w, self.kvh // w
            nq, nk = hq * self.d, hk * self.d
            if self.blocks:  # this column's q | k | v (| gate) slice of the blocked vector, in place
                lo, hi = block_range(self.blocks, w, i)
                x = self.input(cd).need(lo, hi, where)
                q, k, v = x[:, :nq], x[:, nq:nq + nk], x[:, nq + nk:nq + 2 * nk]
                gate = x[:, nq + 2 * nk:]
            else:
                hd, kvd = self.heads * self.d, self.kvh * self.d
                x = self.input(cd).need(0, 2 * hd + 2 * kvd if self.gated else hd + 2 * kvd, where)
                q = x[:, i * nq:(i + 1) * nq]
                k = x[:, hd + i * nk:hd + (i + 1) * nk]
                v = x[:, hd + kvd + i * nk:hd + kvd + (i + 1) * nk]
                gate = x[:, hd + 2 * kvd + i * nq:hd + 2 * kvd + (i + 1) * nq]
            if self.gated:  # Qwen3.5: this column's heads' output gates, applied at the root
                cd.acc[self.name, "gate"] = ref.sigmoid(gate)
            q = q.reshape(self.b, hq, self.d)
            k, v = k.reshape(self.b, hk, self.d), v.reshape(self.b, hk, self.d)
            cd.acc[self.name] = self._attend(cd, cb, q, k, v, self._entries(t, i, j, h))
        elif op == "normalize":
            hq = self.heads // w
            out = self._normalized(cd, i * hq)
            n = self.heads * self.d
            c0 = i * hq * self.d
            flat = out.reshape(self.b, hq * self.d)
            if self.gated:
                flat = (flat * cd.acc.pop((self.name, "gate"))).astype(F32)
            cd.values[self.name] = Vec.of(flat, c0, n)

    def _attend(self, cd, cb, q, k, v, entries):
        """Whole-head attention of the slots of `cb` over this core's ring `entries`:
        q (b, query heads, d), the new key and value k, v (b, KV heads, d), g query heads
        a KV head; the new key (q/k-normed and rotated) and value go to the cache where
        this core holds their entry. (out, max, sum) per slot and query head."""
        hq = q.shape[1]
        cache = self._cache(cd, len(entries), k.shape[1], self.d)
        o = np.zeros((self.b, hq, self.d), F64)
        m = np.full((self.b, hq), -np.inf)
        s = np.zeros((self.b, hq), F64)
        g = self.heads // self.kvh
        for b, slot in enumerate(cb.slots):
            if slot.rid < 0:
                continue
            p = slot.pos
            pos = np.asarray([p])
            qr = ref.apply_rope(ref.qk_norm(q[b][None], self.q_gain, self.eps), pos, self.rope)[0]
            kr = ref.apply_rope(ref.qk_norm(k[b][None], self.k_gain, self.eps), pos, self.rope)[0]
            rows, own = self._rows(p, entries)
            if own is not None:
                cache[0, slot.kv, own] = kr
                cache[1, slot.kv, own] = v[b]
            if not len(rows):
                continue
            keys, vals = cache[0, slot.kv, rows], cache[1, slot.kv, rows]
            for hh in range(hq):
                kv_i = hh // g
                sc = (keys[:, kv_i].astype(F64) @ qr[hh].astype(F64) / math.sqrt(self.d)).astype(F32)
                mx = float(np.max(sc))
                e = np.exp(sc.astype(F64) - mx)
                m[b, hh], s[b, hh] = mx, e.sum()
                o[b, hh] = e @ vals[:, kv_i].astype(F64)
        return o, m, s

    def _normalized(self, cd, h0: int) -> np.ndarray:
        """The merged (out, max, sum) of heads h0.. divided by the softmax sum (and the
        heads' sink terms): (b, heads, features) float32."""
        o, m, s = cd.acc.pop(self.name)
        out = np.zeros(o.shape, F32)
        live = s > 0
        if self.sinks is not None:  # each head's sink logit: one more softmax term
            sink = self.sinks[h0:h0 + m.shape[1]].astype(F64)[None, :]
            with np.errstate(invalid="ignore", over="ignore"):
                s = s + np.where(live, np.exp(sink - np.where(live, m, 0.0)), 0.0)
        out[live] = (o[live] / s[live][:, None]).astype(F32)
        return out

    # -- head_dim split over a group of columns (`layout.HeadSplit`) ------------------
    def _compute_features(self, cd, op):
        """A head split by features (`layout`): partial scores summed along the row."""
        where = self.where(cd)
        t, i, j, w, h = self.grid_pos(cd)
        sp, g = self.split, self.split.g
        kv_head, k0, k1, q0, q1, feats = sp.column(i)
        nf = k1 - k0
        entries = self._entries(t, i, j, h)
        held = len(entries)
        if op == "qk":
            cb = self._table(cd, where)
            self.apply_pushes(cd, cb)
            q, k, v = self._column_qkv(cd)
            q = q.reshape(self.b, nf, g).transpose(0, 2, 1)  # (b, g heads, its features)
            cache = self._cache(cd, held, nf)
            scores = np.zeros((self.b, g, held), F64)
            ssq = np.zeros((self.b, g + 1), F64)  # partial sums of squares: q heads, then k
            prep = {}
            # keys rows of this micro-batch write, not yet normalized nor cached (its own,
            # and a prefill chunk's earlier rows'): KV slot -> {cache row: (row, key)}
            fresh: dict[int, dict[int, tuple[int, np.ndarray]]] = {}
            for b, slot in enumerate(cb.slots):
                if slot.rid < 0:
                    continue
                p = slot.pos
                qb, kb = q[b].astype(F64), k[b].astype(F64)
                ssq[b, :g], ssq[b, g] = (qb * qb).sum(axis=1), (kb * kb).sum()
                # the query heads and the key rotated at once: (g + 1, nf)
                qkr = self._rope(np.concatenate([qb * self._gain(self.q_gain, feats),
                                                 kb[None] * self._gain(self.k_gain, feats)]), p, feats)
                qr, kr = qkr[:g], qkr[g]
                rows, own = self._rows(p, entries)
                written = fresh.setdefault(slot.kv, {})
                if own is not None:
                    written[own] = (b, kr)
                late = []  # (cache row, the row whose key it is): scaled at exp
                if len(rows):
                    keys = cache[0, slot.kv, rows].astype(F64)
                    for r, (src, key) in written.items():
                        c = int(np.searchsorted(rows, r))  # rows ascend
                        if c < len(rows) and rows[c] == r:
                            keys[c] = key
                            late.append((r, src))
                    scores[b][:, rows] = qr @ keys.T
                prep[b] = (slot, rows, own, kr, v[b], late)
            cd.acc[self.name, "prep"] = prep
            cd.acc[self.name, "scores"] = (scores, ssq)
        elif op == "score_add":  # the left neighbour's running sum, if of this group
            (got,) = self.take(cd, FlowRole.DOWN)
            if self._of_group(i, i - 1):
                sc, ssq = cd.acc[self.name, "scores"]
                cd.acc[self.name, "scores"] = (sc + got[0], ssq + got[1])  # new arrays
        elif op == "exp":
            scores, ssq = cd.acc.pop((self.name, "scores"))
            cache = self._cache(cd, held, nf)
            o = np.zeros((self.b, g, nf), F64)
            m = np.full((self.b, g), -np.inf)
            s = np.zeros((self.b, g), F64)
            prep = cd.acc.pop((self.name, "prep"))
            rk_of = {b: self._inv_rms(ssq[b, g], self.k_gain) for b in prep}
            for b, (slot, rows, own, kr, vb, late) in prep.items():
                rq = self._inv_rms(ssq[b, :g], self.q_gain)
                rk = rk_of[b]
                sc = scores[b] * rq[:, None]
                for r, src in late:  # keys of this micro-batch's rows, normalized now
                    sc[:, r] *= rk_of[src]
                if own is not None:
                    cache[0, slot.kv, own] = kr * rk
                    cache[1, slot.kv, own] = vb
                if not len(rows):
                    continue
                sc = (sc[:, rows] / math.sqrt(self.d)).astype(F32)
                mx = sc.max(axis=1)
                e = np.exp(sc.astype(F64) - mx[:, None])
                m[b], s[b] = mx, e.sum(axis=1)
                o[b] = e @ cache[1, slot.kv, rows].astype(F64)
            cd.acc[self.name] = (o, m, s)
        elif op == "normalize":
            out = self._normalized(cd, kv_head * g).transpose(0, 2, 1)  # (b, features, g heads)
            if self.gated:
                out = (out * cd.acc.pop((self.name, "gate")).reshape(self.b, nf, g)).astype(F32)
            cd.values[self.name] = Vec.of(out.reshape(self.b, nf * g), q0, self.heads * self.d)

    @staticmethod
    def _gain(gain, feats):
        return 1.0 if gain is None else gain[feats].astype(F64)

    def _inv_rms(self, ssq, gain):
        """1 / rms of a head from its summed squares (1: no q/k norm)."""
        if gain is None:
            return np.ones_like(ssq) if np.ndim(ssq) else 1.0
        return 1.0 / np.sqrt(ssq / self.d + self.eps)

    def _rope(self, x: np.ndarray, p: int, feats: np.ndarray) -> np.ndarray:
        """RoPE at position p of heads x (n, its features) holding features `feats` of
        their heads: every feature's partner is among them (a unit), so the rotation
        of the whole head, zeros elsewhere, gives their values."""
        full = np.zeros((1, x.shape[0], self.d), F64)
        full[0][:, feats] = x
        return ref.apply_rope(full, np.asarray([p]), self.rope)[0][:, feats].astype(F64)

    def _scoring(self, cd) -> bool:
        """Whether a by-features core is inside the row's score reduction (qk to exp)."""
        return (self.name, "prep") in cd.acc

    def _column_qkv(self, cd):
        """This column's units of q ([its feature][j]), k and v for the micro-batch, as the
        qkv reduction left them (blocked) or picked from the whole vector; keeps the
        sigmoid of its units of the output gate for normalize."""
        where = self.where(cd)
        _, i, _, _, _ = self.grid_pos(cd)
        sp, g = self.split, self.split.g
        _, k0, k1, q0, q1, _ = sp.column(i)
        nf = k1 - k0
        if self.blocks:  # the column's q | k | v (| gate) where the qkv reduction left them
            lo, hi = sp.qkv_range(i, self.gated)
            x = self.input(cd).need(lo, hi, where)
            q, k = x[:, :g * nf], x[:, g * nf:g * nf + nf]
            v, gate = x[:, g * nf + nf:g * nf + 2 * nf], x[:, g * nf + 2 * nf:]
        else:
            hd, kvd = self.heads * self.d, self.kvh * self.d
            x = self.input(cd)
            q = x.need_at(sp.q_order[q0:q1], where)
            k = x.need_at(hd + sp.k_order[k0:k1], where)
            v = x.need_at(np.arange(hd + kvd + k0, hd + kvd + k1), where)
            gate = x.need_at(hd + 2 * kvd + sp.o_order[q0:q1], where) if self.gated else None
        if self.gated:
            cd.acc[self.name, "gate"] = ref.sigmoid(gate)
        return q, k, v

    def _own_qkv(self, cd) -> np.ndarray:
        """This column's units of its group's q | k | v at their places in the whole
        head's (g query heads, the key, the value: (b, (g + 2) d), zeros elsewhere), the
        vector the group's gather sums."""
        _, i, _, _, _ = self.grid_pos(cd)
        g, d = self.split.g, self.d
        kv_head, k0, k1, _, _, feats = self.split.column(i)
        nf = k1 - k0
        q, k, v = self._column_qkv(cd)
        out = np.zeros((self.b, (g + 2) * d), F64)
        heads = np.arange(g)[None, :] * d + feats[:, None]  # q is [its feature][j]
        out[:, heads.ravel()] = q
        out[:, g * d + feats] = k
        out[:, (g + 1) * d + k0 - kv_head * d + np.arange(nf)] = v  # v keeps features in order
        return out

    def _gathers(self, cd) -> bool:
        """Whether the core is in this step's gather (its qk not run yet)."""
        return cd.acc.get((self.name, "at")) != cd.step

    def _gathered(self, cd) -> np.ndarray:
        """The group's q | k | v as this core has it so far (its own units at first)."""
        got = cd.acc.get((self.name, "qkv"))
        if got is None:
            got = cd.acc[self.name, "qkv"] = self._own_qkv(cd)
        return got

    def _of_group(self, i: int, other: int) -> bool:
        """Whether column `other` is of column i's KV head group: the row chains run into
        the row's (or the group's) end, so a core combines what its left neighbour sends
        and keeps what its right one relays only from its own group (`layout`)."""
        return self.split.group_id(other) == self.split.group_id(i) >= 0

    def _compute_rows(self, cd, op):
        """A head split by rows (`layout`): whole heads over every c-th KV row."""
        t, i, j, w, h = self.grid_pos(cd)
        sp, g, d = self.split, self.split.g, self.d
        if op == "qkv_gather":  # the left neighbour's running union, if of this group
            (got,) = self.take(cd, FlowRole.DOWN)
            own = self._gathered(cd)
            if self._of_group(i, i - 1):  # disjoint units: the sum is their union
                cd.acc[self.name, "qkv"] = own + got
        elif op == "qk":  # every core: whole heads over its rows, as in any attention
            cb = self._table(cd, self.where(cd))
            self.apply_pushes(cd, cb)
            x = self._gathered(cd)
            del cd.acc[self.name, "qkv"]
            cd.acc[self.name, "at"] = cd.step
            q = x[:, :g * d].reshape(self.b, g, d)
            k, v = x[:, g * d:(g + 1) * d][:, None], x[:, (g + 1) * d:][:, None]
            cd.acc[self.name] = self._attend(cd, cb, q, k, v, self._entries(t, i, j, h))
        elif op == "group_merge":  # along the row: the left neighbour's, if of this group
            (got,) = self.take(cd, FlowRole.DOWN)
            if self._of_group(i, i - 1):
                cd.acc[self.name] = _merge_softmax(got, cd.acc[self.name])
        elif op == "normalize":  # this column's units of the group's heads
            kv_head, k0, k1, q0, _, _ = sp.column(i)
            f0 = k0 - kv_head * d
            out = self._normalized(cd, kv_head * g)[:, :, f0:f0 + k1 - k0].transpose(0, 2, 1)
            if self.gated:  # (b, features, g heads), as o is ordered
                out = (out * cd.acc.pop((self.name, "gate")).reshape(self.b, k1 - k0, g)).astype(F32)
            cd.values[self.name] = Vec.of(out.reshape(self.b, -1), q0, self.heads * d)

    def send(self, cd, role):
        if role is FlowRole.SPILL:  # its column's q | k | v, to its twin on the spill tile
            _, i, _, w, _ = self.grid_pos(cd)
            lo, hi = (self.split.qkv_range(i, self.gated) if self.split is not None
                      else block_range(self.blocks, w, i))
            return self.input(cd).restrict(lo, hi)
        if self.bodies is not None and role is FlowRole.DOWN:
            return cd.buffers[self.name]["acc"].copy()
        if self.split is not None and self.by_rows:
            if self._gathers(cd):  # the group's q | k | v so far, or as gathered
                return self._gathered(cd)
            if self.name in cd.acc:  # a partial along the group's row or down the column
                return cd.acc[self.name]
            return cd.values[self.name]
        if self.split is not None and self._scoring(cd):  # partial or summed scores
            return cd.acc[self.name, "scores"]
        if role is FlowRole.DOWN:
            return cd.acc.pop(self.name)
        return cd.values[self.name]

    def _row_relay(self, cd, item):
        """Where a value relayed back along a head split's row is kept (the summed scores;
        the group's whole q | k | v or merged partial), or None: not such a relay."""
        if self.split is None:
            return None
        if not self.by_rows:
            return (self.name, "scores") if self._scoring(cd) else None
        if self._gathers(cd):
            return self.name, "qkv"
        return self.name if isinstance(item, tuple) else None  # not the column's result

    def recv(self, cd, role, items):
        if role is FlowRole.SPILL:  # a spill tile core's q | k | v, as its twin holds them
            (got,) = items
            cd.recvd[self.inputs[0]] = Vec(got.data.copy(), got.mask.copy())
            return
        key = self._row_relay(cd, items[0]) if role is FlowRole.UP else None
        if key is None:
            super().recv(cd, role, items)
            return
        _, i, _, _, _ = self.grid_pos(cd)
        if self._of_group(i, i + 1):  # this group's, unless this column ends it
            cd.acc[key] = items[0]


def _merge_softmax(a, b):
    """Combine two (out, max, sum) partials of the same heads (-inf max: no keys)."""
    oa, ma, sa = a
    ob, mb, sb = b
    m = np.maximum(ma, mb)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        fa = np.where(np.isfinite(ma), np.exp(ma - safe), 0.0)
        fb = np.where(np.isfinite(mb), np.exp(mb - safe), 0.0)
    return oa * fa[..., None] + ob * fb[..., None], m, sa * fa + sb * fb
