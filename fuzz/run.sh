#!/usr/bin/env bash
# Run every fuzz target for a bounded time with libFuzzer (needs a nightly
# toolchain and `cargo install cargo-fuzz`).
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
# Default 60 s each. Crashes land in fuzz/artifacts/<target>/; copy them into
# fuzz/regressions/<target>/ so `cargo test` in fuzz/ replays them.
# Without nightly: `cd fuzz && cargo test --release` runs the same
# properties over random and mutated inputs (FUZZ_ITERS=N per target).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(directory_decode archive_import action_parse lock_parse url_normalise rpc_frame ingest_tree)
fi
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz/run.sh: no nightly toolchain (rustup toolchain install nightly); run \`cd fuzz && cargo test --release\` instead" >&2
  exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: cargo-fuzz is missing: cargo install cargo-fuzz" >&2
  exit 2
fi
status=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  if [ -d "fuzz/regressions/$t" ]; then cp -n fuzz/regressions/"$t"/* "fuzz/corpus/$t/" 2>/dev/null || true; fi
  echo "== $t (${secs}s)"
  mkdir -p fuzz/artifacts
  log="fuzz/artifacts/$t.log"
  if cargo +nightly fuzz run -O --fuzz-dir fuzz --features libfuzzer "$t" -- \
      -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=20 >"$log" 2>&1; then
    grep -E '^Done [0-9]+ runs' "$log" | tail -1
  else
    echo "!! $t failed: see $log and fuzz/artifacts/$t/" >&2
    tail -40 "$log" >&2
    status=1
  fi
done
exit $status
