"""Learned corrections on top of the analytical model (scikit-learn fit/predict contract).

Per op class, a regressor predicts the log-ratio log(measured / analytical) from
:mod:`costmodels.ops.features`, clipped to +-``bound``: predictions stay within a bounded
factor of the physics and are never negative or non-finite, so they extrapolate sanely
outside the calibrated range. Fitted regressors are exported to plain arrays (tree
nodes or linear coefficients) and evaluated with numpy, so a shipped profile loads
with any scikit-learn version, or none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from costmodels.ops.analytical import AnalyticalCostModel, frame_columns, op_columns
from costmodels.ops.columns import sparse_gemm_rows
from costmodels.ops.common import CHUNK_ROWS, NotFittedError, Work, distinct, in_chunks
from costmodels.ops.features import (
    FEATURE_NAMES,
    Features,
    feature_matrix,
    kernel_family,
    op_class,
)
from workloads.ops import Op, normalise_frame

if TYPE_CHECKING:
    import pandas as pd

FAMILIES = ("none", "linear", "shallow", "trees")
# trees with more inner nodes than this are walked node by node (TreeEnsemble.predict)
_MAX_TABLE_BITS = 16
# inputs shorter than this are walked too: building the tables would cost more
_TABLE_MIN_ROWS = 256


def _depth(lefts: list[np.ndarray], rights: list[np.ndarray]) -> int:
    """Deepest root-to-leaf path over all trees."""
    best = 0
    for left, right in zip(lefts, rights, strict=True):
        level = np.zeros(len(left), dtype=np.int64)
        for node in range(len(left)):  # sklearn numbers children after their parent
            if left[node] >= 0:
                level[left[node]] = level[right[node]] = level[node] + 1
        best = max(best, int(level.max()))
    return best


@dataclass(frozen=True)
class TreeEnsemble:
    """Gradient-boosted regression trees as arrays: init + lr * sum(tree leaves)."""

    init: float
    learning_rate: float
    left: list[np.ndarray]
    right: list[np.ndarray]
    feature: list[np.ndarray]
    threshold: list[np.ndarray]
    value: list[np.ndarray]

    @classmethod
    def from_sklearn(cls, est: Any) -> TreeEnsemble:
        trees = [e.tree_ for e in est.estimators_[:, 0]]
        return cls(
            init=float(np.ravel(est.init_.constant_)[0]),
            learning_rate=float(est.learning_rate),
            left=[t.children_left.copy() for t in trees],
            right=[t.children_right.copy() for t in trees],
            feature=[t.feature.copy() for t in trees],
            threshold=[t.threshold.copy() for t in trees],
            value=[t.value[:, 0, 0].copy() for t in trees],
        )

    def _padded(self) -> tuple[np.ndarray, ...]:
        """All trees as (trees x nodes) arrays; leaves point to themselves."""
        if not hasattr(self, "_pad"):
            t, width = len(self.left), max(len(lf) for lf in self.left)
            left = np.tile(np.arange(width), (t, 1))
            right, feat = left.copy(), np.zeros((t, width), dtype=np.int64)
            thr, val = np.zeros((t, width)), np.zeros((t, width))
            for i, (lf, r, f, th, v) in enumerate(
                zip(self.left, self.right, self.feature, self.threshold, self.value, strict=True)
            ):
                n = len(lf)
                inner = lf >= 0
                left[i, :n] = np.where(inner, lf, np.arange(n))
                right[i, :n] = np.where(inner, r, np.arange(n))
                feat[i, :n] = np.where(inner, f, 0)
                thr[i, :n], val[i, :n] = th, v
            depth = _depth(self.left, self.right)
            object.__setattr__(self, "_pad", (left, right, feat, thr, val, depth))
        return self._pad

    def _tables(self) -> list[tuple[list[int], list[float], np.ndarray]] | None:
        """Per tree: the features and thresholds of its J inner nodes and a table of
        2**J leaf terms (``learning_rate * value``), indexed by the J comparisons
        ``x[feature] <= threshold`` as bits (the first inner node the highest); None when a
        tree is too deep for a table."""
        if not hasattr(self, "_tab"):
            tables: list[tuple[list[int], list[float], np.ndarray]] | None = []
            for lf, r, f, th, v in zip(
                self.left, self.right, self.feature, self.threshold, self.value, strict=True
            ):
                inner = [int(i) for i in np.flatnonzero(lf >= 0)]
                bits = len(inner)
                if bits > _MAX_TABLE_BITS:
                    tables = None
                    break
                shift = np.zeros(len(lf), dtype=np.int64)  # each inner node's bit
                shift[inner] = bits - 1 - np.arange(bits)
                patterns = np.arange(1 << bits)
                node = np.zeros(len(patterns), dtype=np.int64)
                while (lf[node] >= 0).any():  # walk every pattern to its leaf
                    go_left = (patterns >> shift[node]) & 1
                    node = np.where(lf[node] < 0, node, np.where(go_left == 1, lf[node], r[node]))
                table = self.learning_rate * v[node]
                tables.append(([int(f[i]) for i in inner], [float(th[i]) for i in inner], table))
            object.__setattr__(self, "_tab", tables)
        return self._tab

    def predict_features(self, features: Any, rows: int) -> np.ndarray:
        """:meth:`predict` bit for bit, reading feature columns ``features(i)`` (a
        :class:`~costmodels.ops.features.Features`) instead of a matrix: only the features
        the trees split on are built, and each tree costs one comparison per inner node
        plus one table lookup instead of a walk of gathers per level."""
        tables = self._tables() if rows >= _TABLE_MIN_ROWS else None
        if tables is None:  # few rows (one op, one step): the matrix is cheap
            x = np.column_stack([features(i) for i in range(len(FEATURE_NAMES))])
            return self.predict(x)
        out = np.full(rows, self.init)
        wide = max((len(f) for f, _, _ in tables), default=0) > 8
        idx = np.empty(rows, dtype=np.uint16 if wide else np.uint8)
        bit = np.empty(rows, dtype=bool)
        term = np.empty(rows)
        for feats, ths, table in tables:
            idx.fill(0)
            for f, th in zip(feats, ths, strict=True):  # idx = 2 idx + (x[f] <= th)
                np.less_equal(features(f), th, out=bit)
                np.multiply(idx, 2, out=idx)
                np.add(idx, bit, out=idx, casting="unsafe")
            np.take(table, idx, out=term)
            out += term
        return out

    def predict(self, x: np.ndarray) -> np.ndarray:
        left, right, feat, thr, val, depth = self._padded()
        rows = len(x)
        flat = np.ascontiguousarray(x.T).ravel()  # feature-major: one gather per level
        idx = np.arange(rows)
        out = np.full(rows, self.init)
        for t in range(left.shape[0]):
            lf, r, f, th = left[t], right[t], feat[t], thr[t]
            node = np.zeros(rows, dtype=np.int64)
            for _ in range(depth):
                node = np.where(flat[f[node] * rows + idx] <= th[node], lf[node], r[node])
            out += self.learning_rate * val[t][node]
        return out

    def to_dict(self) -> dict[str, Any]:
        arrays = zip(self.left, self.right, self.feature, self.threshold, self.value, strict=True)
        keys = ("left", "right", "feature", "threshold", "value")
        return {
            "init": self.init,
            "learning_rate": self.learning_rate,
            "trees": [{k: a.tolist() for k, a in zip(keys, tree, strict=True)} for tree in arrays],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TreeEnsemble:
        trees = d["trees"]
        return cls(
            init=float(d["init"]),
            learning_rate=float(d["learning_rate"]),
            left=[np.asarray(t["left"], dtype=np.int64) for t in trees],
            right=[np.asarray(t["right"], dtype=np.int64) for t in trees],
            feature=[np.asarray(t["feature"], dtype=np.int64) for t in trees],
            threshold=[np.asarray(t["threshold"], dtype=float) for t in trees],
            value=[np.asarray(t["value"], dtype=float) for t in trees],
        )


@dataclass(frozen=True)
class Residual:
    """One op class's correction: family, its arrays, and the clip bound."""

    family: str
    bound: float
    linear: tuple[np.ndarray, float, np.ndarray, np.ndarray] | None = None  # coef, b, mean, scale
    trees: TreeEnsemble | None = None

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.family == "linear" and self.linear is not None:
            coef, intercept, mean, scale = self.linear
            raw = ((x - mean) / scale) @ coef + intercept
        elif self.family == "trees" and self.trees is not None:
            raw = self.trees.predict(x)
        else:
            raw = np.zeros(len(x))
        return np.clip(raw, -self.bound, self.bound)

    def predict_features(self, features: Features, rows: int) -> np.ndarray:
        """:meth:`predict` of the feature matrix, from lazily built feature columns."""
        if self.family == "trees" and self.trees is not None:
            raw = self.trees.predict_features(features, rows)
            return np.clip(raw, -self.bound, self.bound)
        if self.family == "linear" and self.linear is not None:
            x = np.column_stack([features(i) for i in range(len(FEATURE_NAMES))])
            return self.predict(x)
        return np.clip(np.zeros(rows), -self.bound, self.bound)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"family": self.family, "bound": self.bound}
        if self.linear is not None:
            coef, intercept, mean, scale = self.linear
            d["linear"] = {"coef": coef.tolist(), "intercept": intercept, "mean": mean.tolist(),
                           "scale": scale.tolist()}  # fmt: skip
        if self.trees is not None:
            d["trees"] = self.trees.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Residual:
        lin = d.get("linear")
        return cls(
            family=d["family"],
            bound=float(d["bound"]),
            linear=(
                np.asarray(lin["coef"], dtype=float), float(lin["intercept"]),
                np.asarray(lin["mean"], dtype=float), np.asarray(lin["scale"], dtype=float),
            ) if lin else None,
            trees=TreeEnsemble.from_dict(d["trees"]) if d.get("trees") else None,
        )  # fmt: skip


