"""``serve --disaggregate``'s KV link defaults to NVLink when both pools fit in one node, to
the NICs otherwise (issue 18 item 11: it used to be the NIC even inside one node)."""

import json

import pytest

BASE = ("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "4", "--num-requests",
        "30", "--disaggregate", "--pd-ratio", "1:1", "--format", "json", "--quiet")  # fmt: skip


@pytest.mark.parametrize(
    "extra, link",
    [
        (("--replicas", "2"), "intra"),  # 2 GPUs of one 8-GPU DGX H100
        (("--replicas", "8"), "intra"),  # 8: the whole node
        (("--replicas", "4", "--tp", "4"), "inter"),  # 16 GPUs: two nodes
        (("--replicas", "2", "--kv-transfer", "inter"), "inter"),  # given: kept
    ],
)
def test_default_link_follows_the_pools(run, extra, link):
    res = run(*BASE, *extra)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["kv_transfer"] == link


def test_intra_node_transfers_are_faster(run):
    intra = json.loads(run(*BASE, "--replicas", "2").stdout)
    inter = json.loads(run(*BASE, "--replicas", "2", "--kv-transfer", "inter").stdout)
    assert intra["kv_transfer_s_mean"] < inter["kv_transfer_s_mean"]


def test_help_says_the_default(run):
    out = " ".join(run("serve", "--help").stdout.split())
    assert "intra when both pools fit in one node, else inter" in out
