"""Requests, their sequences, and the arrival streams that create them.

A :class:`Request` is what a user sends (arrival time, prompt, wanted output); the work a
replica schedules is a :class:`Sequence`. Plain serving has one sequence per request, but
the model keeps them apart so a request can own several: the request completes when
``seqs_left`` of them have finished (:meth:`Request.sequence_finished`) -- all of them, or
the first M of N branches (:mod:`simcli.serving.branches`, whose state is
``Request.branch``).

Arrival streams are generators that draw in fixed-size chunks, so memory stays flat however
many requests are simulated and the draw for a given ``seed`` does not depend on how far
the simulation has read:

- :func:`synthetic_requests`: Poisson arrivals (``burstiness`` = coefficient of variation
  of the inter-arrival gaps = 1) or gamma arrivals (bursty for CV > 1, smoother for CV < 1;
  shape ``1 / CV**2``, mean gap ``1 / qps``), lengths from :func:`workloads.lengths.parse_dist`
  distributions or resampled from a trace's rows (the empirical joint distribution).
- :func:`trace_requests`: replay of a CSV trace ``arrival_s, prompt_tokens, output_tokens``
  (optional ``prefix_id, prefix_tokens``), read line by line.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from workloads.lengths import DatasetLengths, LengthDist


class TraceError(ValueError):
    """A malformed request trace; the message is one line naming the file and line."""


def output_within_model_len(prompt_tokens: int, output_tokens: int, limit: int | None) -> int:
    """Output tokens a request gets under a max model length ``limit``, as vLLM serves
    it: a prompt longer than the limit is refused (0: not served; vLLM's input
    processor raises), a longer request stops when prompt + generated reaches the limit
    (``FINISHED_LENGTH_CAPPED``), after at least the one token its prefill samples (a
    prompt of exactly ``limit`` tokens gets one). ``limit`` None: no limit."""
    if limit is None or prompt_tokens + output_tokens <= limit:
        return output_tokens
    if prompt_tokens > limit:
        return 0
    return max(1, limit - prompt_tokens)


def outputs_within_model_len(
    prompt_tokens: np.ndarray, output_tokens: np.ndarray, limit: int | None
) -> np.ndarray:
    """:func:`output_within_model_len` of many requests at once (the same rule)."""
    if limit is None:
        return output_tokens
    cut = np.where(prompt_tokens > limit, 0, np.maximum(1, limit - prompt_tokens))
    return np.where(prompt_tokens + output_tokens <= limit, output_tokens, cut)


# Sequence states
WAITING = 0  # queued for (re)prefill, holds no KV blocks
PREFILLING = 1  # admitted, KV blocks held, prompt partly in the cache (chunked prefill)
DECODING = 2  # in a replica's decode batch
SWAPPED = 3  # preempted by swapping: its KV blocks are in host memory
FINISHED = 4
SENDING = 5  # disaggregation: prefilled, its KV still on the prefill replica (queued or in flight)
ARRIVED = 6  # disaggregation: its KV transferred into blocks reserved on a decode replica
CANCELLED = 7  # multi-branch: pruned, or cut when enough sibling branches finished


class Request:
    """One user request. Times are simulated seconds; ``None`` until they happen."""

    __slots__ = (
        "id",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "prefix_key",
        "prefix_tokens",
        "first_token_s",
        "finish_s",
        "seqs",
        "seqs_left",
        "replica",
        "preemptions",
        "branch",
        "priority",
        "frontend_in_s",
        "frontend_out_s",
    )

    def __init__(
        self,
        rid: int,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        prefix_key: int | None = None,
        prefix_tokens: int = 0,
        num_seqs: int = 1,
        priority: int = 0,
    ) -> None:
        self.id = rid
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.prefix_key = prefix_key
        self.prefix_tokens = prefix_tokens
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.seqs = [Sequence(self, prompt_tokens, output_tokens) for _ in range(num_seqs)]
        self.seqs_left = num_seqs
        self.replica = -1
        self.preemptions = 0
        self.branch = None  # multi-branch state (simcli.serving.branches.BranchState)
        self.priority = priority  # scheduling class, lower first (vLLM's priority)
        # the API server's time before the engine saw it and after each token left it
        # (simcli.serving.frontend); the metrics report latency as the client sees it
        self.frontend_in_s = 0.0
        self.frontend_out_s = 0.0

    def with_output(self, output_tokens: int) -> Request:
        """This request (not yet simulated) asking for ``output_tokens`` instead."""
        req = Request(
            self.id, self.arrival_s, self.prompt_tokens, output_tokens, self.prefix_key,
            self.prefix_tokens, priority=self.priority,
        )  # fmt: skip
        req.frontend_in_s, req.frontend_out_s = self.frontend_in_s, self.frontend_out_s
        return req

    @property
    def generated_tokens(self) -> int:
        """Tokens produced by all its sequences (cancelled branches included)."""
        return sum(s.generated for s in self.seqs)

    @property
    def finished_tokens(self) -> int:
        """Tokens of the sequences that finished (not those cancelled)."""
        return sum(s.generated for s in self.seqs if s.state == FINISHED)

    @property
    def cancelled_tokens(self) -> int:
        return sum(s.generated for s in self.seqs if s.state == CANCELLED)

    def token_emitted(self, now_s: float) -> None:
        """A sequence of this request produced a token (the first one sets TTFT)."""
        if self.first_token_s is None:
            self.first_token_s = now_s

    def sequence_finished(self, now_s: float) -> bool:
        """One sequence finished; True when that completes the request (``seqs_left``
        starts at the number of sequences, or at the branches to wait for)."""
        self.seqs_left -= 1
        if self.seqs_left == 0:
            self.finish_s = now_s
            return True
        return False


class Sequence:
    """One generation stream of a request: the unit a replica batches and holds KV for.

    ``prefill_target`` tokens must be in the KV cache before the next token can be
    produced: the prompt at first, prompt plus generated tokens after a recompute
    preemption. While the sequence is in a replica's decode batch its context and
    generated counts advance in lockstep with the batch (see ``batch.DecodeBatch``);
    ``ctx_tokens``/``generated`` are then refreshed when it leaves the batch.
    """

    __slots__ = (
        "request",
        "prompt_tokens",
        "output_tokens",
        "generated",
        "ctx_tokens",
        "prefill_target",
        "prefilled",
        "private_blocks",
        "shared_blocks",
        "prefix_entry",
        "owns_prefix",
        "state",
        "last_token_s",
        "slot",
        "join_dit",
        "res_key",
        "finish_dit",
        "order",
        "fork",
        "score",
        "seats",
        "admitted",
    )

    def __init__(self, request: Request, prompt_tokens: int, output_tokens: int) -> None:
        self.request = request
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.generated = 0
        self.ctx_tokens = 0  # tokens in the KV cache (valid outside the decode batch)
        self.prefill_target = prompt_tokens
        self.prefilled = 0  # of prefill_target, including prefix-cache hits
        self.private_blocks = 0  # KV blocks held by this sequence alone
        self.shared_blocks = 0  # prefix blocks held through ``prefix_entry``
        self.prefix_entry = None
        self.owns_prefix = False  # this sequence's prefill fills ``prefix_entry``
        self.state = WAITING
        self.last_token_s = 0.0
        self.slot = -1
        self.join_dit = 0
        self.res_key = 0
        self.finish_dit = 0
        # priority for FCFS admission and LIFO preemption: (arrival, id) folded into a float
        self.order = request.arrival_s
        self.fork = None  # multi-branch: the prompt blocks shared with sibling branches
        self.score = 0.0  # multi-branch: the branch's (seeded) process-reward score
        self.seats = 1  # batch seats taken at admission (a multi-branch root takes N)
        self.admitted = 0  # its engine's admission count when last admitted (vLLM V1)


class SyntheticSpec(BaseModel):
    """How synthetic requests arrive and how long they are."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    qps: float = Field(gt=0, description="mean arrival rate, requests per second")
    num_requests: int = Field(gt=0)
    burstiness: float = Field(
        default=1.0, gt=0, description="CV of inter-arrival gaps: 1 Poisson, >1 bursty (gamma)"
    )
    prompt_len: LengthDist | None = None
    output_len: LengthDist | None = None
    joint: DatasetLengths | None = Field(
        default=None,
        description="draw (prompt, output) pairs from this dataset, correlated (instead of "
        "prompt_len and output_len independently)",
    )
    shared_prefix_len: int = Field(
        default=0, ge=0, description="tokens of shared prefix prepended to every prompt"
    )
    prefix_groups: int = Field(default=1, gt=0, description="distinct shared prefixes")
    seed: int = 0


