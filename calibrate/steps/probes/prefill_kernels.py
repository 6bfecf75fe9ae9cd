"""Probe (kept for reproducibility): per-kernel GPU durations of the eager prefill (profiler).

python3 -m calibrate.steps.probes.prefill_kernels   # writes $OUT/probe2.json
"""

import json
import os
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from calibrate.steps import rope_table
from calibrate.steps.serve_step import LLAMA3_8B as A
from calibrate.steps.serve_step import forward, make_cache, make_weights

dev, dt = "cuda", torch.bfloat16
w = make_weights(A, dev, dt, 0)
rope = rope_table(A, 8300, dev)
out = {}
with torch.inference_mode():
    for b, n in [(8, 1024), (1, 8192), (1, 512)]:
        cache = make_cache(A, b, n, dev, dt, 0)
        tok = torch.randint(0, A.vocab, (b, n), device=dev)

        def fn():
            return forward(A, w, cache, tok, 0, rope, "native")

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            a = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(e))
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            fn()
            torch.cuda.synchronize()
        agg = {}
        seq = []
        for ev in p.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                k = ev.name[:90]
                c, t = agg.get(k, (0, 0.0))
                agg[k] = (c + 1, t + ev.device_time_total)
                seq.append((ev.name[:40], round(ev.device_time_total, 2)))
        out[f"{b}x{n}"] = {
            "step_ms": statistics.median(ts),
            "kernels": sorted(([k, c, t] for k, (c, t) in agg.items()), key=lambda x: -x[2]),
            "layer5_seq": seq[1 + 41 * 5 : 1 + 41 * 6],
        }
        print(b, n, statistics.median(ts), sum(t for _, (c, t) in agg.items()) / 1e3, flush=True)
        del cache
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe2.json"), "w"), indent=1)
