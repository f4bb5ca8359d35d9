//! Remembered answers of pure functions of stored objects (`ROOT/memo/`):
//! what the same inputs gave before, so it need not be worked out again
//! (the merge of a toolchain's ~90 atoms took ~50 ms at every build, the
//! view's synthetic layer ~10 ms more).
//!
//! A memo is only ever a shortcut: its reader checks that what it names is
//! still in the store and works the answer out again if not; a memo lost or
//! torn (it is written without a sync) costs that same work; and every gc
//! drops them all, so no memo keeps anything alive or outlives what it
//! names for long.

use std::fs;

use super::LocalStore;
use crate::error::io;
use crate::{Digest, Result};

impl LocalStore {
    /// What was remembered for `key` under `what` (`[a-z-]`), if anything.
    pub fn recall(&self, what: &str, key: &Digest) -> Option<Vec<u8>> {
        fs::read(self.memo_path(what, key)).ok()
    }

    /// Remember `answer` for `key` under `what`, replacing what was.
    pub fn remember(&self, what: &str, key: &Digest, answer: &[u8]) -> Result<()> {
        let dest = self.memo_path(what, key);
        let dir = self.root().join("memo");
        fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let tmp = self
            .tmp_dir()
            .join(super::unique_name(&format!(".memo-{what}-")));
        fs::write(&tmp, answer)
            .and_then(|()| fs::rename(&tmp, &dest))
            .map_err(|e| {
                let _ = fs::remove_file(&tmp);
                io("write", &dest)(e)
            })
    }

    /// Forget what was remembered for `key` under `what`.
    pub fn forget(&self, what: &str, key: &Digest) {
        let _ = fs::remove_file(self.memo_path(what, key));
    }

    /// Forget every memo (gc).
    pub(crate) fn forget_memos(&self) {
        let _ = fs::remove_dir_all(self.root().join("memo"));
    }

    fn memo_path(&self, what: &str, key: &Digest) -> std::path::PathBuf {
        self.root()
            .join("memo")
            .join(format!("{what}-{}", key.hex()))
    }
}
