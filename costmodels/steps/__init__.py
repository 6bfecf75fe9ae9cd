"""Step models: what a step of real software costs beyond its kernels, priced through the
one decomposition (:mod:`workloads.decompose`) with the op models of :mod:`costmodels.ops`.

- :mod:`.training`: one training micro-batch on one rank (layer forward/backward/recompute,
  first and last stage, TP/CP/EP communication, pipeline sends).
- :mod:`.training_many`: the same for many plans at once (the plan search), every distinct
  op priced in one call.
- :mod:`.varlen`: price tables of variable-length (packed-document) micro-batches.
- :mod:`.memory`: training memory (ZeRO, precision, activations by recompute/SP/TP/CP,
  in-flight micro-batches, framework buffers), scalar and vectorised over plans.
- :mod:`.serving` (with :mod:`.serving_grid`): one serving-engine iteration (prefill,
  decode, mixed; vllm and pytorch-eager engines, launch floors, host dispatch).
- :mod:`.serving_memory`: a serving replica's memory and KV-cache capacity.
- :mod:`.sparse`: sparse attention patterns inside training and serving steps.
"""
