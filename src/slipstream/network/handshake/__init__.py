"""The handshake: client and server machines, sans-I/O (bytes and ``now_ns`` in; bytes, events and a
deadline out).

Rules of this package (read these first; its modules are their code: ``packets`` the wire, ``client``
and ``server`` the two machines):

1. Noise XX in three messages, then a WELCOME: ``HELLO`` (-> e), ``HELLO_ACK`` (<- e, ee, s, es + the
   server's registration description), ``DONE`` (-> s, se + the client's description), ``WELCOME``
   (<- the allocation, sealed under a key derived from the server's send key). A ``REJECT`` carries a
   reason code and a short text; it is not authenticated (it can only stop a handshake, which a
   man in the middle can do anyway by dropping packets).
2. Every packet starts with ``version, type, nonce`` (the nonce is the client's random 64-bit
   connect key). The server keys half-open handshakes by (transport source, nonce), so a packet from
   another source cannot touch a client's handshake.
3. The server allocates nothing before ``DONE`` proves the client holds the keys of its HELLO:
   ids, ports and streams come only with ``ClientAccepted``. Half-open handshakes live in a table
   capped at ``max_pending`` (the oldest is dropped to make room) and expire after the handshake
   timeout; the Diffie-Hellman work for new HELLOs is limited by a token bucket, so a flood of
   forged HELLOs costs bounded memory and CPU, and a real client (which retries) still gets in.
4. Retransmission: the client resends its last message with back-off until the timeout; the server
   answers a repeated HELLO or DONE with the answer it cached, never with new work. A DONE the server
   cannot use (its half-open handshake expired or was evicted, or a late HELLO made it start a new one)
   gets a ``HANDSHAKE_EXPIRED`` REJECT, and the client starts over with a fresh nonce and ephemeral
   key instead of repeating that DONE until its timeout.
5. Admission (limits, filters, tag) is checked at HELLO (cheap refusals before any DH) and again at
   DONE (the client's key is known only then; the counts may have changed).
"""

from __future__ import annotations

from .client import ClientHandshake, ClientState, rejection_error
from .packets import (
    BAD_APP_ID,
    KEY_CHANGED,
    PROTOCOL_NAME,
    REGISTRATION_MISMATCH_LOCAL,
    VERSION,
    PacketType,
    done_digest,
    packet_nonce,
    reject_packet,
)
from .server import REPEAT_GAP_NS, AdmissionCheck, ServerHandshake, ServerStats

__all__ = [
    "BAD_APP_ID",
    "KEY_CHANGED",
    "PROTOCOL_NAME",
    "REGISTRATION_MISMATCH_LOCAL",
    "REPEAT_GAP_NS",
    "VERSION",
    "AdmissionCheck",
    "ClientHandshake",
    "ClientState",
    "PacketType",
    "ServerHandshake",
    "ServerStats",
    "done_digest",
    "packet_nonce",
    "reject_packet",
    "rejection_error",
]
