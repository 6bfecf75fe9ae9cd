"""Memory-bound ops: time = launches + (bytes moved + ramp) / achieved bandwidth.

``ramp_bytes`` models the traffic-equivalent lost before enough bytes are in flight to
saturate HBM (small tensors run at a fraction of peak); it keeps time linear and
monotone in size. Bytes moved per op are the minimum a fused kernel must read and write.
"""

from __future__ import annotations

import numpy as np

from costmodels.ops.common import ELEMENT_BYTES, Work, by_dtype
from costmodels.ops.params import ElementwiseParams
from hardware_specs.schema import GpuSpec

# (elements read, elements written) per m x n element, in the op's dtype.
_RW_PER_ELEMENT: dict[str, tuple[float, float]] = {
    "rmsnorm": (1.0, 1.0),
    "layernorm": (1.0, 1.0),
    "swiglu": (2.0, 1.0),  # silu(gate) * up: reads gate and up, writes one
    "gelu": (1.0, 1.0),
    "rope": (1.0, 1.0),
    "softmax": (1.0, 1.0),
    # log_softmax reads logits and writes log-probs, the NLL pass reads them again
    "cross_entropy": (2.0, 1.0),
    "embedding": (1.0, 1.0),  # gathers rows of the table, writes the activations
    "residual_add": (2.0, 1.0),
}
_KERNELS: dict[str, float] = {"cross_entropy": 2.0}


def elementwise_work(
    kind: np.ndarray,
    m: np.ndarray,
    n: np.ndarray,
    nbytes: np.ndarray,
    dtype: np.ndarray,
    gpu: GpuSpec,
    p: ElementwiseParams,
) -> Work:
    elt = by_dtype(dtype, ELEMENT_BYTES, "elementwise")
    moved = np.zeros(len(kind))
    flops = np.zeros(len(kind))
    eff = np.full(len(kind), p.memory_efficiency.get("default", 0.75))
    kernels = np.ones(len(kind))
    for name in np.unique(kind):
        mask = kind == name
        if name in p.memory_efficiency:
            eff[mask] = p.memory_efficiency[name]
        kernels[mask] = _KERNELS.get(name, 1.0)
        if name == "copy":
            moved[mask] = 2.0 * nbytes[mask]  # `bytes` read, as many written
        elif name == "adamw":
            # fused AdamW per parameter: reads param, grad (param dtype) and fp32 m, v;
            # writes param, m, v (Loshchilov & Hutter 2019, Alg. 2).
            e = elt[mask]
            moved[mask] = n[mask] * (3.0 * e + 16.0)
            flops[mask] = 12.0 * n[mask]
        else:
            r, w = _RW_PER_ELEMENT[name]
            elems = m[mask] * n[mask]
            moved[mask] = (r + w) * elems * elt[mask]
            flops[mask] = 4.0 * elems
    bw = gpu.hbm_bytes_per_s * eff
    time_s = kernels * p.launch_s + (moved + p.ramp_bytes) / bw
    return Work(time_s=time_s, flops=flops, bytes=moved)
