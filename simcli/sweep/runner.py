"""Run a sweep: expand the spec, skip what the store has, execute the rest, store each batch."""

from __future__ import annotations

import datetime as _dt
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from simcli import __version__
from simcli.progress import progress_bar
from simcli.sweep.executors import auto_chunk_size, chunk_points, make_executor
from simcli.sweep.spec import Point, SweepSpec, spec_document
from simcli.sweep.store import Store
from simcli.sweep.target import resolve


@dataclass
class SweepSummary:
    command: str
    store: str
    store_kind: str
    executor: str
    points_total: int
    points_skipped: int  # already in the store
    points_run: int
    points_ok: int
    points_failed: int
    points_not_run: int  # left after an interrupt
    interrupted: bool
    wall_s: float
    points_per_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_sweep(
    spec: SweepSpec,
    points: list[Point],
    store: Store,
    *,
    executor: str = "local",
    workers: int | None = None,
    ray_address: str = "local",
    chunk_size: int | None = None,
    retry_failed: bool = False,
    spec_path: str = "",
) -> SweepSummary:
    """Run the points the store lacks; a Ctrl-C stores what finished, then re-raises."""
    target = resolve(spec.command)
    store.set_meta(
        {
            "spec": spec_document(spec),
            "spec_path": spec_path,
            "command": target.command,
            "points_total": len(points),
            "point_ids": [p.point_id for p in points],
            "simcli_version": __version__,
            "updated_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
    )
    done = store.done()
    todo = [
        (p.seq, p.point_id, p.params)
        for p in points
        if p.point_id not in done or (retry_failed and not done[p.point_id])
    ]
    n_workers = workers or os.cpu_count() or 1
    size = chunk_size or auto_chunk_size(len(todo), n_workers)
    summary = SweepSummary(
        command=target.command,
        store=str(store.path),
        store_kind=store.kind,
        executor=executor,
        points_total=len(points),
        points_skipped=len(points) - len(todo),
        points_run=0,
        points_ok=0,
        points_failed=0,
        points_not_run=len(todo),
        interrupted=False,
        wall_s=0.0,
        points_per_s=0.0,
    )
    if not todo:
        return summary
    start = time.perf_counter()
    ex = make_executor(executor, workers if executor == "ray" else n_workers, ray_address)

    def record(rows: list[dict[str, Any]]) -> None:
        store.write(rows, replace=retry_failed)
        summary.points_run += len(rows)
        failed = sum(1 for r in rows if not r["ok"])
        summary.points_failed += failed
        summary.points_ok += len(rows) - failed

    try:
        with progress_bar("sweep", total=len(todo), fields=("failed",)) as advance:
            try:
                for rows in ex.run(target.command, chunk_points(todo, size)):
                    record(rows)
                    advance(summary.points_run, failed=summary.points_failed)
            except KeyboardInterrupt:
                summary.interrupted = True
                for rows in ex.drain():
                    record(rows)
    finally:
        try:
            store.flush()
        finally:
            ex.close()
    summary.wall_s = time.perf_counter() - start
    summary.points_not_run = len(todo) - summary.points_run
    summary.points_per_s = summary.points_run / summary.wall_s if summary.wall_s > 0 else 0.0
    return summary
