"""What stands for a remote object: the pure-data :class:`RemoteRef`, the proxy base the core
recognises, and the tables of objects a side hosts.

A proxy is the adapter's (an awaitable one for asyncio); the core knows it only as a
:class:`ProxyBase`: a reference and the endpoint it came from, read through public properties, so a
proxy passed back as an argument goes home as a reference to the real object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from ..errors import InterfaceError, ObjectIdInUse
from .wire import DEFAULT_TIMEOUT_NS, MAX_OBJECT_ID, MIN_OBJECT_ID

if TYPE_CHECKING:
    from .registry import InterfaceSpec, MethodSpec, RmiRegistry

__all__ = ["ObjectTable", "ProxyBase", "RemoteRef"]


@dataclass(frozen=True, slots=True)
class RemoteRef:
    """Pure-data handle of an object the peer hosts: what a proxy refers to."""

    interface_id: int
    object_id: int
    is_global: bool = False


class _Registered(Protocol):
    """An endpoint as a proxy needs it: where the interfaces are."""

    @property
    def registry(self) -> RmiRegistry: ...


class ProxyBase:
    """A remote object as every adapter's proxy is one: a :class:`RemoteRef`, the endpoint it belongs
    to, its interface, its call timeout and whether its calls are fire-and-forget.

    Only the interface's methods exist on a proxy (anything else is an AttributeError here and could not
    be called remotely anyway); ``proxy.method`` is the adapter's (:meth:`_remote_method`: an awaitable
    call for asyncio). State lives in ``_rmi_*`` slots, because every other public name of a proxy is a
    remote method's. ``rmi_timeout`` (seconds, default 3, 0 = forever) bounds each call; :meth:`rmi_async`
    gives a fire-and-forget twin whose calls send no reply and never raise.
    """

    __slots__ = ("_rmi_endpoint", "_rmi_oneway", "_rmi_ref", "_rmi_spec", "_rmi_timeout_ns")

    def __init__(
        self, endpoint: _Registered, ref: RemoteRef, *, oneway: bool = False, timeout_ns: int = DEFAULT_TIMEOUT_NS
    ) -> None:
        object.__setattr__(self, "_rmi_endpoint", endpoint)
        object.__setattr__(self, "_rmi_ref", ref)
        object.__setattr__(self, "_rmi_spec", endpoint.registry.interfaces[ref.interface_id])
        object.__setattr__(self, "_rmi_oneway", oneway)
        object.__setattr__(self, "_rmi_timeout_ns", timeout_ns)

    @property
    def rmi_ref(self) -> RemoteRef:
        """Which remote object this proxy calls."""
        ref: RemoteRef = object.__getattribute__(self, "_rmi_ref")
        return ref

    @property
    def rmi_endpoint(self) -> object:
        """The RMI endpoint (one connection's) this proxy calls through."""
        return object.__getattribute__(self, "_rmi_endpoint")

    @property
    def rmi_timeout(self) -> float:
        """Seconds each call waits for its response (0 = forever)."""
        return float(object.__getattribute__(self, "_rmi_timeout_ns")) / 1e9

    @rmi_timeout.setter
    def rmi_timeout(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"rmi_timeout must not be negative: {seconds}")
        object.__setattr__(self, "_rmi_timeout_ns", int(seconds * 1e9))

    def __getattr__(self, name: str) -> object:
        spec: InterfaceSpec = object.__getattribute__(self, "_rmi_spec")
        method = spec.by_name.get(name)
        if method is None:
            raise AttributeError(f"{spec.name} has no remote method {name!r}")
        oneway: bool = object.__getattribute__(self, "_rmi_oneway")
        return self._remote_method(method, oneway, object.__getattribute__(self, "_rmi_timeout_ns"))

    def __setattr__(self, name: str, value: object) -> None:
        if name == "rmi_timeout":
            ProxyBase.rmi_timeout.__set__(self, value)  # type: ignore[attr-defined]
            return
        raise AttributeError(f"a proxy has no attribute {name!r} to set")

    def _remote_method(self, method: MethodSpec, oneway: bool, timeout_ns: int) -> object:
        """``proxy.method``, as the adapter calls it."""
        raise AttributeError(f"a bare reference cannot call {method.qualname}")

    def _twin(self, oneway: bool) -> ProxyBase:
        """The same proxy, with calls that wait for their results or not."""
        return type(self)(
            object.__getattribute__(self, "_rmi_endpoint"),
            self.rmi_ref,
            oneway=oneway,
            timeout_ns=object.__getattribute__(self, "_rmi_timeout_ns"),
        )

    def rmi_async(self) -> ProxyBase:
        """A fire-and-forget twin of this proxy (same object, calls get no reply)."""
        return self._twin(True)

    def rmi_sync(self) -> ProxyBase:
        """A twin whose calls wait for their results (the default mode)."""
        return self._twin(False)

    def __repr__(self) -> str:
        spec: InterfaceSpec = object.__getattribute__(self, "_rmi_spec")
        ref = self.rmi_ref
        return f"<proxy {spec.name}:{'global:' if ref.is_global else ''}{ref.object_id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProxyBase) and self.rmi_ref == other.rmi_ref

    def __hash__(self) -> int:
        return hash(self.rmi_ref)


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
