"""Who removes a driver directory (issue 30, item 11): an embedded driver deletes its own on a clean close,
as Aeron's ``dirDeleteOnShutdown``; a standalone driver keeps its own unless its configuration says so.

The directories here are made up per test under /dev/shm, so a failure leaves nothing the next run trips on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slipstream import Context, DriverConfig, MediaDriver
from slipstream.errors import DriverAlreadyRunningError, DriverConfigError
from slipstream.files.directory import CNC_FILE, LOCK_FILE, SOCKET_FILE

from .test_udp import free_port


@pytest.fixture
def fresh_dir() -> Iterator[Path]:
    """A directory path nobody made yet (the driver creates it)."""
    path = Path("/dev/shm") / f"slipstream-dirtest-{uuid.uuid4().hex[:12]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _python(code: str, env_dir: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new interpreter whose default driver directory ($SLIPSTREAM_DIR) is ``env_dir``."""
    env = {**os.environ, "SLIPSTREAM_DIR": str(env_dir)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=timeout
    )


CONTEXTS = {
    "auto": "Context()",
    "embedded": 'Context(driver="embedded")',
    "invoker": 'Context(driver="embedded", driver_config=DriverConfig(threading_mode="invoker"))',
}


@pytest.mark.parametrize("kind", sorted(CONTEXTS))
def test_a_process_that_closes_its_embedded_driver_leaves_no_directory(fresh_dir: Path, kind: str) -> None:
    done = _python(
        f"""
        import os, time
        from slipstream import Context, DriverConfig
        with {CONTEXTS[kind]} as ctx:
            assert ctx.is_embedded
            sub = ctx.add_subscription("aeron:ipc", 7)
            pub = ctx.add_exclusive_publication("aeron:ipc", 7)
            deadline = time.monotonic() + 10
            while not (pub.is_connected and sub.image_count):
                assert time.monotonic() < deadline, "never connected"
                ctx.invoke() if ctx.is_invoker else time.sleep(0.001)
            assert pub.offer(b"x") > 0
            print(sorted(os.listdir(ctx.directory)))
        """,
        fresh_dir,
    )
    assert done.returncode == 0, done.stderr
    assert "cnc.dat" in done.stdout  # it was there while the driver ran
    assert not fresh_dir.exists(), sorted(os.listdir(fresh_dir))


def test_network_endpoints_close_their_shared_embedded_driver_and_its_directory(fresh_dir: Path) -> None:
    port = free_port()
    done = _python(
        f"""
        import asyncio, os
        import msgspec
        from slipstream.network import Client, ClientConfig, Server, ServerConfig

        class Hello(msgspec.Struct):
            text: str

        async def main() -> None:
            common = dict(app_id="dirtest", messages=[Hello], settings_store=":memory:", enable_ipc=False)
            async with Server(ServerConfig(**common)) as server, Client(ClientConfig(**common)) as client:
                await server.bind({port})
                connection = await client.connect("127.0.0.1", {port}, timeout=10)
                await connection.send_sync(Hello("hi"), timeout=10)
                print(sorted(os.listdir(os.environ["SLIPSTREAM_DIR"])))

        asyncio.run(main())
        """,
        fresh_dir,
    )
    assert done.returncode == 0, done.stderr
    assert "cnc.dat" in done.stdout
    assert not fresh_dir.exists(), sorted(os.listdir(fresh_dir))


def test_a_context_attached_from_another_process_is_told_and_closes_cleanly(fresh_dir: Path) -> None:
    """The directory goes even while another process is attached (as Aeron's): that client has lost its
    driver either way; its mappings stay valid (files are unlinked, never truncated) and it closes cleanly."""
    with Context(fresh_dir, driver="embedded") as ctx:
        ctx.add_subscription("aeron:ipc", 9)
        other = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(f"""
                import sys, time
                from slipstream import Context
                with Context({str(fresh_dir)!r}, driver="external") as ctx:
                    pub = ctx.add_exclusive_publication("aeron:ipc", 9)
                    print("attached", flush=True)
                    deadline = time.monotonic() + 20
                    while ctx.driver_error is None:
                        assert time.monotonic() < deadline, "the driver's end went unnoticed"
                        time.sleep(0.01)
                    print("lost:", ctx.driver_error, flush=True)
                    print("offer after:", pub.offer(b"x"), flush=True)
                print("closed", flush=True)
            """)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert other.stdout is not None
            assert other.stdout.readline().strip() == "attached", other.stderr.read() if other.stderr else ""
        except BaseException:
            other.kill()
            raise
    assert not fresh_dir.exists()
    out, err = other.communicate(timeout=30)
    assert other.returncode == 0, err
    assert "lost: the media driver" in out and out.rstrip().endswith("closed")


