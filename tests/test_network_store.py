"""The settings store: identity created once, pins, persistence across reopening, 0600 files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from slipstream.network.errors import SettingsLimitError, SettingsStoreError
from slipstream.network.noise import public_key
from slipstream.network.store import (
    MAX_SETTING_KEY,
    MAX_SETTING_VALUE,
    MAX_SETTINGS,
    SettingsStore,
    default_store_path,
)


def test_identity_persists_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "store.db"
    with SettingsStore(path) as store:
        private, public = store.identity()
        assert len(private) == 32 and public == public_key(private)
        assert store.identity() == (private, public)
        store.pin("10.0.0.1", b"k" * 32)
    with SettingsStore(str(path)) as again:
        assert again.identity() == (private, public)
        assert again.pinned_key("10.0.0.1") == b"k" * 32


def test_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with SettingsStore(path) as store:
        store.identity()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    os.chmod(path, 0o644)  # a copied, world-readable file is tightened on open
    SettingsStore(path).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_memory_stores_are_separate() -> None:
    a, b = SettingsStore(":memory:"), SettingsStore(":memory:")
    assert a.identity() != b.identity()
    a.pin("x", bytes(32))
    assert b.pinned_key("x") is None
    a.close()
    b.close()


def test_pins() -> None:
    store = SettingsStore(":memory:")
    assert store.pinned_key("server") is None
    store.pin("server", b"a" * 32)
    store.pin("other", b"b" * 32)
    assert store.pinned_key("server") == b"a" * 32
    store.pin("server", b"c" * 32)
    assert store.pins() == {"server": b"c" * 32, "other": b"b" * 32}
    assert store.remove_pin("server") and not store.remove_pin("server")
    assert store.pinned_key("server") is None
    with pytest.raises(ValueError, match="32 bytes"):
        store.pin("server", b"short")
    store.close()
    store.close()


def test_two_processes_agree_on_one_identity(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    code = (
        "import sys; from slipstream.network.store import SettingsStore; "
        "print(SettingsStore(sys.argv[1]).identity()[1].hex())"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    runs = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, env=env) for _ in range(3)
    ]
    keys = {run.communicate(timeout=60)[0].strip() for run in runs}
    assert all(run.returncode == 0 for run in runs)
    assert len(keys) == 1
    with SettingsStore(path) as store:
        assert store.identity()[1].hex().encode() in keys


def test_bad_files_raise_settings_store_error(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(SettingsStoreError, match=r"garbage\.db"):
        SettingsStore(garbage).identity()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(SettingsStoreError, match="cannot open"):
        SettingsStore(blocker / "x.db")


def test_default_path_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_store_path("chat-client") == str(tmp_path / "slipstream" / "chat-client.db")
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_store_path().endswith(os.path.join(".local", "share", "slipstream", "settings.db"))


# -- the application's settings (issue 34) ------------------------------------------------------------


class Window(msgspec.Struct):
    width: int
    height: int
    title: str = ""


def test_app_settings_are_typed_and_survive_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    values: dict[str, object] = {
        "name": "ada",
        "blob": b"\x00\xff",
        "count": 2**63 - 1,
        "ratio": 0.25,
        "on": True,
        "nothing": None,
        "list": [1, "two", 3.0],
        "map": {"a": 1},
        "window": Window(800, 600, "main"),
    }
    with SettingsStore(path) as store:
        identity = store.identity()
        for key, value in values.items():
            store.app.set(key, value)
        store.app.set("count", 7)  # replaced, not added
        assert len(store.app) == len(values)
    with SettingsStore(path) as again:
        app = again.app
        assert sorted(app.keys()) == sorted(values) == list(app)
        assert app.get("name") == "ada" and app.get("blob") == b"\x00\xff" and app.get("count") == 7
        assert app.get("ratio") == 0.25 and app.get("on") is True and app.get("list") == [1, "two", 3.0]
        assert app.get("window") == {"width": 800, "height": 600, "title": "main"}  # untyped: builtins
        assert app.get("window", type=Window) == Window(800, 600, "main")
        assert app.get("missing") is None and app.get("missing", 5) == 5 and "missing" not in app
        assert "nothing" in app and app.get("nothing", "default") is None
        with pytest.raises(SettingsStoreError, match="'name'"):
            app.get("name", type=int)
        assert app.delete("name") and not app.delete("name") and "name" not in app
        assert again.identity() == identity


def test_app_settings_are_apart_from_pins_and_identity() -> None:
    with SettingsStore(":memory:") as store:
        identity = store.identity()
        store.app.set("10.0.0.1", "a setting named like an address")
        store.app.set("identity", b"x" * 32)  # a key named like the identity reaches no identity
        store.pin("10.0.0.1", b"k" * 32)
        assert store.pins() == {"10.0.0.1": b"k" * 32}
        assert store.app.get("10.0.0.1") == "a setting named like an address"
        assert store.remove_pin("10.0.0.1") and store.app.get("10.0.0.1") == "a setting named like an address"
        assert store.app.delete("10.0.0.1") and store.pins() == {}
        store.pin("10.0.0.2", b"j" * 32)
        assert store.app.keys() == ["identity"] and store.app.get("10.0.0.2") is None
        assert store.identity() == identity


def test_app_settings_are_bounded_and_refuse_what_they_cannot_store() -> None:
    with SettingsStore(":memory:") as store:
        app = store.app
        with pytest.raises(SettingsLimitError, match=str(MAX_SETTING_VALUE)):
            app.set("big", b"x" * MAX_SETTING_VALUE)
        app.set("just", b"x" * (MAX_SETTING_VALUE - 5))  # msgpack bin32: 5 bytes of header
        with pytest.raises(SettingsLimitError, match="256"):
            app.set("k" * (MAX_SETTING_KEY + 1), 1)
        with pytest.raises(SettingsLimitError, match="256"):
            app.set("é" * 129, 1)  # 258 bytes of UTF-8
        app.set("é" * 128, 1)
        with pytest.raises(SettingsLimitError):
            app.set("", 1)
        with pytest.raises(TypeError, match="key"):
            app.set(1, 1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="object"):
            app.set("thing", object())
        with pytest.raises(TypeError):
            app.set("huge", 2**70)
        assert "big" not in app and "thing" not in app and "huge" not in app
        for i in range(MAX_SETTINGS - len(app)):
            app.set(f"n{i}", i)
        with pytest.raises(SettingsLimitError, match=f"{MAX_SETTINGS} settings"):
            app.set("one more", 1)
        app.set("n0", "replacing a setting is always possible")
        assert app.delete("n1")
        app.set("one more", 1)
        assert len(app) == MAX_SETTINGS
    with pytest.raises(SettingsStoreError):
        app.get("n0")  # the store was closed


def test_app_settings_shared_by_two_processes(tmp_path: Path) -> None:
    """Two processes writing one file at once: every write lands, and the key limit holds across them."""
    path = tmp_path / "shared.db"
    SettingsStore(path).close()
    script = (
        "import sys\n"
        "from slipstream.network.store import SettingsStore\n"
        "with SettingsStore(sys.argv[1]) as s:\n"
        "    for i in range(200):\n"
        "        s.app.set(f'{sys.argv[2]}{i}', i)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [
        subprocess.Popen([sys.executable, "-c", script, str(path), name], env=env, stderr=subprocess.PIPE)
        for name in ("a", "b")
    ]
    for writer in writers:
        _, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err.decode()[-2000:]
    with SettingsStore(path) as store:
        assert len(store.app) == 400 and store.app.get("a199") == 199 and store.app.get("b0") == 0
