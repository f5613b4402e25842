"""The real transport machines over the in-memory lossy network, stepped by a manual clock.

:class:`TransportPair` is one publication (a :class:`~slipstream.protocol.NetworkPublicationSender`
over an in-memory log an :class:`~slipstream.logbuffer.ExclusiveAppender` fills) and one subscription
(a :class:`~slipstream.protocol.ReceiveEndpoint` whose first image a :class:`Subscriber` reads and
reassembles with :class:`~slipstream.client.FragmentAssembler`), on an
:class:`~slipstream.testing.InMemoryNetwork` with seeded loss, duplication and reordering, driven by
one :class:`~slipstream.testing.ManualClock`. It is to the transport what trio's
``memory_stream_pair`` and h11's ``ConnectionPair`` are to theirs: every run is seeded, so a failure
reproduces exactly, and a 10 s timeout costs nothing. More subscriptions can join (``add_subscription``),
e.g. several receivers of a dynamic multi-destination-cast publication.

Each ``step`` delivers what is due, lets the publication append what its window allows, polls the
sender, reads the images, polls the endpoints and advances the clock. Every poll is checked: when a
machine's ``poll_due`` says a poll is not due, the poll must send and change nothing (the promise
that lets the driver skip idle polls)::

    pair = TransportPair(seed=7, data_link=LinkConditions(loss=0.1))
    pair.offer([b"hello", b"world"])
    pair.run_until(lambda: len(pair.received()) == 2, timeout_ns=5 * 10**9)
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ..client.assembler import FragmentAssembler
from ..logbuffer import (
    ADMIN_ACTION,
    ExclusiveAppender,
    Header,
    LogBuffers,
    PyExclusiveAppender,
    compute_log_length,
    read_term,
)
from ..protocol import (
    ImageCreated,
    NetworkPublicationSender,
    PublicationImageReceiver,
    ReceiveEndpoint,
    ReceiverConfig,
    ReceiverEvent,
    SenderConfig,
    SenderEvent,
)
from ..wire.address import Address
from ..wire.constants import BEGIN_FLAG, END_FLAG, TERM_MIN_LENGTH, UNFRAGMENTED
from ..wire.frames import BytesLike
from .clock import ManualClock
from .network import InMemoryNetwork, LinkConditions

__all__ = [
    "PUBLICATION_ADDRESS",
    "SUBSCRIPTION_ADDRESS",
    "SimulatedPublication",
    "SimulatedSubscription",
    "Subscriber",
    "TransportPair",
    "checked_poll",
    "machine_state",
]

E = TypeVar("E", bound=ReceiverEvent)

PUBLICATION_ADDRESS = ("10.0.0.1", 40001)
"""Where a pair's publication is bound (its socket, or its control address on MDC)."""
SUBSCRIPTION_ADDRESS = ("10.0.0.2", 20121)
"""Where a pair's first subscription endpoint is bound."""
_US = 1_000
_MS = 1_000_000
_S = 1_000_000_000


class Subscriber:
    """Reads an image log from its join position and reassembles fragmented messages with a
    :class:`~slipstream.client.FragmentAssembler`; it reports its position to the image as the
    subscribers' consumption, as a driver would.

    ``discarded`` counts fragmented messages that were begun but never completed (a filled gap inside
    one, on an unreliable stream): a reliable stream never discards."""

    def __init__(self, image: PublicationImageReceiver) -> None:
        self.image = image
        self.log = image.log
        self.position = image.join_position
        self.header = Header(self.log.initial_term_id, self.log.bits)
        self.messages: list[bytes] = []
        self.discarded = 0
        self._open = False
        self._assembler = FragmentAssembler(self._on_message)

    def _on_message(self, payload: memoryview, header: Header) -> None:
        if header.flags & UNFRAGMENTED != UNFRAGMENTED:
            self._open = False
        self.messages.append(bytes(payload))

    def _on_fragment(self, payload: memoryview, header: Header) -> None:
        flags = header.flags
        if flags & BEGIN_FLAG and not flags & END_FLAG:
            if self._open:
                self.discarded += 1  # the message begun before never ended
            self._open = True
        self._assembler(payload, header)

    def poll(self) -> None:
        """Read everything available, then report the position to the image."""
        log = self.log
        while True:
            index, offset = (self.position >> log.bits) % 3, self.position & (log.term_length - 1)
            _, next_offset, intact = read_term(
                log.terms[index], log.terms_i32[index], offset, self._on_fragment, 100, self.header
            )
            if not intact:
                raise AssertionError(f"corrupt frame in the image log at position {self.position}")
            if next_offset == offset:
                break
            self.position += next_offset - offset
        self.image.on_consumption(self.position)


