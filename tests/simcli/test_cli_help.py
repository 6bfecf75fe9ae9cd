"""Every option of ``simcli serve``, ``simcli serve plan`` and ``simcli step`` has help
text (options of a config come from its fields' descriptions)."""

import pytest
import typer

from simcli.cli import app

COMMANDS = (("serve",), ("serve", "plan"), ("step",))


def _command(path: tuple[str, ...]):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_option_has_help(path):
    cmd = _command(path)
    options = [p for p in cmd.params if p.param_type_name == "option"]
    assert len(options) > 5
    missing = [p.opts[0] for p in options if not (p.help or "").strip()]
    assert missing == [], f"simcli {' '.join(path)}: options without help: {missing}"
