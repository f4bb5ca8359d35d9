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
N=${1:-30}
if ! command -v nix-store >/dev/null; then
  echo "bench/peers.sh: installing Debian's nix-bin (for the Nix sandbox baseline)" >&2
  apt-get install -y -qq nix-bin >/dev/null
fi
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
export FHSX_STORE=$WORK/store TMPDIR=$WORK
"$F" toolchain apt busybox-static --deb-cache "${FHSX_DEB_CACHE:-$PWD/target/tmp/bench-debs}" -o "$WORK/bb.toolchain" 2>/dev/null
cat >"$WORK/t.toml" <<A
[inputs]
closure = ["bb.toolchain"]
[run]
command = ["/bin/busybox", "mkdir", "/build/out"]
A
"$F" build "$WORK/t.toml" >/dev/null 2>&1
atom=$(sed -n 's/^atom = "\(.*\)"/\1/p' "$WORK/bb.toolchain" | head -1)
"$F" store export "$atom" "$WORK/bb" >/dev/null

# Nix: the same static busybox in the Nix store, a derivation using it.
export NIX_CONFIG="sandbox = true
substituters =
experimental-features = nix-command"
mkdir -p "$WORK/nixbb/bin"
cp "$WORK/bb/bin/busybox" "$WORK/nixbb/bin/busybox"
bbpath=$(nix-store --add "$WORK/nixbb")
cat >"$WORK/t.nix" <<N
derivation {
  name = "fhsx-peer-trivial";
  system = builtins.currentSystem;
  builder = "\${builtins.storePath $bbpath}/bin/busybox";
  args = [ "mkdir" (builtins.placeholder "out") ];
}
N
drv=$(nix-instantiate "$WORK/t.nix" 2>/dev/null)
nix-store --realise "$drv" >/dev/null 2>&1
nix-store --realise --check "$drv" >/dev/null 2>&1 || { echo "nix-store --check failed: is the Nix sandbox usable here?" >&2; nix-store --realise --check "$drv"; exit 1; }

# The floor: fhsx's own bwrap flags, minus what only fhsx adds
# (bench/run_argv.sh).
# shellcheck source=bench/run_argv.sh
. bench/run_argv.sh
split_run_argv "$F" "$WORK" || exit 1
(cd "$WORK" && "${bare[@]}") || { echo "the bare bwrap command failed" >&2; exit 1; }

# Interleaved, the order rotated every round: a sandbox's teardown goes on
# in the kernel after its process has exited (the network namespace is
# freed by a kernel worker), and is paid by whatever runs next, so each of
# the four follows each of the others equally often.
run_one() {
  case $1 in
    b) (cd "$WORK" && "${bare[@]}") ;;
    f) "$F" build --rebuild "$WORK/t.toml" ;;
    n) nix-store --realise --check "$drv" ;;
    m) "$F" build --rebuild --scratch memory --opens daemon "$WORK/t.toml" ;;
  esac >/dev/null 2>&1
}
order=(b f n m)
: >"$WORK/.f"; : >"$WORK/.m"; : >"$WORK/.n"; : >"$WORK/.b"
for ((k = 0; k < N; k++)); do
  for ((i = 0; i < 4; i++)); do
    c=${order[$(((i + k) % 4))]}
    ms run_one "$c" >>"$WORK/.$c"
  done
done
b=$(median %.1f <"$WORK/.b"); f=$(median %.1f <"$WORK/.f"); m=$(median %.1f <"$WORK/.m"); n=$(median %.1f <"$WORK/.n")
echo "trivial action, medians of $N interleaved runs (order rotated): bare bwrap ${b} ms, fhsx build ${f} ms, fhsx build --scratch memory --opens daemon ${m} ms, Nix sandbox ${n} ms"
awk -v f="$f" -v b="$b" -v n="$n" 'BEGIN { printf "defaults:                       fhsx/bwrap %.2fx (aim <= 2)   fhsx/nix %.2fx (aim ~0.5)\n", f/b, f/n }'
awk -v f="$m" -v b="$b" -v n="$n" 'BEGIN { printf "--scratch memory --opens daemon: fhsx/bwrap %.2fx (aim <= 2)   fhsx/nix %.2fx (aim ~0.5)\n", f/b, f/n }'
