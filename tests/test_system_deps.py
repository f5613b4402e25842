"""``scripts/ensure-system-deps.sh`` checks what it was asked for, and only that (issue 30, item 3).

Nothing is installed: the script runs with a PATH of a few real tools and a stand-in ``apt-get`` that
"installs" a package by dropping a stub command into that PATH, so its install path runs for real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ensure-system-deps.sh"
BASH = shutil.which("bash") or "/bin/bash"
STUBS = {
    "chromium": ("chromium", "echo 'Chromium 120.0'"),
    "openjdk-17-jre-headless": ("java", "echo 'openjdk version \"17.0.9\" 2023-10-17' >&2"),
    "nftables": ("nft", "exit 0"),
    "iproute2": ("ip", "exit 0"),
}
"""What the stand-in apt-get puts on the PATH for each package the script may ask for."""


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _bin(tmp_path: Path, *, java: bool) -> Path:
    """A PATH directory: the tools the script runs, ``id`` saying root, the stand-in apt-get, and java
    only when asked (the real one when the machine has Java 17+, else a stub)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sed", "head", "sort"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    _script(bin_dir / "id", "echo 0")
    stubs = tmp_path / "stubs"  # not on the PATH until apt-get "installs" one
    stubs.mkdir()
    for command, body in STUBS.values():
        _script(stubs / command, body)
    copy = shutil.which("cp")
    assert copy is not None
    installs = "\n".join(
        f'        {package}) {copy} "{stubs}/{command}" "{bin_dir}/{command}" ;;'
        for package, (command, _) in STUBS.items()
    )
    _script(
        bin_dir / "apt-get",
        f'echo "$*" >> "{tmp_path / "apt.log"}"\n'
        '[ "$1" = install ] || exit 0\n'
        'for arg in "$@"; do\n'
        '    case "$arg" in\n'
        f"{installs}\n"
        "    esac\n"
        "done",
    )
    if java:
        real = shutil.which("java")
        if real is not None and _java_17(real):
            (bin_dir / "java").symlink_to(real)
        else:
            _script(bin_dir / "java", STUBS["openjdk-17-jre-headless"][1])
    return bin_dir


def _java_17(java: str) -> bool:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    return any(f'version "{v}' in out for v in range(17, 40))


def _run(bin_dir: Path, *wanted: str, hide_sbin: bool = False) -> subprocess.CompletedProcess[str]:
    """The script with only ``bin_dir`` on its PATH; ``hide_sbin`` also empties the sbin directories it
    adds to the PATH by itself (a private mount namespace), so nft and ip are truly absent."""
    command = [BASH, str(SCRIPT), *wanted]
    if hide_sbin:
        unshare, mount = shutil.which("unshare"), shutil.which("mount")
        assert unshare is not None and mount is not None
        hide = " && ".join(f"{mount} -t tmpfs none {d}" for d in ("/usr/sbin", "/usr/local/sbin") if Path(d).is_dir())
        command = [unshare, "--mount", "--propagation", "private", BASH, "-c", f'{hide} && exec "$@"', "-", *command]
    env = {"PATH": str(bin_dir), "LANG": "C"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)


def _can_hide_sbin() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=30, check=False
    )
    return probe.returncode == 0


needs_mount_namespace = pytest.mark.skipif(
    not _can_hide_sbin(), reason="hiding /usr/sbin's nft needs root and unshare --mount"
)


@needs_mount_namespace
@pytest.mark.parametrize("java_present", [True, False], ids=["java-present", "java-installed"])
def test_make_demo_needs_no_nft(tmp_path: Path, java_present: bool) -> None:
    """``make demo`` runs ``ensure-system-deps.sh java``: on a machine without nft it succeeds, whether Java
    was there already or the script installed it (before the fix: "'nft' still missing", exit 1)."""
    bin_dir = _bin(tmp_path, java=java_present)
    result = _run(bin_dir, "java", hide_sbin=True)
    assert result.returncode == 0, result.stderr
    assert "nft" not in result.stdout + result.stderr
    apt = (tmp_path / "apt.log").read_text() if (tmp_path / "apt.log").exists() else ""
    if java_present:
        assert apt == "" and "nothing to do" in result.stdout
    else:
        assert "openjdk-17-jre-headless" in apt and "nftables" not in apt
        assert "installed openjdk-17-jre-headless" in result.stdout


def test_asked_for_one_entry_the_others_may_stay_missing(tmp_path: Path) -> None:
    """Asked for chromium, not java, java missing: chromium is installed and the script succeeds."""
    bin_dir = _bin(tmp_path, java=False)
    result = _run(bin_dir, "chromium")
    assert result.returncode == 0, result.stderr
    assert "install -y -qq --no-install-recommends chromium" in (tmp_path / "apt.log").read_text()
    assert (bin_dir / "chromium").exists() and not (bin_dir / "java").exists()


def test_an_entry_still_missing_after_installing_fails(tmp_path: Path) -> None:
    """The check after installing still bites for what was asked: a package that did not bring its
    command is an error, not a success."""
    bin_dir = _bin(tmp_path, java=False)
    _script(bin_dir / "apt-get", "exit 0")  # "installs" without putting anything on the PATH
    result = _run(bin_dir, "chromium")
    assert result.returncode == 1
    assert "'chromium' still missing after installing chromium" in result.stderr
