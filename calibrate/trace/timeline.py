"""Steps, busy time and idle gaps on one GPU's timeline, and why the GPU was idle.

**Steps.** A step is delimited by a profiler annotation: ``ProfilerStep#N`` (what
``torch.profiler``'s ``prof.step()`` records) or a user's ``record_function`` name. Each
GPU event belongs to the step whose CPU-side annotation contains the *launch* of the event
(the runtime call with the same correlation id): the GPU runs behind the host, so its
kernels usually start after the annotation has closed. Events without a launch fall back
on their GPU start between one step's annotation and the next; annotations seen only on
the GPU timeline (``gpu_user_annotation``) delimit by GPU time. Without any annotation the
whole trace is one step. A step's measured wall time is its GPU window: first start to
last end of its events.

**Where a step's window goes.** Every instant of the window is exactly one of:

- *compute*: some non-NCCL GPU work runs (kernels, copies, memsets) on any stream;
- *exposed communication*: only NCCL collectives (all-reduce, all-gather,
  reduce-scatter, all-to-all) run: communication that compute did not hide;
- *pipeline wait*: only NCCL send/recv kernels run: a pipeline bubble, the rank waiting
  for its peer's activations or gradients;
- *host-bound*: nothing runs, and the work that ends the gap was launched by the host
  after the GPU went idle (the launch call started at or after the gap's start): the GPU
  waited for the CPU (Python, dispatch, launch overhead);
- *other idle*: nothing runs although the next work had been launched before: it waited
  on a dependency (an event, a stream synchronisation, a host copy).

So the window is compute + exposed_comm + pipeline_wait + host_bound + other. The NCCL
time that ran beside compute is the overlapped communication.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from calibrate.trace.classify import classify
from calibrate.trace.kineto import STEP_PREFIX, Trace, launch_times

GAP_KINDS: tuple[str, ...] = ("host_bound", "exposed_comm", "pipeline_wait", "other")
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
_EPS_S = 1e-12  # equal timestamps: both come from the same microsecond numbers


# --------------------------------------------------------------------------- intervals


@dataclass(frozen=True)
class Intervals:
    """Disjoint, sorted [start, end) intervals (seconds)."""

    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def union(cls, starts: np.ndarray, ends: np.ndarray) -> Intervals:
        """The union of possibly overlapping intervals."""
        s, e = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
        keep = e > s
        s, e = s[keep], e[keep]
        if not len(s):
            return cls(np.zeros(0), np.zeros(0))
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)
        new = np.r_[True, s[1:] > reach[:-1]]
        idx = np.flatnonzero(new)
        return cls(s[idx], np.maximum.reduceat(e, idx))

    def contains(self, t: np.ndarray) -> np.ndarray:
        """Which points of ``t`` lie inside an interval."""
        i = np.searchsorted(self.starts, t, side="right") - 1
        ok = i >= 0
        out = np.zeros(len(t), dtype=bool)
        out[ok] = t[ok] < self.ends[i[ok]]
        return out

    @property
    def total(self) -> float:
        return float((self.ends - self.starts).sum())


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class StepWindow:
    """One step: its annotation (name, CPU or GPU range) and the GPU window of its events."""

    index: int
    name: str
    start_s: float  # GPU window
    end_s: float

    @property
    def wall_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class StepTimeline:
    """Where one step's GPU window went (see the module docstring), seconds."""

    window: StepWindow
    events: int
    busy_s: float  # any GPU activity
    compute_s: float  # non-NCCL activity
    comm_s: float  # NCCL kernels
    comm_overlapped_s: float  # NCCL time beside compute
    gaps_s: dict[str, float]
    host_bound_gaps: int  # how many idle gaps were host-bound

    def row(self) -> dict[str, float | int | str]:
        w = self.window
        return {
            "step": w.index,
            "name": w.name,
            "start_s": w.start_s,
            "end_s": w.end_s,
            "wall_s": w.wall_s,
            "events": self.events,
            "busy_s": self.busy_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "comm_overlapped_s": self.comm_overlapped_s,
            **{f"{k}_s": v for k, v in self.gaps_s.items()},
            "host_bound_gaps": self.host_bound_gaps,
        }


