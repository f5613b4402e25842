"""Echo, take 2 ("Echo 2.0"): works behind NAT, one duologue per client, limits and expiry.

Clients meet the server on an *all clients* channel: they send ``HELLO <key>`` to its data port and
hear its replies through dynamic multi-destination-cast, registering at its control port from their
own socket, so the replies travel back through the NAT mapping that registration made. The server
answers ``<session> CONNECT <port> <control-port> <encrypted-session>`` (or ``<session> ERROR ...``),
and the client moves to its *duologue*: a publication/subscription pair of its own on two ports from
``[base, base + 2 * max_clients)``, with a session id from the reserved range that only the client
can decrypt (``z ^ <key>``). The driver drops anything on the duologue under another session id.

All server state (duologues, allocators, address counts) belongs to the thread running
:meth:`EchoServer.run`. Image callbacks come on the client library's thread, so they only queue events.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..client import (
    BackoffIdleStrategy,
    Context,
    DriverError,
    ExclusivePublication,
    FragmentAssembler,
    Header,
    Image,
    Subscription,
)
from ..driver.config import DriverConfig
from .common import (
    POLL_PAUSE_S,
    ClientPacing,
    ContextOwner,
    EchoError,
    SendError,
    channel,
    host_of,
    join_host_port,
    send_text,
    wait_for,
)
from .messages import (
    ECHO_STREAM_ID,
    ERROR_BAD_MESSAGE,
    ERROR_NO_DUOLOGUE,
    RESERVED_SESSION_ID_HIGH,
    RESERVED_SESSION_ID_LOW,
    AddressCounter,
    AllocationError,
    ConnectResponse,
    EchoResponse,
    ErrorResponse,
    MessageError,
    PortAllocator,
    SessionAllocator,
    SessionErrorResponse,
    admission_error,
    decode,
    encrypt_session,
    format_connect,
    format_echo,
    format_error,
    format_hello,
    format_session_error,
    new_key,
    parse_duologue_response,
    parse_echo,
    parse_hello,
    parse_initial_response,
)

__all__ = [
    "DUOLOGUE_LINGER",
    "RELEASE_DELAY_S",
    "EchoClient",
    "EchoClientRejectedError",
    "EchoClientTimedOutError",
    "EchoServer",
    "EchoServerConfiguration",
    "driver_config",
]

log = logging.getLogger("slipstream.echo.take2")

DUOLOGUE_LINGER = "500ms"
"""How long a closed duologue's publication lingers to repair its last message (say ``ERROR bad
message``). Short, because its control port goes back to a small pool for the next client."""

RELEASE_DELAY_S = 1.0
"""A closed duologue keeps its ports, session id and place in the limits this long, until the driver
has let its publication linger out and released the control port; only then is it deleted. Freeing
the ports at once (as the guide does) would hand the next client a port that is still bound."""

_CREATE_ATTEMPTS = 3
"""Port pairs tried for one duologue when the driver refuses one (a port another program holds)."""


class EchoClientRejectedError(EchoError):
    """The server answered with an error (server full, too many connections, bad message...)."""


class EchoClientTimedOutError(EchoError):
    """The server did not answer (or connect) within the timeout."""


def driver_config(low: int = RESERVED_SESSION_ID_LOW, high: int = RESERVED_SESSION_ID_HIGH) -> DriverConfig:
    """A driver that leaves ``[low, high]`` to the echo server, as the guide's ``create`` sets up.

    Applies when the echo command starts the driver; a standalone driver needs the same range."""
    return DriverConfig(reserved_session_id_low=low, reserved_session_id_high=high)


# -- server -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EchoServerConfiguration:
    """The guide's ``EchoServerConfiguration``; durations in seconds."""

    directory: Path | None
    local_address: str
    local_initial_port: int
    local_initial_control_port: int
    local_clients_base_port: int
    client_maximum_count: int
    maximum_connections_per_address: int = 3
    duologue_expiry_s: float = 10.0
    reserved_session_id_low: int = RESERVED_SESSION_ID_LOW
    reserved_session_id_high: int = RESERVED_SESSION_ID_HIGH

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        for name in ("local_initial_port", "local_initial_control_port", "local_clients_base_port"):
            if not 0 < getattr(self, name) < 65536:
                raise ValueError(f"{name} must be a UDP port 1..65535: {getattr(self, name)}")
        if self.client_maximum_count < 1:
            raise ValueError(f"client_maximum_count must be at least 1: {self.client_maximum_count}")
        if self.local_clients_base_port + 2 * self.client_maximum_count - 1 > 65535:
            raise ValueError("local_clients_base_port + 2 * client_maximum_count exceeds port 65535")
        clients = range(self.local_clients_base_port, self.local_clients_base_port + 2 * self.client_maximum_count)
        for name in ("local_initial_port", "local_initial_control_port"):
            if getattr(self, name) in clients:
                raise ValueError(f"{name} {getattr(self, name)} lies in the duologue ports [{clients.start}, "
                                 f"{clients.stop})")
        if self.local_initial_port == self.local_initial_control_port:
            raise ValueError("the initial data and control ports must differ")
        if self.maximum_connections_per_address < 1:
            raise ValueError(f"maximum_connections_per_address must be at least 1: "
                             f"{self.maximum_connections_per_address}")
        if not self.duologue_expiry_s > 0:
            raise ValueError(f"duologue_expiry_s must be positive: {self.duologue_expiry_s}")
        SessionAllocator(self.reserved_session_id_low, self.reserved_session_id_high)  # checks the range


