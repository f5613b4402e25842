"""Sans-I/O protocol layer: wire frames, positions, channel URIs and protocol state machines."""
