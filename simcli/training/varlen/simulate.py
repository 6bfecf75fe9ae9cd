"""The simulation: every strategy on the same sampled steps, and the results."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from costmodels.steps.training import CostModel, model_flops
from costmodels.steps.varlen import VarlenCoster
from simcli.training.varlen.config import VarlenConfig, VarlenError
from simcli.training.varlen.flexsp import flexsp_lanes
from simcli.training.varlen.packing import StepOutcome, evaluate, sample_steps
from simcli.training.varlen.strategies import (
    ReplicaConfig,
    StaticPlan,
    bytescale_lanes,
    bytescale_layout,
    hydraulis_configs,
    hydraulis_lanes,
    static_lanes,
)
from workloads.models import ModelConfig
from workloads.plan import PlanError, make_plan


@dataclass
class StrategyResult:
    name: str
    outcomes: list[StepOutcome]
    plan_wall_s: float

    def summary(self, static_step_s: float | None, peak_flops: float, flops: float) -> dict:
        steps = np.array([o.step_s for o in self.outcomes])
        tokens = float(sum(o.tokens for o in self.outcomes))
        total_s = float(steps.sum())
        processed = tokens + float(sum(o.padding_tokens for o in self.outcomes))
        gpus = len(self.outcomes[0].busy_s)
        layouts = Counter(o.layout for o in self.outcomes if o.layout)
        return {
            "mean_step_s": float(steps.mean()),
            "p50_step_s": float(np.median(steps)),
            "max_step_s": float(steps.max()),
            "tokens_per_s": tokens / total_s,
            "speedup_vs_static": (static_step_s / float(steps.mean())) if static_step_s else None,
            "imbalance": float(np.mean([o.imbalance for o in self.outcomes])),
            "idle_fraction": float(
                np.mean([1.0 - o.busy_s.mean() / o.busy_s.max() for o in self.outcomes])
            ),
            "padding_fraction": (processed - tokens) / processed if processed else 0.0,
            "mfu": flops / (total_s * gpus * peak_flops),
            "peak_tokens_per_rank": float(max(o.tokens_per_rank_max for o in self.outcomes)),
            "peak_memory_fill": float(max(o.fill_max for o in self.outcomes)),
            "fallback_steps": int(sum(o.fallback for o in self.outcomes)),
            "common_layout": layouts.most_common(1)[0][0] if layouts else "",
            "plan_wall_s_per_step": self.plan_wall_s / len(self.outcomes),
        }


@dataclass
class VarlenResult:
    config: VarlenConfig
    model_id: str
    gpu_id: str
    static_plan: StaticPlan
    tokens_limit: int
    optimizer_s: float
    steps: list[np.ndarray]
    results: dict[str, StrategyResult]
    peak_flops_per_s: float
    flops_per_step: list[float]

    def to_dict(self) -> dict:
        static = self.results["static"]
        static_mean = float(np.mean([o.step_s for o in static.outcomes]))
        flops = float(sum(self.flops_per_step))
        docs = np.concatenate(self.steps)
        return {
            "model": self.model_id,
            "gpu": self.gpu_id,
            "num_gpus": self.config.num_gpus,
            "tp": self.config.tp,
            "lengths": self.config.lengths.spec,
            "tokens_per_step": self.config.tokens_per_step,
            "steps": self.config.steps,
            "seed": self.config.seed,
            "recompute": self.config.recompute,
            "seq_len": self.static_plan.seq_len,
            "static_plan": {
                "dp": self.static_plan.dp,
                "cp": self.static_plan.cp,
                "tp": self.static_plan.tp,
                "seq_len": self.static_plan.seq_len,
                "micro_batch": self.static_plan.micro_batch,
            },
            "tokens_limit_per_rank": self.tokens_limit,
            "optimizer_s": self.optimizer_s,
            "docs_per_step": float(np.mean([len(s) for s in self.steps])),
            "mean_doc_len": float(docs.mean()),
            "max_doc_len": int(docs.max()),
            "strategies": {
                name: res.summary(static_mean, self.peak_flops_per_s, flops)
                for name, res in self.results.items()
                if name in self.config.strategies
            },
        }


def choose_static_plan(
    coster: VarlenCoster, model: ModelConfig, cfg: VarlenConfig, seq_len: int
) -> StaticPlan:
    """The static mesh: the given ``cp`` or the smallest dividing the TP groups whose
    ``seq_len / cp`` tokens per rank fit memory; ``seq_len`` rounded up to a multiple of
    ``2 cp`` (load-balanced causal CP)."""
    units = cfg.num_gpus // cfg.tp
    limit = coster.limit(cfg.tp)
    divisors = [c for c in range(1, units + 1) if units % c == 0]
    options = [cfg.cp] if cfg.cp is not None else divisors
    for c in options:
        s = -(-seq_len // (2 * c)) * (2 * c) if c > 1 else seq_len
        if s // c <= limit:
            try:
                fields = dict(num_gpus=cfg.num_gpus, tp=cfg.tp, cp=c, seq_len=s)
                make_plan(model, global_batch=units // c, **fields)
            except PlanError as exc:
                raise VarlenError(f"static plan: {exc}") from None
            # Megatron's micro_batch_size: as many seq_len sequences as fit memory.
            return StaticPlan(cfg.tp, c, units // c, s, max(1, limit // (s // c)))
    if cfg.cp is not None:
        ok = [c for c in divisors if -(-seq_len // (2 * c)) * 2 <= limit or seq_len <= limit]
        allowed = f"--cp in {{{', '.join(map(str, ok))}}}, or " if ok else ""
        raise VarlenError(
            f"static plan: seq_len/cp = {seq_len // cfg.cp} tokens per rank exceeds the memory "
            f"limit of {limit} at tp={cfg.tp}; allowed: {allowed}a smaller --seq-len"
        )
    raise VarlenError(
        f"seq_len={seq_len} does not fit: {limit} tokens per rank at tp={cfg.tp} times "
        f"{units} TP groups; allowed: more GPUs, larger --tp, or a smaller --seq-len"
    )


def simulate_varlen(model: ModelConfig, cost_model: CostModel, cfg: VarlenConfig) -> VarlenResult:
    """Simulate ``cfg.steps`` steps of every strategy on the same sampled documents."""
    try:
        units = cfg.num_gpus // cfg.tp
        make_plan(model, num_gpus=cfg.num_gpus, tp=cfg.tp, global_batch=units, seq_len=2 * cfg.tp)
    except PlanError as exc:
        raise VarlenError(str(exc)) from None
    seq_len = cfg.seq_len or cfg.lengths.max_length
    if seq_len is None:
        raise VarlenError(
            f"--lengths {cfg.lengths.spec} has no maximum length; allowed: give --seq-len "
            "(longer documents are cut into seq_len pieces) or a bounded distribution "
            "(e.g. lognormal:MEDIAN:SIGMA:MAX)"
        )
    gpn = cost_model.system.gpus_per_node
    block = math.gcd(cfg.num_gpus, gpn)
    block = block if block % cfg.tp == 0 and block >= cfg.tp else cfg.tp
    mem = (cfg.recompute, cfg.memory_fraction, cfg.attn_backend)
    probe = VarlenCoster(model, cost_model, cfg.num_gpus, (), 0, *mem)
    if probe.limit(cfg.tp) <= 0:
        gib = probe.state_bytes(cfg.tp) / 2**30
        raise VarlenError(
            f"model states of {model.id} take {gib:.1f} GiB per GPU at tp={cfg.tp}, leaving "
            "no memory for activations; allowed: larger --tp or more GPUs"
        )
    tps: tuple[int, ...] = (cfg.tp,)
    configs: list[ReplicaConfig] = []
    if "hydraulis" in cfg.strategies:
        configs, extra = hydraulis_configs(probe, cfg.tp, block)
        tps = tuple(sorted({cfg.tp, *extra}))
    coster = VarlenCoster(model, cost_model, cfg.num_gpus, tps, seq_len, *mem)
    static = choose_static_plan(coster, model, cfg, seq_len)
    steps = sample_steps(cfg.lengths, cfg.tokens_per_step, cfg.steps, cfg.seed, seq_len)

    planners = {
        "hydraulis": lambda L: hydraulis_lanes(coster, cfg.tp, L, configs, block),
        "bytescale": lambda L: (
            bytescale_lanes(coster, cfg.tp, L),
            bytescale_layout(coster, cfg.tp, L),
        ),
        "flexsp": lambda L: flexsp_lanes(coster, cfg.tp, L),
    }
    results: dict[str, StrategyResult] = {
        "static": StrategyResult("static", [], 0.0),
        **{n: StrategyResult(n, [], 0.0) for n in cfg.strategies if n != "static"},
    }
    for L in steps:
        t0 = time.perf_counter()
        base = evaluate(coster, static_lanes(static, L), L, f"dp{static.dp}cp{static.cp}")
        results["static"].plan_wall_s += time.perf_counter() - t0
        results["static"].outcomes.append(base)
        unpadded: StepOutcome | None = None
        for name, planner in planners.items():
            if name not in results:
                continue
            t0 = time.perf_counter()
            lanes, layout = planner(L)
            out = evaluate(coster, lanes, L, layout)
            if unpadded is None:
                unpadded = evaluate(coster, static_lanes(static, L, padded=False), L, base.layout)
            if unpadded.step_s < out.step_s:
                out = unpadded
                out = StepOutcome(**{**out.__dict__, "fallback": True})
            results[name].plan_wall_s += time.perf_counter() - t0
            results[name].outcomes.append(out)
    # model_flops is dense (linear in tokens) + causal attention (tokens x seq_len): per step
    # the dense part of all tokens plus the attention of each document over itself.
    attn_per_sq = model_flops(model, 1, 1) - model_flops(model, 1, 0)
    flops = [
        model_flops(model, int(L.sum()), 0) + attn_per_sq * float(np.sum(L.astype(float) ** 2))
        for L in steps
    ]
    return VarlenResult(
        config=cfg,
        model_id=model.id,
        gpu_id=cost_model.system.gpu.id,
        static_plan=static,
        tokens_limit=coster.limit(cfg.tp),
        optimizer_s=coster.optimizer_s,
        steps=steps,
        results=results,
        peak_flops_per_s=cost_model.system.gpu.peak_flops_per_s("bf16"),
        flops_per_step=flops,
    )