class _Duologue:
    """One client's conversation: publication ``t`` (MDC control port), subscription ``u`` (data port)."""

    def __init__(
        self,
        server: EchoServer,
        owner: str,
        initial_session: int,
        session_id: int,
        port: int,
        control_port: int,
        publication: ExclusivePublication,
        subscription: Subscription,
        expires_at: float,
    ) -> None:
        self.server = server
        self.owner = owner
        self.initial_session = initial_session
        self.session_id = session_id
        self.port = port
        self.control_port = control_port
        self.publication = publication
        self.subscription = subscription
        self.expires_at = expires_at
        self.done = False
        """Finished (bad message, failed send, last client gone): the server deletes it next cycle.
        Closing waits for that, because a handler must not close the subscription being polled."""
        self._closed = False
        self.release_at: float | None = None
        """Set when closed: the time its resources go back to the server's pools."""
        self.assembler = FragmentAssembler(self._on_message)

    def poll(self) -> int:
        return self.subscription.poll(self.assembler, 10)

    def is_expired(self, now: float) -> bool:
        """Nobody is connected (no image) and the time limit has passed."""
        return self.subscription.image_count == 0 and now > self.expires_at

    def _on_message(self, payload: memoryview, header: Header) -> None:
        self.server._check_thread()
        if self.done:
            return  # the rest of a batch polled after a bad message
        text = decode(payload)
        log.debug("[%d] received: %s", self.session_id, text if text is not None else "(not UTF-8)")
        try:
            message = parse_echo(text) if text is not None else None
        except MessageError:
            message = None
        if message is not None:
            try:
                send_text(self.publication, format_echo(message), logger=log)
            except SendError as exc:
                log.error("[%d] failed to send message: %s", self.session_id, exc)
                self.done = True
            return
        self.done = True
        try:
            send_text(self.publication, format_error(ERROR_BAD_MESSAGE), logger=log)
        except SendError as exc:
            log.error("[%d] failed to send message: %s", self.session_id, exc)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.done = True
        try:
            self.publication.close()
        finally:
            self.subscription.close()


_Event = tuple[bool, int | None, Image]
"""(available?, duologue session or None for the all-clients channel, image)."""


