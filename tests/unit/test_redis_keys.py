"""The Redis store's key builder: only grammatical identifiers reach a key, every key of one
commit lands in one Redis Cluster slot, and run-index entries sort newest first, then by run id
(the order the SQL stores use), whatever the indexed value holds."""

from __future__ import annotations

import re

from hypothesis import assume, given
from hypothesis import strategies as st
from redis.crc import key_slot

from accord.adapters.stores.redis.keys import (
    MAX_UPDATED_AT,
    StoreKeys,
    check_identifier,
    index_member,
    index_prefix,
    order_key,
)
from accord.errors import StoreError

IDENTIFIER = re.compile(r"[A-Za-z0-9._@/+=-]{1,200}")


@given(st.text(max_size=210) | st.from_regex(IDENTIFIER, fullmatch=True))
def test_only_grammatical_identifiers_reach_a_key(value: str) -> None:
    grammatical = IDENTIFIER.fullmatch(value) is not None and ".." not in value.split("/")
    try:
        check_identifier(value, "run id")
    except StoreError:
        assert not grammatical
    else:
        assert grammatical
        assert not set(value) & set(":{}* \n\r\t") and len(value) <= 200


@given(st.from_regex(IDENTIFIER, fullmatch=True), st.integers(1, 64))
def test_every_key_of_a_commit_is_in_one_cluster_slot(run_id: str, shards: int) -> None:
    assume(".." not in run_id.split("/"))
    keys = StoreKeys("accord", shards).run(run_id).commit_keys()
    assert len({key_slot(k.encode()) for k in keys}) == 1


@given(
    st.lists(
        st.tuples(st.integers(0, MAX_UPDATED_AT), st.from_regex(IDENTIFIER, fullmatch=True)),
        min_size=2,
        max_size=20,
    ),
    st.text(min_size=0, max_size=8),
)
def test_index_entries_sort_newest_first_then_by_run_id(
    runs: list[tuple[int, str]], value: str
) -> None:
    members = {index_member("status", value, order_key(at), rid): (at, rid) for at, rid in runs}
    by_bytes = [members[m] for m in sorted(members, key=lambda m: m.encode())]
    assert by_bytes == sorted(members.values(), key=lambda r: (-r[0], r[1]))
    assert all(m.startswith(index_prefix("status", value)) for m in members)
