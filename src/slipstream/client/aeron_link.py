"""A context's link to the reference Aeron media driver (``aeronmd``) through its CnC file.

Commands go into the CnC's to-driver ring buffer, which every client of the driver writes to (a
compare-and-set on shared memory claims each record); answers come on the to-clients broadcast
buffer, which every client reads: each takes what answers its own commands and what concerns its
own subscriptions, and leaves the rest. The client proves it lives as Aeron's clients do, by writing
the time into its heartbeat counter (type 11, keyed by the client id), which the driver allocates on
the client's first command. The driver proves it lives by the ring buffer's consumer heartbeat.

Aeron's answers carry less than slipstream's driver's: a publication's channel and an image's join
position are filled in here (from the command, and from the image's subscriber position counter).
A slipstream ``Publication`` is registered as an exclusive publication: Aeron shares a plain
publication's log among every client that adds the same channel and stream, appending with an
atomic fetch-and-add on the tail, and slipstream's appender is single-writer.
"""

from __future__ import annotations

import threading
import time

from msgspec.structs import replace

from ..files import aeron_commands as aeron
from ..files import commands as cmd
from ..files.broadcast import BroadcastLappedError, BroadcastReceiver, CopyBroadcastReceiver
from ..files.cnc import CncFile
from ..files.counters import CounterInfo, CountersReader
from ..files.ringbuffer import ManyToOneRingBuffer

CLIENT_HEARTBEAT_TYPE_ID = 11
"""Aeron's counter type of a client's heartbeat timestamp (its key: the client id)."""
POLL_BUSY_S = 0.001
"""How often the broadcast buffer is read while an answer is awaited (or was just received)."""
POLL_IDLE_S = 0.01
"""How often when nothing is awaited: image notifications come within this."""
_BUSY_AFTER_S = 0.1


