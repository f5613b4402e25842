"""The handshake: client and server machines, sans-I/O (bytes and ``now_ns`` in; bytes, events and a
deadline out).

Rules of this package (read these first; its modules are their code: ``packets`` the wire, ``client``
and ``server`` the two machines):

1. Noise XX in three messages, then a WELCOME: ``HELLO`` (-> e), ``HELLO_ACK`` (<- e, ee, s, es + the
   connection expiry and a *fingerprint* of the server's registrations, or a refusal), ``DONE``
   (-> s, se + the client's delivery session and, only when the fingerprints differ, its registration
   description), ``WELCOME`` (<- the allocation, sealed under a key derived from the server's send key).
2. The transcript binds what the server decides on: the Noise prologue is the protocol name followed by
   the HELLO up to its Noise message (header with the nonce, app id, tag, flags), so a HELLO altered on
   the way cannot complete. The client refuses a WELCOME offering plaintext records it did not ask for.
3. Nothing about the application before admission, and every answer readable by its client alone
   (answers share one broadcast channel; a stream per HELLO would be state before admission): a
   refusal at HELLO (app id, filters, limits) is the payload of the Noise message 2, encrypted to that
   HELLO's ephemeral key; a refusal after DONE (the client's key, filters and limits again, then the
   registrations, then the allocation) is a ``REJECT`` sealed under the handshake's keys. Only a
   client that passed admission is told how the registrations differ (the REJECT carries the
   server's description; the client names the difference itself).
4. Every packet starts with ``version, type, nonce`` (the nonce is the client's random 64-bit
   connect key). The server keys half-open handshakes by (transport source, nonce), so a packet from
   another source cannot touch a client's handshake.
5. The server allocates nothing before ``DONE`` proves the client holds the keys of its HELLO:
   ids, ports and streams come only with ``ClientAccepted``. Half-open handshakes live in a table
   capped at ``max_pending`` (the oldest is dropped to make room) and expire after the handshake
   timeout; the Diffie-Hellman work for every answer to a new HELLO (a refusal too) is limited by a
   token bucket, so a flood of forged HELLOs costs bounded memory and CPU, and a real client (which
   retries) still gets in.
6. Retransmission: the client resends its last message with back-off until the timeout; the server
   answers a repeated HELLO or DONE with the answer it cached, never with new work. A DONE the server
   cannot use (its half-open handshake expired or was evicted, or a late HELLO made it start a new one)
   gets an ``EXPIRED`` answer (a digest of that DONE, so no one else can send it), and the client starts
   over with a fresh nonce and ephemeral key instead of repeating that DONE until its timeout.
"""

from __future__ import annotations

from .client import ClientHandshake, ClientState, rejection_error
from .packets import (
    BAD_APP_ID,
    KEY_CHANGED,
    PLAINTEXT_REFUSED,
    PROTOCOL_NAME,
    REGISTRATION_MISMATCH_LOCAL,
    VERSION,
    PacketType,
    done_digest,
    fingerprint,
    packet_nonce,
)
from .server import REPEAT_GAP_NS, AdmissionCheck, ServerHandshake, ServerStats

__all__ = [
    "BAD_APP_ID",
    "KEY_CHANGED",
    "PLAINTEXT_REFUSED",
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
    "fingerprint",
    "packet_nonce",
    "rejection_error",
]
