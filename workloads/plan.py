"""Parallel training plans: the one validated description of how a model is split.

A :class:`TrainPlan` says how ``num_gpus`` GPUs are arranged (tensor x pipeline x context
x data parallel, experts inside data parallel), how the batch is cut into micro-batches,
which pipeline schedule runs, what is recomputed and in which precision. It holds no
costs. :func:`check_plan` checks it against a model and rejects impossible combinations
with one line saying what, the value and the valid choices.

Rank order follows Megatron-LM (``initialize_model_parallel``) by default: TP is the
fastest-varying rank index (so TP groups sit inside a node), then CP, then DP, then PP (so
pipeline neighbours are the farthest apart); ``rank_order="tp-cp-pp-dp"`` is Llama 3's
(data parallelism outermost, the dimension that best tolerates a multi-hop network).
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from workloads.decompose.shard import valid_tp_degrees
from workloads.models import ModelConfig


class PlanError(ValueError):
    """An invalid plan; the message is one line: what, the value, what is allowed."""


Precision = Literal["bf16-mixed", "fp16-mixed", "bf16", "fp8"]
PPSchedule = Literal["1f1b", "gpipe", "interleaved"]
Recompute = Literal["none", "selective", "full"]
CPKind = Literal["ring", "ulysses", "tokenring", "allgather", "hierarchical"]
TPComm = Literal["plain", "overlap", "ladder"]
RankOrder = Literal["tp-cp-dp-pp", "tp-cp-pp-dp"]
RANK_ORDERS: tuple[str, ...] = ("tp-cp-dp-pp", "tp-cp-pp-dp")

PRECISIONS: tuple[str, ...] = ("bf16-mixed", "fp16-mixed", "bf16", "fp8")
PP_SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe", "interleaved")
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
CP_KINDS: tuple[str, ...] = ("ring", "ulysses", "tokenring", "allgather", "hierarchical")
TP_COMMS: tuple[str, ...] = ("plain", "overlap", "ladder")
# Forward tasks of one iteration (micro-batches x model chunks) the event simulator will
# schedule: ~13 s at this bound on one core; real runs stay far below (GPT-3 175B on 1,024
# GPUs: 1,536 micro-batches at most, Llama 3 405B: 32 x 128 chunks).
MAX_PIPELINE_TASKS = 1 << 20


# How --framework pytorch runs an MoE's experts (transformers' ``experts_implementation``)
ExpertsImpl = Literal["auto", "loop", "grouped"]
EXPERTS_IMPL_HELP = (
    "--framework pytorch, MoE: loop = transformers' grouped_mm experts falling back, with fp32 "
    "parameters, to two GEMMs forward and four backward per hit expert; grouped = one "
    "torch._grouped_mm per projection (bf16 parameters, or torchtitan-style); auto: loop "
    "under fp32 master weights (mixed precision), else grouped"
)

class TrainPlan(BaseModel):
    """How one training iteration is parallelised (one global batch, one optimizer step)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_gpus: int = Field(gt=0, description="GPUs in the job")
    tp: int = Field(default=1, gt=0, description="tensor-parallel degree (Megatron column/row)")
    pp: int = Field(default=1, gt=0, description="pipeline-parallel stages")
    cp: int = Field(default=1, gt=0, description="context-parallel degree (sequence split)")
    dp: int | None = Field(
        default=None, gt=0, description="data-parallel degree; default num_gpus/(tp*pp*cp)"
    )
    ep: int = Field(default=1, gt=0, description="expert-parallel degree (within DP; MoE only)")
    vpp: int = Field(default=1, gt=0, description="virtual stages per pipeline rank")
    zero: Literal[0, 1, 2, 3] = Field(
        default=0,
        description="ZeRO stage: 1 optimizer, 2 +gradients, 3 +parameters (FSDP); 2 and 3 "
        "reduce-scatter each micro-batch's gradients layer by layer (any pp)",
    )
    micro_batch: int = Field(default=1, gt=0, description="sequences per micro-batch")
    global_batch: int = Field(gt=0, description="sequences per iteration")
    seq_len: int = Field(gt=0, description="tokens per sequence")
    pp_schedule: PPSchedule = "1f1b"
    recompute: Recompute = "none"
    sequence_parallel: bool | None = Field(
        default=None, description="Megatron sequence parallelism; default on when tp > 1"
    )
    precision: Precision = "bf16-mixed"
    cp_kind: CPKind = Field(
        default="ring",
        description="ring attention, Ulysses all-to-all, TokenRing, all-gathered K/V "
        "(Llama 3), or hierarchical (Ulysses inside a node x ring across nodes)",
    )
    tp_comm: TPComm = Field(
        default="plain",
        description="TP collectives: on the critical path, overlapped with GEMMs "
        "(chunked), or Ladder Residual (overlapped with the next block)",
    )
    layer_split: tuple[int, ...] | None = Field(
        default=None,
        description="layers per model chunk (pp*vpp entries, in chunk order); 0 for a chunk "
        "holding only the embedding (first) or only the LM head and loss (last); default even",
    )
    first_stage_layers: int | None = Field(
        default=None,
        ge=0,
        description="layers on the first pipeline stage, the rest spread evenly (Megatron's "
        "--decoder-first-pipeline-num-layers); 0: the embedding alone",
    )
    last_stage_layers: int | None = Field(
        default=None,
        ge=0,
        description="layers on the last pipeline stage (--decoder-last-pipeline-num-layers); "
        "0: the LM head and loss alone",
    )
    grad_bucket_bytes: int = Field(
        default=40_000_000 * 4, gt=0, description="DP gradient bucket (Megatron: 40M params)"
    )
    overlap_grad_reduce: bool = Field(
        default=True, description="DP gradient reduction overlapped with the backward pass"
    )
    rank_order: RankOrder = Field(
        default="tp-cp-dp-pp",
        description="how ranks are laid out, fastest-varying first: Megatron-LM's "
        "tp-cp-dp-pp (pipeline stages farthest apart) or Llama 3's tp-cp-pp-dp (data "
        "parallelism outermost, across pods; arXiv:2407.21783 sec. 3.3.2)",
    )
    fp8_params: bool = Field(
        default=False,
        description="fp8 plans keep the layers' GEMM weights in fp8 only (Megatron's "
        "--fp8-param-gather, NeMo fp8_params): 1 B weight + 1 B transpose cache, no bf16 copy",
    )
    grad_reduce_dtype: Literal["fp32", "bf16"] | None = Field(
        default=None,
        description="gradient buffer and DP reduction dtype (Megatron --grad-reduce-in-bf16, "
        "NeMo grad_sync_dtype); default fp32 under mixed precision, bf16 under pure bf16",
    )
    experts_impl: ExpertsImpl = Field(default="auto", description=EXPERTS_IMPL_HELP)
    optimizer_offload: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="share of the optimizer state (fp32 master, Adam m and v) held and "
        "stepped on the host CPU (Megatron --optimizer-offload-fraction, ZeRO-Offload)",
    )
    activation_offload: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="share of each rank's layers whose saved activations are copied to "
        "host memory in the forward and back in the backward (TE / Megatron cpu offloading)",
    )

    @model_validator(mode="after")
    def _shape(self) -> TrainPlan:
        inner = self.tp * self.pp * self.cp
        if self.num_gpus % inner:
            raise PlanError(
                f"tp*pp*cp={self.tp}*{self.pp}*{self.cp}={inner} does not divide "
                f"num_gpus={self.num_gpus}; allowed: tp*pp*cp dividing {self.num_gpus}"
            )
        if self.dp is not None and self.dp * inner != self.num_gpus:
            raise PlanError(
                f"tp*pp*cp*dp={inner}*{self.dp}={inner * self.dp} != num_gpus={self.num_gpus}; "
                f"allowed: dp={self.num_gpus // inner}"
            )
        dp = self.data_parallel
        if dp % self.ep:
            raise PlanError(f"ep={self.ep} does not divide dp={dp}; allowed: divisors of {dp}")
        per_step = self.micro_batch * dp
        if self.global_batch % per_step:
            raise PlanError(
                f"global_batch={self.global_batch} is not a multiple of micro_batch*dp="
                f"{self.micro_batch}*{dp}={per_step}; allowed: multiples of {per_step}"
            )
        tasks = self.num_microbatches * self.pp * self.vpp
        if tasks > MAX_PIPELINE_TASKS:
            raise PlanError(
                f"{self.num_microbatches} micro-batches x {self.pp * self.vpp} model chunks = "
                f"{tasks:,} pipeline tasks per iteration; allowed: at most "
                f"{MAX_PIPELINE_TASKS:,} (a larger micro_batch or a smaller global_batch)"
            )
        if self.pp_schedule == "interleaved":
            if self.vpp < 2 or self.pp < 2:
                raise PlanError(
                    f"pp_schedule=interleaved needs pp >= 2 and vpp >= 2 (got pp={self.pp}, "
                    f"vpp={self.vpp}); allowed: 1f1b or gpipe with vpp=1"
                )
            if self.num_microbatches % self.pp:
                raise PlanError(
                    f"interleaved 1F1B needs the micro-batch count ({self.num_microbatches}) "
                    f"to be a multiple of pp={self.pp} (Megatron-LM); allowed: global_batch "
                    f"a multiple of {self.pp * per_step}"
                )
        elif self.vpp != 1:
            raise PlanError(
                f"vpp={self.vpp} needs pp_schedule=interleaved; allowed: vpp=1 with "
                f"{self.pp_schedule}"
            )
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            raise PlanError(
                f"seq_len={self.seq_len} is not a multiple of 2*cp={2 * self.cp} (load-"
                f"balanced causal context parallelism); allowed: multiples of {2 * self.cp}"
            )
        if (self.first_stage_layers, self.last_stage_layers) != (None, None):
            if self.pp < 2:
                raise PlanError(
                    "first/last stage layers need pp >= 2; allowed: a pipeline, or no "
                    "stage layout"
                )
            if self.layer_split is not None:
                raise PlanError(
                    "give either layer_split or first/last stage layers, not both; allowed: "
                    "one layout"
                )
        if self.fp8_params and self.precision != "fp8":
            raise PlanError(
                f"fp8_params needs precision fp8 (got {self.precision}); allowed: "
                "--precision fp8 or no --fp8-params"
            )
        if self.grad_reduce_dtype == "fp32" and self.precision == "bf16":
            raise PlanError(
                "grad_reduce_dtype fp32 needs fp32 master weights; pure bf16 keeps bf16 "
                "gradients; allowed: bf16 with precision bf16"
            )
        if self.sequence_parallel and self.tp == 1:
            raise PlanError("sequence_parallel needs tp > 1; allowed: --no-sequence-parallel")
        return self

    # ------------------------------------------------------------------ derived sizes
    @property
    def data_parallel(self) -> int:
        return self.dp if self.dp is not None else self.num_gpus // (self.tp * self.pp * self.cp)

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect."""
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per iteration (gradient-accumulation steps)."""
        return self.global_batch // (self.micro_batch * self.data_parallel)

    @property
    def num_chunks(self) -> int:
        """Model chunks: pp * vpp (pipeline stages including virtual ones)."""
        return self.pp * self.vpp

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch * self.seq_len

    @cached_property
    def _dtype_names(self) -> tuple[str, str]:
        compute = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16": "bf16", "fp8": "fp8"}
        return compute[self.precision], "bf16" if self.precision == "bf16" else "fp32"

    @property
    def compute_dtype(self) -> str:
        """GEMM dtype (fp8 plans run attention, norms and communication in bf16)."""
        return self._dtype_names[0]

    @property
    def master_dtype(self) -> str:
        """Dtype of the weights the optimizer updates (fp32 master copy under mixed)."""
        return self._dtype_names[1]

    @property
    def experts_loop(self) -> bool:
        """Whether an eager MoE's experts run transformers' per-expert loop: ``auto`` says
        yes under fp32 master weights, where ``grouped_mm`` takes no fp32 weights."""
        if self.experts_impl == "auto":
            return self.master_dtype == "fp32"
        return self.experts_impl == "loop"

    @property
    def dp_stride(self) -> int:
        """Rank distance between neighbours of a data-parallel group."""
        inner = self.tp * self.cp
        return inner if self.rank_order == "tp-cp-dp-pp" else inner * self.pp

    @property
    def stage_stride(self) -> int:
        """Rank distance between the same rank of neighbouring pipeline stages."""
        inner = self.tp * self.cp
        return inner * self.data_parallel if self.rank_order == "tp-cp-dp-pp" else inner

    @property
    def grad_bytes(self) -> int:
        """Bytes per element of the gradient buffer and the DP gradient reduction."""
        default = "bf16" if self.precision == "bf16" else "fp32"
        return 2 if (self.grad_reduce_dtype or default) == "bf16" else 4

    @property
    def activation_dtype(self) -> str:
        return "fp16" if self.precision == "fp16-mixed" else "bf16"

    def layers_per_chunk(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers of each model chunk, in pipeline order (chunk c of rank r is
        chunk index c * pp + r under interleaving)."""
        if self.layer_split is not None:
            return self.layer_split
        n, p = self.num_chunks, self.pp
        fixed: dict[int, int] = {}  # chunk -> layers, from the first/last stage layouts
        for rank, total in ((0, self.first_stage_layers), (p - 1, self.last_stage_layers)):
            if total is None:
                continue
            chunks = [c for c in range(n) if c % p == rank]
            # the stage's layers over its virtual chunks; the chunk holding the embedding
            # (first) or the LM head (last) gets the smaller share
            share, rest = divmod(total, len(chunks))
            order = chunks[::-1] if rank == 0 else chunks
            for i, c in enumerate(order):
                fixed[c] = share + (1 if i < rest else 0)
        free = [c for c in range(n) if c not in fixed]
        left = num_layers - sum(fixed.values())
        out = [fixed.get(c, 0) for c in range(n)]
        if not free:
            return tuple(out)
        base, extra = divmod(max(left, 0), len(free))
        # Any remainder goes to the middle chunks: the first holds the embedding and the
        # last the LM head and loss, so they are the ones to keep light.
        for c in free:
            out[c] = base
        order = sorted(free, key=lambda c: abs(c - (n - 1) / 2))
        for c in order[:extra]:
            out[c] += 1
        return tuple(out)

    def stage_of_chunk(self, chunk: int) -> int:
        """Pipeline rank that runs model chunk ``chunk`` (Megatron interleaving)."""
        return chunk % self.pp


def check_plan(plan: TrainPlan, model: ModelConfig) -> TrainPlan:
    """Checks that need the model; returns the plan so calls chain."""
    valid = valid_tp_degrees(model)
    if plan.tp not in valid:
        raise PlanError(
            f"tp={plan.tp} cannot split {model.id} (num_heads={model.num_heads}, "
            f"num_kv_heads={model.num_kv_heads}); allowed tp: {', '.join(map(str, valid))}"
        )
    if plan.layer_split is not None or plan.first_stage_layers is not None or (
        plan.last_stage_layers is not None
    ):
        split = plan.layers_per_chunk(model.num_layers)
        if len(split) != plan.num_chunks or any(n < 0 for n in split):
            raise PlanError(
                f"layer_split has {len(split)} entries {list(split)}; allowed: "
                f"{plan.num_chunks} non-negative entries (pp*vpp)"
            )
        if sum(split) != model.num_layers:
            raise PlanError(
                f"stage layout {list(split)} sums to {sum(split)}; allowed: a split of "
                f"num_layers={model.num_layers} leaving layers for the middle stages"
            )
        for r in range(plan.pp):
            held = sum(n for c, n in enumerate(split) if c % plan.pp == r)
            if held == 0 and 0 < r < plan.pp - 1:
                raise PlanError(
                    f"pipeline stage {r} holds no layer in layout {list(split)}; allowed: "
                    "empty stages only first (embedding) or last (LM head and loss)"
                )
    elif plan.num_chunks > model.num_layers:
        raise PlanError(
            f"pp*vpp={plan.num_chunks} exceeds num_layers={model.num_layers} of {model.id}; "
            f"allowed: pp*vpp <= {model.num_layers}, or a layer_split with empty first/last "
            "chunks"
        )
    if plan.cp_kind == "ulysses" and plan.cp > 1:
        heads = model.num_heads // plan.tp
        if heads % plan.cp:
            raise PlanError(
                f"Ulysses cp={plan.cp} must divide the {heads} query heads per TP rank; "
                "allowed: cp dividing that, or cp_kind ring/tokenring/allgather/hierarchical"
            )
    if plan.ep > 1:
        if model.num_experts == 1:
            raise PlanError(f"ep={plan.ep} needs an MoE model; {model.id} is dense; allowed: ep=1")
        if model.num_experts % plan.ep:
            raise PlanError(
                f"ep={plan.ep} does not divide num_experts={model.num_experts}; allowed: "
                f"divisors of {model.num_experts} that divide dp={plan.data_parallel}"
            )
    if plan.seq_len > model.max_seq_len and model.position == "learned":
        raise PlanError(
            f"seq_len={plan.seq_len} exceeds the learned position table of {model.id}; "
            f"allowed: <= {model.max_seq_len}"
        )
    return plan


def make_plan(model: ModelConfig | None = None, **fields: object) -> TrainPlan:
    """Build (and, given ``model``, check) a plan; any problem is one :class:`PlanError`."""
    tp = fields.get("tp", 1)
    if model is not None and isinstance(tp, int) and tp not in valid_tp_degrees(model):
        valid = ", ".join(map(str, valid_tp_degrees(model)))
        raise PlanError(
            f"tp={tp} cannot split {model.id} (num_heads={model.num_heads}, "
            f"num_kv_heads={model.num_kv_heads}); allowed tp: {valid}"
        )
    try:
        plan = TrainPlan(**fields)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if where:
            msg = f"{where}: {msg} (got {err.get('input')!r})"
        raise PlanError(msg) from None
    return check_plan(plan, model) if model is not None else plan
