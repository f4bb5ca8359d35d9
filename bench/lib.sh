# The preamble every bench sources: `. "$(dirname "$0")/lib.sh"` as its
# first command. Source it; do not run it. It
#  - sets `-euo pipefail` and goes to the repository root;
#  - builds this tree's fhsx in release (`cargo build --release -q -p
#    fhsx`) and sets F to it; FHSX=/path/to/fhsx uses that binary instead,
#    and BENCH_BUILD=0 builds nothing (a bench that runs no fhsx);
#  - makes the work directory WORK, `bench-NAME.XXXXXX` under
#    ${BENCH_DIR:-$PWD/target} (NAME is the script's), passable by other
#    users (as root builds run as build users, which must pass through a
#    $TMPDIR set to it);
#  - sources bench/unmount.sh and installs an EXIT trap that runs the
#    bench's own `bench_cleanup` if it defines one (to stop what it
#    started), unmounts everything below WORK and removes it;
#    BENCH_KEEP=1 keeps it (and says where);
#  - defines `ms` and `median` (below).
# shellcheck shell=bash
# F, WORK and the helpers are for the bench that sources this.
# shellcheck disable=SC2034

set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BENCH_NAME=$(basename "$0" .sh)
if [ -n "${FHSX:-}" ]; then
  F=$FHSX
elif [ "${BENCH_BUILD:-1}" != 0 ]; then
  cargo build --release -q -p fhsx
  F=${CARGO_TARGET_DIR:-$PWD/target}/release/fhsx
else
  F=
fi

mkdir -p "${BENCH_DIR:-$PWD/target}"
WORK=$(realpath "$(mktemp -d "${BENCH_DIR:-$PWD/target}/bench-$BENCH_NAME.XXXXXX")")
chmod o+x "$WORK"

# shellcheck source=bench/unmount.sh
. bench/unmount.sh
bench_exit() {
  if declare -F bench_cleanup >/dev/null; then bench_cleanup || true; fi
  if [ -n "${BENCH_KEEP:-}" ]; then
    echo "kept $WORK" >&2
    return 0
  fi
  unmount_under "$WORK" || true
  # Fast-tier trees and kept scratch leave read-only directories.
  chmod -R u+w "$WORK" 2>/dev/null || true
  rm -rf "$WORK" || true
}
trap bench_exit EXIT

# ms CMD…: run CMD once, its output discarded, and print how long it took
# in milliseconds to the microsecond ("12.345"); returns CMD's status, so
# under `set -e` a failing CMD ends the bench as it would unwrapped.
ms() {
  local a b rc=0
  a=${EPOCHREALTIME/./}
  "$@" >/dev/null 2>&1 || rc=$?
  b=${EPOCHREALTIME/./}
  b=$((b - a))
  printf '%d.%03d\n' $((b / 1000)) $((b % 1000))
  return "$rc"
}

# median [FORMAT]: the median of the numbers on stdin, one a line (the
# lower of the two middle ones for an even count), printed with printf's
# FORMAT (default: as read).
# shellcheck disable=SC2120
median() {
  sort -n | awk -v f="${1:-%s}" '{a[NR]=$1} END {printf f "\n", a[int((NR+1)/2)]}'
}

# tiny_action DIR FILE CLOSURE DEPS SCRIPT: a busybox action file DIR/FILE
# whose closure is CLOSURE (a TOML string) then DEPS (", …" references).
tiny_action() {
  printf '[inputs]\nclosure = [%s%s]\n[run]\ncommand = ["/bin/busybox", "sh", "-c", "%s"]\n' "$3" "$4" "$5" >"$1/$2"
}

# join_graph DIR CLOSURE WIDTH…: a tree of tiny actions, WIDTH children
# at each level from the root down: leaves (`lID.toml`) write their name,
# each join (`mID`, then `uID` above it) cats what it depends on, and
# DIR/root.toml cats the top level into `$out/all`. IDs are the path of
# indices, `-` between (`l5-5-5.toml`). `join_graph D C 20 20`: 421 actions.
join_graph() {
  local dir=$1 closure=$2
  shift 2
  _jw=("$@")
  _jl=(u m l)
  _jl=("${_jl[@]:$((3 - $#))}")
  _join_node "$dir" "$closure" 0 ""
}

_join_node() { # DIR CLOSURE DEPTH ID: writes the node (and below it)
  local dir=$1 closure=$2 depth=$3 id=$4 i cid deps= child
  if ((depth == ${#_jw[@]})); then
    tiny_action "$dir" "l$id.toml" "$closure" "" "mkdir -p \$out/l; echo l$id > \$out/l/$id"
    return
  fi
  child=${_jl[$depth]}
  for i in $(seq 1 "${_jw[$depth]}"); do
    cid=${id:+$id-}$i
    _join_node "$dir" "$closure" $((depth + 1)) "$cid"
    deps="$deps, \"$child$cid.toml#out\""
  done
  if ((depth == 0)); then
    tiny_action "$dir" root.toml "$closure" "$deps" "mkdir -p \$out; cat /$child/* > \$out/all"
  else
    tiny_action "$dir" "${_jl[$((depth - 1))]}$id.toml" "$closure" "$deps" "mkdir -p \$out/${_jl[$((depth - 1))]}; cat /$child/* > \$out/${_jl[$((depth - 1))]}/$id"
  fi
}
