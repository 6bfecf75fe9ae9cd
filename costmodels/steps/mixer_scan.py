"""The linear mixers' scan kernels, as measured: the decomposition prices a scan as its
nominal memory traffic (:mod:`workloads.decompose.mixer`); the kernels that run it (fla's
chunked GDN/KDA, mamba_ssm's SSD, the recurrent decode steps) take a fitted multiple of
that time, per mixer kind and direction (``costmodels/data/linear_mixers.yaml``, from
H200 graph replays by ``python -m calibrate.fit_mixers``; held-out errors in its
docstring and in README). A kind or direction without measurements borrows the nearest
kernel's: KDA's decode GDN's (fla's ``fused_recurrent`` of both), Mamba-1's prefill
Mamba-2's."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from workloads.decompose.templates import LayerOp, OpTemplate
from workloads.models import ModelConfig

BORROW = {("kda", "decode"): "gdn", ("mamba", "fwd"): "mamba2", ("mamba", "bwd"): "mamba2"}


@cache
def _factors() -> dict[str, dict[str, float]]:
    path = Path(str(resources.files("costmodels") / "data" / "linear_mixers.yaml"))
    return yaml.safe_load(path.read_text())["factors"]


def scan_factor(model: ModelConfig, what: str) -> float:
    """Measured over nominal time of ``model``'s scan: ``fwd``, ``bwd`` or ``decode``."""
    if model.mixer is None:
        return 1.0
    kind = model.mixer.kind
    table = _factors()
    got = table.get(kind, {}).get(what)
    if got is None:
        got = table.get(BORROW.get((kind, what), ""), {}).get(what, 1.0)
    return float(got)


def scale_serving(tpls: dict[str, list[OpTemplate]], model: ModelConfig) -> None:
    """Scale a serving iteration's scan templates in place: the chunked scan by ``fwd``;
    a decoding sequence's state step so that its token's whole scan costs ``decode``
    times the state traffic (its template carries that traffic less the chunked scan's)."""
    if model.mixer is None:
        return
    f, d = scan_factor(model, "fwd"), scan_factor(model, "decode")
    scan = next((t for t in tpls["layer"] if t.name == "mixer_scan"), None)
    per_token = (scan.traffic_bytes or 0.0) if scan else 0.0
    for part in ("layer", "seq"):
        out = []
        for t in tpls[part]:
            if t.name == "mixer_scan":
                t = replace(t, traffic_bytes=f * per_token)
            elif t.name == "mixer_state" and t.traffic_bytes is not None:
                state = t.traffic_bytes + per_token
                t = replace(t, traffic_bytes=max(1.0, d * state - f * per_token))
            out.append(t)
        tpls[part] = out


def scale_training(
    groups: list[list[LayerOp]], times: np.ndarray, model: ModelConfig
) -> np.ndarray:
    """Training op times (``groups`` flattened, as priced) with the scan's forward and
    backward at their measured factors; untouched without mixers."""
    if model.mixer is None:
        return times
    by_name = {"mixer_scan": scan_factor(model, "fwd"), "mixer_scan_bwd": scan_factor(model, "bwd")}
    return times * np.array([by_name.get(o.name, 1.0) for g in groups for o in g])