def _fit_family(family: str, x: np.ndarray, y: np.ndarray, bound: float, seed: int) -> Residual:
    if family == "linear":
        from sklearn.linear_model import Ridge

        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale = np.where(scale > 0, scale, 1.0)
        reg = Ridge(alpha=1.0).fit((x - mean) / scale, y)
        return Residual(
            "linear", bound, linear=(reg.coef_.copy(), float(reg.intercept_), mean, scale)
        )
    if family == "shallow":  # few, shallow trees: smooth corrections that travel across families
        from sklearn.ensemble import GradientBoostingRegressor

        reg = GradientBoostingRegressor(
            loss="huber",
            n_estimators=60,
            max_depth=2,
            learning_rate=0.1,
            subsample=0.8,
            min_samples_leaf=10,
            random_state=seed,
        ).fit(x, y)
        return Residual("trees", bound, trees=TreeEnsemble.from_sklearn(reg))
    if family == "trees":
        from sklearn.ensemble import GradientBoostingRegressor

        reg = GradientBoostingRegressor(
            loss="huber", n_estimators=100, max_depth=3, learning_rate=0.1, subsample=0.8,
            min_samples_leaf=5, random_state=seed,
        ).fit(x, y)  # fmt: skip
        return Residual("trees", bound, trees=TreeEnsemble.from_sklearn(reg))
    return Residual("none", bound)


