"""Plan search (``simcli plan``): enumerate, prune, estimate in closed form, re-rank.

The space (Megatron-LM's knobs) is every ``tp`` that splits the model and fits in a node,
``pp`` dividing the layers, context-parallel ``cp`` (ring / Ulysses / TokenRing), the
data-parallel degree that fills the GPUs, micro-batch sizes dividing the per-replica
batch, ZeRO 0-3, recomputation none / selective / full, sequence parallelism on / off,
1F1B or interleaved 1F1B with ``vpp`` virtual stages, and expert parallelism for MoE
models. Pruning follows Galvatron (Miao et al. 2022) and Megatron-LM's own rules: TP
stays inside a node, ``pp * vpp`` divides the layers (even stages), context parallelism
keeps at least 512 tokens per rank, interleaving needs the micro-batch count to be a
multiple of ``pp``, ZeRO > 0 needs ``dp > 1``, ZeRO-2/3 are not combined with
pipelining, and whatever does not fit in memory is dropped (priced first, for all plans
at once, by :func:`~costmodels.steps.memory.memory_bytes_many`).

Speed: a plan's per-micro-batch costs depend only on (tp, sp, micro-batch, cp, cp kind,
ep, recompute), never on pp, dp or the schedule, so
:func:`~costmodels.steps.training_many.step_costs_many` prices every distinct key with one
``predict_many`` call, and the iteration time of all plans is then evaluated with numpy in
closed form (:mod:`simcli.training.search_estimate`: the pipeline, the DP-gradient tail,
ZeRO-3 exposure, the optimizer step), mirroring the discrete-event simulator for even
stages. The space itself is :mod:`simcli.training.search_space`.
The closed form is an estimate: the best plans by it (and any within 1 % of the last of
them) are re-run with :func:`~simcli.training.simulator.simulate_iteration`, and the
ranking and every reported time are the simulator's.

Stage balancing (``balance=True``) follows Galvatron-BMW (Wang et al. 2023, "Improving
Automatic Parallel Training via Balanced Memory Workload Optimization"): for 1F1B plans
it moves layers off the first stage (embedding, most micro-batches in flight) and the
last stage (LM head and loss) by a binary search on the largest stage time, subject to
every stage fitting in memory, then re-simulates. Not searched: a different strategy per
layer (Galvatron's per-layer dynamic programming), uneven interleaved chunks, TP comm
overlap and the non-Megatron frameworks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from costmodels.ops.select import provenance_fields
from costmodels.steps.memory import estimate_memory
from costmodels.steps.training import CostModel, StepCosts
from costmodels.steps.training_many import step_costs_many
from hardware_specs.prices import GpuPrice
from hardware_specs.registry import System
from simcli.training.search_estimate import (
    BOUND_SLACK,
    EstimateContext,
    balance_split,
    estimate_iteration_s,
    memory_capacity_bytes,
    plan_memory_bytes,
)
from simcli.training.search_space import (
    COLUMNS,
    COMPUTE_DTYPE,
    SearchSpace,
    enumerate_plans,
    plan_from_row,
    select_rows,
)
from simcli.training.simulator import simulate_iteration
from workloads.models import ModelConfig
from workloads.plan import CP_KINDS, RECOMPUTE, TP_COMMS, PlanError, TrainPlan, check_plan

Objective = Literal["time", "cost"]
GIB = 1024**3


# --------------------------------------------------------------------------- the search


def plan_layout(p: TrainPlan) -> dict[str, Any]:
    """The columns that say what a plan is (plans.csv, pareto.csv, the JSON records)."""
    return {
        "num_gpus": p.num_gpus,
        "tp": p.tp,
        "pp": p.pp,
        "dp": p.data_parallel,
        "cp": p.cp,
        "cp_kind": p.cp_kind if p.cp > 1 else "",
        "tp_comm": p.tp_comm,
        "ep": p.ep,
        "vpp": p.vpp,
        "pp_schedule": p.pp_schedule,
        "zero": p.zero,
        "micro_batch": p.micro_batch,
        "num_microbatches": p.num_microbatches,
        "recompute": p.recompute,
        "sequence_parallel": p.sp,
        "precision": p.precision,
        "layer_split": list(p.layer_split) if p.layer_split else None,
        "optimizer_offload": p.optimizer_offload,
        "rank_order": p.rank_order,
    }


@dataclass
class RankedPlan:
    """One plan of the answer, with the simulator's numbers."""

    plan: TrainPlan
    iteration_s: float  # simulate_iteration
    estimate_s: float  # the closed form that selected it
    tokens_per_s: float
    mfu: float
    peak_memory_bytes: float
    capacity_bytes: float
    cost_usd_per_iteration: float
    balanced: bool = False
    breakdown_s: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        p = self.plan
        return {
            **plan_layout(p),
            "balanced": self.balanced,
            "iteration_s": self.iteration_s,
            "estimate_s": self.estimate_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "peak_memory_gib": self.peak_memory_bytes / GIB,
            "memory_capacity_gib": self.capacity_bytes / GIB,
            "memory_headroom_gib": (self.capacity_bytes - self.peak_memory_bytes) / GIB,
            "gpu_hours_per_iteration": self.iteration_s * p.num_gpus / 3600.0,
            "cost_usd_per_iteration": self.cost_usd_per_iteration,
        }


