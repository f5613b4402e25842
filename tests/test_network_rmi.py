"""RMI: the sans-I/O endpoint pair in memory, hostile peers, and the awaitable proxies over an in-memory loop."""

from __future__ import annotations

import asyncio
import functools
import struct
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.client.allocation import IdAllocator
from slipstream.network.aio.rmi import Proxy
from slipstream.network.frames import FrameKind
from slipstream.network.rmi import (
    FileRef,
    InterfaceError,
    ObjectIdInUse,
    ObjectTable,
    ProxyBase,
    RemoteError,
    RemoteObjectMissing,
    RemoteRef,
    RmiCallCompleted,
    RmiCallFailed,
    RmiCallTimeout,
    RmiConnectionClosed,
    RmiEndpoint,
    RmiFailure,
    RmiObjectReceived,
    RmiOnewayFailed,
    RmiRegistry,
    RmiRequestRefused,
    exception_from,
)
from slipstream.network.serialization import Serialization
from slipstream.testing import AsyncConnectionPair, RmiPair, async_test, deliver

# -- interfaces and implementations --------------------------------------------------------------------


class Point(msgspec.Struct):
    x: int
    y: int


class CalcError(Exception):
    """A registered exception type: re-raised as itself."""


class Unregistered(Exception):
    """Not registered: arrives as RemoteError."""


class ICalc(Protocol):
    def add(self, a: int, b: int) -> int: ...

    def move(self, p: Point, dx: int = 1) -> Point: ...

    def fail(self, message: str) -> None: ...

    def fail_unregistered(self, message: str) -> None: ...

    async def slow(self, ms: int) -> int: ...

    def whoami(self) -> str: ...

    def bump(self) -> None: ...

    def count(self) -> int: ...

    def _private(self) -> None: ...


class ICounter(ABC):
    @abstractmethod
    def increment(self, by: int) -> int: ...

    @abstractmethod
    def value(self) -> int: ...


class IFactory(Protocol):
    def make_counter(self, start: int) -> ICounter: ...

    def total(self, counter: ICounter) -> int: ...

    def echo(self, counter: ICounter | None) -> ICounter | None: ...


class Calc:
    def __init__(self) -> None:
        self.bumps = 0
        self.secret = "not reachable"

    def add(self, a: int, b: int) -> int:
        return a + b

    def move(self, p: Point, dx: int = 1) -> Point:
        return Point(p.x + dx, p.y)

    def fail(self, message: str) -> None:
        raise CalcError(message)

    def fail_unregistered(self, message: str) -> None:
        raise Unregistered(message)

    async def slow(self, ms: int) -> int:
        await asyncio.sleep(ms / 1000)
        return ms

    def whoami(self, connection: object) -> str:
        return str(connection)

    def bump(self) -> None:
        self.bumps += 1

    def count(self) -> int:
        return self.bumps

    def _private(self) -> None:
        raise AssertionError("never callable remotely")

    def __reduce__(self) -> Any:
        raise AssertionError("never callable remotely")


class Counter(ICounter):
    def __init__(self, start: int = 0) -> None:
        self.current = start

    def increment(self, by: int) -> int:
        self.current += by
        return self.current

    def value(self) -> int:
        return self.current


class Factory:
    def make_counter(self, start: int) -> ICounter:
        return Counter(start)

    def total(self, counter: ICounter) -> int:
        # on the host a proxy arrives when the caller hosts the counter; a real Counter when we do
        assert isinstance(counter, Counter), counter
        return counter.value()

    def echo(self, counter: ICounter | None) -> ICounter | None:
        return counter


MESSAGES = Serialization([Point])
INTERFACES_NO_IMPL: list[Any] = [ICalc, ICounter, IFactory]


@functools.cache
def registries() -> tuple[RmiRegistry, RmiRegistry]:
    """(client: hosts counters only, server: hosts everything)."""
    client = RmiRegistry([ICalc, (ICounter, Counter), IFactory], messages=MESSAGES, exceptions=[CalcError])
    server = RmiRegistry(
        [(ICalc, Calc), (ICounter, Counter), (IFactory, Factory)], messages=MESSAGES, exceptions=[CalcError]
    )
    return client, server


class Pair(RmiPair):
    """The client (hosts counters only) and the server (hosts everything, global objects too)."""

    def __init__(self, *, pool: IdAllocator | None = None) -> None:
        client_registry, server_registry = registries()
        self.globals = ObjectTable(server_registry, is_global=True)
        super().__init__(
            client_registry, server_registry, global_objects=self.globals, response_ids=pool, caller="conn-1"
        )


# -- registration ---------------------------------------------------------------------------------------


def test_interface_methods_by_sorted_name_without_private_names() -> None:
    client, server = registries()
    spec = client.interface(ICalc)
    assert [m.name for m in spec.methods] == sorted(
        ["add", "move", "fail", "fail_unregistered", "slow", "whoami", "bump", "count"]
    )
    assert [m.index for m in spec.methods] == list(range(len(spec.methods)))
    assert client.description() == server.description()
    assert client.fingerprint() == server.fingerprint()
    assert client.first_difference(server.description()) is None


def test_registration_differences_are_named() -> None:
    client, _ = registries()
    other = RmiRegistry([ICalc, IFactory, (ICounter, Counter)], messages=MESSAGES, exceptions=[CalcError])
    text = client.first_difference(other.description())
    assert text is not None and "ICounter" in text
    fewer = RmiRegistry([ICalc], messages=MESSAGES, exceptions=[CalcError])
    assert "3 RMI interfaces" in (client.first_difference(fewer.description()) or "")
    assert client.first_difference(b"\xc1garbage") == "the remote's RMI registration list is malformed"


