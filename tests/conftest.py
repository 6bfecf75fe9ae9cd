import pytest
from typer.testing import CliRunner

from simcli.cli import app
from simcli.errors import set_debug


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args: str):
        set_debug(False)
        return runner.invoke(app, list(args))

    return invoke


def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite tests/golden/data from the current code (deliberate changes only)",
    )
