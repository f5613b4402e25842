"""The settings store: this endpoint's long-term identity key, the server keys it pinned, and the
application's own settings (``AppSettings``, in a table of their own that the other two never see).

SQLite (stdlib) in one file, by default under the per-user data directory
(``$XDG_DATA_HOME/slipstream/<name>.db``, else ``~/.local/share/slipstream/<name>.db``), created with
0600 permissions because it holds a private key; ``":memory:"`` keeps everything in memory (tests,
throwaway identities). The identity is created once and kept: a client pins a server's key per address
on first contact (trust on first use) and refuses a changed one, so a server must not change keys
across restarts. Safe to share between processes (SQLite locking; an identity is inserted with
``INSERT OR IGNORE`` so two processes starting at once agree on one key).

A client *claims* its identity (``identity(claim=True)``): one slot of the store per client open at once,
held by a lock file (``<store>.identity-<slot>.lock``, ``flock``) until ``close``. Two clients sharing a
store at once (two processes of one application without ``settings_store``, or two in one process) so get
keys of their own, and a server never takes one for the other coming back (buffered sessions, the
table's successor); a client started again takes the first free slot, so a lone client keeps its key
across restarts. Servers share their identity: clients pin a server's key by address.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar, overload

import msgspec

from .errors import SettingsLimitError, SettingsStoreError
from .noise import DHLEN, generate_keypair, public_key

__all__ = [
    "MAX_SETTINGS",
    "MAX_SETTING_KEY",
    "MAX_SETTING_VALUE",
    "MEMORY",
    "AppSettings",
    "SettingsStore",
    "default_store_path",
]

MEMORY: Final = ":memory:"
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS identity (id INTEGER PRIMARY KEY CHECK (id = 1), private BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS pins (address TEXT PRIMARY KEY, key BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS app_settings (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS identities (slot INTEGER PRIMARY KEY CHECK (slot > 1), private BLOB NOT NULL);
"""
MAX_SLOTS: Final = 4096
"""Clients sharing one store at once (each claims a slot)."""
MAX_SETTING_KEY: Final = 256
"""Bytes (UTF-8) of an application setting's key."""
MAX_SETTING_VALUE: Final = 64 * 1024
"""Bytes of an application setting's value, msgpack-encoded."""
MAX_SETTINGS: Final = 1024
"""Application settings in one store: with the value bound, the file grows by at most 64 MiB for them."""

T = TypeVar("T")
D = TypeVar("D")


