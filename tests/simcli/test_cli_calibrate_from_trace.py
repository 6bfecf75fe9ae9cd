"""``simcli calibrate from-trace`` on the committed H100 traces, and ``train --composition``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from costmodels.steps.composition import load_composition
from tests.simcli.reports.browser import one_error_line

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "traces"
STEPS = ROOT / "calibrate" / "data" / "steps2-h100-sxm"
CONFIG = """\
kind: train
model: {model}
gpu: h100-sxm
engine: {engine}
precision: {precision}
micro_batch: 2
seq_len: 4096
attn_backend: cudnn
"""


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(trace, config) of an eager and a compiled Llama-3.2-1B-shaped 2x4096 step."""
    tmp = tmp_path_factory.mktemp("from-trace")
    shutil.copy(DATA / "llama3.2-1b-like.config.json", tmp)
    out = []
    for folder, mode, engine in (("train-eager", "eager", "pytorch-eager"),
                                 ("train-compiled", "compile", "pytorch-compile")):  # fmt: skip
        cfg = tmp / f"{mode}.yaml"
        cfg.write_text(
            CONFIG.format(model="llama3.2-1b-like.config.json", engine=engine,
                          precision="bf16-mixed")  # fmt: skip
        )
        trace = STEPS / folder / "traces" / f"llama3.2-1b-like.{mode}.none.2x4096.trace.json.gz"
        out.append((trace, cfg))
    return tmp, out


def _args(pairs):
    return [x for t, c in pairs for x in ("--trace", str(t), "--config", str(c))]


def test_fit_writes_a_composition_train_applies(run, pairs):
    tmp, items = pairs
    out = tmp / "comp.json"
    result = run("calibrate", "from-trace", *_args(items), "--out", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    comp = load_composition(out)
    assert printed["factors"] == comp.factors
    assert set(comp.factors) == {"pytorch", "pytorch-compile"}
    assert comp.meta["fitted_on"] == ["llama3.2-1b-like"]
    # the fitted factors change what train predicts for that engine, and only through the file
    base = ["train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "1",
            "--global-batch", "1", "--seq-len", "2048", "--framework", "pytorch-compile",
            "--ignore-memory", "--format", "json"]  # fmt: skip
    shipped = json.loads(run(*base).stdout)["iteration_s"]
    mine = json.loads(run(*base, "--composition", str(out)).stdout)["iteration_s"]
    assert mine != pytest.approx(shipped, rel=1e-6)


def test_bad_input_is_one_line_and_writes_nothing(run, pairs, tmp_path):
    tmp, items = pairs
    out = tmp_path / "c.json"
    trace, cfg = items[0]
    r = run("calibrate", "from-trace", "--trace", str(trace), "--out", str(out),
            "--config", str(cfg), "--config", str(cfg))  # fmt: skip
    assert "one --config per --trace" in one_error_line(r)
    r = run("calibrate", "from-trace", *_args(items), "--out", str(out),
            "--held-out-model", "llama3.2-1b-like")  # fmt: skip
    assert "every trace's model is held out" in one_error_line(r)
    decode = tmp / "decode.yaml"
    decode.write_text("kind: decode\nmodel: llama3-8b\ngpu: h100-sxm\nengine: vllm\nbatch: 1\n"
                      "context_len: 1024\n")  # fmt: skip
    r = run("calibrate", "from-trace", "--trace", str(trace), "--config", str(decode),
            "--out", str(out))  # fmt: skip
    assert "allowed: train" in one_error_line(r)
    assert not out.exists()
    missing = str(tmp / "nope.json")
    r = run("train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "1",
            "--global-batch", "1", "--seq-len", "2048", "--composition", missing)  # fmt: skip
    assert "does not exist" in one_error_line(r)


def test_host_time_per_op_from_host_bound_traces(run, tmp_path):
    """Small eager steps set their time on the host: with their untraced times
    (``step_ms``) the fit finds tens of microseconds per op; without, it takes the
    profiled wall time, which the profiler's own host overhead makes longer."""
    shutil.copy(DATA / "llama3.2-1b-like.config.json", tmp_path)
    host = ROOT / "calibrate" / "data" / "steps3-h100-sxm" / "train-host-eager"
    args: dict[bool, list[str]] = {True: [], False: []}
    for seq, step_ms in ((256, 57.8), (512, 81.9), (1024, 84.7)):
        trace = host / "traces" / f"llama3.2-1b-like.eager.none.1x{seq}.trace.json.gz"
        for timed in (True, False):
            cfg = tmp_path / f"{seq}-{timed}.yaml"
            text = CONFIG.format(model="llama3.2-1b-like.config.json", engine="pytorch-eager",
                                 precision="bf16-mixed")  # fmt: skip
            text = text.replace("micro_batch: 2", "micro_batch: 1")
            text = text.replace("seq_len: 4096", f"seq_len: {seq}")
            cfg.write_text(text + (f"step_ms: {step_ms}\n" if timed else ""))
            args[timed] += ["--trace", str(trace), "--config", str(cfg)]
    fitted = {}
    for timed in (True, False):
        out = tmp_path / f"comp-{timed}.json"
        r = run("calibrate", "from-trace", *args[timed], "--out", str(out), "--format", "json")
        assert r.exit_code == 0, r.output
        fitted[timed] = load_composition(out).host_s_per_op("pytorch")
    assert 2e-5 < fitted[True] < 8e-5
    assert fitted[False] > 1.3 * fitted[True]


def test_step_and_serve_take_a_composition_file(run, tmp_path):
    """`step`/`serve --composition FILE` price the eager engine with that file; a bad file
    is one error line."""
    comp = tmp_path / "c.json"
    factors = {"pytorch-eager/graph": {"idle": 2.0}}
    comp.write_text(json.dumps({"gpu": "h100-sxm", "factors": factors}))
    base = ["step", "--model", "llama3-8b", "--gpu", "h100-sxm", "--engine", "pytorch-eager",
            "--phase", "decode", "--batch", "8", "--context-len", "1024",
            "--format", "json"]  # fmt: skip
    shipped = json.loads(run(*base).stdout)["step_ms"]
    mine = run(*base, "--composition", str(comp))
    assert mine.exit_code == 0, mine.output
    assert json.loads(mine.stdout)["step_ms"] > 1.5 * shipped
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert "not JSON" in one_error_line(run(*base, "--composition", str(bad)))
    serve = ["serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--engine", "pytorch-eager",
             "--num-requests", "20", "--qps", "2", "--format", "json", "--quiet"]  # fmt: skip
    r = run(*serve, "--composition", str(comp))
    assert r.exit_code == 0, r.output
