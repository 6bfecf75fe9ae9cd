"""A serving step model of a vision-language model whose requests carry images.

An engine runs the vision encoder over a request's images in the iteration that
schedules the request's first prompt chunk (vLLM V1's encoder runs inside the model
runner's step, before the language model, for the requests whose image placeholders the
scheduler admitted; its encoder cache keeps the embeddings for later chunks), so that
iteration pays the encoder's forward over the images of every request that starts its
prefill in it, all in one batch. The images' placeholder tokens are part of the prompt
(``ImageLoad.tokens``); the serving simulator adds them to each request's prompt.

The encoder's kernels (:mod:`workloads.decompose.vision`) are priced by the replica's op
cost model; the encoder is not captured in CUDA graphs, so its kernels go through the
same host-dispatch queue as an eager step (:func:`dispatch_s`).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from costmodels.steps.serving_grid import EAGER_HOST_DISPATCH_S
from workloads.decompose.vision import vision_encoder_ops
from workloads.ops import Dtype, ops_frame
from workloads.vision import ImageLoad


@lru_cache(maxsize=1)
def eager_host() -> dict[str, float]:
    """transformers' eager encoder's host costs beyond one dispatch per kernel, fitted on
    its measured forwards (``costmodels/data/vision_encoder.yaml``,
    ``python -m calibrate.fit_vision --write``): per SDPA call of its window loop and per
    forward (rotary table, window index and ``cu_seqlens`` built in Python)."""
    path = Path(str(resources.files("costmodels") / "data" / "vision_encoder.yaml"))
    return {k: float(v) for k, v in yaml.safe_load(path.read_text())["eager_host_s"].items()}


def dispatch_s(kernel_s: np.ndarray, host_s: np.ndarray, sync_before: np.ndarray) -> float:
    """GPU finish time of kernels the host launches in order, kernel i after ``host_s[i]``
    of host work, and after the GPU has drained when ``sync_before[i]`` (a ``.tolist()``
    of a device tensor): the single-server queue ``end_i = max(launch_i, end_{i-1}) + g_i``
    of :func:`costmodels.steps.serving_grid.launch_queue_s`, with the syncs."""
    g = np.asarray(kernel_s, dtype=float)
    c = np.asarray(host_s, dtype=float)
    cuts = np.flatnonzero(np.asarray(sync_before, dtype=bool))
    host = end = 0.0
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, g.size], strict=True):
        if hi <= lo:
            continue
        if lo in cuts:
            host = max(host, end)
        # within a segment: end = max_k (host + C_k + sum_{i >= k} g_i, end + sum g)
        cg, cc = g[lo:hi], host + np.cumsum(c[lo:hi])
        suffix = np.cumsum(cg[::-1])[::-1]
        end = float(max(np.max(cc + suffix), end + cg.sum()))
        host = float(cc[-1])
    return end


def encoder_kernels(
    step: Any, images: ImageLoad, n_requests: int, host: dict[str, float] | None = None
) -> tuple[np.ndarray, ...]:
    """(seconds, host seconds before, sync before) of each kernel of one encoder forward
    over ``n_requests`` requests' images on ``step``'s first-stage GPUs, in launch order.
    The eager engine (transformers) syncs once per block (its window split reads the
    segment lengths to the host) and pays a Python loop iteration per window (``host``:
    its host constants, default :func:`eager_host`'s fitted ones)."""
    enc = step.model.vision
    eager = step.engine == "pytorch-eager"
    dtype = Dtype(step.dtype) if step.dtype in ("bf16", "fp16") else Dtype.bf16
    n_images = n_requests * images.per_request
    mode = "eager" if eager else "fused"
    ops = vision_encoder_ops(enc, images, n_images, step.tp, mode, dtype)
    t = np.asarray(step.cost_model.predict_many(ops_frame([o.op for o in ops])), dtype=float)
    counts = [int(o.count) for o in ops]
    g = np.repeat(t, counts)
    c = np.full(g.size, EAGER_HOST_DISPATCH_S)  # one torch call's dispatch
    sync = np.zeros(g.size, dtype=bool)
    if eager:
        extra = host if host is not None else eager_host()
        starts = np.cumsum([0, *counts[:-1]])
        first_call_of_block = True
        for o, i, n in zip(ops, starts, counts, strict=True):
            if o.name.startswith("vit_attn_call"):
                c[i : i + n] += extra["per_window_call"]
                if first_call_of_block:
                    sync[i] = True
                first_call_of_block = False
            elif o.name.endswith("_norm1"):
                first_call_of_block = True
        c[0] += extra["per_forward"]
    return g, c, sync


class VisionSteps:
    """Mixed in before a step model's class by :func:`with_images`: every iteration also
    pays the encoder over the images of the prefills that start in it (added to each of
    the step model's entry points, whose own pricing does not see it)."""

    images: ImageLoad
    _vision_memo: dict[int, float]

    def vision_s(self, n_requests: int) -> float:
        """Seconds of the encoder over ``n_requests`` requests' images (0 for none)."""
        if n_requests <= 0:
            return 0.0
        memo = self._vision_memo
        if n_requests not in memo:
            memo[n_requests] = dispatch_s(*encoder_kernels(self, self.images, n_requests))
        return memo[n_requests]

    @staticmethod
    def _starting(pn: Any, pp: Any) -> int:
        return int(np.count_nonzero((np.asarray(pp) == 0) & (np.asarray(pn) > 0)))

    def step_s(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        base = super().step_s(prefill_new, prefill_past, decode_ctx)  # type: ignore[misc]
        return base + self.vision_s(self._starting(prefill_new, prefill_past))

    def exact_step_s(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        base = super().exact_step_s(prefill_new, prefill_past, decode_ctx)  # type: ignore[misc]
        return base + self.vision_s(self._starting(prefill_new, prefill_past))

    def step_s_summary(
        self, prefill_new: list[int], prefill_past: list[int], n_decode: int, decode_ctx_sum: int
    ) -> float:
        base = super().step_s_summary(prefill_new, prefill_past, n_decode, decode_ctx_sum)  # type: ignore[misc]
        starting = sum(1 for n, p in zip(prefill_new, prefill_past, strict=True) if p == 0 and n)
        return base + self.vision_s(starting)

    def breakdown(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> dict[str, float]:
        """The step model's breakdown and the encoder as ``vision_encoder``."""
        out = super().breakdown(prefill_new, prefill_past, decode_ctx)  # type: ignore[misc]
        extra = self.vision_s(self._starting(prefill_new, prefill_past))
        if extra:
            out["vision_encoder"] = extra
        return out

    def stage_s(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        """The encoder runs on the first stage; with pp > 1 it is added to the slowest
        stage (an upper bound when another stage is slower than the first)."""
        base = super().stage_s(prefill_new, prefill_past, decode_ctx)  # type: ignore[misc]
        return base + self.vision_s(self._starting(prefill_new, prefill_past))


def with_images(step: Any, images: ImageLoad | None) -> Any:
    """``step`` pricing the images of ``images`` (unchanged without images). The compiled
    loop's tables are turned off: its kernel prices steps without the encoder."""
    if images is None or images.per_request == 0:
        return step
    if step.model.vision is None:
        raise ValueError(
            f"--images-per-request {images.per_request}: {step.model.id} has no vision "
            "encoder; allowed: 0, or a vision-language model (e.g. a Qwen2.5-VL config.json)"
        )
    cls = type(step)
    step.__class__ = type(f"Vision{cls.__name__}", (VisionSteps, cls), {})
    step.images = images
    step._vision_memo = {}
    step._summary_tabled = False
    step.vision_s(1)  # a TP that does not split the encoder fails here, in one line
    return step


__all__ = [
    "VisionSteps", "dispatch_s", "eager_host", "encoder_kernels", "with_images",
]  # fmt: skip
