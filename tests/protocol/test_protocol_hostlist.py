"""A job's nodes as a Slurm-style host list (``PhaseEvent.hostlist``, powerd/hostlist.py):
what the job hook compresses the controller expands to the same names, and a list off the
wire cannot make the controller build more than ``MAX_HOSTS`` names or accept a bad one."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.hostlist import MAX_HOSTS, compress_hostlist, expand_hostlist
from powerd.protocol import (
    MAX_PAYLOAD_BYTES,
    NODE_LIST_MAX_BYTES,
    PhaseEvent,
    ProtocolError,
    decode,
    encode,
    job_nodes_fields,
)

names = st.builds(
    lambda prefix, number, width: prefix + ("" if number is None else f"{number:0{width}d}"),
    st.sampled_from(["r01-n", "r02-n", "gpu", "k1-", "login", "a.b_c-"]),
    st.none() | st.integers(0, 120),
    st.integers(1, 3),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(names, max_size=60))
def test_a_compressed_list_expands_to_the_same_names_in_order(nodes):
    assert expand_hostlist(compress_hostlist(nodes)) == nodes


@pytest.mark.parametrize("name", ["a b", "a,b", "n[1]", "", " n1", "n1\t"])
def test_a_name_that_a_host_list_would_split_is_refused(name):
    with pytest.raises(ValueError, match="cannot be part of a host list"):
        compress_hostlist(["n1", name])


def test_a_150_mw_job_fits_one_payload_as_a_host_list():
    nodes = [
        f"row{r:02d}-k{k:02d}-n{i:02d}"
        for r in range(1, 9)
        for k in range(1, 73)
        for i in range(1, 19)
    ]
    assert len(nodes) == 10_368
    fields = job_nodes_fields(nodes)
    assert set(fields) == {"hostlist"}
    assert fields["hostlist"].startswith("row01-k01-n[01-18],row01-k02-n[01-18],")
    payload = encode(PhaseEvent(v=1, job="llm", ts=1.0, phase="startup", **fields))
    assert len(payload) < MAX_PAYLOAD_BYTES
    assert decode(PhaseEvent, payload).node_names() == nodes
    few = nodes[:50]
    assert sum(len(n) + 3 for n in few) <= NODE_LIST_MAX_BYTES
    assert job_nodes_fields(few) == {"nodes": few}
    assert job_nodes_fields(None) == {}


def startup(hostlist: str, **extra: object) -> bytes:
    """A startup announcement as anyone may write it, unchecked."""
    doc = {"v": 1, "job": "j", "ts": 1.0, "phase": "startup", "hostlist": hostlist, **extra}
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("hostlist", "extra", "why"),
    [
        ("a[0-99999,0-99999]", {}, "too many names"),  # one bracket
        ("a[0-60000]b[0-60000]", {}, "too many names"),  # their product
        (",".join(["a[0-99999]"] * 2), {}, "too many names"),  # the list
        ("-bad[1-2]", {}, "not a node name"),
        ("n[1-3]", {"nodes": ["n1"]}, "together"),
        ("n[1-", {}, "unbalanced"),
        ("", {}, "length"),
    ],
)
def test_a_host_list_off_the_wire_is_refused_before_it_is_built(hostlist, extra, why):
    with pytest.raises(ProtocolError, match=why):
        decode(PhaseEvent, startup(hostlist, **extra))


def test_the_largest_range_a_payload_can_write_is_refused_and_said_briefly():
    """64 KiB of ranges (~6,500 brackets of 100,000 names each, 650 million in all) is
    refused at the first range past MAX_HOSTS, and the error quotes 80 characters of it."""
    body = ",".join(["0-99999"] * 8000)[: MAX_PAYLOAD_BYTES - 200]
    body = body[: body.rfind(",")]
    with pytest.raises(ProtocolError, match="too many names") as caught:
        decode(PhaseEvent, startup(f"n[{body}]"))
    assert len(str(caught.value)) < 300
    assert MAX_HOSTS == 100_000
