"""Shared machinery of the microbenchmark runner: rows, resumable CSV sink, timing,
failure classification, device metadata, progress and time budgets.

Imports only the standard library at module level; torch is imported lazily so
that ``--help`` and the CSV helpers work without it.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import json
import math
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Mirrors workloads/ops.py CSV_COLUMNS (+ EXTRA_COLUMNS); kept in sync by a test.
OP_COLUMNS: tuple[str, ...] = (
    "op",
    "dtype",
    "m",
    "n",
    "k",
    "batch",
    "seq_q",
    "seq_kv",
    "heads_q",
    "heads_kv",
    "head_dim",
    "causal",
    "backend",
    "density",
    "block_size",
    "bytes",
    "ranks",
    "nodes",
)
RESULT_COLUMNS: tuple[str, ...] = (
    "measured_ms",
    "suite",
    "family",
    "pattern",
    "status",
    "error",
    "avg_power_w",
    "energy_j",
)
COLUMNS: tuple[str, ...] = OP_COLUMNS + RESULT_COLUMNS
# A row's identity for resuming: what was measured, not what came out.
KEY_COLUMNS: tuple[str, ...] = (*OP_COLUMNS, "suite", "family", "pattern")
STATUSES = ("ok", "oom", "error", "unsupported")

# Environment variable that makes cases of the named op(s) raise (comma-separated op
# names, or "*"): lets tests check that a failing kernel is recorded, not fatal.
INJECT_FAIL_ENV = "CALIBRATE_BENCH_INJECT_FAIL"

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10


# --------------------------------------------------------------------------- rows


def fmt(value: Any) -> str:
    """One canonical text form per value, so that keys read back from a CSV match."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return str(value)


def row_key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(fmt(row.get(c)) for c in KEY_COLUMNS)


@dataclass
class Case:
    """One measurement to make: its op-CSV row fields and private parameters."""

    row: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    group: str = ""  # cases of one group share a shard (e.g. one compiled kernel)

    @property
    def key(self) -> tuple[str, ...]:
        return row_key(self.row)


class CsvSink:
    """Append-only CSV, one flushed row at a time; remembers rows already present."""

    def __init__(self, path: Path, columns: tuple[str, ...] = COLUMNS):
        self.path = Path(path)
        self.columns = columns
        self.done: set[tuple[str, ...]] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        if not new:
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f)
                if reader.fieldnames is None or list(reader.fieldnames) != list(columns):
                    raise SystemExit(
                        f"{self.path}: existing CSV has other columns than this runner writes; "
                        "move it away or pass another --out"
                    )
                for r in reader:
                    self.done.add(tuple(r.get(c) or "" for c in KEY_COLUMNS))
        self._f = self.path.open("a", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=list(columns), extrasaction="raise")
        if new:
            self._w.writeheader()
            self._f.flush()

    def __contains__(self, key: tuple[str, ...]) -> bool:
        return key in self.done

    def write(self, row: dict[str, Any]) -> None:
        self._w.writerow({c: fmt(row.get(c)) for c in self.columns})
        self._f.flush()
        self.done.add(row_key(row))

    def close(self) -> None:
        self._f.close()


def read_rows(path: Path) -> list[dict[str, str]]:
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- context


