"""Imports flow one way: hardware_specs -> workloads -> costmodels -> calibrate -> simcli."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["hardware_specs", "workloads", "costmodels", "calibrate", "simcli"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", LAYERS)
def test_no_upward_imports(package):
    higher = set(LAYERS[LAYERS.index(package) + 1 :])
    for path in (ROOT / package).rglob("*.py"):
        bad = _imports(path) & higher
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)} (higher layer)"


def test_torch_only_in_calibrate():
    for package in ("hardware_specs", "workloads", "costmodels", "simcli"):
        for path in (ROOT / package).rglob("*.py"):
            assert "torch" not in _imports(path), f"{path.relative_to(ROOT)} imports torch"


def test_device_runner_needs_no_project_packages_or_pydantic():
    # the benchmark runner runs on GPU machines without pydantic or this package installed
    allowed_local = {"calibrate"}
    forbidden = {"pydantic", "typer", *LAYERS} - allowed_local
    runner = [
        ROOT / "calibrate" / "run.py",
        *(ROOT / "calibrate" / "bench").rglob("*.py"),
        *(ROOT / "calibrate" / "steps").rglob("*.py"),
    ]
    for path in runner:
        if path.exists():
            bad = _imports(path) & forbidden
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