@dataclass(frozen=True)
class ParetoPlan:
    """A plan on the time / memory / cost front (closed-form time: not simulated)."""

    plan: TrainPlan
    estimate_s: float
    peak_memory_bytes: float
    cost_usd_per_iteration: float

    def record(self) -> dict[str, Any]:
        return {
            **plan_layout(self.plan),
            "estimate_s": self.estimate_s,
            "peak_memory_gib": self.peak_memory_bytes / GIB,
            "cost_usd_per_iteration": self.cost_usd_per_iteration,
        }


def pareto_mask(*objectives: np.ndarray) -> np.ndarray:
    """True where no other point is at least as good in every objective and better in
    one (all minimised). Two objectives: one sort; more: pairwise over the 2-D fronts'
    union, which the callers keep small."""
    pts = np.stack([np.asarray(o, dtype=float) for o in objectives], axis=1)
    if len(pts) == 0:
        return np.zeros(0, dtype=bool)
    # equal points share one verdict (two plans with the same figures are both kept)
    uniq, inv = np.unique(pts, axis=0, return_inverse=True)
    if uniq.shape[1] == 2:
        # sorted by the first objective, then the second: a point is on the front when
        # its second objective beats every point before it
        best = np.minimum.accumulate(uniq[:, 1])
        prev = np.concatenate([[np.inf], best[:-1]])
        keep = uniq[:, 1] < prev
    else:
        le = (uniq[:, None, :] <= uniq[None, :, :]).all(axis=2)
        lt = (uniq[:, None, :] < uniq[None, :, :]).any(axis=2)
        keep = ~(le & lt).any(axis=0)
    return keep[inv.reshape(-1)]


@dataclass
class SearchResult:
    model: str
    gpu: str
    num_gpus: int
    seq_len: int
    global_batch: int
    objective: str
    configs_evaluated: int  # enumerated plans, each memory-checked
    configs_fit: int  # of them, the ones that fit (their time estimated)
    simulated: int  # simulator runs (plans re-ranked, balanced variants included)
    search_seconds: float
    price_usd_per_gpu_hour: float
    price_source: str
    plans: list[RankedPlan]
    estimate_max_rel_error: float  # |closed form / simulator - 1| over the re-run plans
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # with collect=True: every enumerated plan, its memory and closed-form time (reports)
    evaluated: dict[str, np.ndarray] | None = None
    # how the op models were obtained (the cost model's provenance), for the JSON
    op_model_provenance: str | None = None
    op_model_expected_error_pct: float | None = None
    # plans no other fitting plan beats in closed-form time, peak memory and cost at once
    pareto: list[ParetoPlan] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "num_gpus": self.num_gpus,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "objective": self.objective,
            "configs_evaluated": self.configs_evaluated,
            "configs_fit": self.configs_fit,
            "simulated": self.simulated,
            "search_seconds": self.search_seconds,
            "configs_per_s": self.configs_evaluated / max(self.search_seconds, 1e-9),
            "estimate_max_rel_error": self.estimate_max_rel_error,
            "phase_seconds": dict(self.phase_seconds),
            "price_usd_per_gpu_hour": self.price_usd_per_gpu_hour,
            "price_source": self.price_source,
            "op_model_provenance": self.op_model_provenance,
            "op_model_expected_error_pct": self.op_model_expected_error_pct,
        }


