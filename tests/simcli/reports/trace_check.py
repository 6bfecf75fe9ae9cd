"""Validate Chrome/Perfetto trace JSON (the Trace Event Format's required fields)."""

from __future__ import annotations

import json
from pathlib import Path

REQUIRED = {
    "X": ("name", "ph", "ts", "dur", "pid", "tid"),
    "B": ("name", "ph", "ts", "pid", "tid"),
    "E": ("ph", "ts", "pid", "tid"),
    "i": ("name", "ph", "ts", "pid"),
    "C": ("name", "ph", "ts", "pid", "args"),
    "M": ("name", "ph", "pid", "args"),
    "b": ("name", "ph", "ts", "pid", "id", "cat"),
    "e": ("name", "ph", "ts", "pid", "id", "cat"),
}


def load_trace(path: Path) -> list[dict]:
    """Parse ``path`` and check every event; returns the events."""
    doc = json.loads(Path(path).read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert isinstance(events, list) and events, "no trace events"
    for ev in events:
        ph = ev.get("ph")
        assert ph in REQUIRED, f"unknown phase {ph!r} in {ev}"
        missing = [k for k in REQUIRED[ph] if k not in ev]
        assert not missing, f"event {ev} lacks {missing}"
        if "ts" in ev:
            assert isinstance(ev["ts"], int | float) and ev["ts"] >= 0, ev
        if ph == "X":
            assert ev["dur"] >= 0, ev
        if ph == "M":
            assert ev["name"] in ("process_name", "thread_name", "process_sort_index",
                                  "thread_sort_index"), ev  # fmt: skip
    return events


def check_no_overlap(events: list[dict]) -> None:
    """Complete events on one (pid, tid) never overlap: a track does one thing at a time."""
    tracks: dict[tuple, list[tuple[float, float]]] = {}
    for ev in events:
        if ev["ph"] == "X":
            tracks.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
    for key, spans in tracks.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 1e-3, f"overlapping spans on track {key}"
