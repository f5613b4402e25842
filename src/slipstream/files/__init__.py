"""The driver directory's shared files: CnC, counters, error log, loss report, client commands,
directory layout, idle strategies, and read-only observation of a running driver.

These sit below the driver and the client, as Aeron's CnC descriptor, command flyweights and
counters do: a client, the CLI or the telemetry recorder reads them without importing the driver.
May import ``wire`` and ``slipstream.errors`` only.
"""
