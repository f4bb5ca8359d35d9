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
#     the same bytes.
# Usage: bench/reapi.sh [N=10] [MiB=64]   (needs .ci/setup's /opt/fhsx-ci and root)
N=${1:-10}
MIB=${2:-64}
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
      match-property-keys: [fhsx-toolchain]
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

# 1a. On an fhsx worker.
TMPDIR=$WORK "$F" worker --reapi "grpc://127.0.0.1:$P" --toolchain "$WORK/base.toolchain" --jobs 1 --bot-id bench >"$WORK/worker.out" 2>"$WORK/worker.log" &
wpid=$!; pids+=("$wpid")
for _ in $(seq 100); do grep -q attached "$WORK/worker.out" 2>/dev/null && break; sleep 0.1; done
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
