"""The driver conductor: admin of one driver directory, composing the driver's agents in one thread.

As in Aeron's SHARED threading mode, one duty cycle runs every agent: the client-command adapter
(bytes from clients in, commands out, responses queued), the IPC publications' limits, the sender
agent (network publications), the receiver agent (receive channels) and the conductor's own admin:
acting on commands and image events, client liveness and counters. It never blocks: waiting is the
idle strategy's job (see ``MediaDriver``), which parks in the one socket wait of ``park``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ..files import commands as cmd
from ..files.cnc import PARKED_INDEX, CncFile
from ..files.counters import (
    APPLICATION_TYPE_ID_MIN,
    MAX_KEY_LENGTH,
    PUBLISHER_LIMIT_TYPE_ID,
    PUBLISHER_POSITION_TYPE_ID,
    RECEIVER_BYTES_LOST_TYPE_ID,
    RECEIVER_HWM_TYPE_ID,
    RECEIVER_NAKS_SENT_TYPE_ID,
    RECEIVER_POSITION_TYPE_ID,
    SENDER_LIMIT_TYPE_ID,
    SENDER_NAKS_RECEIVED_TYPE_ID,
    SENDER_POSITION_TYPE_ID,
    SENDER_RETRANSMITS_TYPE_ID,
    SUBSCRIBER_POSITION_TYPE_ID,
    CountersManager,
)
from ..files.directory import IMAGES_DIR, PUBLICATIONS_DIR
from ..files.error_log import DistinctErrorLog
from ..files.loss_report import LossReport
from ..logbuffer import LogBuffers
from ..logbuffer.layout import PARKING_SLOTS
from ..protocol.config import ImageLimits
from ..protocol.events import (
    GapFilled,
    ImageCreated,
    ImageEndOfStream,
    ImageReleased,
    ImageRemoved,
    LossDetected,
)
from ..protocol.lifecycle import ACTIVE, DRAINING
from ..protocol.sender import NetworkPublicationSender
from ..wire.positions import wrap_i32
from ..wire.uri import ChannelUri
from .channels import (
    CommandRefused,
    channel_key,
    image_limits,
    map_publication_log,
    open_publication_socket,
    open_receive_socket,
    parse_channel,
    publication_endpoint,
    receiver_config,
    sender_config,
    subscription_endpoints,
)
from .client_commands import AeronClientRefusal, ClientCommandAdapter, ClientSession
from .clock import StallClock
from .config import DriverConfig
from .ipc_publication import IpcPublication
from .network_publication import NetworkPublication
from .poller import SocketPoller
from .receive_channel import DriverImage, ReceiveChannel
from .receiver_agent import ReceiverAgent
from .sender_agent import SenderAgent
from .system_counters import SystemCounters
from .udp_channel import UdpEndpoint, UdpSocket, resolve

log = logging.getLogger("slipstream.driver")

__all__ = ["COMMAND_DRAIN_LIMIT", "ClientSession", "DriverConductor", "SubscriptionLink", "clean_publications_dir"]

COMMAND_DRAIN_LIMIT = 10
"""Client commands run per duty cycle (Aeron: ``COMMAND_DRAIN_LIMIT``, 1 there). Adding a stream costs
a millisecond or so here (its log file is made and mapped); a burst of hundreds (many clients
connecting at once) is spread over cycles, so the streams already up keep moving in between, and an
invoker-mode driver never holds its application's thread for long."""

IPC_TRACK_INTERVAL_NS = 100_000
"""How often the IPC publications' limits are recomputed while no publisher presses on its limit. Each
pass reads every subscriber's position (several microseconds per publication in Python), and a driver
spinning in an application's event loop (invoker mode) would pay it on every turn. A window is at
least half a term (512 KiB for the network layer's IPC default), which a publisher bursting at 2 GB/s
takes 250 us to fill; one that used more than half of it makes the pass run on every duty cycle again."""


@dataclass(slots=True, eq=False)
class SubscriptionLink:
    registration_id: int
    client: ClientSession
    channel: str
    stream_id: int
    session_id: int | None
    receive_channel: ReceiveChannel | None = None
    """The UDP endpoint it listens on; None for IPC."""
    reliable: bool = True
    limits: ImageLimits | None = None
    """The budget its channel URI asks for its stream's images (``max-term-length`` and so on)."""


