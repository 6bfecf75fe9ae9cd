"""The learned correction keeps the cost-model contract and learns what it is shown."""

import json
import math

import numpy as np
import pytest

from costmodels import AnalyticalCostModel
from costmodels.ops.features import FEATURE_NAMES, feature_matrix, op_class
from costmodels.ops.learned import FAMILIES, LearnedCostModel, NotFittedError, mape
from workloads.ops import Op, ops_frame


@pytest.fixture(scope="module")
def base():
    return AnalyticalCostModel.for_gpu("h100-sxm")


def _gemm_frame(base, rows=300, seed=0, bias=0.3):
    rng = np.random.default_rng(seed)
    shapes = np.exp(rng.uniform(np.log(16), np.log(16384), (rows, 3))).round().astype(int)
    frame = ops_frame([Op(op="gemm", m=m, n=n, k=k) for m, n, k in shapes])
    analytical = base.predict_many(frame, validated=True)
    # a shape-dependent effect the analytical model lacks: small k is slower
    truth = analytical * (1 + bias * np.exp(-frame["k"].to_numpy() / 512))
    frame["measured_s"] = truth * np.exp(rng.normal(0, 0.01, rows))
    frame["family"] = [f"fam{i % 12}" for i in range(rows)]
    return frame, truth, analytical


@pytest.fixture(scope="module")
def fitted(base):
    frame, truth, analytical = _gemm_frame(base)
    return LearnedCostModel(base).fit(frame), frame, truth, analytical


def test_fit_returns_self_and_learns(base, fitted):
    model, frame, truth, analytical = fitted
    assert isinstance(model, LearnedCostModel)
    test, test_truth, test_analytical = _gemm_frame(base, rows=200, seed=1)
    pred = model.predict_many(test.drop(columns=["measured_s", "family"]))
    assert mape(test_truth, pred) < 0.5 * mape(test_truth, test_analytical)
    assert model.selection_["gemm_half"]["trees"] < model.selection_["gemm_half"]["none"]


def test_predict_before_fit_raises(base):
    with pytest.raises(NotFittedError):
        LearnedCostModel(base).predict(Op(op="gemm", m=1, n=1, k=1))


def test_fit_needs_measurements(base):
    frame = ops_frame([Op(op="gemm", m=8, n=8, k=8)])
    with pytest.raises(ValueError, match="measured_s"):
        LearnedCostModel(base).fit(frame)
    frame["measured_s"] = [-1.0]
    with pytest.raises(ValueError, match="positive"):
        LearnedCostModel(base).fit(frame)


def test_corrections_are_bounded(base, fitted):
    model = fitted[0]
    ops = [
        Op(op="gemm", m=1, n=1, k=1),
        Op(op="gemm", m=2**20, n=2**20, k=7),
        Op(op="copy", bytes=10**12),
        Op(op="all_reduce", bytes=8, ranks=8),
    ]
    learned = np.array([model.predict(o) for o in ops])
    analytical = np.array([base.predict(o) for o in ops])
    assert np.isfinite(learned).all() and (learned > 0).all()
    ratio = learned / analytical
    assert (ratio <= math.exp(model.bound) + 1e-9).all() and (
        ratio >= math.exp(-model.bound) - 1e-9
    ).all()
    # op classes it never saw keep the analytical prediction
    assert ratio[2] == pytest.approx(1.0) and ratio[3] == pytest.approx(1.0)


def test_scalar_equals_vectorised_and_json_round_trip(base, fitted):
    model, frame, *_ = fitted
    ops = ops_frame(
        [Op(op="gemm", m=m, n=2048, k=k) for m, k in [(1, 64), (777, 4096), (8192, 100)]]
    )
    many = model.predict_many(ops, validated=True)
    one = [
        model.predict(Op(op="gemm", m=m, n=2048, k=k))
        for m, k in [(1, 64), (777, 4096), (8192, 100)]
    ]
    np.testing.assert_allclose(many, one, rtol=1e-12)
    again = LearnedCostModel.from_dict(base, json.loads(json.dumps(model.to_dict())))
    np.testing.assert_allclose(again.predict_many(ops, validated=True), many, rtol=1e-12)


def test_feature_set_mismatch_is_refused(base, fitted):
    d = fitted[0].to_dict()
    d["features"] = d["features"][:-1]
    with pytest.raises(ValueError, match="another feature set"):
        LearnedCostModel.from_dict(base, d)


def test_features_and_classes_cover_every_op(base):
    from costmodels.ops.analytical import frame_columns
    from tests.costmodels.test_contract import BASE_OPS

    frame = ops_frame(BASE_OPS)
    cols = frame_columns(frame)
    x = feature_matrix(cols, base.work_columns(cols))
    assert x.shape == (len(BASE_OPS), len(FEATURE_NAMES))
    assert np.isfinite(x).all()
    assert (op_class(cols["op"], cols["dtype"]) != "").all()


