"""The one decomposition of a model + phase + parallel plan + engine into ops.

- :mod:`.shard`: what one tensor-parallel rank holds (heads, FFN, vocabulary, parameters).
- :mod:`.templates`: ops whose sizes are functions of the token (or sequence) count.
- :mod:`.engines`: the engines (``megatron``, ``megatron-unfused``, ``pytorch-eager``,
  ``vllm``) and the variants of the decomposition each picks.
- :mod:`.layer`: one transformer layer per engine kernel style, and its tensor-parallel
  regions as collectives.
- :mod:`.training`: a training micro-batch (layer forward/backward, first and last stage,
  optimizer; eager, unfused-attention and FP8 variants).
- :mod:`.serving`: a serving iteration (embedding, layers, final norm, LM head, sampler).

Training step costs, serving step latency, sparsity what-ifs and ``simcli predict layer``
all price these ops; none of them lists a model's ops on its own.
"""

from workloads.decompose.engines import ENGINES, Engine, engines_for, get_engine
from workloads.decompose.serving import decode_step_ops, prefill_ops, serving_templates
from workloads.decompose.shard import TPShard, params_per_tp_rank, tp_shard, valid_tp_degrees
from workloads.decompose.templates import LayerOp, OpTemplate
from workloads.decompose.training import (
    BACKWARD_TRAFFIC_RATIO,
    layer_backward_ops,
    layer_forward_ops,
    model_step_ops,
    op_groups,
    optimizer_ops,
)


def total_count(layer_ops: list[LayerOp], name: str) -> int:
    """How many instances of ops called ``name`` a list holds (for tests and reports)."""
    return sum(o.count for o in layer_ops if o.name == name)


__all__ = [
    "BACKWARD_TRAFFIC_RATIO",
    "ENGINES",
    "Engine",
    "LayerOp",
    "OpTemplate",
    "TPShard",
    "decode_step_ops",
    "engines_for",
    "get_engine",
    "layer_backward_ops",
    "layer_forward_ops",
    "model_step_ops",
    "op_groups",
    "optimizer_ops",
    "params_per_tp_rank",
    "prefill_ops",
    "serving_templates",
    "total_count",
    "tp_shard",
    "valid_tp_degrees",
]
