"""Every CSV that ``--output DIR`` writes, and its columns: collected from the report
modules' ``CSV_SCHEMAS`` and rendered as ``docs/outputs.md`` (a test keeps them equal)."""

from __future__ import annotations

import importlib
import pkgutil

PACKAGES = ("simcli.reports", "simcli.sweep")
# modules in the order the docs list them (others follow, by name)
ORDER = ("predict", "train", "plan", "serve", "sparsity", "calibration", "sweep")


def all_schemas() -> dict[str, dict[str, dict[str, str]]]:
    """module name -> {csv file -> {column -> description}}."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for pkg_name in PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except ImportError:
            continue
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg_name}.{info.name}")
            schemas = getattr(mod, "CSV_SCHEMAS", None)
            if schemas:
                out[mod.__name__] = schemas

    def rank(name: str) -> tuple[int, str]:
        short = name.split(".")[-1]
        hits = [i for i, o in enumerate(ORDER) if short.startswith(o) or f".{o}" in name]
        return (min(hits) if hits else len(ORDER), name)

    return dict(sorted(out.items(), key=lambda kv: rank(kv[0])))


def _command(module: str, doc: str | None) -> str:
    first = (doc or "").strip().splitlines()[0] if doc else ""
    if first.startswith("``simcli"):
        return first.split("``")[1]
    return module


def render_markdown() -> str:
    lines = [
        "# Output files",
        "",
        "Every results command takes `--output DIR` and writes there the CSV files below,",
        "`config.json` (the command, every option after defaults, resolved values such as",
        "the plan and the calibration profile, and the simcli version) and `report.html`",
        "(one self-contained page: open it offline or send it). A `--output` ending in",
        "`.csv` or `.json` writes that single file instead, as before. Units are in the",
        "column names (`_s`, `_ms`, `_gib`, `_usd`, `_per_s`).",
        "",
        "This file is generated from the code (`python -m simcli.reports.schemas`);",
        "a test fails when they differ.",
    ]
    for module, schemas in all_schemas().items():
        mod = importlib.import_module(module)
        lines += ["", f"## {_command(module, mod.__doc__)}", "", f"(`{module}`)"]
        for name, cols in schemas.items():
            lines += ["", f"### `{name}`", "", "| column | meaning |", "|---|---|"]
            lines += [f"| `{c}` | {d.replace('|', chr(92) + '|')} |" for c, d in cols.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "outputs.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(render_markdown())
    print(f"wrote {path}")
