#!/usr/bin/env bash
# Remote builds over loopback, against their speed targets:
#  1. a `true` action: `fhsx build --remote` round trip vs a local `fhsx build`
#     (inputs already on the worker; aim ≤ 1.2×);
#  2. upload throughput of the hello toolchain (~all its .debs) to a fresh
#     worker vs `cp -r` of the same store objects between two local
#     directories (aim ≥ 0.9×; also against cp + sync, which is durable
#     when it ends, as the worker's store is only once it flushes). The
#     upload's time is the client's own (`upload_seconds`: from its first
#     question about the inputs to the worker's answer to the last
#     upload); also printed, cold remote build (uploads everything) − warm
#     remote build (uploads nothing), which adds the worker's first
#     composition of the toolchain and the sync of its durable commit —
#     a sync that writes the whole upload to disk;
#  3. an action whose output is 1,500 small files: remote vs local (the
#     download of many small blobs, `getBlobs`).
# Env: FHSX=/path/to/fhsx (default: build this tree in release), RUNS=30
# (round trips: remote and local interleaved, medians), ROUNDS=5 (upload
# rounds, each an upload and its two cp's; medians), FILES_RUNS=10 (3.).
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-30}
ROUNDS=${ROUNDS:-5}
DEBS=${FHSX_DEB_CACHE:-$PWD/target/tmp/bench-debs}
export TMPDIR=$WORK
WPID=
bench_cleanup() {
  if [ -n "$WPID" ]; then kill -TERM "$WPID" 2>/dev/null || true; wait "$WPID" 2>/dev/null || true; fi
}
now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", (b-a)/1e9}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
# start_worker STORE [tcp|unix [FLAGS…]] → sets ADDR, WPID (TCP carries TLS; unix: plain)
start_worker() {
  local store=$1 how=${2:-tcp}
  shift; shift || true
  if [ "$how" = unix ]; then
    "$F" --store "$store" worker --unix "$store.sock" "$@" > "$WORK/worker.out" 2> "$WORK/worker.err" &
  else
    "$F" --store "$store" worker --listen 127.0.0.1:0 "$@" > "$WORK/worker.out" 2> "$WORK/worker.err" &
  fi
  WPID=$!
  for _ in $(seq 1 200); do
    ADDR=$(sed -n 's/.*listening on \([^ ]*\) .*/\1/p' "$WORK/worker.out")
    [ -n "$ADDR" ] && return 0
    sleep 0.05
  done
  cat "$WORK/worker.err" >&2; echo "worker did not come up" >&2; exit 1
}
stop_worker() { kill -TERM "$WPID"; wait "$WPID" || true; WPID=; }

CS=$WORK/client
"$F" --store "$CS" toolchain apt busybox-static --deb-cache "$DEBS" -o "$WORK/bb.toolchain" 2>/dev/null
printf '[inputs]\nclosure = ["bb.toolchain"]\n[run]\ncommand = ["/bin/busybox", "mkdir", "/build/out"]\n' > "$WORK/true.toml"

start_worker "$WORK/w1"
"$F" --store "$CS" build --remote "$ADDR" "$WORK/true.toml" >/dev/null 2>&1   # upload once
"$F" --store "$CS" build "$WORK/true.toml" >/dev/null 2>&1                    # warm local
# RUNS remote builds at $ADDR and local ones, alternating, which goes first
# taking turns (a sandbox's teardown goes on in the kernel after it exits,
# and the next command pays); --rebuild: each one really runs, else the
# caches answer. Sets REMOTE and LOCAL (medians).
interleaved() {
  : >"$WORK/.remote"; : >"$WORK/.local"
  for k in $(seq 1 "$RUNS"); do
    if ((k % 2)); then
      ms "$F" --store "$CS" build --rebuild --remote "$ADDR" "$WORK/true.toml" >>"$WORK/.remote"
      ms "$F" --store "$CS" build --rebuild "$WORK/true.toml" >>"$WORK/.local"
    else
      ms "$F" --store "$CS" build --rebuild "$WORK/true.toml" >>"$WORK/.local"
      ms "$F" --store "$CS" build --rebuild --remote "$ADDR" "$WORK/true.toml" >>"$WORK/.remote"
    fi
  done
  REMOTE=$(median %.1f <"$WORK/.remote"); LOCAL=$(median %.1f <"$WORK/.local")
}
# As both come: the worker keeps emptied scratch file systems mounted
# between its builds (--scratch-pool, default --jobs), and `fhsx build`
# parks its own in $TMPDIR for the next one.
"$F" --store "$CS" build --rebuild --remote "$ADDR" "$WORK/true.toml" >/dev/null 2>&1   # park one
interleaved
recycled=$(sed -n 's/.*scratch pool: \([0-9]*\) builds on a recycled scratch.*/\1/p' "$WORK/worker.err" | tail -1)
stop_worker
echo "true round trip, medians of $RUNS interleaved runs: remote ${REMOTE} ms  local ${LOCAL} ms  ratio $(ratio "$REMOTE" "$LOCAL")x (aim <= 1.2; ${recycled:-0} of $((RUNS + 2)) remote builds on a recycled scratch)"