CHUNK = 4096  # requests drawn per chunk: bounded memory, same draws for any run length


class RequestChunk(NamedTuple):
    """Consecutive requests as arrays: ids ``first_id ..``, arrival times, lengths, the
    shared prefix (``prefix_key`` -1: none) and the scheduling priority (None: all 0)."""

    first_id: int
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_key: np.ndarray
    prefix_tokens: np.ndarray
    priority: np.ndarray | None = None
    frontend_in_s: np.ndarray | None = None  # API-server time before the engine (frontend)


class RequestStream:
    """A request stream that can be read as :class:`Request` objects (iteration) or as
    :class:`RequestChunk` arrays (:meth:`chunks`, what the simulator's fast path reads:
    :mod:`simcli.serving.fastpath`); both start afresh on every call and see the same
    requests. ``shared_prefixes``: whether any request may carry a shared prefix;
    ``expected``: how many requests it yields, when known before reading it (the simulator
    sizes its choice of loop by it)."""

    def __init__(
        self,
        chunks: Callable[[], Iterator[RequestChunk]],
        shared_prefixes: bool,
        expected: int | None = None,
    ):
        self._chunks = chunks
        self.shared_prefixes = shared_prefixes
        self.expected = expected
        self.priorities = False  # whether its requests carry scheduling priorities
        self.frontend_out_s = 0.0  # the frontend's time after each token (frontend.py)

    @classmethod
    def from_arrays(
        cls, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray
    ) -> RequestStream:
        """Requests ``0 ..`` of these arrays (no shared prefixes), :data:`CHUNK` at a time."""
        a = np.asarray(arrival_s, dtype=float)
        p = np.asarray(prompt_tokens, dtype=np.int64)
        o = np.asarray(output_tokens, dtype=np.int64)

        def chunks() -> Iterator[RequestChunk]:
            for i in range(0, a.size, CHUNK):
                n = min(CHUNK, a.size - i)
                none = np.full(n, -1, dtype=np.int64)
                yield RequestChunk(i, a[i : i + n], p[i : i + n], o[i : i + n], none, none + 1)

        return cls(chunks, False, int(a.size))

    def chunks(self) -> Iterator[RequestChunk]:
        return self._chunks()

    def __iter__(self) -> Iterator[Request]:
        for c in self.chunks():
            rid = c.first_id
            prio = [0] * len(c.arrival_s) if c.priority is None else c.priority.tolist()
            fe = [0.0] * len(c.arrival_s) if c.frontend_in_s is None else c.frontend_in_s.tolist()
            for a, p, o, g, t, q, f in zip(
                c.arrival_s.tolist(), c.prompt_tokens.tolist(), c.output_tokens.tolist(),
                c.prefix_key.tolist(), c.prefix_tokens.tolist(), prio, fe, strict=True,
            ):  # fmt: skip
                req = Request(rid, a, p, o, g, t, priority=q) if g >= 0 else Request(
                    rid, a, p, o, priority=q
                )
                req.frontend_in_s, req.frontend_out_s = f, self.frontend_out_s
                yield req
                rid += 1


