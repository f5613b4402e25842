"""Sans-I/O transport machines: the network publication's sender and the receive endpoint's images.

They take datagrams and ``now_ns`` and return datagrams and events; no sockets, threads or clocks.
May import ``wire`` and ``logbuffer``.
"""
