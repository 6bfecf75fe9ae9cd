"""Fits of the sparse kernel models on measured rows (not part of the device runner).

- :mod:`calibrate.sparse.attention`: the tile-table block-sparse attention parameters
  (``costmodels/data/sparse_attention.yaml``) from the FlexAttention ``blocksparse`` rows:
  ``python -m calibrate.sparse.attention [--write]``.
- :mod:`calibrate.sparse.gemm`: the 2:4 and CATS parameters
  (``costmodels/data/sparse_gemm.yaml``) from the ``sparse_gemm`` suite:
  ``python -m calibrate.sparse.gemm fit|eval CSV``.

The models themselves (prediction only) are :mod:`costmodels.ops.sparse_attention` and
:mod:`costmodels.ops.sparse_gemm`.
"""
