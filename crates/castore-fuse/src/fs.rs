//! The FUSE file system: one immutable castore tree, served read-only,
//! verified, and observed.
//!
//! Inodes are allocated lazily, a directory's children all at once (in the
//! directory's name order, so a lookup is a binary search plus an offset) the
//! first time anything below it is resolved. They are never forgotten: the
//! tree is immutable and a mount lives for one build.
//!
//! Every answer the kernel gets is recorded before it is sent: a lookup marks
//! the inode `Lookup` (or records the absent name under its parent), an open,
//! readdir or readlink marks it `Read`. Marks are one atomic per inode, so
//! recording an existing path costs no lock on the hot path; absences go to
//! the compact [`Absences`] table (see `compact.rs`).
//!
//! A new entry past `max_read_set_entries` is refused: the request fails
//! with `ENOMEM` (an error reply, so the kernel caches nothing) and the
//! mount's outcome says the read set is incomplete.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, SystemTime};

use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::{Digest, Name, Node};
use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};

use crate::compact::{escaped, kind_digest, Absences, Budget, CompactReadSet, Full, Tree};
use crate::readset::{Access, EntryKind};
use crate::IntegrityFailure;

/// Entry and attribute lifetime: the content never changes under a mount.
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// The extended attribute naming a file's blob or a directory's digest.
pub const DIGEST_XATTR: &str = "user.fhsx.digest";
/// Preferred I/O size reported by `stat` (cp, cat and friends read this much).
const BLKSIZE: u32 = 128 * 1024;
const ROOT_INO: u64 = 1;

const MARK_NONE: u8 = 0;
const MARK_LOOKUP: u8 = 1;
const MARK_READ: u8 = 2;

/// A directory's children: its entries in name order, with inode numbers
/// `first..first + entries.len()`.
struct Kids {
    first: u64,
    entries: Vec<(Name, Node)>,
    /// The order a listing returns `entries` in, as indices into it; empty
    /// for their own (name-byte) order.
    order: Vec<u32>,
}

struct Inode {
    parent: u64,
    /// Its place in the parent's `Kids` (its name is there); 0 for the root.
    idx: u32,
    node: Node,
    mark: AtomicU8,
    /// Offered to the prefill thread already (see `prefill.rs`).
    prefilled: AtomicBool,
    kids: OnceLock<Result<Arc<Kids>, Errno>>,
}

impl Inode {
    fn new(parent: u64, idx: u32, node: Node) -> Self {
        Inode {
            parent,
            idx,
            node,
            mark: AtomicU8::new(MARK_NONE),
            prefilled: AtomicBool::new(false),
            kids: OnceLock::new(),
        }
    }
}

/// What verifying a blob found: nothing wrong, or what its bytes hash to.
type Verdict = Result<(), Option<Digest>>;

/// Everything one mount knows. Shared between the serving threads and the
/// guard that collects the read set after unmount.
pub(crate) struct Shared {
    store: LocalStore,
    root: Digest,
    inodes: RwLock<Vec<Arc<Inode>>>,
    absent: Mutex<Absences>,
    budget: Budget,
    verified: Mutex<HashMap<Digest, Arc<OnceLock<Verdict>>>>,
    /// Files hashed before, by this mount or another sharing the table.
    known: Arc<crate::verified::VerifiedBlobs>,
    failures: Mutex<Vec<IntegrityFailure>>,
    /// Open files served by the daemon (not passthrough), by file handle.
    handles: Mutex<HashMap<u64, Arc<File>>>,
    next_fh: AtomicU64,
    want_passthrough: bool,
    /// See [`crate::MountOptions::zero_message_open`].
    zero_message_open: bool,
    passthrough: AtomicBool,
    /// Passthrough backing files by inode, kept until unmount.
    backing: Mutex<HashMap<u64, Arc<BackingId>>>,
    /// Where first `READ`s without an open hand their file on to be stored
    /// whole in the page cache; `None` before the session serves and after
    /// it ended.
    prefill: Mutex<Option<crate::prefill::Prefill>>,
    time: SystemTime,
    order: ReaddirOrder,
}

