"""Imports flow one way: hardware_specs -> workloads -> costmodels -> calibrate -> simcli,
and one way inside simcli and costmodels too (:data:`INNER_LAYERS`); no import cycles between
modules; no module over 800 lines, no function of ``simcli/commands/`` over 100 lines.
"""

import ast
from collections import deque
from functools import cache
from itertools import pairwise
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


MAX_MODULE_LINES = 800
MAX_COMMAND_FUNCTION_LINES = 100


def _check_none(found: dict[tuple[str, str], str]) -> None:
    """Fail listing every violation found (``found`` maps (file, kind) to a message)."""
    assert not found, "violations:\n" + "\n".join(found[v] for v in sorted(found))


# --------------------------------------------------------------------------- module graph


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    """Every module of the project packages, by dotted name (a package by its __init__)."""
    return {
        _module_name(path): path for package in LAYERS for path in (ROOT / package).rglob("*.py")
    }


def _owner(name: str) -> str | None:
    """The project module an import of ``name`` loads last: ``name`` or its longest prefix
    that is a module (``a.b.Thing`` -> ``a.b``); None outside the project."""
    modules = _modules()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, path: Path) -> dict[str, int]:
    """Project modules ``module`` imports -> the line of the first such import; module-level,
    function-level and TYPE_CHECKING imports alike, relative ones resolved."""
    modules = _modules()
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                package = parts if path.name == "__init__.py" else parts[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, node.module] if node.module else package)
            # ``from a.b import c`` loads module a.b.c when there is one, else a.b
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            target = _owner(name)
            if target is not None and target != module:
                out.setdefault(target, node.lineno)
    return out


@cache
def _graph() -> dict[str, dict[str, int]]:
    return {module: _imported(module, path) for module, path in _modules().items()}


def _file(module: str) -> str:
    return _modules()[module].relative_to(ROOT).as_posix()


def test_module_graph_sees_imports():
    # the resolver itself: absolute, ``from package import module``, relative, in functions
    graph = _graph()
    assert "simcli.training.varlen" in graph["simcli.commands.varlen"]
    assert "workloads.sparsity" in graph["simcli.sparsity.whatif"]
    assert "calibrate.bench.common" in graph["calibrate.bench.gemm"]
    assert "simcli.reports.predict" in graph["simcli.commands.predict"]  # inside a function
    assert "numpy" not in graph["workloads.sparsity.grid"]


# --------------------------------------------------------------------------- inner layers

# Inside a package: tiers, lowest first; each tier maps a group to the names directly under
# the package that form it ("" is the package's __init__). A module may import its own group
# and the groups of lower tiers, never a group of its own tier or a higher one.
INNER_LAYERS: dict[str, list[dict[str, set[str]]]] = {
    "simcli": [
        {"base": {"", "errors", "lazy", "output", "progress", "options"}},
        {"training": {"training"}, "serving": {"serving"}},
        {"sparsity": {"sparsity"}},  # what-ifs over training and serving
        {"scenario": {"scenario"}},
        {"reports": {"reports"}},
        {"sweep": {"sweep"}},
        {"commands": {"commands"}},
        {"cli": {"cli"}},
    ],
    "costmodels": [
        {"ops": {"ops"}},
        {"steps": {"steps"}},
        {"registry": {"registry"}},  # every model with its contract inputs (tests)
        {"package": {""}},  # the predict/predict_many facade over the op models
    ],
}


def _inner_place(module: str) -> tuple[int, str] | None:
    """(tier, group) of a module of a package in INNER_LAYERS, else None."""
    package, _, rest = module.partition(".")
    if package not in INNER_LAYERS:
        return None
    head = rest.partition(".")[0]
    for tier, groups in enumerate(INNER_LAYERS[package]):
        for group, names in groups.items():
            if head in names:
                return tier, group
    raise AssertionError(f"{_file(module)}: place {package}.{head} in INNER_LAYERS")


@pytest.mark.parametrize("package", sorted(INNER_LAYERS))
def test_every_module_has_an_inner_layer(package):
    for module in _modules():
        if module.partition(".")[0] == package:
            assert _inner_place(module) is not None


def test_imports_flow_one_way_inside_packages():
    found: dict[tuple[str, str], str] = {}
    for module, imported in _graph().items():
        place = _inner_place(module)
        if place is None:
            continue
        for target, line in imported.items():
            if target.partition(".")[0] != module.partition(".")[0]:
                continue
            other = _inner_place(target)
            assert other is not None
            if other[1] != place[1] and other[0] >= place[0]:
                message = (
                    f"{_file(module)}:{line} ({place[1]}) imports {target} ({other[1]}), "
                    "which is not below it in INNER_LAYERS"
                )
                key = (_file(module), "layer")
                found[key] = f"{found[key]}\n{message}" if key in found else message
    _check_none(found)


def test_costmodel_ops_do_not_import_steps():
    # spelled out: the op models price ops; steps compose them, never the other way
    for module, imported in _graph().items():
        if module.startswith("costmodels.ops"):
            bad = [t for t in imported if t.startswith("costmodels.steps")]
            assert not bad, f"{_file(module)} imports {bad}"


# --------------------------------------------------------------------------- cycles


def _shortest_cycle(graph: dict[str, dict[str, int]], start: str) -> list[str] | None:
    """The shortest import path from ``start`` back to itself (breadth-first), or None."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in graph[node]:
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return None


def test_no_import_cycles():
    graph = _graph()
    found: dict[tuple[str, str], str] = {}
    for module in graph:
        cycle = _shortest_cycle(graph, module)
        if cycle is not None:
            steps = [f"{a} (line {graph[a][b]})" for a, b in pairwise(cycle)]
            found[(_file(module), "cycle")] = (
                f"{_file(module)} is on an import cycle: " + " -> ".join([*steps, cycle[-1]])
            )
    _check_none(found)


def test_cycle_finder_reports_the_shortest_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 2, "a": 3}, "c": {"a": 4}, "d": {"a": 5}}
    assert _shortest_cycle(graph, "a") == ["a", "b", "a"]
    assert _shortest_cycle(graph, "c") == ["c", "a", "b", "c"]
    assert _shortest_cycle(graph, "d") is None


# --------------------------------------------------------------------------- sizes


def test_no_module_over_800_lines():
    found: dict[tuple[str, str], str] = {}
    for path in _modules().values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            name = path.relative_to(ROOT).as_posix()
            found[(name, "lines")] = f"{name}: {lines} lines (at most {MAX_MODULE_LINES})"
    _check_none(found)


def test_no_command_function_over_100_lines():
    found: dict[tuple[str, str], str] = {}
    for path in sorted((ROOT / "simcli" / "commands").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_COMMAND_FUNCTION_LINES:
                    found[(name, f"function:{node.name}")] = (
                        f"{name}:{node.lineno} {node.name}: {lines} lines "
                        f"(at most {MAX_COMMAND_FUNCTION_LINES})"
                    )
    _check_none(found)