def test_feature_op_lists_match_the_op_schema():
    # the learned models' feature order is frozen in shipped profiles, so these stay lists;
    # they must still name exactly the schema's op kinds
    from costmodels.ops.features import COLLECTIVES, ELEMENTWISE
    from workloads.ops import COLLECTIVE_KINDS, ELEMENTWISE_KINDS

    assert set(ELEMENTWISE) == {k.value for k in ELEMENTWISE_KINDS}
    assert set(COLLECTIVES) == {k.value for k in COLLECTIVE_KINDS}


def _two_kernel_family_frame(base, rows, seed, unaligned_effect):
    """Aligned GEMMs slower at small k (2% noise); unaligned ones (odd n) by
    ``unaligned_effect(m, k)`` with 10% noise, like cuBLAS's fallback kernels."""
    rng = np.random.default_rng(seed)
    m, n, k = np.exp(rng.uniform(np.log(64), np.log(16384), (3, rows)))
    aligned = np.arange(rows) % 2 == 0
    m, k = m // 64 * 64 + 64, k // 64 * 64 + 64
    n = np.where(aligned, n // 64 * 64 + 64, n // 2 * 2 + 1)
    frame = ops_frame(
        [Op(op="gemm", m=int(a), n=int(b), k=int(c)) for a, b, c in zip(m, n, k, strict=True)]
    )
    effect = np.where(aligned, 1 + 0.3 * np.exp(-k / 512), unaligned_effect(m, k))
    truth = base.predict_many(frame, validated=True) * effect
    noise = np.where(aligned, 0.02, 0.10) * rng.normal(0, 1, rows)
    frame["measured_s"] = truth * np.exp(noise)
    frame["family"] = [f"fam{i % 16}" for i in range(rows)]
    return frame, truth, aligned


def test_kernel_family_labels():
    from costmodels.ops.analytical import frame_columns
    from costmodels.ops.features import kernel_family

    frame = ops_frame([
        Op(op="gemm", m=5, n=4096, k=4096),
        Op(op="gemm", m=5, n=4095, k=4096),  # n rows of 8190 bytes: 2-byte aligned
        Op(op="gemm", m=5, n=4096, k=4100, dtype="fp32"),  # k rows of 16400 bytes
        Op(op="gemm", m=5, n=4096, k=4100),  # k rows of 8200 bytes: 8-byte aligned
        Op(op="copy", bytes=1024),
    ])  # fmt: skip
    assert list(kernel_family(frame_columns(frame))) == [
        "aligned", "unaligned", "aligned", "unaligned", ""
    ]  # fmt: skip


def test_correction_per_kernel_family_when_one_family_swamps_the_other(base):
    # the unaligned kernels' large, shape-dependent residuals take the capacity of one
    # shared correction; fitted apart, the aligned family's own effect is learned
    def unaligned_effect(m, k):
        return 1.5 * np.exp(0.5 * np.sin(2 * np.log2(m)) + 0.5 * np.cos(1.5 * np.log2(k)))

    frame, _, _ = _two_kernel_family_frame(base, 600, 0, unaligned_effect)
    model = LearnedCostModel(base).fit(frame)
    assert {"gemm_half/aligned", "gemm_half/unaligned"} <= set(model.residuals_)
    assert "gemm_half" not in model.residuals_
    scores = model.selection_["gemm_half"]
    assert scores["per_kernel_family"] < min(v for f, v in scores.items() if f in FAMILIES)

    one = LearnedCostModel(base)
    one._split_by_kernel_family = lambda *a: (float("nan"), {})  # one correction, to compare
    one.fit(frame)
    test, truth, aligned = _two_kernel_family_frame(base, 400, 1, unaligned_effect)
    ops = test.drop(columns=["measured_s", "family"])
    pred = model.predict_many(ops)
    assert mape(truth[aligned], pred[aligned]) < 0.7 * mape(
        truth[aligned], one.predict_many(ops)[aligned]
    )
    again = LearnedCostModel.from_dict(base, json.loads(json.dumps(model.to_dict())))
    np.testing.assert_allclose(again.predict_many(ops), pred, rtol=1e-12)


def test_one_correction_when_a_split_gains_nothing(base):
    frame, _, _ = _two_kernel_family_frame(base, 600, 0, lambda m, k: np.full_like(m, 1.5))
    model = LearnedCostModel(base).fit(frame)
    assert "gemm_half" in model.residuals_
    assert not [k for k in model.residuals_ if "/" in k]
    assert "per_kernel_family" in model.selection_["gemm_half"]  # considered, not taken
