"""The one error of the sparsity patterns, and the checks of their arguments."""

from __future__ import annotations

import numpy as np


class SparsityError(ValueError):
    """A bad pattern string, parameter or use of a pattern; the message is one line."""


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def check_use(seq_len: object, heads: object, block_q: object, block_k: object, seed: object):
    for name, value in (
        ("seq_len", seq_len),
        ("heads", heads),
        ("block_q", block_q),
        ("block_k", block_k),
    ):
        if not _is_int(value) or value < 1:  # type: ignore[operator]
            raise SparsityError(f"{name}={value!r} is invalid; allowed: an integer >= 1")
    if not _is_int(seed) or seed < 0:  # type: ignore[operator]
        raise SparsityError(f"seed={seed!r} is invalid; allowed: an integer >= 0")


def check_context(context_len: object) -> int:
    if not _is_int(context_len) or context_len < 1:  # type: ignore[operator]
        raise SparsityError(f"context_len={context_len!r} is invalid; allowed: an integer >= 1")
    return int(context_len)  # type: ignore[arg-type]


def check_layers(num_layers: object) -> None:
    if not _is_int(num_layers) or num_layers < 1:  # type: ignore[operator]
        raise SparsityError(f"num_layers={num_layers!r} is invalid; allowed: an integer >= 1")
