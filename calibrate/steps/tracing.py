"""Profiler traces of measured steps, trimmed to what the trace importer reads.

Every whole-step measurement keeps a ``torch.profiler`` trace beside its row, so the
composition of the step (which kernels ran, where the GPU sat idle and why) can be read
later by ``simcli trace import`` and fitted by ``simcli calibrate from-trace``. A raw
Kineto export of one eager step of a 1B model is tens of MB, most of it CPU-side operator
and Python events; the importer needs only GPU activity, the runtime calls that launched
it (correlation ids: host-bound gaps) and the annotations that delimit steps and phases.
``trim`` keeps exactly those and gzips the result (about 1-3% of the raw size).

Imports only the standard library at module level; torch is imported inside ``capture``.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: event categories the importer reads; everything else (cpu_op, python_function, ...)
#: is dropped. ``ac2g`` are the flow arrows that join a launch to its kernel.
KEEP_CATS = frozenset(
    {
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "cuda_runtime",
        "cuda_driver",
        "user_annotation",
        "gpu_user_annotation",
        "Trace",
    }
)
#: runtime/driver calls worth keeping: those that put work on the GPU or wait for it
#: (the correlation id of a launch is what joins it to its kernel; the ``ac2g`` flow
#: arrows say the same thing again and are dropped)
KEEP_RUNTIME = ("Launch", "Memcpy", "Memset", "Synchronize", "StreamWait", "EventRecord")
#: args of kept events that the importer may use; the rest (e.g. long shape strings) go
KEEP_ARGS = frozenset(
    {
        "correlation",
        "stream",
        "device",
        "grid",
        "block",
        "bytes",
        "External id",
        "name",
        "labels",
        "sort_index",
    }
)


def trim(events: dict[str, Any]) -> dict[str, Any]:
    """The kept subset of a Kineto/Chrome trace object (metadata events are kept)."""
    kept = []
    for ev in events.get("traceEvents", []):
        cat = ev.get("cat")
        if cat in ("cuda_runtime", "cuda_driver") and not any(
            key in ev.get("name", "") for key in KEEP_RUNTIME
        ):
            continue
        if ev.get("ph") == "M" or cat in KEEP_CATS:
            args = ev.get("args")
            if isinstance(args, dict):
                ev = {**ev, "args": {k: v for k, v in args.items() if k in KEEP_ARGS}}
            kept.append(ev)
    out = {k: v for k, v in events.items() if k != "traceEvents"}
    out["traceEvents"] = kept
    return out


def write_trimmed(raw_path: Path, dst: Path, extra: dict[str, Any] | None = None) -> int:
    """Trim the raw export at ``raw_path`` into gzipped ``dst`` (atomic); kept events."""
    with open(raw_path) as fh:
        data = trim(json.load(fh))
    if extra:
        data["simcli"] = extra
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, suffix=".tmp")
    os.close(fd)
    with gzip.open(tmp, "wt", compresslevel=6) as fh:
        json.dump(data, fh, separators=(",", ":"))
    os.chmod(tmp, 0o644)
    os.replace(tmp, dst)
    return len(data["traceEvents"])


def capture(
    fn: Callable[[], Any],
    dst: Path,
    *,
    steps: int = 2,
    cuda: bool = True,
    extra: dict[str, Any] | None = None,
) -> int:
    """Run ``fn`` once untraced-but-profiled (warm-up) and ``steps`` times traced, each
    inside a ``ProfilerStep#N`` window; write the trimmed trace to ``dst``.

    Returns the number of events kept. The profiler's own warm-up step keeps CUPTI's
    start-up cost out of the traced steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with tempfile.TemporaryDirectory() as tmpdir:
        raw = Path(tmpdir) / "raw.json"
        sched = schedule(wait=0, warmup=1, active=steps, repeat=1)
        with profile(activities=acts, schedule=sched, record_shapes=False) as prof:
            for _ in range(steps + 1):
                fn()
                if cuda:
                    torch.cuda.synchronize()
                prof.step()
        prof.export_chrome_trace(str(raw))
        return write_trimmed(raw, dst, extra)


def trace_name(*parts: object) -> str:
    """A file name from config parts: letters, digits, '.', '_' and '-' only."""
    text = ".".join(str(p) for p in parts if str(p))
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in text)
    return f"{safe}.trace.json.gz"
