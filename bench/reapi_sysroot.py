"""bench/reapi.sh's sysroot client, run with BuildGrid's python.

Usage: reapi_sysroot.py ADDR SYSROOT ONEFILE N

Uploads two input roots, a sysroot (the directory SYSROOT) and a one-file
tree (ONEFILE, the busybox alone), then sends actions on them with `Execute`, each a new
command (`/usr/bin/busybox echo TAG`, so no cache answers; each root the
action's `/`, holding a static busybox) and one connection
for all: two on the one-file root to warm up, the first on the sysroot
(its conversion), then N rounds of one action on each root, the order
alternating. Prints one JSON object: per action its root, the client's
wall time and the worker's spans from `execution_metadata` (input fetch,
execution, output upload, and input-fetch start to output-upload end).
"""

import hashlib
import json
import os
import stat
import sys
import time
import uuid

import grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2_grpc as reg
from buildgrid._protos.google.bytestream import bytestream_pb2 as bs
from buildgrid._protos.google.bytestream import bytestream_pb2_grpc as bsg

addr, sysroot, onefile, rounds = sys.argv[1:5]
rounds = int(rounds)
ch = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20),
                                           ("grpc.max_send_message_length", 64 << 20)])
cas = reg.ContentAddressableStorageStub(ch)
bytestream = bsg.ByteStreamStub(ch)
caps = reg.CapabilitiesStub(ch).GetCapabilities(re.GetCapabilitiesRequest())
max_batch = (caps.cache_capabilities.max_batch_total_size_bytes or (4 << 20)) - (64 << 10)


def digest(b):
    return re.Digest(hash=hashlib.sha256(b).hexdigest(), size_bytes=len(b))


# Everything to upload: digest hash -> (digest, bytes or a path).
pending = {}


def tree(path):
    """The Directory message of `path` (its blobs queued); its digest."""
    d = re.Directory()
    for name in sorted(os.listdir(path)):
        p = os.path.join(path, name)
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            d.symlinks.add(name=name, target=os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            d.directories.add(name=name, digest=tree(p))
        else:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            fd = re.Digest(hash=h.hexdigest(), size_bytes=st.st_size)
            pending[fd.hash] = (fd, p)
            d.files.add(name=name, digest=fd, is_executable=bool(st.st_mode & 0o111))
    b = d.SerializeToString()
    dd = digest(b)
    pending[dd.hash] = (dd, b)
    return dd


def data(v):
    if isinstance(v, bytes):
        return v
    with open(v, "rb") as f:
        return f.read()


def upload():
    items = list(pending.values())
    pending.clear()
    missing = set()
    for i in range(0, len(items), 4096):
        r = cas.FindMissingBlobs(re.FindMissingBlobsRequest(
            blob_digests=[d for d, _ in items[i:i + 4096]]))
        missing.update(d.hash for d in r.missing_blob_digests)
    batch, total = [], 0
    for d, v in items:
        if d.hash not in missing:
            continue
        if d.size_bytes + 160 > max_batch:
            def chunks(d=d, v=v):
                b = data(v)
                name = f"uploads/{uuid.uuid4()}/blobs/{d.hash}/{d.size_bytes}"
                for off in range(0, len(b), 1 << 20):
                    yield bs.WriteRequest(resource_name=name, write_offset=off,
                                          data=b[off:off + (1 << 20)],
                                          finish_write=off + (1 << 20) >= len(b))
            bytestream.Write(chunks())
            continue
        if batch and total + d.size_bytes + 160 > max_batch:
            cas.BatchUpdateBlobs(re.BatchUpdateBlobsRequest(requests=batch))
            batch, total = [], 0
        batch.append(re.BatchUpdateBlobsRequest.Request(digest=d, data=data(v)))
        total += d.size_bytes + 160
    if batch:
        cas.BatchUpdateBlobs(re.BatchUpdateBlobsRequest(requests=batch))


def put(m):
    b = m.SerializeToString()
    d = digest(b)
    cas.BatchUpdateBlobs(re.BatchUpdateBlobsRequest(
        requests=[re.BatchUpdateBlobsRequest.Request(digest=d, data=b)]))
    return d


roots = {"sysroot": tree(sysroot), "one-file": tree(onefile)}
upload()
# No toolchain: each root is the action's `/` (`fhsx-root=input`), as
# BuildStream's are, and runs its own static busybox.
platform = re.Platform(properties=[re.Platform.Property(name="fhsx-root", value="input")])
execution = reg.ExecutionStub(ch)


def ms(a, b):
    return (b.ToNanoseconds() - a.ToNanoseconds()) / 1e6


def execute(root, tag, whole=False):
    # `whole`: the action asks for its whole input root back (as
    # BuildStream's integration commands do), so all of it is writable.
    c = re.Command(arguments=["/usr/bin/busybox", "echo", f"{tag}-{uuid.uuid4()}"],
                   output_paths=[""] if whole else [])
    a = re.Action(command_digest=put(c), input_root_digest=roots[root], platform=platform)
    ad = put(a)
    t0 = time.monotonic()
    last = None
    for op in execution.Execute(re.ExecuteRequest(action_digest=ad, skip_cache_lookup=True)):
        last = op
    wall = (time.monotonic() - t0) * 1000
    resp = re.ExecuteResponse()
    last.response.Unpack(resp)
    r = resp.result
    if resp.status.code != 0 or r.exit_code != 0:
        sys.exit(f"{root} action failed: status {resp.status.code} {resp.status.message!r}, exit {r.exit_code}")
    m = r.execution_metadata
    return {
        "root": root,
        "wall": wall,
        "fetch": ms(m.input_fetch_start_timestamp, m.input_fetch_completed_timestamp),
        "exec": ms(m.execution_start_timestamp, m.execution_completed_timestamp),
        "upload": ms(m.output_upload_start_timestamp, m.output_upload_completed_timestamp),
        "worker": ms(m.input_fetch_start_timestamp, m.output_upload_completed_timestamp),
    }


runs = {"warm": [execute("one-file", "warm") for _ in range(2)],
        "first": execute("sysroot", "first"), "again": []}
for k in range(rounds):
    order = ["sysroot", "one-file"] if k % 2 == 0 else ["one-file", "sysroot"]
    for root in order:
        runs["again"].append(execute(root, f"r{k}"))
# The same trivial action asking for the whole sysroot back: what each of
# BuildStream's integration actions costs on it.
runs["whole"] = [execute("sysroot", f"w{k}", whole=True) for k in range(3)]
print(json.dumps({"roots": {k: f"{d.hash}/{d.size_bytes}" for k, d in roots.items()}, "runs": runs}))