def test_bad_registrations_are_refused_with_clear_errors() -> None:
    class NoAnnotation(Protocol):
        def f(self, x) -> int: ...  # type: ignore[no-untyped-def]

    class NotRegisteredType(Protocol):
        def f(self, x: Unregistered) -> int: ...

    class Nested(Protocol):
        def f(self, x: list[ICounter]) -> int: ...

    class Empty(Protocol):
        def _hidden(self) -> None: ...

    class Varargs(Protocol):
        def f(self, *x: int) -> int: ...

    with pytest.raises(InterfaceError, match="parameter x needs a type annotation"):
        RmiRegistry([NoAnnotation])
    with pytest.raises(InterfaceError, match="Unregistered is neither a builtin nor a registered message type"):
        RmiRegistry([NotRegisteredType])
    with pytest.raises(InterfaceError, match="not nested"):
        RmiRegistry([ICounter, Nested])
    with pytest.raises(InterfaceError, match="no public methods"):
        RmiRegistry([Empty])
    with pytest.raises(InterfaceError, match="positional"):
        RmiRegistry([Varargs])
    with pytest.raises(InterfaceError, match="registered twice"):
        RmiRegistry([ICalc, ICalc], messages=MESSAGES)

    class Incomplete:
        def increment(self, by: int) -> int:
            return by

    with pytest.raises(InterfaceError, match=r"does not implement ICounter\.value"):
        RmiRegistry([(ICounter, Incomplete)])

    class TooMany:
        def increment(self, a: int, b: int, c: int) -> int:
            return a

        def value(self) -> int:
            return 0

    with pytest.raises(InterfaceError, match="one more is allowed"):
        RmiRegistry([(ICounter, TooMany)])


# -- object tables --------------------------------------------------------------------------------------


def test_object_table_ids_follow_the_seed() -> None:
    _, server = registries()
    table = ObjectTable(server)
    calc = Calc()
    first = table.save(calc)
    assert 1 <= first <= 65535
    assert table.save(calc) == first
    with pytest.raises(ObjectIdInUse):
        table.save(calc, first + 1)
    with pytest.raises(ObjectIdInUse, match="outside"):
        table.save(Calc(), 0)
    with pytest.raises(ObjectIdInUse, match="outside"):
        table.save(Calc(), 65536)
    with pytest.raises(ObjectIdInUse, match="holds another"):
        table.save(Calc(), first)
    assert table.save(Counter(), 65535) == 65535
    with pytest.raises(InterfaceError, match="not a registered implementation"):
        table.save(object())
    assert table.get(first) is calc and table.id_of(calc) == first
    assert table.delete(first) and not table.delete(first)
    assert table.delete(table.get(65535)) and len(table) == 0
    # automatic ids cycle: the id just deleted is not handed out next
    assert table.save(Calc()) != first


def test_automatic_ids_fill_the_whole_range_then_refuse() -> None:
    _, server = registries()
    table = ObjectTable(server)
    ids = {table.save(Counter()) for _ in range(65535)}
    assert ids == set(range(1, 65536))
    with pytest.raises(ObjectIdInUse, match="all 65535"):
        table.save(Counter())


def test_two_connections_save_different_objects_under_the_same_id() -> None:
    a, b = Pair(), Pair()
    a.server.objects.save(Counter(10), 7)
    b.server.objects.save(Counter(20), 7)
    ref = RemoteRef(a.client_registry.interface(ICounter).interface_id, 7)
    assert a.result(a.client.call(ref, "value", [], 0)) == 10
    assert b.result(b.client.call(ref, "value", [], 0)) == 20


# -- calls ----------------------------------------------------------------------------------------------


def calc_ref(pair: Pair, *, is_global: bool = False) -> RemoteRef:
    table = pair.globals if is_global else pair.server.objects
    object_id = table.save(Calc())
    return RemoteRef(pair.client_registry.interface(ICalc).interface_id, object_id, is_global)


def test_calls_return_results_and_registered_messages() -> None:
    pair = Pair()
    ref = calc_ref(pair)
    assert pair.result(pair.client.call(ref, "add", [2, 3], 0)) == 5
    move = pair.client_registry.interface(ICalc).by_name["move"]
    assert pair.result(pair.client.call(ref, move, move.bind([Point(1, 2)]), 0)) == Point(2, 2)
    assert pair.result(pair.client.call(ref, "whoami", [], 0)) == "conn-1"
    assert pair.client.in_flight == 0


def test_global_and_connection_scopes_are_separate() -> None:
    pair = Pair()
    global_ref = calc_ref(pair, is_global=True)
    assert pair.result(pair.client.call(global_ref, "add", [1, 1], 0)) == 2
    with pytest.raises(RemoteObjectMissing, match=f"remote object {global_ref.object_id} \\(connection-scoped\\)"):
        pair.result(pair.client.call(RemoteRef(global_ref.interface_id, global_ref.object_id), "add", [1, 1], 0))


def test_remote_exceptions_registered_and_not() -> None:
    pair = Pair()
    pair.server.tracebacks = True  # (the server's rmi_tracebacks; off by default: see the next test)
    ref = calc_ref(pair)
    with pytest.raises(CalcError, match="bad input") as info:
        pair.result(pair.client.call(ref, "fail", ["bad input"], 0))
    assert "in fail" in info.value.remote_traceback  # type: ignore[attr-defined]
    with pytest.raises(RemoteError) as remote:
        pair.result(pair.client.call(ref, "fail_unregistered", ["nope"], 0))
    assert remote.value.type_name == "Unregistered"
    assert remote.value.message == "nope"
    assert "raise Unregistered(message)" in remote.value.traceback_text


