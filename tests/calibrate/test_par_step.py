"""calibrate.steps.par_step on the CPU: tensor-parallel (sequence-parallel) and 1F1B
pipeline steps of tiny models in gloo processes, their loss and every gradient checked
against the single-process model of train_step (``--check``), and the CSV they write.
Needs torch (skipped without it)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed.run")

from calibrate.steps import par_step as P  # noqa: E402
from calibrate.steps.par_model import stage_layers  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _torchrun(tmp_path: Path, tp: int, pp: int, *extra: str) -> list[dict[str, str]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(tp * pp), "-m", "calibrate.steps.par_step",
           "--out", str(tmp_path), "--tp", str(tp), "--pp", str(pp), "--tiny",
           "--device", "cpu", "--check", "--warmup", "1", "--steps", "2", *extra]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    path = tmp_path / f"par_step.tp{tp}.pp{pp}.csv"
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == list(P.COLUMNS)
        return list(reader)


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_parallel_step_matches_one_process_and_writes_rows(tmp_path, tp, pp):
    """Two gloo ranks: the gradients of the TP (with SP, vocab-parallel embedding and
    loss) or 1F1B code equal the single-process model's to fp32 rounding; one ok row per
    model and shape, with every rank's numbers."""
    rows = _torchrun(tmp_path, tp, pp, "--models", "tiny-gqa,tiny-mha", "--shapes", "1x16,2x16",
                     "--trace-dir", str(tmp_path / "traces"), "--trace-first-only")  # fmt: skip
    meta = json.loads((tmp_path / f"par_step.tp{tp}.pp{pp}.meta.json").read_text())
    assert meta["check"]["ok"] and meta["check"]["max_rel_error"] < 1e-4
    assert [(r["model"], r["batch"]) for r in rows] == [
        ("tiny-gqa", "1"),
        ("tiny-gqa", "2"),
        ("tiny-mha", "1"),
        ("tiny-mha", "2"),
    ]
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert float(r["check_max_rel_error"]) < 1e-4
        assert int(r["world_size"]) == tp * pp and r["mode"] == P.mode_name(tp, pp)
        assert len(r["rank_step_ms"].split(";")) == tp * pp
        ranks_ms = [float(x) for x in r["rank_step_ms"].split(";")]
        assert float(r["step_ms"]) == pytest.approx(max(ranks_ms), abs=1e-3)
        assert int(r["global_batch"]) == int(r["batch"]) * int(r["microbatches"])
    # --trace-first-only: rank 0's trace of each model's first shape only
    for r in rows[::2]:
        assert r["trace"] and (tmp_path / "traces" / r["trace"]).exists()
    assert not rows[1]["trace"] and not rows[3]["trace"]


def test_layer_split_is_the_plans():
    """The stages hold the layers TrainPlan.layers_per_chunk gives them (what simcli
    simulates for the same plan)."""
    from workloads.models import load_model
    from workloads.plan import make_plan

    for layers, pp in ((16, 4), (24, 4), (28, 4), (30, 4), (7, 2), (10, 4)):
        model = load_model("llama3-8b").model_copy(update={"num_layers": layers})
        plan = make_plan(model, num_gpus=pp, pp=pp, global_batch=pp, seq_len=128)
        want = plan.layers_per_chunk(layers)
        got = [hi - lo for lo, hi in (stage_layers(layers, pp, s) for s in range(pp))]
        assert got == list(want), (layers, pp)


def test_bad_arguments_are_one_line():
    with pytest.raises(SystemExit):
        P.parse_args(["--out", "x", "--pp", "4", "--microbatches", "2"])
    with pytest.raises(SystemExit):
        P.parse_args(["--out", "x", "--microbatches", "4"])
