"""Heterogeneous prefill/decode pools (``simcli serve --disaggregate --prefill-gpu ID
--decode-gpu ID``; ``serve plan --prefill-gpu-types/--decode-gpu-types``): the checks of
the pool flags and each pool's GPU and price, resolved for
:mod:`simcli.scenario.serving`.

Splitwise (Patel et al., ISCA 2024) runs prompts on H100 machines and token generation on
A100 machines (Splitwise-HA): decode is memory-bound, and the A100's HBM is 0.61x the
H100's bandwidth at a lower price, while prefill is compute-bound. Pools of two GPU types
sit in two kinds of node, so their KV transfer always crosses the NICs
(:func:`simcli.serving.disagg.default_transfer` prices it at the slower node's NIC), and
both pools must store the KV cache alike (one model, one KV dtype: a block moves byte for
byte). See docs/disaggregation.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hardware_specs.registry import load_catalog
from simcli.scenario.serving_precision import check_precision

if TYPE_CHECKING:  # pandas: not loaded by `serve --help`
    from simcli.serving.disagg import DisaggConfig


def default_pool_gpu(data: Any) -> Any:
    """``--prefill-gpu X --decode-gpu Y`` without ``--gpu``: ``--gpu`` is X (the output's
    ``gpu``). A ``mode="before"`` validator of :class:`ServeOptions`."""
    if isinstance(data, dict) and data.get("gpu") is None:
        pre, dec = data.get("prefill_gpu"), data.get("decode_gpu")
        if pre is not None and dec is not None:
            return {**data, "gpu": pre}
    return data


def two_gpu_types(o: Any) -> bool:
    """``ServeOptions.heterogeneous``: disaggregated pools on two GPU types."""
    return bool(o.disaggregate) and o.prefill_gpu_or_gpu != o.decode_gpu_or_gpu


def check_pool_options(o: Any) -> None:
    """``serve`` flags that cannot hold with pools of two GPU types (``o`` a
    :class:`~simcli.scenario.serving_options.ServeOptions`): an NVLink (``intra``) KV link,
    a calibration profile or composition file (each fits one GPU)."""
    if not o.heterogeneous:
        return
    pre, dec = o.prefill_gpu_or_gpu, o.decode_gpu_or_gpu
    if o.kv_transfer == "intra":
        raise ValueError(
            f"--kv-transfer intra with prefill pool {pre} and decode pool {dec}: GPUs of two "
            "types never share a node; allowed: --kv-transfer inter (the default for them)"
        )
    for flag, value in (("--profile", o.profile), ("--composition", o.composition)):
        if value is not None:
            raise ValueError(
                f"{flag} fits one GPU type, the pools run {pre} and {dec}; allowed: {flag} "
                "with one GPU type in both pools"
            )


def check_pool_gpus(o: Any) -> None:
    """Each pool's GPU exists and stores the run's weights and KV cache (an fp8 cache on a
    GPU without fp8 cannot receive the other pool's blocks): one line naming the pool."""
    catalog = load_catalog()
    for pool, flag, gpu in (("prefill", "--prefill-gpu", o.prefill_gpu),
                            ("decode", "--decode-gpu", o.decode_gpu)):  # fmt: skip
        if gpu is None:
            continue
        try:
            catalog.gpu(gpu)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{flag}: {str(exc).strip(chr(39)).splitlines()[0]}") from None
        if o.heterogeneous:
            try:
                check_precision(gpu, o.weight_dtype, o.kv_cache_dtype)
            except ValueError as exc:
                raise ValueError(f"{pool} pool ({flag} {gpu}): {exc}") from None


def pool_fields(o: Any, decode_price: float | None, prefill_price: float | None) -> dict:
    """Each pool's GPU id and US$ per GPU-hour (the :class:`DisaggConfig` fields)."""
    return {
        "prefill_gpu": o.prefill_gpu_or_gpu,
        "decode_gpu": o.decode_gpu_or_gpu,
        "prefill_price_per_gpu_hour": prefill_price,
        "decode_price_per_gpu_hour": decode_price,
    }


def mean_price(d: DisaggConfig) -> float | None:
    """The deployment's US$ per GPU-hour: the pools' prices weighted by their GPUs (the
    price itself when both pools pay the same; None when a pool's price is unknown), so
    that GPU-hours x price is the sum of the pools' costs."""
    pp, dp = d.prefill_price_per_gpu_hour, d.decode_price_per_gpu_hour
    if pp is None or dp is None:
        return None
    if pp == dp:
        return pp
    pg = d.prefill_replicas * (d.prefill_gpus_per_replica or 1)
    dg = d.decode_replicas * (d.decode_gpus_per_replica or 1)
    return (pg * pp + dg * dp) / (pg + dg)


def with_pool_prices(config: Any, prefill_price: float, decode_price: float) -> Any:
    """A :class:`~simcli.serving.simulator.ServeConfig` whose pools pay these prices (the
    planner's, with its ``GPU=USD`` overrides), its run price their mean."""
    d = config.disaggregation
    if d is None:
        return config
    d = d.model_copy(
        update={
            "prefill_price_per_gpu_hour": prefill_price,
            "decode_price_per_gpu_hour": decode_price,
        }
    )
    return config.model_copy(update={"disaggregation": d, "price_per_gpu_hour": mean_price(d)})


__all__ = [
    "check_pool_gpus",
    "check_pool_options",
    "default_pool_gpu",
    "mean_price",
    "pool_fields",
    "two_gpu_types",
    "with_pool_prices",
]
