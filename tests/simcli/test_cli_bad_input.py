"""Absurd and impossible sizes are refused in one line that says the bound (issue 18 items 6
and 9): ``predict gemm --m 99999999999999999999999999`` exited 0 with numpy warnings,
``--m 10000000000000`` priced 2.8e27 ms, ``step --phase decode --context-len 0`` ran."""

from pathlib import Path

import pytest

from workloads.ops import MAX_BYTES, MAX_DIM, MAX_TOKENS

HUGE = "99999999999999999999999999"
GPU = ("--gpu", "h100-sxm")
STEP = ("step", "--model", "llama3-8b", *GPU)


def _one_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert res.stdout == "" and "Warning" not in res.stderr
    return lines[0]


@pytest.mark.parametrize(
    "argv, says",
    [
        (("predict", "gemm", "--m", HUGE, "--n", "8", "--k", "8"), f"--m {HUGE} is invalid"),
        (("predict", "gemm", "--m", "10000000000000", "--n", "8", "--k", "8"), str(MAX_DIM)),
        (("predict", "gemm", "--m", "8", "--n", "8", "--k", "8", "--batch", HUGE), str(MAX_DIM)),
        (("predict", "attention", "--seq-q", HUGE, "--heads-q", "32"), str(MAX_TOKENS)),
        (("predict", "decode", "--context-len", HUGE, "--heads-q", "32"), "--context-len"),
        (("predict", "blocksparse", "--seq-len", "8192", "--heads-q", "32", "--density",
          "0.1", "--block-size", HUGE), "--block-size"),
        (("predict", "collective", "--bytes", HUGE), str(MAX_BYTES)),
        (("predict", "elementwise", "--op", "rmsnorm", "--m", "8", "--n", "8000000000"),
         "for --op rmsnorm"),
        (("predict", "layer", "--model", "llama3-8b", "--seq-len", HUGE), "--seq-len"),
        (("predict", "layer", "--model", "llama3-8b", "--seq-len", "16777216", "--batch",
          "65536"), "tokens is too large"),
        (("predict", "gemm", "--m", "0", "--n", "8", "--k", "8"), "--m 0"),
        ((*STEP, "--phase", "decode", "--context-len", "0"), "at least one cached token"),
        ((*STEP, "--phase", "decode", "--context-len", HUGE), str(MAX_TOKENS)),
        ((*STEP, "--phase", "decode", "--context-len", "8", "--batch", HUGE), "--batch"),
        ((*STEP, "--phase", "prefill", "--prompt-len", HUGE), "--prompt-len"),
        (("serve", "--model", "llama3-8b", *GPU, "--qps", "1", "--replicas", HUGE),
         "--replicas"),
        (("serve", "--model", "llama3-8b", *GPU, "--qps", "1", "--num-requests", HUGE),
         "--num-requests"),
    ],
)  # fmt: skip
def test_out_of_range_sizes_are_one_line_with_the_bound(run, argv, says):
    line = _one_line(run(*argv, *(GPU if argv[0] == "predict" else ())))
    assert says in line, line
    assert "allowed" in line, line


def test_sizes_at_the_bounds_still_price_finite_times(run):
    import json

    res = run("predict", "gemm", "--m", str(MAX_DIM), "--n", "8", "--k", "8", *GPU,
              "--format", "json")  # fmt: skip
    assert res.exit_code == 0 and "Warning" not in res.stderr, res.output
    ms = json.loads(res.stdout)["predicted_ms"]
    assert 0 < ms < 1e4  # a 2^31 x 8 x 8 GEMM streams ~34 GB: tens of ms, not 1e27
    res = run(*STEP, "--phase", "decode", "--context-len", "1", "--format", "json")
    assert res.exit_code == 0, res.output


def test_heads_kv_not_dividing_heads_q_is_one_plain_line(run):
    line = _one_line(run("predict", "attention", "--seq-q", "8", "--heads-q", "32",
                         "--heads-kv", "5", *GPU))  # fmt: skip
    assert line == (
        "error: heads_q (32) must be a multiple of heads_kv (5); allowed: a heads_kv "
        "dividing heads_q (1, 2, 4, 8, 16, 32)"
    )


def test_ops_csv_sizes_have_the_same_bounds(run, tmp_path):
    ops = tmp_path / "ops.csv"
    ops.write_text("op,m,n,k\ngemm,8,8,8\ngemm,10000000000000,8,8\nadamw,,8000000000,\n")
    line = _one_line(run("predict", *GPU, "--input", str(ops)))
    assert line == (
        f"error: row 2: column 'm' value 10000000000000 is too large; allowed: at most "
        f"{MAX_DIM} (2^31 - 1, the 32-bit sizes cuBLAS and CUDA kernels take)"
    )
    ops.write_text("op,m,n,k\ngemm,8,8,8\nadamw,,8000000000,\n")  # adamw's n: parameters
    res = run("predict", *GPU, "--input", str(ops), "--format", "json")
    assert res.exit_code == 0, res.output
    assert not list(Path(tmp_path).glob(".*"))
