"""Cost models: ``predict(op) -> seconds`` for every op kind.

Analytical models (roofline + efficiency, tile and wave quantisation, alpha-beta
collectives) priced against hardware specs; calibration profiles override their
efficiency parameters with values fitted on measurements.
"""

from costmodels.analytical import AnalyticalCostModel, frame_columns, op_columns
from costmodels.common import Work
from costmodels.params import ArchParams, arch_params
from costmodels.profile import Profile, ProfileError, load_profile

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


def _model_for(hw, **kwargs) -> AnalyticalCostModel:
    """``hw`` may be a GPU id, a GpuSpec (placed in its reference node), a System or a model."""
    from hardware_specs.registry import System, builtin_catalog
    from hardware_specs.schema import GpuSpec

    if isinstance(hw, AnalyticalCostModel):
        return hw
    if isinstance(hw, System):
        return AnalyticalCostModel(hw)
    if isinstance(hw, GpuSpec):
        cat = builtin_catalog()
        if hw.id not in cat.gpus or cat.gpus[hw.id] != hw:
            from hardware_specs.schema import HardwareFile

            node = cat.reference_node(hw.id) if hw.id in cat.gpus else None
            if node is None:
                raise ValueError(f"GPU {hw.id!r} has no reference node; pass a System instead")
            cat = cat.merged(HardwareFile(gpus=[hw]))
        return AnalyticalCostModel.for_gpu(hw.id, catalog=cat, **kwargs)
    return AnalyticalCostModel.for_gpu(str(hw), **kwargs)


def predict(op, hw, **kwargs) -> float:
    """Seconds for one op on ``hw`` (GPU id, GpuSpec, System or cost model)."""
    return _model_for(hw, **kwargs).predict(op)


def predict_many(frame, hw, **kwargs):
    """Seconds per row of an ops frame on ``hw`` (GPU id, GpuSpec, System or cost model)."""
    return _model_for(hw, **kwargs).predict_many(frame)
