"""Cost models: ``predict(op) -> seconds`` for every op kind.

Analytical models (roofline + efficiency, tile and wave quantisation, alpha-beta
collectives) priced against hardware specs; calibration profiles override their
efficiency parameters with values fitted on measurements.
"""

from costmodels.ops.analytical import AnalyticalCostModel, frame_columns, op_columns
from costmodels.ops.common import Work
from costmodels.ops.params import ArchParams, arch_params
from costmodels.ops.profile import Profile, ProfileError, load_profile

__all__ = [
    "AnalyticalCostModel",
    "ArchParams",
    "Profile",
    "ProfileError",
    "Work",
    "arch_params",
    "frame_columns",
    "load_profile",
    "op_columns",
    "predict",
    "predict_many",
]


def _model_for(hw, **kwargs):
    """``hw``: a GPU id or GpuSpec (best model: its profile when one ships), a System
    (uncalibrated model on that exact system), or a cost model used as is."""
    from costmodels.ops.learned import LearnedCostModel
    from costmodels.ops.select import get_cost_model
    from hardware_specs.registry import System, builtin_catalog
    from hardware_specs.schema import GpuSpec, HardwareFile

    if isinstance(hw, AnalyticalCostModel | LearnedCostModel):
        return hw
    if isinstance(hw, System):
        return AnalyticalCostModel(hw)
    if isinstance(hw, GpuSpec):
        cat = builtin_catalog()
        if hw.id not in cat.gpus:
            raise ValueError(f"GPU {hw.id!r} has no reference node; pass a System instead")
        if cat.gpus[hw.id] != hw:  # a modified spec: priced as specified, not as calibrated
            cat = cat.merged(HardwareFile(gpus=[hw]))
            return AnalyticalCostModel.for_gpu(hw.id, catalog=cat)
        return get_cost_model(hw.id, catalog=cat, **kwargs)
    return get_cost_model(str(hw), **kwargs)


def predict(op, hw, **kwargs) -> float:
    """Seconds for one op on ``hw`` (GPU id, GpuSpec, System or cost model)."""
    return _model_for(hw, **kwargs).predict(op)


def predict_many(frame, hw, **kwargs):
    """Seconds per row of an ops frame on ``hw`` (GPU id, GpuSpec, System or cost model)."""
    return _model_for(hw, **kwargs).predict_many(frame)