def synthetic_requests(
    spec: SyntheticSpec, empirical: tuple[np.ndarray, np.ndarray] | None = None
) -> RequestStream:
    """Requests with Poisson/gamma arrivals; lengths from the spec's distributions, or, with
    ``empirical = (prompts, outputs)``, rows of a trace drawn with replacement."""
    if (
        empirical is None
        and spec.joint is None
        and (spec.prompt_len is None or spec.output_len is None)
    ):
        raise ValueError("synthetic requests need prompt and output length distributions")
    return RequestStream(
        lambda: _synthetic_chunks(spec, empirical), spec.shared_prefix_len > 0, spec.num_requests
    )


def _synthetic_chunks(
    spec: SyntheticSpec, empirical: tuple[np.ndarray, np.ndarray] | None
) -> Iterator[RequestChunk]:
    rng = np.random.default_rng(spec.seed)
    cv = spec.burstiness
    shape = 1.0 / (cv * cv)
    t = 0.0
    rid = 0
    plen = spec.shared_prefix_len
    while rid < spec.num_requests:
        n = min(CHUNK, spec.num_requests - rid)
        if cv == 1.0:
            gaps = rng.exponential(1.0 / spec.qps, n)
        else:
            gaps = rng.gamma(shape, 1.0 / (spec.qps * shape), n)
        if empirical is None and spec.joint is not None:
            prompts, outputs = spec.joint.sample(n, rng)
        elif empirical is None:
            prompts = spec.prompt_len.sample(n, rng)  # type: ignore[union-attr]
            outputs = spec.output_len.sample(n, rng)  # type: ignore[union-attr]
        else:
            pick = rng.integers(0, len(empirical[0]), n)
            prompts, outputs = empirical[0][pick], empirical[1][pick]
        if plen > 0:
            groups = rng.integers(0, spec.prefix_groups, n)
            prompts = np.asarray(prompts, dtype=np.int64) + plen
        else:
            groups = np.full(n, -1, dtype=np.int64)
        arrivals = t + np.cumsum(gaps)
        t = float(arrivals[-1])
        yield RequestChunk(
            rid,
            arrivals,
            np.asarray(prompts, dtype=np.int64),
            np.asarray(outputs, dtype=np.int64),
            groups,
            np.full(n, plen, dtype=np.int64),
        )
        rid += n


TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_COLUMNS = ("prefix_id", "prefix_tokens", "priority")


def _open_trace(path: Path) -> tuple[Iterator[list[str]], dict[str, int], object]:
    where = f"trace {path}"
    try:
        fh = path.open(newline="")
    except FileNotFoundError:
        raise TraceError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise TraceError(f"{where} is a directory") from None
    except OSError as exc:
        raise TraceError(f"{where} cannot be read: {str(exc).splitlines()[0]}") from None
    reader = csv.reader(fh)
    try:
        header = next(reader, None)
    except (csv.Error, UnicodeDecodeError) as exc:
        fh.close()
        raise TraceError(f"{where} is not a CSV file: {str(exc).splitlines()[0]}") from None
    if header is None:
        fh.close()
        raise TraceError(f"{where} is empty; allowed columns: {', '.join(TRACE_COLUMNS)}")
    names = [h.strip().lower() for h in header]
    missing = [c for c in TRACE_COLUMNS if c not in names]
    unknown = [c for c in names if c not in TRACE_COLUMNS + OPTIONAL_COLUMNS]
    if missing or unknown or len(set(names)) != len(names):
        fh.close()
        raise TraceError(
            f"{where} has columns {','.join(names)!r}; allowed: {', '.join(TRACE_COLUMNS)} "
            f"(required) and {', '.join(OPTIONAL_COLUMNS)} (optional)"
        )
    return reader, {n: i for i, n in enumerate(names)}, fh


def _cell_int(where: str, line: int, column: str, cell: str, low: int) -> int:
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not value.is_integer() or value < low:
        raise TraceError(
            f"{where} line {line}: {column} {cell.strip()!r} is invalid; "
            f"allowed: an integer >= {low}"
        )
    return int(value)


def _rows(path: Path) -> Iterator[tuple[int, float, int, int, int | None, int, int]]:
    """Validated rows ``(line, arrival_s, prompt, output, prefix_key, prefix_tokens,
    priority)`` (priority: an integer, lower served first; empty or absent: 0)."""
    where = f"trace {path}"
    reader, col, fh = _open_trace(path)
    ia, ip, io_ = col["arrival_s"], col["prompt_tokens"], col["output_tokens"]
    ig, it = col.get("prefix_id"), col.get("prefix_tokens")
    iq = col.get("priority")
    keys: dict[str, int] = {}
    last = 0.0
    line = 1
    seen = 0
    try:
        for row in reader:
            line = reader.line_num
            if not any(c.strip() for c in row):
                continue
            if len(row) != len(col):
                raise TraceError(
                    f"{where} line {line}: {len(row)} values, expected {len(col)} ({','.join(col)})"
                )
            try:
                arrival = float(row[ia])
            except ValueError:
                arrival = math.nan
            if not math.isfinite(arrival) or arrival < 0:
                raise TraceError(
                    f"{where} line {line}: arrival_s {row[ia].strip()!r} is invalid; "
                    "allowed: a number >= 0"
                )
            if arrival < last:
                raise TraceError(
                    f"{where} line {line}: arrival_s {arrival:g} is before the previous row's "
                    f"{last:g}; allowed: rows sorted by arrival_s"
                )
            last = arrival
            prompt = _cell_int(where, line, "prompt_tokens", row[ip], 1)
            output = _cell_int(where, line, "output_tokens", row[io_], 1)
            key: int | None = None
            ptoks = 0
            if ig is not None and row[ig].strip():
                key = keys.setdefault(row[ig].strip(), len(keys))
                if it is None:
                    raise TraceError(f"{where} line {line}: prefix_id needs a prefix_tokens column")
                ptoks = _cell_int(where, line, "prefix_tokens", row[it], 0)
                if ptoks > prompt:
                    raise TraceError(
                        f"{where} line {line}: prefix_tokens {ptoks} > prompt_tokens {prompt}; "
                        "allowed: prefix_tokens <= prompt_tokens"
                    )
            elif (
                it is not None
                and row[it].strip()
                and _cell_int(where, line, "prefix_tokens", row[it], 0) > 0
            ):
                raise TraceError(f"{where} line {line}: prefix_tokens without a prefix_id")
            prio = 0
            if iq is not None and row[iq].strip():
                try:
                    prio = int(row[iq])
                except ValueError:
                    raise TraceError(
                        f"{where} line {line}: priority {row[iq].strip()!r} is invalid; "
                        "allowed: an integer (lower is served first)"
                    ) from None
            seen += 1
            yield line, arrival, prompt, output, key, ptoks, prio
    except csv.Error as exc:
        raise TraceError(f"{where} line {line}: {str(exc).splitlines()[0]}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{where} line {line}: not UTF-8 text") from None
    finally:
        fh.close()  # type: ignore[attr-defined]
    if seen == 0:
        raise TraceError(f"{where} has a header but no rows")