def test_remote_exceptions_carry_no_traceback_unless_the_host_opts_in() -> None:
    pair = Pair()
    ref = calc_ref(pair)
    with pytest.raises(RemoteError) as remote:
        pair.result(pair.client.call(ref, "fail_unregistered", ["nope"], 0))
    assert (remote.value.type_name, remote.value.message, remote.value.traceback_text) == ("Unregistered", "nope", "")
    with pytest.raises(CalcError, match="bad input") as info:
        pair.result(pair.client.call(ref, "fail", ["bad input"], 0))
    assert info.value.remote_traceback == ""  # type: ignore[attr-defined]


def test_missing_object_names_the_id() -> None:
    pair = Pair()
    ref = RemoteRef(pair.client_registry.interface(ICalc).interface_id, 4242)
    with pytest.raises(RemoteObjectMissing, match="remote object 4242"):
        pair.result(pair.client.call(ref, "add", [1, 2], 0))
    assert pair.server.stats.objects_missing == 1


def test_bad_arguments_fail_on_the_caller_side() -> None:
    pair = Pair()
    ref = calc_ref(pair)
    with pytest.raises(InterfaceError, match="has no method 'secret'"):
        pair.client.call(ref, "secret", [], 0)
    with pytest.raises(InterfaceError, match="takes 2 arguments"):
        pair.client.call(ref, "add", [1], 0)
    with pytest.raises(InterfaceError, match="missing a required argument"):
        pair.client_registry.interface(ICalc).by_name["add"].bind([1])
    with pytest.raises(ValueError, match="negative"):
        pair.client.call(ref, "add", [1, 2], 0, timeout_ns=-1)
    assert pair.client.in_flight == 0


def test_fire_and_forget_sends_no_response_and_reports_host_failures() -> None:
    pair = Pair()
    ref = calc_ref(pair)
    for _ in range(10):
        assert pair.client.call(ref, "bump", [], 0, oneway=True) == 0
    assert pair.client.call(ref, "fail", ["x"], 0, oneway=True) == 0
    frames = pair.client.take_frames()
    assert {request_id for _, request_id, _ in frames} == {1}
    for frame in frames:
        deliver(pair.server, *frame)
    assert pair.server.take_frames() == []
    calc = pair.server.objects.get(ref.object_id)
    assert isinstance(calc, Calc) and calc.bumps == 10
    (failed,) = pair.server.take_events()
    assert isinstance(failed, RmiOnewayFailed) and failed.type_name == "CalcError" and failed.method == "ICalc.fail"
    assert pair.client.in_flight == 0


def test_timeouts_are_deadlines_and_late_responses_are_dropped() -> None:
    pair = Pair()
    ref = calc_ref(pair)
    call_id = pair.client.call(ref, "add", [1, 2], 1_000, timeout_ns=500)
    forever = pair.client.call(ref, "add", [3, 4], 1_000, timeout_ns=0)
    assert pair.client.deadline_ns == 1_500
    pair.client.handle_timer(1_499)
    assert pair.client.take_events() == []
    pair.client.handle_timer(1_500)
    (event,) = pair.client.take_events()
    assert isinstance(event, RmiCallFailed) and event.failure == RmiFailure.TIMED_OUT and event.call_id == call_id
    exc = exception_from(event, pair.client_registry)
    assert isinstance(exc, RmiCallTimeout) and isinstance(exc, TimeoutError) and "ICalc.add" in str(exc)
    assert pair.client.deadline_ns is None
    pair.flush()  # the late response to the timed-out call is dropped; the other completes
    assert [e.value for e in pair.client_events if isinstance(e, RmiCallCompleted)] == [7]
    assert [e.call_id for e in pair.client_events] == [forever]
    assert pair.client.stats.responses_dropped == 1


def test_close_fails_calls_in_flight_at_once_and_frees_every_id() -> None:
    pool = IdAllocator(2, 65535)
    pair = Pair(pool=pool)
    ref = calc_ref(pair)
    calls = [pair.client.call(ref, "add", [i, i], 0) for i in range(50)]
    assert len(pool.in_use) == 50
    pair.client.close("peer vanished")
    events = pair.client.take_events()
    assert [e.call_id for e in events] == calls
    assert all(isinstance(e, RmiCallFailed) and e.failure == RmiFailure.CLOSED for e in events)
    exc = exception_from(events[0], pair.client_registry)  # type: ignore[arg-type]
    assert isinstance(exc, RmiConnectionClosed) and "peer vanished" in str(exc)
    assert len(pool.in_use) == 0 and pair.client.take_frames() == []
    with pytest.raises(RmiConnectionClosed):
        pair.client.call(ref, "add", [1, 2], 0)


