"""Log buffers: three term partitions plus metadata over any writable buffer, with append and read.

One implementation serves IPC publications, network publications and images. May import ``wire``
(and ``slipstream.errors``); ``files``, ``protocol`` and everything above may import it.
"""

from .appender import BufferClaim, ExclusiveAppender, unblock, zero_buffer
from .header import Header
from .layout import LogBufferError, LogBuffers, compute_log_length
from .reader import FragmentHandler, is_equal_run, read_term, scan_term
from .results import ADMIN_ACTION, BACK_PRESSURED, CLOSED, MAX_POSITION_EXCEEDED, NOT_CONNECTED, result_name

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "BufferClaim",
    "ExclusiveAppender",
    "FragmentHandler",
    "Header",
    "LogBufferError",
    "LogBuffers",
    "compute_log_length",
    "read_term",
    "result_name",
    "is_equal_run",
    "scan_term",
    "unblock",
    "zero_buffer",
]
