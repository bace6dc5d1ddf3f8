"""Slurm compact host lists: expansion as `scontrol show hostnames` does it, and back."""
from __future__ import annotations

import pytest

from gpudoctor.fleet.nodelist import MAX_HOSTS, compress, expand


@pytest.mark.parametrize("text, hosts", [
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("gpu01", ["gpu01"]),
    ("a,b,c", ["a", "b", "c"]),
    ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
    ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("node[1,3-4],login,x[007]", ["node1", "node3", "node4", "login", "x007"]),
    ("dgx-a100-[1-2].cluster", ["dgx-a100-1.cluster", "dgx-a100-2.cluster"]),
    (" gpu[1-2] ", ["gpu1", "gpu2"]),
])
def test_expand(text, hosts):
    assert expand(text) == hosts


@pytest.mark.parametrize("text, why", [
    ("gpu[1-", "unbalanced"),
    ("gpu]", "unbalanced"),
    ("gpu[3-1]", "backwards"),
    ("gpu[a-b]", "bad range"),
    ("gpu[[1]]", "nested"),
    ("gpu[1-99999999]", "more than"),
    ("a[1-2000]b[1-2000]", "more than"),
    ("gpu 1", "white space"),
])
def test_malformed_lists_are_refused(text, why):
    with pytest.raises(ValueError, match=why):
        expand(text)


@pytest.mark.parametrize("hosts, text", [
    (["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"], "gpu[01-04,07]"),
    (["gpu8", "gpu9", "gpu10"], "gpu[8-10]"),
    (["gpu08", "gpu09", "gpu10"], "gpu[08-10]"),
    (["a", "b"], "a,b"),
    (["n3", "n1"], "n3,n1"),  # order is kept
    (["x1", "x01"], "x1,x01"),  # widths differ: two entries
])
def test_compress(hosts, text):
    assert compress(hosts) == text
    assert expand(text) == hosts


def test_round_trip_on_a_large_list():
    hosts = [f"gpu{i:04d}" for i in range(2000) if i % 7]
    assert expand(compress(hosts)) == hosts
    assert len(compress(hosts)) < len(",".join(hosts)) / 3
    assert MAX_HOSTS >= 1 << 16
