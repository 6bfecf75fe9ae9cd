import pytest

from simcli import progress


@pytest.fixture
def tty(monkeypatch):
    """stderr seen as a terminal (pytest swaps sys.stderr between phases, so the check
    itself is patched; the pty test below uses a real terminal)."""
    monkeypatch.setattr(progress, "_stderr_is_tty", lambda: True)
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setitem(progress._state, "quiet", False)


def test_bar_draws_on_a_terminal(tty):
    with progress.progress_bar("work", total=3, fields=("failed",)) as advance:
        for i in range(3):
            advance(i + 1, failed=1)
        assert advance._rich is not None  # a rich bar was started (drawing: see the pty test)
        task = advance._rich.tasks[0]
        assert (task.completed, task.total, task.fields["failed"]) == (3, 3, 1)


def test_quiet_and_pipes_draw_nothing(tty, monkeypatch):
    # recorded before set_quiet, so teardown restores "not quiet" for later tests
    monkeypatch.setitem(progress._state, "quiet", False)
    progress.set_quiet(True)
    with progress.progress_bar("work", total=3) as advance:
        advance(1)
    assert advance is progress._noop
    monkeypatch.setitem(progress._state, "quiet", False)
    monkeypatch.setattr(progress, "_stderr_is_tty", lambda: False)  # a pipe
    assert not progress.enabled()


def test_short_work_stays_silent(tty, monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 60.0)
    with progress.progress_bar("quick", total=2) as advance:
        advance(2)
        assert advance._rich is None  # under a second: no bar was ever started


def test_json_stdout_is_clean_while_a_bar_draws_on_stderr(tmp_path):
    """A real process with stderr on a pseudo-terminal: the bar goes there, stdout is JSON."""
    import json
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    env = {**os.environ, "SIMCLI_PROGRESS_AFTER_S": "0", "COLUMNS": "120"}
    args = "plan --model llama3-8b --gpu h100-sxm --gpus 8 --seq-len 4096 --global-batch 64"
    args = [*args.split(), "--top", "2", "--format", "json"]
    code = "from simcli.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=slave, env=env,
        timeout=120,
    )  # fmt: skip
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    assert proc.returncode == 0
    assert len(json.loads(proc.stdout)["plans"]) == 2
    assert b"plan search" in drawn
    quiet = subprocess.run(
        [sys.executable, "-c", code, "--quiet", *args], capture_output=True, env=env, timeout=120
    )
    assert quiet.returncode == 0 and quiet.stderr == b""


def test_without_a_terminal_long_work_prints_periodic_lines(monkeypatch, capsys):
    """Pipes and CI logs: no bar, but a plain line at most every LINE_EVERY_S (issue 18
    item 7: long work is never silent); quiet still silences it."""
    monkeypatch.setitem(progress._state, "quiet", False)
    monkeypatch.setattr(progress, "_stderr_is_tty", lambda: False)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    with progress.progress_bar("plan search", total=4) as advance:
        advance(1)
        advance(3, failed=1)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("plan search: 1/4 (25%)") and "elapsed" in err[0]
    assert err[1].startswith("plan search: 3/4 (75%), failed 1")
    monkeypatch.setattr(progress, "LINE_EVERY_S", 3600.0)
    with progress.progress_bar("quick", total=2) as advance:
        advance(2)
    assert capsys.readouterr().err == ""  # short work stays silent
