"""The host cost of a tensor-parallel collective call in eager PyTorch, from one machine's
one-GPU and TP steps (``costmodels.steps.training.HOST_OPS_PER_COLLECTIVE``).

    python -m calibrate.trace.tp_host [--folder calibrate/data/steps-par-h200-x4/host]

A host-bound step takes ``host_s_per_op * (ops + k * collectives)`` per iteration: ``ops``
the op instances of the decomposition the host dispatches, ``collectives`` its TP
collective calls (:func:`costmodels.steps.training.host_launches` and
``host_collectives``). Host speed differs between machines of one kind by up to 2x, so
``k`` is measured against the same machine's own ``host_s_per_op``: the one-GPU steps of
512-1k tokens of a model (``single-alone``, host-bound) give its seconds per op, the TP
steps of 1k tokens (``par``, host-bound at TP 2 and 4) its TP host time, and
``k = (step_s / host_s_per_op - ops) / collectives``. The fit uses the models in
:data:`FIT_MODELS`; every other model of the folder is held out and predicted with the
fitted ``k``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from calibrate.trace.fit import single_gpu_plan, step_model
from costmodels.ops.select import get_cost_model
from costmodels.steps.training import host_collectives, host_launches, step_costs
from hardware_specs.registry import builtin_catalog
from workloads.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "calibrate" / "data" / "steps-par-h200-x4" / "host"
FIT_MODELS = ("llama3.2-1b-like",)
#: steps of at most this many tokens per rank are host-bound on an H200 (1-1.5B models)
HOST_BOUND_TOKENS = 1024


@dataclass(frozen=True)
class TPHostRow:
    """One host-bound TP step: measured seconds, its host work and the fitted ``k``."""

    model: str
    tp: int
    step_s: float
    host_s_per_op: float  # the same machine's one-GPU host time per op of this model
    ops: int
    collectives: int

    @property
    def k(self) -> float:
        return (self.step_s / self.host_s_per_op - self.ops) / self.collectives

    def predicted_s(self, k: float) -> float:
        return self.host_s_per_op * (self.ops + k * self.collectives)


def _counts(row: pd.Series, tp: int) -> tuple[int, int]:
    """(ops, TP collectives) of one step of ``row``'s model at ``tp`` on one rank."""
    model = step_model(row)
    b, s = int(row.batch), int(row.seq_len)
    if tp == 1:
        plan = single_gpu_plan(model, row, "bf16-mixed")
    else:
        plan = make_plan(
            model, num_gpus=tp, tp=tp, micro_batch=b, global_batch=b, seq_len=s,
            sequence_parallel=True,
        )  # fmt: skip
    system = builtin_catalog().system("h200-sxm", tp)
    c = step_costs(model, plan, get_cost_model("h200-sxm"), system, "cudnn", "pytorch")
    layers = model.num_layers
    return host_launches(c, layers, 1, True, True, 1), host_collectives(c, layers, 1, True, True)


def tp_host_rows(folder: Path = FOLDER) -> list[TPHostRow]:
    """Every host-bound TP step of ``folder`` with its machine's one-GPU host time per op."""
    single = pd.read_csv(folder / "single-alone" / "train_step.csv")
    single = single[(single.status == "ok") & (single.batch * single.seq_len <= HOST_BOUND_TOKENS)]
    per_op: dict[str, float] = {}
    for name, rows in single.groupby("model"):
        ops = [_counts(r, 1)[0] for _, r in rows.iterrows()]
        per_op[str(name)] = float((rows.step_ms / 1e3 / pd.Series(ops, index=rows.index)).mean())
    out = []
    for csv in sorted(folder.glob("par/par_step.tp*.pp1.csv")):
        df = pd.read_csv(csv)
        df = df[(df.status == "ok") & (df.batch * df.seq_len <= HOST_BOUND_TOKENS)]
        for _, r in df.iterrows():
            if str(r.model) not in per_op:
                continue
            ops, calls = _counts(r, int(r.tp))
            out.append(
                TPHostRow(
                    str(r.model), int(r.tp), r.step_ms / 1e3, per_op[str(r.model)], ops, calls
                )
            )
    return out


def fit_host_ops_per_collective(rows: list[TPHostRow]) -> float:
    """Mean ``k`` of the rows of :data:`FIT_MODELS`, rounded to 0.1."""
    fit = [r.k for r in rows if r.model in FIT_MODELS]
    if not fit:
        raise ValueError(f"no host-bound TP row of {', '.join(FIT_MODELS)}")
    return round(sum(fit) / len(fit), 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.trace.tp_host", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--folder", type=Path, default=FOLDER)
    args = ap.parse_args(argv)
    rows = tp_host_rows(args.folder)
    k = fit_host_ops_per_collective(rows)
    print(f"host ops per TP collective: {k} (fitted on {', '.join(FIT_MODELS)})")
    for r in rows:
        tag = "fit" if r.model in FIT_MODELS else "held out"
        err = 100.0 * (r.predicted_s(k) / r.step_s - 1.0)
        pred_ms = r.predicted_s(k) * 1e3
        print(f"{r.model:18s} tp{r.tp} {r.step_s * 1e3:7.1f} ms  host/op "
              f"{r.host_s_per_op * 1e6:5.1f} us  ops {r.ops} + {r.collectives} collectives  "
              f"k {r.k:4.2f}  predicted {pred_ms:7.1f} ms ({err:+.1f}%, {tag})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
