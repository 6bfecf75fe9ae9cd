"""Where points run: a local process pool, or Ray tasks on a cluster.

Both executors get the same chunks of points and call the same :func:`run_chunk`, so a
point's row is the same either way (its ``wall_s`` and ``finished_utc`` excepted). Chunks
keep the per-point IPC cost small; at most a few chunks per worker are in flight, so a
Ctrl-C cancels what has not started and :meth:`drain` returns what was running.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as _dt
import json
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from simcli import __version__
from simcli.sweep.errors import SweepError
from simcli.sweep.target import resolve

Chunk = list[tuple[int, str, dict[str, Any]]]  # (seq, point_id, params)
Row = dict[str, Any]
EXECUTORS = ("local", "ray")


# -- the work of one chunk (runs in a worker) ---------------------------------------------
@lru_cache(maxsize=64)
def _label(gpu: str, profile: str | None) -> str:
    try:
        from costmodels.ops.select import get_cost_model

        return str(get_cost_model(gpu, profile=profile).label)
    except Exception:
        return ""


def profile_id(command: str, params: dict[str, Any], outputs: dict[str, Any] | None) -> str:
    """The calibration profile a point used: the command's own label when it prints one."""
    if outputs:
        if isinstance(outputs.get("cost_model"), str):
            return outputs["cost_model"]
        if command.startswith("predict") and isinstance(outputs.get("model"), str):
            return outputs["model"]
    gpu = params.get("gpu")
    if not isinstance(gpu, str):
        return ""
    profile = params.get("profile")
    return _label(gpu, None if profile is None else str(profile))


def run_chunk(command: str, chunk: Chunk) -> list[Row]:
    """Run every point of a chunk in this process; one row per point, failures included."""
    target = resolve(command)
    rows = []
    for seq, pid, params in chunk:
        outcome = target.run(params)
        rows.append(
            {
                "point_id": pid,
                "seq": seq,
                "command": target.command,
                "params_json": json.dumps(params, sort_keys=True),
                "ok": outcome.ok,
                "outputs_json": outcome.outputs_json,
                "error": outcome.error,
                "simcli_version": __version__,
                "profile_id": profile_id(target.command, params, outcome.outputs),
                "wall_s": outcome.wall_s,
                "finished_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds"),
            }
        )
    return rows


def worker_init() -> None:
    """Workers: no tracebacks, Ctrl-C handled by the parent only, die with the parent."""
    from simcli.errors import set_debug

    set_debug(False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a SIGKILLed parent takes us along
        except OSError:
            pass


def chunk_points(points: list[tuple[int, str, dict[str, Any]]], size: int) -> list[Chunk]:
    return [points[i : i + size] for i in range(0, len(points), size)]


def auto_chunk_size(n_points: int, workers: int) -> int:
    """Enough chunks to balance the workers, few enough that IPC stays small."""
    return max(1, min(64, n_points // max(1, workers * 8)))


# -- local: a process pool ----------------------------------------------------------------
class LocalExecutor:
    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._pool: cf.ProcessPoolExecutor | None = None
        self._inflight: set[cf.Future] = set()

    def run(self, command: str, chunks: list[Chunk]) -> Iterator[list[Row]]:
        ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
        self._pool = cf.ProcessPoolExecutor(
            max_workers=self.workers, mp_context=ctx, initializer=worker_init
        )
        todo = iter(chunks)
        limit = self.workers * 3
        for chunk in todo:
            self._inflight.add(self._pool.submit(run_chunk, command, chunk))
            if len(self._inflight) >= limit:
                break
        while self._inflight:
            done, _ = cf.wait(self._inflight, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                self._inflight.discard(fut)
                nxt = next(todo, None)
                if nxt is not None:
                    self._inflight.add(self._pool.submit(run_chunk, command, nxt))
                yield fut.result()

    def drain(self) -> Iterator[list[Row]]:
        """After an interrupt: cancel chunks not started, return those still running."""
        running = [f for f in self._inflight if not f.cancel()]
        self._inflight.clear()
        for fut in cf.as_completed(running):
            try:
                yield fut.result()
            except Exception:
                continue

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


# -- ray: tasks on a cluster ----------------------------------------------------------------
def _package_root() -> str:
    import simcli

    return str(Path(simcli.__file__).resolve().parent.parent)


def check_ray(address: str) -> None:
    """What can be known about ``--executor ray`` before any work: ray is installed, and
    ``auto`` has a running cluster to find (Ray's own discovery: RAY_ADDRESS, or the
    address file ``ray start`` writes). One :class:`SweepError` line otherwise."""
    import importlib.util
    import tempfile

    if importlib.util.find_spec("ray") is None:
        raise SweepError("--executor ray needs ray: pip install 'simcli[ray]'")
    if address != "auto" or os.environ.get("RAY_ADDRESS"):
        return
    tmp = os.environ.get("RAY_TMPDIR") or os.path.join(tempfile.gettempdir(), "ray")
    if not os.path.exists(os.path.join(tmp, "ray_current_cluster")):
        raise SweepError(
            "--ray-address auto: no running Ray cluster found (start one with `ray start "
            "--head`, or set RAY_ADDRESS); allowed: local, auto with a running cluster, "
            "HOST:PORT"
        )


class RayExecutor:
    """``ray.init(address)``: ``auto`` / ``HOST:PORT`` joins a cluster, ``local`` starts one."""

    def __init__(self, address: str, workers: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise SweepError("--executor ray needs ray: pip install 'simcli[ray]'") from None
        self.ray = ray
        self._started = False
        self._inflight: list[Any] = []
        if not ray.is_initialized():
            # workers of a local cluster import simcli from where this process found it
            env = {
                "env_vars": {
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (_package_root(), os.environ.get("PYTHONPATH", "")) if p
                    )
                }
            }
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "configure_logging": False,
            }
            try:
                if address == "local":
                    ray.init(num_cpus=workers, runtime_env=env, **kwargs)
                else:
                    ray.init(address=address, **kwargs)
            except Exception as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise SweepError(
                    f"--ray-address {address}: cannot start or join Ray: {first}; "
                    "allowed: local, auto, HOST:PORT"
                ) from None
            self._started = True
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(num_cpus=1)(_ray_chunk)

    def run(self, command: str, chunks: list[Chunk]) -> Iterator[list[Row]]:
        todo = iter(chunks)
        limit = self.workers * 3
        for chunk in todo:
            self._inflight.append(self._remote.remote(command, chunk))
            if len(self._inflight) >= limit:
                break
        while self._inflight:
            ready, self._inflight = self.ray.wait(self._inflight, num_returns=1)
            nxt = next(todo, None)
            if nxt is not None:
                self._inflight.append(self._remote.remote(command, nxt))
            yield self.ray.get(ready[0])

    def drain(self) -> Iterator[list[Row]]:
        pending, self._inflight = self._inflight, []
        for ref in pending:
            try:
                yield self.ray.get(ref, timeout=60)
            except Exception:
                continue

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False


def _ray_chunk(command: str, chunk: Chunk) -> list[Row]:
    from simcli.errors import set_debug

    set_debug(False)
    return run_chunk(command, chunk)


def make_executor(kind: str, workers: int, ray_address: str) -> LocalExecutor | RayExecutor:
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "ray":
        return RayExecutor(ray_address, workers or None)
    raise SweepError(f"--executor {kind!r}; allowed: {', '.join(EXECUTORS)}")
