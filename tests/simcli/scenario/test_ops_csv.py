"""``simcli predict --input ops.csv --output pred.csv``: the fast CSV path
(simcli/scenario/ops_csv.py) writes the reference path's bytes, and leaves every file it
is not sure of, and every error, to the reference path."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simcli.scenario.predict as predict_mod
from simcli.scenario.ops_csv import format_g6, read_fast
from simcli.scenario.predict import PredictBatchConfig, resolve_predict_batch, run_predict_batch
from workloads.ops import CSV_COLUMNS, OpError

from ...costmodels.ops.test_learned_fast_path import mixed_frame


def _csv_text(frame: pd.DataFrame, columns=CSV_COLUMNS) -> str:
    """A validated frame as a user's CSV: integers without '.0', empty cells empty."""
    out = pd.DataFrame(index=frame.index)
    for c in columns:
        col = frame[c]
        if c == "causal":
            out[c] = np.where(col, "true", "")
        elif col.dtype == object:
            out[c] = col
        elif c == "density":
            out[c] = [("" if v != v else repr(v)) for v in col]
        else:
            out[c] = [("" if v != v else str(int(v))) for v in col]
    return out.to_csv(index=False)


@pytest.fixture(scope="module")
def mixed_csv() -> str:
    return _csv_text(mixed_frame(3000, seed=5))


def _predict(path: Path, out: Path, *, fast: bool, monkeypatch) -> tuple[bytes, object]:
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(predict_mod, "read_fast", lambda _path: None)
        scenario = resolve_predict_batch(PredictBatchConfig(gpu="h100-sxm", input_csv=path))
        pred = run_predict_batch(scenario)
        assert (scenario.fast is not None) == fast
        pred.write_csv(out)
    return out.read_bytes(), pred


def _variants(text: str) -> dict[str, str]:
    lines = text.splitlines()
    header, rows = lines[0], lines[1:]
    names = header.split(",")
    keep = [names.index(c) for c in ("op", "dtype", "m", "n", "k", "bytes", "ranks")]
    no_attn = [r for r in rows[:800] if not r.startswith("attn")]  # needs none of its columns
    gemm_like = [",".join(r.split(",")[i] for i in keep) for r in no_attn]
    return {
        "plain": text,
        "crlf": text.replace("\n", "\r\n"),
        "blank lines, no last newline": "\n".join([header, rows[0], "", *rows[1:50], "", ""])
        + rows[50],
        "a few columns, reordered": "\n".join(
            ["ranks,bytes,k,n,m,dtype,op", *(",".join(r.split(",")[::-1]) for r in gemm_like)]
        )
        + "\n",
        "upper-case names": text.replace("gemm,bf16", "GEMM,BF16"),
        "leading zeros": text.replace(",128,", ",0128,"),
    }


def test_fast_path_writes_the_reference_bytes(mixed_csv, tmp_path, monkeypatch):
    for name, text in _variants(mixed_csv).items():
        src = tmp_path / "ops.csv"
        src.write_text(text, newline="")
        fast, p_fast = _predict(src, tmp_path / "fast.csv", fast=True, monkeypatch=monkeypatch)
        ref, p_ref = _predict(src, tmp_path / "ref.csv", fast=False, monkeypatch=monkeypatch)
        assert fast == ref, name
        np.testing.assert_array_equal(p_fast.work.time_s, p_ref.work.time_s)
        assert p_fast.summary() == p_ref.summary()
        # rows, records and the validated frame are still there when asked for
        pd.testing.assert_frame_equal(p_fast.out, p_ref.out)
        pd.testing.assert_frame_equal(p_fast.scenario.frame, p_ref.scenario.frame)


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace("gemm,", '"gemm",', 1),  # quotes
        lambda t: t.replace("gemm,", " gemm,", 1),  # initial space
        lambda t: "\ufeff" + t,  # byte-order mark
        lambda t: t.replace("op,", "op,op,", 1),  # duplicate header name
        lambda t: t.replace(",ranks", ",ranks,extra", 1),  # unknown column
        lambda t: t.replace(",128,", ",128.0,", 1),  # a size written as a float
        lambda t: t.split("\n", 1)[0] + "\n",  # header only
        lambda t: t.replace("\n", "\n\n", 1).replace("op,", "\nop,", 1),  # leading blank
    ],
)
def test_files_the_fast_path_leaves_to_pandas(mixed_csv, tmp_path, edit):
    src = tmp_path / "ops.csv"
    src.write_text(edit(mixed_csv), newline="")
    assert read_fast(src) is None


