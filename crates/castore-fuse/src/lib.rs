//! castore-fuse: fhsx's *Observe tier* — one composed castore tree served as a
//! read-only, digest-verifying FUSE file system that records what was read.
//!
//! # What it owns
//!
//! - **The view** ([`mount`]): lookup, getattr, readdir(plus), open, read,
//!   readlink, statfs, getxattr (`user.fhsx.digest` holds a file's blob
//!   digest, and reading it is recorded as a read of the file; a directory
//!   has none, since its digest would tell a build about everything below
//!   it without any of that in the read set). Everything that would write — create,
//!   write, mkdir, unlink, rename, setattr, setxattr, link, symlink, mknod —
//!   fails with `EROFS`, for root too; the mount is also `ro` in the kernel.
//!   Content is immutable, so entries and attributes have year-long TTLs
//!   (absences too), the page cache is kept across opens, several threads
//!   serve, each on its own `/dev/fuse` clone, and reads are as large as the
//!   kernel allows. With FUSE passthrough (Linux ≥ 6.9, root) an opened file
//!   is handed to the kernel, which reads the blob file directly (one backing
//!   file per inode, kept for the mount's life); the open itself still comes
//!   to the daemon, so it is still verified and logged. Without opens
//!   ([`MountOptions::zero_message_open`]) a file's first `READ` has a
//!   thread of the mount store the rest of it, verified, in the page cache
//!   (`prefill.rs`), so an exec's page faults are not each a round trip.
//!   `flush` is left
//!   unimplemented on purpose: the kernel then stops sending it, saving a
//!   round trip per `close`.
//!   Files are `0444` (`0555` if executable), directories `0555`, owned by
//!   root, all times 1970-01-01T00:00:01Z.
//! - **Verification**: the first open of a blob in a mount hashes the whole
//!   blob against its digest (once per blob per mount). A mismatch fails that
//!   open with `EIO`, prints the path and digests on stderr, and is listed in
//!   [`MountOutcome::integrity_failures`]; [`MountOutcome::check`] turns it
//!   into [`Error::Integrity`] (exit code 3). No corrupt byte is ever served;
//!   every other file stays readable. A store file this process hashed
//!   before and that is unchanged since (same device, inode, size, `mtime`,
//!   `ctime`) is not hashed again ([`VerifiedBlobs`]): a worker's jobs and a
//!   graph's actions open the same toolchain files over and over.
//! - **Read-set capture** ([`ReadSet`]): every lookup (a failed one records
//!   the absence), open-for-read (which `mmap` and `execve` go through),
//!   readdir and readlink. [`MountGuard::finish`] unmounts, de-duplicates and
//!   sorts, stores the encoding as a CAS blob and returns its digest.
//! - **Bounded read-set memory** ([`compact`]): while a mount runs, an
//!   observed existing path is one mark byte on its inode, and an absence
//!   is a `(parent inode, escaped name)` record in one arena behind a hash
//!   table of offsets — about 20 bytes an absence plus its escaped name
//!   (45 bytes an entry of peak RSS measured for 2 million 24-byte names,
//!   `examples/readset_flood.rs`), instead of a path string per entry. [`MountGuard::finish_compact`] freezes that into
//!   a [`CompactReadSet`] (canonical order from a depth-first walk) and
//!   streams the encoding into the store; the whole set is never
//!   materialised unless asked for ([`MountGuard::finish`] still returns a
//!   [`ReadSet`] for callers that want one). The encoding is byte for byte
//!   what [`ReadSet::encode`] gives for the same observations.
//! - **A cap on the read set** ([`MountOptions::max_read_set_entries`],
//!   default [`DEFAULT_MAX_READ_SET_ENTRIES`] = 4 million). A build that
//!   probes more distinct paths than that is not one whose inputs we can
//!   record: past the cap a request that would add an entry fails with
//!   `ENOMEM` — an error reply, so the kernel caches no negative entry and
//!   a retry asks again — and is counted. The outcome's `read_set_overflow`
//!   ([`ReadSetOverflow`]: the cap and how many requests were refused) then
//!   says the set is incomplete, and `check()` fails with
//!   [`Error::ReadSetIncomplete`]: the executor must fail the build as a
//!   limit failure and never sign its read set as complete. `ENOMEM`
//!   rather than `EIO`: the view is not broken (`EIO` is what corrupt
//!   content gets); a resource limit was reached, and tools report it as
//!   such. 4 million is far above what large real builds observe (a
//!   compiler's header search adds a few absences per `#include` per
//!   search directory; hundreds of thousands of entries is already a very
//!   large build) while bounding the daemon's recording memory to roughly
//!   200 MB and the stored read set to a few hundred MB.
//! - **Lifecycle** ([`MountGuard`]): one fresh mount per use; dropping the
//!   guard detaches the mount (`MNT_DETACH`), aborts its connection through
//!   fusectl (so a straggler holding a file open cannot make drop or finish
//!   hang) and joins every serving thread (and the prefill thread). The guard holds an `O_PATH`
//!   descriptor of the root until the abort is done: connection numbers are
//!   device minors the kernel reuses at once, and only a live superblock
//!   keeps the number ours — an abort by number after it died ended another
//!   build's view.
//!   Each live mount is registered with its owner's pid and start time;
//!   [`cleanup_stale_mounts`] (run by every [`mount`]) detaches those whose
//!   owner died.
//! - **Closure bloat** ([`closure_bloat`]): each read-set entry is charged to
//!   the atom(s) that supplied it via the composition map, giving
//!   `declared − read` per atom.
//!
//! It does not own the store, composition or its map (`castore`), the
//! sandbox that uses the mount (`executor-sandbox`), nor the BuildRecord
//! that carries the read-set digest (`executor-core` / `fhs-executor`).
//!
//! # Read-set format (`fhsx-read-set/1`)
//!
//! One compact JSON object followed by a single `\n`; its BLAKE3 is the read
//! set's digest:
//!
//! ```text
//! {"format":"fhsx-read-set/1","root":"b3:<view root>","entries":[
//!   {"path":"/usr/bin/cc","kind":"exe","digest":"b3:…","access":"read"},
//!   {"path":"/usr/include/nope.h","kind":"absent","access":"lookup"}, …]}
//! ```
//!
//! (shown wrapped; the encoding has no whitespace). Fields appear in exactly
//! this order. `entries` holds one entry per path, sorted by the path's
//! bytes. `path` is absolute in the view (`/` is the root), each name escaped
//! with `castore::compose::escape_name` (`%`, control characters and
//! non-UTF-8 bytes as `%XX`). `kind` is `absent`, `dir`, `file`, `exe` or
//! `symlink`; `digest` is the Directory digest, the blob digest, or the
//! BLAKE3 of the symlink target, and is omitted exactly for `absent`.
//! `access` is `lookup` (resolved by name: stat, existence checks, path
//! traversal) or `read` (a file opened, a directory listed, a symlink read);
//! a path seen both ways is `read`.
//!
//! With readdirplus the kernel learns a listed directory's children from the
//! listing, so a later `stat` of such a child may not reach the daemon; the
//! listing itself is in the set (`read` of the directory, whose digest
//! covers every child's name, kind and digest), so nothing observed escapes.

mod bloat;
pub mod compact;
mod error;
mod fs;
mod mount;
mod prefill;
pub mod readset;
mod signals;
mod verified;
mod warm;

pub use bloat::{closure_bloat, AtomUsage, BloatReport};
pub use compact::CompactReadSet;
pub use error::{Error, IntegrityFailure, Result};
pub use fs::{ReaddirOrder, DIGEST_XATTR};
pub use mount::{
    cleanup_stale_mounts, default_registry, detach, live_mounts, mount, preflight, register_mount,
    register_parked, CompactOutcome, MountGuard, MountOptions, MountOutcome, ReadSetOverflow,
    Registration, DEFAULT_MAX_READ_SET_ENTRIES, FS_NAME,
};
pub use readset::{Access, EntryKind, ReadSet, ReadSetEntry};
pub use signals::TerminationSignals;
pub use verified::VerifiedBlobs;
pub use warm::FirstOpen;
