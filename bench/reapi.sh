#!/usr/bin/env bash
# fhsx as an REAPI worker under BuildGrid (PostgreSQL and the engine on
# loopback, as the tests run them), each figure against a baseline measured
# in this same run:
#  1. a trivial action (`/bin/sh -c 'echo K'`, a new K each time so no cache
#     answers) sent with `bgd execute`, per action: on an fhsx worker vs on
#     a plain bot (below: it takes the lease and only execs the command on
#     the host) — the fhsx worker's added time and the ratio; and vs the
#     same action with `fhsx build` locally (no engine);
#  2. bytes through the engine's CAS: the client's upload of an input tree
#     (`bgd cas upload-dir`), the worker's fetch of it into its store (the
#     ActionResult's input-fetch timestamps), the worker's upload of an
#     output tree of the same size (its output-upload timestamps) and the
#     client's download of it (`bgd cas download-dir`), each vs `cp -r` of
#     the same bytes;
#  3. a sysroot as the input root (SYSROOT MiB in ~10,000 files, an FHS
#     shape: shared objects, headers, symlinks): its first action (the
#     conversion), then N rounds of one trivial action on it and one on a
#     one-file input root, the order alternating (bench/reapi_sysroot.py,
#     one connection, `Execute` with a new command each time; each root is
#     the action's `/`, running its own static busybox): the second
#     and later actions on the sysroot against the one-file root, by the
#     client's wall time and the worker's spans (execution_metadata). The
#     aim: the sysroot's later actions within +50 ms of the one-file one.
#     Then three actions asking for the whole sysroot back (as BuildStream's
#     integration commands do), which make all of it writable.
# Usage: bench/reapi.sh [N=10] [MiB=64] [SYSROOT=400]
#   (needs .ci/setup's /opt/fhsx-ci and root; REAPI_ONLY=sysroot runs 3 alone)
N=${1:-10}
MIB=${2:-64}
SYSROOT_MIB=${3:-400}
ONLY=${REAPI_ONLY:-}
BG=${FHSX_BUILDGRID:-/opt/fhsx-ci/buildgrid}
[ -x "$BG/bin/bgd" ] || { echo "no BuildGrid at $BG: run .ci/setup" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root (PostgreSQL runs as its own user)" >&2; exit 2; }
# In /tmp, which PostgreSQL (its own user) can reach; BENCH_KEEP=1 keeps it.
BENCH_DIR=/tmp
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
chmod 755 "$WORK"
pids=()
bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$WORK/pg/data" -m immediate stop >/dev/null 2>&1 || true
}
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# PostgreSQL and BuildGrid.
mkdir -p "$WORK/pg" && chown postgres "$WORK/pg"
runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D "$WORK/pg/data" -A trust -U bgd --no-sync >/dev/null
PGP=$(port)
runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$WORK/pg/data" -l "$WORK/pg/log" -w start \
  -o "-c listen_addresses=127.0.0.1 -p $PGP -k $WORK/pg -c fsync=off -c synchronous_commit=off" >/dev/null
DB=postgresql+psycopg2://bgd@127.0.0.1:$PGP/postgres
"$BG/bin/bgd" migrate apply "$DB" >/dev/null
P=$(port)
cat >"$WORK/bgd.yml" <<EOF
server:
  - !channel
    address: "127.0.0.1:$P"
    insecure-mode: true
authorization:
  method: none
connections:
  - !sql-connection &sql
    connection-string: $DB
storages:
  - !lru-storage &cas
    size: 4096MB
caches:
  - !lru-action-cache &ac
    storage: *cas
    max-cached-refs: 10000
    allow-updates: true
    cache-failed-actions: true
schedulers:
  - !sql-scheduler &scheduler
    sql: *sql
    action-cache: *ac
    storage: *cas
    property-set: !dynamic-property-set
      match-property-keys: [fhsx-toolchain, fhsx-root]
      wildcard-property-keys: []
instances:
  - name: ''
    services:
      - !action-cache
        cache: *ac
      - !execution
        scheduler: *scheduler
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
EOF
"$BG/bin/bgd" server start "$WORK/bgd.yml" >"$WORK/bgd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$P") 2>/dev/null && break; sleep 0.1; done
URL=http://127.0.0.1:$P

export FHSX_STORE=$WORK/store
"$F" toolchain apt --essential coreutils -o "$WORK/base.toolchain" 2>/dev/null
TC=$("$F" toolchain id "$WORK/base.toolchain")
mkdir -p "$WORK/empty"
# Per action: N sequential `bgd execute`s of new trivial actions; the
# milliseconds each took on average.
executes() { # tag
  local k
  for ((k = 0; k < N; k++)); do
    "$BG/bin/bgd" execute --remote "$URL" command -p fhsx-toolchain "$TC" "$WORK/empty" -- /bin/sh -c "echo $1-$k-$RANDOM"
  done
}
per_action() { # tag
  local t
  t=$(ms executes "$1" || true)
  awk -v t="$t" -v n="$N" 'BEGIN { printf "%d\n", t / n }'
}