@dataclass
class _Candidate:
    ctx: EstimateContext
    plan: TrainPlan
    estimate_s: float
    balanced_s: float
    score: float


class SearchHardware(Protocol):
    """What the search needs of one resolved GPU count (``simcli.scenario.Hardware`` is
    one): the GPU type, how many, the system they form, the op cost model priced on it
    and the GPU's price (None: not known)."""

    @property
    def gpu_id(self) -> str: ...

    @property
    def num_gpus(self) -> int: ...

    @property
    def system(self) -> System: ...

    @property
    def cost_model(self) -> CostModel: ...

    @property
    def price(self) -> GpuPrice | None: ...


def _price(price: GpuPrice | None, gpu_id: str, objective: Objective) -> tuple[float, str]:
    """US$ per GPU-hour and its source; NaN when unknown (the ``time`` objective only)."""
    if price is not None:
        return price.usd_per_gpu_hour, price.source
    if objective == "cost":
        raise PlanError(
            f"objective cost needs a price for GPU {gpu_id!r}; allowed: pass --price-per-gpu-hour"
        )
    return float("nan"), "no price known for this GPU"


def gpu_counts(num_gpus: int, objective: Objective) -> list[int]:
    """GPU counts searched: the given one for ``time``; for ``cost`` also its halvings,
    since with a fixed count cost is time times a constant (fewer GPUs can be cheaper
    per iteration when they run at a higher MFU)."""
    counts = [num_gpus]
    if objective == "cost":
        n = num_gpus
        while n % 2 == 0 and n > 1:
            n //= 2
            counts.append(n)
    return counts


