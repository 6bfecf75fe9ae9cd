"""Read a PyTorch profiler trace (Kineto / Chrome trace JSON, optionally gzipped) into frames.

``torch.profiler``'s ``export_chrome_trace`` writes one JSON object whose ``traceEvents``
list holds every CPU op, Python frame, runtime call, GPU kernel, copy and annotation of the
profiled steps. The importer needs three kinds of them:

- **GPU activity** (``kernel``, ``gpu_memcpy``, ``gpu_memset``): what the GPU ran, on which
  stream and device, and the ``correlation`` id CUPTI gave the call that launched it;
- **runtime calls** (``cuda_runtime``, ``cuda_driver``): ``cudaLaunchKernel``,
  ``cuLaunchKernelEx``, ``cudaGraphLaunch``, ``cudaMemcpyAsync``...: when the host
  launched each piece of GPU work (same ``correlation`` id), which tells a host-bound
  gap from a GPU-side wait;
- **annotations** (``user_annotation`` on the CPU, ``gpu_user_annotation`` projected on
  the GPU timeline): ``ProfilerStep#N`` and ``record_function`` ranges, which delimit
  steps and phases.

Everything else is dropped while reading, in one pass over the list after a single
``json.load`` (raw traces of one step are tens of MB, mostly CPU ops). Real files are
untidy, so the reader tolerates: the event list at the top level, nested one level deep
under another key, events that are not complete (``ph`` other than ``X``: metadata,
flows, instants), events without ``dur`` or ``args``, legacy capitalised categories and
string timestamps. Times are microseconds in the file; they are converted once, here,
to seconds relative to the earliest kept event (subtracting first keeps sub-microsecond
resolution of absolute timestamps).
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: event categories of GPU work (legacy spellings map onto these, see ``_ALIASES``)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
ANNOTATION_CATS = ("user_annotation", "gpu_user_annotation")
_ALIASES = {
    "kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "memset": "gpu_memset",
    "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
}
#: torch names each profiler step ``ProfilerStep#N``; older exports file it as a cpu_op
STEP_PREFIX = "ProfilerStep#"
US_PER_S = 1e6

GPU_COLUMNS = (
    "name", "cat", "ts_s", "dur_s", "end_s", "stream", "device", "correlation", "grid", "block",
)  # fmt: skip
RUNTIME_COLUMNS = ("name", "cat", "ts_s", "dur_s", "end_s", "correlation", "tid")
ANNOTATION_COLUMNS = ("name", "cat", "ts_s", "dur_s", "end_s", "tid", "device")


class TraceError(ValueError):
    """A file that is not a usable profiler trace; the message is one line: which file,
    what is wrong, what is expected."""


@dataclass(frozen=True)
class Trace:
    """The kept events of one trace file (see the module docstring); times in seconds
    from ``t0_us`` (the earliest kept event, microseconds in the file's clock)."""

    path: str
    gpu: pd.DataFrame  # GPU_COLUMNS, sorted by ts_s
    runtime: pd.DataFrame  # RUNTIME_COLUMNS
    annotations: pd.DataFrame  # ANNOTATION_COLUMNS
    t0_us: float
    skipped: int = 0  # GPU/runtime/annotation events without a usable ts or dur
    # top-level keys but the events (and long lists): deviceProperties, distributedInfo...
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def devices(self) -> list[int]:
        return sorted(int(d) for d in self.gpu["device"].unique())


_EXPECTED = (
    "allowed: a Chrome/Kineto trace JSON as torch.profiler's export_chrome_trace writes "
    "(.json or .json.gz)"
)


def _read_json(path: Path) -> Any:
    """``json.load`` of the file, gunzipped when it starts with gzip's magic bytes."""
    try:
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(path, "rb") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise OSError(f"trace {path} does not exist") from None
    except IsADirectoryError:
        raise OSError(f"trace {path} is a folder; allowed: a trace file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path} is not a profiler trace: not JSON ({exc}); {_EXPECTED}") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise TraceError(f"{path} is not a profiler trace: bad gzip data ({exc})") from None


def _event_list(data: Any, path: Path) -> tuple[list[Any], dict[str, Any]]:
    """The ``traceEvents`` list (top level, a bare list, or one level down) and the
    other top-level keys."""
    if isinstance(data, list):
        return data, {}
    if isinstance(data, dict):
        if isinstance(data.get("traceEvents"), list):
            return data["traceEvents"], {k: v for k, v in data.items() if k != "traceEvents"}
        for key, value in data.items():
            if isinstance(value, dict) and isinstance(value.get("traceEvents"), list):
                meta = {k: v for k, v in value.items() if k != "traceEvents"}
                return value["traceEvents"], {**meta, "nested_under": key}
    raise TraceError(f"{path} is not a profiler trace: no 'traceEvents' list; {_EXPECTED}")


def _num(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _int(value: Any, default: int = -1) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    num = _num(value)
    return int(num) if num is not None and num == num else default


def _split(events: list[Any]) -> tuple[list[tuple], list[tuple], list[tuple], int]:
    """One pass: (gpu rows, runtime rows, annotation rows, skipped), times in file µs."""
    gpu: list[tuple] = []
    runtime: list[tuple] = []
    ann: list[tuple] = []
    skipped = 0
    aliases = _ALIASES
    for ev in events:
        if type(ev) is not dict:
            continue
        raw_cat = ev.get("cat")
        if not isinstance(raw_cat, str):
            continue
        cat = aliases.get(raw_cat) or aliases.get(raw_cat.lower())
        name = ev.get("name")
        if cat is None:
            # older exports file ProfilerStep#N as a cpu_op
            if isinstance(name, str) and name.startswith(STEP_PREFIX):
                cat = "user_annotation"
            else:
                continue
        if ev.get("ph", "X") != "X":
            continue
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
        if ts is None or dur is None or dur < 0:
            skipped += 1
            continue
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        name = str(name) if name is not None else ""
        if cat in GPU_CATS:
            stream = _int(args.get("stream", ev.get("tid")))
            device = _int(args.get("device", ev.get("pid")), 0)
            gpu.append(
                (name, cat, ts, dur, stream, device, _int(args.get("correlation")),
                 _shape(args.get("grid")), _shape(args.get("block")))
            )  # fmt: skip
        elif cat in RUNTIME_CATS:
            runtime.append((name, cat, ts, dur, _int(args.get("correlation")), _int(ev.get("tid"))))
        else:
            device = _int(args.get("device", ev.get("pid")), -1) if cat != "user_annotation" else -1
            tid = _int(args.get("stream", ev.get("tid")))
            ann.append((name, cat, ts, dur, tid, device))
    return gpu, runtime, ann, skipped


def _shape(value: Any) -> str:
    """A launch grid/block as ``"x,y,z"`` (empty when absent): one text cell in CSVs."""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return "" if value is None else str(value)


def _frame(rows: list[tuple], columns: tuple[str, ...], t0_us: float) -> pd.DataFrame:
    """Rows with (ts, dur) in µs at positions 2, 3 -> a frame with ts_s, dur_s, end_s."""
    names = [c for c in columns if c not in ("ts_s", "dur_s", "end_s")]
    raw = pd.DataFrame(rows, columns=[names[0], names[1], "ts_us", "dur_us", *names[2:]])
    ts_s = (raw["ts_us"].to_numpy(dtype=float) - t0_us) / US_PER_S
    dur_s = raw["dur_us"].to_numpy(dtype=float) / US_PER_S
    out = raw.drop(columns=["ts_us", "dur_us"])
    out.insert(2, "ts_s", ts_s)
    out.insert(3, "dur_s", dur_s)
    out.insert(4, "end_s", ts_s + dur_s)
    return out.reindex(columns=list(columns))


def load_trace(path: str | Path) -> Trace:
    """Read ``path`` (see the module docstring); a file that is not a trace, or a trace
    without GPU activity, is one :class:`TraceError` line."""
    path = Path(path)
    events, meta = _event_list(_read_json(path), path)
    gpu, runtime, ann, skipped = _split(events)
    if not gpu:
        raise TraceError(
            f"{path}: no GPU kernels, memcpys or memsets among its {len(events)} events; "
            "allowed: a trace recorded with ProfilerActivity.CUDA"
        )
    t0_us = min(
        min(r[2] for r in gpu),
        min((r[2] for r in runtime), default=np.inf),
        min((r[2] for r in ann), default=np.inf),
    )
    gpu_f = _frame(gpu, GPU_COLUMNS, t0_us).sort_values("ts_s", kind="stable")
    return Trace(
        path=str(path),
        gpu=gpu_f.reset_index(drop=True),
        runtime=_frame(runtime, RUNTIME_COLUMNS, t0_us),
        annotations=_frame(ann, ANNOTATION_COLUMNS, t0_us),
        t0_us=float(t0_us),
        skipped=skipped,
        meta={k: v for k, v in meta.items() if not isinstance(v, list) or len(v) <= 64},
    )


def launch_times(trace: Trace) -> pd.Series:
    """Per GPU event (aligned with ``trace.gpu``): seconds when the host call that
    launched it started (the runtime/driver event of the same correlation id; the
    earliest when several share it), NaN when the trace has none."""
    rt = trace.runtime
    rt = rt[rt["correlation"] >= 0]
    first = rt.groupby("correlation")["ts_s"].min()
    corr = trace.gpu["correlation"]
    out = corr.map(first)
    out[corr < 0] = np.nan
    return out.astype(float)
