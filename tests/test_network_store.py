"""The settings store: identity created once, pins, persistence across reopening, 0600 files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slipstream.network.errors import SettingsStoreError
from slipstream.network.noise import public_key
from slipstream.network.store import SettingsStore, default_store_path


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
