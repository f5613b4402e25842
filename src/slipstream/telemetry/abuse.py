"""The abuse list as a running application receives it: Spark publishes it, a server refuses its addresses.

The pipeline's streaming query publishes one ``AbuseEntry`` message per listed address (a tagged
msgpack map, what the ``slipstream`` sink writes) onto a slipstream stream. ``AbuseListSubscriber``
keeps the set of listed addresses up to date from that stream, and its :meth:`~AbuseListSubscriber.admit`
is the callback a server's admission check calls: False for a listed address. It lives on this floor
(not in the pipeline) so that the network layer, which may import telemetry but never the pipeline,
can use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgspec

from ..client import Context, FragmentAssembler, Header, Subscription

ABUSE_LIST_TYPE = "AbuseEntry"


class AbuseEntry(msgspec.Struct, tag=ABUSE_LIST_TYPE, tag_field="type", forbid_unknown_fields=False):
    """One listed address: how many handshakes it had refused, and why."""

    address: str
    rejections: int
    reasons: str = ""


class AbuseListSubscriber:
    """Subscribes to the published abuse list; ``admit(address)`` refuses listed addresses.

    Call :meth:`poll` from the application's loop, or :meth:`start` a thread that does. ``host:port``
    and bare ``host`` entries both match an address's host.
    """

    def __init__(
        self,
        context: Context,
        channel: str,
        stream_id: int,
        *,
        on_listed: Callable[[AbuseEntry], object] | None = None,
    ) -> None:
        self.subscription: Subscription = context.add_subscription(channel, stream_id)
        self.on_listed = on_listed
        self.entries: dict[str, AbuseEntry] = {}
        self.messages = 0
        self.invalid = 0
        """Messages that were not abuse-list entries (counted and dropped, never raised)."""
        self._decoder = msgspec.msgpack.Decoder(AbuseEntry)
        self._assembler = FragmentAssembler(self._on_message)
        self._hosts: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _on_message(self, buffer: memoryview, header: Header) -> None:
        self.messages += 1
        try:
            entry = self._decoder.decode(buffer)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.invalid += 1
            return
        is_new = entry.address not in self.entries
        self.entries[entry.address] = entry
        self._hosts = self._hosts | {_host(entry.address)}
        if is_new and self.on_listed is not None:
            self.on_listed(entry)

    def poll(self, fragment_limit: int = 64) -> int:
        """Read what has arrived; returns the fragments read."""
        return self.subscription.poll(self._assembler, fragment_limit)

    def admit(self, address: str) -> bool:
        """The admission callback: False when ``address`` (or its host) is on the abuse list."""
        return address not in self.entries and _host(address) not in self._hosts

    def start(self, idle_s: float = 0.005) -> AbuseListSubscriber:
        """Poll on a daemon thread until :meth:`close`."""
        def run() -> None:
            while not self._stop.is_set():
                if self.poll() == 0:
                    self._stop.wait(idle_s)

        self._thread = threading.Thread(target=run, name="slipstream-abuse-list", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread (if any) and close the subscription."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.subscription.close()


def _host(address: str) -> str:
    if address.startswith("["):  # [v6]:port
        return address[1:].partition("]")[0]
    host, sep, port = address.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else address
