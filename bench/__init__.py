"""Benchmarks of slipstream against the peers a user would pick instead (pyzmq first).

This module holds only the process harness the benchmarks share: workers run in "spawn" processes
(no inherited threads, locks or driver state), talk to the parent over a pipe, and every wait on
either side has a timeout, so a stuck peer ends a run with an error instead of a hang.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

Worker = Callable[[Connection, Any], None]


@contextlib.contextmanager
def scratch_dir(prefix: str, base: str | None) -> Iterator[Path]:
    """A fresh directory removed afterwards; under /dev/shm for slipstream (its logs live in memory)."""
    if base is not None and not os.path.isdir(base):
        base = None
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class BenchError(RuntimeError):
    """A benchmark run failed (a worker raised, died, or missed a deadline)."""


def run_worker(conn: Connection, worker: Worker, params: Any) -> None:
    """Entry point of every child: run ``worker`` and turn an exception into an ``error`` message,
    because a traceback on the child's stderr is easy to miss and says nothing to the parent."""
    try:
        worker(conn, params)
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


def expect(conn: Connection, kind: str, timeout_s: float, who: str = "parent") -> Any:
    """Receive the next message, which must be ``kind``; raise BenchError on timeout or anything else."""
    if not conn.poll(timeout_s):
        raise BenchError(f"{who}: no {kind!r} message within {timeout_s:.1f} s")
    try:
        tag, payload = conn.recv()
    except EOFError:
        raise BenchError(f"{who}: pipe closed while waiting for {kind!r}") from None
    if tag == "error":
        raise BenchError(f"{who} failed:\n{payload}")
    if tag != kind:
        raise BenchError(f"{who}: expected {kind!r}, got {tag!r}")
    return payload


def stop_requested(conn: Connection) -> bool:
    """True (and the message consumed) if the parent asked a serving worker to stop early, which it
    does when the other side ran out of time: the server then need not wait for its own deadline."""
    if not conn.poll(0):
        return False
    tag, _ = conn.recv()
    if tag != "stop":
        raise BenchError(f"expected 'stop', got {tag!r}")
    return True


class Child:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, name: str, process: BaseProcess, conn: Connection) -> None:
        self.name = name
        self.process = process
        self.conn = conn

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def expect(self, kind: str, timeout_s: float) -> Any:
        """Wait for ``kind`` from the child, noticing at once (not at the timeout) if it died."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if self.conn.poll(max(0.0, min(remaining, 0.1))):
                return expect(self.conn, kind, 0, self.name)
            if not self.process.is_alive() and not self.conn.poll(0):
                raise BenchError(f"{self.name} exited (code {self.process.exitcode}) before sending {kind!r}")
            if remaining <= 0:
                raise BenchError(f"{self.name}: no {kind!r} message within {timeout_s:.1f} s")

    def send(self, kind: str, payload: Any = None) -> None:
        with contextlib.suppress(OSError):
            self.conn.send((kind, payload))

    def finish(self, timeout_s: float = 5.0) -> int | None:
        """Wait for a clean exit; terminate, then kill, a child that does not go."""
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2.0)
        self.conn.close()
        return self.process.exitcode


class Children:
    """Starts workers and guarantees none outlives the block, whatever happened in it."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self._children: list[Child] = []

    def start(self, name: str, worker: Worker, params: Any) -> Child:
        parent_end, child_end = self._ctx.Pipe()
        process = self._ctx.Process(target=run_worker, args=(child_end, worker, params), name=name, daemon=True)
        process.start()
        child_end.close()
        child = Child(name, process, parent_end)
        self._children.append(child)
        return child

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for child in self._children:
            if child.process.is_alive():
                child.process.terminate()
        for child in self._children:
            child.finish(timeout_s=2.0)
        self._children.clear()


def _spin_worker(conn: Connection, seconds: float) -> None:
    start, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        pass
    conn.send(("result", (time.process_time() - cpu) / (time.perf_counter() - start)))


def measure_parallelism(processes: int = 2, seconds: float = 0.5) -> float:
    """Cores' worth of CPU that ``processes`` busy processes get together. ``os.cpu_count()`` can
    promise more than a VM or cgroup quota delivers, and busy-spin figures mean little without this."""
    with Children() as children:
        spinners = [children.start(f"spin-{i}", _spin_worker, seconds) for i in range(processes)]
        total = sum(float(s.expect("result", seconds + 15.0)) for s in spinners)
        for s in spinners:
            s.finish()
    return total
