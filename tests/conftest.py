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
