"""The step costs of a ``simcli train`` scenario when they are not the default pricing: a
sparse attention pattern (:func:`simcli.sparsity.whatif.sparse_step_costs`) and 2:4 linear
layers (:mod:`costmodels.steps.sparse_linear`), alone or together."""

from __future__ import annotations

from typing import Any

from costmodels.steps.hf_attention import hf_attention_scale
from costmodels.steps.training import StepCosts, step_costs

HF_FRAMEWORKS = ("pytorch", "pytorch-compile")  # transformers-style models: SDPA with masks


def scenario_step_costs(s: Any) -> StepCosts | None:
    """Step costs for a :class:`~simcli.scenario.training.TrainScenario` ``s``, or None
    where the simulator's own pricing applies (no pattern, dense linear layers). A model's
    own local attention (no ``--attn-pattern``) under the PyTorch frameworks runs as
    transformers runs it: masked SDPA (:mod:`costmodels.steps.hf_attention`)."""
    w = s.config.weight_sparsity
    if s.attn_pattern is None and not w:
        return None
    hw = s.hardware
    costs = step_costs(
        s.model, s.plan, hw.cost_model, hw.system, s.attn_backend, s.framework, s.composition,
        weight_sparsity=w,
    )  # fmt: skip
    sinks_eager = s.model.attention_sinks and s.framework == "pytorch"  # no SDPA: eager
    if s.attn_pattern is not None and s.config.attn_pattern is None and sinks_eager:
        return costs  # its scores materialised whatever the mask (hf_sinks_attention)
    if s.attn_pattern is not None and s.config.attn_pattern is None and (
        s.framework in HF_FRAMEWORKS
    ):
        from costmodels.steps.sparse import scale_attention  # loads the serving step model

        f, b = hf_attention_scale(s.model, s.plan.seq_len // s.plan.cp)
        return scale_attention(costs, s.plan, f, b)
    if s.attn_pattern is None:
        return costs
    # the sparsity pricer (and the serving step model it builds on) loads for patterns only
    from simcli.sparsity.whatif import SparsityPricer, sparse_step_costs

    pricer = SparsityPricer(hw.gpu_id, cost_models=s.cost_model, seed=0)
    return sparse_step_costs(s.model, s.plan, s.attn_pattern, hw.gpu_id, base=costs, pricer=pricer)


__all__ = ["scenario_step_costs"]