def _matches(names: pd.Series, marker: str | None) -> np.ndarray:
    """Annotation names that mark a step: ``marker``, ``marker#N``, or (no marker) torch's
    ``ProfilerStep#N``."""
    if marker is None:
        return names.str.startswith(STEP_PREFIX).to_numpy()
    return ((names == marker) | names.str.startswith(f"{marker}#")).to_numpy()


def _ranges(ann: pd.DataFrame, mask: np.ndarray, gpu_side: bool) -> pd.DataFrame:
    """Annotation ranges (name, ts_s, end_s), sorted; GPU-side ones (one per stream) are
    merged per name into one range per occurrence."""
    cat = "gpu_user_annotation" if gpu_side else "user_annotation"
    part = ann[mask & (ann["cat"] == cat).to_numpy()]
    if not gpu_side or part.empty:
        return part[["name", "ts_s", "end_s"]].sort_values("ts_s").reset_index(drop=True)
    rows = []
    for name, grp in part.groupby("name", sort=False):
        u = Intervals.union(grp["ts_s"].to_numpy(), grp["end_s"].to_numpy())
        rows += [(name, s, e) for s, e in zip(u.starts, u.ends, strict=True)]
    out = pd.DataFrame(rows, columns=["name", "ts_s", "end_s"])
    return out.sort_values("ts_s").reset_index(drop=True)


def _in_ranges(t: np.ndarray, ranges: pd.DataFrame) -> np.ndarray:
    """Index of the range containing each time (-1: none); ranges sorted, disjoint."""
    starts, ends = ranges["ts_s"].to_numpy(), ranges["end_s"].to_numpy()
    i = np.searchsorted(starts, t, side="right") - 1
    ok = (i >= 0) & ~np.isnan(t)
    ok[ok] = t[ok] <= ends[i[ok]]
    return np.where(ok, i, -1)


def assign_steps(
    events: pd.DataFrame, annotations: pd.DataFrame, marker: str | None
) -> tuple[np.ndarray, list[str], str]:
    """(step index of each event, -1 outside every step; step names; how steps were
    found: ``cpu annotations``, ``gpu annotations`` or ``whole trace``). ``events`` needs
    ``ts_s`` and ``launch_ts_s``."""
    names = annotations["name"].astype(str)
    mask = _matches(names, marker) if len(annotations) else np.zeros(0, dtype=bool)
    cpu = _ranges(annotations, mask, gpu_side=False) if len(annotations) else None
    if cpu is not None and len(cpu):
        launch = events["launch_ts_s"].to_numpy()
        step = _in_ranges(launch, cpu)
        # events without a launch: by GPU start, up to the next step's annotation
        lost = np.isnan(launch)
        if lost.any():
            starts = cpu["ts_s"].to_numpy()
            ends = np.r_[starts[1:], np.inf]
            t = events["ts_s"].to_numpy()[lost]
            i = np.searchsorted(starts, t, side="right") - 1
            ok = (i >= 0) & (t < ends[np.maximum(i, 0)])
            step[np.flatnonzero(lost)] = np.where(ok, i, -1)
        return step, cpu["name"].tolist(), "cpu annotations"
    gpu = _ranges(annotations, mask, gpu_side=True) if len(annotations) else None
    if gpu is not None and len(gpu):
        return _in_ranges(events["ts_s"].to_numpy(), gpu), gpu["name"].tolist(), "gpu annotations"
    return np.zeros(len(events), dtype=int), ["whole trace"], "whole trace"


