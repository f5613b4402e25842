"""The driver directory's shared files: CnC (with Aeron's ring buffer and broadcast buffer), counters,
error log, loss report, client commands (slipstream's and Aeron's), directory layout, idle strategies,
and read-only observation of a running driver.

These sit below the driver and the client, as Aeron's CnC descriptor, command flyweights and
counters do: a client, the CLI or the telemetry recorder reads them without importing the driver.
May import ``wire``, ``logbuffer`` (its atomic operations and log layout) and ``slipstream.errors`` only.
"""
