"""simcli/serving imports no cycle (module-level, ``TYPE_CHECKING`` and function-level
imports all count), nothing above it (scenario, commands), and no private name of another
module; nor do the serve, serve plan and step commands."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVING = ROOT / "simcli" / "serving"
COMMANDS = [ROOT / "simcli" / "commands" / f"{m}.py" for m in ("serve", "serve_plan", "step")]


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import anywhere in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in SERVING.glob("*.py"):
        deps = set()
        for module, names in _imports(path):
            if module.startswith("simcli.serving."):
                deps.add(module.split(".")[2])
            elif module == "simcli.serving":
                deps.update(names)
        graph[path.stem] = deps - {path.stem}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return [*stack[stack.index(w) :], w]
            if w not in state and (found := visit(w)):
                return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_no_import_cycle_in_serving():
    graph = _graph()
    assert {"replica", "engine", "batch", "schedulers", "metrics", "branches"} <= set(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_serving_imports_nothing_above_it():
    for path in SERVING.glob("*.py"):
        for module, _ in _imports(path):
            assert not module.startswith(("simcli.scenario", "simcli.commands", "simcli.cli")), (
                f"{path.name} imports {module}"
            )


def test_no_private_names_across_modules():
    for path in [*SERVING.glob("*.py"), *COMMANDS]:
        for module, names in _imports(path):
            if module.split(".")[0] in ("simcli", "costmodels", "workloads", "hardware_specs"):
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{path.name} imports {private} from {module}"
