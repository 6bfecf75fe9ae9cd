"""Each engine profile runs its own scheduler kind by default, with its own budget."""

import pytest

from costmodels.steps.engines import ENGINE_IDS, load_engine
from simcli.options import validate
from simcli.scenario.serving import resolve_deployment, serve_config
from simcli.scenario.serving_options import ServeOptions
from simcli.serving.schedulers import SCHEDULERS
from workloads.models import load_model


def test_every_profile_names_a_registered_scheduler():
    for engine in ENGINE_IDS:
        assert load_engine(engine).defaults.scheduler in SCHEDULERS, engine


@pytest.mark.parametrize(
    ("engine", "gpu", "kind", "budget"),
    [
        ("vllm", "h100-sxm", "vllm-v1", 8192),
        ("vllm", "a100-sxm-80gb", "vllm-v1", 2048),  # vLLM keeps A100 at 2048
        ("sglang", "h100-sxm", "sglang", 8192),
        ("trtllm", "h200-sxm", "trtllm", 8192),
        ("vllm-v0", "h100-sxm", "vllm", 8192),  # max(max_model_len 8192, 2048)
    ],
)
def test_engine_default_scheduler_and_budget(engine, gpu, kind, budget):
    o = validate(ServeOptions, {"model": "llama3-8b", "gpu": gpu, "engine": engine, "qps": 1})
    assert o.scheduler == kind
    model = load_model("llama3-8b")
    cfg = serve_config(o, model, resolve_deployment(o, model).hardware)
    assert cfg.scheduler.kind == kind
    got = cfg.scheduler.chunked_prefill_size if kind == "sglang" else cfg.scheduler.max_tokens
    assert got == budget
