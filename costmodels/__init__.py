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


def predict(op, gpu_id: str, **kwargs) -> float:
    """Seconds for one op on ``gpu_id`` (see :meth:`AnalyticalCostModel.for_gpu`)."""
    return AnalyticalCostModel.for_gpu(gpu_id, **kwargs).predict(op)


def predict_many(frame, gpu_id: str, **kwargs):
    """Seconds per row of an ops frame on ``gpu_id``."""
    return AnalyticalCostModel.for_gpu(gpu_id, **kwargs).predict_many(frame)