class EchoServer(ContextOwner):
    """The Echo 2.0 server. ``run`` serves until its ``stop`` event is set; ``close`` releases all."""

    def __init__(self, configuration: EchoServerConfiguration, *, rng: random.Random | None = None) -> None:
        configuration.validate()
        self.configuration = configuration
        self.context = Context(
            configuration.directory,
            driver_config=driver_config(configuration.reserved_session_id_low, configuration.reserved_session_id_high),
        )
        if not self.context.is_embedded:
            log.warning(
                "attached to the running driver in %s: it must leave session ids [%d, %d] to this server "
                "(reserved_session_id_low/high), or duologues may clash with its other publications",
                self.context.directory,
                configuration.reserved_session_id_low,
                configuration.reserved_session_id_high,
            )
        self.duologues: dict[int, _Duologue] = {}
        """By duologue session id."""
        self.ports = PortAllocator(configuration.local_clients_base_port, 2 * configuration.client_maximum_count, rng)
        self.sessions = SessionAllocator(
            configuration.reserved_session_id_low, configuration.reserved_session_id_high, rng
        )
        self.addresses = AddressCounter()
        self._events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._publication: ExclusivePublication | None = None
        self._subscription: Subscription | None = None

    def _check_thread(self) -> None:
        """The guide's ``assertIsExecutorThread``: catch a state access from the wrong thread early."""
        if threading.current_thread() is not self._thread:
            raise RuntimeError("echo server state touched outside the server's thread")

    def run(self, stop: threading.Event) -> None:
        config = self.configuration
        self._thread = threading.current_thread()
        address = config.local_address
        pub_uri = channel(
            control=join_host_port(address, config.local_initial_control_port), control_mode="dynamic", reliable=True
        )
        sub_uri = channel(endpoint=join_host_port(address, config.local_initial_port), reliable=True)
        self._publication = self.context.add_exclusive_publication(pub_uri, ECHO_STREAM_ID)
        self._subscription = self.context.add_subscription(
            sub_uri,
            ECHO_STREAM_ID,
            on_available_image=lambda image: self._events.put((True, None, image)),
            on_unavailable_image=lambda image: self._events.put((False, None, image)),
        )
        log.info(
            "echo server (take 2) on %s: all-clients publication %s, subscription %s; duologue ports [%d, %d), "
            "at most %d clients, %d per address, expiry %g s",
            address,
            pub_uri,
            sub_uri,
            config.local_clients_base_port,
            config.local_clients_base_port + 2 * config.client_maximum_count,
            config.client_maximum_count,
            config.maximum_connections_per_address,
            config.duologue_expiry_s,
        )
        assembler = FragmentAssembler(self._on_initial_message)
        idle = BackoffIdleStrategy(max_sleep_s=0.002)
        while not stop.is_set():
            work = self._drain_events()
            work += self._subscription.poll(assembler, 100)
            work += self._poll_duologues(time.monotonic())
            idle.idle(work)

    # -- events from the client thread ----------------------------------------------------------------

    def _drain_events(self) -> int:
        self._check_thread()
        count = 0
        while count < 1000:  # bounded: the rest wait for the next duty cycle
            try:
                available, duologue_session, image = self._events.get_nowait()
            except queue.Empty:
                break
            count += 1
            if duologue_session is None:
                state = "connected" if available else "disconnected"
                log.debug("[%d] initial client %s (%s)", image.session_id, state, image.source_identity)
                continue
            duologue = self.duologues.get(duologue_session)
            if duologue is None or duologue.done:
                continue
            host = host_of(image.source_identity)
            if available:
                if host == duologue.owner:
                    log.debug("[%d] client with correct IP connected", duologue.session_id)
                else:
                    log.warning("[%d] connecting client has wrong address: %s", duologue.session_id, host)
            elif duologue.subscription.image_count == 0:
                log.debug("[%d] last client (%s) disconnected", duologue.session_id, host)
                duologue.done = True
            else:
                log.debug("[%d] client %s disconnected", duologue.session_id, host)
        return count

    # -- the all-clients channel -----------------------------------------------------------------------

    def _on_initial_message(self, payload: memoryview, header: Header) -> None:
        self._check_thread()
        session = header.session_id
        text = decode(payload)
        log.debug("[%d] received: %s", session, text if text is not None else "(not UTF-8)")
        try:
            key = parse_hello(text) if text is not None else None
        except MessageError:
            key = None
        if key is None:
            self._reply(format_session_error(session, ERROR_BAD_MESSAGE))
            return
        assert self._subscription is not None
        image = self._subscription.image_by_session_id(session)
        owner = host_of(image.source_identity) if image is not None else None
        if owner is None:
            log.warning("[%d] HELLO from a session whose address is unknown: ignored", session)
            return
        config = self.configuration
        error = admission_error(
            len(self.duologues),
            config.client_maximum_count,
            self.addresses.count_for(owner),
            config.maximum_connections_per_address,
        )
        if error is not None:
            log.debug("[%d] %s", session, error)
            self._reply(format_session_error(session, error))
            return
        duologue = self._allocate_duologue(session, owner)
        if duologue is None:
            self._reply(format_session_error(session, ERROR_NO_DUOLOGUE))
            return
        log.debug("[%d] created new duologue", session)
        encrypted = encrypt_session(duologue.session_id, key)
        self._reply(format_connect(session, duologue.port, duologue.control_port, encrypted))

    def _reply(self, text: str) -> None:
        assert self._publication is not None
        try:
            send_text(self._publication, text, logger=log)
        except SendError as exc:
            log.error("could not reply %r: %s", text, exc)

    def _allocate_duologue(self, initial_session: int, owner: str) -> _Duologue | None:
        """Ports, a session id and the driver's channels for a new duologue; None if the driver refuses."""
        config = self.configuration
        for _ in range(_CREATE_ATTEMPTS):
            try:
                port, control_port = self.ports.allocate(2)
            except AllocationError as exc:
                log.error("[%d] %s", initial_session, exc)
                return None
            try:
                session_id = self.sessions.allocate()
            except AllocationError as exc:
                log.error("[%d] %s", initial_session, exc)
                self.ports.free(port)
                self.ports.free(control_port)
                return None
            log.debug(
                "creating new duologue at %s (%d,%d) session %d for %s",
                config.local_address,
                port,
                control_port,
                session_id,
                owner,
            )
            try:
                duologue = self._open_duologue(owner, initial_session, session_id, port, control_port)
            except DriverError as exc:
                log.warning("[%d] cannot open duologue on ports %d, %d: %s", initial_session, port, control_port, exc)
                self.sessions.free(session_id)
                self.ports.free(port)
                self.ports.free(control_port)
                continue
            self.duologues[session_id] = duologue
            self.addresses.increment(owner)
            return duologue
        log.error("[%d] no duologue after %d attempts", initial_session, _CREATE_ATTEMPTS)
        return None

    def _open_duologue(
        self, owner: str, initial_session: int, session_id: int, port: int, control_port: int
    ) -> _Duologue:
        address = self.configuration.local_address
        pub_uri = channel(
            control=join_host_port(address, control_port),
            control_mode="dynamic",
            session_id=session_id,
            reliable=True,
            linger=DUOLOGUE_LINGER,
        )
        sub_uri = channel(endpoint=join_host_port(address, port), session_id=session_id, reliable=True)
        publication = self.context.add_exclusive_publication(pub_uri, ECHO_STREAM_ID)
        try:
            subscription = self.context.add_subscription(
                sub_uri,
                ECHO_STREAM_ID,
                on_available_image=lambda image: self._events.put((True, session_id, image)),
                on_unavailable_image=lambda image: self._events.put((False, session_id, image)),
            )
        except BaseException:
            publication.close()
            raise
        expires_at = time.monotonic() + self.configuration.duologue_expiry_s
        return _Duologue(
            self, owner, initial_session, session_id, port, control_port, publication, subscription, expires_at
        )

    # -- duologues -------------------------------------------------------------------------------------

    def _poll_duologues(self, now: float) -> int:
        """Close finished and expired duologues, delete closed ones once their channels are gone (freeing
        ports, session and address slot), and poll the rest."""
        self._check_thread()
        work = 0
        for duologue in list(self.duologues.values()):
            if duologue.release_at is not None:
                if now >= duologue.release_at:
                    self._delete(duologue)
                    work += 1
                continue
            expired = duologue.is_expired(now)
            if not (expired or duologue.done):
                work += duologue.poll()
                continue
            log.debug("[%d] duologue %s", duologue.initial_session, "closed" if duologue.done else "expired")
            try:
                duologue.close()
            except DriverError as exc:
                log.warning("[%d] closing duologue: %s", duologue.session_id, exc)
            duologue.release_at = now + RELEASE_DELAY_S
            work += 1
        return work

    def _delete(self, duologue: _Duologue) -> None:
        del self.duologues[duologue.session_id]
        self.ports.free(duologue.port)
        self.ports.free(duologue.control_port)
        self.sessions.free(duologue.session_id)
        self.addresses.decrement(duologue.owner)
        log.debug(
            "[%d] deleted duologue (session %d, ports %d, %d)",
            duologue.initial_session,
            duologue.session_id,
            duologue.port,
            duologue.control_port,
        )

    def close(self) -> None:
        for duologue in self.duologues.values():
            try:
                duologue.close()
            except DriverError as exc:
                log.warning("[%d] closing duologue: %s", duologue.session_id, exc)
        self.duologues.clear()
        super().close()


