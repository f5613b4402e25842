"""Tests for slipstream.protocol.uri: reference examples, suffixes, every error path, round-trip and fuzz."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slipstream.wire.constants import IPC_TERM_DEFAULT_LENGTH, TERM_DEFAULT_LENGTH
from slipstream.wire.positions import wrap_i32
from slipstream.wire.uri import (
    KNOWN_KEYS,
    ChannelUri,
    ChannelUriError,
    FlowControl,
    StartPosition,
    UnsupportedChannelError,
    check_supported,
    parse_bool,
    parse_duration_ns,
    parse_endpoint,
    parse_size,
)

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1

ACCESSORS = (
    "media",
    "is_spy",
    "is_udp",
    "is_ipc",
    "params",
    "endpoint",
    "endpoint_address",
    "control",
    "control_address",
    "control_mode",
    "interface",
    "ttl",
    "reliable",
    "session_id",
    "mtu",
    "term_length",
    "init_term_id",
    "term_id",
    "term_offset",
    "start_position",
    "linger_ns",
    "eos",
    "fc",
    "gtag",
    "cc",
    "rcv_wnd",
    "pub_wnd",
    "so_rcvbuf",
    "so_sndbuf",
    "nak_delay_ns",
    "max_resend",
    "sparse",
    "tether",
    "rejoin",
    "group",
    "alias",
    "tags",
)


def touch_all(uri: ChannelUri) -> None:
    """Every accessor must work on any URI that parsed."""
    for name in ACCESSORS:
        getattr(uri, name)


# -- reference examples ------------------------------------------------------------------------------


def test_unicast_endpoint() -> None:
    uri = ChannelUri.parse("aeron:udp?endpoint=localhost:20121")
    assert uri.media == "udp" and uri.is_udp and not uri.is_ipc and not uri.is_spy
    assert uri.endpoint == "localhost:20121"
    assert uri.endpoint_address == ("localhost", 20121)
    assert uri.get("endpoint") == "localhost:20121"
    assert uri.get("missing") is None
    assert uri.get("missing", "x") == "x"
    assert uri.control is None and uri.mtu is None and uri.term_length is None
    assert str(uri) == "aeron:udp?endpoint=localhost:20121"


def test_mdc_publication_placeholder_and_concrete() -> None:
    # The reference writes HOST:CPORT as a placeholder; a literal non-numeric port is rejected.
    with pytest.raises(ChannelUriError) as info:
        ChannelUri.parse("aeron:udp?control=HOST:CPORT|control-mode=dynamic")
    assert info.value.parameter == "control"
    uri = ChannelUri.parse("aeron:udp?control=HOST:40456|control-mode=dynamic")
    assert uri.control_address == ("HOST", 40456)
    assert uri.control_mode == "dynamic"
    assert uri.endpoint is None


def test_mdc_subscription_with_endpoint() -> None:
    uri = ChannelUri.parse("aeron:udp?control=pubhost:40456|control-mode=dynamic|endpoint=0.0.0.0:0")
    assert uri.control_address == ("pubhost", 40456)
    assert uri.endpoint_address == ("0.0.0.0", 0)
    assert list(uri.params) == ["control", "control-mode", "endpoint"]


@pytest.mark.parametrize("mode", ["manual", "response"])
def test_udp_without_endpoint_allowed_for_manual_and_response(mode: str) -> None:
    uri = ChannelUri.parse(f"aeron:udp?control-mode={mode}")
    assert uri.control_mode == mode


def test_udp_with_only_tags_allowed() -> None:
    assert ChannelUri.parse("aeron:udp?tags=1001,1002").tags == (1001, 1002)


def test_ipc() -> None:
    uri = ChannelUri.parse("aeron:ipc?term-length=64k")
    assert uri.is_ipc and uri.media == "ipc"
    assert uri.term_length == 64 * 1024
    assert str(uri) == "aeron:ipc?term-length=64k"
    bare = ChannelUri.parse("aeron:ipc")
    assert bare.params == {} and str(bare) == "aeron:ipc"
    assert bare == ChannelUri("ipc")


def test_spy_prefix() -> None:
    uri = ChannelUri.parse("aeron-spy:aeron:udp?endpoint=localhost:20121")
    assert uri.is_spy and uri.media == "udp"
    assert str(uri) == "aeron-spy:aeron:udp?endpoint=localhost:20121"
    assert uri != ChannelUri.parse("aeron:udp?endpoint=localhost:20121")
    assert uri.replace(is_spy=False) == ChannelUri.parse("aeron:udp?endpoint=localhost:20121")
    assert ChannelUri.parse("aeron-spy:aeron:ipc").is_spy


def test_unicast_parameters_that_matter() -> None:
    uri = ChannelUri.parse(
        "aeron:udp?endpoint=10.0.0.1:40123|mtu=8k|term-length=1m|session-id=-7|reliable=false|rcv-wnd=256k"
    )
    assert uri.endpoint_address == ("10.0.0.1", 40123)
    assert uri.mtu == 8192
    assert uri.term_length == 1024 * 1024
    assert uri.session_id == -7
    assert uri.reliable is False
    assert uri.rcv_wnd == 256 * 1024


def test_all_known_keys_typed() -> None:
    text = (
        "aeron:udp?endpoint=[::1]:40123|control=[fe80::1%eth0]:1|control-mode=response|interface=192.168.1.0/24"
        "|ttl=16|reliable=TRUE|session-id=1000|mtu=1408|term-length=128k|init-term-id=-5|term-id=2"
        "|term-offset=1024|linger=5s|eos=false|fc=tagged,g:99/2,t:3ms|gtag=-123|cc=cubic|rcv-wnd=64k"
        "|pub-wnd=1m|so-rcvbuf=2m|so-sndbuf=0|nak-delay=100us|max-resend=256|sparse=true|tether=false"
        "|rejoin=true|group=false|alias=my alias|tags=1,-2,3|future-key=anything=goes"
    )
    uri = ChannelUri.parse(text)
    assert uri.endpoint_address == ("::1", 40123)
    assert uri.control_address == ("fe80::1%eth0", 1)
    assert uri.control_mode == "response"
    assert uri.interface == "192.168.1.0/24"
    assert uri.ttl == 16
    assert uri.reliable is True
    assert uri.session_id == 1000
    assert uri.mtu == 1408
    assert uri.term_length == 128 * 1024
    assert (uri.init_term_id, uri.term_id, uri.term_offset) == (-5, 2, 1024)
    assert uri.start_position == StartPosition(-5, 2, 1024)
    assert uri.linger_ns == 5_000_000_000
    assert uri.eos is False
    assert uri.fc == FlowControl("tagged", group_tag=99, group_min_size=2, timeout_ns=3_000_000)
    assert uri.gtag == -123
    assert uri.cc == "cubic"
    assert uri.rcv_wnd == 64 * 1024
    assert uri.pub_wnd == 1024 * 1024
    assert uri.so_rcvbuf == 2 * 1024 * 1024
    assert uri.so_sndbuf == 0
    assert uri.nak_delay_ns == 100_000
    assert uri.max_resend == 256
    assert (uri.sparse, uri.tether, uri.rejoin, uri.group) == (True, False, True, False)
    assert uri.alias == "my alias"
    assert uri.tags == (1, -2, 3)
    assert uri.get("future-key") == "anything=goes"
    assert str(uri) == text
    assert ChannelUri.parse(str(uri)) == uri
    assert "future-key" not in KNOWN_KEYS and "term-length" in KNOWN_KEYS


@pytest.mark.parametrize(
    ("fc", "expected"),
    [
        ("max", FlowControl("max")),
        ("min", FlowControl("min")),
        ("min,t:5s", FlowControl("min", timeout_ns=5_000_000_000)),
        ("min,g:/3", FlowControl("min", group_min_size=3)),
        ("tagged,g:1001", FlowControl("tagged", group_tag=1001)),
        ("tagged,g:1001/4,t:500ms", FlowControl("tagged", 1001, 4, 500_000_000)),
        ("tagged,t:10,g:-1/0", FlowControl("tagged", -1, 0, 10)),
    ],
)
def test_flow_control(fc: str, expected: FlowControl) -> None:
    assert ChannelUri.parse(f"aeron:udp?control=h:1|fc={fc}").fc == expected


def test_start_position_uses_media_default_term_length() -> None:
    # Without term-length, term-offset is checked against the default for the media.
    last_udp = TERM_DEFAULT_LENGTH - 32
    uri = ChannelUri.parse(f"aeron:udp?endpoint=h:1|init-term-id=0|term-id=0|term-offset={last_udp}")
    assert uri.term_offset == last_udp
    last_ipc = IPC_TERM_DEFAULT_LENGTH - 32
    assert ChannelUri.parse(f"aeron:ipc?init-term-id=0|term-id=0|term-offset={last_ipc}").term_offset == last_ipc
    with pytest.raises(ChannelUriError) as info:
        ChannelUri.parse(f"aeron:udp?endpoint=h:1|init-term-id=0|term-id=0|term-offset={TERM_DEFAULT_LENGTH}")
    assert info.value.parameter == "term-offset"


def test_term_id_may_wrap_past_i32_max() -> None:
    uri = ChannelUri.parse(f"aeron:ipc?init-term-id={I32_MAX}|term-id={I32_MIN}|term-offset=0")
    assert uri.start_position == StartPosition(I32_MAX, I32_MIN, 0)


# -- suffix forms ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("65536", 65536),
        ("64k", 64 * 1024),
        ("64K", 64 * 1024),
        ("16m", 16 * 1024**2),
        ("16M", 16 * 1024**2),
        ("1g", 1024**3),
        ("1G", 1024**3),
        ("0k", 0),
        ("007k", 7 * 1024),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [("65536", 65536), ("64k", 65536), ("64K", 65536), ("1m", 2**20), ("1M", 2**20), ("1g", 2**30), ("1G", 2**30)],
)
def test_term_length_suffixes(text: str, value: int) -> None:
    assert ChannelUri.parse(f"aeron:ipc?term-length={text}").term_length == value


@pytest.mark.parametrize("key", ["rcv-wnd", "pub-wnd", "so-rcvbuf", "so-sndbuf"])
@pytest.mark.parametrize(("text", "value"), [("4096", 4096), ("128k", 128 * 1024), ("2M", 2 * 1024**2)])
def test_window_and_buffer_suffixes(key: str, text: str, value: int) -> None:
    uri = ChannelUri.parse(f"aeron:udp?endpoint=h:1|{key}={text}")
    assert getattr(uri, key.replace("-", "_")) == value


@pytest.mark.parametrize(("text", "value"), [("1408", 1408), ("8k", 8192), ("8K", 8192), ("32k", 32768)])
def test_mtu_suffixes(text: str, value: int) -> None:
    assert ChannelUri.parse(f"aeron:udp?endpoint=h:1|mtu={text}").mtu == value


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("0", 0),
        ("250", 250),
        ("250ns", 250),
        ("250NS", 250),
        ("7us", 7_000),
        ("7US", 7_000),
        ("5ms", 5_000_000),
        ("5Ms", 5_000_000),
        ("2s", 2_000_000_000),
        ("2S", 2_000_000_000),
    ],
)
def test_durations(text: str, nanos: int) -> None:
    assert parse_duration_ns(text) == nanos
    uri = ChannelUri.parse(f"aeron:udp?endpoint=h:1|linger={text}|nak-delay={text}")
    assert uri.linger_ns == nanos
    assert uri.nak_delay_ns == nanos


@pytest.mark.parametrize(("text", "value"), [("true", True), ("TRUE", True), ("False", False), ("false", False)])
def test_parse_bool(text: str, value: bool) -> None:
    assert parse_bool(text) is value


# -- endpoints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost:40123", ("localhost", 40123)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("my_host.example-1.com:65535", ("my_host.example-1.com", 65535)),
        ("[::1]:40123", ("::1", 40123)),
        ("[2001:db8::7]:1", ("2001:db8::7", 1)),
        ("[fe80::1%eth0]:9", ("fe80::1%eth0", 9)),
        ("[::ffff:10.0.0.1]:80", ("::ffff:10.0.0.1", 80)),
    ],
)
def test_parse_endpoint(text: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "localhost",
        "localhost:",
        ":40123",
        "localhost:65536",
        "localhost:-1",
        "localhost:+1",
        "localhost:1x",
        "localhost:123456",
        "::1:40123",
        "::1",
        "[::1]",
        "[::1]40123",
        "[::1:40123",
        "[not-ipv6]:1",
        "[127.0.0.1]:1",
        "[]:1",
        "bad host:1",
        "host/x:1",
        "hôst:1",
        "-host:1",
        "",
    ],
)
def test_parse_endpoint_rejects(text: str) -> None:
    with pytest.raises(ChannelUriError) as info:
        parse_endpoint(text, "endpoint")
    assert info.value.parameter == "endpoint"
    with pytest.raises(ChannelUriError) as info:
        parse_endpoint(text)
    assert info.value.parameter is None


# -- errors ------------------------------------------------------------------------------------------

EP = "aeron:udp?endpoint=h:1|"

ERROR_CASES: list[tuple[str, str | None]] = [
    # structure
    ("", None),
    ("aeron", None),
    ("aeron:", None),
    ("udp?endpoint=h:1", None),
    ("AERON:udp?endpoint=h:1", None),
    ("aeron:UDP?endpoint=h:1", None),
    ("aeron:tcp?endpoint=h:1", None),
    ("aeron:udp:x?endpoint=h:1", None),
    ("aeron-spy:udp?endpoint=h:1", None),
    ("aeron-spy:", None),
    (" aeron:ipc", None),
    ("aeron:ipc?", None),
    ("aeron:ipc?=5", None),
    ("aeron:ipc?mtu=1408|", None),
    ("aeron:ipc?mtu=1408||tether=true", None),
    ("aeron:ipc?mtu", "mtu"),
    ("aeron:ipc?mtu=1408|tether", "tether"),
    ("aeron:ipc?mtu=1408|mtu=1408", "mtu"),
    ("aeron:ipc?x=1|x=2", "x"),
    # udp needs an address
    ("aeron:udp", "endpoint"),
    ("aeron:udp?mtu=1408", "endpoint"),
    ("aeron:udp?control-mode=dynamic", "endpoint"),
    ("aeron-spy:aeron:udp", "endpoint"),
    # endpoint / control
    ("aeron:udp?endpoint=localhost", "endpoint"),
    ("aeron:udp?endpoint=", "endpoint"),
    ("aeron:udp?endpoint=localhost:65536", "endpoint"),
    ("aeron:udp?endpoint=::1:40123", "endpoint"),
    ("aeron:udp?endpoint=[::1]", "endpoint"),
    ("aeron:udp?control=h|control-mode=dynamic", "control"),
    ("aeron:udp?control=h:x|control-mode=manual", "control"),
    # enumerations
    (EP + "control-mode=auto", "control-mode"),
    (EP + "control-mode=DYNAMIC", "control-mode"),
    (EP + "control-mode=", "control-mode"),
    (EP + "cc=reno", "cc"),
    (EP + "cc=", "cc"),
    # interface
    (EP + "interface=", "interface"),
    # ints
    (EP + "ttl=256", "ttl"),
    (EP + "ttl=-1", "ttl"),
    (EP + "ttl=x", "ttl"),
    (EP + "session-id=2147483648", "session-id"),
    (EP + "session-id=-2147483649", "session-id"),
    (EP + "session-id=1.0", "session-id"),
    (EP + "session-id= 1", "session-id"),
    (EP + "session-id=1_000", "session-id"),
    (EP + "session-id=\u0661\u0662", "session-id"),
    (EP + "session-id=", "session-id"),
    (EP + "session-id=0x10", "session-id"),
    (EP + "max-resend=0", "max-resend"),
    (EP + "max-resend=257", "max-resend"),
    (EP + "max-resend=1k", "max-resend"),
    (EP + "gtag=9223372036854775808", "gtag"),
    (EP + "gtag=abc", "gtag"),
    (EP + "gtag=" + "9" * 5000, "gtag"),
    # bools
    (EP + "reliable=yes", "reliable"),
    (EP + "reliable=1", "reliable"),
    (EP + "reliable=", "reliable"),
    (EP + "eos=on", "eos"),
    (EP + "sparse=t", "sparse"),
    (EP + "tether=truee", "tether"),
    (EP + "rejoin=0", "rejoin"),
    (EP + "group=no", "group"),
    # sizes
    (EP + "mtu=1400", "mtu"),
    (EP + "mtu=32", "mtu"),
    (EP + "mtu=65536", "mtu"),
    (EP + "mtu=64k", "mtu"),
    (EP + "mtu=-64", "mtu"),
    (EP + "term-length=1000", "term-length"),
    (EP + "term-length=32k", "term-length"),
    (EP + "term-length=2g", "term-length"),
    (EP + "term-length=64kb", "term-length"),
    (EP + "term-length=64 k", "term-length"),
    (EP + "term-length=k", "term-length"),
    (EP + "term-length=64t", "term-length"),
    (EP + "term-length=64\u212a", "term-length"),  # KELVIN SIGN, which folds to 'k' in Unicode
    (EP + "term-length=99999999999999999999g", "term-length"),
    (EP + "term-length=" + "1" * 100, "term-length"),
    (EP + "rcv-wnd=0", "rcv-wnd"),
    (EP + "rcv-wnd=2g", "rcv-wnd"),
    (EP + "pub-wnd=x", "pub-wnd"),
    (EP + "so-rcvbuf=4g", "so-rcvbuf"),
    (EP + "so-sndbuf=-1", "so-sndbuf"),
    # durations
    (EP + "linger=5m", "linger"),
    (EP + "linger=5 ms", "linger"),
    (EP + "linger=-5ms", "linger"),
    (EP + "linger=1.5s", "linger"),
    (EP + "linger=ms", "linger"),
    (EP + "linger=99999999999999999999s", "linger"),
    (EP + "nak-delay=abc", "nak-delay"),
    (EP + "nak-delay=", "nak-delay"),
    # flow control
    (EP + "fc=fastest", "fc"),
    (EP + "fc=", "fc"),
    (EP + "fc=min,", "fc"),
    (EP + "fc=min,x:1", "fc"),
    (EP + "fc=min,g:", "fc"),
    (EP + "fc=min,g:x", "fc"),
    (EP + "fc=tagged,g:1/x", "fc"),
    (EP + "fc=tagged,g:1/", "fc"),
    (EP + "fc=min,t:5 parsecs", "fc"),
    (EP + "fc=min,t:1s,t:2s", "fc"),
    (EP + "fc=min,g", "fc"),
    # tags
    (EP + "tags=", "tags"),
    (EP + "tags=1,,2", "tags"),
    (EP + "tags=a", "tags"),
    (EP + "tags=1,", "tags"),
    # start position
    (EP + "init-term-id=1|term-id=2", "term-offset"),
    (EP + "term-id=1|term-offset=0", "init-term-id"),
    (EP + "init-term-id=1", "term-id"),
    (EP + "init-term-id=1|term-id=1|term-offset=33", "term-offset"),
    (EP + "init-term-id=1|term-id=1|term-offset=-32", "term-offset"),
    (EP + "init-term-id=1|term-id=1|term-offset=65536|term-length=64k", "term-offset"),
    (EP + "init-term-id=5|term-id=4|term-offset=0", "term-id"),
    (EP + "init-term-id=x|term-id=4|term-offset=0", "init-term-id"),
    (EP + "init-term-id=2147483648|term-id=4|term-offset=0", "init-term-id"),
]


@pytest.mark.parametrize(("text", "parameter"), ERROR_CASES)
def test_parse_errors_name_the_parameter(text: str, parameter: str | None) -> None:
    with pytest.raises(ChannelUriError) as info:
        ChannelUri.parse(text)
    assert info.value.parameter == parameter
    if parameter is not None:
        assert repr(parameter) in str(info.value)


def _typo(key: str) -> str:
    """``key`` with one letter dropped from its middle (``endpoint`` -> ``endpint``)."""
    middle = len(key) // 2
    return key[:middle] + key[middle + 1 :]


@pytest.mark.parametrize("key", sorted(KNOWN_KEYS))
def test_every_misspelt_key_gets_the_same_did_you_mean(key: str) -> None:
    # Issue 30 item 9: 'term-lenght' had a suggestion, 'endpont' none, because a udp channel without
    # endpoint failed parse() on the missing endpoint before anything looked at the unknown key.
    typo = _typo(key)
    value = "localhost:1" if key in ("endpoint", "control") else "1"
    said = set()
    for text in (f"aeron:udp?{typo}={value}", f"aeron:ipc?{typo}={value}", f"{EP}{typo}={value}"):
        with pytest.raises(ChannelUriError) as info:
            check_supported(ChannelUri.parse(text))
        assert info.value.parameter == typo, text
        said.add(info.value.reason.partition("?")[0])
    assert len(said) == 1  # the same suggestion whichever check met the key first
    if len(key) > 3:  # 'c' could be cc or fc
        assert said == {f"unknown parameter; did you mean {key!r}"}


@pytest.mark.parametrize(
    ("text", "typo", "meant", "rule"),
    [
        ("aeron:udp?endpont=x:1", "endpont", "endpoint", "needs endpoint"),
        ("aeron:udp?control-mod=manual", "control-mod", "control-mode", "needs endpoint"),
        (EP + "init-term-id=1|term-id=2|term-ofset=0", "term-ofset", "term-offset", "given together"),
    ],
)
def test_parse_blames_a_misspelt_key_for_a_rule_it_breaks(text: str, typo: str, meant: str, rule: str) -> None:
    with pytest.raises(ChannelUriError) as info:
        ChannelUri.parse(text)
    assert not isinstance(info.value, UnsupportedChannelError)  # parse() still models Aeron's URIs
    assert info.value.parameter == typo
    assert f"did you mean {meant!r}?" in str(info.value) and rule in str(info.value)


def test_a_rule_broken_with_no_likely_typo_is_reported_as_before() -> None:
    with pytest.raises(ChannelUriError, match="needs endpoint") as info:
        ChannelUri.parse("aeron:udp?future-key=1")
    assert info.value.parameter == "endpoint"
    assert ChannelUri.parse(EP + "future-key=1").get("future-key") == "1"  # unknown keys are still kept


@pytest.mark.parametrize("value", [None, b"aeron:ipc", 5, ["aeron:ipc"], object()])
def test_parse_rejects_non_str(value: object) -> None:
    with pytest.raises(ChannelUriError) as info:
        ChannelUri.parse(value)  # type: ignore[arg-type]
    assert info.value.parameter is None


def test_error_is_value_error_and_pickles() -> None:
    err = ChannelUriError("bad", "mtu")
    assert isinstance(err, ValueError)
    assert "mtu" in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert copy.parameter == "mtu" and str(copy) == str(err)
    assert ChannelUriError("structural").parameter is None


# -- building ----------------------------------------------------------------------------------------


def test_constructor_and_params_order() -> None:
    uri = ChannelUri("udp", [("term-length", 65536), ("endpoint", "h:1"), ("eos", False), ("x", "y")])
    assert list(uri.params.items()) == [("term-length", "65536"), ("endpoint", "h:1"), ("eos", "false"), ("x", "y")]
    assert str(uri) == "aeron:udp?term-length=65536|endpoint=h:1|eos=false|x=y"
    assert ChannelUri("udp", {"endpoint": "h:1"}, is_spy=True).is_spy


def test_equality_ignores_order_and_hash_agrees() -> None:
    a = ChannelUri.parse("aeron:udp?endpoint=h:1|mtu=1408")
    b = ChannelUri.parse("aeron:udp?mtu=1408|endpoint=h:1")
    assert a == b and hash(a) == hash(b)
    assert a != ChannelUri.parse("aeron:udp?endpoint=h:1|mtu=1440")
    assert a != "aeron:udp?endpoint=h:1|mtu=1408"
    assert len({a, b}) == 1
    assert repr(a) == "ChannelUri.parse('aeron:udp?endpoint=h:1|mtu=1408')"


def test_with_params_and_replace() -> None:
    base = ChannelUri.parse("aeron:udp?endpoint=h:1|mtu=1408")
    edited = base.with_params(mtu="8k", term_length="64k", session_id=-3, reliable=False)
    assert str(edited) == "aeron:udp?endpoint=h:1|mtu=8k|term-length=64k|session-id=-3|reliable=false"
    assert str(base) == "aeron:udp?endpoint=h:1|mtu=1408"  # unchanged
    assert edited.mtu == 8192 and edited.session_id == -3 and edited.reliable is False
    removed = edited.with_params({"mtu": None, "odd.key": "v"}, reliable=None)
    assert str(removed) == "aeron:udp?endpoint=h:1|term-length=64k|session-id=-3|odd.key=v"
    with pytest.raises(ChannelUriError) as info:
        base.with_params(endpoint=None)
    assert info.value.parameter == "endpoint"
    with pytest.raises(ChannelUriError) as info:
        base.with_params(mtu=1000)
    assert info.value.parameter == "mtu"
    ipc = base.replace(media="ipc", params={"term-length": "64k"})
    assert str(ipc) == "aeron:ipc?term-length=64k"
    assert base.replace() == base
    spy = base.replace(is_spy=True)
    assert str(spy) == "aeron-spy:aeron:udp?endpoint=h:1|mtu=1408"


def test_pickle_and_copy() -> None:
    uri = ChannelUri.parse("aeron-spy:aeron:udp?endpoint=h:1|mtu=8k|x=y")
    assert pickle.loads(pickle.dumps(uri)) == uri
    assert copy.copy(uri) == uri and copy.deepcopy(uri) == uri


def test_immutable() -> None:
    uri = ChannelUri.parse("aeron:ipc?mtu=1408")
    with pytest.raises(AttributeError):
        uri._media = "udp"
    with pytest.raises(TypeError):
        uri.params["mtu"] = "1"  # type: ignore[index]
    with pytest.raises(AttributeError):
        del uri._params


@pytest.mark.parametrize(
    ("args", "kwargs", "parameter"),
    [
        (("tcp",), {}, None),
        ((5,), {}, None),
        (("ipc",), {"is_spy": "yes"}, None),
        (("ipc", {"a|b": "1"}), {}, "a|b"),
        (("ipc", {"a=b": "1"}), {}, "a=b"),
        (("ipc", {"": "1"}), {}, None),
        (("ipc", {5: "1"}), {}, None),
        (("ipc", {"k": "a|b"}), {}, "k"),
        (("ipc", {"k": 1.5}), {}, "k"),
        (("ipc", {"k": None}), {}, "k"),
        (("ipc", [("a", "1"), ("a", "2")]), {}, "a"),
        (("ipc", [("a", "1", "x")]), {}, None),
        (("ipc", ["ab"]), {}, None),
        (("ipc", "a=1"), {}, None),
        (("ipc", 5), {}, None),
        (("ipc", {"mtu": "1000"}), {}, "mtu"),
        (("udp", {"mtu": 1408}), {}, "endpoint"),
    ],
)
def test_constructor_errors(args: tuple[object, ...], kwargs: dict[str, object], parameter: str | None) -> None:
    with pytest.raises(ChannelUriError) as info:
        ChannelUri(*args, **kwargs)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


def test_with_params_rejects_bad_updates() -> None:
    base = ChannelUri.parse("aeron:ipc")
    with pytest.raises(ChannelUriError):
        base.with_params([("a", "1")])  # type: ignore[arg-type]
    with pytest.raises(ChannelUriError) as info:
        base.with_params({"": "1"})
    assert info.value.parameter is None


# -- property tests ----------------------------------------------------------------------------------

SAFE_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="|"), max_size=12)
HOSTS = st.sampled_from(["localhost", "127.0.0.1", "0.0.0.0", "[::1]", "[2001:db8::1]", "host-1.example"])
ADDRESS = st.builds(lambda host, port: f"{host}:{port}", HOSTS, st.integers(0, 65535))
BOOL_TEXT = st.sampled_from(["true", "false", "TRUE", "False"])


def size_text(value: int) -> st.SearchStrategy[str]:
    """Every textual form of a size, e.g. 65536, 64k, 64K."""
    forms = [str(value)]
    for suffix, unit in (("k", 1024), ("m", 1024**2), ("g", 1024**3)):
        if value and value % unit == 0:
            forms += [f"{value // unit}{suffix}", f"{value // unit}{suffix.upper()}"]
    return st.sampled_from(forms)


def duration_text() -> st.SearchStrategy[str]:
    return st.builds(
        lambda n, suffix: f"{n}{suffix}",
        st.integers(0, 10**6),
        st.sampled_from(["", "ns", "us", "ms", "s", "NS", "Us", "MS", "S"]),
    )


VALUE_STRATEGIES: dict[str, st.SearchStrategy[str]] = {
    "endpoint": ADDRESS,
    "control": ADDRESS,
    "control-mode": st.sampled_from(["dynamic", "manual", "response"]),
    "interface": SAFE_TEXT.filter(bool),
    "ttl": st.integers(0, 255).map(str),
    "reliable": BOOL_TEXT,
    "session-id": st.integers(I32_MIN, I32_MAX).map(str),
    "mtu": st.integers(2, 65504 // 32).flatmap(lambda n: size_text(n * 32)),
    "term-length": st.integers(16, 30).flatmap(lambda bits: size_text(1 << bits)),
    "linger": duration_text(),
    "eos": BOOL_TEXT,
    "fc": st.sampled_from(["max", "min", "min,t:5s", "min,g:/2", "tagged,g:7", "tagged,g:-7/3,t:100ms"]),
    "gtag": st.integers(I64_MIN, I64_MAX).map(str),
    "cc": st.sampled_from(["static", "cubic"]),
    "rcv-wnd": st.integers(1, I32_MAX).flatmap(size_text),
    "pub-wnd": st.sampled_from([1, 4096, 65536, 2**20, 2**30]).flatmap(size_text),
    "so-rcvbuf": st.integers(0, I32_MAX).flatmap(size_text),
    "so-sndbuf": st.sampled_from([0, 2**17, 2**21]).flatmap(size_text),
    "nak-delay": duration_text(),
    "max-resend": st.integers(1, 256).map(str),
    "sparse": BOOL_TEXT,
    "tether": BOOL_TEXT,
    "rejoin": BOOL_TEXT,
    "group": BOOL_TEXT,
    "alias": SAFE_TEXT,
    "tags": st.lists(st.integers(I64_MIN, I64_MAX), min_size=1, max_size=3).map(lambda tags: ",".join(map(str, tags))),
}
UNKNOWN_KEY = st.text(st.characters(codec="utf-8", exclude_characters="=|"), min_size=1, max_size=10).filter(
    lambda key: key not in KNOWN_KEYS
)


@st.composite
def valid_uris(draw: st.DrawFn) -> tuple[str, bool, list[tuple[str, str]]]:
    """(media, is_spy, ordered params) that must build a valid URI."""
    media = draw(st.sampled_from(["udp", "ipc"]))
    keys = draw(st.lists(st.sampled_from(sorted(VALUE_STRATEGIES)), unique=True, max_size=8))
    pairs = [(key, draw(VALUE_STRATEGIES[key])) for key in keys]
    if draw(st.booleans()):
        # The start position: term-offset stays below the smallest legal term length.
        initial = draw(st.integers(I32_MIN, I32_MAX))
        term_id = wrap_i32(initial + draw(st.integers(0, I32_MAX)))
        offset = draw(st.integers(0, 2047)) * 32
        pairs += [("init-term-id", str(initial)), ("term-id", str(term_id)), ("term-offset", str(offset))]
    unknown = draw(st.lists(UNKNOWN_KEY, unique=True, max_size=3))
    pairs += [(key, draw(SAFE_TEXT)) for key in unknown if key not in dict(pairs)]
    pairs = draw(st.permutations(pairs))
    params = dict(pairs)
    needs_address = not (
        {"endpoint", "control", "tags"} & params.keys() or params.get("control-mode") in ("manual", "response")
    )
    if media == "udp" and needs_address:
        pairs.append(("endpoint", draw(ADDRESS)))
    return media, draw(st.booleans()), pairs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_uris())
def test_round_trip(spec: tuple[str, bool, list[tuple[str, str]]]) -> None:
    media, is_spy, pairs = spec
    uri = ChannelUri(media, pairs, is_spy=is_spy)
    text = str(uri)
    again = ChannelUri.parse(text)
    assert again == uri
    assert hash(again) == hash(uri)
    assert list(again.params.items()) == pairs
    assert str(again) == text
    assert again.is_spy is is_spy and again.media == media
    for name in ACCESSORS:
        assert getattr(again, name) == getattr(uri, name)
    for key, value in pairs:
        assert again.get(key) == value


FRAGMENTS = st.sampled_from(
    [
        "aeron:",
        "aeron-spy:",
        "udp",
        "ipc",
        "?",
        "|",
        "=",
        ":",
        ",",
        "/",
        "[",
        "]",
        "::1",
        "localhost",
        "1",
        "-1",
        "0",
        "32",
        "1408",
        "65536",
        "99999999999999999999999",
        "k",
        "m",
        "g",
        "ms",
        "s",
        "true",
        "false",
        "g:",
        "t:",
        "min",
        "tagged",
        *sorted(KNOWN_KEYS),
    ]
)
FUZZ_VALUE = st.one_of(
    st.lists(FRAGMENTS, max_size=4).map("".join),
    st.text(max_size=6),
    st.sampled_from(sorted(VALUE_STRATEGIES)).flatmap(lambda key: VALUE_STRATEGIES[key]),
)
FUZZ_PAIR = st.one_of(
    st.tuples(st.one_of(st.sampled_from(sorted(KNOWN_KEYS)), st.text(max_size=4)), FUZZ_VALUE),
    st.sampled_from(sorted(VALUE_STRATEGIES)).flatmap(lambda key: st.tuples(st.just(key), VALUE_STRATEGIES[key])),
)


def join_uri(prefix: str, media: str, pairs: list[tuple[str, str]]) -> str:
    return prefix + media + ("?" + "|".join(f"{key}={value}" for key, value in pairs) if pairs else "")


FUZZ_TEXT = st.one_of(
    st.text(max_size=60),
    st.lists(FRAGMENTS, max_size=20).map("".join),
    st.lists(st.one_of(FRAGMENTS, st.text(max_size=3)), max_size=20).map(lambda parts: "aeron:" + "".join(parts)),
    # Mostly well-formed structure, so the per-parameter validators get fuzzed too.
    st.builds(
        join_uri,
        st.sampled_from(["aeron:", "aeron-spy:aeron:"]),
        st.sampled_from(["udp", "ipc"]),
        st.lists(FUZZ_PAIR, max_size=5),
    ),
)


def check_error(err: ChannelUriError) -> None:
    assert err.parameter is None or isinstance(err.parameter, str)
    if err.parameter is not None:
        assert repr(err.parameter) in str(err)


@settings(max_examples=1500, deadline=None)
@given(FUZZ_TEXT)
def test_fuzz_parse_only_raises_channel_uri_error(text: str) -> None:
    try:
        uri = ChannelUri.parse(text)
    except ChannelUriError as err:
        check_error(err)
        return
    touch_all(uri)
    assert ChannelUri.parse(str(uri)) == uri


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=30), st.lists(FRAGMENTS, max_size=6).map("".join)))
def test_fuzz_endpoint_and_scalars(text: str) -> None:
    for parse in (parse_endpoint, parse_size, parse_duration_ns, parse_bool):
        try:
            parse(text, "k")
        except ChannelUriError as err:
            assert err.parameter == "k"


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10), st.binary(max_size=4))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.sampled_from(["udp", "ipc"]), ANY_VALUE),
    st.one_of(
        st.none(),
        st.dictionaries(st.one_of(st.sampled_from(sorted(KNOWN_KEYS)), ANY_VALUE), ANY_VALUE, max_size=4),
        st.lists(st.tuples(st.one_of(st.sampled_from(sorted(KNOWN_KEYS)), ANY_VALUE), ANY_VALUE), max_size=4),
        ANY_VALUE,
    ),
    ANY_VALUE,
)
def test_fuzz_constructor_only_raises_channel_uri_error(media: object, params: object, is_spy: object) -> None:
    try:
        uri = ChannelUri(media, params, is_spy=is_spy)  # type: ignore[arg-type]
    except ChannelUriError as err:
        check_error(err)
        return
    touch_all(uri)
    assert ChannelUri.parse(str(uri)) == uri
