"""``simcli sweep``: run a grid of simcli commands on a process pool or Ray, resumably.

``simcli sweep SPEC.yaml`` runs (``run`` is the default subcommand);
``simcli sweep status STORE`` and ``simcli sweep export STORE`` read a store back.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from simcli.errors import fail, user_errors
from simcli.options import SimcliGroup
from simcli.output import Format, atomic_write_text, emit_object, jsonable
from simcli.progress import set_quiet


class DefaultGroup(SimcliGroup):
    """A group whose first argument, when it names no subcommand, goes to ``run``.

    So ``simcli sweep SPEC.yaml`` means ``simcli sweep run SPEC.yaml`` while ``status``,
    ``export`` and ``report`` stay subcommands (a spec file named ``status`` needs
    ``sweep run status``).
    """

    default_command = "run"

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=DefaultGroup,
    help=(
        "Run many simcli commands from a YAML spec (grid, zip, filters) on a local process "
        "pool or a Ray cluster; results go to a resumable SQLite/Parquet store. "
        "simcli sweep SPEC.yaml | simcli sweep status STORE | simcli sweep export STORE | "
        "simcli sweep report STORE --output DIR"
    ),
    no_args_is_help=True,
)


class Executor(StrEnum):
    local = "local"
    ray = "ray"


class StoreKind(StrEnum):
    sqlite = "sqlite"
    parquet = "parquet"


class ExportFormat(StrEnum):
    csv = "csv"
    json = "json"


@app.command("run")
def run(
    spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="The sweep spec."),
    executor: Executor = typer.Option(
        Executor.local, "--executor", help="local (process pool) | ray"
    ),
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="Worker processes (default: CPUs; ray: cluster CPUs)."
    ),
    ray_address: str = typer.Option(
        "local", "--ray-address", help="local (start Ray here) | auto | HOST:PORT"
    ),
    store_kind: StoreKind = typer.Option(StoreKind.sqlite, "--store", help="sqlite | parquet"),
    results: Path | None = typer.Option(
        None,
        "--results",
        help="Store path (default: SPEC_NAME.results.sqlite, or SPEC_NAME.results.parquet/ "
        "folder, in the current folder).",
    ),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Rerun points stored as failed (others are skipped)."
    ),
    chunk_size: int | None = typer.Option(
        None, "--chunk-size", min=1, help="Points per task (default: automatic)."
    ),
    output: Path | None = typer.Option(
        None, "--output", help="Write the sweep report (points.csv, report.html) to this folder."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Validate and expand the spec, print the point count, run none."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Run every point of SPEC.yaml the store does not have yet (resume after a crash)."""
    set_quiet(quiet)
    with user_errors():
        from simcli.sweep.runner import run_sweep
        from simcli.sweep.spec import expand, load_spec
        from simcli.sweep.store import default_path, open_store, remove_store, summary_rows

        spec = load_spec(spec_path)
        points = expand(spec, str(spec_path))
        if not points:
            raise fail(f"{spec_path}: the filters drop every point; allowed: filters some pass")
        if dry_run:
            emit_object(
                {
                    "command": spec.command,
                    "points": len(points),
                    "first": " ".join(f"{k}={v}" for k, v in points[0].params.items()),
                },
                fmt,
                title="simcli sweep --dry-run",
            )
            return
        # everything that can fail before the work, checked before the store exists
        if output is not None:
            from simcli.reports.bundle import check_output_path

            check_output_path(output)
        if executor.value == "ray":
            from simcli.sweep.executors import check_ray

            check_ray(ray_address)
        path = results or default_path(spec_path, store_kind.value)
        created = not path.exists()
        store = open_store(path, store_kind.value, create=True)
        ok = False
        try:
            summary = run_sweep(
                spec,
                points,
                store,
                executor=executor.value,
                workers=workers,
                ray_address=ray_address,
                chunk_size=chunk_size,
                retry_failed=retry_failed,
                spec_path=str(spec_path),
            )
            if output is not None and not summary.interrupted:
                from simcli.sweep.report import points_frame, write_report

                write_report(output, points_frame(store.frame()), store.meta(), str(path))
            ok = True
        finally:
            store.close()
            if not ok and created and summary_rows(path) == 0:
                remove_store(path)  # a sweep that failed before any point leaves nothing
        out = summary.as_dict()
        if output is not None and not summary.interrupted:
            out["output"] = str(output)
        emit_object(out, fmt, title=f"simcli sweep {spec_path}")
        if summary.interrupted:
            sys.stderr.write(
                f"error: interrupted: {summary.points_run} points stored, "
                f"{summary.points_not_run} not run; rerun the same command to resume\n"
            )
            raise typer.Exit(130)


