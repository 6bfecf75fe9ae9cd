"""calibrate.engine_fit: the engine kernels fitted into a profile move nothing else."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd

from calibrate.dataset import load_dataset
from calibrate.engine_fit import engine_rows, fit_engine, is_engine_dataset
from costmodels.ops.features import ENGINE_CLASSES

ROOT = Path(__file__).resolve().parents[2]


def test_engine_fit_adds_its_classes_and_keeps_every_other_value():
    shipped = json.loads((ROOT / "costmodels" / "profiles" / "h100-sxm.json").read_text())
    # start from the profile without its engine parts, as before the engine was fitted
    base = copy.deepcopy(shipped)
    base["params"]["attention"]["backends"].pop("flashinfer")
    base["params"]["attention"].pop("decode_backends")
    for cls in ENGINE_CLASSES:
        base["learned"]["residuals"].pop(cls)
        base["learned"]["selection"].pop(cls)
        base["fidelity"].pop(cls)
    base["held_out_groups"] = [
        g for g in base["held_out_groups"] if not g.startswith("flashinfer:")
    ]
    raw = load_dataset(ROOT / "calibrate" / "data" / "engine-kernels-h100-sxm")
    assert is_engine_dataset(raw)
    ds = engine_rows(raw)
    assert set(ds.frame["pattern"].str.split(":").str[0]) == {"graph", "paged"}
    assert set(ds.frame["dtype"]) == {"bf16"}
    assert engine_rows(ds).frame["group"].equals(ds.frame["group"])  # idempotent
    merged, rows = fit_engine(base, [ds])
    for key in ("gemm", "elementwise", "collectives"):
        assert merged["params"].get(key) == base["params"].get(key)
    att = dict(merged["params"]["attention"])
    att["backends"] = {k: v for k, v in att["backends"].items() if k != "flashinfer"}
    att.pop("decode_backends")
    assert att == base["params"]["attention"]
    for k, v in base["learned"]["residuals"].items():
        assert merged["learned"]["residuals"][k] == v
    for k, v in base["fidelity"].items():
        assert merged["fidelity"][k] == v
    assert set(rows["op_class"]) == set(ENGINE_CLASSES)
    # the same data gives the shipped figures
    for cls in ENGINE_CLASSES:
        assert merged["fidelity"][cls] == shipped["fidelity"][cls]
    assert isinstance(rows, pd.DataFrame) and (rows["rows_held_out"] > 0).all()
