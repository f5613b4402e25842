"""The application layer: servers, clients and connections over slipstream's transport.

Asyncio-first, as the seed library (dorkbox Network) in Python's spelling: ``Server``/``Client`` with
listener decorators, a Noise XX handshake, every record after it encrypted (ChaCha20-Poly1305 with
counter nonces and a replay window), typed messages with msgspec, ping and ``send_sync``. The core
is sans-I/O (``handshake``, ``connection``); ``aio`` is the adapter. May import ``telemetry``,
``client`` and the floors below, never its sibling ``echo``; ``pipeline`` and ``cli`` may import it::

    async with Server(ServerConfig(app_id="chat", messages=[Hello])) as server:
        @server.on_message(Hello)
        async def hello(connection, message): await connection.send(message)
        await server.bind(20000)
"""

from .aio import Client, Connection, Ping, Server, Transfer
from .config import ClientConfig, ConfigError, ConfigTypeError, ServerConfig
from .driverstats import DriverStats
from .errors import (
    BlockingListenerError,
    ClientClosedError,
    ClientError,
    ClientRejected,
    ConnectionClosedError,
    ConnectionNotPermitted,
    ConnectTimeout,
    DriverNotAttachedError,
    InboxFull,
    MaxMessageSizeExceeded,
    MessageDecodeError,
    MessageDispatchError,
    MessageTooLarge,
    NetworkError,
    PingTimeout,
    ReceiveTimeout,
    RegistrationMismatch,
    SendSyncTimeout,
    SendTimeout,
    ServerError,
    ServerFull,
    ServerKeyChanged,
    SpillQuotaExceeded,
    StreamRefused,
    TooManyConnectionsForAddress,
    UndeliveredError,
    UnregisteredTypeError,
)
from .rmi import RemoteError, RemoteObjectMissing, RmiCallTimeout, RmiConnectionClosed, RmiError, RmiRequestRefused
from .streaming import StreamingError
from .tuning import DriverSettingsIgnored

__all__ = [
    "BlockingListenerError",
    "Client",
    "ClientClosedError",
    "ClientConfig",
    "ClientError",
    "ClientRejected",
    "ConfigError",
    "ConfigTypeError",
    "ConnectTimeout",
    "Connection",
    "ConnectionClosedError",
    "ConnectionNotPermitted",
    "DriverNotAttachedError",
    "DriverStats",
    "DriverSettingsIgnored",
    "InboxFull",
    "MessageDecodeError",
    "MessageDispatchError",
    "MaxMessageSizeExceeded",
    "MessageTooLarge",
    "NetworkError",
    "Ping",
    "PingTimeout",
    "ReceiveTimeout",
    "RegistrationMismatch",
    "SendSyncTimeout",
    "SendTimeout",
    "Server",
    "ServerConfig",
    "ServerError",
    "ServerFull",
    "ServerKeyChanged",
    "TooManyConnectionsForAddress",
    "Transfer",
    "UndeliveredError",
    "UnregisteredTypeError",
    "RemoteError",
    "RemoteObjectMissing",
    "RmiCallTimeout",
    "RmiConnectionClosed",
    "RmiError",
    "RmiRequestRefused",
    "SpillQuotaExceeded",
    "StreamRefused",
    "StreamingError",
]
