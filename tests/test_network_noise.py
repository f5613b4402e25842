"""Noise XX: published test vectors (cacophony), a fresh handshake, and hostile messages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.network.errors import NoiseError
from slipstream.network.noise import CipherState, HandshakeState, generate_keypair, public_key

# From the cacophony test vectors (vectors/cacophony.txt of haskell-cryptography/cacophony): messages 1-3 are
# the handshake, 4-6 transport messages (responder, initiator, responder: turns keep alternating) under
# the split cipher states.
PROLOGUE = "4a6f686e2047616c74"
INIT_STATIC = "e61ef9919cde45dd5f82166404bd08e38bceb5dfdfded0a34c8df7ed542214d1"
INIT_EPHEMERAL = "893e28b9dc6ca8d611ab664754b8ceb7bac5117349a4439a6b0569da977c464a"
RESP_STATIC = "4a3acbfdb163dec651dfa3194dece676d437029c62a408b4c5ea9114246e4893"
RESP_EPHEMERAL = "bbdb4cdbd309f1a1f2e1456967fe288cadd6f712d65dc7b7793d5e63da6b375b"
PAYLOADS = [
    "4c756477696720766f6e204d69736573",
    "4d757272617920526f746862617264",
    "462e20412e20486179656b",
    "4361726c204d656e676572",
    "4a65616e2d426170746973746520536179",
    "457567656e2042f6686d20766f6e2042617765726b",
]
VECTORS = {
    "BLAKE2s": (
        "6c4c56cf71612f72d05ceb96c0155e6f4ea54a26b504c93de632a2db4a49d200",
        [
            "ca35def5ae56cec33dc2036731ab14896bc4c75dbb07a61f879f8e3afa4c79444c756477696720766f6e204d69736573",
            "95ebc60d2b1fa672c1f46a8aa265ef51bfe38e7ccb39ec5be34069f1448088437c365eb362a1c991b0557fe8a7fb187d99346765"
            "d93ec63db6c1b01504ebeec55a2298d2dbff80eff034d20595153f63a196a6cead1e11b2bb13e336fa13616dd3e8b0a070c882ed3f"
            "1a78c7c06c93",
            "46c3307de83b014258717d97781c1f50936d8b7d50c0722a1739654d10392d415b670c114f79b9a4f80541570f77ce88802efa42"
            "20cff733e7b5668ba38059ec904b4b8eef9448085faf51",
            "d5e83adfaac5dc324a68f1862df54549e56d209fba707205f328b2",
            "d102c9029b1f55c788f561ba7737afbccef9c9f1bf2f238167fd40ba9c1c134867",
            "cb1ce80960382c6d5d5e740ffb724d1432f0310b200fb6f8424120f506092744baa415e155",
        ],
    ),
    "SHA256": (
        "c8e5f64e846193be2a834104c2a009868d6c9f3bd3c186299888b488b2f1f58e",
        [
            "ca35def5ae56cec33dc2036731ab14896bc4c75dbb07a61f879f8e3afa4c79444c756477696720766f6e204d69736573",
            "95ebc60d2b1fa672c1f46a8aa265ef51bfe38e7ccb39ec5be34069f14480884381cbad1f276e038c48378ffce2b65285e08d6b68"
            "aaa3629a5a8639392490e5b9bd5269c2f1e4f488ed8831161f19b7815528f8982ffe09be9b5c412f8a0db50f8814c7194e83f23dbd"
            "8d162c9326ad",
            "c7195ffacac1307ff99046f219750fc47693e23c3cb08b89c2af808b444850a80ae475b9df0f169ae80a89be0865b57f58c9fea0"
            "d4ec82a286427402f113e4b6ae769a1d95941d49b25030",
            "96763ed773f8e47bb3712f0e29b3060ffc956ffc146cee53d5e1df",
            "3e40f15f6f3a46ae446b253bf8b1d9ffb6ed9b174d272328ff91a7e2e5c79c07f5",
            "eb3f3515110702e047a6c9da4478b6ead94873c11c0f2d710ddb3f09fce024b3a58502ae3f",
        ],
    ),
}


def vector_pair(hash_name: str) -> tuple[HandshakeState, HandshakeState]:
    initiator = HandshakeState(
        initiator=True,
        static_private=bytes.fromhex(INIT_STATIC),
        ephemeral_private=bytes.fromhex(INIT_EPHEMERAL),
        prologue=bytes.fromhex(PROLOGUE),
        hash_name=hash_name,
    )
    responder = HandshakeState(
        initiator=False,
        static_private=bytes.fromhex(RESP_STATIC),
        ephemeral_private=bytes.fromhex(RESP_EPHEMERAL),
        prologue=bytes.fromhex(PROLOGUE),
        hash_name=hash_name,
    )
    return initiator, responder


@pytest.mark.parametrize("hash_name", ["BLAKE2s", "SHA256"])
def test_cacophony_xx_vectors(hash_name: str) -> None:
    handshake_hash, ciphertexts = VECTORS[hash_name]
    initiator, responder = vector_pair(hash_name)
    writers = [initiator, responder, initiator]
    for index in range(3):
        writer = writers[index]
        reader = responder if writer is initiator else initiator
        message = writer.write_message(bytes.fromhex(PAYLOADS[index]))
        assert message.hex() == ciphertexts[index], f"handshake message {index + 1}"
        assert reader.read_message(message).hex() == PAYLOADS[index]
    assert initiator.is_complete and responder.is_complete
    assert initiator.handshake_hash.hex() == handshake_hash
    assert responder.handshake_hash.hex() == handshake_hash
    assert initiator.remote_static == public_key(bytes.fromhex(RESP_STATIC))
    assert responder.remote_static == public_key(bytes.fromhex(INIT_STATIC))
    i_send, i_receive = initiator.split()
    r_send, r_receive = responder.split()
    assert i_send.key == r_receive.key and i_receive.key == r_send.key and i_send.key != i_receive.key
    for index in range(3, 6):
        send, receive = (i_send, r_receive) if index % 2 == 0 else (r_send, i_receive)
        ciphertext = send.encrypt_with_ad(b"", bytes.fromhex(PAYLOADS[index]))
        assert ciphertext.hex() == ciphertexts[index], f"transport message {index + 1}"
        assert receive.decrypt_with_ad(b"", ciphertext).hex() == PAYLOADS[index]


def handshake(hash_name: str = "BLAKE2s") -> tuple[HandshakeState, HandshakeState, bytes, bytes, bytes]:
    client_private, _ = generate_keypair()
    server_private, _ = generate_keypair()
    client = HandshakeState(initiator=True, static_private=client_private, prologue=b"app", hash_name=hash_name)
    server = HandshakeState(initiator=False, static_private=server_private, prologue=b"app", hash_name=hash_name)
    m1 = client.write_message(b"hello")
    assert server.read_message(m1) == b"hello"
    m2 = server.write_message(b"server description")
    assert client.read_message(m2) == b"server description"
    m3 = client.write_message(b"client description")
    assert server.read_message(m3) == b"client description"
    return client, server, m1, m2, m3


def test_fresh_handshake_agrees() -> None:
    client, server, *_ = handshake()
    assert client.handshake_hash == server.handshake_hash
    assert client.remote_static == server.local_static and server.remote_static == client.local_static
    c_send, c_receive = client.split()
    s_send, s_receive = server.split()
    assert s_receive.decrypt_with_ad(b"ad", c_send.encrypt_with_ad(b"ad", b"x")) == b"x"
    assert c_receive.decrypt_with_ad(b"", s_send.encrypt_with_ad(b"", b"y")) == b"y"


def test_keypair_is_raw_32_bytes() -> None:
    private, public = generate_keypair()
    assert len(private) == 32 and len(public) == 32 and public_key(private) == public


@pytest.mark.parametrize("which", [1, 2])
def test_tampered_messages_raise_noise_error(which: int) -> None:
    client_private, _ = generate_keypair()
    server_private, _ = generate_keypair()
    client = HandshakeState(initiator=True, static_private=client_private)
    server = HandshakeState(initiator=False, static_private=server_private)
    m1 = client.write_message()
    server.read_message(m1)
    m2 = bytearray(server.write_message(b"p"))
    if which == 1:
        m2[40] ^= 1  # inside the encrypted static key
        with pytest.raises(NoiseError):
            client.read_message(bytes(m2))
    else:
        client.read_message(bytes(m2))
        m3 = bytearray(client.write_message(b"q"))
        m3[-1] ^= 0x80  # the payload's tag
        with pytest.raises(NoiseError):
            server.read_message(bytes(m3))
        with pytest.raises(NoiseError, match="failed earlier"):
            server.read_message(bytes(m3))
        with pytest.raises(NoiseError):
            server.split()


def test_prologue_mismatch_fails() -> None:
    a_private, _ = generate_keypair()
    b_private, _ = generate_keypair()
    client = HandshakeState(initiator=True, static_private=a_private, prologue=b"one")
    server = HandshakeState(initiator=False, static_private=b_private, prologue=b"two")
    server.read_message(client.write_message())
    with pytest.raises(NoiseError):
        client.read_message(server.write_message())


def test_short_long_and_out_of_turn_messages() -> None:
    private, _ = generate_keypair()
    server = HandshakeState(initiator=False, static_private=private)
    with pytest.raises(NoiseError, match="not this side's to write"):
        server.write_message()
    with pytest.raises(NoiseError, match="must be 32"):
        server.read_message(b"\x01" * 31)
    client_private, _ = generate_keypair()
    client = HandshakeState(initiator=True, static_private=client_private)
    client.write_message()
    for bad in (b"", b"\x00" * 95, b"\x00" * 65536):
        fresh = HandshakeState(initiator=True, static_private=client_private)
        fresh.write_message()
        with pytest.raises(NoiseError):
            fresh.read_message(bad)
    with pytest.raises(NoiseError, match="not this side's to read"):
        HandshakeState(initiator=True, static_private=private).read_message(b"\x00" * 32)


def test_low_order_key_is_refused() -> None:
    private, _ = generate_keypair()
    server = HandshakeState(initiator=False, static_private=private)
    server.read_message(bytes(32))  # the all-zero point: accepted as bytes, refused at the DH
    with pytest.raises(NoiseError, match="low-order"):
        server.write_message()


def test_handshake_with_sha256_and_payload_limit() -> None:
    client, server, *_ = handshake("SHA256")
    assert client.handshake_hash == server.handshake_hash
    private, _ = generate_keypair()
    big = HandshakeState(initiator=True, static_private=private)
    with pytest.raises(NoiseError, match="exceeds"):
        big.write_message(bytes(65536))
    with pytest.raises(ValueError, match="hash_name"):
        HandshakeState(initiator=True, static_private=private, hash_name="MD5")
    with pytest.raises(ValueError, match="32 bytes"):
        HandshakeState(initiator=True, static_private=b"short")


def test_cipher_state_refuses_forgery_and_keeps_the_nonce() -> None:
    key = bytes(range(32))
    send, receive = CipherState(key), CipherState(key)
    first = send.encrypt_with_ad(b"", b"one")
    with pytest.raises(NoiseError):
        receive.decrypt_with_ad(b"", first[:-1] + bytes([first[-1] ^ 1]))
    with pytest.raises(NoiseError, match="shorter"):
        receive.decrypt_with_ad(b"", b"short")
    assert receive.decrypt_with_ad(b"", first) == b"one"
    assert receive.nonce == 1
    assert CipherState().encrypt_with_ad(b"", b"clear") == b"clear"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2), st.binary(max_size=200))
def test_random_messages_only_raise_noise_error(step: int, junk: bytes) -> None:
    """Whatever arrives at any step of the handshake, the reader raises NoiseError or reads it."""
    client_private = bytes.fromhex(INIT_STATIC)
    server_private = bytes.fromhex(RESP_STATIC)
    client = HandshakeState(initiator=True, static_private=client_private)
    server = HandshakeState(initiator=False, static_private=server_private)
    if step >= 1:
        server.read_message(client.write_message())
    if step >= 2:
        client.read_message(server.write_message())
    reader = client if step == 1 else server
    try:
        reader.read_message(junk)
    except NoiseError:
        return
    assert step == 0 and len(junk) >= 32  # only message 1 (a bare ephemeral key) has nothing to authenticate