@pytest.mark.parametrize("size", [3, 1000, 65534])
def test_response_pools_complete_131070_callbacks(size: int) -> None:
    """The seed's response-manager battery: a pool of ``size`` ids, kept full, completes 131,070 calls."""
    pool = IdAllocator(2, 2 + size - 1)
    pair = Pair(pool=pool)
    ref = calc_ref(pair)
    add = pair.client_registry.interface(ICalc).by_name["add"]
    total = 131_070
    sent = completed = 0
    checksum = 0
    client, server = pair.client, pair.server
    while completed < total:
        while sent < total and client.in_flight < size:
            client.call(ref, add, (sent, 1), 0)
            sent += 1
        assert client.in_flight <= size
        for _, request_id, payload in client.take_frames():
            invocation = server.receive_request(request_id, payload)
            assert invocation is not None
            server.execute(invocation)
        for _, request_id, payload in server.take_frames():
            client.receive_response(request_id, payload)
        for event in client.take_events():
            assert isinstance(event, RmiCallCompleted)
            checksum += event.value  # type: ignore[operator]
            completed += 1
    assert completed == total
    assert checksum == sum(range(total)) + total
    assert len(pool.in_use) == 0 and pool.available == size


def test_remote_construction_and_nested_objects() -> None:
    pair = Pair()
    create = pair.client.create(IFactory, [], 0)
    factory_ref = pair.result(create)
    assert isinstance(factory_ref, RemoteRef) and factory_ref.object_id in pair.server.objects
    counter_ref = pair.result(pair.client.call(factory_ref, "make_counter", [5], 0))
    assert isinstance(counter_ref, RemoteRef)
    assert pair.result(pair.client.call(counter_ref, "increment", [3], 0)) == 8
    # a create with constructor arguments, a failing constructor, and one with no implementation there
    counter2 = pair.result(pair.client.create(ICounter, [41], 0))
    assert pair.result(pair.client.call(counter2, "increment", [1], 0)) == 42
    with pytest.raises(TypeError):
        pair.result(pair.client.create(ICounter, ["a", "b", "c"], 0))
    reverse = RmiEndpoint(pair.server_registry)
    reverse.create(ICalc, [], 0)
    for kind, request_id, payload in reverse.take_frames():
        deliver(pair.client, kind, request_id, payload)
    for kind, request_id, payload in pair.client.take_frames():
        deliver(reverse, kind, request_id, payload)
    (refused,) = reverse.take_events()
    assert isinstance(refused, RmiCallFailed) and refused.failure == RmiFailure.REFUSED
    assert "no implementation of ICalc" in refused.message


def test_implementations_by_value_arrive_as_proxies_and_proxies_come_home() -> None:
    pair = Pair()
    factory = RemoteRef(pair.client_registry.interface(IFactory).interface_id, pair.server.objects.save(Factory()))
    mine = Counter(11)
    # the client's own Counter goes as a reference: the server gets a RemoteRef (a proxy), echoes it,
    # and the client gets its real object back
    echoed = pair.result(pair.client.call(factory, "echo", [mine], 0))
    assert echoed is mine
    assert pair.client.objects.id_of(mine) is not None
    assert pair.result(pair.client.call(factory, "echo", [None], 0)) is None
    # a server object sent back as the proxy we hold arrives as the real object on the server
    counter_ref = pair.result(pair.client.call(factory, "make_counter", [3], 0))

    proxy = ProxyBase(pair.client, counter_ref)
    assert pair.result(pair.client.call(factory, "total", [proxy], 0)) == 3
    with pytest.raises(InterfaceError, match="not a registered implementation of ICounter"):
        pair.client.call(factory, "total", [Calc()], 0)
    other = ProxyBase(RmiEndpoint(pair.client_registry), counter_ref)
    with pytest.raises(InterfaceError, match="over the connection it came from"):
        pair.client.call(factory, "total", [other], 0)


# -- hostile peers --------------------------------------------------------------------------------------

REQUEST = struct.Struct(">BHHH")


def hostile(pair: Pair, request_id: int, payload: bytes) -> bytes:
    """Send a forged request straight to the server; returns its response payload."""
    assert pair.server.receive_request(request_id, payload) is None
    ((kind, rid, response),) = pair.server.take_frames()
    assert kind == FrameKind.RMI_RESPONSE and rid == request_id
    return response


def test_hostile_requests_get_error_responses_and_the_host_keeps_serving() -> None:
    pair = Pair()
    ref = calc_ref(pair)
    calc_id = ref.interface_id
    n_methods = len(pair.server_registry.interface(ICalc).methods)
    args = msgspec.msgpack.encode([1, 2])
    cases = {
        "unknown interface": REQUEST.pack(0, ref.object_id, 999, 0) + args,
        "unknown method index": REQUEST.pack(0, ref.object_id, calc_id, n_methods) + args,
        "huge method index": REQUEST.pack(0, ref.object_id, calc_id, 65535) + args,
        "unknown flags": REQUEST.pack(0x80, ref.object_id, calc_id, 0) + args,
        "wrong argument types": REQUEST.pack(0, ref.object_id, calc_id, 0) + msgspec.msgpack.encode(["a", {}]),
        "too many arguments": REQUEST.pack(0, ref.object_id, calc_id, 0) + msgspec.msgpack.encode([1, 2, 3]),
        "garbage arguments": REQUEST.pack(0, ref.object_id, calc_id, 0) + b"\xc1\xff",
        "truncated header": b"\x00\x01",
        "interface not served": REQUEST.pack(0, ref.object_id, pair.server_registry.interface(ICounter).interface_id, 0)
        + msgspec.msgpack.encode([1]),
        "create with garbage": REQUEST.pack(2, 0, calc_id, 0) + b"\x93\x01",
    }
    for index, (name, payload) in enumerate(cases.items()):
        response = hostile(pair, (index + 1) << 16 | 2, payload)
        assert response[0] == 4, name  # REFUSED
    missing = hostile(pair, 5 << 20 | 3, REQUEST.pack(0, 999, calc_id, 0) + args)
    assert missing[0] == 3  # MISSING
    assert pair.server.stats.requests_refused == len(cases)
    # "private", dunder and non-interface names are not addressable: the method table is the interface's
    spec = pair.server_registry.interface(ICalc)
    assert not any(m.name.startswith("_") or m.name in ("secret", "__reduce__") for m in spec.methods)
    # a response id below 2 is no valid call token
    assert hostile(pair, 0, REQUEST.pack(0, ref.object_id, calc_id, 0) + args)[0] == 4
    calc = pair.server.objects.get(ref.object_id)
    assert isinstance(calc, Calc) and calc.bumps == 0
    assert pair.result(pair.client.call(ref, "add", [20, 22], 0)) == 42


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 2**32 - 1))
def test_random_requests_never_escape(payload: bytes, request_id: int) -> None:
    pair = Pair()
    pair.server.objects.save(Calc(), 1)
    invocation = pair.server.receive_request(request_id, payload)
    if invocation is not None:
        pair.server.execute(invocation)
    pair.server.take_frames()
    pair.server.take_events()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_responses_fail_the_call_never_the_endpoint(payload: bytes) -> None:
    pair = Pair()
    ref = calc_ref(pair)
    call_id = pair.client.call(ref, "move", [Point(1, 1), 1], 0)
    pair.client.receive_response(call_id, payload)
    events = pair.client.take_events()
    if payload:
        (event,) = events
        assert event.call_id == call_id  # type: ignore[union-attr]
    assert pair.client.in_flight == (0 if payload else 1)


