//! How long an action took the last time it ran, for a scheduler to put
//! the longest remaining path first.
//!
//! ```text
//! STORE/memo/history-<key>   {"file":"b3:…","wall_ms":1234}
//! ```
//!
//! A scheduler must know an action's duration before the action can be
//! resolved (its inputs are its dependencies' outputs, not built yet), so
//! the key cannot be the action digest: it is the caller's name for the
//! action (`fhsx build` hashes the action file's canonical path), stable
//! across edits, as BuildXL keys its historic timings by a pip's stable
//! name. Each entry holds the wall time of the last run as its record
//! states it (its own time, not a wait for a token), and the digest of
//! the action file as it was then, so a scheduler can tell an action that
//! will likely run again (its file changed, or something it depends on
//! will run) from one the cache will likely answer. Only a build that ran
//! and succeeded writes one; a hit changes nothing.
//!
//! An entry is a memo of the store ([`LocalStore::remember`]), a hint like
//! every memo: written whole, and one that is missing or unreadable only
//! makes the scheduler guess. Every gc forgets the memos, these with them,
//! so the first schedule after a gc is a guess (every action expected to
//! take as long as any other), as on a fresh store.

use castore::store::LocalStore;
use castore::Digest;
use serde::{Deserialize, Serialize};

use crate::Error;

/// The memos' kind ([`LocalStore::remember`]).
const MEMO: &str = "history";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The action file's bytes' digest when it ran.
    pub file: Digest,
    pub wall_ms: u64,
}

/// The history of one store.
pub struct History {
    store: LocalStore,
}

impl History {
    pub fn open(store: &LocalStore) -> History {
        History {
            store: store.clone(),
        }
    }

    /// The key of an action named `name` (any stable bytes).
    pub fn key(name: &[u8]) -> Digest {
        let mut h = blake3::Hasher::new();
        h.update(b"fhsx-history/1\0");
        h.update(name);
        Digest::from(h.finalize())
    }

    /// The last timed run of `key`, if one is known.
    pub fn get(&self, key: &Digest) -> Option<Entry> {
        serde_json::from_slice(&self.store.recall(MEMO, key)?).ok()
    }

    /// Remember that `key` last ran as `entry`.
    pub fn put(&self, key: &Digest, entry: &Entry) -> Result<(), Error> {
        let bytes = serde_json::to_vec(entry).map_err(|e| Error::Other(e.to_string()))?;
        self.store.remember(MEMO, key, &bytes)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_the_last_put_garbage_is_none_and_gc_forgets_it() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path()).unwrap();
        let h = History::open(&store);
        let k = History::key(b"/src/zlib/build.toml");
        assert_eq!(h.get(&k), None);
        let e = |ms| Entry {
            file: Digest::of(b"f"),
            wall_ms: ms,
        };
        h.put(&k, &e(10)).unwrap();
        h.put(&k, &e(20)).unwrap();
        assert_eq!(h.get(&k), Some(e(20)));
        assert_ne!(k, History::key(b"/src/zlib/other.toml"));
        store.remember(MEMO, &k, &[b'{'; 10_000]).unwrap();
        assert_eq!(h.get(&k), None);
        h.put(&k, &e(30)).unwrap();
        castore::gc::gc(&store, &[]).unwrap();
        assert_eq!(h.get(&k), None);
    }
}
