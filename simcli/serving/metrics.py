"""Streaming serving metrics in bounded memory.

Latency quantiles come from :class:`LogHistogram`, a fixed log-bucketed histogram (the
DDSketch idea, Masson et al. VLDB 2019): bucket ``i`` covers ``[lo * g**i, lo * g**(i+1))``
with ``g = 1.01``, so a quantile is reported within 0.5% (relative) of an exact order
statistic, clamped to the exact min and max (one sample gives its exact value). Memory is
a few thousand counters per metric whatever the number of requests, which is why this was
chosen over per-request arrays: a simulation of 10^8 requests needs the same memory as one
of 10^3, and the sketches of several replicas merge by adding counts. Means, minima,
maxima and counts are exact.

Per-request rows, when wanted, are streamed to a file as requests finish (``sink``), never
kept. Token-level history is never stored: time between tokens is recorded per decode
iteration with a weight (every sequence in a decode batch gets its token at the same
moment, so one sample weighted by the batch size is exact).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from costmodels.ops.common import Work

if TYPE_CHECKING:
    from simcli.serving.batch import Batch
    from simcli.serving.engine import Engine
    from simcli.serving.requests import Request


class LogHistogram:
    """Weighted samples of a positive quantity, quantiles to 0.5% relative error."""

    GAMMA = 1.01
    LO = 1e-7  # seconds; smaller samples land in the first bucket (min/max stay exact)
    NBINS = 3500  # up to LO * GAMMA**NBINS ~ 1.4e8 s

    def __init__(self) -> None:
        self.counts = [0] * self.NBINS
        self.n = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self._inv_log_g = 1.0 / math.log(self.GAMMA)
        self._log_lo = math.log(self.LO)

    def add(self, value: float, weight: int = 1) -> None:
        if value > self.LO:
            i = int((math.log(value) - self._log_lo) * self._inv_log_g)
            if i >= self.NBINS:
                i = self.NBINS - 1
        else:
            i = 0
        self.counts[i] += weight
        self.n += weight
        self.total += value * weight
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def add_many(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """:meth:`add` of every sample, vectorised (the same buckets; the total summed
        pairwise, so it may differ from one-by-one adds in the last bits)."""
        if not values.size:
            return
        pos = values > self.LO
        idx = np.zeros(values.size, dtype=np.int64)
        raw = (np.log(values[pos]) - self._log_lo) * self._inv_log_g
        idx[pos] = np.minimum(raw.astype(np.int64), self.NBINS - 1)
        w = np.ones(values.size, dtype=np.int64) if weights is None else weights
        counts = np.bincount(idx, weights=w, minlength=self.NBINS)
        for i in np.flatnonzero(counts).tolist():
            self.counts[i] += int(counts[i])
        self.n += int(w.sum())
        self.total += float(np.dot(values, w))
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))

    def merge(self, other: LogHistogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.n += other.n
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan

    def quantile(self, q: float) -> float:
        """Nearest-rank quantile: the bucket holding the ``ceil(q n)``-th smallest sample,
        reported at its geometric centre, clamped to [min, max]."""
        if not self.n:
            return math.nan
        rank = max(1, math.ceil(q * self.n))
        cum = np.cumsum(np.asarray(self.counts, dtype=np.int64))
        i = int(np.searchsorted(cum, rank))
        centre = math.exp(self._log_lo + (i + 0.5) / self._inv_log_g)
        return min(max(centre, self.min), self.max)


QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


class EnergyMeter:
    """Energy of the iterations, from the cost model's board-power model
    (:class:`costmodels.ops.energy.PowerModel`: P = min(cap, idle + compute_w x tensor-core
    utilisation + memory_w x HBM utilisation), fitted on NVML samples).

    The utilisations of an iteration are its model FLOPs and HBM bytes over its time on
    each GPU: FLOPs ``2 N`` per token through the layer matmuls plus the LM head per
    sequence, and causal attention ``4 L q_size`` per (query, key) pair; bytes the weights
    once plus the KV cache read and written. Each GPU of a ``tp x pp`` replica does
    ``1/(tp pp)`` of that in ``step_s / pp``. Samples are buffered in fixed-size arrays and
    priced in vectorised batches (bounded memory). Idle GPUs draw ``idle_w``.
    """

    CHUNK = 4096

    def __init__(
        self,
        power: Any,
        gpu: Any,
        *,
        matmul_flops_per_token: float,
        head_flops_per_seq: float,
        attn_flops_per_pair: float,
        weight_bytes: float,
        kv_bytes_per_token: float,
        tp: int,
        pp: int,
        dtype: str = "bf16",
    ) -> None:
        self.power, self.gpu = power, gpu
        self.idle_w = float(power.idle_w)
        self.f_tok, self.f_seq, self.f_pair = (
            matmul_flops_per_token,
            head_flops_per_seq,
            attn_flops_per_pair,
        )
        self.weight_bytes, self.kv_bytes = weight_bytes, kv_bytes_per_token
        self.tp, self.pp, self.dtype = tp, pp, dtype
        self._t = np.zeros(self.CHUNK)
        self._f = np.zeros(self.CHUNK)
        self._b = np.zeros(self.CHUNK)
        self._n = 0
        self.joules = 0.0

    @classmethod
    def for_step_model(cls, step: Any) -> EnergyMeter | None:
        """A meter for ``costmodels.steps.serving.StepModel`` when its cost model has a power
        model (calibrated profiles do), else None."""
        cm = getattr(step, "cost_model", None)
        power = getattr(cm, "power", None)
        model = getattr(step, "model", None)
        gpu = getattr(step, "gpu", None)
        if power is None or model is None or gpu is None:
            return None
        head = 2.0 * model.vocab_size * model.hidden_size
        elt = 2.0  # bf16/fp16 weights, unless the step model knows how they are stored
        weights = getattr(step, "weight_bytes_total", None)
        return cls(
            power,
            gpu,
            matmul_flops_per_token=2.0 * model.matmul_params_per_token - head,
            head_flops_per_seq=head,
            attn_flops_per_pair=4.0 * model.num_layers * model.q_size,
            weight_bytes=float(weights) if weights is not None else elt * model.num_params,
            kv_bytes_per_token=float(step.kv_bytes_per_token),
            tp=int(getattr(step, "tp", 1)),
            pp=int(getattr(step, "pp", 1)),
            dtype=str(getattr(step, "gemm_dtype", "bf16")),
        )

    def add(
        self, new: list[int], past: list[int], n_decode: int, ctx_sum: int, dt_s: float
    ) -> None:
        """One iteration: prefill chunks ``new`` over ``past`` cached tokens, ``n_decode``
        decodes over ``ctx_sum`` cached tokens in all, ``dt_s`` seconds."""
        tokens = seqs = pairs = keys = 0.0
        if new:
            s_new = float(sum(new))
            n_past = float(sum(a * b for a, b in zip(new, past, strict=True)))
            tokens += s_new
            seqs += len(new)
            pairs += n_past + 0.5 * float(sum(a * (a + 1) for a in new))
            keys += n_past + s_new
        if n_decode:
            s_ctx = float(ctx_sum + n_decode)  # each decode attends over ctx + 1 keys
            tokens += n_decode
            seqs += n_decode
            pairs += s_ctx
            keys += s_ctx
        flops = self.f_tok * tokens + self.f_seq * seqs + self.f_pair * pairs
        nbytes = self.weight_bytes + self.kv_bytes * (keys + tokens)
        i = self._n
        self._t[i] = dt_s
        self._f[i] = flops
        self._b[i] = nbytes
        self._n = i + 1
        if self._n == self.CHUNK:
            self._flush()

    def add_iterations(
        self,
        dt_s: np.ndarray,
        n_decode: np.ndarray,
        ctx_sum: np.ndarray,
        chunk_at: np.ndarray,
        chunk_new: np.ndarray,
        chunk_past: np.ndarray,
    ) -> None:
        """:meth:`add` of many iterations in order, vectorised: iteration ``i`` took
        ``dt_s[i]`` and decoded ``n_decode[i]`` sequences over ``ctx_sum[i]`` cached
        tokens; prefill chunk ``j`` of ``chunk_new[j]`` tokens over ``chunk_past[j]`` ran
        in iteration ``chunk_at[j]``. The sums are :meth:`add`'s, in its order (integers,
        exact in floats)."""
        k = dt_s.size
        s_new = np.bincount(chunk_at, chunk_new, k)
        n_past = np.bincount(chunk_at, chunk_new * chunk_past, k)
        pairs_new = n_past + 0.5 * np.bincount(chunk_at, chunk_new * (chunk_new + 1), k)
        nd = n_decode.astype(float)
        s_ctx = np.where(n_decode > 0, ctx_sum + n_decode, 0).astype(float)
        tokens = s_new + nd
        seqs = np.bincount(chunk_at, minlength=k).astype(float) + nd
        flops = self.f_tok * tokens + self.f_seq * seqs + self.f_pair * (pairs_new + s_ctx)
        nbytes = self.weight_bytes + self.kv_bytes * ((n_past + s_new + s_ctx) + tokens)
        done = 0
        while done < k:
            i = self._n
            m = min(self.CHUNK - i, k - done)
            self._t[i : i + m] = dt_s[done : done + m]
            self._f[i : i + m] = flops[done : done + m]
            self._b[i : i + m] = nbytes[done : done + m]
            self._n = i + m
            done += m
            if self._n == self.CHUNK:
                self._flush()

    def _flush(self) -> None:
        n = self._n
        if not n:
            return
        gpus = self.tp * self.pp
        t = self._t[:n] / self.pp  # each GPU's share of the iteration
        work = Work(time_s=t, flops=self._f[:n] / gpus, bytes=self._b[:n] / gpus)
        watts = self.power.power_w(work, np.full(n, self.dtype), self.gpu)
        self.joules += float(np.sum(watts * t)) * gpus
        self._n = 0

    def busy_joules(self) -> float:
        self._flush()
        return self.joules


class Metrics:
    """Collects everything a serving run reports; the replicas call it."""

    def __init__(
        self,
        *,
        slo_ttft_s: float | None = None,
        slo_tpot_s: float | None = None,
        sink: Callable[[Request], None] | None = None,
        energy: EnergyMeter | None = None,
    ) -> None:
        self.slo_ttft_s = slo_ttft_s if slo_ttft_s is not None else math.inf
        self.slo_tpot_s = slo_tpot_s if slo_tpot_s is not None else math.inf
        self.sink = sink
        self.energy = energy
        self.ttft = LogHistogram()
        self.tpot = LogHistogram()
        self.e2e = LogHistogram()
        self.tbt_hist = LogHistogram()
        self.queue = LogHistogram()
        self.completed = 0
        self.slo_met = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.preempted_requests = 0
        self.first_arrival_s = math.inf
        self.last_finish_s = 0.0
        self.iterations = 0
        self.decode_seq_iters = 0
        self.batched_tokens = 0
        self.kv_block_s = 0.0  # sum over iterations of (active blocks / capacity) x time
        self.kv_util_max = 0.0
        self.engine_busy_s = 0.0
        self.handoff = LogHistogram()  # disaggregation: prefill end to KV on the decode side
        # optional hooks: a StepRecorder (simcli.serving.timeline) and progress(done, total)
        self.recorder: Any = None
        self.progress: Callable[[int, int | None], None] | None = None
        self.progress_total: int | None = None
        self._progress_every = 1
        self._progress_next = math.inf
        # per priority class: (ttft, tpot, e2e) histograms, kept when track_priority is on
        # (a priority scheduler or requests with priorities: the output's ``by_priority``)
        self.track_priority = False
        self.by_priority: dict[int, tuple[LogHistogram, LogHistogram, LogHistogram]] = {}

    def set_progress(
        self, progress: Callable[[int, int | None], None] | None, total: int | None
    ) -> None:
        """Call ``progress(completed, total)`` about 200 times over the run (every 256
        requests when the total is unknown)."""
        self.progress, self.progress_total = progress, total
        self._progress_every = max(1, total // 200) if total else 256
        self._progress_next = self._progress_every if progress is not None else math.inf

    # called by replicas -----------------------------------------------------------------
    def iteration(self, engine: Engine, batch: Batch, dt_s: float) -> None:
        self.iterations += 1
        self.decode_seq_iters += batch.n_decode
        kv = engine.kv
        util = (kv.used_blocks - kv.evictable_blocks) / kv.num_blocks
        self.kv_block_s += util * dt_s
        if util > self.kv_util_max:
            self.kv_util_max = util
        self.engine_busy_s += dt_s
        n_dec = batch.n_decode
        self.batched_tokens += sum(batch.prefill_new) + n_dec
        energy = engine.replica.energy
        if energy is not None:
            ctx_sum = engine.decode.context_sum() if n_dec else 0
            energy.add(batch.prefill_new, batch.prefill_past, n_dec, ctx_sum, dt_s)
        if self.recorder is not None:
            self.recorder.step(engine, batch, dt_s)

    def tbt(self, gap_s: float, weight: int) -> None:
        self.tbt_hist.add(gap_s, weight)

    def kv_transfer(self, handoff_s: float) -> None:
        self.handoff.add(handoff_s)

    def request_done(self, req: Request) -> None:
        if req.frontend_in_s or req.frontend_out_s:  # as the client sees it (frontend.py)
            req.arrival_s -= req.frontend_in_s
            req.first_token_s += req.frontend_out_s  # type: ignore[operator]
            req.finish_s += req.frontend_out_s  # type: ignore[operator]
            req.frontend_in_s = req.frontend_out_s = 0.0
        self.completed += 1
        ttft = req.first_token_s - req.arrival_s  # type: ignore[operator]
        e2e = req.finish_s - req.arrival_s  # type: ignore[operator]
        self.ttft.add(ttft)
        self.e2e.add(e2e)
        out = req.output_tokens
        tokens = out * len(req.seqs)
        if req.branch is not None:  # TPOT over the branch that completed the request
            out = req.branch.last_len
            tokens = req.finished_tokens
        ok = ttft <= self.slo_ttft_s
        if out > 1:
            tpot = (req.finish_s - req.first_token_s) / (out - 1)  # type: ignore[operator]
            self.tpot.add(tpot)
            ok = ok and tpot <= self.slo_tpot_s
        if ok:
            self.slo_met += 1
        if self.track_priority:
            hs = self.priority_hists(req.priority)
            hs[0].add(ttft)
            hs[2].add(e2e)
            if out > 1:
                hs[1].add(tpot)
        self.prompt_tokens += req.prompt_tokens
        self.output_tokens += tokens
        if req.preemptions:
            self.preempted_requests += 1
        if req.arrival_s < self.first_arrival_s:
            self.first_arrival_s = req.arrival_s
        if req.finish_s > self.last_finish_s:  # type: ignore[operator]
            self.last_finish_s = req.finish_s  # type: ignore[assignment]
        if self.sink is not None:
            self.sink(req)
        if self.recorder is not None:
            self.recorder.request(req)
        if self.completed >= self._progress_next:
            self._progress_next += self._progress_every
            self.progress(self.completed, self.progress_total)  # type: ignore[misc]

    def priority_hists(self, priority: int) -> tuple[LogHistogram, LogHistogram, LogHistogram]:
        """The (ttft, tpot, e2e) histograms of one priority class."""
        hs = self.by_priority.get(priority)
        if hs is None:
            hs = self.by_priority[priority] = (LogHistogram(), LogHistogram(), LogHistogram())
        return hs

    # results ------------------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        """From the first arrival to the last completion."""
        if not self.completed:
            return 0.0
        return max(self.last_finish_s - self.first_arrival_s, 1e-12)

    def summary(self) -> dict[str, float | int | None]:
        dur = self.duration_s
        out: dict[str, float | int | None] = {
            "requests_completed": self.completed,
            "duration_s": dur,
        }
        for name, hist in (
            ("ttft_s", self.ttft),
            ("tpot_s", self.tpot),
            ("tbt_s", self.tbt_hist),
            ("e2e_s", self.e2e),
        ):
            out[f"{name}_mean"] = hist.mean
            for label, q in QUANTILES:
                out[f"{name}_{label}"] = hist.quantile(q)
            out[f"{name}_max"] = hist.max if hist.n else math.nan
        rate = 1.0 / dur if dur > 0 else math.nan
        out |= {
            "throughput_tokens_per_s": self.output_tokens * rate,
            "total_tokens_per_s": (self.output_tokens + self.prompt_tokens) * rate,
            "throughput_requests_per_s": self.completed * rate,
            "goodput_requests_per_s": self.slo_met * rate,
            "slo_attainment": self.slo_met / self.completed if self.completed else math.nan,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "preempted_requests": self.preempted_requests,
            "iterations": self.iterations,
            "mean_decode_batch": self.decode_seq_iters / self.iterations
            if self.iterations
            else math.nan,
        }
        if self.track_priority:
            out["by_priority"] = self.priority_summary()  # type: ignore[assignment]
        return out

    def priority_summary(self) -> dict[str, dict[str, float | int]]:
        """Per priority class (lowest value first): requests and TTFT/TPOT/E2E mean and
        percentiles."""
        out: dict[str, dict[str, float | int]] = {}
        for p in sorted(self.by_priority):
            row: dict[str, float | int] = {"requests_completed": self.by_priority[p][2].n}
            for name, hist in zip(("ttft_s", "tpot_s", "e2e_s"), self.by_priority[p], strict=True):
                row[f"{name}_mean"] = hist.mean
                for label, q in QUANTILES:
                    row[f"{name}_{label}"] = hist.quantile(q)
            out[str(p)] = row
        return out


__all__ = ["QUANTILES", "EnergyMeter", "LogHistogram", "Metrics"]