def test_replayed_and_forged_responses_are_dropped_and_counted() -> None:
    pair = Pair()
    ref = calc_ref(pair)
    pair.client.call(ref, "add", [1, 2], 0)
    deliver(pair.server, *pair.client.take_frames()[0])
    ((_, rid, response),) = pair.server.take_frames()
    pair.client.receive_response(rid, response)
    pair.client.receive_response(rid, response)  # replay
    pair.client.receive_response(rid ^ 0x10000, response)  # another generation of the same id
    pair.client.receive_response(12345, response)  # never issued
    assert [type(e) for e in pair.client.take_events()] == [RmiCallCompleted]
    assert pair.client.stats.responses_dropped == 3
    # a new call that reuses the same response id is not completed by the old response
    pool = IdAllocator(2, 2)
    solo = Pair(pool=pool)
    solo_ref = calc_ref(solo)
    first = solo.client.call(solo_ref, "add", [1, 1], 0)
    deliver(solo.server, *solo.client.take_frames()[0])
    old = solo.server.take_frames()[0]
    solo.client.handle_timer(10**12)  # first times out; its id is freed
    solo.client.take_events()
    second = solo.client.call(solo_ref, "add", [2, 2], 0)
    assert second & 0xFFFF == first & 0xFFFF and second != first
    solo.client.receive_response(old[1], old[2])
    assert solo.client.take_events() == [] and solo.client.in_flight == 1


# -- awaitable proxies over an in-memory loop -------------------------------------------------------------


aio = async_test(60)


class AioPair(AsyncConnectionPair):
    """The registries of :class:`Pair` over two connection machines on the running loop."""

    def __init__(self, *, timeout: float = 3.0) -> None:
        client_registry, server_registry = registries()
        self.globals = ObjectTable(server_registry, is_global=True)
        self.errors: list[BaseException] = []
        super().__init__(
            client_registry,
            server_registry,
            global_objects=self.globals,
            timeout=timeout,
            callers=("client-connection", "server-connection"),
        )
        self.server.on_error = self.errors.append


@aio
async def test_awaited_calls_exceptions_and_the_connection_parameter() -> None:
    pair = AioPair()
    calc_id = pair.server.save(Calc())
    calc = pair.client.get(ICalc, calc_id)
    assert isinstance(calc, Proxy)
    assert await calc.add(1, 2) == 3
    assert await calc.move(Point(0, 0), dx=4) == Point(4, 0)
    assert await calc.whoami() == "server-connection"
    assert await calc.slow(5) == 5  # a coroutine method on the host
    with pytest.raises(CalcError, match="boom"):
        await calc.fail("boom")
    with pytest.raises(RemoteError, match="Unregistered: nope"):
        await calc.fail_unregistered("nope")
    with pytest.raises(RemoteObjectMissing, match="remote object 999"):
        await pair.client.get(ICalc, 999).add(1, 2)
    with pytest.raises(AttributeError, match="no remote method 'secret'"):
        calc.secret  # noqa: B018
    with pytest.raises(AttributeError, match="no remote method '_private'"):
        calc._private  # noqa: B018
    with pytest.raises(AttributeError):
        calc.anything = 1
    assert repr(calc) == f"<proxy ICalc:{calc_id}>"


@aio
async def test_timeouts_1000ms_vs_calls_of_200_and_2000ms() -> None:
    pair = AioPair()
    calc = pair.client.get(ICalc, pair.server.save(Calc()))
    calc.rmi_timeout = 1.0
    with pytest.raises(ValueError, match="negative"):
        calc.rmi_timeout = -1
    assert await asyncio.wait_for(calc.slow(200), 5) == 200
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RmiCallTimeout, match=r"ICalc\.slow") as info:
        await asyncio.wait_for(calc.slow(2000), 5)
    assert isinstance(info.value, TimeoutError)
    assert 0.9 <= loop.time() - started < 1.8
    calc.rmi_timeout = 0  # forever
    assert calc.rmi_timeout == 0
    assert await asyncio.wait_for(calc.slow(30), 5) == 30
    assert pair.client.endpoint.in_flight == 0


