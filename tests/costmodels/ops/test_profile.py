import json

import pytest

from costmodels import ProfileError, load_profile
from costmodels.ops.select import get_cost_model
from workloads.ops import Op

COPY = Op(op="copy", bytes=2**30)


def _write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_profile_overrides_parameters(tmp_path, h100):
    path = _write(
        tmp_path,
        {
            "name": "test",
            "gpu": "h100-sxm",
            "params": {"elementwise": {"memory_efficiency": {"copy": 0.45}}},
        },
    )
    slow = get_cost_model("h100-sxm", profile=path, use_shipped=False)
    assert slow.label == "profile test"
    base = h100.params.elementwise
    ratio = (slow.predict(COPY) - base.launch_s) / (h100.predict(COPY) - base.launch_s)
    assert ratio == pytest.approx(0.90 / 0.45, rel=1e-9)
    # untouched parameters keep their defaults
    assert slow.params.elementwise.memory_efficiency["rmsnorm"] == base.memory_efficiency["rmsnorm"]
    assert slow.params.gemm == h100.params.gemm


def test_profile_for_another_gpu_is_refused(tmp_path):
    path = _write(tmp_path, {"name": "h200 run", "gpu": "h200-sxm"})
    with pytest.raises(ProfileError, match="measured on 'h200-sxm', not 'h100-sxm'"):
        get_cost_model("h100-sxm", profile=path, use_shipped=False)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a mapping"),
        (json.dumps({"gpu": "h100-sxm"}), "name"),
        (json.dumps({"name": "x", "gpu": "h100-sxm", "colour": 1}), "colour"),
    ],
)
def test_bad_profiles_give_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ProfileError, match=message) as err:
        load_profile(path)
    assert "\n" not in str(err.value)


def test_bad_override_values_are_rejected(tmp_path):
    path = _write(
        tmp_path, {"name": "x", "gpu": "h100-sxm", "params": {"gemm": {"memory_efficiency": 3}}}
    )
    with pytest.raises(ValueError, match="gemm.memory_efficiency"):
        get_cost_model("h100-sxm", profile=path, use_shipped=False)


def test_missing_profile_file(tmp_path):
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "nope.json")
