//! How long an action took the last time it ran, for a scheduler to put
//! the longest remaining path first.
//!
//! ```text
//! STORE/history/ab/ab12…(key)   {"file":"b3:…","record":"b3:…","wall_ms":1234}
//! ```
//!
//! A scheduler must know an action's duration before the action can be
//! resolved (its inputs are its dependencies' outputs, not built yet), so
//! the key cannot be the action digest: it is the caller's name for the
//! action (`fhsx build` hashes the action file's canonical path), stable
//! across edits, as BuildXL keys its historic timings by a pip's stable
//! name. Each entry names the record that ran last, with its wall time as
//! that record states it (its own time, not a wait for a token), and the
//! digest of the action file as it was then, so a scheduler can tell an
//! action that will likely run again (its file changed, or something it
//! depends on will run) from one the cache will likely answer. Only a
//! build that ran and succeeded writes one; a hit changes nothing.
//!
//! An entry is a hint like every index here: written whole (a temporary
//! file renamed over it), read in at most [`MAX_ENTRY_BYTES`], and one
//! that is missing or unreadable only makes the scheduler guess.

use std::fs;
use std::io::{Read, Write};
use std::path::PathBuf;

use castore::store::LocalStore;
use castore::Digest;
use serde::{Deserialize, Serialize};

use crate::Error;

/// No entry is read past this.
pub const MAX_ENTRY_BYTES: u64 = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The action file's bytes' digest when it ran.
    pub file: Digest,
    /// The record of the run timed.
    pub record: Digest,
    pub wall_ms: u64,
}

/// The history of one store.
pub struct History {
    dir: PathBuf,
}

impl History {
    pub fn open(store: &LocalStore) -> History {
        History {
            dir: store.root().join("history"),
        }
    }

    /// The key of an action named `name` (any stable bytes).
    pub fn key(name: &[u8]) -> Digest {
        let mut h = blake3::Hasher::new();
        h.update(b"fhsx-history/1\0");
        h.update(name);
        Digest::from(h.finalize())
    }

    fn path(&self, key: &Digest) -> PathBuf {
        let hex = key.hex();
        self.dir.join(&hex[..2]).join(hex)
    }

    /// The last timed run of `key`, if one is known.
    pub fn get(&self, key: &Digest) -> Option<Entry> {
        let mut text = Vec::new();
        fs::File::open(self.path(key))
            .ok()?
            .take(MAX_ENTRY_BYTES)
            .read_to_end(&mut text)
            .ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Remember that `key` last ran as `entry`.
    pub fn put(&self, key: &Digest, entry: &Entry) -> Result<(), Error> {
        let path = self.path(key);
        let dir = path.parent().unwrap_or(&self.dir);
        fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)
            .map_err(|e| Error::io("create a file in", dir, e))?;
        let bytes = serde_json::to_vec(entry).map_err(|e| Error::Other(e.to_string()))?;
        tmp.write_all(&bytes)
            .map_err(|e| Error::io("write", tmp.path(), e))?;
        tmp.persist(&path)
            .map_err(|e| Error::io("rename into", &path, e.error))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_the_last_put_and_garbage_is_none() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path()).unwrap();
        let h = History::open(&store);
        let k = History::key(b"/src/zlib/build.toml");
        assert_eq!(h.get(&k), None);
        let e = |ms| Entry {
            file: Digest::of(b"f"),
            record: Digest::of(b"r"),
            wall_ms: ms,
        };
        h.put(&k, &e(10)).unwrap();
        h.put(&k, &e(20)).unwrap();
        assert_eq!(h.get(&k), Some(e(20)));
        assert_ne!(k, History::key(b"/src/zlib/other.toml"));
        fs::write(h.path(&k), vec![b'{'; 10_000]).unwrap();
        assert_eq!(h.get(&k), None);
    }
}
