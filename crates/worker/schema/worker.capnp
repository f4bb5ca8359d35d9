# The fhsx worker protocol: a scheduler (or `fhsx build --remote`) talks to an
# executor worker (`fhsx worker`) over Cap'n Proto RPC.
#
# A digest is BLAKE3-256, carried as its 32 raw bytes (`Data`). Directories
# travel in castore's canonical encoding (the snix castore protobuf layout),
# so their digest is the BLAKE3 of exactly those bytes.
#
# Versioning: `protocolVersion` below is bumped on any incompatible change.
# A client calls `Gate.version` first and stops on a mismatch; `build`
# carries the client's version too, so a client that never asks (or an old
# one that sends no version, i.e. 0) gets a clear error instead of a
# misread request.

@0xf3b8852e38e2468f;

const protocolVersion :UInt32 = 5;

# What a connection gets first. Anyone may ask the version; the executor
# takes the worker's access token (empty when the worker was started without
# one, which it allows only on loopback and UNIX sockets).
interface Gate {
  # What this worker speaks and who signs its records. On TCP (TLS),
  # `tlsBinding` is the record key's ed25519 signature over
  # "fhsx-worker-tls-binding-v1\0" ++ BLAKE3(the TLS certificate's DER):
  # the client checks it before it sends the token. Empty on UNIX sockets.
  version @0 () -> (protocol :UInt32, executor :Text, publicKey :Text, tlsBinding :Data);
  login @1 (protocol :UInt32, token :Data) -> (executor :Executor);
}

interface Executor {
  # The worker's content-addressed store: upload inputs, download outputs.
  cas @0 () -> (cas :Cas);

  # Run one action. `action` is a resolved action's TOML text (every input
  # a digest: references to other actions' outputs are resolved by the
  # client, which builds those actions first); `lock` the
  # fetch lock's bytes (network mode "replay"; empty otherwise — "record"
  # is refused remotely: it is the one impure mode). Every input the action
  # names (and every body the lock names) must already be in the worker's
  # store. The build's output streams to `logSink` as it happens. Returns
  # the stored signed record (JSON, as `fhsx record show` reads it) and its
  # digest. Dropping the call (or the connection) cancels the build.
  # A build the executor refused or could not finish (an input missing, a
  # containment violation, cancelled) returns `failure` instead of a record.
  # `cache` is the client's policy: the worker answers from its action
  # cache (`cached` is then true and nothing ran), rebuilds, or checks —
  # rebuilds and compares with its cached record, `check` being that
  # comparison as JSON (empty when not checking).
  build @1 (protocol :UInt32, action :Text, lock :Data, logSink :LogSink, cache :CachePolicy)
        -> (recordDigest :Data, record :Data, failure :Failure, cached :Bool, check :Data);

  # Counters, for tests and monitoring.
  stats @2 () -> (stats :Stats);
}

enum CachePolicy {
  use @0;
  rebuild @1;
  check @2;
}

struct Failure {
  class @0 :ExitClass;
  message @1 :Text;
}

# DESIGN.md's exit codes: 1, 2 and 3.
enum ExitClass {
  buildFailed @0;
  usage @1;
  integrity @2;
}

struct Stats {
  blobsWritten @0 :UInt64;        # blobs this worker added to its store
  blobBytesWritten @1 :UInt64;
  directoriesWritten @2 :UInt64;
  bytesReceived @3 :UInt64;       # blob payload bytes received (stored or not)
  buildsStarted @4 :UInt64;
  buildsRunning @5 :UInt32;
  buildsQueued @6 :UInt32;
  maxConcurrentBuilds @7 :UInt32; # the most builds ever running at once
  jobs @8 :UInt32;                # the --jobs limit
}

interface Cas {
  # Which of these objects the store lacks (each list answered separately).
  findMissing @0 (blobs :List(Data), directories :List(Data))
              -> (blobs :List(Data), directories :List(Data));

  # Upload one blob of `size` bytes in chunks: call `upload.write` per
  # chunk, then `upload.finish`, which checks the bytes against `digest`.
  # `upload` is null when the store already has it (or another client just
  # uploaded it): send nothing.
  putBlob @1 (digest :Data, size :UInt64) -> (upload :BlobUpload);

  # Many small blobs in one call and one store transaction. Each blob's
  # bytes must hash to its digest.
  putBlobs @2 (blobs :List(Blob)) -> ();

  # A directory (canonical encoding) whose children — sub-directories and
  # file blobs — are already in the store: upload bottom-up.
  putDirectory @3 (directory :Data) -> (digest :Data);

  # Several directories, children before parents, in one transaction.
  putDirectories @4 (directories :List(Data)) -> ();

  # Stream a blob's verified bytes to `sink`.
  getBlob @5 (digest :Data, sink :ByteSink) -> (size :UInt64);

  # A directory's canonical encoding.
  getDirectory @6 (digest :Data) -> (directory :Data);

  # Reserve missing blobs before sending their bytes, so that clients
  # uploading the same inputs at once send them once: `mine` are this
  # client's to upload (reserved until uploaded or this client goes away);
  # `others` are being uploaded by another client — wait with `awaitBlobs`.
  # Blobs the store already has are in neither list, and are held for this
  # client (rooted, then looked for again) as `findMissing` holds them: a
  # client may claim what it has not asked about.
  claimBlobs @7 (digests :List(Data)) -> (mine :List(Data), others :List(Data));

  # Wait until no other client is uploading these; returns those still
  # missing (their uploader failed or went away): upload them yourself.
  awaitBlobs @8 (digests :List(Data)) -> (missing :List(Data));

  # Several small blobs' verified bytes in one answer, in the order asked
  # (since protocol 5). Refused when the store lacks one, or when they
  # come to more than 960 KiB together: ask for bigger ones with getBlob.
  getBlobs @9 (digests :List(Data)) -> (blobs :List(Data));
}

struct Blob {
  digest @0 :Data;
  data @1 :Data;
}

interface BlobUpload {
  write @0 (chunk :Data) -> stream;
  finish @1 () -> ();
}

interface ByteSink {
  write @0 (chunk :Data) -> stream;
}

interface LogSink {
  write @0 (chunk :Data) -> stream;
}
