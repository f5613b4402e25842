"""``Image.block_poll`` (Aeron's blockPoll): whole frames in blocks, within the limit, nothing skipped."""

from __future__ import annotations

import time
from pathlib import Path

from slipstream import Context, DriverConfig


def test_block_poll_delivers_every_frame_once_in_blocks_within_the_limit(driver_dir: Path) -> None:
    config = DriverConfig(directory=driver_dir, ipc_term_length=64 * 1024)
    with Context(driver_dir, driver="embedded", driver_config=config) as context:
        subscription = context.add_subscription("aeron:ipc", 9)
        publication = context.add_publication("aeron:ipc", 9)
        deadline = time.monotonic() + 10
        while not subscription.images:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        image = subscription.images[0]
        sent = [bytes([i % 251]) * (40 if i % 50 else 3000) for i in range(600)]  # equal runs, fragments
        frames: list[tuple[int, int, bytes]] = []  # (flags, type, payload)
        blocks: list[int] = []

        def on_block(term: memoryview, session_id: int, term_id: int) -> None:
            assert session_id == publication.session_id
            before = len(frames)
            offset = 0
            end = length = len(term)
            while offset < end:
                frame_length = int.from_bytes(term[offset : offset + 4], "little")
                assert term[offset + 6] == 1  # DATA only: padding to a term's end is skipped, never handed out
                assert 32 <= frame_length <= end - offset
                frames.append((term[offset + 5], term[offset + 6], bytes(term[offset + 32 : offset + frame_length])))
                offset += (frame_length + 31) & -32
            blocks.append(length if len(frames) - before > 1 else 0)  # one frame may exceed the limit

        for message in sent:  # the 64 KiB term wraps several times: padding at each term's end
            while publication.offer(message) < 0:
                assert time.monotonic() < deadline
                image.block_poll(on_block, 1000)
        while image.position < publication.position:
            assert time.monotonic() < deadline
            image.block_poll(on_block, 1000)
    assert len(blocks) > 1 and max(blocks) <= 1000
    data = [(flags, payload) for flags, kind, payload in frames if kind == 1]
    messages: list[bytes] = []
    partial = b""
    for flags, payload in data:
        partial += payload
        if flags & 0x40:  # END
            messages.append(partial)
            partial = b""
    assert messages == sent
