//! `--check`: a rebuild compared with the record it rebuilt.
//!
//! Nix's `--check` semantics: the action is run again although a record of
//! it exists, and the new outputs are compared with the recorded ones, path
//! by path. The rebuild's record is signed and stored like any other, with
//! `check_of` naming the record it was compared with, so a difference is
//! evidence anyone can re-examine; such a record never answers the cache.

use castore::store::LocalStore;
use executor_core::{CheckReport, OutputDifference, SignedRecord};

use crate::cache::Found;
use crate::Error;

/// Compare the outputs of `rebuilt` with those of the record `against`.
/// An output the rebuild did not make (it failed) differs at its root.
pub fn compare(
    store: &LocalStore,
    against: &Found,
    rebuilt: &SignedRecord,
) -> Result<CheckReport, Error> {
    let mut differences = Vec::new();
    for (name, before) in &against.record.record.outputs {
        let difference = |after| OutputDifference {
            output: name.clone(),
            difference: castore::diff::Difference {
                path: String::new(),
                before: Some(castore::diff::NodeSummary {
                    kind: castore::diff::NodeKind::Dir,
                    digest: *before,
                    size: 0,
                }),
                after,
            },
        };
        match rebuilt.record.outputs.get(name) {
            None => differences.push(difference(None)),
            Some(after) => {
                for d in castore::diff::diff(store, before, after)? {
                    differences.push(OutputDifference {
                        output: name.clone(),
                        difference: d,
                    });
                }
            }
        }
    }
    Ok(CheckReport {
        against: against.digest,
        differences,
    })
}
