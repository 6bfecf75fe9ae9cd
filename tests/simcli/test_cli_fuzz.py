"""CLI fuzz (issue 18 item 16): every results command, one option at a time replaced by a
hostile value (numbers at and past limits, empty / malformed / missing files, folders
where files go, unwritable outputs). Whatever the value, the command either answers
(exit 0) or refuses with one ``error:`` line (exit 2): no traceback, no partial output
file. A hypothesis deadline guards against hangs."""

from __future__ import annotations

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import simcli.cli

runner = CliRunner()

# A cheap valid invocation of each command; the fuzz replaces or adds one option.
BASE: dict[tuple[str, ...], list[str]] = {
    ("predict", "gemm"): ["--gpu", "h100-sxm", "--m", "128", "--n", "128", "--k", "128"],
    ("predict", "attention"): [
        "--gpu",
        "h100-sxm",
        "--batch",
        "1",
        "--heads",
        "8",
        "--seq-len",
        "512",
        "--head-dim",
        "64",
    ],  # fmt: skip
    ("predict", "collective"): [
        "--gpu",
        "h100-sxm",
        "--op",
        "all_reduce",
        "--bytes",
        "1048576",
        "--ranks",
        "8",
    ],  # fmt: skip
    ("train",): [
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--seq-len",
        "1024",
    ],  # fmt: skip
    ("plan",): [
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "8",
        "--global-batch",
        "16",
        "--seq-len",
        "1024",
        "--top",
        "1",
    ],  # fmt: skip
    ("step",): [
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm",
        "--phase",
        "decode",
        "--batch",
        "1",
        "--context-len",
        "128",
    ],  # fmt: skip
    ("serve",): [
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm",
        "--qps",
        "1",
        "--num-requests",
        "20",
    ],  # fmt: skip
    ("varlen",): [
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "8",
        "--seq-len",
        "4096",
        "--steps",
        "2",
    ],  # fmt: skip
    ("specs", "list"): [],
    ("models", "list"): [],
}

NUMBERS = ["0", "-1", "1", "2147483648", "99999999999999999999999999", "1e308", "nan", "inf",
           "-inf", "0.5", "abc", ""]  # fmt: skip
TEXTS = ["", "x", "1,2,,3", "h100-sxm", "::", "a" * 300, "-", "%"]


def _command(path: tuple[str, ...]):
    cmd = typer.main.get_command(simcli.cli.app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _options(path: tuple[str, ...]) -> list:
    # (typer vendors click: duck-typed, not isinstance)
    skip = {"--help", "--trace-output"}
    return [
        p
        for p in _command(path).params
        if getattr(p, "param_type_name", "") == "option"
        and p.opts[0] not in skip
        and not getattr(p, "hidden", False)
    ]


PATH_OPTIONS = {"output", "input", "trace", "profile", "hardware", "cluster", "composition",
                "config", "draft_model"}  # fmt: skip


def _values(opt, tmp) -> list[str]:
    """Hostile values for one option, by its type."""
    if getattr(opt, "is_flag", False):
        return []
    kind = str(opt.bare_type())
    if opt.name in PATH_OPTIONS or "path" in kind.lower():
        empty = tmp / "empty.csv"
        empty.write_text("")
        header = tmp / "header.csv"
        header.write_text("op,dtype\n")
        junk = tmp / "junk.yaml"
        junk.write_text("{[: not yaml\n")
        return [str(tmp / "missing" / "x.csv"), str(tmp), str(empty), str(header), str(junk),
                "/proc/simcli-unwritable/out.json", str(tmp / "out.json")]  # fmt: skip
    if kind in ("int", "float"):
        return NUMBERS
    return NUMBERS[:3] + TEXTS


CASES = [(path, opt.opts[0]) for path in BASE for opt in _options(path)]


@settings(
    max_examples=150,
    deadline=60_000,  # a hang guard, not a speed measurement
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=st.sampled_from(CASES), pick=st.integers(0, 1_000))
def test_every_option_survives_hostile_values(case, pick, tmp_path_factory):
    path, flag = case
    tmp = tmp_path_factory.mktemp("fuzz")
    opt = next(o for o in _options(path) if o.opts[0] == flag)
    values = _values(opt, tmp)
    if not values:
        return
    value = values[pick % len(values)]
    argv = [*path, *BASE[path], flag, value]
    before = {p.name for p in tmp.rglob("*")}
    res = runner.invoke(simcli.cli.app, argv)
    out = res.output + (res.stderr if res.stderr_bytes is not None else "")
    assert res.exit_code in (0, 2), (argv, res.exit_code, out[-800:])
    assert "Traceback" not in out, (argv, out[-800:])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        pytest.fail(f"{argv}: {type(res.exception).__name__}: {res.exception}")
    if res.exit_code == 2:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")]
        assert len(errors) == 1 and len(lines) <= 2, (argv, lines)
        after = {p.name for p in tmp.rglob("*")}
        assert after == before, (argv, after - before)  # no partial output
