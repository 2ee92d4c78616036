"""Which confluent-kafka clients a test module left open, and what still holds each one.

A client is *released* once its librdkafka handle is destroyed: the handle owns threads and broker
connections, and one left alive keeps reconnecting after the stack stopped ("Connection refused" on
stderr at the end of the session) or is destroyed during interpreter exit, which can crash it.

- ``Consumer``: ``close()`` destroys the handle; a closed consumer still referenced is released.
- ``Producer``: ``close()`` (confluent-kafka >= 2.x) destroys it after flushing; a closed producer
  still referenced is released. Without ``close()`` only its garbage collection does.
- ``AdminClient`` has no ``close()``: only its garbage collection destroys the handle, so an
  AdminClient still alive (after ``gc.collect()``) is open, whoever holds it.

The scan is one pass over ``gc.get_objects()`` at the end of each module (the C types take no weak
references, but the garbage collector tracks them): well under a second even for a large heap.
"""

from __future__ import annotations

import gc
import sys
import threading
import types
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

CLIENT_TYPES = (Producer, Consumer, AdminClient)


def is_open(client: Any) -> bool:
    """Whether ``client``'s librdkafka handle still exists (the probes have no effect on an open one)."""
    try:
        if isinstance(client, Consumer):
            client.assignment()
        elif isinstance(client, Producer):
            client.purge(in_queue=False, in_flight=False, blocking=False)  # purges nothing
    except RuntimeError:  # "Consumer closed", "Producer has been closed"
        return False
    return True


def open_clients() -> list[Any]:
    """Every live client whose handle is open (call ``gc.collect()`` first to leave out garbage)."""
    types_ = _with_subclasses(CLIENT_TYPES)  # a set lookup per object: faster than isinstance
    return [obj for obj in gc.get_objects() if type(obj) in types_ and is_open(obj)]


def _with_subclasses(roots: tuple[type, ...]) -> set[type]:
    found: set[type] = set()
    todo = list(roots)
    while todo:
        kind = todo.pop()
        if kind not in found:
            found.add(kind)
            todo.extend(kind.__subclasses__())
    return found


def in_call_on_thread(client: Any) -> bool:
    """Whether a call on another thread than this one is using ``client`` now (a frame of it holds ``client``)."""
    here = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        while ident != here and frame is not None:
            if any(value is client for value in frame.f_locals.values()):
                return True
            frame = frame.f_back  # type: ignore[assignment]
    return False


def holders(target: Any, ignore: tuple[Any, ...] = (), depth: int = 8) -> str:
    """What keeps ``target`` alive, one chain of referrers: ``KafkaCluster.admin <- MetadataManager.cluster
    <- frame of run (x.py:12)``; stops at a module, a frame, a class or after ``depth`` steps. ``ignore``:
    the caller's own containers of clients."""
    chain: list[str] = []
    seen = {id(target), *(id(obj) for obj in ignore)}
    here = target
    for _ in range(depth):
        step = _holder(here, seen)
        if step is None:
            if chain:
                chain.append("a running function's local variable, or C code")
            break
        seen.add(id(step))
        text, here = step
        chain.append(text)
        if here is None:
            break
    return " <- ".join(chain) or "nothing the garbage collector sees (a C extension or a thread's stack)"


def _holder(target: Any, seen: set[int]) -> tuple[str, Any] | None:
    """The most telling referrer of ``target``: (its description, the object to follow next or None)."""
    found: list[tuple[int, str, Any]] = []  # (rank: lower is more telling, description, next object)
    seen.add(id(found))
    referrers = gc.get_referrers(target)
    for ref in referrers:
        if id(ref) in seen or ref is referrers:
            continue
        if isinstance(ref, types.FrameType):
            code = ref.f_code
            if code.co_filename == __file__ or code.co_filename.endswith("conftest.py"):
                continue
            found.append((3, f"frame of {code.co_name} ({code.co_filename}:{ref.f_lineno})", None))
        elif isinstance(ref, dict):
            owner = _dict_owner(ref, target, seen)
            if owner is not None:
                found.append((0 if owner[1] is not None else 3, *owner))
        elif isinstance(ref, (list, tuple, set, frozenset)):
            found.append((2, f"a {type(ref).__name__} of {len(ref)}", ref))
        elif isinstance(ref, types.CellType):
            found.append((1, "a closure's cell", ref))
        elif not isinstance(ref, (types.FunctionType, type)):
            found.append((1, _describe(ref, target), ref))
    for item in found:
        seen.add(id(item))
        if item[2] is not None:
            seen.add(id(item[2]))
    if not found:
        return None
    _, text, following = min(found, key=lambda item: item[0])
    return text, following


def _dict_owner(mapping: dict[str, Any], target: Any, seen: set[int]) -> tuple[str, Any] | None:
    keys = [k for k, v in mapping.items() if v is target]
    name = str(keys[0]) if keys else "?"
    for owner in gc.get_referrers(mapping):
        if getattr(owner, "__dict__", None) is mapping and id(owner) not in seen:
            if isinstance(owner, types.ModuleType):
                return f"{owner.__name__}.{name} (module global)", None
            return f"{type(owner).__qualname__}.{name}", owner
    return f"a dict (key {name})", mapping


def _describe(owner: Any, target: Any) -> str:
    """``Class.attribute`` (an instance's attributes need not live in a dict the collector reports), a
    thread with its name."""
    if isinstance(owner, threading.Thread):
        return f"thread {owner.name!r}"
    try:
        names = [k for k, v in vars(owner).items() if v is target]
    except TypeError:  # no __dict__ (slots, C types)
        names = [k for k in getattr(type(owner), "__slots__", ()) if getattr(owner, k, None) is target]
    return f"{type(owner).__qualname__}.{names[0]}" if names else type(owner).__qualname__
