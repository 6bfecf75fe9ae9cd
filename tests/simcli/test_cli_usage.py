"""Everyday use of every command (issue 18): help text printed intact, usage lines, usage
errors as one line, ``--quiet`` after the command, ``--output`` everywhere."""

import pytest
import typer

from simcli.cli import app
from simcli.progress import _state as progress_state


def _walk(cmd, path=()):
    yield path, cmd
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        yield from _walk(sub, (*path, name))


ROOT = typer.main.get_command(app)
COMMANDS = list(_walk(ROOT))
LEAVES = [(p, c) for p, c in COMMANDS if p and not getattr(c, "commands", None)]


def _squash(text: str) -> str:
    """No whitespace (help is re-wrapped, words may break at hyphens) and no box lines."""
    return "".join(ch for ch in text if not ch.isspace() and ch not in "│")


def test_the_walk_finds_every_command():
    paths = {" ".join(p) for p, _ in COMMANDS}
    assert {"calibrate run", "varlen", "serve plan", "sweep export", "predict gemm"} <= paths
    assert len(LEAVES) >= 25


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "simcli")
def test_help_prints_every_option_help_intact(run, path):
    """Rich markup used to eat ``[calibrate]`` and turn ``:A:`` of ``uniform:A:B`` into an
    emoji: every option's help and the command's own text must appear as written."""
    cmd = dict(COMMANDS)[path]
    res = run(*path, "--help")
    assert res.exit_code == 0, res.output
    out = _squash(res.output)
    for param in cmd.params:
        text = (getattr(param, "help", None) or "").strip()
        assert _squash(text) in out, f"simcli {' '.join(path)} --help: {param.opts}: {text!r}"
    own = (cmd.help or "").split("\f")[0].strip()
    if path:
        assert _squash(own) in out, f"simcli {' '.join(path)} --help lost its text"


def test_known_literals_survive_help(run):
    assert "pip install 'simcli[calibrate]'" in run("calibrate", "run", "--help").output
    assert "uniform:A:B" in run("varlen", "--help").output


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS if p], ids=" ".join)
def test_usage_line_names_subcommands_only_where_there_are_some(run, path):
    cmd = dict(COMMANDS)[path]
    usage = next(line for line in run(*path, "--help").output.splitlines() if "Usage:" in line)
    assert ("COMMAND [ARGS]" in usage) == bool(getattr(cmd, "commands", None)), usage


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS if p], ids=" ".join)
def test_quiet_is_accepted_after_every_command(path):
    cmd = dict(COMMANDS)[path]
    assert any("--quiet" in getattr(p, "opts", ()) for p in cmd.params), " ".join(path)


def test_quiet_after_the_command_silences_progress(run):
    progress_state["quiet"] = False
    try:
        res = run("specs", "list", "--quiet", "--format", "csv")
        assert res.exit_code == 0, res.output
        assert progress_state["quiet"] is True
    finally:
        progress_state["quiet"] = False


@pytest.mark.parametrize(
    "argv, needle",
    [
        (("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "abc"), "--qps"),
        (("specs", "list", "--format", "xml"), "'xml'"),
        (("step", "--model", "llama3-8b", "--gpu", "h100-sxm"), "--phase"),  # missing
        (("predict", "gemm", "--m", "8", "--bogus", "1"), "--bogus"),
        (("serve", "plan", "--qps", "1", "--slo-ttft-s", "fast"), "--slo-ttft-s"),
        (("sweep", "status"), "STORE"),
        (("--bogus",), "--bogus"),  # root level (simcli.cli.LazyGroup)
        (("nosuchcmd",), "nosuchcmd"),
    ],
)
def test_usage_errors_are_one_line(argv, needle):
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, list(argv))
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert needle in lines[0] and "Value error" not in lines[0]
    assert res.stdout == ""


def test_calibrate_takes_output_and_keeps_out(tmp_path):
    for name in ("run", "fit", "from-trace"):
        opts = {p.name: p.opts for p in dict(COMMANDS)[("calibrate", name)].params}
        assert opts["out"][:2] == ["--output", "--out"], (name, opts["out"])
