"""A config.json's model is named by the config, else by the file (issue 18 item 4): run in
folder ``s``, ``--draft-model draft.json`` used to report ``"draft_model": "s"``."""

import json
from pathlib import Path

import pytest

from workloads.models import load_model

# Llama-3.2-1B's config without its name: each case adds the naming keys it tests
_EXAMPLE = Path(__file__).parents[2] / "examples/models/llama-3.2-1b.config.json"
LLAMA_1B = {
    k: v
    for k, v in json.loads(_EXAMPLE.read_text()).items()
    if k not in ("_name_or_path", "_source")
}


@pytest.mark.parametrize(
    "extra, file, name",
    [
        ({}, "draft.json", "draft"),  # the file's stem, never the folder it sits in
        ({"_name_or_path": "meta-llama/Llama-3.2-1B"}, "draft.json", "meta-llama/Llama-3.2-1B"),
        ({"name": "tiny", "_name_or_path": "x/y"}, "draft.json", "tiny"),
        ({"_name_or_path": ""}, "my-model.json", "my-model"),
        ({}, "Llama-3.2-1B/config.json", "Llama-3.2-1B"),  # a checkpoint folder's config
    ],
)
def test_name_from_the_config_else_the_file(tmp_path, monkeypatch, extra, file, name):
    folder = tmp_path / "s"
    path = folder / file
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**LLAMA_1B, **extra}))
    monkeypatch.chdir(folder)
    rel = file if "/" not in file else file.split("/")[0]  # a folder: its config.json
    assert load_model(rel).id == name
    assert load_model(str(path)).name == name


def test_serve_reports_the_draft_by_its_file_name(run, tmp_path, monkeypatch):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "draft.json").write_text(json.dumps(LLAMA_1B))
    monkeypatch.chdir(folder)
    argv = ["serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "2"]
    res = run(*argv, "--num-requests", "10", "--draft-model", "draft.json", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["draft_model"] == "draft"
