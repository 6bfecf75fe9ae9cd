import re
from pathlib import Path

from simcli.reports.schemas import all_schemas, render_markdown

DOCS = Path(__file__).resolve().parents[3] / "docs" / "outputs.md"


def test_docs_list_every_csv_column():
    assert DOCS.read_text() == render_markdown(), "run: python -m simcli.reports.schemas"


def test_schemas_are_tidy():
    schemas = all_schemas()
    assert {"simcli.reports.train", "simcli.reports.plan"} <= set(schemas)
    for module, files in schemas.items():
        for name, cols in files.items():
            assert name.endswith(".csv"), (module, name)
            assert cols, (module, name)
            for col, meaning in cols.items():
                # "in.<option>": a column per swept option (sweeps)
                pattern = r"[a-z][a-z0-9_]*(\.(<[a-z_]+>|[a-z0-9_]+))?"
                assert re.fullmatch(pattern, col), (module, name, col)
                assert meaning.strip(), (module, name, col)
