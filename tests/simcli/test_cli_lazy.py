"""Commands load on demand (simcli/cli.py): the root help lists them without importing
any, as the eagerly registered app did, and the quick commands start without the heavy
libraries (issue 18: start-up; the times are benchmarks/cli_startup.py's, not a test's)."""

import gc
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import simcli.cli as cli

HEAVY = ("pandas", "pyarrow", "scipy", "sklearn", "matplotlib", "simcli.serving.simulator")


def _eager_app() -> typer.Typer:
    """The root app as it was built before: every command module imported and added."""
    app = typer.Typer(
        name="simcli",
        help=cli.app.info.help,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    for name, module in cli.COMMANDS.items():
        app.add_typer(importlib.import_module(module).app, name=name)
    app.callback()(cli._root)
    return app


def test_root_help_is_the_eager_apps():
    runner = CliRunner()
    for argv in (["--help"], []):
        lazy = runner.invoke(cli.app, argv, terminal_width=100)
        eager = runner.invoke(_eager_app(), argv, terminal_width=100)
        assert (lazy.exit_code, lazy.output) == (eager.exit_code, eager.output)


def test_help_lines_come_from_the_modules_source():
    for name, module in cli.COMMANDS.items():
        assert cli.source_help(module) == importlib.import_module(module).app.info.help, name


def test_every_command_module_is_registered():
    folder = Path(cli.__file__).parent / "commands"
    modules = {f"simcli.commands.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    # serve plan is a subcommand of serve, registered by simcli.commands.serve
    assert set(cli.COMMANDS.values()) == modules - {"simcli.commands.serve_plan"}


def test_a_lazy_command_is_the_added_one():
    lazy = typer.main.get_command(cli.app)
    eager = typer.main.get_command(_eager_app())
    for name in cli.COMMANDS:
        a, b = lazy.commands[name], eager.commands[name]
        assert type(a) is type(b) and a.name == b.name == name
        assert [p.opts for p in a.params] == [p.opts for p in b.params]
        assert sorted(getattr(a, "commands", {})) == sorted(getattr(b, "commands", {}))


def _loaded(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` are in sys.modules after ``simcli *argv`` in a fresh process."""
    code = (
        "import json, sys\n"
        "from simcli.cli import main\n"
        f"sys.argv = ['simcli', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {names!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["specs", "list"],
        ["predict", "gemm", "--m", "64", "--n", "64", "--k", "64", "--gpu", "h100-sxm"],
    ],  # fmt: skip
)
def test_quick_commands_start_without_heavy_libraries(argv):
    assert _loaded(argv, HEAVY) == []


def test_root_help_loads_no_command_nor_pydantic():
    assert _loaded(["--help"], ("pydantic", "numpy", "yaml", *cli.COMMANDS.values())) == []


# A simulation command's --help needs its options (pydantic configs), not the simulator,
# the step models, pandas, scipy or the report renderer, which load when it runs.
SIMULATORS = ("costmodels.steps.serving", "simcli.scenario.serving", "simcli.reports.serve")


@pytest.mark.parametrize(
    "argv, allowed",
    [
        (["train", "--help"], ()),
        (["plan", "--help"], ()),
        (["step", "--help"], ()),
        (["serve", "--help"], ()),
        (["serve", "plan", "--help"], ()),
    ],
)
def test_simulation_help_starts_without_the_simulators(argv, allowed):
    heavy = tuple(m for m in (*HEAVY, *SIMULATORS) if m not in allowed)
    assert _loaded(argv, heavy) == []


def test_loading_a_command_leaves_the_collector_on():
    # commands import with the cyclic GC paused (simcli.cli._loading), then run with it on
    assert gc.isenabled()
    result = CliRunner().invoke(cli.app, ["specs", "list", "--format", "json"])
    assert result.exit_code == 0 and gc.isenabled()
