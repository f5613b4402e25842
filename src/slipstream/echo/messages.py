"""The echo protocol's lines, and one-time pad, without any I/O.

Everything a peer sends is parsed here, strictly, before a server or client acts on it: a line
either matches the guide's grammar exactly or raises :class:`MessageError`, so a malformed or
hostile message is answered (or ignored) by the caller and can never crash it. The allocators (the
guide's ``EchoServerPortAllocator``, ``EchoServerSessionAllocator`` and address counter) live in
:mod:`slipstream.client.allocation`, shared with the network layer, and are re-exported here.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Final

from ..client.allocation import AddressCounter, AllocationError, PortAllocator, SessionAllocator

__all__ = [
    "ECHO_STREAM_ID",
    "ERROR_BAD_MESSAGE",
    "ERROR_NO_DUOLOGUE",
    "ERROR_SERVER_FULL",
    "ERROR_TOO_MANY_CONNECTIONS",
    "RESERVED_SESSION_ID_HIGH",
    "RESERVED_SESSION_ID_LOW",
    "AddressCounter",
    "AllocationError",
    "ConnectResponse",
    "DuologueResponse",
    "EchoResponse",
    "ErrorResponse",
    "InitialResponse",
    "MessageError",
    "PortAllocator",
    "SessionAllocator",
    "SessionErrorResponse",
    "UnrecognizedResponse",
    "admission_error",
    "decode",
    "decrypt_session",
    "encrypt_session",
    "format_connect",
    "format_echo",
    "format_error",
    "format_hello",
    "format_hello_port",
    "format_session_error",
    "new_key",
    "parse_duologue_response",
    "parse_echo",
    "parse_hello",
    "parse_hello_port",
    "parse_initial_response",
    "to_i32",
]

ECHO_STREAM_ID: Final = 0x2044F002
"""The stream id both takes of the guide use for every channel."""

RESERVED_SESSION_ID_LOW: Final = 1
RESERVED_SESSION_ID_HIGH: Final = 2**31 - 1
"""The guide's ``EchoSessions`` range: the server picks duologue sessions here, and drivers started by
the echo commands assign their own sessions outside it, so the two never collide."""

ERROR_SERVER_FULL: Final = "server full"
ERROR_TOO_MANY_CONNECTIONS: Final = "too many connections for IP address"
ERROR_BAD_MESSAGE: Final = "bad message"
ERROR_NO_DUOLOGUE: Final = "could not create duologue"
"""Not in the guide: the driver refused the duologue's channels (say a port another program holds).
It still has the specified ``<session> ERROR <message>`` form, so clients log it and exit."""

_U32: Final = 0xFFFF_FFFF
_I32_MIN: Final = -(2**31)
_I32_MAX: Final = 2**31 - 1

# fullmatch everywhere: ``$`` in Python also matches before a trailing newline.
_HELLO_PORT_RE: Final = re.compile(r"HELLO ([0-9]{1,5})", re.ASCII)
_HELLO_RE: Final = re.compile(r"HELLO ([0-9A-Fa-f]{1,8})", re.ASCII)
_SESSION_RE: Final = re.compile(r"(0|-?[1-9][0-9]{0,9}) (.*)", re.ASCII | re.DOTALL)  # as Java prints an int
_CONNECT_RE: Final = re.compile(r"CONNECT ([0-9]{1,5}) ([0-9]{1,5}) ([0-9A-Fa-f]{1,8})", re.ASCII)
_ERROR_RE: Final = re.compile(r"ERROR (.*)", re.DOTALL)
_ECHO_RE: Final = re.compile(r"ECHO (.*)", re.DOTALL)


class MessageError(ValueError):
    """A line that does not follow the echo protocol's grammar."""


def to_i32(value: int) -> int:
    """Reinterpret the low 32 bits as a signed int, as Java's ``int`` (and Aeron's session ids) are."""
    value &= _U32
    return value - (1 << 32) if value > _I32_MAX else value