_NOT_STATE = {"log", "config", "rng", "log_factory", "_log_factory", "_delay", "_tails"}
_PARTS = {"_loss", "_retransmit", "_flow"}


def _log_crc(log: LogBuffers) -> int:
    crc = 0
    for term in log.terms:
        crc = zlib.crc32(term, crc)
    return zlib.crc32(log.meta_i64, crc)


def machine_state(machine: object) -> dict[str, Any]:
    """Everything a poll could change in a sender or an endpoint (its images, their loss detectors,
    retransmit actions and logs included), as comparable values."""
    state: dict[str, Any] = {}
    for name, value in vars(machine).items():
        if name in _NOT_STATE:
            continue
        if name == "_actions":
            value = [tuple(getattr(a, slot) for slot in a.__slots__) for a in value]
        elif name in _PARTS:
            value = machine_state(value)
        elif isinstance(value, (list, dict, set)):
            value = repr(value)
        state[name] = value
    if isinstance(machine, ReceiveEndpoint):
        images = [*machine.images, *vars(machine)["_lingering"]]
        state["images"] = [machine_state(image) for image in images]
        state["logs"] = [_log_crc(image.log) for image in images]
        state["rng"] = machine.rng.getstate()
    elif isinstance(machine, NetworkPublicationSender):
        state["log"] = _log_crc(machine.log)
    return state


def checked_poll(machine: NetworkPublicationSender | ReceiveEndpoint, now_ns: int) -> list[Any]:
    """Poll, and when the machine said no poll was due, check that this one sent and changed nothing."""
    poll: Callable[[int], Sequence[Any]] = (
        machine.poll_batches if isinstance(machine, NetworkPublicationSender) else machine.poll
    )
    if machine.poll_due(now_ns):
        return list(poll(now_ns))
    before = machine_state(machine)
    out = list(poll(now_ns))
    if out:
        raise AssertionError(f"poll_due was False at {now_ns} but poll sent {out}")
    if machine_state(machine) != before:
        raise AssertionError(f"poll_due was False at {now_ns} but poll changed the state")
    return out


