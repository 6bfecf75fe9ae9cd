"""Attention sparsity patterns: exact visited-tile counts and decode KV footprints.

A pattern string (the ``--pattern`` of the sparsity what-ifs) parses with
:func:`parse_pattern` into a frozen pydantic :class:`Pattern`. Every pattern answers:

- :meth:`Pattern.tiles` -- a :class:`TileTable`: for each head and query block, how many
  ``block_q x block_k`` tiles a block-sparse kernel visits, split into *full* tiles (every
  element attends) and *partial* tiles (the kernel masks elements inside: the causal
  diagonal, window edges). Counts are exact and computed in closed form over the
  ``[heads, q_blocks]`` grid (searchsorted on tile extents, modular counts), never from an
  ``N x N`` mask, so 1M tokens x 32 heads takes about a millisecond.
  ``density`` = visited / (heads x q_blocks x k_blocks): the fraction of *all* tiles, the
  definition of the ``density`` column in ``simcli predict`` and in the measured
  FlexAttention data (``calibrate/bench/blocksparse.py``).
- :meth:`Pattern.tile_masks` -- the same tiles as boolean ``[heads, q_blocks, k_blocks]``
  tables (with the seeded random selections of top-k / NSA / SALE / AdaSpa drawn), for
  tests and for building real block masks at moderate sizes. Its row sums equal
  :meth:`Pattern.tiles` exactly, for every seed.
- :meth:`Pattern.kv_cache_tokens` / :meth:`Pattern.decode_read_tokens` -- tokens kept per
  KV head, and read per KV head per decode step, at a context of ``context_len`` tokens.
- :meth:`Pattern.layer_patterns` (hybrid models: which layers are dense) and
  :meth:`Pattern.describe`.

Conventions. Self-attention over ``seq_len`` tokens; query block ``i`` covers rows
``[i*block_q, min((i+1)*block_q, seq_len))`` (the last block may be ragged, any length
works). Causal (key ``k <= q``) is implied for every pattern but ``dense``. A tile is
visited when at least one of its elements attends, *full* when all its in-range elements
do (rows/keys past ``seq_len`` are bounds, not mask). Patterns that select whole blocks
(top-k, S2, NSA selection) have their own block size in tokens (``block``, ``lsel``), which
must be a multiple of the kernel's ``block_k`` (and, for top-k style selection shared by a
query block, of ``block_q``): a tile then lies in one selection block.

Patterns (``PATTERN`` strings; ``,`` and ``:`` both separate parameters):

- ``dense`` -- every tile, non-causal. ``causal`` -- the lower triangle.
- ``window:W[:sinks=S]`` -- causal sliding window of ``W`` keys (``q - k < W``, the query's
  own token included) plus ``S`` attention-sink tokens ``k < S`` always attended
  (StreamingLLM, Xiao et al. 2023, "Efficient Streaming Language Models with Attention
  Sinks"). ``W <= seq_len`` is checked at use.
- ``chunk:C`` -- chunked local attention: a query attends causally within its own chunk of
  ``C`` tokens (``k // C == q // C``), Llama 4's local layers; ``C`` a multiple of the
  tile sizes.
- ``topk:density=D|k=K[,block=B][:per_head]`` -- block-sparse top-k: each query block of
  ``B`` tokens attends ``K`` key blocks of ``B`` tokens among its causal ones, its own
  (diagonal) block always included, so exactly ``min(K, QB + 1)`` blocks for query block
  ``QB``. With ``density=D`` the budget is relative to the causal blocks of that query
  block: ``K = max(1, ceil(D * (QB + 1)))``, so ``density=1`` is ``causal`` (the fraction
  of *all* tiles is then about ``D / 2``: read :attr:`TileTable.density`). The other
  blocks are drawn at random from ``seed``: one selection shared by all heads (what
  FlexAttention calls a head-broadcast block mask; GQA heads then read the same KV
  blocks), or one per head with ``per_head``. Counts do not depend on the draw.
- ``s2:local=L,stride=S[,block=B]`` -- S2-Attention (Lin et al. 2024, "S2-Attention:
  Hardware-Aware Context Sharding Among Attention Heads"): head ``h`` attends the ``L``
  most recent blocks of ``B`` tokens (``k // B > q // B - L``) plus every block
  ``KB`` with ``KB % S == h % S``; with ``heads >= S`` the union of heads covers the context.
- ``nsa[:l=32,d=16,lsel=64,n=16,w=512,local=2]`` -- Native Sparse Attention (Yuan et al.
  2025, "Native Sparse Attention: Hardware-Aligned and Natively Trainable Sparse
  Attention", defaults of its section 4.1): three branches, see :class:`NSAPattern`.
- ``sale:density=D[,est_bits=4,block=B]`` -- SALE (Ji et al. 2025, "SALE: Low-bit
  Estimation for Efficient Sparse Attention in Long-context LLM Prefilling"): an estimation
  pass of ``est_bits``-bit ``Q K^T`` over the causal tiles, then top-k at ``density``.
- ``adaspa:search_every=N,density=D[,spread=0.5,block=B]`` -- AdaSpa (Xia et al. 2025,
  "Training-free and Adaptive Sparse Attention for Efficient Long Video Generation"): one
  step in ``N`` is a dense search step, the others block-sparse with head-adaptive
  densities of mean ``D``. See :class:`AdaSpaPattern`.
- ``hybrid:dense_every=K|dense_fraction=F,inner=PATTERN`` -- LongGen-style hybrid (Ge et
  al. 2024, "A Little Goes a Long Way: Efficient Long Context Training and Inference with
  Partial Contexts": 1/3 full-attention layers, the rest sparse): some layers causal-dense,
  the others ``inner``. ``inner=`` comes last and takes the rest of the string.

Multi-branch patterns list their work in :attr:`TileTable.branches` (see there).

Modules: :mod:`~workloads.sparsity.tables` (the results), :mod:`~workloads.sparsity.grid`
(tile geometry and the closed-form counting rules shared by the patterns),
:mod:`~workloads.sparsity.basic` (the :class:`Pattern` base; dense, causal, window),
:mod:`~workloads.sparsity.topk` (top-k, SALE, AdaSpa), :mod:`~workloads.sparsity.s2`,
:mod:`~workloads.sparsity.nsa`, :mod:`~workloads.sparsity.hybrid` and
:mod:`~workloads.sparsity.parse` (pattern strings).
"""

from workloads.sparsity.basic import (
    CausalPattern,
    ChunkPattern,
    DensePattern,
    Pattern,
    WindowPattern,
)
from workloads.sparsity.errors import SparsityError
from workloads.sparsity.hybrid import AnyPattern, HybridPattern, InnerPattern
from workloads.sparsity.nsa import NSAPattern
from workloads.sparsity.parse import ALLOWED, SYNTAX, parse_pattern
from workloads.sparsity.s2 import S2Pattern
from workloads.sparsity.tables import TileMask, TileTable
from workloads.sparsity.topk import AdaSpaPattern, SALEPattern, TopKPattern

__all__ = [
    "ALLOWED",
    "AdaSpaPattern",
    "AnyPattern",
    "CausalPattern",
    "DensePattern",
    "HybridPattern",
    "InnerPattern",
    "NSAPattern",
    "Pattern",
    "S2Pattern",
    "SALEPattern",
    "SYNTAX",
    "SparsityError",
    "TileMask",
    "TileTable",
    "TopKPattern",
    "WindowPattern",
    "ChunkPattern",
    "parse_pattern",
]