def phase_of(events: pd.DataFrame, annotations: pd.DataFrame, name: str) -> np.ndarray | None:
    """Which events a phase annotation (``record_function(name)``) covers: by launch time
    inside its CPU ranges, else by GPU start inside its GPU ranges; None when the trace
    has no annotation of that name."""
    if not len(annotations):
        return None
    mask = (annotations["name"] == name).to_numpy()
    cpu = _ranges(annotations, mask, gpu_side=False)
    if len(cpu):
        merged = Intervals.union(cpu["ts_s"].to_numpy(), cpu["end_s"].to_numpy())
        ranges = pd.DataFrame({"ts_s": merged.starts, "end_s": merged.ends})
        return _in_ranges(events["launch_ts_s"].to_numpy(), ranges) >= 0
    gpu = _ranges(annotations, mask, gpu_side=True)
    if len(gpu):
        merged = Intervals.union(gpu["ts_s"].to_numpy(), gpu["end_s"].to_numpy())
        return merged.contains(events["ts_s"].to_numpy())
    return None


# --------------------------------------------------------------------------- one step


def analyse_window(events: pd.DataFrame, window: StepWindow, n_events: int) -> StepTimeline:
    """Split ``window`` (see the module docstring). ``events``: every GPU event of the
    device (any step: work of a neighbouring step that overlaps the window counts as
    busy), with ``op_class``, ``detail`` and ``launch_ts_s``."""
    lo, hi = window.start_s, window.end_s
    near = events[(events["end_s"] > lo) & (events["ts_s"] < hi)]
    s = np.clip(near["ts_s"].to_numpy(), lo, hi)
    e = np.clip(near["end_s"].to_numpy(), lo, hi)
    nccl = (near["op_class"] == "collective").to_numpy()
    p2p = nccl & (near["detail"] == "send_recv").to_numpy()
    compute = Intervals.union(s[~nccl], e[~nccl])
    coll = Intervals.union(s[nccl & ~p2p], e[nccl & ~p2p])
    pipe = Intervals.union(s[p2p], e[p2p])
    comm = Intervals.union(s[nccl], e[nccl])
    bounds = np.unique(np.r_[lo, hi, compute.starts, compute.ends, comm.starts, comm.ends,
                             coll.starts, coll.ends])  # fmt: skip
    bounds = bounds[(bounds >= lo) & (bounds <= hi)]
    mids, lens = (bounds[:-1] + bounds[1:]) / 2, np.diff(bounds)
    in_compute, in_coll, in_pipe = compute.contains(mids), coll.contains(mids), pipe.contains(mids)
    exposed = ~in_compute & in_coll
    waiting = ~in_compute & ~in_coll & in_pipe
    idle = ~in_compute & ~in_coll & ~in_pipe
    host, other, n_host = _idle_gaps(near, bounds, idle)
    comm_s = comm.total
    return StepTimeline(
        window=window,
        events=n_events,
        busy_s=float(lens[~idle].sum()),
        compute_s=float(lens[in_compute].sum()),
        comm_s=comm_s,
        comm_overlapped_s=float(lens[in_compute & (in_coll | in_pipe)].sum()),
        gaps_s={
            "host_bound": host,
            "exposed_comm": float(lens[exposed].sum()),
            "pipeline_wait": float(lens[waiting].sum()),
            "other": other,
        },
        host_bound_gaps=n_host,
    )


def _idle_gaps(
    near: pd.DataFrame, bounds: np.ndarray, idle: np.ndarray
) -> tuple[float, float, int]:
    """(host-bound seconds, other idle seconds, host-bound gap count) of the idle
    segments: each maximal idle run is one gap, judged by the launch of the work that
    ends it."""
    if not idle.any():
        return 0.0, 0.0, 0
    edges = np.diff(np.r_[0, idle.astype(np.int8), 0])
    first, last = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    g0, g1 = bounds[first], bounds[last]
    order = np.argsort(near["ts_s"].to_numpy(), kind="stable")
    ts = near["ts_s"].to_numpy()[order]
    launch = near["launch_ts_s"].to_numpy()[order]
    host = other = 0.0
    n_host = 0
    for a, b in zip(g0, g1, strict=True):
        i, j = np.searchsorted(ts, b - _EPS_S), np.searchsorted(ts, b + _EPS_S, side="right")
        starters = launch[i:j]
        starters = starters[~np.isnan(starters)]
        if len(starters) and starters.min() >= a - _EPS_S:
            host += b - a
            n_host += 1
        else:
            other += b - a
    return float(host), float(other), n_host