class SimulatedPublication:
    """A publication's sender machine bound at ``address``: messages offered queue in ``outbox`` and are
    appended as the publisher limit allows; ``poll`` sends what the sender wants sent."""

    def __init__(
        self,
        network: InMemoryNetwork,
        address: Address,
        *,
        peer: Address | None,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
        term_length: int = TERM_MIN_LENGTH,
        mtu: int = 1408,
        config: SenderConfig | None = None,
    ) -> None:
        self.network = network
        self.address = address
        self.peer = peer
        """Where a unicast sender's datagrams go (its socket is connected there); None on MDC."""
        log = LogBuffers(bytearray(compute_log_length(term_length)), term_length)
        log.initialize(initial_term_id=initial_term_id, session_id=session_id, stream_id=stream_id, mtu=mtu)
        self.log = log
        self.appender = ExclusiveAppender(log)
        self.sender = NetworkPublicationSender(log, config)
        self.outbox: deque[bytes] = deque()
        self.published: list[bytes] = []
        self.events: list[SenderEvent] = []
        """The sender's events (connected, destinations added ...), taken after every poll."""
        self.last_offer_result = 0
        self.close_when_published = False
        self.running = True
        """False: the publishing driver died (nothing is polled or sent)."""
        self.send_fresh = False
        """True: what ``publish`` appends goes out at once through ``poll_fresh_batches`` (an invoker-mode
        driver's ``send_now``) before the duty cycle's ``poll``."""
        self.fresh_sent = 0
        """Datagrams ``poll_fresh_batches`` put on the network (with ``send_fresh``; on MDC, once per
        destination)."""
        network.bind(address, lambda data, source, now: self.sender.on_datagram(data, now, source))

    def offer(self, messages: Sequence[bytes]) -> None:
        """Queue messages; ``publish`` appends them in order as the window allows."""
        self.outbox.extend(messages)

    def publish(self) -> None:
        """Append queued messages while the sender's publisher limit allows; close once all went if asked."""
        while self.outbox:
            result = self.appender.append(self.outbox[0], self.sender.publisher_limit())
            if result == ADMIN_ACTION:
                continue
            if result < 0:
                self.last_offer_result = result
                return
            self.published.append(self.outbox.popleft())
        if self.close_when_published:
            self.sender.close()

    def poll(self, now_ns: int) -> int:
        """Send what the sender wants sent; the number of datagrams put on the network."""
        if not self.running:
            return 0
        sent = 0
        if self.send_fresh:
            fresh = self._send(self.sender.poll_fresh_batches(now_ns) or ())
            self.fresh_sent += fresh
            sent += fresh
        sent += self._send(checked_poll(self.sender, now_ns))
        if self.sender.has_events:
            self.events.extend(self.sender.take_events())
        return sent

    def _send(self, batches: Iterable[tuple[list[BytesLike], Address | None]]) -> int:
        """Put ``batches`` on the network (destination None: the unicast peer); the datagrams sent."""
        sent = 0
        for datagrams, destination in batches:
            target = self.peer if destination is None else destination
            for datagram in datagrams:
                self.network.send(self.address, target, datagram)
                sent += 1
        return sent


class SimulatedSubscription:
    """A receive endpoint bound at ``address``, with a :class:`Subscriber` on the first image it creates."""

    def __init__(
        self,
        network: InMemoryNetwork,
        address: Address,
        *,
        stream_id: int,
        reliable: bool = True,
        config: ReceiverConfig | None = None,
        seed: int = 1,
        control: Address | None = None,
    ) -> None:
        self.network = network
        self.address = address
        self.stream_id = stream_id
        self.reliable = reliable
        self.config = config
        self.seed = seed
        self.control = control
        self.endpoint = self.new_endpoint()
        self.subscriber: Subscriber | None = None
        self.events: list[ReceiverEvent] = []
        self.consume = True
        """False: the subscriber stalls (reads nothing), so flow control must hold the sender back."""
        self.running = True
        """False: the subscribing driver died (nothing is polled or sent)."""
        network.bind(address, lambda data, source, now: self.endpoint.on_datagram(data, now, source))

    def new_endpoint(self) -> ReceiveEndpoint:
        """A fresh endpoint (a restarted subscriber: new receiver id, no images); assign it to ``endpoint``."""
        endpoint = ReceiveEndpoint(self.config, rng=random.Random(self.seed), control=self.control)
        endpoint.add_subscription(self.stream_id, reliable=self.reliable)
        return endpoint

    def take_events(self) -> None:
        """Collect the endpoint's events; the first image created gets the subscriber."""
        for event in self.endpoint.take_events():
            self.events.append(event)
            if isinstance(event, ImageCreated):
                image = self.endpoint.image_by_id(event.image_id)
                if image is not None:
                    self.subscriber = Subscriber(image)

    def read(self) -> None:
        """Let the subscriber read what its image holds (unless it stalls)."""
        if self.subscriber is not None and self.consume:
            self.subscriber.poll()

    def poll(self, now_ns: int) -> int:
        """Send the endpoint's status messages, NAKs and replies; the number put on the network."""
        if not self.running:
            return 0
        out = checked_poll(self.endpoint, now_ns)
        for datagram, destination in out:
            self.network.send(self.address, destination, datagram)
        return len(out)

    def received(self) -> list[bytes]:
        """Messages this subscription's subscriber reassembled, in order."""
        return self.subscriber.messages if self.subscriber is not None else []

    def events_of(self, kind: type[E]) -> list[E]:
        """Every endpoint event of ``kind`` so far, oldest first."""
        self.take_events()
        return [e for e in self.events if isinstance(e, kind)]


