"""Probe (kept for reproducibility): eager decode vs eager prefill 1x512 in one session.

python3 -m calibrate.steps.probes.host_session   # writes $OUT/probe3.json
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

dev, dt = "cuda", torch.bfloat16
print(torch.cuda.get_device_name(0), flush=True)
w = make_weights(A, dev, dt, 0)
rope = rope_table(A, 8300, dev)


def mk(phase, b, n):
    if phase == "decode":
        cache = make_cache(A, b, n + 1, dev, dt, 0)
        tok = torch.randint(0, A.vocab, (b, 1), device=dev)
        return lambda: decode_step(A, w, cache, tok, n, rope, "native")
    cache = make_cache(A, b, n, dev, dt, 0)
    tok = torch.randint(0, A.vocab, (b, n), device=dev)
    return lambda: forward(A, w, cache, tok, 0, rope, "native")


cfgs = [
    ("decode", 1, 1024),
    ("prefill", 1, 512),
    ("decode", 8, 4096),
    ("prefill", 2, 512),
    ("decode", 32, 1024),
]
fns = {c: mk(*c) for c in cfgs}
res = {f"{c[0]} {c[1]}x{c[2]}": {"host": [], "step": []} for c in cfgs}
with torch.inference_mode():
    for c in cfgs:
        for _ in range(3):
            fns[c]()
    torch.cuda.synchronize()
    for rnd in range(4):
        for c in cfgs:
            for _ in range(5):
                torch.cuda.synchronize()
                a = torch.cuda.Event(enable_timing=True)
                e = torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                a.record()
                fns[c]()
                e.record()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                k = f"{c[0]} {c[1]}x{c[2]}"
                res[k]["host"].append((t1 - t0) * 1e3)
                res[k]["step"].append(a.elapsed_time(e))
        print(
            rnd,
            {
                k: (
                    round(statistics.median(v["host"][-5:]), 2),
                    round(statistics.median(v["step"][-5:]), 2),
                )
                for k, v in res.items()
            },
            flush=True,
        )
summary = {
    k: {"host_ms": statistics.median(v["host"]), "step_ms": statistics.median(v["step"])}
    for k, v in res.items()
}
print(json.dumps(summary, indent=1))
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe3.json"), "w"))