def _show(text: str) -> str:
    """repr() cut short, so hostile input cannot flood a log line or an exception message."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def decode(payload: bytes | bytearray | memoryview) -> str | None:
    """A message's text, or None when it is not valid UTF-8 (all messages are UTF-8 strings)."""
    try:
        return bytes(payload).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _port(text: str, what: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise MessageError(f"{what} {port} is not a UDP port (1..65535)")
    return port


# -- take 1 -----------------------------------------------------------------------------------------


def format_hello_port(port: int) -> str:
    """Take 1's first message: the port the client listens on for echoes."""
    if not 0 < port < 65536:
        raise ValueError(f"port must be 1..65535: {port}")
    return f"HELLO {port}"


def parse_hello_port(text: str) -> int:
    """Take 1: the port of ``HELLO <port>``."""
    match = _HELLO_PORT_RE.fullmatch(text)
    if match is None:
        raise MessageError(f"expected 'HELLO <port>', got {_show(text)}")
    return _port(match[1], "port")


# -- take 2: the one-time pad -----------------------------------------------------------------------


def new_key() -> int:
    """A fresh one-time pad: 32 random bits from the OS. Never reuse one for a second connection."""
    return secrets.randbits(32)


def encrypt_session(session_id: int, key: int) -> int:
    """``z ^ <key>`` as the unsigned 32-bit value the CONNECT line carries."""
    return (session_id & _U32) ^ (key & _U32)


def decrypt_session(encrypted: int, key: int) -> int:
    """``k = <encrypted-session> ^ <key>``, as the signed session id to put in channel URIs."""
    return to_i32(encrypted ^ key)


# -- take 2: all-clients channel --------------------------------------------------------------------


def format_hello(key: int) -> str:
    """``HELLO <key>``: the key in upper-case hexadecimal, as the guide's client writes it."""
    if not 0 <= key <= _U32:
        raise ValueError(f"key must be an unsigned 32-bit value: {key}")
    return f"HELLO {key:X}"


def parse_hello(text: str) -> int:
    """The key of ``HELLO <key>`` (1 to 8 hexadecimal digits, either case)."""
    match = _HELLO_RE.fullmatch(text)
    if match is None:
        raise MessageError(f"expected 'HELLO <key>', got {_show(text)}")
    return int(match[1], 16)


def format_connect(session_id: int, port: int, control_port: int, encrypted_session: int) -> str:
    """``<session> CONNECT <port> <control-port> <encrypted-session>``."""
    if not (0 < port < 65536 and 0 < control_port < 65536):
        raise ValueError(f"ports must be 1..65535: {port}, {control_port}")
    if not 0 <= encrypted_session <= _U32:
        raise ValueError(f"encrypted session must be an unsigned 32-bit value: {encrypted_session}")
    return f"{to_i32(session_id)} CONNECT {port} {control_port} {encrypted_session:X}"


def format_session_error(session_id: int, message: str) -> str:
    """``<session> ERROR <message>``: an error addressed to one client on the shared channel."""
    return f"{to_i32(session_id)} ERROR {message}"


@dataclass(frozen=True, slots=True)
class ConnectResponse:
    """Where the client's duologue is: data ``port``, ``control_port`` and the session, encrypted."""

    session_id: int
    port: int
    control_port: int
    encrypted_session: int

    def duologue_session(self, key: int) -> int:
        return decrypt_session(self.encrypted_session, key)


@dataclass(frozen=True, slots=True)
class SessionErrorResponse:
    """The server refused the client whose session is ``session_id``."""

    session_id: int
    message: str


@dataclass(frozen=True, slots=True)
class UnrecognizedResponse:
    """Addressed to ``session_id`` but neither CONNECT nor ERROR: logged, and waiting goes on."""

    session_id: int
    body: str


InitialResponse = ConnectResponse | SessionErrorResponse | UnrecognizedResponse


def parse_initial_response(text: str) -> InitialResponse:
    """A line of the all-clients channel. Raises MessageError only when it names no session, since a
    client must ignore anything addressed to another session, however malformed."""
    match = _SESSION_RE.fullmatch(text)
    if match is None:
        raise MessageError(f"expected '<session> ...', got {_show(text)}")
    session_id = int(match[1])
    if not _I32_MIN <= session_id <= _I32_MAX:
        raise MessageError(f"session {session_id} is not a 32-bit integer")
    body = match[2]
    error = _ERROR_RE.fullmatch(body)
    if error is not None:
        return SessionErrorResponse(session_id, error[1])
    connect = _CONNECT_RE.fullmatch(body)
    if connect is not None:
        try:
            port = _port(connect[1], "port")
            control_port = _port(connect[2], "control port")
        except MessageError:
            return UnrecognizedResponse(session_id, body)
        return ConnectResponse(session_id, port, control_port, int(connect[3], 16))
    return UnrecognizedResponse(session_id, body)


# -- take 2: duologues ------------------------------------------------------------------------------


def format_echo(message: str) -> str:
    return f"ECHO {message}"


def format_error(message: str) -> str:
    return f"ERROR {message}"


def parse_echo(text: str) -> str:
    """The message of ``ECHO <message>`` (any text, possibly empty, after exactly one space)."""
    match = _ECHO_RE.fullmatch(text)
    if match is None:
        raise MessageError(f"expected 'ECHO <message>', got {_show(text)}")
    return match[1]


@dataclass(frozen=True, slots=True)
class EchoResponse:
    message: str


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    message: str


DuologueResponse = EchoResponse | ErrorResponse


def parse_duologue_response(text: str) -> DuologueResponse:
    """What the server sends on a duologue: ``ECHO <message>`` or ``ERROR <message>``."""
    echo = _ECHO_RE.fullmatch(text)
    if echo is not None:
        return EchoResponse(echo[1])
    error = _ERROR_RE.fullmatch(text)
    if error is not None:
        return ErrorResponse(error[1])
    raise MessageError(f"expected 'ECHO <message>' or 'ERROR <message>', got {_show(text)}")


# -- take 2: the server's decisions -----------------------------------------------------------------


def admission_error(duologues: int, max_clients: int, owned_by_address: int, max_per_address: int) -> str | None:
    """The error a HELLO gets, or None to admit it; "server full" is checked first, as specified."""
    if duologues >= max_clients:
        return ERROR_SERVER_FULL
    if owned_by_address >= max_per_address:
        return ERROR_TOO_MANY_CONNECTIONS
    return None