def test_density_written_as_nan_is_refused_as_before(tmp_path, monkeypatch):
    text = "op,seq_q,seq_kv,heads_q,heads_kv,head_dim,batch,density,block_size\n"
    text += "attn_blocksparse_fwd,1024,1024,8,8,128,1,nan,128\n"
    src = tmp_path / "ops.csv"
    src.write_text(text)
    assert read_fast(src) is None
    with pytest.raises(OpError, match="density"):
        resolve_predict_batch(PredictBatchConfig(gpu="h100-sxm", input_csv=src))


@pytest.mark.parametrize(
    "bad",
    [
        ("gemm,bf16,64,64,64", "gemm,bf16,64,0,64"),  # non-positive size
        ("gemm,bf16,64,64,64", "gemm,bf17,64,64,64"),  # unknown dtype
        ("gemm,bf16,64,64,64", "gemm,bf16,64,,64"),  # missing required size
        ("gemm,bf16,64,64,64", "gemm,bf16,64,64,4294967296"),  # beyond the size limits
    ],
)
def test_errors_are_the_reference_errors(tmp_path, monkeypatch, bad):
    """An error far down a big file, after an error of another kind near the end: the
    message is the whole file's first, worded as the reference words it."""
    good, wrong = bad
    rows = [good] * 200_000
    rows[150_000] = wrong
    rows[-1] = "attn_fwd,bf16,,,"  # misses its sizes: a later error of another check
    src = tmp_path / "ops.csv"
    src.write_text("op,dtype,m,n,k\n" + "\n".join(rows) + "\n")
    messages = []
    for fast in (True, False):
        with monkeypatch.context() as m:
            if not fast:
                m.setattr(predict_mod, "read_fast", lambda _path: None)
            with pytest.raises(OpError) as err:
                resolve_predict_batch(PredictBatchConfig(gpu="h100-sxm", input_csv=src))
        messages.append(str(err.value))
    assert messages[0] == messages[1]


def test_format_g6_is_printf():
    rng = np.random.default_rng(1)
    values = np.concatenate(
        [
            np.exp(rng.uniform(math_log(1e-20), math_log(1e20), 200_000)),
            np.round(rng.uniform(0, 1e6, 50_000)) / 10.0 ** rng.integers(0, 12, 50_000),
            rng.integers(1, 10**7, 20_000).astype(float),
            [0.0, -1.5, np.nan, np.inf, -np.inf, 1.0, 1e5, 999999.5, 9999995.0, 0.000123456,
             1e-4, 1e-5, 99999.95, 123456.5, 1234565.0, 5e-324, 1e300, 0.5, 2.5e-7],
        ]
    )  # fmt: skip
    text, size = format_g6(values)
    got = [bytes(row[:n]).decode() for row, n in zip(text, size, strict=True)]
    want = ["" if v != v else "%.6g" % v for v in values.tolist()]  # noqa: UP031
    assert got == want


def math_log(x: float) -> float:
    return float(np.log(x))


def test_without_pyarrow_the_pandas_path_reads(mixed_csv, monkeypatch):
    """pyarrow comes with the parquet extra: a plain `pip install .` has none, and the
    quick start's `simcli predict --input` must still work."""
    import builtins

    real = builtins.__import__

    def no_arrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_arrow)
    assert read_fast(mixed_csv) is None
