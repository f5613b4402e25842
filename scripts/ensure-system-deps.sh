#!/usr/bin/env bash
# Installs the system packages the tests need (netns + nftables test hosts), only when missing.
# Idempotent: when every command is present it prints one line and makes no apt call, so
# `make test` stays fast on a prepared machine. Java is not needed (yet).
set -euo pipefail

# command -> Debian package that provides it
declare -A PROVIDER=(
    [nft]=nftables
    [ip]=iproute2
)

# Root's tools live in sbin, which a non-login PATH may lack.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

missing=()
for cmd in "${!PROVIDER[@]}"; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
        missing+=("${PROVIDER[$cmd]}")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "ensure-system-deps: nothing to do (nft and ip present)"
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
    exit 1
fi

echo "ensure-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

for cmd in "${!PROVIDER[@]}"; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
        echo "ensure-system-deps: '$cmd' still missing after installing ${PROVIDER[$cmd]}" >&2
        exit 1
    fi
done
echo "ensure-system-deps: installed ${missing[*]}"
