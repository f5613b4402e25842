"""Reassembly of messages that were split into several frames (longer than MTU - 32 bytes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..logbuffer import FragmentHandler, Header
from ..logbuffer.fastpath import FAST
from ..wire.constants import BEGIN_FLAG, END_FLAG, UNFRAGMENTED


class PyFragmentAssembler:
    """Wraps a handler so it receives whole messages. Partial messages are kept per session; a gap
    in a session's frames (which cannot happen on a reliable stream) drops the partial message.

    The pure-Python reference; ``FragmentAssembler`` is the C one when the fast path is active.
    """

    __slots__ = ("_buffers", "_handler", "_next_offset")

    def __init__(self, handler: FragmentHandler) -> None:
        self._handler = handler
        self._buffers: dict[int, bytearray] = {}
        self._next_offset: dict[int, int] = {}

    def __call__(self, fragment: memoryview, header: Header) -> None:
        flags = header.flags
        if flags & UNFRAGMENTED == UNFRAGMENTED:
            self._handler(fragment, header)
            return
        session_id = header.session_id
        offset = header.offset
        next_offset = offset + ((header.frame_length + 31) & -32)
        if flags & BEGIN_FLAG:
            buffer = self._buffers.get(session_id)
            if buffer is None:
                buffer = self._buffers[session_id] = bytearray()
            buffer[:] = fragment
            self._next_offset[session_id] = next_offset
            return
        buffer = self._buffers.get(session_id)
        if buffer is None or not buffer or self._next_offset.get(session_id) != offset:
            if buffer is not None:
                buffer.clear()
            return
        buffer += fragment
        if flags & END_FLAG:
            try:
                with memoryview(buffer) as view:
                    self._handler(view, header)
            finally:
                try:
                    buffer.clear()
                except BufferError:  # the handler kept a slice of the message: it keeps this buffer
                    self._buffers[session_id] = bytearray()
        else:
            self._next_offset[session_id] = next_offset

    def free_session_buffer(self, session_id: int) -> None:
        """Forget a session's partial message (call from an unavailable-image handler)."""
        self._buffers.pop(session_id, None)
        self._next_offset.pop(session_id, None)


if TYPE_CHECKING or FAST is None:
    FragmentAssembler = PyFragmentAssembler
else:

    class FragmentAssembler(FAST.AssemblerCore):  # type: ignore[misc,name-defined]
        """Wraps a handler so it receives whole messages (as ``PyFragmentAssembler``, the reference),
        with its state in C: polled through ``Subscription.poll`` / ``Image.poll``, a fragment of a
        longer message is copied in C and the handler is called once per message. The message view is
        valid only during the call; a handler that keeps it keeps a buffer the assembler then gives up.
        """

        __slots__ = ()