@aio
async def test_4000_awaited_calls_count_exactly_and_100_delayed_calls_on_a_global_object() -> None:
    pair = AioPair()
    calc = Calc()
    global_id = pair.globals.save(calc)
    proxy = pair.client.get_global(ICalc, global_id)
    await asyncio.wait_for(asyncio.gather(*(proxy.bump() for _ in range(4000))), 30)
    assert calc.bumps == 4000
    assert await proxy.count() == 4000
    results = await asyncio.wait_for(asyncio.gather(*(proxy.slow(10) for _ in range(100))), 10)
    assert results == [10] * 100
    assert pair.client.endpoint.in_flight == 0


@aio
async def test_fire_and_forget_calls_all_arrive_and_never_raise() -> None:
    pair = AioPair()
    calc = Calc()
    proxy = pair.client.get(ICalc, pair.server.save(calc))
    oneway = proxy.rmi_async()  # type: ignore[attr-defined]
    n = 50_000
    for _ in range(n):
        oneway.bump()
    oneway.fail("reported on the host, not raised here")
    await oneway.bump()  # awaiting a fire-and-forget call is allowed and returns at once
    assert await asyncio.wait_for(proxy.count(), 10) == n + 1
    assert len(pair.errors) == 1 and "CalcError" in str(pair.errors[0])
    pair.close("connection closed")
    oneway.bump()  # closed: dropped, never raises


@aio
async def test_nested_objects_created_remotely_and_sent_back() -> None:
    pair = AioPair()
    factory = await pair.client.create(IFactory)
    counter = await factory.make_counter(5)
    assert isinstance(counter, Proxy)
    assert await counter.increment(2) == 7
    assert await factory.total(counter) == 7  # the proxy arrives at its host as the real Counter
    direct = await pair.client.create(ICounter, 100)
    assert await direct.increment(1) == 101
    mine = Counter(1)
    assert await factory.echo(mine) is mine  # by value it went as a proxy and came back as itself


@aio
async def test_closing_fails_in_flight_calls_at_once() -> None:
    pair = AioPair(timeout=0)
    calc = pair.client.get(ICalc, pair.server.save(Calc()))
    calls = [asyncio.ensure_future(calc.slow(10_000)) for _ in range(5)]
    await asyncio.sleep(0.01)
    pair.close("connection lost")
    for call in calls:
        with pytest.raises(RmiConnectionClosed, match="connection lost"):
            await asyncio.wait_for(call, 1)
    with pytest.raises(RmiConnectionClosed):
        await calc.add(1, 2)
    assert pair.client.endpoint.in_flight == 0


def test_refused_is_distinct_from_missing() -> None:
    event = RmiCallFailed(5, RmiFailure.REFUSED, "ICalc.add", message="bad")
    client, _ = registries()
    assert isinstance(exception_from(event, client), RmiRequestRefused)


def test_a_side_without_global_objects_answers_missing_and_clients_cannot_host_globals() -> None:
    pair = Pair()
    counter_id = pair.client_registry.interface(ICounter).interface_id
    pair.client.objects.save(Counter(1), 5)
    # the server calls the client's object 5 as a *global*: the client hosts no global table
    pair.server.call(RemoteRef(counter_id, 5, is_global=True), "value", [], 0)
    pair.flush()
    (failed,) = pair.server_events
    assert isinstance(failed, RmiCallFailed) and failed.failure == RmiFailure.MISSING and failed.is_global
    # the same id in connection scope works
    call_id = pair.server.call(RemoteRef(counter_id, 5), "value", [], 0)
    pair.flush()
    (done,) = pair.server_events[1:]
    assert isinstance(done, RmiCallCompleted) and done.call_id == call_id and done.value == 1


def test_timeouts_stay_exact_after_many_completed_calls() -> None:
    pair = Pair()
    ref = calc_ref(pair)
    for i in range(5000):  # each leaves a stale heap entry behind; the heap is compacted as it grows
        pair.result(pair.client.call(ref, "add", [i, 0], i, timeout_ns=10_000))
    assert len(pair.client._pending._timeouts) < 200
    late = pair.client.call(ref, "add", [1, 1], 10_000, timeout_ns=50)
    assert pair.client.deadline_ns == 10_050
    pair.client.take_frames()
    pair.client.handle_timer(10_050)
    (event,) = pair.client.take_events()
    assert isinstance(event, RmiCallFailed) and event.call_id == late and event.failure == RmiFailure.TIMED_OUT


class IEcho(Protocol):
    def echo(self, value: list[int] | str | dict[str, float] | None) -> list[int] | str | dict[str, float] | None: ...

    def points(self, points: list[Point]) -> list[Point]: ...


class Echo:
    def echo(self, value: list[int] | str | dict[str, float] | None) -> list[int] | str | dict[str, float] | None:
        return value

    def points(self, points: list[Point]) -> list[Point]:
        return points[::-1]