def test_an_embedded_driver_keeps_its_directory_when_configured_to(fresh_dir: Path) -> None:
    with Context(fresh_dir, driver="embedded", driver_config=DriverConfig(dir_delete_on_shutdown=False)) as ctx:
        ctx.add_subscription("aeron:ipc", 3)
    assert (fresh_dir / CNC_FILE).exists()


def test_the_driver_removes_only_what_it_made(fresh_dir: Path) -> None:
    fresh_dir.mkdir()
    (fresh_dir / "notes.txt").write_text("mine")
    with Context(fresh_dir, driver="embedded"):
        pass
    assert sorted(os.listdir(fresh_dir)) == ["notes.txt"]


def test_the_setting_is_checked_and_read_from_a_config_file(tmp_path: Path) -> None:
    from slipstream.driver.config_file import format_config, load_config

    with pytest.raises(DriverConfigError, match="dir_delete_on_shutdown"):
        DriverConfig(dir_delete_on_shutdown="yes")  # type: ignore[arg-type]
    for name, text in (
        ("a.toml", "dir_delete_on_shutdown = true\n"),
        ("a.properties", "aeron.dir.delete.on.shutdown=true\n"),
        ("b.properties", "dir-delete-on-shutdown: false\n"),
    ):
        (tmp_path / name).write_text(text)
        assert load_config(tmp_path / name).dir_delete_on_shutdown is ("true" in text)
    assert "dir_delete_on_shutdown" in format_config(DriverConfig())


def _standalone(directory: Path, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream", "driver", "--dir", str(directory), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "media driver running" in line, proc.stderr.read() if proc.stderr else ""
    return proc


def _sigint(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        assert proc.wait(15) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_standalone_driver_stopped_with_sigint_keeps_its_directory(fresh_dir: Path) -> None:
    proc = _standalone(fresh_dir)
    with Context(fresh_dir, driver="external") as ctx:
        ctx.add_subscription("aeron:ipc", 5)
    _sigint(proc)
    assert (fresh_dir / CNC_FILE).exists()  # slipstream stat / errors / loss still read it
    done = subprocess.run(
        [sys.executable, "-m", "slipstream", "stat", "--once", "--dir", str(fresh_dir)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0 and "slipstream stat, pid" in done.stdout, done.stderr
    printed = subprocess.run(
        [sys.executable, "-m", "slipstream", "driver", "--print-config"], capture_output=True, text=True, timeout=30
    )
    assert "dir_delete_on_shutdown" in printed.stdout and "= false" in printed.stdout.split("dir_delete_on_shutdown")[1]


def test_a_standalone_driver_deletes_its_directory_when_its_config_file_says_so(
    fresh_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "driver.toml"
    config.write_text("dir_delete_on_shutdown = true\n")
    proc = _standalone(fresh_dir, "--config", str(config))
    with Context(fresh_dir, driver="external") as ctx:
        ctx.add_subscription("aeron:ipc", 5)
    _sigint(proc)
    assert not fresh_dir.exists()


def test_a_driver_claims_the_directory_while_the_last_one_removes_it(fresh_dir: Path) -> None:
    """A driver starting while the previous one is deleting the directory either waits (already running)
    or gets a directory of its own whose files survive the deletion; never a directory error."""
    config = DriverConfig(directory=fresh_dir, counters_capacity=64, error_log_length=4096, ipc_term_length=1 << 16)
    for _ in range(100):
        first = MediaDriver(config).launch_embedded()
        closer = threading.Thread(target=first.close)
        closer.start()
        deadline = time.monotonic() + 10
        while True:
            try:
                second = MediaDriver(config).launch_embedded()
                break
            except DriverAlreadyRunningError:
                assert time.monotonic() < deadline
                time.sleep(0.0005)
        closer.join(10)
        try:
            for name in (CNC_FILE, LOCK_FILE, SOCKET_FILE):
                assert (fresh_dir / name).exists(), name
            with Context(fresh_dir, driver="external", driver_timeout_s=5):
                pass
        finally:
            second.close()
        assert not fresh_dir.exists()


def test_a_context_raises_the_open_file_limit_its_mapped_logs_need(tmp_path: Path) -> None:
    """Each mapped log holds a descriptor (CPython's mmap keeps a duplicate), a few per stream: under the
    common soft limit of 1024 a server with a few hundred connections ran out. A context (and a driver)
    raises the soft limit to the hard one, in a process started with a low soft limit."""
    import resource

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))

    code = textwrap.dedent(f"""
        import resource
        from slipstream import Context
        with Context({str(tmp_path / "d")!r}, driver="embedded"):
            print(*resource.getrlimit(resource.RLIMIT_NOFILE))
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=low_soft_limit
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["4096", "4096"], done.stdout
