"""The abuse list as a running application receives it: Spark publishes it, a server refuses its addresses.

The pipeline's streaming query publishes the abuse list as a snapshot: one ``AbuseEntry`` message per
listed host (a tagged msgpack map, what the ``slipstream`` sink writes), numbered (query id, batch id,
sequence), each batch the whole list of its time. ``AbuseListSubscriber`` receives it through
:class:`~slipstream.telemetry.sinkfeed.SinkSubscriber` (repeats of a replayed batch dropped, the
retained latest batch read first, so a server that starts after the last batch has the list at once)
and replaces its list with each complete batch. Each entry expires at its ``expires_ns`` (when the
host's refusals fall out of the query's window), checked against the wall clock here, since the query
publishes nothing until new refusals arrive. Its :meth:`~AbuseListSubscriber.admit` is the callback a
server's admission check calls: False for a listed address. It lives on this floor (not in the
pipeline) so that the network layer, which may import telemetry but never the pipeline, can use it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec

from ..client import Context
from .sinkfeed import Envelope, SinkSubscriber

ABUSE_LIST_TYPE = "AbuseEntry"


class AbuseEntry(msgspec.Struct, tag=ABUSE_LIST_TYPE, tag_field="type", forbid_unknown_fields=False):
    """One listed host: its refused handshakes within the window, why, the last one's time, and when
    the entry expires (0: never, from a publisher without a window)."""

    address: str
    rejections: int
    reasons: str = ""
    last_ns: int = 0
    expires_ns: int = 0


class AbuseListSubscriber:
    """Subscribes to the published abuse list; ``admit(address)`` refuses listed addresses.

    Call :meth:`poll` from the application's loop, or :meth:`start` a thread that does. ``host:port``
    and bare ``host`` entries both match an address's host. ``version`` is the (query id, batch id) of
    the snapshot applied; ``clock`` (wall-clock ns) decides expiry.
    """

    def __init__(
        self,
        context: Context,
        channel: str,
        stream_id: int,
        *,
        on_listed: Callable[[AbuseEntry], object] | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.on_listed = on_listed
        self.clock = clock
        self._listed: dict[str, AbuseEntry] = {}
        self.invalid = 0
        """Messages that were not abuse-list entries (counted and dropped, never raised)."""
        self._decoder = msgspec.msgpack.Decoder(AbuseEntry)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.feed = SinkSubscriber(context, channel, stream_id, on_batch=self._on_batch)
        self.subscription = self.feed.subscription

    @property
    def messages(self) -> int:
        """Messages received (repeats of a replayed batch included)."""
        return self.feed.messages

    @property
    def version(self) -> tuple[str, int] | None:
        """The applied snapshot's (query id, batch id); None before the first."""
        return self.feed.version

    @property
    def entries(self) -> dict[str, AbuseEntry]:
        """The listed hosts now: the last snapshot's entries that have not expired."""
        now = self.clock()
        with self._lock:
            return {a: e for a, e in self._listed.items() if e.expires_ns == 0 or e.expires_ns > now}

    def _on_batch(self, envelope: Envelope, records: list[bytes]) -> None:
        listed: dict[str, AbuseEntry] = {}
        for record in records:
            try:
                entry = self._decoder.decode(record)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.invalid += 1
                continue
            listed[_host(entry.address)] = entry
        with self._lock:
            before, self._listed = self._listed, listed
        if self.on_listed is not None:
            for host, entry in listed.items():
                if host not in before:
                    self.on_listed(entry)

    def poll(self, fragment_limit: int = 64) -> int:
        """Read what has arrived; returns the fragments read."""
        return self.feed.poll(fragment_limit)

    def admit(self, address: str) -> bool:
        """The admission callback: False when ``address``'s host is on the abuse list and not expired."""
        with self._lock:
            entry = self._listed.get(_host(address))
        return entry is None or (entry.expires_ns != 0 and entry.expires_ns <= self.clock())

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
        self.feed.close()


def _host(address: str) -> str:
    if address.startswith("["):  # [v6]:port
        return address[1:].partition("]")[0]
    host, sep, port = address.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else address
