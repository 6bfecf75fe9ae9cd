"""vLLM V0 multi-step scheduling (``--num-scheduler-steps``): decode rounds of N steps,
admission only between rounds, and a round's tokens reaching the client together."""

from __future__ import annotations

import pytest

from simcli.scenario.serving import ServeOptions, resolve_serve
from simcli.serving import fastpath
from simcli.serving.engine import Engine
from simcli.serving.schedulers import SchedulerConfig

BASE = {
    "model": "llama3-8b",
    "gpu": "h100-sxm",
    "engine": "vllm-v0",
    "qps": 6.0,
    "num_requests": 120,
    "prompt_len": "lognormal:300:0.8:1500",
    "output_len": "lognormal:150:0.8:600",
    "seed": 5,
}


def _run(steps: int):
    """(summary, per-iteration log [(prefills, decodes, end_s)], finish times)."""
    sc = resolve_serve(ServeOptions(**BASE, num_scheduler_steps=steps))
    finishes: list[float] = []  # engine-side: before the API server's time is added
    sim = sc.simulator()
    log: list[list] = []
    orig, orig_finish = Engine.try_start, Engine.finish_sequence

    def finish_sequence(self, seq, now_s):
        finishes.append(now_s)
        orig_finish(self, seq, now_s)

    def try_start(self, now_s):
        events = orig(self, now_s)
        if events:
            b = self.batch
            log.append([len(b.prefills), b.n_decode, events[0].time_s])
        return events

    reqs = list(sc.arrivals.requests())
    assert not fastpath.eligible(sim, reqs) or steps == 1
    Engine.try_start, Engine.finish_sequence = try_start, finish_sequence
    try:
        summary = sim.run(reqs).summary
    finally:
        Engine.try_start, Engine.finish_sequence = orig, orig_finish
    return summary, log, finishes


@pytest.mark.parametrize("steps", [4, 10])
def test_rounds_admit_only_between_rounds_and_deliver_at_their_end(steps):
    summary, log, finishes = _run(steps)
    assert len(finishes) == BASE["num_requests"]
    # every run of decode-only iterations is whole rounds: a prefill never cuts one
    run, round_ends = 0, set()
    for n_pre, n_dec, end_s in log:
        assert not (n_pre and n_dec)  # vLLM 0.6 multi-step: no mixed batches
        if n_pre:
            assert run % steps == 0, run
            run = 0
        else:
            run += 1
            if run % steps == 0:
                round_ends.add(end_s)
    # a request finishing mid-round is delivered when its round ends
    # (all but those whose only output token came from the prefill)
    assert sum(f in round_ends for f in finishes) >= 0.9 * len(finishes)


def test_rounds_stream_chunks_and_make_new_requests_wait():
    one, _, _ = _run(1)
    ten, _, _ = _run(10)
    # one chunk per round: the gap between chunks is about ten decode steps
    ratio = ten["tbt_s_p50"] / ten["tpot_s_p50"]
    assert 7.0 < ratio < 13.0, ratio
    assert one["tbt_s_p50"] / one["tpot_s_p50"] < 1.3
    # host work once per round: decode steps are shorter; new requests wait for the round
    assert ten["tpot_s_p50"] < one["tpot_s_p50"]
    assert ten["ttft_s_p50"] > one["ttft_s_p50"] + 2 * ten["tpot_s_p50"]


def test_multi_step_is_vllm_v0_only():
    with pytest.raises(ValueError, match="multi-step rounds are vLLM V0's"):
        SchedulerConfig(kind="sarathi", scheduler_steps=8)
    with pytest.raises(ValueError, match="--scheduler vllm alone"):
        ServeOptions(**BASE, num_scheduler_steps=8, scheduler="sarathi")
    with pytest.raises(ValueError, match="allowed: --engine vllm-v0"):
        ServeOptions(**{**BASE, "engine": "vllm"}, num_scheduler_steps=8)
