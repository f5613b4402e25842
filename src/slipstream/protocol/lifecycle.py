"""The one lifecycle every transport resource goes through: publications, senders and images.

Aeron's publications and images share it (active, draining, linger, done); an IPC publication skips
the linger. Kept as one enum so the driver and the machines compare the same values.
"""

from __future__ import annotations

import enum

__all__ = ["ACTIVE", "DONE", "DRAINING", "LINGER", "ImageState", "Lifecycle", "SenderState"]


class Lifecycle(enum.Enum):
    """Where a publication, sender or image is in its life."""

    ACTIVE = "active"
    DRAINING = "draining"
    """Closed (or, for an image, no more data will come: EOS, liveness timeout or unsubscribed): what is
    left still goes out, or subscribers still read it (an image's SMs carry EOS meanwhile)."""
    LINGER = "linger"
    """Done with its data but kept: a sender answers NAKs until an EOS SM or its linger timeout; an image
    has left its endpoint and its log stays readable until the linger ends."""
    DONE = "done"
    """Over: its log may be released."""


SenderState = Lifecycle
"""A network publication's sender lifecycle (the C driver's)."""
ImageState = Lifecycle
"""A publication image's lifecycle (the C driver's)."""

ACTIVE, DRAINING, LINGER, DONE = Lifecycle.ACTIVE, Lifecycle.DRAINING, Lifecycle.LINGER, Lifecycle.DONE
"""The members as module names, for the duty cycles' comparisons: on Python 3.11 reading an attribute of an Enum
class goes through its metaclass's ``__getattr__`` hook (about 80 ns, eight times a global's), and the driver and
the senders compare states on every pass."""
