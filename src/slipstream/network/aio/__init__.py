"""The asyncio adapter: the only part of the network layer that touches an event loop."""

from ..results import Ping, Transfer
from .client import Client
from .connection import Connection
from .server import Server

__all__ = ["Client", "Connection", "Ping", "Server", "Transfer"]
