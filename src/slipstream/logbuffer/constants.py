"""Log-buffer layout constants: partitions, metadata section, page size.

They describe the shared log files, not the wire, so they live with the log buffers (Aeron's
``LogBufferDescriptor``).
"""

from __future__ import annotations

from typing import Final

PARTITION_COUNT: Final = 3
LOG_META_DATA_LENGTH: Final = 4096
PAGE_SIZE_DEFAULT: Final = 4096