def default_store_path(name: str = "settings") -> str:
    """Where a store named ``name`` lives by default (the per-user data directory)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "slipstream" / f"{name}.db")


class SettingsStore:
    """Identity and pinned keys in SQLite. ``SettingsStore(":memory:")`` for an in-memory store."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = os.fspath(path) if path is not None else default_store_path()
        self._lock = threading.Lock()
        try:
            if self.path != MEMORY:
                self._create_private_file(self.path)
            self._db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise SettingsStoreError(f"cannot open the settings store {self.path!r}: {exc}") from exc
        self._identity: tuple[bytes, bytes] | None = None
        self.app = AppSettings(self._db, self._lock, self.path)
        """The application's own key/value settings (an endpoint's ``settings``)."""
        self._claim: int | None = None
        """The lock file held for the claimed identity slot (its descriptor)."""

    @staticmethod
    def _create_private_file(path: str) -> None:
        """Create the file (and its directory) readable by its owner only, before SQLite opens it."""
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)  # an older or copied file: it holds a private key
        finally:
            os.close(fd)

    def identity(self, *, claim: bool = False) -> tuple[bytes, bytes]:
        """(private, public) raw X25519 keys of this endpoint: created on first use, then the same forever.
        With ``claim``, the first slot no other open store holds (see the module's text)."""
        if self._identity is not None:
            return self._identity
        slot = self._claim_slot() if claim and self.path != MEMORY else 1
        candidate, _ = generate_keypair()
        table, column = ("identity", "id") if slot == 1 else ("identities", "slot")
        with self._lock:
            self._execute(f"INSERT OR IGNORE INTO {table} ({column}, private) VALUES (?, ?)", (slot, candidate))
            row = self._execute(f"SELECT private FROM {table} WHERE {column} = ?", (slot,)).fetchone()
        private = row[0] if row is not None else None
        if not isinstance(private, bytes) or len(private) != DHLEN:
            raise SettingsStoreError(f"settings store {self.path!r} holds an invalid identity key")
        self._identity = (private, public_key(private))
        return self._identity

    def _claim_slot(self) -> int:
        """Lock the first free slot's file (kept until ``close``); SettingsStoreError when all are held."""
        for slot in range(1, MAX_SLOTS + 1):
            try:
                fd = os.open(f"{self.path}.identity-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise SettingsStoreError(f"cannot claim an identity in {self.path!r}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # held by another client
                continue
            self._claim = fd
            return slot
        raise SettingsStoreError(f"{MAX_SLOTS} clients hold identities of {self.path!r} at once")

    def pinned_key(self, address: str) -> bytes | None:
        """The server key pinned for ``address``, or None if none is."""
        with self._lock:
            row = self._execute("SELECT key FROM pins WHERE address = ?", (address,)).fetchone()
        if row is None:
            return None
        key = row[0]
        if not isinstance(key, bytes) or len(key) != DHLEN:
            raise SettingsStoreError(f"settings store {self.path!r} holds an invalid key pinned for {address!r}")
        return key

    def pin(self, address: str, key: bytes) -> None:
        """Pin ``key`` for ``address`` (replacing any earlier pin: callers decide whether a change is allowed)."""
        if len(key) != DHLEN:
            raise ValueError(f"a pinned key is {DHLEN} bytes, not {len(key)}")
        with self._lock:
            self._execute("INSERT OR REPLACE INTO pins (address, key) VALUES (?, ?)", (address, bytes(key)))

    def remove_pin(self, address: str) -> bool:
        """Forget the key pinned for ``address`` (so the next contact pins anew); False if none was."""
        with self._lock:
            return self._execute("DELETE FROM pins WHERE address = ?", (address,)).rowcount > 0

    def pins(self) -> dict[str, bytes]:
        """Every pinned address and key."""
        with self._lock:
            return {address: key for address, key in self._execute("SELECT address, key FROM pins", ())}

    def _execute(self, sql: str, parameters: tuple[object, ...]) -> sqlite3.Cursor:
        return _execute(self._db, self.path, sql, parameters)

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            self._db.close()
            if self._claim is not None:
                os.close(self._claim)  # (the slot is free again)
                self._claim = None

    def __enter__(self) -> SettingsStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class AppSettings:
    """The application's own settings, a small key/value store in the settings store's file (the
    seed's ``storage``): ``settings.set("volume", 0.8)``, ``settings.get("volume", 1.0)``.

    Apart from the identity and the pins: no key reaches them, and pinning never touches a setting.
    Values are anything msgspec encodes (str, bytes, int, float, bool, None, lists, dicts, Structs,
    dataclasses...), stored as msgpack; ``get(key, type=Window)`` decodes into a type again (without it,
    a Struct comes back as a dict). Bounded: keys of ``MAX_SETTING_KEY`` bytes, values of
    ``MAX_SETTING_VALUE`` bytes encoded, ``MAX_SETTINGS`` keys (``SettingsLimitError`` past them, nothing
    written). Processes sharing the file see each other's writes; each ``set`` is one transaction."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, path: str) -> None:
        self._db = db
        self._lock = lock
        self._path = path

    @overload
    def get(self, key: str) -> Any: ...
    @overload
    def get(self, key: str, default: D) -> Any | D: ...
    @overload
    def get(self, key: str, default: D, *, type: type[T]) -> T | D: ...
    @overload
    def get(self, key: str, *, type: type[T]) -> T | None: ...
    def get(self, key: str, default: object = None, *, type: type[Any] | None = None) -> Any:
        """The value of ``key`` (decoded into ``type`` when given), or ``default`` when it is not set."""
        _check_key(key)
        with self._lock:
            row = self._execute("SELECT value FROM app_settings WHERE key = ?", (key,)).fetchone()
        if row is None:
            return default
        try:
            return msgspec.msgpack.decode(row[0]) if type is None else msgspec.msgpack.decode(row[0], type=type)
        except msgspec.DecodeError as exc:
            raise SettingsStoreError(f"settings store {self._path!r}: setting {key!r}: {exc}") from exc

    def set(self, key: str, value: object) -> None:
        """Store ``value`` under ``key`` (replacing it); ``TypeError`` for a value msgspec cannot encode."""
        _check_key(key)
        try:
            encoded = msgspec.msgpack.encode(value)
        except (TypeError, OverflowError, msgspec.EncodeError) as exc:
            raise TypeError(f"setting {key!r}: a {type(value).__name__} cannot be stored: {exc}") from exc
        if len(encoded) > MAX_SETTING_VALUE:
            raise SettingsLimitError(
                f"setting {key!r}: {len(encoded)} bytes encoded, over the {MAX_SETTING_VALUE}-byte limit"
            )
        with self._lock:
            self._execute("BEGIN IMMEDIATE", ())  # the count and the insert are one step for every process
            try:
                known = self._db.execute("SELECT 1 FROM app_settings WHERE key = ?", (key,)).fetchone()
                if known is None:
                    (count,) = self._db.execute("SELECT count(*) FROM app_settings").fetchone()
                    if count >= MAX_SETTINGS:
                        raise SettingsLimitError(f"setting {key!r}: the store holds {MAX_SETTINGS} settings already")
                self._db.execute("INSERT OR REPLACE INTO app_settings (key, value) VALUES (?, ?)", (key, encoded))
                self._db.execute("COMMIT")
            except BaseException as exc:
                self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise SettingsStoreError(f"settings store {self._path!r}: {exc}") from exc
                raise

    def delete(self, key: str) -> bool:
        """Forget ``key``; False if it was not set."""
        _check_key(key)
        with self._lock:
            return self._execute("DELETE FROM app_settings WHERE key = ?", (key,)).rowcount > 0

    def keys(self) -> list[str]:
        """Every key set, sorted."""
        with self._lock:
            return [key for (key,) in self._execute("SELECT key FROM app_settings ORDER BY key", ())]

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        with self._lock:
            return self._execute("SELECT 1 FROM app_settings WHERE key = ?", (key,)).fetchone() is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        with self._lock:
            return int(self._execute("SELECT count(*) FROM app_settings", ()).fetchone()[0])

    def _execute(self, sql: str, parameters: tuple[object, ...]) -> sqlite3.Cursor:
        return _execute(self._db, self._path, sql, parameters)


def _execute(db: sqlite3.Connection, path: str, sql: str, parameters: tuple[object, ...]) -> sqlite3.Cursor:
    """``db.execute``, its failures as ``SettingsStoreError`` naming the file."""
    try:
        return db.execute(sql, parameters)
    except sqlite3.Error as exc:
        raise SettingsStoreError(f"settings store {path!r}: {exc}") from exc


def _check_key(key: object) -> None:
    if not isinstance(key, str):
        raise TypeError(f"a setting's key is a str, not {type(key).__name__}")
    size = len(key.encode("utf-8", "surrogatepass"))
    if not 0 < size <= MAX_SETTING_KEY:
        raise SettingsLimitError(f"a setting's key is 1 to {MAX_SETTING_KEY} bytes (UTF-8), not {size}: {key[:40]!r}")