def search_plans(
    model: ModelConfig,
    hardware: Sequence[SearchHardware],
    *,
    seq_len: int,
    global_batch: int,
    top: int = 5,
    objective: Objective = "time",
    balance: bool = False,
    space: SearchSpace | None = None,
    attn_backend: str = "",
    margin: float = 0.01,
    memory_margin_bytes: float = 0.0,
    collect: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Search the plan space (see the module docstring); ``top`` plans ranked by the
    simulator's iteration time (``time``) or cost per iteration (``cost``).

    ``hardware``: one resolved GPU count per entry (``simcli.scenario`` resolves them),
    all of one GPU type; the first is the job's, the others are the smaller counts the
    ``cost`` objective also tries (:func:`gpu_counts`). Their ``price`` prices the plans
    (NaN where none is known; the ``cost`` objective needs one).
    ``margin``: plans whose estimate is within this fraction of the ``top``-th best are
    re-simulated too, so an estimate error cannot push a better plan out of the answer.
    ``memory_margin_bytes``: memory every plan must leave free (``--memory-margin``).
    ``collect``: keep every enumerated plan with its memory and closed-form time in
    ``SearchResult.evaluated`` (for the time/memory Pareto chart of reports).
    ``progress(done, total)``: called after each GPU count is estimated and each plan
    is simulated.
    """
    # the estimate prices ops as pandas frames: imported before the clock starts, so that
    # search_seconds and configs_per_s time the search (the CLI loads pandas only to run)
    import pandas  # noqa: F401

    t_start = time.perf_counter()
    if objective not in ("time", "cost"):
        raise PlanError(f"unknown objective {objective!r}; allowed: time, cost")
    if top < 1:
        raise PlanError(f"--top must be >= 1, got {top}")
    if not hardware:
        raise PlanError("no GPU count to search; allowed: one or more resolved GPU counts")
    gpu_id, num_gpus = hardware[0].gpu_id, hardware[0].num_gpus
    if any(hw.gpu_id != gpu_id for hw in hardware):
        raise PlanError(f"the GPU counts searched mix GPU types; allowed: {gpu_id} only")
    for name, value in (("--seq-len", seq_len), ("--global-batch", global_batch)):
        if value < 1:
            raise PlanError(f"{name} must be positive, got {value}")
    space = space or SearchSpace()
    gpu = hardware[0].system.gpu
    compute = COMPUTE_DTYPE
    if compute[space.precision] not in {d.value for d in gpu.peak_dense_tflops}:
        raise PlanError(
            f"precision {space.precision} needs {compute[space.precision]} "
            f"tensor cores; {gpu_id} has none"
        )
    price, source = _price(hardware[0].price, gpu_id, objective)
    if model.position == "learned" and seq_len > model.max_seq_len:
        raise PlanError(
            f"seq_len={seq_len} exceeds the learned position table of {model.id}; "
            f"allowed: <= {model.max_seq_len}"
        )

    evaluated = fit = 0
    op_cache: dict = {}
    phases = dict.fromkeys(("enumerate", "memory", "estimate", "simulate"), 0.0)
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] += now - clock
        clock = now

    candidates: list[_Candidate] = []
    front: list[tuple] = []  # (ctx, table, row, count, estimate_s, memory_bytes)
    collected: list[dict[str, np.ndarray]] = []
    counts = [hw.num_gpus for hw in hardware]
    report = progress or (lambda done, total: None)
    total_steps = len(counts) + top + min(top, 5)
    for step, hw in enumerate(hardware):
        report(step, total_steps)
        system, count = hw.system, hw.num_gpus
        ctx = EstimateContext(
            model,
            system,
            hw.cost_model,
            count,
            seq_len,
            global_batch,
            space.precision,
            attn_backend,
            op_cache,
            grad_bytes=_grad_bytes(space),
            fp8_params=space.fp8_params,
            memory_margin_bytes=memory_margin_bytes,
        )
        table = enumerate_plans(model, count, seq_len, global_batch, system.gpus_per_node, space)
        lap("enumerate")
        n = len(table["tp"])
        evaluated += n
        if not n:
            continue
        mem = plan_memory_bytes(ctx, table)
        ok = np.flatnonzero(mem + memory_margin_bytes <= memory_capacity_bytes(system))
        lap("memory")
        fit += len(ok)
        if collect:
            collected.append(
                {**table, "num_gpus": np.full(n, count), "memory_bytes": mem.astype(float)}
            )
        if not len(ok):
            continue
        sub = select_rows(table, ok)
        est = estimate_iteration_s(ctx, sub, balance=balance)
        # branch and bound: where the closed form is only a lower bound, schedule the
        # plans exactly if that bound leaves them within reach of the best
        near = est["iteration_s"] <= (1.0 + BOUND_SLACK) * est["iteration_s"].min()
        redo = np.flatnonzero(est["loose"] & near)
        if len(redo):
            again = estimate_iteration_s(ctx, select_rows(sub, redo), balance=balance, exact=True)
            for name in ("iteration_s", "balanced_s"):
                if name in est:
                    est[name][redo] = again[name]
        t_even = est["iteration_s"]
        t_best = np.minimum(t_even, est.get("balanced_s", t_even))
        if collect:
            full = np.full(n, np.nan)
            full[ok] = t_best
            collected[-1]["estimate_s"] = full
        factor = count * price / 3600.0 if objective == "cost" else 1.0
        score = t_best * factor
        # the time / memory front of this GPU count (cost is time x count x price)
        for j in np.flatnonzero(pareto_mask(t_best, mem[ok])):
            front.append((ctx, sub, int(j), count, float(t_best[j]), float(mem[ok][j])))
        # keep only what could make the answer: the best few hundred by score
        keep = np.argsort(score, kind="stable")[: max(4 * top, 50)]
        for j in keep:
            plan = _row_plan(sub, int(j), count, model, seq_len, global_batch, space)
            candidates.append(
                _Candidate(ctx, plan, float(t_even[j]), float(t_best[j]), float(score[j]))
            )
        lap("estimate")
    pareto = _pareto(front, price, model, seq_len, global_batch, space)
    if not candidates:
        if not evaluated:
            raise PlanError(
                f"no valid plan for {model.id} on {num_gpus} GPUs (global_batch="
                f"{global_batch}, seq_len={seq_len}) in the search space; allowed: a "
                "global batch divisible by some data-parallel degree, and --tp/--pp "
                "values that split the model and the GPUs"
            )
        raise PlanError(
            f"no plan of {model.id} fits in {gpu_id} memory ({gpu.memory_gib:g} GiB) on "
            f"{num_gpus} GPUs ({evaluated} plans tried); allowed: more GPUs, a shorter "
            "sequence or a smaller batch"
        )

    candidates.sort(key=lambda c: c.score)
    cut = candidates[min(top, len(candidates)) - 1].score * (1.0 + margin)
    chosen = [c for c in candidates if c.score <= cut][: top + min(top, 5)]
    report(len(counts), len(counts) + len(chosen))
    results = _simulate_candidates(
        chosen, price, balance, lambda i, n: report(len(counts) + i, len(counts) + n)
    )
    errors = [abs(r.estimate_s / r.iteration_s - 1.0) for r in results if not r.balanced]
    lap("simulate")
    key = (lambda r: r.cost_usd_per_iteration) if objective == "cost" else (lambda r: r.iteration_s)
    results.sort(key=key)
    # one entry per plan (a balanced variant replaces its even twin when better)
    seen: set[tuple] = set()
    unique: list[RankedPlan] = []
    for r in results:
        ident = tuple((k, v) for k, v in r.plan.model_dump().items() if k != "layer_split")
        if ident in seen:
            continue
        seen.add(ident)
        unique.append(r)
    return SearchResult(
        model=model.id,
        gpu=gpu_id,
        num_gpus=num_gpus,
        seq_len=seq_len,
        global_batch=global_batch,
        objective=objective,
        configs_evaluated=evaluated,
        configs_fit=fit,
        simulated=len(results),
        search_seconds=time.perf_counter() - t_start,
        price_usd_per_gpu_hour=price,
        price_source=source,
        plans=unique[:top],
        estimate_max_rel_error=max(errors) if errors else 0.0,
        phase_seconds=phases,
        evaluated=_decode_collected(collected, price) if collect else None,
        **provenance_fields(hardware[0].cost_model),
        pareto=pareto,
    )


def _row_plan(
    table: dict[str, np.ndarray],
    row: int,
    num_gpus: int,
    model: ModelConfig,
    seq_len: int,
    global_batch: int,
    space: SearchSpace,
) -> TrainPlan:
    """The TrainPlan of an enumerated row, with the space's plan-wide settings."""
    return plan_from_row(
        table, row, num_gpus=num_gpus, seq_len=seq_len, global_batch=global_batch,
        precision=space.precision, num_layers=model.num_layers,
        fp8_params=space.fp8_params, grad_reduce_dtype=space.grad_reduce_dtype,
    )  # fmt: skip


def _pareto(
    front: list[tuple],
    price: float,
    model: ModelConfig,
    seq_len: int,
    global_batch: int,
    space: SearchSpace,
) -> list[ParetoPlan]:
    """The plans no other beats in time, memory and cost together: the union of each GPU
    count's time / memory front, filtered on all three; sorted by time."""
    if not front:
        return []
    t = np.array([f[4] for f in front])
    mem = np.array([f[5] for f in front])
    count = np.array([f[3] for f in front], dtype=float)
    cost = t * count * (price if np.isfinite(price) else 1.0) / 3600.0
    keep = np.flatnonzero(pareto_mask(t, mem, cost))
    out = []
    for i in keep[np.argsort(t[keep], kind="stable")]:
        ctx, table, row, n = front[i][:4]
        plan = _row_plan(table, row, n, model, seq_len, global_batch, space)
        usd = float(t[i] * n * price / 3600.0) if np.isfinite(price) else float("nan")
        out.append(ParetoPlan(plan, float(t[i]), float(mem[i]), usd))
    return out


def _decode_collected(parts: list[dict[str, np.ndarray]], price: float) -> dict[str, np.ndarray]:
    """Readable columns of every enumerated plan (codes decoded, units in names)."""
    if not parts:
        return {}
    cols = {k: np.concatenate([p.get(k, np.full(len(p["tp"]), np.nan)) for p in parts])
            for k in (*COLUMNS, "num_gpus", "memory_bytes", "estimate_s")}  # fmt: skip
    est = cols["estimate_s"].astype(float)
    return {
        "num_gpus": cols["num_gpus"],
        "tp": cols["tp"],
        "pp": cols["pp"],
        "dp": cols["dp"],
        "cp": cols["cp"],
        "cp_kind": np.where(cols["cp"] > 1, np.array(CP_KINDS)[cols["kind"]], ""),
        "tp_comm": np.where(cols["tp"] > 1, np.array(TP_COMMS)[cols["tpc"]], "plain"),
        "ep": cols["ep"],
        "vpp": cols["vpp"],
        "zero": cols["zero"],
        "micro_batch": cols["mb"],
        "num_microbatches": cols["m"],
        "recompute": np.array(RECOMPUTE)[cols["rec"]],
        "sequence_parallel": cols["sp"].astype(bool),
        "peak_memory_gib": cols["memory_bytes"] / GIB,
        "fits": np.isfinite(est),
        "estimate_s": est,
        "cost_usd_per_iteration_estimate": est * cols["num_gpus"] * price / 3600.0,
    }


def _simulate_candidates(
    chosen: list[_Candidate],
    price: float,
    balance: bool,
    done: Callable[[int, int], None] | None = None,
) -> list[RankedPlan]:
    """The simulator's result for each candidate that fits, and for its balanced split
    where that is estimated to help. Step costs come from :func:`step_costs_many`, one
    batch per system (they equal ``step_costs``; the simulator itself does the rest)."""
    work: list[tuple[_Candidate, TrainPlan, bool]] = []
    for cand in chosen:
        ctx, plan = cand.ctx, cand.plan
        work.append((cand, plan, False))
        if balance and plan.pp > 1 and plan.vpp == 1 and cand.balanced_s < cand.estimate_s:
            split = _balanced_split(ctx, plan)
            if split is not None and split != plan.layers_per_chunk(ctx.model.num_layers):
                work.append((cand, plan.model_copy(update={"layer_split": split}), True))
    fitting = []
    for cand, variant, balanced in work:
        check_plan(variant, cand.ctx.model)
        mem = estimate_memory(cand.ctx.model, variant, cand.ctx.system.gpu)
        if mem.total_bytes + cand.ctx.memory_margin_bytes <= mem.capacity_bytes:
            fitting.append((cand, variant, balanced, mem))
    costs: dict[int, StepCosts] = {}
    for ctx in {id(c.ctx): c.ctx for c, *_ in fitting}.values():
        mine = [i for i, (c, *_) in enumerate(fitting) if c.ctx is ctx]
        plans = [fitting[i][1] for i in mine]
        batch = step_costs_many(
            ctx.model, plans, ctx.cost_model, ctx.system, ctx.attn_backend, ctx.op_cache
        )
        if ctx.model.native_attn_pattern is not None:  # the model's own local layers
            batch = _with_native_attention(ctx, plans, batch)
        costs.update(zip(mine, batch, strict=True))
    out: list[RankedPlan] = []
    for i, (cand, variant, balanced, mem) in enumerate(fitting):
        ctx = cand.ctx
        res = simulate_iteration(
            ctx.model,
            variant,
            system=ctx.system,
            cost_model=ctx.cost_model,
            costs=costs[i],
            attn_backend=ctx.attn_backend,
        )
        out.append(
            RankedPlan(
                plan=variant,
                iteration_s=res.iteration_s,
                estimate_s=cand.balanced_s if balanced else cand.estimate_s,
                tokens_per_s=res.tokens_per_s,
                mfu=res.mfu,
                peak_memory_bytes=float(mem.total_bytes),
                capacity_bytes=float(mem.capacity_bytes),
                cost_usd_per_iteration=res.iteration_s * variant.num_gpus * price / 3600.0,
                balanced=balanced,
                breakdown_s=dict(res.breakdown_s),
            )
        )
        if done is not None:
            done(i + 1, len(fitting))
    return out


def _with_native_attention(
    ctx: EstimateContext, plans: list[TrainPlan], batch: list[StepCosts]
) -> list[StepCosts]:
    """Step costs with the model's own local attention (gpt-oss, Gemma, Llama 4) priced
    as ``simcli train`` prices it for Megatron (its pattern's time over dense attention,
    :func:`costmodels.steps.sparse.sparse_step_costs`); the closed-form estimates that
    rank candidates before simulation price dense attention."""
    from costmodels.steps.sparse import SparsityPricer, sparse_step_costs

    pricer = SparsityPricer(ctx.system.gpu.id, cost_models=lambda _n: ctx.cost_model, seed=0)
    pattern = ctx.model.native_attn_pattern
    return [
        sparse_step_costs(ctx.model, plan, pattern, ctx.system.gpu.id, base=c, pricer=pricer)
        for plan, c in zip(plans, batch, strict=True)
    ]


def _balanced_split(ctx: EstimateContext, plan: TrainPlan) -> tuple[int, ...] | None:
    """Layers per stage for ``plan`` (1F1B) balancing time under each stage's memory."""
    (c,) = step_costs_many(
        ctx.model, [plan], ctx.cost_model, ctx.system, ctx.attn_backend, ctx.op_cache
    )
    per_layer = c.layer_fwd.total_s + c.layer_bwd.total_s + c.layer_recompute.total_s
    work = [0.0] * plan.pp
    work[0] += c.first_fwd.total_s + c.first_bwd.total_s
    work[-1] += c.last_fwd.total_s + c.last_bwd.total_s
    caps = _stage_layer_caps(ctx, plan)
    return balance_split(ctx.model.num_layers, work, per_layer, caps)


def _stage_layer_caps(ctx: EstimateContext, plan: TrainPlan) -> list[int] | None:
    """Most layers each pipeline stage can hold within the GPU's memory.

    A stage's memory depends only on its own layer count and position, and is affine in
    the layer count (weights, gradients, optimizer state and stored activations all
    scale with it), so two probe splits of :func:`estimate_memory` give each stage's line.
    """
    p, layers = plan.pp, ctx.model.num_layers
    if layers < 2 * p - 1:
        return None
    s1 = tuple([1] * (p - 1) + [layers - (p - 1)])
    s2 = tuple([2] * (p - 1) + [layers - 2 * (p - 1)])
    m1 = estimate_memory(ctx.model, plan.model_copy(update={"layer_split": s1}), ctx.system.gpu)
    m2 = estimate_memory(ctx.model, plan.model_copy(update={"layer_split": s2}), ctx.system.gpu)
    cap = m1.capacity_bytes - ctx.memory_margin_bytes
    caps = []
    for r in range(p):
        y1, y2 = m1.per_stage_total_bytes[r], m2.per_stage_total_bytes[r]
        slope = (y2 - y1) / (s2[r] - s1[r])
        if slope <= 0:
            caps.append(layers)
            continue
        caps.append(int(min(layers, math.floor(s1[r] + (cap - y1) / slope + 1e-9))))
    return caps


def _grad_bytes(space: SearchSpace) -> int | None:
    """The gradient element size a search space fixes (None: the precision's default)."""
    if space.grad_reduce_dtype is None:
        return None
    return 2 if space.grad_reduce_dtype == "bf16" else 4
