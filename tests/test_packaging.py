"""Every data file inside a package ships with ``pip install .`` (a non-editable install
copies only what ``[tool.setuptools.package-data]`` names)."""

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _glob(rel: str, pattern: str) -> bool:
    """setuptools' glob: ``*`` stays inside one folder (fnmatch's crosses ``/``)."""
    parts, pats = rel.split("/"), pattern.split("/")
    return len(parts) == len(pats) and all(
        fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pats, strict=True)
    )


def test_every_package_data_file_is_declared():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = conf["package-data"]
    missing = []
    for pkg in ("simcli", "costmodels", "hardware_specs", "workloads"):
        for path in (ROOT / pkg).rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT / pkg).as_posix()
            if path.suffix in (".nbi", ".nbc"):  # numba's cache
                continue
            if not any(_glob(rel, p) for p in patterns.get(pkg, [])):
                missing.append(f"{pkg}/{rel}")
    assert not missing, f"not in package-data: {missing}"