# Neither keeping a scratch: a loop device, mount and teardown each build.
start_worker "$WORK/w1" tcp --scratch-pool 0
export FHSX_SCRATCH_POOL=0
interleaved
unset FHSX_SCRATCH_POOL
stop_worker
echo "without scratch pools (--scratch-pool 0, FHSX_SCRATCH_POOL=0): remote ${REMOTE} ms  local ${LOCAL} ms  ratio $(ratio "$REMOTE" "$LOCAL")x"

# An output of many small files: each run a new action (its own salt, so
# no cache answers and every file is new to the client), remote and local
# interleaved. Remote adds the download of 1,500 blobs.
# Timed from a settled disk: the client's file creations waited ~0.4 ms
# each (against ~0.05) while earlier writes were still going out.
FILES_RUNS=${FILES_RUNS:-10}
sync
start_worker "$WORK/w1"
files_action() {
  # shellcheck disable=SC2016  # a literal shell command for the action
  printf '[inputs]\nclosure = ["bb.toolchain"]\n[run]\ncommand = ["/bin/busybox", "sh", "-c", "mkdir -p /build/out/d; cd /build/out/d; for i in $(/bin/busybox seq 1 1500); do echo $i-%s > f$i; done"]\n' "$1" > "$WORK/files.toml"
}
: >"$WORK/.remote"; : >"$WORK/.local"
for k in $(seq 1 "$FILES_RUNS"); do
  files_action "r$k-$RANDOM"
  ms "$F" --store "$CS" build --remote "$ADDR" "$WORK/files.toml" >>"$WORK/.remote"
  files_action "l$k-$RANDOM"
  ms "$F" --store "$CS" build "$WORK/files.toml" >>"$WORK/.local"
done
stop_worker
REMOTE=$(median %.1f <"$WORK/.remote"); LOCAL=$(median %.1f <"$WORK/.local")
echo "1,500-file output, medians of $FILES_RUNS interleaved runs: remote ${REMOTE} ms  local ${LOCAL} ms  ratio $(ratio "$REMOTE" "$LOCAL")x"