/// The order a directory's listing comes back in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReaddirOrder {
    /// By name bytes, as the directory encodes them: fhsx's pinned order.
    #[default]
    Sorted,
    /// Reversed: a cheap fixed alternative.
    Reverse,
    /// Shuffled, per directory, from this seed and the directory's digest:
    /// the same seed gives the same listings, so a failure replays.
    Shuffle(u64),
}

impl ReaddirOrder {
    /// The listing order of `n` entries of the directory `dir`.
    fn permutation(self, dir: &Digest, n: usize) -> Vec<u32> {
        match self {
            ReaddirOrder::Sorted => Vec::new(),
            ReaddirOrder::Reverse => (0..n as u32).rev().collect(),
            ReaddirOrder::Shuffle(seed) => {
                let mut x =
                    seed ^ u64::from_le_bytes(dir.as_bytes()[..8].try_into().unwrap_or([0; 8]));
                // splitmix64, then Fisher-Yates.
                let mut next = move || {
                    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = x;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^ (z >> 31)
                };
                let mut p: Vec<u32> = (0..n as u32).collect();
                for i in (1..n).rev() {
                    let j = (next() % (i as u64 + 1)) as usize;
                    p.swap(i, j);
                }
                p
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking serving thread must not take the read set with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// The state of a mount of the directory `root` (its size `root_size`)
    /// served as `opts` says.
    pub(crate) fn new(
        store: LocalStore,
        root: Digest,
        root_size: u64,
        opts: &crate::MountOptions,
    ) -> Self {
        let root_inode = Inode::new(
            ROOT_INO,
            0,
            Node::Directory {
                digest: root,
                size: root_size,
            },
        );
        Shared {
            store,
            root,
            inodes: RwLock::new(vec![Arc::new(root_inode)]),
            absent: Mutex::new(Absences::default()),
            budget: Budget::new(opts.max_read_set_entries),
            verified: Mutex::new(HashMap::new()),
            known: opts.verified.clone(),
            failures: Mutex::new(Vec::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            want_passthrough: opts.passthrough && !opts.zero_message_open,
            zero_message_open: opts.zero_message_open,
            passthrough: AtomicBool::new(false),
            backing: Mutex::new(HashMap::new()),
            prefill: Mutex::new(None),
            time: SystemTime::UNIX_EPOCH + Duration::from_secs(opts.mtime_secs),
            order: opts.readdir_order,
        }
    }

    pub(crate) fn root(&self) -> Digest {
        self.root
    }

    /// Whether first `READ`s should be offered for prefill (mounts without
    /// opens only: with opens, passthrough already serves pages natively).
    pub(crate) fn wants_prefill(&self) -> bool {
        self.zero_message_open
    }

    /// Start (`Some`) or stop (`None`) offering files for prefill.
    pub(crate) fn set_prefill(&self, p: Option<crate::prefill::Prefill>) {
        *lock(&self.prefill) = p;
    }

    pub(crate) fn passthrough_active(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// Freeze the observations so far into the canonical compact set. The
    /// absences move out (a straggling request after this records nothing
    /// that counts).
    pub(crate) fn freeze(&self) -> CompactReadSet {
        let absences = std::mem::take(&mut *lock(&self.absent));
        let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
        CompactReadSet::freeze(self.root, &InodeTree(&inodes), absences)
    }

    /// How many new entries were refused at the cap, and the cap.
    pub(crate) fn refused(&self) -> (u64, u64) {
        (self.budget.refused(), self.budget.max)
    }

    /// Mark `inode` as observed with `m`; false if that would be a new
    /// entry past the cap (nothing is recorded then).
    fn mark(&self, inode: &Inode, m: u8) -> bool {
        let cur = inode.mark.load(Ordering::Relaxed);
        if cur >= m {
            return true;
        }
        if cur != MARK_NONE {
            inode.mark.fetch_max(m, Ordering::Relaxed);
            return true;
        }
        if !self.budget.reserve() {
            return false;
        }
        if inode.mark.fetch_max(m, Ordering::Relaxed) != MARK_NONE {
            // Another thread made it an entry first.
            self.budget.release();
        }
        true
    }

    /// The absolute, escaped path of inode `ino` (for messages).
    fn path_of(&self, ino: u64) -> String {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO {
            let Some(i) = self.inode(INodeNo(cur)) else {
                break;
            };
            let name = self
                .inode(INodeNo(i.parent))
                .and_then(|p| p.kids.get().and_then(|k| k.as_ref().ok().cloned()))
                .and_then(|k| k.entries.get(i.idx as usize).map(|(n, _)| n.clone()));
            match name {
                Some(n) => parts.push(escaped(n.as_bytes()).into_owned()),
                None => break,
            }
            cur = i.parent;
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    /// Integrity failures so far, one per path, sorted.
    pub(crate) fn failures(&self) -> Vec<IntegrityFailure> {
        let mut f = lock(&self.failures).clone();
        f.sort_by(|a, b| a.path.cmp(&b.path));
        f.dedup_by(|a, b| a.path == b.path);
        f
    }

    fn inode(&self, ino: INodeNo) -> Option<Arc<Inode>> {
        let idx = usize::try_from(ino.0.checked_sub(1)?).ok()?;
        self.inodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(idx)
            .cloned()
    }

    fn fail(&self, path: &str, digest: Digest, actual: Option<Digest>) {
        let f = IntegrityFailure {
            path: path.to_owned(),
            digest,
            actual,
        };
        // The one log line an operator sees while the build is still running.
        eprintln!("fhsx: integrity error: refusing to serve {f}");
        lock(&self.failures).push(f);
    }

    /// The children of a directory inode, allocating their inodes on first use.
    fn kids(&self, ino: u64, inode: &Inode) -> Result<Arc<Kids>, Errno> {
        inode
            .kids
            .get_or_init(|| {
                let Node::Directory { digest, .. } = &inode.node else {
                    return Err(Errno::ENOTDIR);
                };
                let dir = match self.store.get_directory(digest) {
                    Ok(d) => d,
                    Err(e) => {
                        let actual = match e {
                            castore::Error::Corrupt { actual, .. } => Some(actual),
                            _ => None,
                        };
                        self.fail(&self.path_of(ino), *digest, actual);
                        return Err(Errno::EIO);
                    }
                };
                let entries: Vec<(Name, Node)> = dir
                    .entries()
                    .map(|(n, node)| (n.clone(), node.clone()))
                    .collect();
                let mut inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
                let first = inodes.len() as u64 + 1;
                // Inode indices are u32 in the read set's trie.
                if first + entries.len() as u64 > u64::from(u32::MAX) {
                    return Err(Errno::ENOMEM);
                }
                for (idx, (_, node)) in entries.iter().enumerate() {
                    inodes.push(Arc::new(Inode::new(ino, idx as u32, node.clone())));
                }
                let order = self.order.permutation(digest, entries.len());
                Ok(Arc::new(Kids {
                    first,
                    entries,
                    order,
                }))
            })
            .clone()
    }

    fn attr(&self, ino: u64, node: &Node) -> FileAttr {
        let (kind, perm, size, nlink) = match node {
            Node::Directory { .. } => (FileType::Directory, 0o555, 4096, 1),
            Node::File {
                size, executable, ..
            } => (
                FileType::RegularFile,
                if *executable { 0o555 } else { 0o444 },
                *size,
                1,
            ),
            Node::Symlink { target } => {
                (FileType::Symlink, 0o777, target.as_bytes().len() as u64, 1)
            }
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.time,
            mtime: self.time,
            ctime: self.time,
            crtime: self.time,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        }
    }

    /// Open a blob's file, checked against its digest once per mount. The
    /// first open hashes the very file it returns, so what the kernel is then
    /// handed (or what the daemon serves) is the inode that was verified —
    /// unless that very file, unchanged, was hashed before by a mount
    /// sharing the `known` table (see `verified.rs`).
    /// `None` (with the failure recorded) if it is missing or corrupt.
    fn verified_file(&self, ino: u64, digest: &Digest) -> Option<File> {
        let file = match self.open_blob_file(digest) {
            Ok(f) => f,
            Err(_) => {
                self.fail(&self.path_of(ino), *digest, None);
                return None;
            }
        };
        match self.verdict(digest, &file) {
            Ok(()) => Some(file),
            Err(actual) => {
                self.fail(&self.path_of(ino), *digest, actual);
                None
            }
        }
    }

    /// Whether `file` holds `digest`'s bytes, decided once per mount (the
    /// first caller hashes; one that comes meanwhile waits for its
    /// verdict); `Err` carries the digest found, if the file could be read.
    fn verdict(&self, digest: &Digest, file: &File) -> Result<(), Option<Digest>> {
        let cell = lock(&self.verified).entry(*digest).or_default().clone();
        *cell.get_or_init(|| {
            // One fstat: the identity asked about is the one remembered.
            let id = crate::verified::FileId::of(file);
            if id.is_some_and(|id| self.known.holds(digest, id)) {
                return Ok(());
            }
            match hash_file(file) {
                Ok(actual) if actual == *digest => {
                    if let Some(id) = id {
                        self.known.insert(*digest, id);
                    }
                    Ok(())
                }
                Ok(actual) => Err(Some(actual)),
                Err(_) => Err(None),
            }
        })
    }

    fn open_blob_file(&self, digest: &Digest) -> std::io::Result<File> {
        let path = self
            .store
            .blob_path(digest)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EIO))?;
        File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(Path::new(&path))
    }
}

/// The inode table as the freezer sees it (index = inode number − 1).
struct InodeTree<'a>(&'a [Arc<Inode>]);

impl Tree for InodeTree<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn parent(&self, i: u32) -> u32 {
        self.0
            .get(i as usize)
            .map(|n| (n.parent - 1) as u32)
            .unwrap_or(0)
    }

    fn name(&self, i: u32) -> &[u8] {
        let Some(n) = self.0.get(i as usize) else {
            return b"";
        };
        self.0
            .get((n.parent - 1) as usize)
            .and_then(|p| p.kids.get())
            .and_then(|k| k.as_ref().ok())
            .and_then(|k| k.entries.get(n.idx as usize))
            .map(|(name, _)| name.as_bytes())
            .unwrap_or(b"")
    }

    fn observed(&self, i: u32) -> Option<(EntryKind, Digest, Access)> {
        let n = self.0.get(i as usize)?;
        let access = match n.mark.load(Ordering::Relaxed) {
            MARK_LOOKUP => Access::Lookup,
            MARK_READ => Access::Read,
            _ => return None,
        };
        let (kind, digest) = kind_digest(&n.node);
        Some((kind, digest, access))
    }
}

/// Files at least this large are hashed on several threads.
const PARALLEL_HASH_MIN: u64 = 8 << 20;

/// The read size of a serial hash: below glibc's mmap threshold (128 KiB).
const SERIAL_HASH_CHUNK: u64 = 64 << 10;

/// BLAKE3 of a whole file, read through the given descriptor; a large
/// file is hashed on all cores.
fn hash_file(f: &File) -> std::io::Result<Digest> {
    let len = f.metadata()?.len();
    // Hashing on rayon's threads halves a 64 MB file's time, but starting
    // its pool costs a process ~1 ms and a file of a few MiB gains nothing
    // from it: a CLI build that opens only a 2 MB shell paid the start for
    // nothing.
    let parallel = len >= PARALLEL_HASH_MIN;
    // A small buffer for the serial hash: a fresh 1 MiB one is a fresh
    // mapping whose 256 pages fault in during the first read, and that
    // cost 1.8 ms of the 2.0 ms it took to read a 2 MB shell (0.19 ms
    // through 64 KiB, which malloc serves from memory it already has).
    // Rayon's split wants large inputs, and a file that large amortizes
    // the faults.
    let chunk = if parallel { 1 << 20 } else { SERIAL_HASH_CHUNK };
    let mut buf = vec![0u8; len.clamp(1, chunk) as usize];
    let mut h = blake3::Hasher::new();
    let mut off = 0u64;
    loop {
        let n = match f.read_at(&mut buf, off) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if parallel {
            h.update_rayon(&buf[..n]);
        } else {
            h.update(&buf[..n]);
        }
        off += n as u64;
    }
    Ok(h.finalize().into())
}

fn file_type(node: &Node) -> FileType {
    match node {
        Node::Directory { .. } => FileType::Directory,
        Node::File { .. } => FileType::RegularFile,
        Node::Symlink { .. } => FileType::Symlink,
    }
}

thread_local! {
    /// A serving thread's buffer for daemon-served `READ`s.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The `fuser` face of [`Shared`].
pub(crate) struct ViewFs {
    pub(crate) shared: Arc<Shared>,
}

impl ViewFs {
    /// The store file behind `ino` for a `READ` that came without an open
    /// ([`crate::MountOptions::zero_message_open`]): what an open would do,
    /// done at the first byte wanted — recorded as read (`ENOMEM` past the
    /// read-set cap) and verified (`EIO` if the store's bytes are wrong).
    /// With it, the file's size if this is its first `READ` and it should
    /// be prefilled.
    fn unopened_file(&self, ino: INodeNo) -> Result<(File, Option<u64>), Errno> {
        let s = &self.shared;
        let inode = s.inode(ino).ok_or(Errno::ENOENT)?;
        let Node::File { digest, size, .. } = &inode.node else {
            return Err(Errno::EISDIR);
        };
        if !s.mark(&inode, MARK_READ) {
            return Err(Errno::ENOMEM);
        }
        let file = s.verified_file(ino.0, digest).ok_or(Errno::EIO)?;
        let prefill = (*size <= crate::prefill::MAX_FILE
            && !inode.prefilled.swap(true, Ordering::Relaxed))
        .then_some(*size);
        Ok((file, prefill))
    }

    /// Directory entries from `offset` on: `.`, `..`, then the children.
    fn list(
        &self,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(u64, u64, &[u8], &Node) -> bool,
    ) -> Result<(), Errno> {
        let s = &self.shared;
        let inode = s.inode(ino).ok_or(Errno::ENOENT)?;
        let kids = s.kids(ino.0, &inode)?;
        if !s.mark(&inode, MARK_READ) {
            return Err(Errno::ENOMEM);
        }
        let parent_node = if inode.parent == ino.0 {
            inode.node.clone()
        } else {
            s.inode(INodeNo(inode.parent))
                .map(|p| p.node.clone())
                .unwrap_or_else(|| inode.node.clone())
        };
        let total = kids.entries.len() as u64 + 2;
        for off in offset..total {
            let full = match off {
                0 => add(ino.0, 1, b".", &inode.node),
                1 => add(inode.parent, 2, b"..", &parent_node),
                n => {
                    let p = (n - 2) as usize;
                    let i = kids.order.get(p).map_or(p, |i| *i as usize);
                    let (name, node) = &kids.entries[i];
                    add(kids.first + i as u64, n + 1, name.as_bytes(), node)
                }
            };
            if full {
                break;
            }
        }
        Ok(())
    }
}

impl Filesystem for ViewFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for flag in [
            // Always plus (not READDIRPLUS_AUTO): attributes cost nothing
            // here, and a listing then saves a lookup per child stat.
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ] {
            // Optional speed-ups: an old kernel without one still works.
            let _ = config.add_capabilities(flag);
        }
        // More readahead in flight for daemon-served reads.
        if let Err(max) = config.set_max_background(64) {
            let _ = config.set_max_background(max);
        }
        if let Err(max) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(max);
        }
        if self.shared.want_passthrough
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(2).is_ok()
        {
            self.shared.passthrough.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = &self.shared;
        let Some(p) = s.inode(parent) else {
            return reply.error(Errno::ENOENT);
        };
        let kids = match s.kids(parent.0, &p) {
            Ok(k) => k,
            Err(e) => return reply.error(e),
        };
        let name = name.as_bytes();
        match kids
            .entries
            .binary_search_by(|(n, _)| n.as_bytes().cmp(name))
        {
            Ok(i) => {
                let ino = kids.first + i as u64;
                let node = &kids.entries[i].1;
                if let Some(child) = s.inode(INodeNo(ino)) {
                    // Without opens, an empty file is never read: what its
                    // attributes show is all of it.
                    let empty_file = matches!(node, Node::File { size: 0, .. });
                    let mark = if s.zero_message_open && empty_file {
                        MARK_READ
                    } else {
                        MARK_LOOKUP
                    };
                    if !s.mark(&child, mark) {
                        return reply.error(Errno::ENOMEM);
                    }
                }
                reply.entry(&TTL, &s.attr(ino, node), Generation(0));
            }
            Err(_) => {
                let esc = escaped(name);
                // The parent is a directory inode: its index fits (see kids).
                let parent_idx = (parent.0 - 1) as u32;
                let r = lock(&s.absent).insert(parent_idx, esc.as_bytes(), &s.budget);
                if let Err(Full) = r {
                    // Not recorded, so not cached either: an error reply.
                    return reply.error(Errno::ENOMEM);
                }
                // A negative entry with a lifetime: the kernel caches the
                // absence instead of asking again.
                let mut attr = s.attr(0, &p.node);
                attr.ino = INodeNo(0);
                reply.entry(&TTL, &attr, Generation(0));
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.shared.inode(ino) {
            Some(i) => reply.attr(&TTL, &self.shared.attr(ino.0, &i.node)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.shared.inode(ino) {
            Some(i) => match &i.node {
                Node::Symlink { target } => {
                    if !self.shared.mark(&i, MARK_READ) {
                        return reply.error(Errno::ENOMEM);
                    }
                    reply.data(target.as_bytes())
                }
                _ => reply.error(Errno::EINVAL),
            },
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let s = &self.shared;
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        if s.zero_message_open {
            // The kernel takes this open as done and asks no more (see
            // `read` for what the open would have done).
            return reply.error(Errno::ENOSYS);
        }
        let Some(inode) = s.inode(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let Node::File { digest, .. } = &inode.node else {
            return reply.error(Errno::EISDIR);
        };
        if !s.mark(&inode, MARK_READ) {
            return reply.error(Errno::ENOMEM);
        }
        if s.passthrough.load(Ordering::Relaxed) {
            // One backing file per inode for the whole mount (it exists only
            // once verified): the kernel holds the file, not our fd table.
            let known = lock(&s.backing).get(&ino.0).cloned();
            if let Some(id) = known {
                return reply.opened_passthrough(FileHandle(0), FopenFlags::empty(), &id);
            }
        }
        let Some(file) = s.verified_file(ino.0, digest) else {
            return reply.error(Errno::EIO);
        };
        if s.passthrough.load(Ordering::Relaxed) {
            match reply.open_backing(&file) {
                Ok(id) => {
                    // Two first opens may race: the inode keeps one backing
                    // file, the loser's is closed when its Arc drops.
                    let id = lock(&s.backing)
                        .entry(ino.0)
                        .or_insert_with(|| Arc::new(id))
                        .clone();
                    return reply.opened_passthrough(FileHandle(0), FopenFlags::empty(), &id);
                }
                Err(e) => {
                    // Not permitted here (no CAP_SYS_ADMIN) or not supported:
                    // serve through the daemon from now on.
                    eprintln!("fhsx: FUSE passthrough unavailable ({e}); serving reads through the daemon");
                    s.passthrough.store(false, Ordering::Relaxed);
                }
            }
        }
        let fh = s.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&s.handles).insert(fh, Arc::new(file));
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let handle = lock(&self.shared.handles).get(&fh.0).cloned();
        let mut prefill = None;
        let file = match handle {
            Some(f) => f,
            None if self.shared.zero_message_open => match self.unopened_file(ino) {
                Ok((f, size)) => {
                    let f = Arc::new(f);
                    prefill = size.map(|size| (f.clone(), size));
                    f
                }
                Err(e) => return reply.error(e),
            },
            None => return reply.error(Errno::EBADF),
        };
        let served = READ_BUF.with_borrow_mut(|buf| {
            // One buffer per serving thread, grown to the largest read it
            // has served (the kernel's max read, ~1 MiB at most): a fresh
            // allocation per READ was a fresh mapping to fault in and zero.
            if buf.len() < size as usize {
                buf.resize(size as usize, 0);
            }
            let buf = &mut buf[..size as usize];
            let mut n = 0;
            while n < buf.len() {
                match file.read_at(&mut buf[n..], offset + n as u64) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        reply.error(Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)));
                        return None;
                    }
                }
            }
            reply.data(&buf[..n]);
            Some(offset + n as u64)
        });
        // After the reply: this READ's pages are unlocked only by it. A
        // file this one READ covered whole has nothing left to store.
        if let (Some((file, size)), Some(end)) = (prefill, served) {
            if offset > 0 || end < size {
                if let Some(p) = lock(&self.shared.prefill).as_ref() {
                    p.offer(ino.0, file, size);
                }
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.shared.handles).remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.shared.inode(ino) {
            Some(i) if matches!(i.node, Node::Directory { .. }) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
            ),
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.list(ino, offset, |ino, next, name, node| {
            reply.add(INodeNo(ino), next, file_type(node), OsStr::from_bytes(name))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let s = &self.shared;
        let r = self.list(ino, offset, |ino, next, name, node| {
            reply.add(
                INodeNo(ino),
                next,
                OsStr::from_bytes(name),
                &TTL,
                &s.attr(ino, node),
                Generation(0),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self
            .shared
            .inodes
            .read()
            .map(|v| v.len() as u64)
            .unwrap_or(0);
        reply.statfs(0, 0, 0, files, 0, BLKSIZE, Name::MAX_LEN as u32, BLKSIZE);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Some(i) = self.shared.inode(ino) else {
            return reply.error(Errno::ENOENT);
        };
        // Only a file's digest: it tells no more than its content, so
        // reading it is a read of the file. A directory's digest would tell
        // the build about everything below it without any of it being in
        // the read set.
        let value = match (&i.node, name.as_bytes() == DIGEST_XATTR.as_bytes()) {
            (Node::File { digest, .. }, true) => {
                if !self.shared.mark(&i, MARK_READ) {
                    return reply.error(Errno::ENOMEM);
                }
                digest.to_string()
            }
            _ => return reply.error(Errno::ENODATA),
        };
        if size == 0 {
            reply.size(value.len() as u32)
        } else if (size as usize) < value.len() {
            reply.error(Errno::ERANGE)
        } else {
            reply.data(value.as_bytes())
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let Some(i) = self.shared.inode(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let list: &[u8] = match i.node {
            Node::File { .. } => b"user.fhsx.digest\0",
            _ => b"",
        };
        if size == 0 {
            reply.size(list.len() as u32)
        } else if (size as usize) < list.len() {
            reply.error(Errno::ERANGE)
        } else {
            reply.data(list)
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if self.shared.inode(ino).is_none() {
            reply.error(Errno::ENOENT)
        } else if mask.contains(AccessFlags::W_OK) {
            reply.error(Errno::EROFS)
        } else {
            reply.ok()
        }
    }

    // Everything that would write: refused, whoever asks.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _r: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(&self, _req: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _wf: fuser::WriteFlags,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _i: INodeNo,
        _n: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _o: u64,
        _l: u64,
        _m: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn fsync(&self, _req: &Request, _i: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        reply.ok();
    }
}
