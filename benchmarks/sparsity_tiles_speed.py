"""Milliseconds per ``Pattern.tiles()`` call, per sparsity pattern, at 128k and 1M tokens.

Run: python benchmarks/sparsity_tiles_speed.py [--heads 32] [--block 128] [--repeat 5]
Prints, for each pattern and length, the best-of-``repeat`` wall time of the closed-form
tile count over ``heads`` heads and the resulting density (fraction of all tiles). Figures,
not a timed test.
"""

from __future__ import annotations

import argparse
import time

from workloads.sparsity import parse_pattern

PATTERNS = [
    "dense",
    "causal",
    "window:4096:sinks=4",
    "topk:density=0.1",
    "topk:k=16:per_head",
    "s2:local=4,stride=16",
    "nsa",
    "sale:density=0.2",
    "adaspa:search_every=5,density=0.3",
    "hybrid:dense_every=4,inner=nsa",
]
LENGTHS = [128 * 1024, 1024 * 1024]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--block", type=int, default=128, help="block_q = block_k")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"heads={args.heads} block_q=block_k={args.block}, best of {args.repeat}")
    print(f"{'pattern':38s} {'tokens':>9s} {'ms':>8s} {'density':>9s}")
    for spec in PATTERNS:
        pattern = parse_pattern(spec)
        for n in LENGTHS:
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                table = pattern.tiles(n, args.heads, args.block, args.block)
                best = min(best, time.perf_counter() - t0)
            print(f"{spec:38s} {n:9d} {best * 1e3:8.2f} {table.density:9.5f}")


if __name__ == "__main__":
    main()