# --------------------------------------------------------------------------- whole trace


@dataclass(frozen=True)
class Timeline:
    """A trace's GPU events of one device, classified and assigned to steps, and each
    step's split (see the module docstring)."""

    events: pd.DataFrame  # GPU events of ``device``: + op_class, detail, launch_ts_s, step
    steps: list[StepTimeline]
    device: int
    step_source: str  # cpu annotations | gpu annotations | whole trace
    phases: dict[str, np.ndarray] = field(default_factory=dict)  # phase -> event mask
    warnings: list[str] = field(default_factory=list)

    @property
    def measured(self) -> pd.DataFrame:
        """The events inside some step."""
        return self.events[self.events["step"] >= 0]

    def mean_gaps_s(self) -> dict[str, float]:
        return {k: float(np.mean([s.gaps_s[k] for s in self.steps])) for k in GAP_KINDS}

    def mean(self, attr: str) -> float:
        return float(np.mean([getattr(s, attr) for s in self.steps]))

    @property
    def wall_s(self) -> float:
        """Mean GPU wall time of a step."""
        return float(np.mean([s.window.wall_s for s in self.steps]))


def pick_device(gpu: pd.DataFrame, device: int | None = None) -> int:
    """``device``, or the device that ran the most GPU time (a trace of one rank may
    hold a stray event of another)."""
    if device is not None:
        if device not in set(gpu["device"].tolist()):
            known = ", ".join(str(d) for d in sorted(gpu["device"].unique()))
            raise ValueError(f"device {device} has no GPU events in the trace; allowed: {known}")
        return device
    return int(gpu.groupby("device")["dur_s"].sum().idxmax())


def build_timeline(
    trace: Trace,
    *,
    step_marker: str | None = None,
    phase_markers: dict[str, str] | None = None,
    device: int | None = None,
) -> Timeline:
    """Classify, assign to steps and split every step of ``trace`` (one device)."""
    dev = pick_device(trace.gpu, device)
    warnings: list[str] = []
    if len(trace.gpu["device"].unique()) > 1:
        warnings.append(f"trace has GPU events of several devices; analysed device {dev}")
    events = trace.gpu.assign(launch_ts_s=launch_times(trace).to_numpy())
    events = classify(events[events["device"] == dev].reset_index(drop=True))
    step, names, source = assign_steps(events, trace.annotations, step_marker)
    events["step"] = step
    if source == "whole trace":
        what = f"'{step_marker}'" if step_marker else "ProfilerStep#N"
        warnings.append(f"no {what} annotations: the whole trace is one step")
    if trace.skipped:
        warnings.append(f"{trace.skipped} events without a usable ts or dur were skipped")
    steps = []
    for k, name in enumerate(names):
        mine = events[events["step"] == k]
        if mine.empty:
            warnings.append(f"step {name!r} has no GPU events of device {dev}; left out")
            continue
        w = StepWindow(k, str(name), float(mine["ts_s"].min()), float(mine["end_s"].max()))
        steps.append(analyse_window(events, w, len(mine)))
    if not steps:
        raise ValueError(f"{trace.path}: no step has GPU events on device {dev}")
    phases: dict[str, np.ndarray] = {}
    for phase, marker in (phase_markers or {}).items():
        found = phase_of(events, trace.annotations, marker)
        if found is None:
            warnings.append(f"phase {phase}: no annotation {marker!r} in the trace")
        else:
            phases[phase] = found & (events["step"] >= 0).to_numpy()
    return Timeline(events, steps, dev, source, phases, warnings)


def phase_totals_s(tl: Timeline, phase: str) -> tuple[float, float]:
    """(kernel seconds, GPU span seconds) of a phase, mean over the steps."""
    mask = tl.phases[phase]
    ev = tl.events[mask]
    kern, span = [], []
    for st in tl.steps:
        mine = ev[ev["step"] == st.window.index]
        kern.append(float(mine["dur_s"].sum()))
        span.append(float(mine["end_s"].max() - mine["ts_s"].min()) if len(mine) else 0.0)
    return float(np.mean(kern)), float(np.mean(span))
