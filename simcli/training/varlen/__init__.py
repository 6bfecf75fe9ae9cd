"""Variable-length training data: packing, load imbalance and dynamic parallel layouts.

Every step takes a global batch of documents drawn from a length distribution until it
holds ``tokens_per_step`` tokens, and each strategy decides which GPUs process which
document and how the document is split:

- ``static``: a fixed ``dp x cp x tp`` mesh (the plan every framework starts from).
  Documents are packed first-fit-decreasing into bins of the context length ``seq_len``;
  bins go round-robin to the data-parallel ranks; every bin is padded to ``seq_len`` and
  split over the ``cp`` ranks of its CP group (short documents too); a micro-batch holds
  as many bins as fit memory (Megatron's ``micro_batch_size``).
- ``hydraulis`` (Li et al. 2025, "Hydraulis: Balancing Large Transformer Model Training via
  Co-designing Parallel Strategies and Data Assignment"): per step, a heterogeneous
  layout of replicas from a few candidate configurations (wider TP, or CP, inside a node;
  CP groups of whole nodes for documents no node holds), chosen among a handful of
  candidate layouts by predicted step time; documents go to the replicas by greedy LPT on
  *predicted time* (each document, costliest first, to the replica where it would finish
  first); see :func:`hydraulis_lanes`.
- ``bytescale`` (Ge et al. 2025, "ByteScale: ... 2048K Context Length on More Than 12,000
  GPUs", Hybrid Data Parallelism): every TP group is a data-parallel rank; a document too
  long for one rank's memory is split over just enough ranks (``ceil(L / limit)``), which
  form a CP ring for that document only (dynamic communication mesh) and may hold short
  documents too; shards and documents are balanced by predicted time.
- ``flexsp`` (Wang et al., ASPLOS 2025, "FlexSP: Data-Centric and Heterogeneity-Adaptive
  Sequence Parallelism"): per step, the GPUs are cut into sequence-parallel groups of
  ``1, 2, 4, ...`` TP groups and documents are assigned to group sizes by a mixed-integer
  linear program minimising the busiest group's time (scipy ``milp``, HiGHS; see
  :func:`solve_flexsp_milp`), then realised by LPT inside each group size.

Every dynamic planner also prices the static layout without its padding and keeps
whichever it predicts faster (counted as ``fallback_steps``), as a planner with a cost
model would.

Costs (one vectorised ``predict_many`` call when the simulator is built):

- token-linear work per micro-batch -- every GEMM, norm, activation, embedding, LM head,
  loss and TP collective of the whole model (``pp = 1``) -- priced on a grid of per-GPU
  token counts and interpolated; packing documents into one micro-batch runs them as one
  set of GEMMs.
- attention per document: varlen (packed) FlashAttention-style kernels keep documents
  from attending across boundaries, so a document of ``L`` tokens costs causal attention
  of length ``L``. It is priced on a grid of lengths as a batch of same-length documents
  filling a 32k-token pack, divided by the batch (one launch for a pack, not one per
  document); a pack of one 32k document thus costs ~32x the attention of 32 x 1k.
- context parallelism over ``c`` ranks (ring attention, Liu et al. 2023, with Megatron's
  load-balanced causal chunking as in :mod:`costmodels.steps.training`): each rank holds
  ``L / c`` tokens and ``1/c`` of the causal attention; per layer ``c - 1`` KV exchanges
  (KV and dKV backward), each hidden behind one ``1/c`` attention block, the rest exposed.
- per step, the AdamW update of the rank's optimizer shard; gradient reduction is assumed
  overlapped with the backward pass (Megatron's ``overlap_grad_reduce``).

Memory: a micro-batch may give one rank (a TP group: one DP or CP rank; each of its GPUs
keeps ``1/tp`` of the activations under sequence parallelism) at most
``VarlenCoster.limit(tp)`` tokens: the GPU memory (times ``memory_fraction``) minus model
states, over the activation bytes a token leaves on a GPU; see
:meth:`VarlenCoster.activation_bytes_per_token` and :meth:`VarlenCoster.state_bytes`.

Simplifications: no pipeline parallelism; ranks sharing a long document (ByteScale) are
assumed to reach its ring exchanges together (ByteScale's balance scheduler orders the
micro-batches so they do); switching layouts between steps (re-sharding weights for a
wider TP in Hydraulis, rebuilding communicators) is free; every strategy's replicas take
part in the same gradient reduction, which is therefore left out of the comparison.

Modules: :mod:`~simcli.training.varlen.config` (what is simulated),
:mod:`~costmodels.steps.varlen` (the price tables), :mod:`~simcli.training.varlen.packing`
(document sampling, packing, lanes and their pricing), :mod:`~simcli.training.varlen.strategies`
(static, ByteScale, Hydraulis), :mod:`~simcli.training.varlen.flexsp` (the FlexSP program)
and :mod:`~simcli.training.varlen.simulate` (steps, results).
"""

from costmodels.steps.varlen import (
    ACT_BYTES,
    ATTENTION,
    ATTN_PACK_TOKENS,
    COLLECTIVES,
    VarlenCoster,
)
from simcli.training.varlen.config import (
    STRATEGIES,
    Strategy,
    VarlenConfig,
    VarlenError,
    make_varlen_config,
)
from simcli.training.varlen.flexsp import (
    FlexSPSolution,
    flexsp_buckets,
    flexsp_lanes,
    flexsp_realise,
    solve_flexsp_milp,
)
from simcli.training.varlen.packing import (
    Lane,
    LaneCost,
    StepOutcome,
    eft,
    evaluate,
    ffd,
    lane_cost,
    sample_steps,
)
from simcli.training.varlen.simulate import (
    StrategyResult,
    VarlenResult,
    choose_static_plan,
    simulate_varlen,
)
from simcli.training.varlen.strategies import (
    ReplicaConfig,
    StaticPlan,
    bytescale_lanes,
    bytescale_layout,
    hydraulis_configs,
    hydraulis_lanes,
    static_lanes,
)

__all__ = [
    "ACT_BYTES",
    "ATTENTION",
    "ATTN_PACK_TOKENS",
    "COLLECTIVES",
    "STRATEGIES",
    "FlexSPSolution",
    "Lane",
    "LaneCost",
    "ReplicaConfig",
    "StaticPlan",
    "StepOutcome",
    "Strategy",
    "StrategyResult",
    "VarlenConfig",
    "VarlenCoster",
    "VarlenError",
    "VarlenResult",
    "bytescale_lanes",
    "bytescale_layout",
    "choose_static_plan",
    "eft",
    "evaluate",
    "ffd",
    "flexsp_buckets",
    "flexsp_lanes",
    "flexsp_realise",
    "hydraulis_configs",
    "hydraulis_lanes",
    "lane_cost",
    "make_varlen_config",
    "sample_steps",
    "simulate_varlen",
    "solve_flexsp_milp",
    "static_lanes",
]
