"""What stands for a remote object: the pure-data :class:`RemoteRef`, the proxy base the core
recognises, and the tables of objects a side hosts.

A proxy is the adapter's (an awaitable one for asyncio); the core knows it only as a
:class:`ProxyBase`: a reference and the endpoint it came from, read through public properties, so a
proxy passed back as an argument goes home as a reference to the real object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ..errors import InterfaceError, ObjectIdInUse
from .wire import MAX_OBJECT_ID, MIN_OBJECT_ID

if TYPE_CHECKING:
    from .registry import RmiRegistry

__all__ = ["ObjectTable", "ProxyBase", "RemoteRef"]


@dataclass(frozen=True, slots=True)
class RemoteRef:
    """Pure-data handle of an object the peer hosts: what a proxy refers to."""

    interface_id: int
    object_id: int
    is_global: bool = False


class ProxyBase:
    """What a proxy is to the core: a :class:`RemoteRef` and the endpoint it belongs to.

    The adapters subclass it. Its state lives in ``_rmi_*`` slots, because every public name of a proxy
    is a remote method's; the two read-only properties below are the only names the core uses.
    """

    __slots__ = ("_rmi_endpoint", "_rmi_ref")

    def __init__(self, endpoint: object, ref: RemoteRef) -> None:
        object.__setattr__(self, "_rmi_endpoint", endpoint)
        object.__setattr__(self, "_rmi_ref", ref)

    @property
    def rmi_ref(self) -> RemoteRef:
        """Which remote object this proxy calls."""
        ref: RemoteRef = object.__getattribute__(self, "_rmi_ref")
        return ref

    @property
    def rmi_endpoint(self) -> object:
        """The RMI endpoint (one connection's) this proxy calls through."""
        return object.__getattribute__(self, "_rmi_endpoint")


_identity: Final = id
"""The builtin ``id`` (the object tables' methods name their parameter ``id``, as the issue does)."""


class ObjectTable:
    """Objects a side hosts, by id (1-65535; 0 is invalid): the global table or one connection's.

    Only objects that serve a registered interface (an instance of a registered implementation) can be
    saved. Automatic ids cycle through the range, so an id just deleted is the last to be reused (a
    stale proxy is unlikely to reach a new object).
    """

    def __init__(self, registry: RmiRegistry, *, is_global: bool = False) -> None:
        self.registry = registry
        self.is_global = is_global
        self._by_id: dict[int, object] = {}
        self._ids: dict[int, int] = {}
        self._next = MIN_OBJECT_ID

    def save(self, obj: object, id: int | None = None) -> int:
        """Host ``obj`` under ``id`` (1-65535; by default the next free one); returns its id (the
        existing one when it is already saved)."""
        object_id = id
        if not self.registry.served(obj):
            raise InterfaceError(f"{type(obj).__qualname__} is not a registered implementation of any RMI interface")
        existing = self._ids.get(_identity(obj))
        if existing is not None:
            if object_id is not None and object_id != existing:
                raise ObjectIdInUse(f"this object is already saved under id {existing}, not {object_id}")
            return existing
        if object_id is None:
            if len(self._by_id) >= MAX_OBJECT_ID:
                raise ObjectIdInUse(f"all {MAX_OBJECT_ID} object ids are in use")
            while self._next in self._by_id:
                self._next = self._next % MAX_OBJECT_ID + 1
            object_id = self._next
            self._next = self._next % MAX_OBJECT_ID + 1
        elif not MIN_OBJECT_ID <= object_id <= MAX_OBJECT_ID:
            raise ObjectIdInUse(f"object id {object_id} is outside {MIN_OBJECT_ID}-{MAX_OBJECT_ID}")
        elif object_id in self._by_id:
            raise ObjectIdInUse(
                f"object id {object_id} holds another object ({type(self._by_id[object_id]).__qualname__})"
            )
        self._by_id[object_id] = obj
        self._ids[_identity(obj)] = object_id
        return object_id

    def get(self, id: int) -> object | None:
        """The object saved under ``id``, or None."""
        return self._by_id.get(id)

    def id_of(self, obj: object) -> int | None:
        """The id ``obj`` is saved under, or None."""
        object_id = self._ids.get(_identity(obj))
        return object_id if object_id is not None and self._by_id.get(object_id) is obj else None

    def delete(self, id: object) -> bool:
        """Forget an object, by ``id`` or by the object itself; False if it was not saved. A call the
        peer makes on it afterwards fails with RemoteObjectMissing naming the id."""
        if isinstance(id, int) and not isinstance(id, bool):
            obj = self._by_id.pop(id, None)
            if obj is None:
                return False
            self._ids.pop(_identity(obj), None)
            return True
        object_id = self.id_of(id)
        if object_id is None:
            return False
        del self._by_id[object_id]
        del self._ids[_identity(id)]
        return True

    def clear(self) -> None:
        """Forget every object (the connection closed)."""
        self._by_id.clear()
        self._ids.clear()

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, object_id: object) -> bool:
        return object_id in self._by_id
