"""Every cost model simcli ships, registered once: a default instance, valid inputs and
inputs of growing work, and the tolerances its contract documents.

An entry (:class:`Registered`) says how to build a model ready to predict, how to draw a
valid input (``sample``) and the same input doing more work (``grow``: more tokens, a
bigger shape, a longer context, more tiles), and how to call the vectorised path
(``many`` turns a list of inputs into ``predict_many``'s argument; ``reference`` is the
scalar path it must match, ``predict`` unless said otherwise). Fittable entries also say
how to build an unfitted instance and a small frame to fit it on.

The contract every entry keeps (``tests/costmodels/test_contract.py`` runs it over all of
them, so a model added here is checked like the others): outputs finite and positive;
more work never cheaper, or never cheaper by more than the documented ``monotone_rtol``;
``predict_many`` row by row equal to ``reference`` within ``vector_rtol``; for fittable
models ``fit`` returns self and predicting before it raises.

Step models (:mod:`costmodels.steps`) have no ``predict(x)`` of their own; the thin
adapters here (:class:`ServingStepLatency`, :class:`TrainingMicroBatch`,
:class:`TrainingMemory`) give them one through their public API.
"""

from costmodels.registry.base import REGISTRY, Registered, get, names, register
from costmodels.registry.ops import (
    DECODE_ROWS_PER_TILE,
    LEARNED_BOUND,
    LEARNED_ENVELOPE,
    SIZE_FIELDS,
    WEIGHT_MULTIPLE,
    SparseAttentionSample,
    grow_op,
    in_domain,
    op_family,
    sample_gemm,
    sample_op,
)
from costmodels.registry.steps import (
    ServingStep,
    ServingStepLatency,
    TrainingMemory,
    TrainingMicroBatch,
)

__all__ = [
    "DECODE_ROWS_PER_TILE",
    "LEARNED_BOUND",
    "LEARNED_ENVELOPE",
    "REGISTRY",
    "SIZE_FIELDS",
    "Registered",
    "ServingStep",
    "ServingStepLatency",
    "SparseAttentionSample",
    "TrainingMemory",
    "TrainingMicroBatch",
    "WEIGHT_MULTIPLE",
    "get",
    "grow_op",
    "in_domain",
    "names",
    "op_family",
    "register",
    "sample_gemm",
    "sample_op",
]
