#!/usr/bin/env bash
# Fetch-proxy replay speed vs a direct loopback fetch, one run, curl as client.
#   bench/proxy_replay.sh [BIG_MIB=1024] [SMALL_REQUESTS=200]
# Needs curl (apt-get install -y curl). Set PROFILE=release for a release build
# (default: the dev profile, whose dependencies are built at opt-level 2).
command -v curl >/dev/null || { echo "curl missing: apt-get install -y curl" >&2; exit 2; }
# It runs fetch-proxy's example, not fhsx: nothing to build here.
BENCH_BUILD=0
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
profile=()
[ "${PROFILE:-dev}" = release ] && profile=(--release)
cargo run -q "${profile[@]}" -p fetch-proxy --example proxy_bench -- "${1:-1024}" "${2:-200}"