@functools.cache
def echo_registries() -> tuple[RmiRegistry, RmiRegistry]:
    return RmiRegistry([IEcho], messages=MESSAGES), RmiRegistry([(IEcho, Echo)], messages=MESSAGES)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.text(max_size=50),
        st.lists(st.integers(-(2**63), 2**64 - 1), max_size=20),
        st.dictionaries(st.text(max_size=5), st.floats(allow_nan=False), max_size=5),
    ),
    st.lists(st.tuples(st.integers(-1000, 1000), st.integers(-1000, 1000)), max_size=10),
)
def test_values_round_trip_through_typed_calls(value: Any, coords: list[tuple[int, int]]) -> None:
    client_registry, server_registry = echo_registries()
    client, server = RmiEndpoint(client_registry), RmiEndpoint(server_registry)
    ref = RemoteRef(0, server.objects.save(Echo()))
    first = client.call(ref, "echo", [value], 0)
    second = client.call(ref, "points", [[Point(x, y) for x, y in coords]], 0)
    for kind, request_id, payload in client.take_frames():
        deliver(server, kind, request_id, payload)
    for kind, request_id, payload in server.take_frames():
        deliver(client, kind, request_id, payload)
    results = {e.call_id: e.value for e in client.take_events() if isinstance(e, RmiCallCompleted)}
    assert results == {first: value, second: [Point(x, y) for x, y in coords][::-1]}


def test_a_subclass_the_host_cannot_dispatch_is_refused_not_crashing() -> None:
    class Odd(Counter):
        def increment(self, a: int, b: int, c: int) -> int:  # type: ignore[override]
            return a

    pair = Pair()
    object_id = pair.server.objects.save(Odd())
    with pytest.raises(RmiRequestRefused, match="cannot be dispatched"):
        pair.result(
            pair.client.call(
                RemoteRef(pair.client_registry.interface(ICounter).interface_id, object_id), "increment", [1], 0
            )
        )
    assert pair.result(pair.client.call(calc_ref(pair), "add", [1, 2], 0)) == 3


def test_objects_sent_as_messages_arrive_as_proxies_or_as_themselves() -> None:
    pair = Pair()
    mine = Counter(3)
    assert pair.client.is_remote_object(mine) and not pair.client.is_remote_object(Point(1, 2))
    pair.client.send_object(mine)  # an implementation by value: the server gets a proxy (RemoteRef here)
    pair.flush()
    (received,) = pair.server_events
    assert isinstance(received, RmiObjectReceived) and isinstance(received.value, RemoteRef)
    assert received.value.object_id == pair.client.objects.id_of(mine)
    pair.server.send_object(received.value)  # the proxy goes home: the client gets its real object
    pair.flush()
    (back,) = pair.client_events
    assert isinstance(back, RmiObjectReceived) and back.value is mine
    with pytest.raises(InterfaceError, match="not a registered implementation"):
        pair.client.send_object(Point(1, 2))
    # forged object messages are refused and counted: unknown ids, bad bodies, wanting a response
    counter_id = pair.client_registry.interface(ICounter).interface_id
    forged = [
        (1, REQUEST.pack(4, 0, counter_id, 0) + msgspec.msgpack.encode([0, 999, counter_id, 1])),
        (1, REQUEST.pack(4, 0, counter_id, 0) + b"\xc1"),
        (1, REQUEST.pack(4, 0, counter_id, 0) + msgspec.msgpack.encode([0, 1, counter_id + 1, 0])),
        (2 | 1 << 16, REQUEST.pack(4, 0, counter_id, 0) + msgspec.msgpack.encode([0, 1, counter_id, 0])),
    ]
    for request_id, payload in forged:
        assert pair.client.receive_request(request_id, payload) is None
    assert not any(isinstance(e, RmiObjectReceived) for e in pair.client.take_events())


@aio
async def test_proxies_sent_as_messages_over_the_loop() -> None:
    received: list[object] = []
    pair = AioPair()
    pair.server.on_object = received.append
    pair.client.on_object = received.append
    counter = Counter(5)
    pair.client.send_object(counter)
    await asyncio.sleep(0.01)
    (proxy,) = received
    assert isinstance(proxy, Proxy) and await proxy.increment(1) == 6  # the server calls the client's object
    pair.server.send_object(proxy)
    await asyncio.sleep(0.01)
    assert received[1] is counter


# -- ids by keyword, fire-and-forget failures, files ------------------------------------------------------


def test_ids_are_the_id_keyword_and_the_older_names_are_gone() -> None:
    _, server = registries()
    table = ObjectTable(server, is_global=True)
    calc = Calc()
    assert table.save(calc, id=5) == 5 and table.get(id=5) is calc and table.get(5) is calc
    assert table.save(Counter(), 6) == 6 and table.get(6) is not None
    for older in ({"object_id": 7}, {"obj_or_id": 7}):  # one name per parameter (issue 27)
        with pytest.raises(TypeError, match="unexpected keyword"):
            table.save(Calc(), **older)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="missing"):
        table.delete()  # type: ignore[call-arg]
    assert table.delete(id=5) and table.delete(6) and len(table) == 0


@aio
async def test_session_ids_by_keyword_and_fire_and_forget_failures_go_to_on_error() -> None:
    pair = AioPair()
    client_errors: list[BaseException] = []
    pair.client.on_error = client_errors.append
    assert pair.server.save(Calc(), id=3) == 3
    assert await pair.client.get(ICalc, id=3).add(1, 2) == 3
    assert await pair.client.get(ICalc, 3).add(2, 2) == 4
    global_id = pair.globals.save(Calc(), id=8)
    calc = pair.client.get_global(ICalc, id=global_id)
    assert await calc.add(3, 3) == 6
    oneway = calc.rmi_async()  # type: ignore[attr-defined]
    oneway.add(1)  # one argument short
    oneway.add(1, 2, 3)  # one too many
    oneway.add(1, b=2, c=3)  # an unknown keyword
    oneway.move(object())  # not encodable
    with pytest.raises(InterfaceError):  # an awaited call still raises for the same mistake
        calc.add(1)
    assert len(client_errors) == 4 and all(isinstance(e, InterfaceError) for e in client_errors)
    assert "serialized" in str(client_errors[3])
    assert pair.server.delete(id=3) and not pair.server.delete(3)
    with pytest.raises(RemoteObjectMissing, match="remote object 3 "):
        await pair.client.get(ICalc, 3).add(1, 2)
    pair.close("connection closed")
    oneway.bump()  # closed: reported, never raised
    assert isinstance(client_errors[-1], RmiConnectionClosed) and len(client_errors) == 5


