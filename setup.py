"""Builds the optional C fast path (``slipstream.logbuffer._fastpath``); everything else is in pyproject.toml.

The extension is optional: without a working C compiler (or with ``SLIPSTREAM_NO_EXTENSIONS=1``) the
install still succeeds and slipstream runs its pure-Python reference code, saying so in one line.
``SLIPSTREAM_SANITIZE=1`` builds with AddressSanitizer and UBSan (``make asan``).
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
    """Compile the fast path if possible; on any compiler failure, say so once and install without it."""

    def run(self) -> None:
        if _flag("SLIPSTREAM_NO_EXTENSIONS"):
            print("slipstream: SLIPSTREAM_NO_EXTENSIONS is set: installing the pure-Python path only", file=sys.stderr)
            return
        try:
            super().run()
        except Exception as exc:  # no compiler at all (setuptools raises its own platform errors)
            self._fallback(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # compile or link error
            self._fallback(exc)

    @staticmethod
    def _fallback(exc: BaseException) -> None:
        print(
            f"slipstream: C fast path not built ({type(exc).__name__}: {exc}); installing the pure-Python path",
            file=sys.stderr,
        )


compile_args = WARNINGS + (SANITIZE if _flag("SLIPSTREAM_SANITIZE") else ["-O3"])
link_args = SANITIZE[:1] if _flag("SLIPSTREAM_SANITIZE") else []

setup(
    ext_modules=[
        Extension(
            "slipstream.logbuffer._fastpath",
            sources=["src/slipstream/logbuffer/_fastpath.c"],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
