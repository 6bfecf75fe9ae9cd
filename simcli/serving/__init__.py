"""Serving: the discrete-event serving simulator, schedulers, KV block manager, routing,
disaggregation, speculative decoding, multi-branch reasoning, capacity planning. Step
latencies come from :mod:`costmodels.steps.serving`; deployments are resolved by
:mod:`simcli.scenario.serving`.

Contract between the step model and the simulator (both sides rely on it):

``costmodels.steps.serving.StepModel(model, gpu_id, *, tp=1, pp=1, engine="vllm", ...)``

- ``step_s(prefill_new, prefill_past, decode_ctx) -> float``: seconds of one engine
  iteration (one forward pass of a mixed batch) on one replica: ``prefill_new[i]`` new
  prompt tokens of prefilling sequence i whose first ``prefill_past[i]`` tokens are already
  in the KV cache (chunked prefill / prefix-cache hits; 0 for a plain prefill), and one
  new token for each decoding sequence j attending over ``decode_ctx[j]`` cached tokens.
  Arguments are 1-D integer numpy arrays (empty allowed, not both). Must be cheap
  (microseconds): the simulator calls it once per iteration.
- ``kv_bytes_per_token`` (one replica, all layers) and ``kv_capacity_tokens(block_size,
  gpu_memory_utilization)``: how many tokens of KV cache fit beside the weights and the
  activation workspace on each replica; raises a one-line error when the model does not
  fit the GPU at that TP/PP.
- ``verify_step_s(decode_ctx, k)``: a speculative-decoding verification step, k + 1 query
  tokens per sequence over its cache (decode_ctx + the k drafts). A speculative engine
  calls it (and the draft model's ``step_s``) once per decode-only iteration instead of
  ``step_s`` (:mod:`simcli.serving.spec`).

Modules: ``requests`` (requests, sequences, arrival streams), ``kv`` (paged blocks, prefix
cache), ``batch`` (the lockstep decode batch, one iteration's batch, the step-model
protocol), ``engine`` (an engine's queues and iteration loop), ``replica`` (``pp`` engines
sharing a KV cache), ``schedulers``, ``router``,
``metrics``, ``timeline`` (bounded per-iteration samples and Chrome traces for reports),
``simulator`` (the event loop, ``ServeConfig``, ``simulate``), ``fastpath`` (the same
loop for plain deployments, from arrays), ``plan_inputs``,
``plan_result`` and ``planner`` (the capacity-planning search), and the optional
features, each a ``ServeConfig`` field: ``disagg`` (prefill/decode pools joined by KV
transfers), ``spec`` (speculative decoding: draft model, SpecTr drafts, TriForce hierarchy),
``branches`` (N branches per request, early stopping at M, SART pruning).
"""