# 3. A sysroot input root (the fhsx worker attached): made, then driven by
# bench/reapi_sysroot.py; prints its lines.
sysroot_section() {
  python3 - "$WORK/sysroot" "$SYSROOT_MIB" <<'PY'
import os, sys
root, mib = sys.argv[1], int(sys.argv[2])
# Three quarters in 120 shared objects (each with its .so link), the rest
# in ~9,880 headers of 1-20 KiB over ~400 directories, a few tools.
lib = f"{root}/usr/lib/x86_64-linux-gnu"
os.makedirs(lib)
big = (mib << 20) * 3 // 4 // 120
for i in range(120):
    with open(f"{lib}/lib{i}.so.1", "wb") as f: f.write(os.urandom(big))
    os.symlink(f"lib{i}.so.1", f"{lib}/lib{i}.so")
left, i = (mib << 20) - 120 * big, 0
while left > 0:
    d = f"{root}/usr/include/p{i % 400}/sub{i % 7}"
    os.makedirs(d, exist_ok=True)
    n = min(left, 1024 + (i * 7919) % (19 << 10))
    with open(f"{d}/h{i}.h", "wb") as f: f.write(os.urandom(n))
    left -= n; i += 1
os.makedirs(f"{root}/usr/bin")
for t in range(16):
    with open(f"{root}/usr/bin/tool{t}", "wb") as f: f.write(os.urandom(4096))
    os.chmod(f"{root}/usr/bin/tool{t}", 0o755)
os.symlink("usr/bin", f"{root}/bin")
os.symlink("usr/lib", f"{root}/lib")
PY
  # Each root runs its own static busybox (Debian's busybox-static): the
  # one-file root is that file alone.
  "$F" toolchain apt busybox-static -o "$WORK/busybox.toolchain" 2>/dev/null
  "$F" store export "$(sed -n 's/^atom = "\(.*\)"$/\1/p' "$WORK/busybox.toolchain")" "$WORK/busybox" >/dev/null
  cp "$WORK/busybox/bin/busybox" "$WORK/sysroot/usr/bin/busybox"
  mkdir -p "$WORK/onefile/usr/bin" && cp "$WORK/busybox/bin/busybox" "$WORK/onefile/usr/bin/"
  local files
  files=$(find "$WORK/sysroot" -type f | wc -l)
  "$BG/bin/python" bench/reapi_sysroot.py "127.0.0.1:$P" "$WORK/sysroot" "$WORK/onefile" "$N" >"$WORK/sysroot.json"
  python3 - "$WORK/sysroot.json" "$(du -sm "$WORK/sysroot" | cut -f1)" "$files" "$N" "$WORK/worker.log" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
mib, files, n = sys.argv[2], sys.argv[3], sys.argv[4]
runs = r["runs"]
def med(xs):
    xs = sorted(xs); return xs[(len(xs) - 1) // 2]
again = {root: [x for x in runs["again"] if x["root"] == root] for root in ("sysroot", "one-file")}
keys = ["wall", "worker", "fetch", "exec", "upload"]
m = {root: {k: med([x[k] for x in xs]) for k in keys} for root, xs in again.items()}
f = runs["first"]
print(f"sysroot input root: {mib} MiB, {files} files; {n} rounds (ms, medians; worker = input fetch start to output upload end):")
print(f"  first action on it   wall {f['wall']:.0f}   worker {f['worker']:.0f}   fetch {f['fetch']:.0f}   exec {f['exec']:.0f}   upload {f['upload']:.0f}")
for root in ("sysroot", "one-file"):
    x = m[root]
    print(f"  again, {root:9}     wall {x['wall']:.0f}   worker {x['worker']:.0f}   fetch {x['fetch']:.0f}   exec {x['exec']:.0f}   upload {x['upload']:.0f}")
d = {k: m["sysroot"][k] - m["one-file"][k] for k in keys}
print(f"  sysroot - one-file   wall {d['wall']:+.0f}   worker {d['worker']:+.0f}   fetch {d['fetch']:+.0f}   exec {d['exec']:+.0f}   upload {d['upload']:+.0f}")
w = {k: med([x[k] for x in runs["whole"]]) for k in keys}
print(f"  sysroot, whole root asked back ({len(runs['whole'])} runs)   wall {w['wall']:.0f}   worker {w['worker']:.0f}   fetch {w['fetch']:.0f}   exec {w['exec']:.0f}   upload {w['upload']:.0f}")
# Where the execution's time went, stage by stage (the worker runs under
# FHSX_TIMINGS): the last N actions on each root, medians.
import re
roots, root_of, stages = {v: k for k, v in r["roots"].items()}, {}, {}
for line in open(sys.argv[5], errors="replace"):
    m1 = re.search(r"lease (\S+): input root (\S+): fetched", line)
    if m1 and m1.group(2) in roots:
        root_of[m1.group(1)] = roots[m1.group(2)]
    m2 = re.search(r"lease (\S+): timings: (.*)", line)
    if m2 and m2.group(1) in root_of:
        st = dict((k, float(v)) for k, v in re.findall(r"([a-z_ ]+?) ([0-9.]+) ms", m2.group(2)))
        stages.setdefault(root_of[m2.group(1)], []).append({k.strip(): v for k, v in st.items()})
whole = len(runs["whole"])
for root in ("sysroot", "one-file"):
    # The sysroot's last leases are the whole-root ones: left out here.
    runs_ = stages.get(root, [])
    runs_ = (runs_[:-whole] if root == "sysroot" and whole else runs_)[-int(n):]
    if runs_:
        names = list(runs_[-1])
        print(f"  stages, {root:9}   " + ", ".join(f"{k} {med([x.get(k, 0) for x in runs_]):.1f}" for k in names))
PY
}

# 1a. On an fhsx worker.
TMPDIR=$WORK FHSX_TIMINGS=1 "$F" worker --reapi "grpc://127.0.0.1:$P" --toolchain "$WORK/base.toolchain" --jobs 1 --bot-id bench >"$WORK/worker.out" 2>"$WORK/worker.log" &
wpid=$!; pids+=("$wpid")
for _ in $(seq 100); do grep -q attached "$WORK/worker.out" 2>/dev/null && break; sleep 0.1; done
if [ "$ONLY" = sysroot ]; then
  sysroot_section
  kill "$wpid"; wait "$wpid" 2>/dev/null || true
  exit 0
fi
per_action warm >/dev/null   # the first action composes nothing new, but warms the page cache
fhsx_ms=$(per_action fhsx)

# 2. Bytes through the CAS (the fhsx worker still attached).
python3 - "$WORK/tree" "$MIB" <<'PY'
import os, sys
root, mib = sys.argv[1], int(sys.argv[2])
os.makedirs(root)
big = mib * 3 // 4          # three quarters in 4 MiB files, the rest in 4 KiB ones
for i in range(big // 4):
    with open(f"{root}/big{i}", "wb") as f: f.write(os.urandom(4 << 20))
small = (mib - big) * 256
for i in range(small):
    d = f"{root}/d{i % 64}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/s{i}", "wb") as f: f.write(os.urandom(4096))
PY
bytes=$(du -sb "$WORK/tree" | cut -f1)
sync
copy_tree() { cp -r "$WORK/tree" "$WORK/tree-cp" && sync; }
upload_tree() { "$BG/bin/bgd" cas --remote "$URL" upload-dir "$WORK/tree" >"$WORK/up.out" 2>&1; }
download_tree() { "$BG/bin/bgd" cas --remote "$URL" download-dir "$root_digest" "$WORK/down" >"$WORK/down.out" 2>&1; }
cp_ms=$(ms copy_tree); rm -rf "$WORK/tree-cp"
up_ms=$(ms upload_tree)
# The worker fetches the tree as an input root, then makes an output tree of the same size.
# Fresh bytes (else the engine would have them all already), the same shape.
gen="mkdir -p copy/s && head -c $((MIB * 3 / 4 << 20)) /dev/urandom | split -b 4194304 - copy/big && head -c $(((MIB - MIB * 3 / 4) << 20)) /dev/urandom | split -a 4 -b 4096 - copy/s/"
"$BG/bin/bgd" execute --remote "$URL" command -c -p fhsx-toolchain "$TC" --output-file copy "$WORK/tree" -- /bin/sh -c "$gen" >"$WORK/ex.out" 2>&1
action=$(python3 - "$WORK/ex.out" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
m = re.search(r'Sent action=\[hash: "([0-9a-f]+)"\s+size_bytes: (\d+)', s)
print(f"{m.group(1)}/{m.group(2)}")
PY
)
"$BG/bin/bgd" actioncache --remote "$URL" get --json "$action" >"$WORK/ar.json" 2>/dev/null
read -r fetch_ms upload_ms root_digest < <(python3 - "$WORK/ar.json" <<'PY'
import json, sys
from datetime import datetime
s = open(sys.argv[1]).read()
r = json.loads(s[s.index("{"):])
m = r["executionMetadata"]
t = lambda k: datetime.fromisoformat(m[k].replace("Z", "+00:00")).timestamp()
d = r["outputDirectories"][0]["rootDirectoryDigest"]
print(int((t("inputFetchCompletedTimestamp") - t("inputFetchStartTimestamp")) * 1000),
      int((t("outputUploadCompletedTimestamp") - t("outputUploadStartTimestamp")) * 1000),
      f'{d["hash"]}/{d["sizeBytes"]}')
PY
)
down_ms=$(ms download_tree)
sysroot_out=$(sysroot_section)
kill "$wpid"; wait "$wpid" 2>/dev/null || true

# 1b. The same on a plain bot: take the lease, exec the command, return its
# exit code and stdout. No inputs, no sandbox, no record.
cat >"$WORK/plain_bot.py" <<'PY'
import hashlib, subprocess, sys, grpc
from buildgrid._protos.google.devtools.remoteworkers.v1test2 import bots_pb2 as b, bots_pb2_grpc as bg, worker_pb2 as w
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re, remote_execution_pb2_grpc as rg
ch = grpc.insecure_channel(sys.argv[1]); bots = bg.BotsStub(ch); cas = rg.ContentAddressableStorageStub(ch)
def put(data):
    d = re.Digest(hash=hashlib.sha256(data).hexdigest(), size_bytes=len(data))
    cas.BatchUpdateBlobs(re.BatchUpdateBlobsRequest(requests=[re.BatchUpdateBlobsRequest.Request(digest=d, data=data)]))
    return d
dev = w.Device(handle="plain", properties=[w.Device.Property(key="fhsx-toolchain", value=sys.argv[2])])
s = bots.CreateBotSession(b.CreateBotSessionRequest(bot_session=b.BotSession(bot_id="plain", status=1, worker=w.Worker(devices=[dev]))), timeout=30)
print("attached", flush=True)
while True:
    for l in s.leases:
        if l.state == b.LeaseState.ACTIVE:
            a = re.Action(); l.payload.Unpack(a)
            c = re.Command(); c.ParseFromString(cas.BatchReadBlobs(re.BatchReadBlobsRequest(digests=[a.command_digest])).responses[0].data)
            p = subprocess.run(list(c.arguments), capture_output=True)
            l.result.Pack(re.ActionResult(exit_code=p.returncode, stdout_digest=put(p.stdout)))
            l.state = b.LeaseState.COMPLETED
    s = bots.UpdateBotSession(b.UpdateBotSessionRequest(name=s.name, bot_session=s), timeout=30)
PY
"$BG/bin/python" "$WORK/plain_bot.py" "127.0.0.1:$P" "$TC" >"$WORK/plain.out" 2>"$WORK/plain.log" &
ppid=$!; pids+=("$ppid")
for _ in $(seq 100); do grep -q attached "$WORK/plain.out" 2>/dev/null && break; sleep 0.1; done
per_action warm >/dev/null
plain_ms=$(per_action plain)
kill "$ppid"; wait "$ppid" 2>/dev/null || true

# 1c. `fhsx build` locally, a new action each time.
local_builds() {
  local k
  for ((k = 0; k < N; k++)); do
    cat >"$WORK/a.toml" <<EOF
[inputs]
toolchain = ["$WORK/base.toolchain"]
[run]
command = ["/bin/sh", "-c", "mkdir \$out; echo local-$k-$RANDOM"]
EOF
    TMPDIR=$WORK "$F" build "$WORK/a.toml" || return
  done
}
t=$(ms local_builds)
local_ms=$(awk -v t="$t" -v n="$N" 'BEGIN { printf "%d", t / n }')

mbs() { python3 -c "print(f'{$bytes / 1048576 / max($1, 1) * 1000:.0f}')"; }
ratio() { python3 -c "print(f'{$1 / max($2, 1):.2f}')"; }
echo "trivial action, $N runs each (ms per action, bgd execute's own start-up included):"
echo "  fhsx worker  $fhsx_ms   plain bot  $plain_ms   added $((fhsx_ms - plain_ms))   ratio $(ratio "$fhsx_ms" "$plain_ms")"
echo "  fhsx build locally  $local_ms   (fhsx worker / local: $(ratio "$fhsx_ms" "$local_ms"))"
echo "bytes through the engine's CAS: $((bytes / 1048576)) MiB, $(find "$WORK/tree" -type f | wc -l) files (MiB/s; ratio to cp -r, higher is slower):"
echo "  cp -r                        $(mbs "$cp_ms")"
echo "  client upload (bgd)          $(mbs "$up_ms")   $(ratio "$up_ms" "$cp_ms")"
echo "  worker input fetch (fhsx)    $(mbs "$fetch_ms")   $(ratio "$fetch_ms" "$cp_ms")"
echo "  worker output upload (fhsx)  $(mbs "$upload_ms")   $(ratio "$upload_ms" "$cp_ms")"
echo "  client download (bgd)        $(mbs "$down_ms")   $(ratio "$down_ms" "$cp_ms")"
echo "$sysroot_out"
