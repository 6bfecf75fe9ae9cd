"""Probe (kept for reproducibility): in-graph kernel floor, kernel counts, host timing.

python3 -m calibrate.steps.probes.graph_floor   # writes $OUT/probe.json
"""

import json
import os
import statistics
import time

import torch

from calibrate.steps import rope_table
from calibrate.steps.serve_step import (
    LLAMA3_8B as A,
)
from calibrate.steps.serve_step import (
    decode_step,
    forward,
    make_cache,
    make_weights,
)

out = {}
dev, dt = "cuda", torch.bfloat16


def graph_time(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


N = 2000
for shape, dtype in [
    ((4096,), dt),
    ((1, 4096), torch.float32),
    ((32, 4096), torch.float32),
    ((256, 14336), dt),
]:
    x = torch.zeros(*shape, device=dev, dtype=dtype)

    def chain():
        for _ in range(N):
            x.add_(1.0)

    out[f"graph_add_{shape}_{dtype}_us_per_kernel"] = graph_time(chain) * 1e3 / N
# eager host dispatch of tiny adds
x = torch.zeros(4096, device=dev, dtype=dt)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(5000):
    x.add_(1.0)
out["eager_add_host_us"] = (time.perf_counter() - t0) / 5000 * 1e6
torch.cuda.synchronize()
w = make_weights(A, dev, dt, 0)
rope = rope_table(A, 8300, dev)


def kernels(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    names = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name[:60]] = names.get(e.name[:60], 0) + 1
    return sum(names.values()), names


res = []
with torch.inference_mode():
    for phase, b, n in [
        ("decode", 1, 1024),
        ("prefill", 1, 512),
        ("decode", 8, 4096),
        ("prefill", 1, 256),
        ("prefill", 2, 512),
        ("decode", 1, 1024),
        ("prefill", 1, 512),
    ]:
        if phase == "decode":
            cache = make_cache(A, b, n + 1, dev, dt, 0)
            tok = torch.randint(0, A.vocab, (b, 1), device=dev)

            def fn():
                return decode_step(A, w, cache, tok, n, rope, "native")
        else:
            cache = make_cache(A, b, n, dev, dt, 0)
            tok = torch.randint(0, A.vocab, (b, n), device=dev)

            def fn():
                return forward(A, w, cache, tok, 0, rope, "native")

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        host, step = [], []
        for _ in range(10):
            torch.cuda.synchronize()
            a = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            fn()
            e.record()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            host.append((t1 - t0) * 1e3)
            step.append(a.elapsed_time(e))
        k, names = kernels(fn) if len(res) < 2 else (None, None)
        gt = graph_time(fn) if phase == "decode" or n <= 512 else None
        r = dict(
            phase=phase,
            b=b,
            n=n,
            host_ms=statistics.median(host),
            eager_ms=statistics.median(step),
            graph_ms=gt,
            kernels=k,
        )
        if names:
            r["names"] = names
        print(json.dumps({kk: vv for kk, vv in r.items() if kk != "names"}), flush=True)
        res.append(r)
        del cache
out["steps"] = res
print(json.dumps({k: v for k, v in out.items() if k != "steps"}, indent=1))
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe.json"), "w"), indent=1)
