"""How far a serving answer is expected to be from a real engine's, by engine and metric.

The figures come from ``benchmarks/validate_serving.py``: simcli's predictions of published
serving results of real engines (``benchmarks/data/serving_published.yaml``, sources in
``docs/serving_published.md``), never fitted on. ``python benchmarks/validate_serving.py
--write-fidelity`` summarises them into ``costmodels/data/serving_fidelity.yaml``: the mean
absolute percentage error per engine and metric class (TTFT, TPOT/ITL, end-to-end latency,
throughput) over the rows that are not near saturation (where latency is very sensitive to
capacity; they are reported apart and kept out of the expected error).

An answer's expected error, per metric class:

- the engine has at least :data:`MIN_ROWS` rows of that class: their MAPE;
- fewer: the MAPE of that class over every engine's rows,
  doubled (another engine's host work and policies are not this one's);
- no row of the class at all: None.

``serving_provenance`` is ``validated`` when every class with a figure is the engine's own,
``partly-validated`` when some are, ``validated-other-engines`` when none are and
``unvalidated`` when no class has a figure.

Both were measured with calibrated op models (A100, H100, H200); an answer whose op
models are transferred or datasheet-only adds the op model's own expected error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

FIDELITY_PATH = Path(__file__).resolve().parents[1] / "data" / "serving_fidelity.yaml"
METRIC_CLASSES = ("ttft", "tpot_itl", "e2e", "throughput")
MIN_ROWS = 3  # rows of an engine and class before its own MAPE is its expected error
OTHER_ENGINES_FACTOR = 2.0


def summarise(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The fidelity table of validated rows, each ``{engine, metric_class, error_pct,
    near_saturation}`` (``error_pct`` signed, (predicted - published) / published)."""
    by: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.get("near_saturation") or r.get("error_pct") is None:
            continue
        err = abs(float(r["error_pct"]))
        for engine in (str(r["engine"]), "all"):
            by.setdefault((engine, str(r["metric_class"])), []).append(err)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for (engine, cls), errs in sorted(by.items()):
        table.setdefault(engine, {})[cls] = {
            "mape_pct": round(sum(errs) / len(errs), 2),
            "rows": len(errs),
        }
    return {"by_engine": table}


@lru_cache(maxsize=4)
def load_fidelity(path: str | None = None) -> dict[str, Any]:
    p = Path(path) if path else FIDELITY_PATH
    if not p.exists():
        return {"by_engine": {}}
    with p.open() as f:
        return yaml.safe_load(f) or {"by_engine": {}}


def serving_fidelity_fields(
    engine: str,
    op_expected_error_pct: float | None,
    op_provenance: str | None,
    path: str | None = None,
) -> dict[str, Any]:
    """``serving_provenance`` and ``serving_expected_error_pct_<class>`` (one key per
    metric class: ttft, tpot_itl, e2e, throughput; None where no row validates it) of an
    answer of ``engine``; see the module docstring for the rule."""
    table = load_fidelity(path)["by_engine"]
    own, every = table.get(engine, {}), table.get("all", {})
    errors: dict[str, float | None] = {}
    kinds = []
    for cls in METRIC_CLASSES:
        mine = own.get(cls)
        if mine and mine["rows"] >= MIN_ROWS:
            err, kind = float(mine["mape_pct"]), "validated"
        elif cls in every:
            err, kind = OTHER_ENGINES_FACTOR * float(every[cls]["mape_pct"]), "other"
        else:
            errors[cls] = None
            continue
        if op_provenance not in (None, "calibrated") and op_expected_error_pct:
            err += float(op_expected_error_pct)
        errors[cls] = round(err, 1)
        kinds.append(kind)
    if not kinds:
        prov = "unvalidated"
    elif all(k == "validated" for k in kinds):
        prov = "validated"
    elif "validated" in kinds:
        prov = "partly-validated"
    else:
        prov = "validated-other-engines"
    return {
        "serving_provenance": prov,
        **{f"serving_expected_error_pct_{cls}": errors[cls] for cls in METRIC_CLASSES},
    }


__all__ = [
    "FIDELITY_PATH",
    "METRIC_CLASSES",
    "load_fidelity",
    "serving_fidelity_fields",
    "summarise",
]
