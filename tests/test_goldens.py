"""Predictions of a fixed set of CLI runs against committed goldens (tests/golden/).

A refactor must leave every number where it was; a deliberate change regenerates them with
``python -m pytest tests/test_goldens.py --update-goldens`` and lists before/after figures
in its commit message.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.golden.cases import CASES, VOLATILE_KEYS

DATA = Path(__file__).parent / "golden" / "data"
RTOL = 1e-9


def _clean(value):
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _diffs(got, want, path: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}/{k}: missing" for k in want if k not in got]
        out += [f"{path}/{k}: unexpected" for k in got if k not in want]
        for k in want:
            if k in got:
                out += _diffs(got[k], want[k], f"{path}/{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: length {len(got)} != {len(want)}"]
        pairs = enumerate(zip(got, want, strict=True))
        return [d for i, (g, w) in pairs for d in _diffs(g, w, f"{path}[{i}]")]
    both_num = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (got, want))
    if both_num:
        if math.isnan(want) and math.isnan(got):
            return []
        if math.isclose(got, want, rel_tol=RTOL, abs_tol=1e-12):
            return []
        return [f"{path}: {got!r} != {want!r}"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name, run, request):
    res = run("--quiet", *CASES[name], "--format", "json")
    assert res.exit_code == 0, res.output
    got = _clean(json.loads(res.stdout))
    path = DATA / f"{name}.json"
    if request.config.getoption("--update-goldens"):
        DATA.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    assert path.exists(), f"no golden for {name}; create it with --update-goldens"
    diffs = _diffs(got, json.loads(path.read_text()))
    assert not diffs, f"{name}: {len(diffs)} values differ:\n" + "\n".join(diffs[:20])