def mape(measured: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured) * 100.0)


class LearnedCostModel:
    """Analytical model x exp(learned log-ratio), one correction per op class (or per
    kernel family within a class, where grouped CV shows the split predicts better).

    ``fit(frame)`` takes an ops frame with a ``measured_s`` column (and optionally
    ``family`` for grouped model selection) and returns self; fitted state lives in
    ``residuals_`` and ``selection_``.
    """

    def __init__(
        self,
        base: AnalyticalCostModel,
        *,
        families: tuple[str, ...] = FAMILIES,
        bound: float = math.log(2.0),
        folds: int = 4,
        seed: int = 0,
    ):
        self.base = base
        self.families = families
        self.bound = bound
        self.folds = folds
        self.seed = seed

    @property
    def system(self):
        return self.base.system

    @property
    def gpu(self):
        return self.base.gpu

    @property
    def power(self):
        return self.base.power

    @property
    def label(self) -> str:
        return self.base.label

    # --- fitting -----------------------------------------------------------------------
    def fit(self, frame: pd.DataFrame) -> LearnedCostModel:
        if "measured_s" not in frame.columns:
            raise ValueError("fit needs a 'measured_s' column of measured seconds")
        measured = frame["measured_s"].to_numpy(dtype=float)
        if not np.all(np.isfinite(measured) & (measured > 0)):
            raise ValueError("measured_s must be finite and positive")
        groups = frame["family"].astype(str).to_numpy() if "family" in frame.columns else None
        ops = normalise_frame(frame.drop(columns=[c for c in frame.columns if c not in _OP_COLS]))
        cols = frame_columns(ops)
        work = self.base.work_columns(cols)
        x = feature_matrix(cols, work)
        y = np.log(measured / work.time_s)
        classes = op_class(cols["op"], cols["dtype"], cols["backend"])
        kinds = kernel_family(cols)
        self.residuals_: dict[str, Residual] = {}
        self.selection_: dict[str, dict[str, float]] = {}
        for cls in np.unique(classes):
            mask = classes == cls
            grp = groups[mask] if groups is not None else np.arange(mask.sum()) % self.folds
            family, scores, err = self._cv(x[mask], y[mask], grp)
            split_score, parts = self._split_by_kernel_family(
                x[mask], y[mask], grp, kinds[mask], err
            )
            if np.isfinite(split_score):
                scores = {**scores, "per_kernel_family": split_score}
            if parts:
                self.selection_[str(cls)] = scores
                for kind, (sub, fam, sc) in parts.items():
                    self.selection_[f"{cls}/{kind}"] = sc
                    self.residuals_[f"{cls}/{kind}"] = _fit_family(
                        fam, x[mask][sub], y[mask][sub], self.bound, self.seed
                    )
                continue
            self.selection_[str(cls)] = scores
            self.residuals_[str(cls)] = _fit_family(family, x[mask], y[mask], self.bound, self.seed)
        return self

    def _split_by_kernel_family(
        self,
        x: np.ndarray,
        y: np.ndarray,
        groups: np.ndarray,
        kinds: np.ndarray,
        err_one: np.ndarray,
    ) -> tuple[float, dict[str, Any]]:
        """(CV MAPE of one correction per kernel family, those corrections if taken).

        The split is taken only if it beats the class's one correction by more than one
        standard error of the per-group mean difference in CV error (the one-standard-
        error rule, Hastie et al., ESL sec. 7.10): with few shape families, a split that
        wins by noise is refused. NaN and nothing when the class has one family.
        """
        if len(np.unique(kinds)) < 2:
            return float("nan"), {}
        err_split = np.zeros(len(y))
        parts: dict[str, Any] = {}
        for kind in np.unique(kinds):
            sub = kinds == kind
            fam, sc, err = self._cv(x[sub], y[sub], groups[sub])
            if not np.isfinite(sc[fam]):
                return float("nan"), {}
            err_split[sub] = err
            parts[str(kind)] = (sub, fam, sc)
        score = float(np.mean(err_split) * 100.0)
        uniq, inverse = np.unique(groups, return_inverse=True)
        gain = np.bincount(inverse, err_one - err_split) / np.bincount(inverse)
        if len(uniq) < 2 or gain.mean() <= gain.std(ddof=1) / np.sqrt(len(uniq)):
            return score, {}
        return score, parts

    def _cv(
        self, x: np.ndarray, y: np.ndarray, groups: np.ndarray
    ) -> tuple[str, dict[str, float], np.ndarray]:
        """Grouped CV (groups never straddle folds): (the family with the lowest MAPE,
        MAPE per family, that family's CV error of every row)."""
        uniq = np.unique(groups)
        if len(uniq) < 2 or len(y) < 20:
            return "none", {"none": float("nan")}, np.abs(np.exp(-y) - 1.0)
        rng = np.random.default_rng(self.seed)
        fold_of = dict(
            zip(uniq, rng.permutation(len(uniq)) % min(self.folds, len(uniq)), strict=True)
        )
        fold = np.array([fold_of[g] for g in groups])
        scores, errors = {}, {}
        for family in self.families:
            err = np.zeros(len(y))
            for f in np.unique(fold):
                tr, te = fold != f, fold == f
                res = _fit_family(family, x[tr], y[tr], self.bound, self.seed)
                # |predicted / measured - 1| with predicted = analytical * exp(r), y = log(m / a)
                err[te] = np.abs(np.exp(res.predict(x[te]) - y[te]) - 1.0)
            scores[family], errors[family] = float(np.mean(err) * 100.0), err
        best = min(scores, key=scores.get)
        return best, scores, errors[best]

    # --- prediction --------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "residuals_"):
            raise NotFittedError("LearnedCostModel is not fitted: call fit() or load a profile")

    def _correction_keys(self, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Each row's correction: its op class's, or its kernel family's within the class
        when the fit split that class (kernel families are worked out for those rows only)."""
        # not cols.get: _Rows slices a column in __missing__, which dict.get skips
        backend = cols["backend"] if "backend" in cols else None  # noqa: SIM401
        keys = op_class(cols["op"], cols["dtype"], backend)
        split = sorted({k.rsplit("/", 1)[0] for k in self.residuals_ if "/" in k})
        rows = np.flatnonzero(np.isin(keys, split)) if split else ()
        if len(rows):
            sub = {k: cols[k][rows] for k in ("op", "dtype", "k", "n", "backend") if k in cols}
            own = keys[rows] + "/" + kernel_family(sub)
            keys[rows] = np.where(np.isin(own, list(self.residuals_)), own, keys[rows])
        return keys

    def _correction_groups(self, cols: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """(residual key, rows) of every row group a fitted correction (not ``none``) applies
        to: :meth:`_correction_keys` computed on the distinct (op, dtype) pairs and kernel
        families, not row by row."""
        op_codes, ops = distinct(cols["op"])
        dt_codes, dtypes = distinct(cols["dtype"])
        be_codes, backends = distinct(cols["backend"]) if "backend" in cols else (0, np.array([""]))
        pair = (op_codes.astype(np.int64) * len(dtypes) + dt_codes) * len(backends) + be_codes
        pair_codes, pairs = distinct(pair)
        op_dt, be = pairs // len(backends), pairs % len(backends)
        names = op_class(
            ops[op_dt // len(dtypes)].astype(str),
            dtypes[op_dt % len(dtypes)].astype(str),
            backends[be].astype(str),
        )
        cls_codes, classes = distinct(names)
        cls_of_row = cls_codes[pair_codes]
        split = {k.rsplit("/", 1)[0] for k in self.residuals_ if "/" in k}
        groups: list[tuple[str, np.ndarray]] = []
        order = np.argsort(cls_of_row, kind="stable")
        bounds = np.searchsorted(cls_of_row[order], np.arange(len(classes) + 1))
        for c, cls in enumerate(classes.tolist()):
            rows = order[bounds[c] : bounds[c + 1]]
            if not len(rows):
                continue
            if cls not in split:
                groups.append((cls, rows))
                continue
            sub = {k: cols[k][rows] for k in ("op", "dtype", "k", "n", "backend") if k in cols}
            fam_codes, fams = distinct(kernel_family(sub))
            for f, fam in enumerate(fams.tolist()):
                own = f"{cls}/{fam}"
                groups.append((own if own in self.residuals_ else cls, rows[fam_codes == f]))
        return [
            (key, rows)
            for key, rows in groups
            if key in self.residuals_ and self.residuals_[key].family != "none"
        ]

    def work_columns(self, cols: dict[str, np.ndarray]) -> Work:
        """Corrected time; FLOPs and bytes are the analytical model's. Large inputs are
        priced :data:`~costmodels.ops.common.CHUNK_ROWS` rows at a time (the same values:
        every row is priced on its own)."""
        self._check_fitted()
        rows = len(cols["op"])
        if rows > CHUNK_ROWS:
            return in_chunks(self.work_columns, cols)
        work = self.base.work_columns(cols)
        log_ratio = np.zeros(rows)
        for key, idx in self._correction_groups(cols):
            sub_cols = _Rows(cols, idx)
            sub_work = Work(work.time_s[idx], work.flops[idx], work.bytes[idx])
            log_ratio[idx] = self.residuals_[key].predict_features(
                Features(sub_cols, sub_work), len(idx)
            )
        # sparse GEMMs: their own fitted model; the dense-GEMM correction does not apply
        log_ratio[sparse_gemm_rows(cols)] = 0.0
        return Work(time_s=work.time_s * np.exp(log_ratio), flops=work.flops, bytes=work.bytes)

    def work_columns_reference(self, cols: dict[str, np.ndarray]) -> Work:
        """:meth:`work_columns` as it was first written (the whole feature matrix, trees
        walked level by level, one pass over all rows); kept to test the fast path
        against (tests/costmodels/ops/test_learned_fast_path.py)."""
        self._check_fitted()
        work = self.base.work_columns(cols)
        classes = self._correction_keys(cols)
        log_ratio = np.zeros(len(classes))
        active = [(c, r) for c, r in self.residuals_.items() if r.family != "none"]
        corrected = np.isin(classes, [c for c, _ in active])
        if corrected.any():  # features only for rows some correction will read
            idx = np.flatnonzero(corrected)
            sub_cols = {k: v[idx] for k, v in cols.items()}
            sub_work = Work(work.time_s[idx], work.flops[idx], work.bytes[idx])
            x = feature_matrix(sub_cols, sub_work)
            for cls, res in active:
                mask = classes[idx] == cls
                if mask.any():
                    log_ratio[idx[mask]] = res.predict(x[mask])
        return Work(time_s=work.time_s * np.exp(log_ratio), flops=work.flops, bytes=work.bytes)

    def predict_columns(self, cols: dict[str, np.ndarray]) -> np.ndarray:
        return self.work_columns(cols).time_s

    def work_many(self, frame: pd.DataFrame, *, validated: bool = False) -> Work:
        if not validated:
            frame = normalise_frame(frame)
        return self.work_columns(frame_columns(frame))

    def predict_many(self, frame: pd.DataFrame, *, validated: bool = False) -> np.ndarray:
        return self.work_many(frame, validated=validated).time_s

    def work(self, op: Op) -> Work:
        return self.work_columns(op_columns(op))

    def predict(self, op: Op) -> float:
        return float(self.work(op).time_s[0])

    # --- persistence -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        self._check_fitted()
        return {
            "features": FEATURE_NAMES,
            "residuals": {k: r.to_dict() for k, r in self.residuals_.items()},
            "selection": self.selection_,
        }

    @classmethod
    def from_dict(cls, base: AnalyticalCostModel, d: dict[str, Any]) -> LearnedCostModel:
        if list(d.get("features", [])) != FEATURE_NAMES:
            raise ValueError("learned model was fitted on another feature set; refit the profile")
        model = cls(base)
        model.residuals_ = {k: Residual.from_dict(v) for k, v in d["residuals"].items()}
        model.selection_ = d.get("selection", {})
        return model


class _Rows(dict):
    """``{name: column[rows]}`` for the columns of ``cols``, each sliced when first read."""

    def __init__(self, cols: dict[str, np.ndarray], rows: np.ndarray) -> None:
        super().__init__()
        self.cols, self.rows = cols, rows

    def __missing__(self, name: str) -> np.ndarray:
        col = self[name] = self.cols[name][self.rows]
        return col

    def __contains__(self, name: object) -> bool:
        return name in self.cols


_OP_COLS = {
    "op", "dtype", "m", "n", "k", "batch", "seq_q", "seq_kv", "heads_q", "heads_kv", "head_dim",
    "causal", "backend", "density", "block_size", "bytes", "ranks", "nodes",
}  # fmt: skip
