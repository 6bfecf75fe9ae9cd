"""Step models: what a step of real software costs beyond its kernels, priced through the
one decomposition (:mod:`workloads.decompose`) with the op models of :mod:`costmodels.ops`.

- :mod:`.training`: one training micro-batch on one rank (layer forward/backward/recompute,
  first and last stage, TP/CP/EP communication, pipeline sends).
- :mod:`.training_many`: the same for many plans at once (the plan search), every distinct
  op priced in one call.
- :mod:`.varlen`: price tables of variable-length (packed-document) micro-batches.
- :mod:`.memory`: training memory (ZeRO, precision, activations by recompute/SP/TP/CP,
  in-flight micro-batches, framework buffers), scalar and vectorised over plans.
- :mod:`.serving` (with :mod:`.serving_grid`, :mod:`.serving_launch`): one serving-engine
  iteration (prefill, decode, mixed; launch floors, CUDA-graph padding, host work).
- :mod:`.engines`: engine profiles (vllm, vllm-v0, sglang, trtllm, pytorch-eager): kernels
  per GPU, CUDA graphs, host and API-server work, defaults, every number with its source.
- :mod:`.serving_memory`: a serving replica's memory and KV-cache capacity.
- :mod:`.sparse`: sparse attention patterns inside training and serving steps.
"""
