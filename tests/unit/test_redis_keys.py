"""The Redis store's key builder: only grammatical identifiers reach a key, every key of one
commit lands in one Redis Cluster slot, and run-index entries sort newest first, then by run id
(the order the SQL stores use), whatever the indexed value holds. Shards up to the shared limit
have distinct tags, the ones below 100 the two-digit tags keyspaces made before still use, and
a shard's lease is in its runs' slot. And the call group's plain command packer writes the same
bytes as hiredis and redis-py."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.crc import key_slot

from accord.adapters._redis_group import pack, pack_plain
from accord.adapters._store_rules import MAX_SHARDS
from accord.adapters.stores.redis.keys import (
    MAX_UPDATED_AT,
    StoreKeys,
    check_identifier,
    index_member,
    index_prefix,
    order_key,
    shard_tag,
)
from accord.engine.ports import shard_of
from accord.errors import StoreError

IDENTIFIER = re.compile(r"[A-Za-z0-9._@/+=-]{1,200}")
UNTIMED = settings(deadline=None)  # a loaded machine is no failure: no time limit per example


@UNTIMED
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


@UNTIMED
@given(st.from_regex(IDENTIFIER, fullmatch=True), st.integers(1, MAX_SHARDS))
def test_every_key_of_a_commit_is_in_one_cluster_slot(run_id: str, shards: int) -> None:
    assume(".." not in run_id.split("/"))
    store = StoreKeys("accord", shards)
    run = store.run(run_id)
    keys = run.commit_keys()
    assert len(keys) == 9 and keys[-1] == run.shard.lease  # the fence's lease is read there too
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert store.shard_of(run_id) == shard_of(run_id, shards)  # the engine's shard is the keys'
    assert run.shard is store.shards[shard_of(run_id, shards)]


def test_shard_tags_keep_their_old_names_below_100_and_stay_distinct_up_to_the_limit() -> None:
    keys = StoreKeys("P", MAX_SHARDS)
    assert [s.tag for s in keys.shards[:3]] == ["P:{s00}", "P:{s01}", "P:{s02}"]
    assert keys.shards[7].lease == "P:{s07}:lease" and keys.shards[99].outbox == "P:{s99}:obx"
    assert keys.shards[100].tag == "P:{s100}" and keys.shards[200].timers == "P:{s200}:tmr"
    assert keys.shards[MAX_SHARDS - 1].tag == f"P:{{s{MAX_SHARDS - 1}}}"
    assert len({s.tag for s in keys.shards}) == MAX_SHARDS
    assert shard_tag("P", 7) == keys.shards[7].tag
    assert keys.engines == "P:engines"  # its own key, outside every shard's slot


@pytest.mark.parametrize("count", [0, MAX_SHARDS + 1])
def test_a_shard_count_outside_the_limit_is_refused(count: int) -> None:
    with pytest.raises(StoreError, match=f"expected 1..{MAX_SHARDS}"):
        StoreKeys("P", count)


@UNTIMED
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


@UNTIMED
@given(
    st.lists(
        st.text() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.binary(),
        min_size=1,
        max_size=12,
    )
)
def test_the_plain_command_packer_writes_what_hiredis_and_redis_py_write(
    args: list[str | int | float | bytes],
) -> None:
    """The store's fallback packer (used without hiredis) against redis-py's, and against the
    packer in use (hiredis's when installed), on every kind of argument the scripts are given."""
    assume(all(not isinstance(a, str) or _encodes(a) for a in args))
    packed = pack_plain(args)
    assert packed == pack(args)
    command = [b"EVALSHA", *args]  # redis-py splits a first argument on spaces: give it none
    assert pack_plain(command) == b"".join(Connection().pack_command(*command))


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