def _open(store: Path):
    from simcli.sweep.store import open_store

    return open_store(store)


@app.command("status")
def status(
    store: Path = typer.Argument(..., metavar="STORE", help="A sweep store (file or folder)."),
    errors: int = typer.Option(5, "--errors", min=0, help="How many last error lines to show."),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Points done, failed and still to run, and the last errors."""
    with user_errors():
        st = _open(store)
        try:
            frame, meta = st.frame(), st.meta()
        finally:
            st.close()
        ids = meta.get("point_ids")
        in_spec = frame[frame["point_id"].isin(ids)] if ids else frame
        total = int(meta.get("points_total", len(frame)))
        failed = in_spec[~in_spec["ok"]]
        last = failed.sort_values("finished_utc").tail(errors) if errors else failed.head(0)
        out: dict[str, Any] = {
            "store": str(store),
            "store_kind": st.kind,
            "command": meta.get("command", frame["command"].iloc[0] if len(frame) else ""),
            "spec_path": meta.get("spec_path", ""),
            "points_total": total,
            "points_done": len(in_spec),
            "points_ok": int(in_spec["ok"].sum()),
            "points_failed": len(failed),
            "points_to_run": max(0, total - len(in_spec)),
            "rows_in_store": len(frame),
            "last_errors": [f"{r.point_id}: {r.error}" for r in last.itertuples()],
        }
        if fmt == Format.csv:
            out["last_errors"] = " | ".join(out["last_errors"])
        emit_object(out, fmt, title=f"sweep store {store}")


@app.command("export")
def export(
    store: Path = typer.Argument(..., metavar="STORE", help="A sweep store (file or folder)."),
    fmt: ExportFormat = typer.Option(
        ExportFormat.csv,
        "--format",
        help="csv | json (an --output name ending in .csv or .json sets it)",
    ),
    output: Path | None = typer.Option(None, "--output", help="File to write (default stdout)."),
) -> None:
    """Every stored point as one flat row: params as in.*, scalar outputs as out.*."""
    with user_errors():
        from simcli.sweep.report import points_frame

        if output is not None and output.suffix.lower() in (".csv", ".json"):
            fmt = ExportFormat(output.suffix.lower()[1:])  # a .json file holds JSON
        st = _open(store)
        try:
            frame = points_frame(st.frame())
        finally:
            st.close()
        if fmt == ExportFormat.csv:
            text = frame.to_csv(index=False, float_format="%.6g")
        else:
            records = [
                {k: v for k, v in r.items() if not (isinstance(v, float) and v != v)}
                for r in frame.to_dict(orient="records")
            ]
            text = json.dumps({"store": str(store), "points": jsonable(records)}, indent=2) + "\n"
        if output is None:
            sys.stdout.write(text)
        else:
            atomic_write_text(output, text)


@app.command("report")
def report(
    store: Path = typer.Argument(..., metavar="STORE", help="A sweep store (file or folder)."),
    output: Path = typer.Option(
        ..., "--output", help="Folder for points.csv, config.json and report.html."
    ),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """The --output report of a stored sweep, e.g. one that was interrupted or is still
    partial (points not yet run are counted as such)."""
    with user_errors():
        from simcli.reports.bundle import check_output_path
        from simcli.sweep.report import points_frame, write_report

        check_output_path(output, "--output", kind="folder")
        st = _open(store)
        try:
            frame, meta = points_frame(st.frame()), st.meta()
        finally:
            st.close()
        write_report(output, frame, meta, str(store))
        ids = meta.get("point_ids")
        in_spec = frame[frame["point_id"].isin(ids)] if ids else frame
        out = {
            "store": str(store),
            "output": str(output),
            "points_total": int(meta.get("points_total", len(frame))),
            "points_done": len(in_spec),
        }
        emit_object(out, fmt, title=f"sweep report {output}")