class AeronLink:
    """A client of ``aeronmd``, over the CnC file ``cnc`` (its flavour "aeron")."""

    parks = False  # aeronmd spins or sleeps by its own idle strategy; nobody rings it

    def __init__(self, cnc: CncFile, timeout_s: float) -> None:
        self._cnc = cnc
        self._timeout_s = timeout_s
        self._to_driver = ManyToOneRingBuffer(cnc.to_driver_buffer)
        self._to_clients = CopyBroadcastReceiver(BroadcastReceiver(cnc.to_clients_buffer))
        self._counters: CountersReader = cnc.counters_reader()
        self.client_id = self._to_driver.next_correlation_id()
        self.driver_pid = cnc.header.pid
        self.client_liveness_timeout_ns = cnc.header.client_liveness_timeout_ns
        self._mine: dict[int, cmd.ClientMessage] = {}  # commands awaiting an answer, by correlation id
        self._subscriptions: set[int] = set()
        self._received: list[cmd.DriverMessage] = []
        self._heartbeat_id = -1
        self._sent_any = False
        self._reason: str | None = None
        self._stop = threading.Event()
        self._busy_until = 0.0

    # -- commands -------------------------------------------------------------------------------

    def next_correlation_id(self) -> int:
        """From the ring buffer's correlation counter, which every client of the driver shares: answers
        come on a broadcast all clients read, so ids must be unique across them."""
        return self._to_driver.next_correlation_id()

    def send(self, message: cmd.ClientMessage) -> None:
        """Write the command into the ring buffer; a full buffer (the driver is behind) is waited for
        up to the timeout, then ``TimeoutError``."""
        if isinstance(message, cmd.AddPublication) and not message.exclusive:
            message = replace(message, exclusive=True)  # see the module's docstring
        encoded = aeron.encode_command(message, self.client_id)
        if encoded is None:
            return  # Wake, Hello: nothing to say to aeronmd
        type_id, payload = encoded
        correlation_id = getattr(message, "correlation_id", None)
        if correlation_id is not None:
            self._mine[correlation_id] = message
            if isinstance(message, cmd.AddSubscription):
                self._subscriptions.add(correlation_id)
            elif isinstance(message, cmd.RemoveSubscription):
                self._subscriptions.discard(message.registration_id)
        deadline = time.monotonic() + self._timeout_s
        while not self._to_driver.write(type_id, payload):
            if time.monotonic() >= deadline:
                self._mine.pop(correlation_id, None)  # type: ignore[arg-type]
                raise TimeoutError(f"the Aeron media driver did not read commands for {self._timeout_s:.1f} s")
            time.sleep(0.0005)
        self._sent_any = True
        self._busy_until = time.monotonic() + _BUSY_AFTER_S

    def send_keepalive(self) -> bool:
        """Write the time into this client's heartbeat counter (found once the driver made it, on our
        first command); a counter that was ours and is no longer means the driver ended us."""
        if not self._sent_any:
            return True  # the driver does not know this client yet: nothing to keep alive
        counters = self._counters
        if self._heartbeat_id < 0:
            self._heartbeat_id = self._find_heartbeat()
            if self._heartbeat_id < 0:
                return True
        elif not self._is_heartbeat(counters.info(self._heartbeat_id)):
            self._reason = (
                f"the Aeron media driver (pid {self.driver_pid}) freed this client's heartbeat counter: "
                "it timed the client out"
            )
            self._stop.set()
            return True
        counters.values_i64[counters.value_index(self._heartbeat_id)] = time.time_ns() // 1_000_000
        return True

    def _find_heartbeat(self) -> int:
        for info in self._counters:
            if self._is_heartbeat(info):
                return info.counter_id
        return -1

    def _is_heartbeat(self, info: CounterInfo | None) -> bool:
        return (
            info is not None
            and info.type_id == CLIENT_HEARTBEAT_TYPE_ID
            and int.from_bytes(info.key[:8], "little", signed=True) == self.client_id
        )

    # -- answers --------------------------------------------------------------------------------

    def receive(self, timeout_s: float) -> list[cmd.DriverMessage] | None:
        """Reads the broadcast buffer every millisecond while answers are awaited, every 10 ms else."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._stop.is_set():
                return None
            try:
                while self._to_clients.receive(self._on_record):
                    pass
            except BroadcastLappedError:
                where = self._cnc.path.parent
                self._reason = (
                    f"this client fell a broadcast buffer behind the Aeron media driver in {where}: answers were lost"
                )
                return None
            if self._received:
                out, self._received = self._received, []
                self._busy_until = time.monotonic() + _BUSY_AFTER_S
                return out
            now = time.monotonic()
            if now >= deadline:
                return []
            pace = POLL_BUSY_S if self._mine or now < self._busy_until else POLL_IDLE_S
            self._stop.wait(min(pace, deadline - now))

    def _on_record(self, type_id: int, payload: bytes) -> None:
        if type_id not in aeron.RESPONSE_NAMES:
            return  # a newer driver's message for clients that know it
        message = aeron.decode_response(type_id, payload)
        if message is None or isinstance(message, aeron.UnavailableCounter):
            return  # nothing a slipstream client acts on
        if isinstance(message, aeron.ClientTimeout):
            if message.client_id == self.client_id:
                self._reason = f"the Aeron media driver (pid {self.driver_pid}) timed this client out"
                self._stop.set()
            return
        if isinstance(message, cmd.ImageAvailable):
            if message.subscription_registration_id in self._subscriptions:
                counter_id = message.subscriber_position_counter_id
                if not 0 <= counter_id < self._counters.capacity:
                    raise aeron.AeronProtocolError(f"image {message.correlation_id}: no counter {counter_id}")
                join = self._counters.get(counter_id)
                self._received.append(replace(message, join_position=join))
            return
        if isinstance(message, cmd.ImageUnavailable):
            if message.subscription_registration_id in self._subscriptions:
                self._received.append(message)
            return
        if isinstance(message, cmd.Welcome):
            return
        correlation_id = message.correlation_id
        if isinstance(message, cmd.CounterReady) and correlation_id == self.client_id:
            if 0 <= message.counter_id < self._counters.capacity:
                self._heartbeat_id = message.counter_id  # the driver met this client: its heartbeat counter
            return
        request = self._mine.pop(correlation_id, None)
        if request is None:
            return  # another client's answer
        if isinstance(message, cmd.PublicationReady) and isinstance(request, cmd.AddPublication):
            message = aeron.with_channel(message, request)
        elif isinstance(message, cmd.ErrorResponse) and isinstance(request, cmd.AddSubscription):
            self._subscriptions.discard(correlation_id)
        self._received.append(message)

    def closed_reason(self) -> str | None:
        """Why the driver ended this client (timed out, counter freed, broadcast lapped), once it did."""
        return self._reason

    def shutdown(self) -> None:
        """Tell the driver this client is done (it frees what the client held), then end ``receive``."""
        if self._sent_any:
            encoded = aeron.encode_command(cmd.CloseClient(), self.client_id)
            if encoded is not None:
                self._to_driver.write(*encoded)
        self._stop.set()

    def close(self) -> None:
        """Nothing to release: the CnC file's mapping belongs to the context."""
        self._stop.set()
