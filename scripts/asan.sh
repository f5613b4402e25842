#!/usr/bin/env bash
# Build the C fast path with AddressSanitizer + UBSan in a scratch copy of the tree and run the
# differential and fuzz tests against it. The normal in-place build is never touched: the sanitized
# build lives only in the scratch directory (removed on exit), and the run checks that it is the one
# imported. `make test` runs this after the main suite; it takes about 1.5 minutes on 2 cores and is cut
# off after ASAN_TIMEOUT seconds (default 600).
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
find "$scratch" -name '__pycache__' -type d -prune -exec rm -rf {} +
(cd "$scratch" && SLIPSTREAM_SANITIZE=1 SLIPSTREAM_REQUIRE_EXTENSIONS=1 "$py" setup.py -q build_ext --inplace)
ls "$scratch"/src/slipstream/logbuffer/_fastpath*.so "$scratch"/src/slipstream/network/_records*.so >/dev/null  # the sanitized builds must exist
libasan="$(${CC:-gcc} -print-file-name=libasan.so)"
libubsan="$(${CC:-gcc} -print-file-name=libubsan.so)"
cd "$scratch"
export LD_PRELOAD="$libasan $libubsan" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 PYTHONPATH=src SLIPSTREAM_REQUIRE_EXTENSIONS=1
# The module imported must be the scratch build, not the in-place one an editable install points at.
for module in slipstream.logbuffer._fastpath slipstream.network._records; do
    loaded="$("$py" -c "import $module as m; print(m.__file__)")"
    case "$loaded" in
        "$scratch"/*) ;;
        *) echo "asan.sh: imported $loaded, not the sanitized build in $scratch" >&2; exit 1 ;;
    esac
done
timeout "${ASAN_TIMEOUT:-600}" "$py" -m pytest -q -p no:cacheprovider tests/test_fastpath.py tests/test_fastpath_datagrams.py \
    tests/test_fastpath_udp.py tests/test_logbuffer.py tests/test_ipc.py tests/test_sender.py tests/test_receiver.py \
    tests/test_network_records_c.py tests/test_network_session.py tests/test_doorbell.py