class DriverConductor:
    """Owns every driver-side resource of one driver directory."""

    def __init__(
        self, config: DriverConfig, cnc: CncFile, listener: socket.socket, clock: StallClock, loss_report: LossReport
    ) -> None:
        self.config = config
        self.clock = clock
        """Where every duty cycle's ``now_ns`` comes from (``MediaDriver`` reads it), and the socket wait's."""
        self.cnc = cnc
        self.loss_report = loss_report
        self.error_log = DistinctErrorLog(cnc.error_log)
        self._refused_seen: dict[int, int] = {}
        self._invalid_seen: dict[int, int] = {}
        self.counters: CountersManager = cnc.counters_manager()
        self.poller: SocketPoller[ClientSession | str | None] = SocketPoller()
        """Every socket the agents read (None: the command listener; "udp": a channel's socket)."""
        self.client_commands = ClientCommandAdapter(listener, self.poller, config.client_liveness_timeout_ns)
        self.aeron_clients = AeronClientRefusal(cnc.to_driver_buffer, cnc.to_clients_buffer, self.record_error)
        self.sender = SenderAgent()
        self.receiver = ReceiverAgent()
        self.publications: dict[int, IpcPublication] = {}
        self.subscriptions: dict[int, SubscriptionLink] = {}
        self.publications_dir = config.directory / PUBLICATIONS_DIR
        self.images_dir = config.directory / IMAGES_DIR
        self.system_counters = SystemCounters(self.counters)
        self._next_image_id = 0
        self._rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        now_ns = clock.now_ns()
        self._next_timer_ns = now_ns
        self._next_ipc_ns = now_ns
        """When the IPC limits are next recomputed (0: at the next duty cycle)."""
        self._udp_ready: set[int] = set()
        """UDP sockets the last socket wait found readable."""
        self._stalls_seen = 0
        """The clock's stalls already logged and counted."""

    @property
    def network_publications(self) -> dict[int, NetworkPublication]:
        """The sender agent's publications, by registration id."""
        return self.sender.publications

    @property
    def receive_channels(self) -> dict[UdpEndpoint, ReceiveChannel]:
        """The receiver agent's channels, by bound endpoint."""
        return self.receiver.channels

    @property
    def clients(self) -> dict[int, ClientSession]:
        """Clients past the handshake, by client id."""
        return self.client_commands.clients

    # -- duty cycle -------------------------------------------------------------------------------

    def do_work(self, now_ns: int, timeout_s: float = 0.0) -> int:
        """One duty cycle of every agent; ``timeout_s`` lets an idle driver sleep in the socket wait itself."""
        work = self._poll_sockets(now_ns, timeout_s)
        if self.client_commands.pending:
            work += self._on_client_commands(now_ns)
            self._next_ipc_ns = 0  # a publication or subscription may have come or gone
        if self.publications and now_ns >= self._next_ipc_ns:
            ipc = self._ipc_work(now_ns)
            # a publisher past half its window (or a publication draining) keeps the pass on every cycle
            self._next_ipc_ns = 0 if ipc else now_ns + IPC_TRACK_INTERVAL_NS
            work += ipc
        work += self.sender.do_work(now_ns, self._udp_ready, self.counters)
        if self.sender.finished:
            work += self._retire_network_publications(self.sender.take_finished(), now_ns)
        work += self.receiver.do_work(now_ns, self._udp_ready, self.counters)
        if self.receiver.image_events:
            work += self._on_image_events(now_ns)
        if now_ns >= self._next_timer_ns:
            work += self._on_timer(now_ns)
        return work

    def data_in_flight(self) -> bool:
        """Whether some stream has data not yet consumed (or sent). Then the driver wants a duty cycle
        every millisecond or so even without input: a subscriber in another process moves its position
        without telling us, and its publisher waits on the limit (or the sender on the status message)
        that only a duty cycle sets. An idle driver's own chores (heartbeats, status messages, the
        100 ms timer) tolerate running late, so an invoker-mode driver's application may park longer."""
        counters = self.counters
        for publication in self.publications.values():
            if publication.subscribers and counters.min_value(publication.subscribers.values()) < (
                publication.producer_position()
            ):
                return True
        for network in self.sender.publications.values():
            if network.sender.sender_position < network.sender.producer_position():
                return True
        for channel in self.receiver.channels.values():
            for image in channel.images.values():
                if image.subscribers and (
                    counters.min_value(image.subscribers.values()) < image.receiver.rebuild_position
                ):
                    return True
        return False

    def carries_network(self) -> bool:
        """Whether some stream goes over UDP (a network publication, or a channel subscribed to): then
        datagrams may arrive for the duty cycle to take in at any moment."""
        return bool(self.sender.publications or self.receiver.channels)

    def streams_deadline_ns(self) -> int:
        """When some UDP stream's machine is next due without input: a heartbeat, a SETUP, a status
        message, a NAK or retransmission, a liveness check (``1 << 63``: none); 0 while decoded
        commands wait (more than one cycle takes, ``COMMAND_DRAIN_LIMIT``). An invoker-mode
        application may sleep until then; the conductor's own chores (``timer_interval_ns``: client
        liveness, counters) run late then, which only delays cleanup."""
        if self.client_commands.pending:
            return 0  # commands wait past the drain limit: due now
        deadline = 1 << 63
        for network in self.sender.publications.values():
            deadline = min(deadline, network.sender.deadline_ns)
        for channel in self.receiver.channels.values():
            deadline = min(deadline, channel.receive.deadline_ns)
        return deadline

    def park(self, timeout_s: float) -> int:
        """Sleep until a client speaks (commands, doorbell), a datagram arrives, or ``timeout_s``.

        The flag in cnc.dat tells clients to ring the doorbell when they append to a UDP publication.
        A wake-up lost to store/load reordering costs at most ``timeout_s``; nothing is lost.
        """
        parked = self.cnc.header_i64
        parked[PARKED_INDEX] = 1
        try:
            return self._poll_sockets(self.clock.now_ns(), timeout_s)  # clients' last-seen times: the same clock
        finally:
            parked[PARKED_INDEX] = 0

    def _poll_sockets(self, now_ns: int, timeout_s: float) -> int:
        """Wait for readable sockets: clients' bytes go to the command adapter, UDP sockets are noted
        for the agents (only sockets with datagrams cost a receive call)."""
        work = 0
        ready = self._udp_ready
        ready.clear()
        commands = self.client_commands
        for fd, what in self.poller.poll(timeout_s):
            if what == "udp":
                ready.add(fd)
            else:
                work += commands.on_readable(cast(ClientSession | None, what), now_ns)
        commands.flush()
        return work

    def _watch(self, sock: socket.socket) -> None:
        self.poller.register(sock.fileno(), "udp")

    def _unwatch(self, sock: socket.socket | UdpSocket) -> None:
        self.poller.unregister(sock.fileno())

    def _on_client_commands(self, now_ns: int) -> int:
        """Act on what clients sent: release the clients that went away, then run each command."""
        adapter = self.client_commands
        if adapter.errors:
            for text in adapter.errors:
                self.record_error(text)
            adapter.errors.clear()
        self._release_closed_clients(now_ns)
        commands = adapter.take_commands(COMMAND_DRAIN_LIMIT)
        for client, message in commands:
            if client.closed:
                continue
            try:
                self._on_message(client, message, now_ns)
            except Exception as exc:  # a bug must cost one command, never the driver
                log.exception("command %r failed", message)
                correlation_id = getattr(message, "correlation_id", 0)
                self._error(client, correlation_id, "INTERNAL", f"{type(message).__name__} failed: {exc!r}")
        self._release_closed_clients(now_ns)  # clients closed meanwhile (one that stopped reading)
        return len(commands)

    def _ipc_work(self, now_ns: int) -> int:
        """IPC publications: publisher limits from subscriber positions; closed ones retire once drained."""
        work = 0
        for publication in list(self.publications.values()):
            work += publication.update_limit(self.counters)
            if publication.state is DRAINING:
                work += self._check_drained(publication, now_ns)
        return work

    def _on_timer(self, now_ns: int) -> int:
        """Every ``timer_interval_ns``: heartbeat, client liveness, error log and counters."""
        self._next_timer_ns = now_ns + self.config.timer_interval_ns
        # cnc.dat's one heartbeat: the to-driver ring buffer's consumer heartbeat, where Aeron's tools read it.
        self.cnc.heartbeat_ms = time.time_ns() // 1_000_000
        if self.clock.stalls != self._stalls_seen:
            self._on_stall()
        work = self._check_liveness(now_ns)
        work += self.aeron_clients.poll()
        self._record_invalid_packets()
        self._update_stream_counters()
        self.system_counters.update(self.sender.publications.values(), self.receiver.channels.values())
        return work

    def _send(self, client: ClientSession, message: cmd.DriverMessage) -> None:
        self.client_commands.send(client, message)

    # -- commands ---------------------------------------------------------------------------------

    def _on_message(self, client: ClientSession, message: cmd.ClientMessage, now_ns: int) -> None:
        """Run one command; a refused one answers the client with its error code and message."""
        try:
            match message:
                case cmd.Keepalive() | cmd.Wake():
                    pass
                case cmd.AddPublication():
                    self._add_publication(client, message, now_ns)
                case cmd.RemovePublication():
                    self._remove_publication(client, message.correlation_id, message.registration_id, now_ns)
                case cmd.AddSubscription():
                    self._add_subscription(client, message, now_ns)
                case cmd.RemoveSubscription():
                    self._remove_subscription(client, message.correlation_id, message.registration_id, now_ns)
                case cmd.AddDestination() | cmd.RemoveDestination():
                    self._destination(client, message)
                case cmd.AddCounter():
                    self._add_counter(client, message, now_ns)
                case cmd.RemoveCounter():
                    self._remove_counter(client, message, now_ns)
                case cmd.RejectImage():
                    self._reject_image(client, message)
                case cmd.CloseClient():
                    self._close_client(client, now_ns, "client closed")
                case cmd.Hello():
                    raise CommandRefused("PROTOCOL", "Hello sent twice")
                case cmd.InvalidCommand():  # a mistyped command costs that command, not the client
                    raise CommandRefused("INVALID_COMMAND", message.reason)
        except CommandRefused as refused:
            self._error(client, getattr(message, "correlation_id", 0), refused.code, refused.message)

    def _error(self, client: ClientSession, correlation_id: int, code: str, message: str) -> None:
        self.record_error(f"{code}: {message}")
        self._send(client, cmd.ErrorResponse(correlation_id, code, message))

    def _check_correlation(self, client: ClientSession, correlation_id: int) -> None:
        """Registration ids are the client's correlation ids, unique because they carry its client id."""
        if (
            correlation_id >> 32 != client.client_id
            or correlation_id in self.publications
            or (correlation_id in self.subscriptions)
        ):
            raise CommandRefused("PROTOCOL", f"correlation id {correlation_id} is not this client's")

    def _add_publication(self, client: ClientSession, message: cmd.AddPublication, now_ns: int) -> None:
        """A new publication: where it sends, its session, its socket and log file, then its driver side."""
        correlation_id, stream_id, channel = message.correlation_id, message.stream_id, message.channel
        self._check_correlation(client, correlation_id)
        uri = parse_channel(channel, stream_id)
        endpoint, control_mode = publication_endpoint(channel, uri)
        session_id = self._publication_session_id(uri, stream_id)
        sock = None if endpoint is None else open_publication_socket(channel, uri, endpoint, control_mode, self.config)
        path = self.publications_dir / f"{correlation_id}.logbuffer"
        try:
            mapping, logbuffers, window = map_publication_log(
                path,
                uri,
                self.config,
                self._rng,
                ipc=endpoint is None,
                session_id=session_id,
                stream_id=stream_id,
                correlation_id=correlation_id,
            )
        except CommandRefused:
            if sock is not None:
                sock.close()
            raise
        limit_id = self.counters.allocate(
            f"pub-lmt: {correlation_id} {session_id} {stream_id} {channel}",
            PUBLISHER_LIMIT_TYPE_ID,
            registration_id=correlation_id,
            owner_id=client.client_id,
            now_ms=now_ns // 1_000_000,
        )
        self.counters.set(limit_id, logbuffers.producer_position())
        ready = cmd.PublicationReady(
            correlation_id, correlation_id, session_id, stream_id, str(path), limit_id, channel
        )
        client.publications.add(correlation_id)
        identity = (correlation_id, client.client_id, session_id, stream_id, channel, message.exclusive)
        if sock is not None:
            network = NetworkPublication(
                *identity,
                path,
                mapping,
                logbuffers,
                limit_id,
                NetworkPublicationSender(logbuffers, sender_config(uri, control_mode, self.config)),
                UdpSocket(sock, offload=self.config.udp_gso),
                control_mode=control_mode,
            )
            self.network_publications[correlation_id] = network
            self._watch(sock)
            for name, type_id in (
                ("pub-pos", PUBLISHER_POSITION_TYPE_ID),
                ("snd-pos", SENDER_POSITION_TYPE_ID),
                ("snd-lmt", SENDER_LIMIT_TYPE_ID),
                ("snd-naks", SENDER_NAKS_RECEIVED_TYPE_ID),
                ("snd-rtx", SENDER_RETRANSMITS_TYPE_ID),
            ):
                network.position_counters[type_id] = self._stream_counter(
                    name, type_id, correlation_id, session_id, stream_id, channel, client.client_id, now_ns
                )
            self._send(client, ready)
            network.update_limit(self.counters)
            return
        publication = IpcPublication(*identity, path, mapping, logbuffers, limit_id, window)
        self.publications[correlation_id] = publication
        publication.position_counters[PUBLISHER_POSITION_TYPE_ID] = self._stream_counter(
            "pub-pos",
            PUBLISHER_POSITION_TYPE_ID,
            correlation_id,
            session_id,
            stream_id,
            channel,
            client.client_id,
            now_ns,
        )
        self._send(client, ready)
        for link in self.subscriptions.values():
            if link.receive_channel is None and self._matches(link, publication):
                self._link(link, publication, now_ns)
        publication.update_limit(self.counters)

    def _publication_session_id(self, uri: ChannelUri, stream_id: int) -> int:
        """The channel's ``session-id`` unless an active publication of the stream uses it, else a free one."""
        session_id = uri.session_id
        if session_id is None:
            return self._allocate_session_id(stream_id)
        all_publications: list[IpcPublication | NetworkPublication] = [
            *self.publications.values(),
            *self.network_publications.values(),
        ]
        key = channel_key(uri)
        if any(
            p.session_id == session_id
            and p.stream_id == stream_id
            and p.state is ACTIVE
            and channel_key(ChannelUri.parse(p.channel)) == key
            for p in all_publications
        ):
            raise CommandRefused("SESSION_IN_USE", f"session id {session_id} is already used on stream {stream_id}")
        return session_id

    def _allocate_session_id(self, stream_id: int) -> int:
        low, high = self.config.reserved_session_id_low, self.config.reserved_session_id_high
        used = {p.session_id for p in self.publications.values() if p.stream_id == stream_id}
        used |= {p.session_id for p in self.network_publications.values() if p.stream_id == stream_id}
        while True:
            candidate = wrap_i32(self._rng.getrandbits(32))
            if not low <= candidate <= high and candidate not in used:
                return candidate

    def _remove_publication(
        self, client: ClientSession, correlation_id: int, registration_id: int, now_ns: int
    ) -> None:
        publication = self.publications.get(registration_id) or self.network_publications.get(registration_id)
        if publication is None or publication.client_id != client.client_id:
            raise CommandRefused("UNKNOWN_PUBLICATION", f"no publication {registration_id} of this client")
        client.publications.discard(registration_id)
        publication.start_draining(now_ns)
        self._send(client, cmd.OperationSuccess(correlation_id))

    def _destination(self, client: ClientSession, message: cmd.AddDestination | cmd.RemoveDestination) -> None:
        """Manual MDC: the application adds and removes a publication's destinations."""
        publication = self.network_publications.get(message.registration_id)
        if publication is None or publication.client_id != client.client_id:
            raise CommandRefused("UNKNOWN_PUBLICATION", f"no UDP publication {message.registration_id} of this client")
        if publication.control_mode != "manual":
            raise CommandRefused(
                "INVALID_CHANNEL", f"{publication.channel}: destinations can only be managed with control-mode=manual"
            )
        try:
            uri = ChannelUri.parse(message.channel)
            if uri.endpoint is None:
                raise ValueError(f"{message.channel}: a destination needs endpoint=host:port")
            destination = resolve(uri.endpoint)
        except ValueError as exc:
            raise CommandRefused("INVALID_CHANNEL", str(exc)) from None
        if isinstance(message, cmd.AddDestination):
            publication.add_destination(destination.address)
        elif not publication.remove_destination(destination.address):
            raise CommandRefused("UNKNOWN_DESTINATION", f"{message.channel} is not a destination")
        self._send(client, cmd.OperationSuccess(message.correlation_id))

    def _add_subscription(self, client: ClientSession, message: cmd.AddSubscription, now_ns: int) -> None:
        correlation_id = message.correlation_id
        self._check_correlation(client, correlation_id)
        uri = parse_channel(message.channel, message.stream_id)
        receive_channel = self._receive_channel(message.channel, uri) if uri.is_udp else None
        link = SubscriptionLink(
            correlation_id, client, message.channel, message.stream_id, uri.session_id, receive_channel,
            uri.reliable is not False, image_limits(uri),
        )  # fmt: skip
        self.subscriptions[correlation_id] = link
        client.subscriptions.add(correlation_id)
        self._send(client, cmd.SubscriptionReady(correlation_id, correlation_id))
        if receive_channel is not None:
            receive_channel.subscriptions.add(correlation_id)
            self._declare_interest(receive_channel, link)
            for image in receive_channel.images.values():
                if not image.removed and self._image_matches(link, image):
                    self._link_image(link, image, image.receiver.rebuild_position, now_ns)
            return
        for publication in self.publications.values():
            if publication.state is ACTIVE and self._matches(link, publication):
                self._link(link, publication, now_ns)

    def _declare_interest(self, channel: ReceiveChannel, latest: SubscriptionLink) -> None:
        """Tell the endpoint what the subscriptions of ``latest``'s stream want together: images of any
        session unless each names one, within the widest of their budgets (none if one has none)."""
        links = [
            link
            for r in channel.subscriptions
            if (link := self.subscriptions.get(r)) is not None and link.stream_id == latest.stream_id
        ]
        sessions: set[int] | None = set()
        limits = latest.limits
        for link in links:
            if sessions is not None:
                sessions = None if link.session_id is None else sessions | {link.session_id}
            limits = None if limits is None else limits.widest(link.limits)
        channel.receive.add_subscription(latest.stream_id, reliable=latest.reliable, sessions=sessions, limits=limits)

    def _reject_image(self, client: ClientSession, message: cmd.RejectImage) -> None:
        """A subscriber refuses an image it is linked to: the endpoint sends ERR and removes it."""
        for channel in self.receive_channels.values():
            for image in channel.images.values():
                if image.correlation_id == message.image_correlation_id:
                    if not client.subscriptions & image.subscribers.keys():
                        raise CommandRefused("UNKNOWN_IMAGE", f"image {image.correlation_id} is not yours")
                    if not channel.receive.reject_image(image.receiver.image_id, message.reason):
                        raise CommandRefused("UNKNOWN_IMAGE", f"image {image.correlation_id} is already going")
                    self._send(client, cmd.OperationSuccess(message.correlation_id))
                    return
        raise CommandRefused("UNKNOWN_IMAGE", f"no image {message.image_correlation_id}")

    def _receive_channel(self, channel: str, uri: ChannelUri) -> ReceiveChannel:
        """The bound endpoint for a UDP subscription: shared by every subscription on the same address."""
        endpoint, control = subscription_endpoints(channel, uri)
        existing = self.receive_channels.get(endpoint) if endpoint.address[1] else None
        if existing is not None:
            if existing.control != control:
                raise CommandRefused(
                    "INVALID_CHANNEL", f"{channel}: {endpoint.host_port} is already bound with another control address"
                )
            return existing
        sock = open_receive_socket(channel, uri, endpoint, self.config)
        config = receiver_config(uri, sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF), self.config)
        if not endpoint.address[1]:  # ephemeral: keyed by the port the OS chose
            endpoint = UdpEndpoint(endpoint.family, sock.getsockname()[: len(endpoint.address)])
        udp = UdpSocket(sock, offload=self.config.udp_gso)
        receive_channel = ReceiveChannel(endpoint, udp, config, self.images_dir, control)
        self.receive_channels[endpoint] = receive_channel
        self._watch(sock)
        return receive_channel

    # -- images and subscribers -------------------------------------------------------------------

    @staticmethod
    def _image_matches(link: SubscriptionLink, image: DriverImage) -> bool:
        return _wants(link, image.receiver.stream_id, image.receiver.session_id)

    def _link_image(self, link: SubscriptionLink, image: DriverImage, join: int, now_ns: int) -> None:
        receiver = image.receiver
        self._add_subscriber(
            link,
            image.subscribers,
            receiver.log,
            image.parking,
            image.correlation_id,
            receiver.session_id,
            receiver.stream_id,
            image.log_path,
            join,
            image.source_identity,
            now_ns,
        )

    def _add_subscriber(
        self,
        link: SubscriptionLink,
        subscribers: dict[int, int],
        log: LogBuffers,
        parking: dict[int, int],
        correlation_id: int,
        session_id: int,
        stream_id: int,
        log_path: Path,
        join: int,
        source_identity: str,
        now_ns: int,
    ) -> None:
        """A subscriber position counter at ``join``, a parking slot if one is free, and the client told
        that an image appeared."""
        counter_id = self.counters.allocate(
            f"sub-pos: {link.registration_id} {session_id} {stream_id} {link.channel} @{join}",
            SUBSCRIBER_POSITION_TYPE_ID,
            registration_id=link.registration_id,
            owner_id=link.client.client_id,
            reference_id=correlation_id,
            now_ms=now_ns // 1_000_000,
        )
        self.counters.set(counter_id, join)
        subscribers[link.registration_id] = counter_id
        slot = _claim_parking_slot(log, parking, link.registration_id)
        self._send(
            link.client,
            cmd.ImageAvailable(
                link.registration_id,
                correlation_id,
                session_id,
                stream_id,
                str(log_path),
                counter_id,
                join,
                source_identity,
                slot,
            ),
        )

    def _on_image_events(self, now_ns: int) -> int:
        """Images appeared, went or lost data: link them to subscriptions, tell clients, count."""
        events = self.receiver.take_image_events()
        channels = self.receiver.channels
        for channel, event in events:
            if channels.get(channel.endpoint) is not channel:
                continue  # the channel closed meanwhile (its last subscriber's client went away)
            match event:
                case ImageCreated():
                    receiver = channel.receive.image_by_id(event.image_id)
                    if receiver is None:  # released in the cycle it was made: nothing to tell anyone
                        continue
                    log_file = channel.claim_log(receiver)
                    source = cast(tuple[str, int], event.source)
                    host = f"[{source[0]}]" if ":" in source[0] else source[0]
                    self._next_image_id += 1
                    image = DriverImage(
                        self._next_image_id, receiver, log_file.path, log_file.mapping, f"{host}:{source[1]}"
                    )
                    channel.images[event.image_id] = image
                    name = channel.endpoint.channel
                    for label, type_id in (
                        ("rcv-hwm", RECEIVER_HWM_TYPE_ID),
                        ("rcv-pos", RECEIVER_POSITION_TYPE_ID),
                        ("rcv-naks", RECEIVER_NAKS_SENT_TYPE_ID),
                        ("rcv-lost", RECEIVER_BYTES_LOST_TYPE_ID),
                    ):
                        image.position_counters[type_id] = self._stream_counter(
                            label, type_id, image.correlation_id, event.session_id, event.stream_id, name, 0, now_ns
                        )
                    for registration_id in list(channel.subscriptions):
                        link = self.subscriptions.get(registration_id)
                        if link is not None and self._image_matches(link, image):
                            self._link_image(link, image, event.join_position, now_ns)
                case ImageRemoved():
                    removed = channel.images.get(event.image_id)
                    if removed is not None and not removed.removed:
                        removed.removed = True
                        self._unlink_image(removed, now_ns, notify=True)
                case ImageReleased():
                    released = channel.images.pop(event.image_id, None)
                    if released is not None:
                        self._unlink_image(released, now_ns, notify=True)
                        self._free_stream_counters(released.position_counters, now_ns)
                        released.close()
                case LossDetected():
                    self._record_loss(channel, event)
                case ImageEndOfStream():
                    pass  # written to the image log's metadata, where subscribers read it
                case GapFilled():
                    pass  # the loss was reported by LossDetected; the fill is counted by the image
        return len(events)

    def _unlink_image(self, image: DriverImage, now_ns: int, notify: bool) -> None:
        for registration_id, counter_id in list(image.subscribers.items()):
            self.counters.free(counter_id, now_ns // 1_000_000)
            _free_parking_slot(image.receiver.log, image.parking, registration_id)
            link = self.subscriptions.get(registration_id)
            if notify and link is not None:
                self._send(link.client, cmd.ImageUnavailable(registration_id, image.correlation_id))
        image.subscribers.clear()

    def _retire_network_publications(self, finished: list[NetworkPublication], now_ns: int) -> int:
        """Publications whose sender finished: counters freed, socket closed, log released."""
        for publication in finished:
            self.network_publications.pop(publication.registration_id, None)
            self._unwatch(publication.sock)
            self.system_counters.retire_sender(publication)
            self.counters.free(publication.limit_counter_id, now_ns // 1_000_000)
            self._free_stream_counters(publication.position_counters, now_ns)
            publication.close()
        return len(finished)

    def _remove_subscription(
        self, client: ClientSession, correlation_id: int, registration_id: int, now_ns: int
    ) -> None:
        link = self.subscriptions.get(registration_id)
        if link is None or link.client is not client:
            self._error(
                client, correlation_id, "UNKNOWN_SUBSCRIPTION", f"no subscription {registration_id} of this client"
            )
            return
        self._drop_subscription(link, now_ns)
        self._send(client, cmd.OperationSuccess(correlation_id))

    @staticmethod
    def _matches(link: SubscriptionLink, publication: IpcPublication) -> bool:
        return _wants(link, publication.stream_id, publication.session_id)

    def _link(self, link: SubscriptionLink, publication: IpcPublication, now_ns: int) -> None:
        """Join a subscription to a publication at its current position: an image appears."""
        self._add_subscriber(
            link,
            publication.subscribers,
            publication.log,
            publication.parking,
            publication.registration_id,
            publication.session_id,
            publication.stream_id,
            publication.log_path,
            publication.producer_position(),
            "aeron:ipc",
            now_ns,
        )

    def _unlink(self, link: SubscriptionLink, publication: IpcPublication, now_ns: int, notify: bool) -> None:
        counter_id = publication.subscribers.pop(link.registration_id, None)
        if counter_id is None:
            return
        _free_parking_slot(publication.log, publication.parking, link.registration_id)
        self.counters.free(counter_id, now_ns // 1_000_000)
        if notify:
            self._send(link.client, cmd.ImageUnavailable(link.registration_id, publication.registration_id))

    def _drop_subscription(self, link: SubscriptionLink, now_ns: int) -> None:
        self.subscriptions.pop(link.registration_id, None)
        link.client.subscriptions.discard(link.registration_id)
        channel = link.receive_channel
        if channel is None:
            for publication in self.publications.values():
                self._unlink(link, publication, now_ns, notify=False)
            return
        channel.subscriptions.discard(link.registration_id)
        for image in channel.images.values():
            counter_id = image.subscribers.pop(link.registration_id, None)
            if counter_id is not None:
                self.counters.free(counter_id, now_ns // 1_000_000)
                _free_parking_slot(image.receiver.log, image.parking, link.registration_id)
        still_wanted = next(
            (
                other
                for r in channel.subscriptions
                if (other := self.subscriptions.get(r)) is not None and other.stream_id == link.stream_id
            ),
            None,
        )
        if still_wanted is None:
            channel.receive.remove_subscription(link.stream_id)
        else:
            self._declare_interest(channel, still_wanted)
        if not channel.subscriptions:
            self.receive_channels.pop(channel.endpoint, None)
            self._unwatch(channel.sock)
            self.system_counters.retire_receiver(channel)
            for image in channel.images.values():
                self._free_stream_counters(image.position_counters, now_ns)
            channel.close()

    # -- end of stream and liveness ---------------------------------------------------------------

    def _check_drained(self, publication: IpcPublication, now_ns: int) -> int:
        if not publication.is_drained(self.counters):
            unblocked = publication.unblock(self.counters, now_ns, self.config.publication_unblock_timeout_ns)
            return 1 if unblocked else 0
        for registration_id in list(publication.subscribers):
            link = self.subscriptions.get(registration_id)
            if link is not None:
                self._unlink(link, publication, now_ns, notify=True)
        self.counters.free(publication.limit_counter_id, now_ns // 1_000_000)
        self._free_stream_counters(publication.position_counters, now_ns)
        del self.publications[publication.registration_id]
        publication.close()
        return 1

    def _on_stall(self) -> None:
        """Say once that the driver did not run for a while, and count it: an operator who sees streams
        hiccup, or clients of other processes time out late, finds why in the log and in ``stat``."""
        clock = self.clock
        self._stalls_seen = clock.stalls
        self.system_counters.stalls = clock.stalls
        log.warning(
            "the media driver did not run for %.1f s (its process was stopped or starved); timeouts count "
            "that as %.1f s",
            clock.last_stall_ns / 1e9,
            clock.threshold_ns / 1e9,
        )

    def _check_liveness(self, now_ns: int) -> int:
        work = 0
        timeout = self.config.client_liveness_timeout_ns
        for client in self.client_commands.timed_out(now_ns):
            self.system_counters.client_timeouts += 1
            self._close_client(client, now_ns, f"no keep-alive for {timeout / 1e9:.1f} s")
            work += 1
        return work

    def _close_client(self, client: ClientSession, now_ns: int, reason: str) -> None:
        """Close a client's connection and release what it held."""
        self.client_commands.close(client, reason)
        self._release_closed_clients(now_ns)

    def _release_closed_clients(self, now_ns: int) -> None:
        """Release everything closed clients held: their subscriptions stop holding publishers back at
        once, their publications end their streams so subscribers still get every byte before the image
        goes."""
        if not self.client_commands.has_closed:
            return
        for client, _ in self.client_commands.take_closed():
            for registration_id in list(client.subscriptions):
                link = self.subscriptions.get(registration_id)
                if link is not None:
                    self._drop_subscription(link, now_ns)
            for registration_id in list(client.publications):
                publication = self.publications.get(registration_id) or self.network_publications.get(registration_id)
                if publication is not None:
                    publication.start_draining(now_ns)
            client.publications.clear()
            for counter_id in client.counters.values():
                self.counters.free(counter_id, now_ns // 1_000_000)
            client.counters.clear()

    # -- observability --------------------------------------------------------------------------

    def _stream_counter(
        self,
        name: str,
        type_id: int,
        registration_id: int,
        session_id: int,
        stream_id: int,
        channel: str,
        owner_id: int,
        now_ns: int,
    ) -> int:
        """A per-stream counter labelled as Aeron labels them: ``name: registrationId sessionId streamId channel``."""
        return self.counters.allocate(
            f"{name}: {registration_id} {session_id} {stream_id} {channel}",
            type_id,
            registration_id=registration_id,
            owner_id=owner_id,
            now_ms=now_ns // 1_000_000,
        )

    def _add_counter(self, client: ClientSession, message: cmd.AddCounter, now_ns: int) -> None:
        """A counter of the client's own: allocated with its label, type and key, owned by the client."""
        correlation_id = message.correlation_id
        self._check_correlation(client, correlation_id)
        if not APPLICATION_TYPE_ID_MIN <= message.type_id < 1 << 31:
            raise CommandRefused(
                "INVALID_COMMAND",
                f"counter type id {message.type_id} outside [{APPLICATION_TYPE_ID_MIN}, 2**31): "
                "lower ids are the driver's",
            )
        if len(message.key) > MAX_KEY_LENGTH:
            raise CommandRefused("INVALID_COMMAND", f"counter key longer than {MAX_KEY_LENGTH} bytes")
        try:
            counter_id = self.counters.allocate(
                message.label,
                message.type_id,
                registration_id=correlation_id,
                owner_id=client.client_id,
                key=message.key,
                now_ms=now_ns // 1_000_000,
            )
        except MemoryError as exc:
            raise CommandRefused("COUNTERS_FULL", str(exc)) from None
        client.counters[correlation_id] = counter_id
        self._send(client, cmd.CounterReady(correlation_id, counter_id))

    def _remove_counter(self, client: ClientSession, message: cmd.RemoveCounter, now_ns: int) -> None:
        counter_id = client.counters.pop(message.registration_id, None)
        if counter_id is None:
            raise CommandRefused("UNKNOWN_COUNTER", f"no counter {message.registration_id} of this client")
        self.counters.free(counter_id, now_ns // 1_000_000)
        self._send(client, cmd.OperationSuccess(message.correlation_id))

    def _free_stream_counters(self, position_counters: dict[int, int], now_ns: int) -> None:
        for counter_id in position_counters.values():
            self.counters.free(counter_id, now_ns // 1_000_000)
        position_counters.clear()

    def _update_stream_counters(self) -> None:
        """Positions for readers of the counters file (stat, backlog); refreshed on the driver's timer."""
        counters = self.counters
        for publication in self.publications.values():
            counters.set(publication.position_counters[PUBLISHER_POSITION_TYPE_ID], publication.producer_position())
        for network in self.network_publications.values():
            ids = network.position_counters
            counters.set(ids[PUBLISHER_POSITION_TYPE_ID], network.log.producer_position())
            counters.set(ids[SENDER_POSITION_TYPE_ID], network.sender.sender_position)
            counters.set(ids[SENDER_LIMIT_TYPE_ID], network.sender.sender_limit)
            counters.set(ids[SENDER_NAKS_RECEIVED_TYPE_ID], network.sender.naks_received)
            counters.set(ids[SENDER_RETRANSMITS_TYPE_ID], network.sender.retransmits_sent)
        for channel in self.receive_channels.values():
            for image in channel.images.values():
                ids = image.position_counters
                receiver = image.receiver
                counters.set(ids[RECEIVER_HWM_TYPE_ID], receiver.high_water_mark)
                counters.set(ids[RECEIVER_POSITION_TYPE_ID], receiver.rebuild_position)
                counters.set(ids[RECEIVER_NAKS_SENT_TYPE_ID], receiver.naks_sent)
                counters.set(ids[RECEIVER_BYTES_LOST_TYPE_ID], receiver.bytes_lost)

    def record_error(self, text: str, observations: int = 1) -> None:
        """One more observation of a distinct error; also counted by the Errors system counter."""
        self.error_log.record(text, time.time_ns() // 1_000_000, observations)
        self.system_counters.errors += observations

    def _record_invalid_packets(self) -> None:
        """Invalid datagrams are data, not crashes: counted, and summarised in the error log per channel."""
        sources: list[tuple[int, int, str]] = [
            (id(p), p.sender.invalid_packets, p.channel) for p in self.network_publications.values()
        ]
        sources += [(id(c), c.receive.invalid_packets, c.endpoint.channel) for c in self.receive_channels.values()]
        seen = self._invalid_seen
        for key, count, channel in sources:
            delta = count - seen.get(key, 0)
            if delta > 0:
                self.record_error(f"invalid datagrams dropped on {channel}", delta)
            seen[key] = count
        # Valid SETUPs the receiver refused (max_images, max_term_length, a log it could not make): the
        # stream never connects, so say why, once per distinct reason and channel.
        refused = self._refused_seen
        for receive_channel in self.receive_channels.values():
            receiver = receive_channel.receive
            delta = receiver.setups_rejected - refused.get(id(receive_channel), 0)
            if delta > 0:
                reason = (receiver.last_error or "").removeprefix("SETUP refused: ")
                self.record_error(f"SETUP refused on {receive_channel.endpoint.channel}: {reason}", delta)
            refused[id(receive_channel)] = receiver.setups_rejected

    def _record_loss(self, channel: ReceiveChannel, event: LossDetected) -> None:
        image = next(
            (
                i
                for i in channel.images.values()
                if i.receiver.session_id == event.session_id and i.receiver.stream_id == event.stream_id
            ),
            None,
        )
        source = image.source_identity if image is not None else ""
        key = (channel.endpoint, event.session_id, event.stream_id, image.correlation_id if image else 0)
        self.loss_report.record(
            key,
            event.bytes_lost,
            time.time_ns() // 1_000_000,
            event.session_id,
            event.stream_id,
            channel.endpoint.channel,
            source,
        )

    def close(self) -> None:
        """Tear everything down: clients see the socket close, files are removed."""
        self.client_commands.close_all("driver closing")
        self._release_closed_clients(0)
        for publication in list(self.publications.values()):
            publication.close()
        self.publications.clear()
        for network in list(self.network_publications.values()):
            network.close()
        self.network_publications.clear()
        for channel in list(self.receive_channels.values()):
            channel.close()
        self.receive_channels.clear()
        self.poller.close()


def _claim_parking_slot(log: LogBuffers, parking: dict[int, int], registration_id: int) -> int:
    """Give a new subscriber of ``log`` a free slot of its parking table (-1 if all are taken).

    The conductor is the slots' only allocator, so assignment needs no atomics; the slot is cleared
    first, and from then on only the subscriber writes its parked byte, until ``_free_parking_slot``."""
    used = set(parking.values())
    for slot in range(PARKING_SLOTS):
        if slot not in used:
            log.set_parked(slot, False)
            log.set_doorbell_number(slot, 0)
            parking[registration_id] = slot
            return slot
    return -1


def _free_parking_slot(log: LogBuffers, parking: dict[int, int], registration_id: int) -> None:
    """Take an unlinked subscriber's slot back: a subscriber that died parked must not be rung forever."""
    slot = parking.pop(registration_id, None)
    if slot is not None:
        log.set_parked(slot, False)  # the byte first: a writer that still sees it set reads number 0, rings none
        log.set_doorbell_number(slot, 0)


def _wants(link: SubscriptionLink, stream_id: int, session_id: int) -> bool:
    """Does the subscription take this stream (and session, if it named one)?"""
    return link.stream_id == stream_id and (link.session_id is None or link.session_id == session_id)


def clean_publications_dir(directory: Path) -> None:
    """Remove log files a dead driver left behind, then make sure the folders exist."""
    for name in (PUBLICATIONS_DIR, IMAGES_DIR):
        folder = directory / name
        folder.mkdir(parents=True, exist_ok=True)
        for path in folder.glob("*.logbuffer"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
