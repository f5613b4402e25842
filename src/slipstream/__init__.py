"""slipstream: fast, secure messaging between processes and machines."""

__version__ = "0.1.0"