@dataclass
class Context:
    """What every suite needs to know about the run."""

    mode: str = "full"  # full | quick | tiny
    device: str = "cuda"
    timer: str = "events"  # events | triton
    warmup_ms: float = 10.0
    rep_ms: float = 40.0
    seed: int = 0
    l2_bytes: int = 50 * MiB
    mem_bytes: int = 80 * GiB
    sm_count: int = 0
    gpu_name: str = ""
    _flush_buf: Any = None

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def tiny(self) -> bool:
        return self.mode == "tiny"

    @property
    def quick(self) -> bool:
        return self.mode == "quick"

    def input_budget_bytes(self) -> int:
        """Largest input set a case may allocate (8 GiB, or a quarter of the card)."""
        if not self.is_cuda:
            return 256 * MiB
        return min(8 * GiB, self.mem_bytes // 4)

    def flush_l2(self) -> None:
        if self._flush_buf is None:
            import torch

            nbytes = max(4 * self.l2_bytes, 64 * MiB)
            self._flush_buf = torch.empty(nbytes, dtype=torch.int8, device=self.device)
        self._flush_buf.zero_()


def make_context(mode: str, device: str, timer: str, seed: int) -> Context:
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch sees no CUDA device")
    ctx = Context(mode=mode, device=device, timer=timer, seed=seed)
    if mode == "tiny":
        ctx.warmup_ms, ctx.rep_ms = 1.0, 3.0
    elif mode == "quick":
        ctx.warmup_ms, ctx.rep_ms = 5.0, 20.0
    if ctx.is_cuda:
        props = torch.cuda.get_device_properties(0)
        ctx.l2_bytes = int(getattr(props, "L2_cache_size", 50 * MiB) or 50 * MiB)
        ctx.mem_bytes = int(props.total_memory)
        ctx.sm_count = int(props.multi_processor_count)
        ctx.gpu_name = props.name
    return ctx


# --------------------------------------------------------------------------- timing


def rotating(make_inputs: Callable[[], Any], set_bytes: int, ctx: Context) -> list[Any]:
    """Several input sets when one fits in L2, so that repeats don't time the cache."""
    n = 1
    if ctx.is_cuda and set_bytes > 0 and set_bytes < 2 * ctx.l2_bytes:
        n = min(8, max(2, math.ceil(4 * ctx.l2_bytes / set_bytes)))
    return [make_inputs() for _ in range(n)]


PAD_S = 100e-6  # host head start before each short timed call
PAD_BELOW_MS = 1.0


def bench(
    fn: Callable[[], Any],
    ctx: Context,
    *,
    warmup_ms: float | None = None,
    rep_ms: float | None = None,
    min_reps: int = 5,
    max_reps: int = 300,
) -> float:
    """Median milliseconds of ``fn()``.

    CUDA: like ``triton.testing.do_bench`` (events around each call, L2 flushed
    before each call, warm-up, median), but with a floor and a ceiling on the number
    of repeats so that long kernels still get several samples. ``--timer triton``
    calls ``do_bench`` itself. CPU: wall clock, median of a few calls.
    """
    warmup_ms = ctx.warmup_ms if warmup_ms is None else warmup_ms
    rep_ms = ctx.rep_ms if rep_ms is None else rep_ms
    if not ctx.is_cuda:
        fn()
        t0 = time.perf_counter()
        fn()
        est_ms = (time.perf_counter() - t0) * 1e3
        reps = max(3, min(50, int(rep_ms / max(est_ms, 1e-3))))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    import torch

    if ctx.timer == "triton":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))

    fn()
    torch.cuda.synchronize()
    # estimate (with the flush, as do_bench does)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        ctx.flush_l2()
        fn()
    end.record()
    torch.cuda.synchronize()
    est_ms = max(start.elapsed_time(end) / 3, 1e-3)
    if est_ms > 50:
        min_reps = min(min_reps, 3)
    n_warm = max(1, min(100, int(warmup_ms / est_ms)))
    n_rep = max(min_reps, min(max_reps, int(rep_ms / est_ms)))
    for _ in range(n_warm):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    # A kernel shorter than the host's dispatch time would otherwise be timed host-bound
    # (the GPU idles between the start event and the kernel): a GPU spin after the flush
    # lets the host enqueue the call before the GPU reaches the start event.
    pad_cycles = int(PAD_S * 2e9) if est_ms < PAD_BELOW_MS else 0
    for i in range(n_rep):
        ctx.flush_l2()
        if pad_cycles:
            torch.cuda._sleep(pad_cycles)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def cuda_event_times_ms(fn: Callable[[], Any], reps: int, warmup: int = 2) -> list[float]:
    """Milliseconds of ``reps`` calls of ``fn`` after ``warmup`` untimed ones, each between
    two CUDA events and synchronised (the whole-call timer of the step and function
    benchmarks: host launch time included, unlike :func:`bench`'s kernel timers)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def synchronize(ctx: Context) -> None:
    if ctx.is_cuda:
        import torch

        torch.cuda.synchronize()


# --------------------------------------------------------------------------- failures


class Unsupported(Exception):
    """The requested kernel does not exist for this case (recorded as 'unsupported')."""


class FatalDeviceError(Exception):
    """The CUDA context is broken (sticky error): the process must stop."""


_UNSUPPORTED_HINTS = (
    "no available kernel",
    "no viable backend",
    "novalidchoiceserror",
    "not implemented for",
    "not supported",
    "unsupported",
    "only supports",
    "is not available",
)
_STICKY_HINTS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "cuda error: an illegal",
)


def classify(exc: BaseException) -> tuple[str, str]:
    """(status, short error text) for an exception raised by a case."""
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    low = text.lower()
    if name == "OutOfMemoryError" or "out of memory" in low:
        status = "oom"
    elif isinstance(exc, (Unsupported, NotImplementedError)) or any(
        h in low for h in _UNSUPPORTED_HINTS
    ):
        status = "unsupported"
    else:
        status = "error"
    short = f"{name}: {text}"
    return status, (short[:197] + "...") if len(short) > 200 else short


def is_sticky(exc: BaseException) -> bool:
    low = str(exc).lower()
    return any(h in low for h in _STICKY_HINTS)


def maybe_inject_failure(op: str) -> None:
    want = os.environ.get(INJECT_FAIL_ENV, "")
    if want and (want == "*" or op in want.split(",")):
        raise RuntimeError(f"injected failure for op {op!r} ({INJECT_FAIL_ENV})")


def cleanup(ctx: Context) -> None:
    import gc

    gc.collect()
    if ctx.is_cuda:
        import torch

        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- metadata


def _run(cmd: list[str], timeout: float = 20) -> str:
    if shutil.which(cmd[0]) is None:
        return ""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _nvml_handle():
    try:
        import pynvml
    except ImportError:
        return None, None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None, None
    handle = None
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(0).uuid)
        if not uuid.startswith("GPU-"):
            uuid = "GPU-" + uuid
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:
        handle = None
    if handle is None:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(vis) if vis.isdigit() else 0)
        except Exception:
            handle = None
    return pynvml, handle


def clocks_snapshot(ctx: Context) -> dict[str, Any]:
    """SM/memory clocks, power and temperature now (NVML, else nvidia-smi)."""
    snap: dict[str, Any] = {"time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    if not ctx.is_cuda:
        return snap
    nv, h = _nvml_handle()
    if nv is not None and h is not None:
        for key, fn in (
            ("clocks_sm_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            ("clocks_mem_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            ("clocks_max_sm_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
            ("clocks_max_mem_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)),
            ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
            ("temperature_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        ):
            with contextlib.suppress(Exception):
                snap[key] = fn()
        snap["source"] = "nvml"
        return snap
    out = _run(
        [
            "nvidia-smi",
            "--query-gpu=index,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu",
            "--format=csv,noheader",
        ]
    )
    if out:
        snap["nvidia_smi"] = out.splitlines()
        snap["source"] = "nvidia-smi"
    return snap


def environment(ctx: Context, device_kind: str = "") -> dict[str, Any]:
    """Static facts about the machine and software, for the dataset's metadata."""
    import torch

    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "device_kind": device_kind or os.environ.get("CALIBRATE_DEVICE_KIND", ""),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": ctx.device,
        "mode": ctx.mode,
        "timer": ctx.timer,
        "warmup_ms": ctx.warmup_ms,
        "rep_ms": ctx.rep_ms,
        "timing_method": (
            "median of CUDA-event-timed calls, L2 flushed before each call, after warm-up"
            if ctx.is_cuda
            else "median wall-clock of a few calls (CPU)"
        ),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    try:
        env["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        env["cudnn"] = None
    if ctx.is_cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu_name=props.name,
            gpu_count=torch.cuda.device_count(),
            sm_count=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
            memory_bytes=int(props.total_memory),
            l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
        )
        try:
            v = torch.cuda.nccl.version()
            env["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            env["nccl"] = None
        nv, h = _nvml_handle()
        if nv is not None:
            try:
                d = nv.nvmlSystemGetDriverVersion()
                env["driver"] = d.decode() if isinstance(d, bytes) else d
            except Exception:
                pass
        if "driver" not in env:
            env["driver"] = _run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            ).split("\n")[0]
        env["nvidia_smi_L"] = _run(["nvidia-smi", "-L"])
    return env


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- selection


