"""Log buffers: three term partitions plus metadata over any writable buffer, with append and read.

One implementation serves IPC publications, network publications and images. May import ``wire``
(and ``slipstream.errors``); ``files``, ``protocol`` and everything above may import it.
"""

from .appender import BufferClaim, ExclusiveAppender, PyExclusiveAppender, unblock, zero_buffer
from .fastpath import fast_path_active, fast_path_description
from .header import Header
from .layout import LogBufferError, LogBuffers, compute_log_length
from .reader import (
    BlockHandler,
    FragmentHandler,
    block_frames,
    is_equal_run,
    py_is_equal_run,
    py_read_term,
    py_scan_block,
    py_scan_term,
    read_term,
    scan_block,
    scan_term,
)
from .results import ADMIN_ACTION, BACK_PRESSURED, CLOSED, MAX_POSITION_EXCEEDED, NOT_CONNECTED, result_name

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "BlockHandler",
    "BufferClaim",
    "ExclusiveAppender",
    "FragmentHandler",
    "Header",
    "LogBufferError",
    "LogBuffers",
    "PyExclusiveAppender",
    "block_frames",
    "fast_path_active",
    "fast_path_description",
    "py_is_equal_run",
    "py_read_term",
    "py_scan_block",
    "py_scan_term",
    "scan_block",
    "compute_log_length",
    "read_term",
    "result_name",
    "is_equal_run",
    "scan_term",
    "unblock",
    "zero_buffer",
]
