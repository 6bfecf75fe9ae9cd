"""The serving simulator's hot path of :class:`costmodels.steps.serving.StepModel`: an
iteration priced from its summary (prefill chunks as lists, decodes as their count and
context sum) on the step model's interpolation grids, in scalars.

:class:`SummaryPricing` is mixed into ``StepModel``, which holds what it reads (``_grids``,
``model``, ``engine``, ``launch``, ``composition``, ``_decode_memo``, ``_attn_f``,
``_summary_fast``, ``_summary_tabled``, ``_graph_floor_s``, ``_finish``,
``_kernels``,
``_decode_attn``, ``_attn_layer_s``, ``_evaluate``). The values equal ``step_s``'s bit for
bit (the same operations in the same order); a serving run calls it millions of times, so
it avoids numpy and memoises a decode-only step's share by batch size.
"""

from __future__ import annotations

import numpy as np

from costmodels.steps.serving_grid import bracket

# --- summary_tables' layout: PI int64 (flags, then where each grid starts in PG), PF float64
# scalars, PG every 1-D grid end to end, W2 the prefill attention grids (w1, wfill), WDEC
# the decode attention grid, DT each decode batch size's share (base, weight, row)
# (PI flags: mixed steps tabled, layers, largest tabled decode batch, mixed steps replay
# piecewise graphs, largest capture size, host work overlapped; then grid starts: prefill
# attention axes, token grid and its graph totals, sequence grid and its totals, decode
# attention axes, the host-launched (stream) totals, kernels per step, capture sizes)
P_MIXED_OK, P_LAYERS, P_DEC_MAX, P_MIXED_GRAPH, P_CAP_MAX, P_OVERLAP = range(6)
(O_N, O_P, O_TOKX, O_TOKT, O_SEQX, O_SEQT, O_SEQTD, O_DECB, O_DECKV, O_TOKT_S, O_SEQT_S,
 O_SEQTD_S, O_TOKK, O_SEQK, O_CAPS, O_END) = range(6, 22)  # fmt: skip
# PF: graph attention (factor, idle, floor, a decode launch's floor), host-launched
# attention (factor, idle, floor), host seconds per launch, host work a + b seqs + c tokens
(PF_F, PF_IDLE, PF_FLOOR, PF_IDLE_FLOOR, PF_FS, PF_IDLES, PF_FLOORS, PF_LAUNCH, PF_HA, PF_HB,
 PF_HC) = range(11)  # fmt: skip
# DT rows per decode batch size: base, batch weight, row, attention factor, its launch floor,
# launch-bound floor, host seconds
DT_ROWS = 7