# -- client -----------------------------------------------------------------------------------------


class EchoClient(ContextOwner):
    """The Echo 2.0 client: HELLO on the all-clients channel, then ECHO on its own duologue.

    ``count`` > 0 stops after that many ECHO messages and their answers; 0 runs until stopped. Every
    wait is bounded by ``timeout_s``; failures raise EchoError (the guide's client logs and exits).
    """

    def __init__(
        self,
        directory: str | Path | None,
        remote_address: str,
        remote_initial_port: int,
        remote_initial_control_port: int,
        *,
        count: int = 0,
        interval_s: float = 1.0,
        timeout_s: float = 10.0,
        reserved_session_id_low: int = RESERVED_SESSION_ID_LOW,
        reserved_session_id_high: int = RESERVED_SESSION_ID_HIGH,
    ) -> None:
        self.pacing = ClientPacing(count, interval_s, timeout_s)
        self.remote_address = remote_address
        self.remote_initial_port = remote_initial_port
        self.remote_initial_control_port = remote_initial_control_port
        self.timeout_s = timeout_s
        config = driver_config(reserved_session_id_low, reserved_session_id_high)
        self.context = Context(directory, driver_config=config)
        self.session_id: int | None = None
        """This client's session on the all-clients channel, once its publication exists."""
        self.duologue: ConnectResponse | None = None
        self._key = 0
        self._error: str | None = None
        self._random = random.SystemRandom()

    @property
    def received(self) -> int:
        """ECHO answers received so far."""
        return self.pacing.received

    def _remote(self, port: int) -> str:
        return join_host_port(self.remote_address, port)

    def run(self, stop: threading.Event) -> None:
        self._key = new_key()  # fresh for every connection attempt: a pad used twice is broken
        timeout = self.timeout_s
        s = self.context.add_subscription(
            channel(control=self._remote(self.remote_initial_control_port), control_mode="dynamic", reliable=True),
            ECHO_STREAM_ID,
        )
        if not wait_for(lambda: s.image_count > 0, timeout, stop):
            raise EchoClientTimedOutError("timed out making the initial subscription to the server")
        log.debug("initial subscription connected")
        p = self.context.add_exclusive_publication(
            channel(endpoint=self._remote(self.remote_initial_port), reliable=True), ECHO_STREAM_ID
        )
        if not wait_for(lambda: p.is_connected, timeout, stop):
            raise EchoClientTimedOutError("timed out making the initial publication to the server")
        log.debug("initial publication connected")
        session = self.session_id = p.session_id
        send_text(p, format_hello(self._key), logger=log)
        log.debug("waiting for response")
        connect = self._wait_for_connect(s, session, stop)
        if connect is None:
            return  # stopped
        k = connect.duologue_session(self._key)
        log.debug("[%d] connect %d %d (encrypted %d)", session, connect.port, connect.control_port,
                  connect.encrypted_session)
        t = self.context.add_subscription(
            channel(control=self._remote(connect.control_port), control_mode="dynamic", session_id=k, reliable=True),
            ECHO_STREAM_ID,
        )
        u = self.context.add_exclusive_publication(
            channel(endpoint=self._remote(connect.port), session_id=k, reliable=True), ECHO_STREAM_ID
        )
        s.close()
        p.close()
        if not wait_for(lambda: t.image_count > 0, timeout, stop):
            raise EchoClientTimedOutError("timed out making the CONNECT subscription to the server")
        log.debug("CONNECT subscription connected")
        if not wait_for(lambda: u.is_connected, timeout, stop):
            raise EchoClientTimedOutError("timed out making the CONNECT publication to the server")
        log.debug("CONNECT publication connected")
        self._echo_loop(t, u, session, stop)

    def _wait_for_connect(self, s: Subscription, session: int, stop: threading.Event) -> ConnectResponse | None:
        found: list[ConnectResponse] = []

        def on_response(payload: memoryview, header: Header) -> None:
            text = decode(payload)
            if text is None:
                return
            log.debug("[%d] response: %s", session, text)
            try:
                response = parse_initial_response(text)
            except MessageError:
                log.error("[%d] server returned unrecognized message: %s", session, text)
                return
            if response.session_id != session:
                log.debug("[%d] ignored message intended for another client", session)
                return
            if isinstance(response, SessionErrorResponse):
                log.error("[%d] server returned an error: %s", session, response.message)
                self._error = response.message
            elif isinstance(response, ConnectResponse):
                found.append(response)
            else:
                log.error("[%d] server returned unrecognized message: %s", session, response.body)

        assembler = FragmentAssembler(on_response)
        deadline = time.monotonic() + self.timeout_s
        while not stop.is_set():
            s.poll(assembler, 100)
            if self._error is not None:
                raise EchoClientRejectedError(f"server rejected this client: {self._error}")
            if found:
                self.duologue = found[0]
                return found[0]
            if time.monotonic() > deadline:
                raise EchoClientTimedOutError("timed out waiting for the CONNECT response from the server")
            time.sleep(POLL_PAUSE_S)
        return None

    def _echo_loop(self, t: Subscription, u: ExclusivePublication, session: int, stop: threading.Event) -> None:
        assembler = FragmentAssembler(lambda payload, header: self._on_echo_response(session, payload))
        pacing = self.pacing
        while not stop.is_set():
            now = time.monotonic()
            if pacing.due(now):
                text = f"{self._random.getrandbits(64):x}"
                send_text(u, format_echo(text), logger=log)  # SendError: the server is gone
                pacing.on_sent(text, now)
            polled = t.poll(assembler, 100)
            if self._error is not None:
                raise EchoClientRejectedError(f"server returned an error: {self._error}")
            if pacing.finished():
                return
            overdue = pacing.overdue(time.monotonic())
            if overdue is not None:
                raise EchoClientTimedOutError(overdue)
            if polled == 0:
                if t.image_count == 0:
                    raise EchoError("the server closed the duologue")
                time.sleep(POLL_PAUSE_S)

    def _on_echo_response(self, session: int, payload: memoryview) -> None:
        text = decode(payload)
        if text is None:
            log.error("[%d] server returned a message that is not UTF-8", session)
            return
        log.debug("[%d] response: %s", session, text)
        try:
            response = parse_duologue_response(text)
        except MessageError:
            log.error("[%d] server returned unrecognized message: %s", session, text)
            return
        if isinstance(response, ErrorResponse):
            log.error("[%d] server returned an error: %s", session, response.message)
            self._error = response.message
            return
        assert isinstance(response, EchoResponse)
        log.debug("[%d] ECHO %s", session, response.message)
        if not self.pacing.on_answer(response.message):
            log.warning("[%d] echo of something this client did not send: %s", session, response.message)