def trace_requests(path: str | Path, num_requests: int | None = None) -> RequestStream:
    """Replay a trace, streaming: the first ``num_requests`` rows, read :data:`CHUNK` rows
    at a time."""
    path = Path(path)
    _, col, fh = _open_trace(path)  # a missing or malformed header fails now
    fh.close()  # type: ignore[attr-defined]
    rows = line_count(path) - 1  # about the rows: a blank last line counts too
    expected = rows if num_requests is None else min(rows, num_requests)
    stream = RequestStream(
        lambda: _trace_chunks(path, num_requests), "prefix_id" in col, max(expected, 0)
    )
    stream.priorities = "priority" in col
    return stream


def line_count(path: Path) -> int:
    """Lines of a file, counted in 1 MiB blocks (a 1M-row trace in ~50 ms)."""
    n = 0
    last = b"\n"
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def _trace_chunks(path: Path, num_requests: int | None) -> Iterator[RequestChunk]:
    rows: list[tuple[float, int, int, int, int, int]] = []
    rid = 0
    for _, arrival, prompt, output, key, ptoks, prio in _rows(path):
        if num_requests is not None and rid + len(rows) >= num_requests:
            break
        rows.append((arrival, prompt, output, -1 if key is None else key, ptoks, prio))
        if len(rows) == CHUNK:
            yield trace_chunk(rid, rows)
            rid += len(rows)
            rows = []
    if rows:
        yield trace_chunk(rid, rows)


def trace_chunk(first_id: int, rows: list[tuple]) -> RequestChunk:
    """A chunk of trace rows ``(arrival, prompt, output, prefix key, prefix tokens[,
    priority])`` (priority 0 where the reader has none)."""
    cols = list(zip(*rows, strict=True))
    a, p, o, g, t = cols[:5]
    q = cols[5] if len(cols) > 5 else (0,) * len(a)
    i64 = np.int64
    return RequestChunk(
        first_id, np.array(a, dtype=float), np.array(p, dtype=i64), np.array(o, dtype=i64),
        np.array(g, dtype=i64), np.array(t, dtype=i64), np.array(q, dtype=i64),
    )  # fmt: skip


def trace_lengths(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """All ``(prompt_tokens, output_tokens)`` of a trace, for empirical resampling."""
    prompts: list[int] = []
    outputs: list[int] = []
    for _, _, p, o, _, _, _ in _rows(Path(path)):
        prompts.append(p)
        outputs.append(o)
    return np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)


def with_image_tokens(requests: Iterable[Request], tokens: int) -> Iterator[Request]:
    """``requests`` with ``tokens`` image placeholder tokens added to every prompt (a
    vision-language model's images, :mod:`simcli.scenario.image_options`). A plain
    iterator: the compiled loop does not price the vision encoder."""
    for req in requests:
        out = Request(
            req.id, req.arrival_s, req.prompt_tokens + tokens, req.output_tokens,
            req.prefix_key, req.prefix_tokens, priority=req.priority,
        )  # fmt: skip
        out.frontend_in_s, out.frontend_out_s = req.frontend_in_s, req.frontend_out_s
        yield out


__all__ = [
    "ARRIVED",
    "CANCELLED",
    "DECODING",
    "FINISHED",
    "PREFILLING",
    "SENDING",
    "SWAPPED",
    "WAITING",
    "Request",
    "RequestChunk",
    "RequestStream",
    "Sequence",
    "with_image_tokens",
    "SyntheticSpec",
    "TraceError",
    "synthetic_requests",
    "trace_lengths",
    "trace_requests",
]
