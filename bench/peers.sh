#!/usr/bin/env bash
# fhsx's per-action cost beside its peers, interleaved in one run (N runs
# each, medians): the same trivial action, one exec of a static busybox
# making its output directory (`busybox mkdir $out`),
#   - in fhsx: `fhsx build --rebuild`,
#     as it comes (disk scratch, opens without a message) and as a small
#     action is best run (`--scratch memory --opens daemon`);
#   - in Nix's sandbox: `nix-store --realise --check` of a derivation doing
#     the same with the same static busybox, single-user as root, sandbox
#     on, substituters off (Debian's nix-bin; this script installs it);
#   - in bare bwrap with fhsx's own flags (`fhsx run --print-argv`, without
#     what only fhsx adds: supervisor, RPC socket, seccomp) running true:
#     the floor, the kernel work any sandbox must do.
# Prints the medians and the ratios fhsx/bwrap and fhsx/nix for each.
# Usage: bench/peers.sh [N=30]   (as root: installs nix-bin with apt)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-30}
if ! command -v nix-store >/dev/null; then
  echo "bench/peers.sh: installing Debian's nix-bin (for the Nix sandbox baseline)" >&2
  apt-get install -y -qq nix-bin >/dev/null
fi
cargo build --release -q -p fhsx
F=$PWD/target/release/fhsx
work=$(mktemp -d "${BENCH_DIR:-$PWD/target}/bench-peers.XXXXXX")
chmod o+x "$work"
. bench/unmount.sh
trap 'unmount_under "$work"; rm -rf "$work"' EXIT
export FHSX_STORE=$work/store TMPDIR=$work
"$F" toolchain apt busybox-static --deb-cache "${FHSX_DEB_CACHE:-$PWD/target/tmp/bench-debs}" -o "$work/bb.toolchain" 2>/dev/null
cat >"$work/t.toml" <<A
[inputs]
closure = ["bb.toolchain"]
[run]
command = ["/bin/busybox", "mkdir", "/build/out"]
A
"$F" build "$work/t.toml" >/dev/null 2>&1
atom=$(sed -n 's/^atom = "\(.*\)"/\1/p' "$work/bb.toolchain" | head -1)
"$F" store export "$atom" "$work/bb" >/dev/null

# Nix: the same static busybox in the Nix store, a derivation using it.
export NIX_CONFIG="sandbox = true
substituters =
experimental-features = nix-command"
mkdir -p "$work/nixbb/bin"
cp "$work/bb/bin/busybox" "$work/nixbb/bin/busybox"
bbpath=$(nix-store --add "$work/nixbb")
cat >"$work/t.nix" <<N
derivation {
  name = "fhsx-peer-trivial";
  system = builtins.currentSystem;
  builder = "\${builtins.storePath $bbpath}/bin/busybox";
  args = [ "mkdir" (builtins.placeholder "out") ];
}
N
drv=$(nix-instantiate "$work/t.nix" 2>/dev/null)
nix-store --realise "$drv" >/dev/null 2>&1
nix-store --realise --check "$drv" >/dev/null 2>&1 || { echo "nix-store --check failed: is the Nix sandbox usable here?" >&2; nix-store --realise --check "$drv"; exit 1; }

# The floor: fhsx's own bwrap flags, minus what only fhsx adds
# (bench/run_argv.sh).
. bench/run_argv.sh
split_run_argv "$F" "$work" || exit 1
(cd "$work" && "${bare[@]}") || { echo "the bare bwrap command failed" >&2; exit 1; }

# Interleaved, the order rotated every round: a sandbox's teardown goes on
# in the kernel after its process has exited (the network namespace is
# freed by a kernel worker), and is paid by whatever runs next, so each of
# the four follows each of the others equally often.
run_one() {
  case $1 in
    b) (cd "$work" && "${bare[@]}") ;;
    f) "$F" build --rebuild "$work/t.toml" ;;
    n) nix-store --realise --check "$drv" ;;
    m) "$F" build --rebuild --scratch memory --opens daemon "$work/t.toml" ;;
  esac >/dev/null 2>&1
}
order=(b f n m)
: >"$work/.f"; : >"$work/.m"; : >"$work/.n"; : >"$work/.b"
for ((k = 0; k < N; k++)); do
  for ((i = 0; i < 4; i++)); do
    c=${order[$(((i + k) % 4))]}
    t0=${EPOCHREALTIME/./}; run_one "$c"; t1=${EPOCHREALTIME/./}
    echo $((t1 - t0)) >>"$work/.$c"
  done
done
med() { sort -n "$1" | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]/1000}'; }
b=$(med "$work/.b"); f=$(med "$work/.f"); m=$(med "$work/.m"); n=$(med "$work/.n")
echo "trivial action, medians of $N interleaved runs (order rotated): bare bwrap ${b} ms, fhsx build ${f} ms, fhsx build --scratch memory --opens daemon ${m} ms, Nix sandbox ${n} ms"
awk -v f="$f" -v b="$b" -v n="$n" 'BEGIN { printf "defaults:                       fhsx/bwrap %.2fx (aim <= 2)   fhsx/nix %.2fx (aim ~0.5)\n", f/b, f/n }'
awk -v f="$m" -v b="$b" -v n="$n" 'BEGIN { printf "--scratch memory --opens daemon: fhsx/bwrap %.2fx (aim <= 2)   fhsx/nix %.2fx (aim ~0.5)\n", f/b, f/n }'
