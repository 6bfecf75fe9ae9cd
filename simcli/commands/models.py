"""``simcli models list|show``: built-in architectures and HuggingFace configs."""

from __future__ import annotations

import typer

from simcli.errors import user_errors
from simcli.options import SimcliGroup
from simcli.output import Format, emit_object, emit_records
from workloads.models import list_models, load_model

app = typer.Typer(
    cls=SimcliGroup,
    help="Model architectures simcli knows (or reads from config.json).",
    no_args_is_help=True,
)

FormatOpt = typer.Option(Format.table, "--format", help="table | json | csv")


def _summary(m) -> dict:
    return {
        "id": m.id,
        "family": m.family,
        "params_b": m.num_params / 1e9,
        "active_params_b": m.num_active_params / 1e9,
        "layers": m.num_layers,
        "hidden": m.hidden_size,
        "heads": m.num_heads,
        "kv_heads": m.num_kv_heads,
        "ffn": m.ffn_hidden_size,
        "experts": m.num_experts,
        "vocab": m.vocab_size,
    }


@app.command("list")
def list_cmd(fmt: Format = FormatOpt) -> None:
    """Built-in model ids with their sizes."""
    with user_errors():
        emit_records(
            [_summary(m) for m in list_models()], fmt, title="simcli models", json_key="models"
        )


@app.command("show")
def show_cmd(
    model: str = typer.Argument(
        ..., metavar="ID|CONFIG", help="Built-in id or a config.json path."
    ),
    fmt: Format = FormatOpt,
) -> None:
    """Every architecture field, parameter counts, KV-cache bytes per token and a
    hybrid's recurrent state per sequence, a vision-language model's encoder parameters
    and the tokens of a 1024x1024 image."""
    with user_errors():
        m = load_model(model)
        data = m.model_dump(mode="json")
        data["num_params"] = m.num_params
        data["num_active_params"] = m.num_active_params
        data["kv_cache_bytes_per_token_bf16"] = m.kv_cache_bytes_per_token(2)
        if m.mixer is not None:  # a hybrid's constant state per sequence
            data["attention_layers"] = m.attention_layers
            data["state_bytes_per_seq_bf16"] = m.state_bytes_per_seq(2)
        if m.vision is not None:  # a vision-language model's image encoder
            data["vision_params"] = m.vision.params
            data["image_tokens_1024x1024"] = m.vision.tokens(1024, 1024)
        emit_object(data, fmt, title=m.id)
