"""What a paged serving engine's sequence holds of the KV pool: whole-context layers,
capped (sliding-window, chunked) layers and a hybrid's constant recurrent state
(:class:`KvLayout`; built by :func:`costmodels.steps.sparse.kv_layout` and the step
models' ``kv_layout``)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class KvLayout:
    """What a paged serving engine can hold per sequence under an attention pattern.

    A KV block (``block_size`` tokens of every layer) is split into ``full_units +
    capped_units`` layer groups: ``full_units`` keep every token; ``capped_units`` (sliding
    window layers) free blocks wholly outside the window, so they hold at most
    ``ceil(sinks / bs) + ceil(window / bs) + 1`` blocks (the window's ``window`` newest
    keys straddle one more block than they fill; vLLM's sliding-window manager frees whole
    blocks). ``bytes_factor`` scales the KV bytes a cached token costs (NSA's compressed
    keys: one compressed token per stride ``d`` on the NSA layers, reserved per token).
    """

    full_units: int = 1
    capped_units: int = 0
    window_tokens: int = 0
    sink_tokens: int = 0
    bytes_factor: float = 1.0
    note: str = "every layer keeps the whole context"
    state_tokens: float = 0.0

    @property
    def capped(self) -> bool:
        return self.capped_units > 0

    @property
    def special(self) -> bool:
        """Sequences hold other than a block per ``block_size`` tokens: capped layers, or
        a hybrid's constant recurrent state (``state_tokens``: the KV tokens its memory
        holds, taken once per sequence)."""
        return self.capped or self.state_tokens > 0

    def state_units(self, block_size: int) -> int:
        """Units one sequence's recurrent state takes (0 without mixers)."""
        return math.ceil(self.state_tokens * self.units / block_size) if self.state_tokens else 0

    def cap_blocks(self, block_size: int) -> int:
        """Blocks a capped layer group holds at most (0: no cap)."""
        if not self.capped:
            return 0
        bs = block_size
        return -(-self.sink_tokens // bs) + -(-self.window_tokens // bs) + 1

    def cap_tokens(self, block_size: int) -> int | None:
        """KV tokens per sequence and capped layer, at most (block-rounded); None: no cap."""
        return self.cap_blocks(block_size) * block_size if self.capped else None

    @property
    def units(self) -> int:
        """Layer-group units per KV block (1 without a capped group)."""
        return self.full_units + self.capped_units

    def held_units(self, tokens: int, block_size: int) -> int:
        """Units a sequence of ``tokens`` cached tokens holds at most: every block of the
        full groups, at most :meth:`cap_blocks` of the capped ones."""
        blocks = -(-int(tokens) // block_size)
        state = self.state_units(block_size)
        if not self.capped:
            return self.units * blocks + state
        return self.full_units * blocks + self.capped_units * min(
            blocks, self.cap_blocks(block_size)
        ) + state

    def capacity_units(self, kv_capacity_tokens: int, block_size: int) -> int:
        """Units a KV cache of ``kv_capacity_tokens`` (dense-equivalent tokens) holds."""
        return int(kv_capacity_tokens) // block_size * self.units
