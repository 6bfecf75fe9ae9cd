"""The one error type of sweeps (its own module, so reading a store imports no scenario)."""

from __future__ import annotations


class SweepError(ValueError):
    """A bad sweep spec or store: one line naming the field, the value, what is allowed."""


__all__ = ["SweepError"]
