"""The media driver: Aeron's agents over the sans-I/O machines, composed in one thread.

``media_driver`` runs them (embedded, standalone or invoked by the application) on the time of
``clock``, which leaves the driver's own stalls out of every timeout; ``conductor`` is the admin agent
and composes the others: ``client_commands`` (clients' sockets: bytes in, commands out, responses
queued), ``sender_agent`` over ``network_publication``s, ``receiver_agent`` over ``receive_channel``s,
and the IPC publications' limits (``ipc_publication``). ``udp_channel`` holds the sockets (GSO/GRO
batching), ``poller`` the one epoll they share, ``system_counters`` the totals.
May import ``protocol``, ``files``, ``logbuffer``, ``wire`` and ``slipstream.errors``; the client
imports the driver only to start an embedded one.
"""
