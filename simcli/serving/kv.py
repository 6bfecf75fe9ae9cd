"""Paged KV-cache block manager with a ref-counted, LRU-evicted prefix cache.

Blocks are counted, not named: the simulator needs how many blocks are in use, not which
(vLLM's PagedAttention, Kwon et al. SOSP 2023, allocates fixed-size blocks on demand, so
fragmentation is at most one partly-filled block per sequence, which counting captures).

Prefix caching (vLLM automatic prefix caching / SGLang RadixAttention, simplified to one
shared prefix per request): the full blocks of a shared prefix form a :class:`PrefixEntry`
keyed by ``(prefix id, blocks)``. The first sequence to need it allocates the entry and
fills it by its prefill; once filled (``ready``) later sequences reuse the blocks, skipping
that part of their prefill. Entries are ref-counted; one nobody uses stays cached but
evictable, and allocation evicts the least recently used such entry when free blocks run
out. A sequence that arrives while the entry is still being filled does not share it (it
prefills its prefix into private blocks), as in vLLM where blocks are only reusable once
computed.
"""

from __future__ import annotations

from collections import OrderedDict


class KVCapacityError(ValueError):
    """More blocks asked for than are available (a scheduler bug or a bad config)."""


class PrefixEntry:
    __slots__ = ("key", "blocks", "refs", "ready")

    def __init__(self, key: tuple[int, int], blocks: int) -> None:
        self.key = key
        self.blocks = blocks
        self.refs = 0
        self.ready = False


class BlockManager:
    """Block accounting for one KV cache (one replica, or one pipeline virtual engine).

    ``used_blocks`` counts every allocated block, cached-but-evictable prefix blocks
    included; ``available_blocks`` (free + evictable) is what an allocation can get;
    ``active_blocks`` (used minus evictable) is what running sequences hold.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise KVCapacityError(f"a KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.used_blocks = 0
        self.evictable_blocks = 0
        self.peak_used_blocks = 0
        self.prefix_hits = 0
        self.prefix_hit_tokens = 0
        self.evictions = 0
        self._entries: dict[tuple[int, int], PrefixEntry] = {}
        self._lru: OrderedDict[tuple[int, int], PrefixEntry] = OrderedDict()

    # --- plain blocks -------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.num_blocks - self.used_blocks

    @property
    def available_blocks(self) -> int:
        return self.num_blocks - self.used_blocks + self.evictable_blocks

    @property
    def active_blocks(self) -> int:
        return self.used_blocks - self.evictable_blocks

    def allocate(self, n: int) -> None:
        """Take ``n`` blocks, evicting least-recently-used cached prefixes if needed."""
        if n <= 0:
            return
        if n > self.num_blocks - self.used_blocks:
            self._evict(n)
        self.used_blocks += n
        if self.used_blocks > self.peak_used_blocks:
            self.peak_used_blocks = self.used_blocks

    def release(self, n: int) -> None:
        self.used_blocks -= n
        if self.used_blocks < self.evictable_blocks:
            raise KVCapacityError(f"released more KV blocks than allocated ({n})")

    def _evict(self, n: int) -> None:
        lru = self._lru
        while n > self.num_blocks - self.used_blocks:
            if not lru:
                raise KVCapacityError(
                    f"asked for {n} KV blocks with {self.available_blocks} available "
                    f"of {self.num_blocks}"
                )
            key, entry = lru.popitem(last=False)
            del self._entries[key]
            self.used_blocks -= entry.blocks
            self.evictable_blocks -= entry.blocks
            self.evictions += 1

    # --- prefix cache -------------------------------------------------------------------
    def lookup(self, key: tuple[int, int]) -> PrefixEntry | None:
        """The entry for ``key`` if it exists (ready or still being filled)."""
        return self._entries.get(key)

    def has_ready(self, key: tuple[int, int]) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.ready

    def acquire_cost(self, entry: PrefixEntry) -> int:
        """Blocks an acquire takes from ``available_blocks`` (an unused entry stops being
        evictable)."""
        return entry.blocks if entry.refs == 0 else 0

    def acquire(self, entry: PrefixEntry) -> None:
        if entry.refs == 0:
            del self._lru[entry.key]
            self.evictable_blocks -= entry.blocks
        entry.refs += 1
        self.prefix_hits += 1
        self.prefix_hit_tokens += entry.blocks * self.block_size

    def create(self, key: tuple[int, int], blocks: int) -> PrefixEntry:
        """A new entry (allocated, not ready, held once by its creator)."""
        self.allocate(blocks)
        entry = PrefixEntry(key, blocks)
        entry.refs = 1
        self._entries[key] = entry
        return entry

    def release_entry(self, entry: PrefixEntry) -> None:
        entry.refs -= 1
        if entry.refs:
            return
        if entry.ready:
            self._lru[entry.key] = entry
            self.evictable_blocks += entry.blocks
        else:  # its filler left before finishing: nothing reusable in it
            del self._entries[entry.key]
            self.used_blocks -= entry.blocks

    def touch(self, entry: PrefixEntry) -> None:
        """Mark a filled entry reusable."""
        entry.ready = True

    def check(self) -> None:
        """Invariants (tests call this)."""
        assert 0 <= self.evictable_blocks <= self.used_blocks <= self.num_blocks, (
            self.evictable_blocks,
            self.used_blocks,
            self.num_blocks,
        )
        assert self.evictable_blocks == sum(e.blocks for e in self._lru.values())


__all__ = ["BlockManager", "KVCapacityError", "PrefixEntry"]
