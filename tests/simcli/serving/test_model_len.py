"""The max model length in the serving simulator (simcli.serving.simulator): prompts
beyond it refused and counted, outputs cut to fit, as vLLM serves them."""

from __future__ import annotations

import numpy as np
import pytest

from simcli.serving.branches import BranchConfig
from simcli.serving.requests import Request, output_within_model_len
from simcli.serving.simulator import ServeConfig, SimulationError, Simulator


class FlatStep:
    """A step model whose iterations cost 1 ms plus 1 us per token."""

    kv_bytes_per_token = 131072.0

    def step_s(self, prefill_new, prefill_past, decode_ctx) -> float:
        return 1e-3 + 1e-6 * (float(np.sum(prefill_new)) + len(decode_ctx))

    def kv_capacity_tokens(self, block_size: int, gpu_memory_utilization: float) -> int:
        return 1_000_000

    def verify_step_s(self, decode_ctx, k: int) -> float:
        return self.step_s(np.zeros(0), np.zeros(0), decode_ctx) * (1 + k)


@pytest.mark.parametrize(
    ("prompt", "output", "limit", "served"),
    [
        (100, 50, None, 50),  # no limit
        (100, 50, 150, 50),  # fits exactly
        (100, 80, 150, 50),  # cut: stops when prompt + generated reaches the limit
        (150, 10, 150, 1),  # a prompt of exactly the limit still samples one token
        (151, 10, 150, 0),  # refused (vLLM's input processor raises)
    ],
)
def test_output_within_model_len(prompt, output, limit, served):
    assert output_within_model_len(prompt, output, limit) == served


def _run(requests, limit, **kw):
    finished: list[Request] = []
    cfg = ServeConfig(max_model_len=limit, **kw)
    sim = Simulator(FlatStep(), cfg, sink=finished.append)
    return sim.run(requests).summary, {r.id: r for r in finished}


def test_longer_prompts_are_refused_and_outputs_cut():
    rows = [(0.0, 100, 20), (0.1, 5000, 10), (0.2, 1000, 200), (0.3, 1024, 5), (0.4, 10, 10)]
    reqs = [Request(i, *r) for i, r in enumerate(rows)]
    summary, done = _run(reqs, 1024)
    assert summary["requests_rejected_too_long"] == 1  # the 5000-token prompt
    assert summary["requests_output_capped"] == 2  # 1000 + 200 and 1024 + 5
    assert summary["requests_completed"] == 4 and 1 not in done
    assert summary["max_model_len"] == 1024
    assert done[2].output_tokens == 24 and done[3].output_tokens == 1
    assert done[0].output_tokens == 20 and done[4].output_tokens == 10
    assert summary["output_tokens"] == 20 + 24 + 1 + 10
    assert summary["prompt_tokens"] == 100 + 1000 + 1024 + 10


def test_no_limit_serves_everything():
    reqs = [Request(0, 0.0, 5000, 10), Request(1, 0.1, 10, 10)]
    summary, done = _run(reqs, None)
    assert summary["requests_rejected_too_long"] == summary["requests_output_capped"] == 0
    assert summary["max_model_len"] is None and len(done) == 2


def test_every_prompt_too_long_is_one_error_line():
    with pytest.raises(SimulationError, match="every one of the 2 requests") as err:
        _run([Request(0, 0.0, 300, 1), Request(1, 1.0, 400, 1)], 256)
    assert "\n" not in str(err.value)


def test_branches_stop_at_the_limit_too():
    branching = BranchConfig(branches=4)
    reqs = [Request(0, 0.0, 200, 40), Request(1, 0.5, 50, 40)]
    summary, done = _run(reqs, 220, branching=branching)
    assert summary["requests_output_capped"] == 1  # request 0: 200 + 40 > 220
    assert done[0].branch.lengths.max() == 20 and done[1].branch.lengths.max() == 40
