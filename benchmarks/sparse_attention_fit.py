"""Block-sparse attention figures: the tile model's fit and held-out tables, then the
kernel choices and examples it prices.

Run:  python benchmarks/sparse_attention_fit.py

The fit and validation are ``calibrate.sparse.attention`` (``python -m
calibrate.sparse.attention --write`` refits costmodels/data/sparse_attention.yaml); this
script prints its tables and adds the NSA-kernel vs FSA-kernel figures, a SALE and an S2
example, priced by ``costmodels.ops.sparse_attention``.
"""

from __future__ import annotations

import numpy as np

from calibrate.sparse import attention as fit
from costmodels.ops import sparse_attention as sa
from workloads.sparsity import parse_pattern


def nsa_fsa_table() -> list[dict]:
    out = []
    for gpu in fit.GPUS:
        for block, sel in ((64, 16), (128, 8)):
            pattern = parse_pattern(f"nsa:lsel={block},n={sel}")
            for seq in (32768, 65536):
                for g in (1, 2, 4, 8, 16):
                    t = sa.nsa_attention_time(
                        seq_len=seq, heads_q=4 * g, heads_kv=4, pattern=pattern, gpu=gpu
                    )
                    out.append(
                        {
                            "gpu": gpu,
                            "block": block,
                            "selected": sel,
                            "seq": seq,
                            "group": g,
                            "nsa_sel_ms": t.selected.nsa_s * 1e3,
                            "fsa_sel_ms": t.selected.fsa_s * 1e3,
                            "sel_speedup": t.selected.fsa_speedup,
                            "full_speedup": t.nsa_total_s / t.fsa_total_s,
                            "choice": t.selected.choice,
                        }
                    )
    return out


def print_nsa_fsa() -> None:
    print("\nNSA selected attention: NSA kernel vs FSA kernel (forward; 4 KV heads, d 128)")
    print(
        f"{'gpu':9s} {'blk':>3s} {'n':>2s} {'seq':>6s} {'G':>2s} {'NSA ms':>8s} {'FSA ms':>8s} "
        f"{'sel x':>6s} {'all x':>6s} choice"
    )
    rows = nsa_fsa_table()
    for r in rows:
        print(
            f"{r['gpu']:9s} {r['block']:3d} {r['selected']:2d} {r['seq']:6d} {r['group']:2d} "
            f"{r['nsa_sel_ms']:8.2f} {r['fsa_sel_ms']:8.2f} {r['sel_speedup']:6.2f} "
            f"{r['full_speedup']:6.2f} {r['choice']}"
        )
    for gpu in fit.GPUS:
        full = np.array([r["full_speedup"] for r in rows if r["gpu"] == gpu])
        small = np.array([r["full_speedup"] for r in rows if r["gpu"] == gpu and r["group"] <= 8])
        print(
            f"{gpu}: NSA/FSA over all three branches: max {full.max():.2f}x, geometric mean "
            f"{np.exp(np.log(small).mean()):.2f}x for G <= 8 (published: up to 3.5x, 1.6x on "
            "average at kernel level)"
        )


def print_examples() -> None:
    sale = parse_pattern("sale:density=0.1").tiles(65536, 32)
    st = sa.sale_time(sale, gpu="h100-sxm")
    print(
        f"\nSALE density 0.1, 64k x 32 heads, H100: estimate {st.estimate_s * 1e3:.2f} ms + "
        f"sparse {st.sparse_s * 1e3:.2f} ms vs dense causal {st.dense_s * 1e3:.2f} ms "
        f"({st.speedup:.2f}x)"
    )
    s2 = parse_pattern("s2:local=2,stride=8")
    masks = s2.tile_masks(32768, 16)["main"]
    hs = sa.head_sharded_time(s2.tiles(32768, 16), 4, direction="bwd", masks=masks)
    print(
        f"S2 local=2 stride=8, 32k x 16 heads over 4 ranks, H100 backward: ranks "
        f"{[round(x * 1e3, 2) for x in hs['rank_s']]} ms, imbalance {hs['imbalance']:.3f}"
    )


def main() -> None:
    fit.print_tables([fit.evaluate(g) for g in fit.GPUS], fit.repeat_noise())
    print_nsa_fsa()
    print_examples()


if __name__ == "__main__":
    main()