class IFiles(Protocol):
    def size_of(self, name: str, file: Path) -> int: ...

    def export(self, name: str) -> Path: ...

    def maybe(self, file: Path | None) -> Path | None: ...


class Files:
    def size_of(self, connection: object, name: str, file: Path) -> int:
        return file.stat().st_size

    def export(self, name: str) -> Path:
        return Path(name)

    def maybe(self, file: Path | None) -> Path | None:
        return file


class FakeChannel:
    """Records the files an endpoint streams (a connection's MachineFiles streams them)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.aborted: list[int] = []

    def send(self, path: Any) -> FileRef:
        if "missing" in str(path):
            raise FileNotFoundError(str(path))
        self.sent.append(str(path))
        return FileRef(len(self.sent), 123, Path(path).name)

    def abort(self, stream_id: int) -> None:
        self.aborted.append(stream_id)


def test_path_parameters_and_results_are_streamed_files_on_the_wire() -> None:
    class Nested(Protocol):
        def f(self, files: list[Path]) -> int: ...

    with pytest.raises(InterfaceError, match=r"Path .* may only be a parameter or result itself"):
        RmiRegistry([Nested])
    client_registry = RmiRegistry([IFiles])
    server_registry = RmiRegistry([(IFiles, Files)])
    assert client_registry.description() == server_registry.description()
    spec = client_registry.interface(IFiles).by_name["size_of"]
    assert spec.file_params == ((1, False),) and not spec.file_result
    client, server = RmiEndpoint(client_registry), RmiEndpoint(server_registry)
    ref = RemoteRef(0, server.objects.save(Files()))
    with pytest.raises(InterfaceError, match="cannot stream a Path"):
        client.call(ref, "size_of", ["a", Path("/x")], 0)  # no file channel: refused, nothing sent
    channel = FakeChannel()
    client.files = server.files = channel
    with pytest.raises(InterfaceError, match=r"os\.PathLike"):
        client.call(ref, "size_of", ["a", "/not/a/path/object"], 0)
    with pytest.raises(InterfaceError, match="serialized"):
        client.call(ref, "size_of", [object(), Path("/x")], 0)
    assert channel.sent == [] and client.take_frames() == []  # no file streamed for a call not sent
    with pytest.raises(FileNotFoundError):
        client.call(ref, "size_of", ["a", Path("/missing")], 0)
    call_id = client.call(ref, "size_of", ["a", Path("/data/report.bin")], 0)
    assert channel.sent == ["/data/report.bin"]
    ((_kind, request_id, payload),) = client.take_frames()
    invocation = server.receive_request(request_id, payload, caller="conn")
    assert invocation is not None
    assert invocation.files == ((3, FileRef(1, 123, "report.bin")),)  # (self, connection, name, file)
    assert invocation.args[3] == FileRef(1, 123, "report.bin")
    # a Path result is streamed by the host and the response names it
    call_id = client.call(ref, "export", ["/srv/out.bin"], 0)
    ((_kind, request_id, payload),) = client.take_frames()
    invocation = server.receive_request(request_id, payload)
    assert invocation is not None and invocation.files == ()
    assert server.execute(invocation) is None
    assert channel.sent[-1] == "/srv/out.bin"
    ((_kind, request_id, payload),) = server.take_frames()
    client.receive_response(request_id, payload)
    (done,) = client.take_events()
    assert isinstance(done, RmiCallCompleted) and done.call_id == call_id and done.value == FileRef(2, 123, "out.bin")
    call_id = client.call(ref, "maybe", [None], 0)  # an optional file: None travels as None
    ((_kind, request_id, payload),) = client.take_frames()
    invocation = server.receive_request(request_id, payload)
    assert invocation is not None and invocation.files == ()
    server.execute(invocation)
    ((_kind, request_id, payload),) = server.take_frames()
    client.receive_response(request_id, payload)
    assert client.take_events() == [RmiCallCompleted(call_id, None)]


def test_a_call_request_is_its_header_then_the_msgpack_of_its_arguments() -> None:
    """The arguments are encoded in place after the header: the payload stays exactly the documented layout."""
    pair = Pair()
    ref = calc_ref(pair)
    call_id = pair.client.call(ref, "add", [2, 3], 0)
    ((kind, request_id, payload),) = pair.client.take_frames()
    method = pair.client_registry.interface(ICalc).by_name["add"]
    assert kind == FrameKind.RMI_REQUEST and request_id == call_id
    assert bytes(payload) == REQUEST.pack(0, ref.object_id, ref.interface_id, method.index) + msgspec.msgpack.encode(
        [2, 3]
    )
    with pytest.raises(InterfaceError, match="do not fit"):  # checked in place, before anything is queued
        pair.client.call(ref, "add", ["two", 3], 0)
    assert pair.client.take_frames() == []
    deliver(pair.server, kind, request_id, bytes(payload))
    ((kind, rid, response),) = pair.server.take_frames()
    assert (kind, rid, bytes(response)) == (FrameKind.RMI_RESPONSE, call_id, b"\x00" + msgspec.msgpack.encode(5))
