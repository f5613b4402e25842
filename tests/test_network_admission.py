"""Admission policy (limits, CIDR rules, callback, key allowlist, tags) and the seed's id allocator."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.client.allocation import AllocationError, IdAllocator
from slipstream.echo.messages import PortAllocator as EchoPortAllocator
from slipstream.network import admission
from slipstream.network.admission import AdmissionPolicy, IpFilterRule, RejectReason

KEY = bytes(range(32))


def test_reject_reasons_have_values_and_messages() -> None:
    assert [int(r) for r in RejectReason] == list(range(1, 9))
    assert RejectReason.SERVER_FULL.message == "the server is full"
    assert all(reason.message for reason in RejectReason)


def test_allocators_are_the_shared_ones_not_copies() -> None:
    assert admission.PortAllocator is EchoPortAllocator
    assert admission.IdAllocator is IdAllocator


@pytest.mark.parametrize(
    ("rule", "inside", "outside"),
    [
        ("10.0.0.0/8", "10.200.3.4", "11.0.0.1"),
        ("192.168.1.7", "192.168.1.7", "192.168.1.8"),
        ("0.0.0.0/0", "8.8.8.8", "::1"),
        ("127.0.0.1/32", "::ffff:127.0.0.1", "::1"),
        ("fd00::/8", "fd12:3456::1", "fe80::1"),
        ("::1/128", "::1", "127.0.0.1"),
        ("::/0", "2001:db8::1", "10.0.0.1"),
        ("fe80::/10", "fe80::1%eth0", "not-an-address"),
    ],
)
def test_cidr_rules(rule: str, inside: str, outside: str) -> None:
    assert IpFilterRule(rule).matches(inside)
    assert not IpFilterRule(rule).matches(outside)


def test_bad_rule_names_the_text() -> None:
    with pytest.raises(ValueError, match=r"10\.0\.0\.0/33"):
        IpFilterRule("10.0.0.0/33")


def test_check_order_and_limits() -> None:
    policy = AdmissionPolicy(max_clients=3, max_connections_per_address=2)
    assert policy.check("10.0.0.1", "tag", KEY, 0, 0) is None
    assert policy.check("10.0.0.1", "tag", KEY, 2, 2) is RejectReason.TOO_MANY_FOR_ADDRESS
    assert policy.check("10.0.0.1", "tag", KEY, 3, 0) is RejectReason.SERVER_FULL
    assert policy.check("10.0.0.1", "tag", KEY, 3, 2) is RejectReason.SERVER_FULL  # full is checked first
    assert policy.check(None, "tag", KEY, 2, 5) is None  # IPC has no address to count
    for loopback in ("127.0.0.1", "127.8.0.1", "::1", "::ffff:127.0.0.1"):  # exempt, as in the seed
        assert policy.check(loopback, "tag", KEY, 2, 2) is None
        assert policy.check(loopback, "tag", KEY, 3, 3) is RejectReason.SERVER_FULL
    assert AdmissionPolicy(max_clients=5).max_connections_per_address == 5


def test_rules_filter_ip_but_never_ipc() -> None:
    policy = AdmissionPolicy(rules=[IpFilterRule("127.0.0.0/8"), IpFilterRule("::1")])
    assert policy.check("127.0.0.1", "", KEY, 0, 0) is None
    assert policy.check("::1", "", KEY, 0, 0) is None
    assert policy.check("10.1.1.1", "", KEY, 0, 0) is RejectReason.NOT_PERMITTED
    assert policy.check(None, "", KEY, 0, 0) is None
    assert AdmissionPolicy().check("203.0.113.9", "", KEY, 0, 0) is None  # no rules: everyone


def test_filter_callback_and_its_exceptions() -> None:
    seen: list[tuple[str | None, str]] = []

    def only_tag_ok(address: str | None, tag: str) -> bool:
        seen.append((address, tag))
        if tag == "boom":
            raise RuntimeError("user bug")
        return tag == "ok"

    policy = AdmissionPolicy(filter_callback=only_tag_ok)
    assert policy.check("10.0.0.1", "ok", KEY, 0, 0) is None
    assert policy.check("10.0.0.1", "no", KEY, 0, 0) is RejectReason.NOT_PERMITTED
    assert policy.check(None, "boom", KEY, 0, 0) is RejectReason.NOT_PERMITTED
    assert policy.callback_errors == 1 and seen[-1] == (None, "boom")


def test_key_allowlist_and_tags() -> None:
    other = bytes(32)
    policy = AdmissionPolicy(allowed_keys=[KEY], max_tag_length=4)
    assert policy.check("10.0.0.1", "abcd", KEY, 0, 0) is None
    assert policy.check("10.0.0.1", "abcd", other, 0, 0) is RejectReason.KEY_NOT_ALLOWED
    assert policy.check("10.0.0.1", "abcde", KEY, 0, 0) is RejectReason.BAD_TAG
    assert policy.check("10.0.0.1", "a\nb", KEY, 0, 0) is RejectReason.BAD_TAG


def test_policy_arguments_checked() -> None:
    with pytest.raises(ValueError, match="max_clients"):
        AdmissionPolicy(max_clients=0)
    with pytest.raises(ValueError, match="max_connections_per_address"):
        AdmissionPolicy(max_connections_per_address=-1)


# -- IdAllocator (the seed's semantics) ---------------------------------------------------------------


def test_ids_cover_the_range_in_random_order_then_run_out() -> None:
    allocator = IdAllocator(1, 200, random.Random(3))
    ids = [allocator.allocate() for _ in range(200)]
    assert sorted(ids) == list(range(1, 201))
    assert ids != sorted(ids)
    assert allocator.available == 0 and len(allocator) == 200
    with pytest.raises(AllocationError, match=r"no ids left in \[1, 200\]"):
        allocator.allocate()


def test_freed_ids_are_reused_first_in_first_out() -> None:
    allocator = IdAllocator(1, 5)
    ids = [allocator.allocate() for _ in range(5)]
    for value in (ids[3], ids[0], ids[4]):
        allocator.free(value)
    assert [allocator.allocate() for _ in range(3)] == [ids[3], ids[0], ids[4]]


def test_over_free_and_foreign_free_raise() -> None:
    allocator = IdAllocator(10, 20)
    value = allocator.allocate()
    allocator.free(value)
    with pytest.raises(AllocationError, match="freed twice or never allocated"):
        allocator.free(value)
    with pytest.raises(AllocationError):
        allocator.free(99)
    assert allocator.in_use == frozenset()


def test_bad_ranges() -> None:
    with pytest.raises(ValueError):
        IdAllocator(5, 4)
    huge = IdAllocator(-(2**31), 2**31 - 1)  # construction is O(1): the shuffle is lazy
    assert -(2**31) <= huge.allocate() < 2**31 and huge.available == 2**32 - 1
    assert IdAllocator(1, 65534).available == 65534


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1000)), max_size=100))
def test_allocator_invariants(operations: list[tuple[bool, int]]) -> None:
    allocator = IdAllocator(1, 20)
    held: list[int] = []
    for allocate, pick in operations:
        if allocate:
            if allocator.available:
                value = allocator.allocate()
                assert value not in held and 1 <= value <= 20
                held.append(value)
            else:
                with pytest.raises(AllocationError):
                    allocator.allocate()
        elif held:
            allocator.free(held.pop(pick % len(held)))
        assert allocator.in_use == frozenset(held)
        assert allocator.available + len(held) == 20


def test_a_freed_id_waits_behind_the_never_used_ones() -> None:
    allocator = IdAllocator(1, 10)
    first = allocator.allocate()
    allocator.free(first)
    fresh = [allocator.allocate() for _ in range(9)]
    assert first not in fresh and sorted([first, *fresh]) == list(range(1, 11))
    assert allocator.allocate() == first
