#!/usr/bin/env bash
# Installs the system packages the tests and the demo need, only when missing: nft and ip (netns +
# nftables test hosts), Java 17 (Spark, for the pipeline) and chromium (the report's browser check).
# Idempotent: when every command is present it prints one line and makes no apt call, so
# `make test` stays fast on a prepared machine. Arguments name the commands to ensure (default: all);
# `make demo` asks only for java.
set -euo pipefail

# command -> Debian package that provides it
declare -A PROVIDER=(
    [nft]=nftables
    [ip]=iproute2
    [java]=openjdk-17-jre-headless
    [chromium]=chromium
)

# Root's tools live in sbin, which a non-login PATH may lack.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

# Spark 4 needs Java 17 or newer: an older java on the PATH counts as missing.
java_ok() {
    command -v java >/dev/null 2>&1 || return 1
    local version
    version=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
    [ -n "$version" ] && [ "$version" -ge 17 ]
}

present() {
    if [ "$1" = java ]; then java_ok; else command -v "$1" >/dev/null 2>&1; fi
}

wanted=("$@")
if [ "${#wanted[@]}" -eq 0 ]; then
    wanted=("${!PROVIDER[@]}")
fi
missing=()
for cmd in "${wanted[@]}"; do
    if [ -z "${PROVIDER[$cmd]:-}" ]; then
        echo "ensure-system-deps: unknown command '$cmd' (known: ${!PROVIDER[*]})" >&2
        exit 2
    fi
    if ! present "$cmd"; then
        missing+=("${PROVIDER[$cmd]}")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "ensure-system-deps: nothing to do (${wanted[*]} present)"
    exit 0
fi

# Deduplicate and sort for a stable message.
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-system-deps: missing system packages: ${missing[*]}" >&2
    echo "ensure-system-deps: run as root (or: sudo apt-get install ${missing[*]})" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-system-deps: missing ${missing[*]} and apt-get is not available; install them by hand" >&2
    echo "ensure-system-deps: (Java 17+ for Spark: any OpenJDK 17 build; set JAVA_HOME if it is not on the PATH)" >&2
    exit 1
fi

echo "ensure-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    echo "ensure-system-deps: apt-get could not install ${missing[*]}" >&2
    case " ${missing[*]} " in
        *openjdk-17*) echo "ensure-system-deps: Java 17 is needed by Spark (the pipeline); on Debian 12 it is" \
            "openjdk-17-jre-headless; elsewhere install any OpenJDK 17+ and put java on the PATH" >&2 ;;
    esac
    exit 1
fi

# Only what was asked for: an entry nobody asked for may stay missing (`make demo` needs java, not nft).
for cmd in "${wanted[@]}"; do
    if ! present "$cmd"; then
        echo "ensure-system-deps: '$cmd' still missing after installing ${PROVIDER[$cmd]}" >&2
        exit 1
    fi
done
echo "ensure-system-deps: installed ${missing[*]}"
