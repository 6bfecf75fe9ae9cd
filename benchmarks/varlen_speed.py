"""Steps simulated per second by ``simcli varlen``, per strategy, and the speedups found.

Run: python benchmarks/varlen_speed.py [--steps 50] [--gpu h100-sxm]
For each scenario prints the price-table build time, every strategy's planning +
pricing time per step (steps/s) and its speedup over the static plan. Figures, not a
timed test.
"""

from __future__ import annotations

import argparse
import time

from costmodels.ops.select import get_cost_model
from simcli.training.varlen import make_varlen_config, simulate_varlen
from workloads.lengths import parse_dist
from workloads.models import get_model

SCENARIOS = [
    # model, gpus, tp, lengths, tokens per step, recompute
    ("llama3-8b", 64, 8, "longtail-256k", 1 << 20, "none"),
    ("llama3-8b", 64, 8, "longtail-256k", 1 << 22, "none"),
    ("llama3-8b", 64, 2, "longtail-128k", 1 << 20, "none"),
    ("llama3-70b", 128, 8, "longtail-128k", 1 << 21, "full"),
    ("llama3-8b", 256, 8, "longtail-256k", 1 << 23, "none"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for model_id, gpus, tp, dist, tokens, recompute in SCENARIOS:
        cfg = make_varlen_config(
            lengths=parse_dist(dist),
            num_gpus=gpus,
            tp=tp,
            tokens_per_step=tokens,
            steps=args.steps,
            seed=args.seed,
            recompute=recompute,
        )
        cost = get_cost_model(args.gpu, num_gpus=gpus)
        t0 = time.perf_counter()
        out = simulate_varlen(get_model(model_id), cost, cfg).to_dict()
        wall = time.perf_counter() - t0
        print(
            f"{model_id} {gpus}x{args.gpu} tp={tp} recompute={recompute} {dist} "
            f"{tokens} tokens/step ({out['docs_per_step']:.0f} docs/step, static "
            f"dp={out['static_plan']['dp']} cp={out['static_plan']['cp']}): "
            f"{args.steps} steps in {wall:.2f} s"
        )
        for name, s in out["strategies"].items():
            per_step = s["plan_wall_s_per_step"]
            print(
                f"  {name:10s} {1 / per_step:8.1f} steps/s   speedup {s['speedup_vs_static']:.3f}"
                f"   imbalance {s['imbalance']:.3f}   fallback {s['fallback_steps']}"
            )


if __name__ == "__main__":
    main()
