"""The ops CSV's optional ``sparsity`` column (workloads/ops.py): parsing, validation, and
frames without it left exactly as before."""

from __future__ import annotations

import pandas as pd
import pytest

from workloads.ops import (
    CSV_COLUMNS,
    EXTRA_COLUMNS,
    Op,
    OpError,
    OpKind,
    canonical_sparsity,
    normalise_frame,
    ops_frame,
    parse_gemm_sparsity,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", ("dense", 1.0)),
        ("Dense", ("dense", 1.0)),
        ("2:4", ("2:4", 0.5)),
        (" unstructured:0.8 ", ("unstructured", 0.8)),
        ("unstructured:0", ("unstructured", 0.0)),
        ("cats:1", ("cats", 1.0)),
    ],
)
def test_parse(text, want) -> None:
    assert parse_gemm_sparsity(text) == want


@pytest.mark.parametrize(
    "text", ["3:4", "unstructured:1", "unstructured:-0.1", "cats:0", "cats:1.5", "cats:x", "4:8"]
)
def test_bad_values_are_one_line(text) -> None:
    with pytest.raises(OpError) as exc:
        parse_gemm_sparsity(text)
    assert "\n" not in str(exc.value) and "allowed:" in str(exc.value)


def test_canonical_spelling() -> None:
    assert canonical_sparsity("DENSE") == ""
    assert canonical_sparsity("unstructured:0.80") == "unstructured:0.8"
    assert canonical_sparsity("cats:.5") == "cats:0.5"


def test_frames_without_the_column_are_unchanged() -> None:
    raw = pd.DataFrame({"op": ["gemm"], "m": ["8"], "n": ["16"], "k": ["32"]})
    out = normalise_frame(raw)
    assert list(out.columns) == [*CSV_COLUMNS, *EXTRA_COLUMNS]
    assert list(ops_frame([Op(op=OpKind.gemm, m=1, n=2, k=3)]).columns) == list(out.columns)


def test_column_round_trip() -> None:
    raw = pd.DataFrame(
        {
            "op": ["gemm", "gemm", "gemm", "copy"],
            "m": ["8", "8", "8", ""],
            "n": ["16", "16", "16", ""],
            "k": ["32", "32", "32", ""],
            "bytes": ["", "", "", "64"],
            "sparsity": ["2:4", "Unstructured:0.50", "", ""],
        }
    )
    out = normalise_frame(raw)
    assert list(out["sparsity"]) == ["2:4", "unstructured:0.5", "", ""]
    op = Op(op=OpKind.gemm, m=8, n=16, k=32, sparsity="cats:0.3")
    assert ops_frame([op])["sparsity"].tolist() == ["cats:0.3"]


def test_bad_rows_name_row_and_value() -> None:
    bad = pd.DataFrame({"op": ["gemm", "gemm"], "m": ["1", "1"], "n": ["2", "2"],
                        "k": ["3", "3"], "sparsity": ["2:4", "2:8"]})  # fmt: skip
    with pytest.raises(OpError, match=r"row 2: column 'sparsity' '2:8' not understood"):
        normalise_frame(bad)
    other = pd.DataFrame({"op": ["copy"], "bytes": ["8"], "sparsity": ["2:4"]})
    with pytest.raises(OpError, match="non-gemm op; allowed: gemm rows only"):
        normalise_frame(other)
    with pytest.raises(ValueError, match="takes no sparsity"):
        Op(op=OpKind.copy, bytes=8, sparsity="2:4")
