"""``--weight-sparsity`` and ``--activation-sparsity`` of ``simcli step``, ``simcli serve``
and ``simcli train``: the option fields (one definition for every command), the checks that
need no hardware, and the JSON keys the commands add when a sparsity is given (what the
options mean: :mod:`workloads.decompose.sparsity`; the GPU checks run where the GPU is
resolved, in the step and training models)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from workloads.decompose.sparsity import linear_sparsity
from workloads.ops import OpError, canonical_sparsity

WEIGHT_SPARSITY_HELP = (
    "Weight sparsity of the linear layers (QKV, out, MLP; not attention, LM head or routed "
    "experts): 2:4 (cuSPARSELt, sparse tensor cores) | unstructured:S (S = fraction of zero "
    "weights, Flash-LLM). Default: dense."
)
ACTIVATION_SPARSITY_HELP = (
    "Activation sparsity of a dense SwiGLU MLP: cats:F (CATS, F = fraction of neurons active "
    "per token; gate dense, up and down sparse). Default: dense."
)
TRAIN_WEIGHT_SPARSITY_HELP = (
    "2:4 weight sparsity of the linear layers in training (forward and input-gradient GEMMs "
    "sparse with transposable masks, weight gradient dense). Default: dense."
)
TRAIN_ACTIVATION_SPARSITY_HELP = "Not modelled for training (CATS is an inference kernel)."


# the CLI prefixes a field's error with its flag and value: the messages say the rest
_KINDS = {"--weight-sparsity": "2:4, unstructured:S (0 <= S < 1)", "--activation-sparsity":
          "cats:F (0 < F <= 1)"}  # fmt: skip


def _canonical(flag: str, kinds: tuple[str, ...]):
    def check(value: str | None) -> str | None:
        if value is None or value == "":
            return None
        try:
            out = canonical_sparsity(value)
        except OpError:
            raise ValueError(f"not understood; allowed: {_KINDS[flag]}") from None
        if out and not out.startswith(kinds):
            other = "--activation-sparsity" if flag == "--weight-sparsity" else "--weight-sparsity"
            raise ValueError(f"allowed: {_KINDS[flag]} ({value} is {other})")
        return out or None

    return check


WeightSparsity = Annotated[
    str | None, AfterValidator(_canonical("--weight-sparsity", ("2:4", "unstructured:")))
]
ActivationSparsity = Annotated[
    str | None, AfterValidator(_canonical("--activation-sparsity", ("cats:",)))
]


def _training(flag: str, kinds: tuple[str, ...]):
    canonical = _canonical(flag, kinds)

    def check(value: str | None) -> str | None:
        out = canonical(value)
        if out is not None and out != "2:4":
            kernel = "CATS" if out.startswith("cats") else "Flash-LLM"
            raise ValueError(
                f"no training kernel ({kernel} is an inference kernel); allowed for train: "
                "--weight-sparsity 2:4"
            )
        return out

    return check


TrainWeightSparsity = Annotated[
    str | None, AfterValidator(_training("--weight-sparsity", ("2:4", "unstructured:")))
]
TrainActivationSparsity = Annotated[
    str | None, AfterValidator(_training("--activation-sparsity", ("cats:",)))
]


def weight_sparsity_field(training: bool = False) -> Any:
    return Field(None, description=TRAIN_WEIGHT_SPARSITY_HELP if training else WEIGHT_SPARSITY_HELP)


def activation_sparsity_field(training: bool = False) -> Any:
    help_ = TRAIN_ACTIVATION_SPARSITY_HELP if training else ACTIVATION_SPARSITY_HELP
    return Field(None, description=help_)


def check_sparsity_options(options: Any, *, training: bool = False) -> None:
    """The combinations that need no model or GPU: both options at once, a quantised
    ``--weight-dtype``, a kind with no training kernel (one ``ValueError`` line)."""
    linear_sparsity(
        options.weight_sparsity,
        options.activation_sparsity,
        weight_dtype=getattr(options, "weight_dtype", None),
        training=training,
    )


def sparsity_fields(options: Any) -> dict[str, str | None]:
    """The JSON keys a command adds when a sparsity is given (none otherwise: dense outputs
    stay as they were)."""
    w, a = options.weight_sparsity, options.activation_sparsity
    if not (w or a):
        return {}
    return {"weight_sparsity": w, "activation_sparsity": a}


SPARSITY_SCHEMA = {
    "weight_sparsity": "--weight-sparsity only: the linear layers' weight sparsity (2:4 | "
    "unstructured:S), empty when dense",
    "activation_sparsity": "--activation-sparsity only: the MLP's activation sparsity (cats:F), "
    "empty when dense",
}

__all__ = [
    "SPARSITY_SCHEMA",
    "ActivationSparsity",
    "TrainActivationSparsity",
    "TrainWeightSparsity",
    "WeightSparsity",
    "activation_sparsity_field",
    "check_sparsity_options",
    "sparsity_fields",
    "weight_sparsity_field",
]