class TransportPair:
    """One publication and one subscription endpoint on a seeded lossy network, stepped by hand.

    ``data_link`` and ``control_link`` set the conditions from publication to subscription and back.
    With ``sender_config.control_mode="dynamic"`` the publication is a dynamic MDC publication at
    its control address and subscriptions register there (``control=``); add more with
    :meth:`add_subscription`. The first subscription's parts are also the pair's own attributes
    (``endpoint``, ``subscriber``, ``consume`` ...), the publication's too (``sender``, ``appender``,
    ``outbox`` ...)."""

    def __init__(
        self,
        *,
        seed: int = 1,
        data_link: LinkConditions | None = None,
        control_link: LinkConditions | None = None,
        reliable: bool = True,
        receiver_config: ReceiverConfig | None = None,
        sender_config: SenderConfig | None = None,
        step_ns: int = 20 * _US,
        initial_term_id: int = -5,
        session_id: int = 0x1234,
        stream_id: int = 1001,
        term_length: int = TERM_MIN_LENGTH,
        mtu: int = 1408,
        publication_address: Address = PUBLICATION_ADDRESS,
        subscription_address: Address = SUBSCRIPTION_ADDRESS,
        start_ns: int = 1_000 * _S,
    ) -> None:
        self.clock = ManualClock(start_ns)
        self.net = InMemoryNetwork(self.clock, seed=seed)
        self.seed = seed
        self.step_ns = step_ns
        self.data_link = data_link or LinkConditions(delay_ns=50 * _US)
        self.control_link = control_link or LinkConditions(delay_ns=50 * _US)
        self.receiver_config = receiver_config
        self.reliable = reliable
        mdc = sender_config is not None and sender_config.control_mode is not None
        self.publication = SimulatedPublication(
            self.net,
            publication_address,
            peer=None if mdc else subscription_address,
            session_id=session_id,
            stream_id=stream_id,
            initial_term_id=initial_term_id,
            term_length=term_length,
            mtu=mtu,
            config=sender_config,
        )
        self.subscriptions: list[SimulatedSubscription] = []
        self.add_subscription(subscription_address, control=publication_address if mdc else None)

    def add_subscription(
        self, address: Address, *, control: Address | None = None, seed: int | None = None
    ) -> SimulatedSubscription:
        """Another subscription endpoint at ``address`` (with the pair's links to and from the publication)."""
        publication = self.publication.address
        self.net.set_link(publication, address, self.data_link)
        self.net.set_link(address, publication, self.control_link)
        subscription = SimulatedSubscription(
            self.net,
            address,
            stream_id=self.publication.sender.stream_id,
            reliable=self.reliable,
            config=self.receiver_config,
            seed=self.seed if seed is None else seed,
            control=control,
        )
        self.subscriptions.append(subscription)
        return subscription

    # -- stepping -----------------------------------------------------------------------------------

    @property
    def now(self) -> int:
        """The manual clock's time."""
        return self.clock.now_ns()

    def step(self) -> None:
        """Deliver, publish, poll the sender, read, poll the endpoints, then advance the clock (by
        ``step_ns`` while anything moved, else by a millisecond)."""
        now = self.now
        delivered = self.net.deliver_due()
        publication = self.publication
        publication.publish()
        sent = publication.poll(now)
        for subscription in self.subscriptions:
            subscription.take_events()
            subscription.read()
            sent += subscription.poll(now)
        idle = not delivered and not sent and self.net.in_flight == 0
        self.clock.advance(_MS if idle else self.step_ns)

    def run_until(self, done: Callable[[], bool], timeout_ns: int) -> None:
        """Step until ``done()``; AssertionError if ``timeout_ns`` of simulated time pass first."""
        deadline = self.now + timeout_ns
        while not done():
            if self.now >= deadline:
                raise AssertionError("simulation timed out")
            self.step()

    def run_for(self, duration_ns: int) -> None:
        """Step for ``duration_ns`` of simulated time."""
        deadline = self.now + duration_ns
        while self.now < deadline:
            self.step()

    # -- the publication's parts --------------------------------------------------------------------

    @property
    def sender(self) -> NetworkPublicationSender:
        """The publication's sender machine."""
        return self.publication.sender

    @property
    def appender(self) -> PyExclusiveAppender:
        """The publication's appender (its ``position`` is what was appended)."""
        return self.publication.appender

    @property
    def outbox(self) -> deque[bytes]:
        """Messages offered and not yet appended."""
        return self.publication.outbox

    @property
    def published(self) -> list[bytes]:
        """Messages appended so far, in order."""
        return self.publication.published

    @property
    def last_offer_result(self) -> int:
        """The last refusal ``publish`` met (NOT_CONNECTED, BACK_PRESSURED ...); 0 before any."""
        return self.publication.last_offer_result

    @property
    def close_when_published(self) -> bool:
        """Close the publication once everything offered was appended."""
        return self.publication.close_when_published

    @close_when_published.setter
    def close_when_published(self, value: bool) -> None:
        self.publication.close_when_published = value

    @property
    def sender_running(self) -> bool:
        """False: the publishing driver died (its sender is not polled)."""
        return self.publication.running

    @sender_running.setter
    def sender_running(self, value: bool) -> None:
        self.publication.running = value

    def offer(self, messages: Sequence[bytes]) -> None:
        """Queue messages for the publication (appended as its window allows, in order)."""
        self.publication.offer(messages)

    # -- the first subscription's parts -------------------------------------------------------------

    @property
    def subscription(self) -> SimulatedSubscription:
        """The first subscription."""
        return self.subscriptions[0]

    @property
    def endpoint(self) -> ReceiveEndpoint:
        """The first subscription's endpoint machine (assign one from ``new_endpoint`` to restart it)."""
        return self.subscription.endpoint

    @endpoint.setter
    def endpoint(self, endpoint: ReceiveEndpoint) -> None:
        self.subscription.endpoint = endpoint

    @property
    def subscriber(self) -> Subscriber | None:
        """The first subscription's subscriber (None until its first image)."""
        return self.subscription.subscriber

    @subscriber.setter
    def subscriber(self, subscriber: Subscriber | None) -> None:
        self.subscription.subscriber = subscriber

    @property
    def consume(self) -> bool:
        """False: the first subscription's subscriber stalls."""
        return self.subscription.consume

    @consume.setter
    def consume(self, value: bool) -> None:
        self.subscription.consume = value

    @property
    def receiver_running(self) -> bool:
        """False: the subscribing driver died (its endpoint is not polled)."""
        return self.subscription.running

    @receiver_running.setter
    def receiver_running(self, value: bool) -> None:
        self.subscription.running = value

    @property
    def events(self) -> list[ReceiverEvent]:
        """The first subscription's endpoint events collected so far."""
        return self.subscription.events

    def new_endpoint(self) -> ReceiveEndpoint:
        """A fresh endpoint for the first subscription (a restarted subscriber)."""
        return self.subscription.new_endpoint()

    def received(self) -> list[bytes]:
        """Messages the first subscription's subscriber reassembled, in order."""
        return self.subscription.received()

    def events_of(self, kind: type[E]) -> list[E]:
        """The first subscription's events of ``kind`` so far."""
        return self.subscription.events_of(kind)
