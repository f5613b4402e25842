"""Aeron wire-protocol constants: frame types, flags, header offsets, sizes and limits.

Every number here comes from the public Aeron protocol (see shared/reference/aeron-wire-protocol.md);
keeping them in one module means codecs, log buffers and the driver cannot drift apart.
"""

from __future__ import annotations

from typing import Final

CURRENT_VERSION: Final = 0
FRAME_ALIGNMENT: Final = 32
HEADER_LENGTH: Final = 8
"""Length of the common header every frame starts with."""
DATA_HEADER_LENGTH: Final = 32

# Frame types (u16 at offset 6).
HDR_TYPE_PAD: Final = 0x00
HDR_TYPE_DATA: Final = 0x01
HDR_TYPE_NAK: Final = 0x02
HDR_TYPE_SM: Final = 0x03
HDR_TYPE_ERR: Final = 0x04
HDR_TYPE_SETUP: Final = 0x05
HDR_TYPE_RTTM: Final = 0x06
HDR_TYPE_RES: Final = 0x07
HDR_TYPE_RSP_SETUP: Final = 0x0B
HDR_TYPE_EXT: Final = 0xFFFF

# DATA / PAD flags.
BEGIN_FLAG: Final = 0x80
END_FLAG: Final = 0x40
EOS_FLAG: Final = 0x20
REVOKED_FLAG: Final = 0x10
UNFRAGMENTED: Final = BEGIN_FLAG | END_FLAG

# SETUP flags.
SETUP_SEND_RESPONSE_FLAG: Final = 0x80
SETUP_GROUP_FLAG: Final = 0x40

# STATUS MESSAGE flags.
SM_SEND_SETUP_FLAG: Final = 0x80
SM_EOS_FLAG: Final = 0x40

# RTTM flags.
RTTM_REPLY_FLAG: Final = 0x80

# ERR flags.
ERR_GROUP_TAG_FLAG: Final = 0x08
ERROR_CODE_IMAGE_REJECTED: Final = 13
MAX_ERROR_MESSAGE_LENGTH: Final = 1023

# Header lengths per type.
SETUP_LENGTH: Final = 40
SM_LENGTH: Final = 36
SM_WITH_GROUP_TAG_LENGTH: Final = 44
NAK_LENGTH: Final = 28
RTTM_LENGTH: Final = 40
ERR_HEADER_LENGTH: Final = 40
RSP_SETUP_LENGTH: Final = 20

# DATA header field offsets.
FRAME_LENGTH_OFFSET: Final = 0
VERSION_OFFSET: Final = 4
FLAGS_OFFSET: Final = 5
TYPE_OFFSET: Final = 6
TERM_OFFSET_OFFSET: Final = 8
SESSION_ID_OFFSET: Final = 12
STREAM_ID_OFFSET: Final = 16
TERM_ID_OFFSET: Final = 20
RESERVED_VALUE_OFFSET: Final = 24

# Sizes and limits.
TERM_MIN_LENGTH: Final = 64 * 1024
TERM_MAX_LENGTH: Final = 1024 * 1024 * 1024
TERM_DEFAULT_LENGTH: Final = 16 * 1024 * 1024
IPC_TERM_DEFAULT_LENGTH: Final = 64 * 1024 * 1024
MTU_DEFAULT: Final = 1408
MTU_MIN: Final = 64
MTU_MAX: Final = 65504
MAX_MESSAGE_LENGTH_LIMIT: Final = 16 * 1024 * 1024
