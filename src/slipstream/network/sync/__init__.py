"""The application layer for blocking code: ``Server``, ``Client`` and ``Connection`` over the same
machines as :mod:`..aio`, with no event loop. One poll thread per process runs every blocking endpoint's
duty cycle; a thread that waits for an answer (``send_sync``, ``ping``, ``receive``, a remote call) runs
the cycles itself meanwhile, so the answer is taken in where it is wanted::

    with Server(ServerConfig(app_id="chat", messages=[Hello])) as server:
        @server.on_message(Hello)
        def hello(connection, message):
            connection.send_nowait(message)
        server.bind(20000)
        server.serve_forever()

``busy_poll=True`` spins instead of parking (the lowest latency, a core each for the poll thread and for a
thread that waits). Listeners are plain functions run on the thread that cycles; they must not wait for an
answer themselves (:class:`~..errors.BlockingListenerError`).
"""

from ..results import Ping, Transfer
from .client import Client
from .connection import INBOX_LIMIT, Connection
from .rmi import Proxy
from .server import Server

__all__ = ["INBOX_LIMIT", "Client", "Connection", "Ping", "Proxy", "Server", "Transfer"]