# Upload: the hello toolchain into a fresh worker store.
TS=$WORK/tc-client
"$F" --store "$TS" toolchain apt --essential gcc make libc6-dev --deb-cache "$DEBS" -o "$WORK/gcc.toolchain" 2>/dev/null
printf '[inputs]\ntoolchain = ["gcc.toolchain"]\n[run]\ncommand = ["/bin/mkdir", "/build/out"]\n' > "$WORK/tc.toml"
# Every timed copy below (each upload, each cp) reads the client store
# from the page cache: warm_client reads it just before. Read once at the
# start, it did not stay: these VMs page out page cache that DAMON sees
# touched at most once per 5 s for a minute (a `pageout` scheme on
# physical memory), so by the second round the upload, which comes first
# in a round, read part of the store from disk (`perf`: half of the
# client's waits were in `filemap_read`), while each cp right after it
# read what the upload had just brought back in.
warm_client() { find "$TS/blobs" "$TS/dirs" -type f -print0 | xargs -0 cat > /dev/null; }
# ROUNDS rounds (five by default), interleaved: an upload into a fresh worker store, a `cp -r`
# of the same objects, and the same `cp -r` followed by `sync -f`. The
# worker answers an upload once it is in the store, before it is durable,
# as plain cp leaves its copy in the page cache; it syncs once uploads
# pause (castore's `unsynced`), after the timed window, as cp's copy is
# synced by the `sync` after it. Medians: one round is noisy, cp's
# figure above all.
#
# Where each copy lands: as root, every timed copy (the worker's store,
# each cp's destination) gets a new ext4 of its own, journal-less like
# these machines' disks, loop-mounted before its timer starts. On a
# shared file system creating 8000 files costs what the file system's
# recent churn makes it (ext4 checks each new inode against recently
# deleted ones in its group: the same cp -r took 0.4-9.5 s there, the
# bench's own rm -rf between rounds included), so which copy went first
# decided the ratio. FRESH_FS=0 copies into $WORK instead (the default
# without root).
FRESH_FS=${FRESH_FS:-1}
[ "$(id -u)" = 0 ] || FRESH_FS=0
# dest DIR: an empty directory for one timed copy.
dest() {
  mkdir -p "$1"
  if [ "$FRESH_FS" = 1 ]; then
    truncate -s 8G "$1.img"
    mkfs.ext4 -q -F -O ^has_journal "$1.img"
    mount -o loop "$1.img" "$1"
  fi
}
# drop DIR: what dest made, gone.
drop() {
  if mountpoint -q "$1"; then umount "$1"; fi
  rm -rf "$1" "$1.img"
}
# wait_synced STORE: the worker syncs an upload once it pauses; let that
# end before the warm run, so the warm baseline does not carry it (which
# would shrink cold - warm and overstate the upload).
wait_synced() {
  for _ in $(seq 1 600); do
    compgen -G "$1/unsynced/log-*" >/dev/null || return 0
    sleep 0.1
  done
}
if [ "$FRESH_FS" = 1 ]; then where="each on a fresh loop-mounted ext4"; else where="into $WORK"; fi
cp_bytes=$(du -sb "$TS/blobs" | cut -f1)
: >"$WORK/.up"; : >"$WORK/.upb"; : >"$WORK/.cp"; : >"$WORK/.cps"; : >"$WORK/.pair"
for round in $(seq 1 "$ROUNDS"); do
  dest "$WORK/w2-$round"
  sync
  start_worker "$WORK/w2-$round/store"
  warm_client
  a=$(now); out=$("$F" --store "$TS" --json build --remote "$ADDR" "$WORK/tc.toml" 2>/dev/null); b=$(now)
  cold=$(secs "$a" "$b")
  wait_synced "$WORK/w2-$round/store"
  a=$(now); "$F" --store "$TS" --json build --rebuild --remote "$ADDR" "$WORK/tc.toml" >/dev/null 2>&1; b=$(now)
  warm=$(secs "$a" "$b")
  stop_worker
  drop "$WORK/w2-$round"
  read -r bytes up_secs nblobs ndirs < <(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin)["remote"]; u=r["uploaded"]; print(u["bytes"], r["upload_seconds"], u["blobs"], u["directories"])')
  files="$nblobs blobs, $ndirs directories"
  awk -v n="$bytes" -v s="$up_secs" 'BEGIN{printf "%.1f\n", n/s/1e6}' >>"$WORK/.up"
  awk -v n="$bytes" -v a="$cold" -v b="$warm" 'BEGIN{printf "%.1f\n", n/(a-b)/1e6}' >>"$WORK/.upb"
  dest "$WORK/cp-dest"
  sync
  warm_client
  a=$(now); cp -r "$TS/blobs" "$TS/dirs" "$WORK/cp-dest/"; b=$(now)
  awk -v n="$cp_bytes" -v s="$(secs "$a" "$b")" 'BEGIN{printf "%.1f\n", n/s/1e6}' >>"$WORK/.cp"
  # The same round's upload against its cp, a minute apart at most: the
  # VM's phase moves both alike.
  # shellcheck disable=SC2005  # ratio prints no newline
  echo "$(ratio "$(tail -n 1 "$WORK/.up")" "$(tail -n 1 "$WORK/.cp")")" >>"$WORK/.pair"
  drop "$WORK/cp-dest"
  dest "$WORK/cp-dest"
  sync
  warm_client
  a=$(now); cp -r "$TS/blobs" "$TS/dirs" "$WORK/cp-dest/"; sync -f "$WORK/cp-dest"; b=$(now)
  awk -v n="$cp_bytes" -v s="$(secs "$a" "$b")" 'BEGIN{printf "%.1f\n", n/s/1e6}' >>"$WORK/.cps"
  drop "$WORK/cp-dest"
done
up_mbs=$(median <"$WORK/.up"); upb_mbs=$(median <"$WORK/.upb"); cp_mbs=$(median <"$WORK/.cp"); cps_mbs=$(median <"$WORK/.cps")
echo "upload: $files, $bytes bytes, $where; medians of $ROUNDS rounds: upload ${up_mbs} MB/s, cp -r ${cp_mbs} MB/s, cp -r + sync ${cps_mbs} MB/s"
echo "upload/cp throughput ratio $(ratio "$up_mbs" "$cp_mbs")x (aim >= 0.9); upload/(cp + sync) $(ratio "$up_mbs" "$cps_mbs")x"
echo "upload/cp within each round: $(sort -n "$WORK/.pair" | tr '\n' ' ')(median $(median <"$WORK/.pair")x)"
echo "cold - warm remote build: ${upb_mbs} MB/s; /cp $(ratio "$upb_mbs" "$cp_mbs")x, /(cp + sync) $(ratio "$upb_mbs" "$cps_mbs")x (adds the first build's composition and the sync of the whole upload)"
upload=$(awk -v n="$bytes" -v r="$up_mbs" 'BEGIN{printf "%.3f", n/r/1e6}')

# The same upload over a UNIX socket (no TLS): what encryption costs.
dest "$WORK/w3"
sync
start_worker "$WORK/w3/store" unix
warm_client
uupload=$("$F" --store "$TS" --json build --remote "$ADDR" "$WORK/tc.toml" 2>/dev/null |
  python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["remote"]["upload_seconds"])')
stop_worker
drop "$WORK/w3"
echo "upload over a UNIX socket (no TLS): ${uupload}s; TCP+TLS/unix time ratio $(ratio "$upload" "$uupload")x"