def parse_shard(text: str | None) -> tuple[int, int]:
    if not text:
        return 0, 1
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SystemExit(f"--shard must look like i/n (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise SystemExit(f"--shard {text!r}: need 0 <= i < n")
    return i, n


def select(cases: list[Case], shard: tuple[int, int], limit: int | None) -> list[Case]:
    """This shard's cases (whole groups, round-robin) and, with ``limit``, an evenly
    spaced sample of them."""
    i, n = shard
    if n > 1:
        groups: dict[str, int] = {}
        for j, c in enumerate(cases):
            groups.setdefault(c.group or f"#{j}", len(groups))
        cases = [c for j, c in enumerate(cases) if groups[c.group or f"#{j}"] % n == i]
    if limit is not None and len(cases) > limit:
        step = len(cases) / limit
        cases = [cases[int(j * step)] for j in range(limit)]
    return cases


def dedupe(cases: Iterable[Case]) -> list[Case]:
    """Drop cases measuring the same op as an earlier one (first family wins)."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for c in cases:
        k = tuple(fmt(c.row.get(col)) for col in OP_COLUMNS)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


def shuffled(cases: list[Case], seed: int, head: int = 0) -> list[Case]:
    """Seeded shuffle (keeping the first ``head`` cases first), so that a run cut
    short by its time budget still covers every family."""
    rest = cases[head:]
    random.Random(seed).shuffle(rest)
    return cases[:head] + rest


# --------------------------------------------------------------------------- progress


class Progress:
    """rich progress bar on a terminal, else a plain line every few seconds."""

    def __init__(self, suite: str, total: int):
        self.suite, self.total, self.n = suite, total, 0
        self.counts: dict[str, int] = {}
        self.t0 = time.monotonic()
        self._last = self.t0
        self._rich = None
        if sys.stdout.isatty():
            try:
                from rich.progress import Progress as RP

                self._rich = RP(transient=False)
                self._rich.start()
                self._task = self._rich.add_task(suite, total=total)
            except Exception:
                self._rich = None

    def update(self, status: str, label: str = "") -> None:
        self.n += 1
        self.counts[status] = self.counts.get(status, 0) + 1
        if self._rich is not None:
            self._rich.update(self._task, advance=1, description=f"{self.suite} {label}"[:60])
            return
        now = time.monotonic()
        if now - self._last > 15 or self.n == self.total:
            self._last = now
            print(
                f"[{self.suite}] {self.n}/{self.total} {self._counts()} "
                f"{now - self.t0:.0f}s {label}",
                flush=True,
            )

    def _counts(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()


# --------------------------------------------------------------------------- the loop


@dataclass
class SuiteResult:
    suite: str
    planned: int = 0
    skipped_done: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    stopped_early: bool = False
    not_run: int = 0
    elapsed_s: float = 0.0
    fatal: str = ""


def run_cases(
    suite: str,
    cases: list[Case],
    run_one: Callable[[Case, Context], dict[str, Any]],
    ctx: Context,
    sink: CsvSink,
    deadline: float,
    *,
    before_group: Callable[[str, Context, float], str | None] | None = None,
) -> SuiteResult:
    """Measure each case not already in ``sink``; record every outcome as a row.

    ``run_one`` returns the measured fields (``measured_ms`` and optionally
    ``avg_power_w``, ``energy_j``); exceptions become rows with a status. The loop
    stops when ``deadline`` (time.monotonic) passes, leaving the CSV complete.
    ``before_group`` may veto a whole group (e.g. too little time left to compile):
    it returns a reason, and that group's cases are left unrun.
    """
    res = SuiteResult(suite, planned=len(cases))
    for c in cases:
        c.row.setdefault("suite", suite)  # part of the key rows are resumed by
    todo = [c for c in cases if c.key not in sink]
    res.skipped_done = len(cases) - len(todo)
    prog = Progress(suite, len(todo))
    t0 = time.monotonic()
    vetoed: dict[str, str] = {}
    try:
        for idx, case in enumerate(todo):
            if time.monotonic() > deadline:
                res.stopped_early = True
                res.not_run = len(todo) - idx
                print(f"[{suite}] time budget spent: {res.not_run} case(s) left unrun", flush=True)
                break
            if before_group is not None and case.group:
                if case.group not in vetoed:
                    vetoed[case.group] = before_group(case.group, ctx, deadline) or ""
                if vetoed[case.group]:
                    res.not_run += 1
                    continue
            row = dict(case.row)
            row["suite"] = suite
            try:
                maybe_inject_failure(str(row.get("op")))
                out = run_one(case, ctx)
                row.update(out)
                row["status"] = "ok"
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # recorded, never fatal unless the context broke
                status, err = classify(exc)
                row["status"], row["error"] = status, err
                sticky = is_sticky(exc)
                if not sticky and ctx.is_cuda:
                    try:
                        synchronize(ctx)
                    except Exception as exc2:
                        sticky = is_sticky(exc2) or True
                if sticky:
                    sink.write(row)
                    res.counts[status] = res.counts.get(status, 0) + 1
                    res.fatal = err
                    raise FatalDeviceError(err) from exc
            finally:
                case.params.pop("_state", None)
            sink.write(row)
            res.counts[row["status"]] = res.counts.get(row["status"], 0) + 1
            if row["status"] != "ok":
                cleanup(ctx)
            prog.update(row["status"], label=_label(row))
    finally:
        prog.close()
        res.elapsed_s = time.monotonic() - t0
    return res


def _label(row: dict[str, Any]) -> str:
    parts = [str(row.get("op"))]
    for c in ("dtype", "m", "n", "k", "seq_kv", "bytes", "backend"):
        v = row.get(c)
        if v not in (None, ""):
            parts.append(f"{c}={v}")
    return " ".join(parts)


def out_name(suite: str, shard: tuple[int, int]) -> str:
    i, n = shard
    return f"{suite}.csv" if n == 1 else f"{suite}.shard{i}of{n}.csv"