class SummaryPricing:
    """``step_s_summary`` and the scalar pieces it is built from (see the module)."""

    def _attn_factors(self, stream: bool) -> tuple[float, float]:
        """(attention's composition factor x idle, idle) of a launch context; 1, 1 with
        no composition."""
        out = self._attn_f.get(stream)
        if out is None:
            f = idle = 1.0
            if self.composition is not None:
                key = self._composition_key("stream" if stream else "graph")
                f = self.composition.factor(key, "attn_fwd")  # the group's factor x idle
                idle = self.composition.idle(key)
            # a hybrid's mean layer: attention runs in the attention layers' share only
            share = self.model.attention_layers / self.model.num_layers
            out = self._attn_f[stream] = (f * share, idle * share)
        return out

    def _prefill_attn_lists(self, new: list[int], past: list[int]) -> float | None:
        """:meth:`_prefill_attn` of a few chunks, in scalars (cheaper than numpy there)."""
        L = self._grids.lists
        n_hi, p_hi = L["n"][-1], L["p"][-1]
        tot = 0.0
        top = 0.0
        first = self._first_chunk_memo  # (v1, vf) of a chunk with nothing cached, by size
        for n, p in zip(new, past, strict=True):
            if n > n_hi or p > p_hi:
                return None
            if not p:
                hit = first.get(n)
                if hit is not None:
                    tot += hit[1]
                    top = max(top, hit[0])
                    continue
            i, wi = bracket(L["n"], n)
            j, wj = bracket(L["p"], p)
            a1, af = L["w1"], L["wfill"]
            r0, r1 = a1[i], a1[i + 1]
            v1 = (1 - wi) * ((1 - wj) * r0[j] + wj * r0[j + 1]) + wi * (
                (1 - wj) * r1[j] + wj * r1[j + 1]
            )
            r0, r1 = af[i], af[i + 1]
            vf = (1 - wi) * ((1 - wj) * r0[j] + wj * r0[j + 1]) + wi * (
                (1 - wj) * r1[j] + wj * r1[j + 1]
            )
            if not p:
                first[n] = (v1, vf)
            tot += vf
            top = max(top, v1)
        return max(tot, top)

    def _grid_total_s(self, T: int, S: int, decodes: bool, ctx: str = "graph") -> float:
        """A step's GEMMs, norms and other per-token and per-sequence ops in launch
        context ``ctx``, attention aside: the per-step totals interpolated on the token and
        sequence grids (T and S inside them)."""
        g = self._grids
        i, w = bracket(g.lists["tok_x"], T)
        tt = g.tok_total[ctx]
        tok = tt[i] + w * (tt[i + 1] - tt[i])
        i, w = bracket(g.lists["seq_x"], S)
        st = (g.seq_total_dec if decodes else g.seq_total)[ctx]
        return tok + st[i] + w * (st[i + 1] - st[i])

    def step_s_summary(
        self, prefill_new: list[int], prefill_past: list[int], n_decode: int, decode_ctx_sum: int
    ) -> float:
        """:meth:`step_s` of an iteration as the serving simulator keeps it: prefill
        chunks as lists, decodes as their count and context sum (all their price depends
        on). Unchecked and without arrays: the simulator's loop calls it once per
        iteration with inputs it built. A decode-only step memoises its batch size's
        share (GEMMs and the decode-attention row of its size), so the call is one
        bracket on the mean context."""
        if not prefill_new:
            return self.step_s_decode(n_decode, decode_ctx_sum)
        if self._summary_fast and len(prefill_new) <= 8 and self.engine != "pytorch-eager":
            pre = self._prefill_attn_lists(prefill_new, prefill_past)
            dec = self._decode_attn(n_decode, decode_ctx_sum) if n_decode else None
            T = sum(prefill_new) + n_decode
            S = len(prefill_new) + n_decode
            g = self._grids
            priced = pre is not None and (dec is not None or not n_decode)
            k = len(prefill_new)
            ctx, Tg, attn_stream = self.launch.plan(k, T)
            if priced and g.tok_x[-1] >= Tg and g.seq_x[-1] >= S:
                attn = self._attn_layer_s(pre, dec, attn_stream)
                gpu = self._grid_total_s(Tg, S, n_decode > 0, ctx) + self.model.num_layers * attn
                return self._finish(gpu, ctx, T, S, k, n_decode)
        pn = np.array(prefill_new, dtype=np.int64)
        pp = np.array(prefill_past, dtype=np.int64)
        return self._evaluate(pn, pp, n_decode, decode_ctx_sum).total

    def step_s_decode(self, n_decode: int, decode_ctx_sum: int) -> float:
        """:meth:`step_s_summary` of a decode-only step (``n_decode`` >= 1 sequences over
        ``decode_ctx_sum`` cached tokens in all)."""
        memo = self._decode_memo.get(n_decode)
        if memo is None:
            memo = self._decode_memo[n_decode] = self._decode_share(n_decode)
        if memo:
            base, wi, r0, r1, f, idle_floor, kv_axis, layers, launch_floor, host = memo
            kv = decode_ctx_sum / n_decode + 1.0
            if kv <= kv_axis[-1]:  # _decode_attn, its row fixed
                j, wj = bracket(kv_axis, kv)
                dec = (1 - wi) * ((1 - wj) * r0[j] + wj * r0[j + 1]) + wi * (
                    (1 - wj) * r1[j] + wj * r1[j + 1]
                )
                gpu = base + layers * (f * dec + idle_floor)  # _finish, its terms fixed
                if launch_floor:
                    gpu = max(gpu, launch_floor)
                return max(gpu, host) if self.launch.overlap else gpu + host
        empty = np.zeros(0, dtype=np.int64)
        return self._evaluate(empty, empty, n_decode, decode_ctx_sum).total

    def summary_tables(self, max_decode: int) -> tuple[np.ndarray, ...]:
        """What :meth:`step_s_summary` reads, as arrays, for a compiled copy of its scalar
        path (:mod:`costmodels.steps.serving_compiled`), in the layout above: PI (mixed
        steps priced from the tables, layers, the largest tabulated decode batch, then where
        each 1-D grid starts in PG), PF (attention factor, idle factor, kernel floor, a
        decode launch's floor), PG, W2, WDEC and DT (each decode batch size's share up to
        ``max_decode``: base seconds, batch weight, row, -1 where it is priced outside the
        grids). Few arrays and no views: the compiled code indexes them in place. The values
        are this object's own (``_decode_share``, ``_attn_factors``), so the copy prices bit
        for bit alike; memoised by ``max_decode``."""
        memo = self.__dict__.setdefault("_tables_memo", {})
        if max_decode not in memo:
            memo[max_decode] = self._summary_tables(int(max_decode))
        return memo[max_decode]

    def _summary_tables(self, max_decode: int) -> tuple[np.ndarray, ...]:
        g = self._grids
        L = g.lists
        f, idle = self._attn_factors(False)
        tabled = bool(self._summary_tabled)
        top = min(max_decode, int(L["dec_b"][-1])) if tabled else 0
        DT = np.zeros((DT_ROWS, top + 1))
        DT[2] = -1.0
        for n in range(1, top + 1):
            share = self._decode_share(n)
            if share:
                DT[0, n], DT[1, n] = share[0], share[1]
                DT[2, n], _ = bracket(L["dec_b"], n)
                DT[3, n], DT[4, n], DT[5, n], DT[6, n] = share[4], share[5], share[8], share[9]
        totals = (g.tok_total["graph"], g.seq_total["graph"], g.seq_total_dec["graph"])
        stream = (g.tok_total["stream"], g.seq_total["stream"], g.seq_total_dec["stream"])
        grids = [L["n"], L["p"], L["tok_x"], totals[0], L["seq_x"], *totals[1:], L["dec_b"],
                 L["dec_kv"], *stream, g.tok_kern, g.seq_kern, self.launch.caps]  # fmt: skip
        starts = np.cumsum([0] + [len(x) for x in grids])
        flags = [tabled and self.engine != "pytorch-eager", self.model.num_layers, top,
                 self.launch.mixed_graph, self.launch.cap_max, self.launch.overlap]  # fmt: skip
        PI = np.array(flags + starts.tolist(), dtype=np.int64)
        fs, idles = self._attn_factors(True)
        launch = self.launch.launch_s
        h = self.launch.host
        PF = np.array([f, idle, self._graph_floor_s, self._attn_layer_s(None, 0.0, False), fs,
                       idles, self._stream_floor_s, launch, h.per_step_s, h.per_seq_s,
                       h.per_token_s])  # fmt: skip
        PG = np.concatenate([np.asarray(x, dtype=np.float64).ravel() for x in grids])
        W2 = np.ascontiguousarray(np.stack([L["w1"], L["wfill"]]), dtype=np.float64)
        WDEC = np.ascontiguousarray(L["wdec"], dtype=np.float64)
        return PI, PF, PG, W2, WDEC, DT

    def _decode_share(self, n: int) -> tuple | bool:
        """What a decode-only step of ``n`` sequences costs whatever their contexts, for
        :meth:`step_s_summary`; False when it is priced outside the grids."""
        g = self._grids
        L = g.lists
        if not self._summary_fast or n > L["dec_b"][-1] or g.tok_x[-1] < n or g.seq_x[-1] < n:
            return False
        ctx, Tg, attn_stream = self.launch.plan(0, n)
        if g.tok_x[-1] < Tg:
            return False
        i, wi = bracket(L["dec_b"], n)
        f, _ = self._attn_factors(attn_stream)
        idle_floor = self._attn_layer_s(None, 0.0, attn_stream)  # a decode launch's floor alone
        base = self._grid_total_s(Tg, n, True, ctx)
        layers = self.model.num_layers
        launch_floor = 0.0
        if ctx == "stream" and self.launch.launch_s:
            launch_floor = self._kernels(n, n, 0, n) * self.launch.launch_s
        host = self.launch.host.step_s(n, n)
        return (base, wi, L["wdec"][i], L["wdec"][i + 1], f, idle_floor, L["dec_kv"], layers,
                launch_floor, host)  # fmt: skip


__all__ = ["SummaryPricing"]
