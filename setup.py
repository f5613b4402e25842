"""Builds the optional C fast path (``slipstream.logbuffer._fastpath``, the log buffer's hot loops, and
``slipstream.network._records``, a connection's record layer and record decoder); everything else is in
pyproject.toml.

The extension is optional: without a working C compiler (or with ``SLIPSTREAM_NO_EXTENSIONS=1``) the
install still succeeds and slipstream runs its pure-Python reference code, saying so in one line.
``SLIPSTREAM_REQUIRE_EXTENSIONS=1`` makes a failed build an error (a non-zero exit, as ``make test`` and CI
want: they must not go on with a stale or missing build). ``SLIPSTREAM_SANITIZE=1`` builds with
AddressSanitizer and UBSan (``make asan``, in a scratch copy of the tree).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

WARNINGS = ["-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers", "-std=c11"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined", "-O1", "-g"]


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """Compile the fast path if possible; on any compiler failure, say so once and install without it,
    unless SLIPSTREAM_REQUIRE_EXTENSIONS is set: then the failure propagates and the build exits non-zero."""

    def run(self) -> None:
        if _flag("SLIPSTREAM_NO_EXTENSIONS"):
            print("slipstream: SLIPSTREAM_NO_EXTENSIONS is set: installing the pure-Python path only", file=sys.stderr)
            return
        self._inplace_requested = bool(self.inplace)  # setuptools clears it while building, then copies
        try:
            super().run()
        except Exception as exc:  # no compiler at all (setuptools raises its own platform errors)
            self._fallback(exc)

    def build_extension(self, ext: Extension) -> None:
        if _flag("SLIPSTREAM_REQUIRE_EXTENSIONS"):
            super().build_extension(ext)  # a failure is the build's (run reports it once)
            return
        try:
            super().build_extension(ext)
        except Exception as exc:  # compile or link error
            self._fallback(exc)

    def _fallback(self, exc: BaseException) -> None:
        self._remove_stale_inplace()
        if _flag("SLIPSTREAM_REQUIRE_EXTENSIONS"):
            print(f"slipstream: C fast path not built and SLIPSTREAM_REQUIRE_EXTENSIONS is set: {exc}", file=sys.stderr)
            raise exc
        print(
            f"slipstream: C fast path not built ({type(exc).__name__}: {exc}); installing the pure-Python path",
            file=sys.stderr,
        )

    def _remove_stale_inplace(self) -> None:
        """A failed in-place build must not leave an earlier one to be loaded instead (setuptools copies an
        optional extension in place only if it built): without it, the pure-Python path runs, as the
        fallback's line says, or an import that requires the extension fails."""
        if not getattr(self, "_inplace_requested", False):
            return
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            package, _, _ = ext.name.rpartition(".")
            stale = os.path.join(build_py.get_package_dir(package), os.path.basename(self.get_ext_filename(ext.name)))
            if os.path.exists(stale):
                os.remove(stale)
                print(f"slipstream: removed the earlier build {stale}", file=sys.stderr)


compile_args = WARNINGS + (SANITIZE if _flag("SLIPSTREAM_SANITIZE") else ["-O3"])
link_args = SANITIZE[:1] if _flag("SLIPSTREAM_SANITIZE") else []

setup(
    ext_modules=[
        Extension(
            name,
            sources=[source],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
            optional=not _flag("SLIPSTREAM_REQUIRE_EXTENSIONS"),
        )
        for name, source in (
            ("slipstream.logbuffer._fastpath", "src/slipstream/logbuffer/_fastpath.c"),
            ("slipstream.network._records", "src/slipstream/network/_records.c"),
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
