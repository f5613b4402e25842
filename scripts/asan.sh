#!/usr/bin/env bash
# Build the C fast path with AddressSanitizer + UBSan in a scratch copy of the tree and run the
# differential and fuzz tests against it (the normal in-place build is left alone).
# Usage: scripts/asan.sh [python]   (default: .venv/bin/python, else python3)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${1:-$here/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # the script changes directory: a relative path would break
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp -r "$here/src" "$here/tests" "$here/setup.py" "$here/pyproject.toml" "$here/README.md" "$scratch/"
find "$scratch/src" -name '*.so' -delete
(cd "$scratch" && SLIPSTREAM_SANITIZE=1 "$py" setup.py -q build_ext --inplace)
ls "$scratch"/src/slipstream/logbuffer/_fastpath*.so >/dev/null  # the sanitized build must exist
libasan="$(${CC:-gcc} -print-file-name=libasan.so)"
libubsan="$(${CC:-gcc} -print-file-name=libubsan.so)"
cd "$scratch"
LD_PRELOAD="$libasan $libubsan" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    PYTHONPATH=src SLIPSTREAM_REQUIRE_EXTENSIONS=1 \
    "$py" -m pytest -q -p no:cacheprovider tests/test_fastpath.py tests/test_fastpath_datagrams.py tests/test_fastpath_udp.py tests/test_logbuffer.py \
    tests/test_ipc.py tests/test_sender.py tests/test_receiver.py
