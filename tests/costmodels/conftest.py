import pytest

from costmodels import AnalyticalCostModel
from hardware_specs.registry import builtin_catalog


@pytest.fixture(scope="session")
def h100():
    return AnalyticalCostModel.for_gpu("h100-sxm")


@pytest.fixture(scope="session", params=sorted(builtin_catalog().gpus))
def any_gpu_model(request):
    return AnalyticalCostModel.for_gpu(request.param)
