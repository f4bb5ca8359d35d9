//! `--check`: a rebuild compared with the record it rebuilt.
//!
//! Nix's `--check` semantics: the action is run again although a record of
//! it exists, and the new outputs are compared with the recorded ones, path
//! by path. The rebuild's record is signed and stored like any other, with
//! `check_of` naming the record it was compared with (and, with `--vary`,
//! what was varied), so a difference is evidence anyone can re-examine;
//! such a record never answers the cache.
//!
//! For each differing file the report says what it is (ELF, archive, text,
//! binary) and the first byte where the two differ; `--diffoscope` adds
//! diffoscope's report, kept as a blob the check record names.
//!
//! With `--vary`: no difference is exit 0; a difference keeps the varied
//! output and record, and with several variations on, each is rebuilt alone
//! against the pinned build (reused, not run again), naming those that
//! reproduce the difference alone, or all if none does. `--diffoscope` needs
//! Debian's diffoscope package installed.

use std::collections::BTreeMap;
use std::io::Read;

use castore::diff::{Difference, NodeKind, NodeSummary};
use castore::store::{BlobStore, LocalStore};
use castore::{Digest, TempRoots};
use executor_core::{CheckReport, FileDifference, OutputDifference, OutputName};

use crate::cache::Found;
use crate::Error;

/// Compare the outputs `rebuilt` with those of the record `against`. An
/// output the rebuild did not make (it failed) differs at its root.
pub fn compare(
    store: &LocalStore,
    against: &Found,
    rebuilt: &BTreeMap<OutputName, Digest>,
) -> Result<CheckReport, Error> {
    let mut differences = Vec::new();
    for (name, before) in &against.record.record.outputs {
        match rebuilt.get(name) {
            None => differences.push(OutputDifference {
                output: name.clone(),
                difference: Difference {
                    path: String::new(),
                    before: Some(NodeSummary {
                        kind: NodeKind::Dir,
                        digest: *before,
                        size: 0,
                    }),
                    after: None,
                },
                file: None,
            }),
            Some(after) => {
                for d in castore::diff::diff(store, before, after)? {
                    let file = file_difference(store, &d);
                    differences.push(OutputDifference {
                        output: name.clone(),
                        difference: d,
                        file,
                    });
                }
            }
        }
    }
    Ok(CheckReport {
        against: against.digest,
        differences,
        variations: BTreeMap::new(),
        culprits: None,
        diffoscope: None,
    })
}

/// Kind and first differing offset of a path that is a file on both sides.
fn file_difference(store: &LocalStore, d: &Difference) -> Option<FileDifference> {
    let (a, b) = (d.before.as_ref()?, d.after.as_ref()?);
    let is_file = |s: &NodeSummary| matches!(s.kind, NodeKind::File | NodeKind::Exe);
    if !is_file(a) || !is_file(b) {
        return None;
    }
    let mut x = store.open_blob(&a.digest).ok()?;
    let mut y = store.open_blob(&b.digest).ok()?;
    let (mut bx, mut by) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    let mut offset = 0u64;
    let mut head = Vec::new();
    loop {
        let n = read_full(&mut x, &mut bx).ok()?;
        let m = read_full(&mut y, &mut by).ok()?;
        if head.is_empty() {
            head = bx[..n.min(8192)].to_vec();
        }
        let same = bx[..n.min(m)]
            .iter()
            .zip(&by[..n.min(m)])
            .take_while(|(p, q)| p == q)
            .count();
        if same < n.min(m) || n != m || n == 0 {
            offset += same as u64;
            break;
        }
        offset += n as u64;
    }
    Some(FileDifference {
        kind: kind_of(&head).into(),
        first_difference: offset,
    })
}

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn kind_of(head: &[u8]) -> &'static str {
    let archive: [&[u8]; 5] = [
        b"!<arch>\n",
        &[0x1f, 0x8b],
        b"\xfd7zXZ\0",
        &[0x28, 0xb5, 0x2f, 0xfd],
        b"PK\x03\x04",
    ];
    if head.starts_with(b"\x7fELF") {
        "elf"
    } else if archive.iter().any(|m| head.starts_with(m))
        || (head.len() > 262 && &head[257..262] == b"ustar")
    {
        "archive"
    } else if !head.contains(&0) && std::str::from_utf8(head).is_ok() {
        "text"
    } else {
        "binary"
    }
}

/// Run `diffoscope` on the differing outputs (exported side by side) and
/// keep its text report as a blob; `None` (with a note) when it is not
/// installed.
pub fn diffoscope(
    store: &LocalStore,
    roots: &TempRoots,
    report: &CheckReport,
    rebuilt: &BTreeMap<OutputName, Digest>,
    live: &mut dyn std::io::Write,
) -> Result<Option<Digest>, Error> {
    let Some(exe) = which("diffoscope") else {
        let _ = writeln!(live, "fhsx: --diffoscope: diffoscope is not installed (apt-get install diffoscope); the report has sizes and offsets only");
        return Ok(None);
    };
    let rec = crate::sign::load_record(store, &report.against)?;
    let tmp = tempfile::tempdir()
        .map_err(|e| Error::io("create a directory in", &std::env::temp_dir(), e))?;
    let mut text = Vec::new();
    let outputs: std::collections::BTreeSet<&OutputName> =
        report.differences.iter().map(|d| &d.output).collect();
    for name in outputs {
        let (Some(a), Some(b)) = (rec.record.outputs.get(name), rebuilt.get(name)) else {
            continue;
        };
        let (pa, pb) = (
            tmp.path().join(format!("before-{name}")),
            tmp.path().join(format!("after-{name}")),
        );
        castore::export::export(store, a, &pa, &())?;
        castore::export::export(store, b, &pb, &())?;
        let o = std::process::Command::new(&exe)
            .args(["--text", "-", "--no-progress"])
            .arg(&pa)
            .arg(&pb)
            .output()
            .map_err(|e| Error::io("run", &exe, e))?;
        text.extend_from_slice(format!("== ${name}\n").as_bytes());
        text.extend_from_slice(&o.stdout);
    }
    let d = roots.rooted(|| store.put_blob(&text), |d| vec![*d])?;
    let _ = writeln!(
        live,
        "fhsx: diffoscope's report is blob {d} (`fhsx store blob {d}`)"
    );
    Ok(Some(d))
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// `--check --vary`: the varied rebuild, and — when it differs with several
/// variations on — each of them alone (reprotest's auto mode), naming the
/// ones that reproduce the difference by themselves; if none does alone,
/// the difference needs them together and all are named.
pub fn check_varied(
    exec: &crate::FhsExecutor,
    req: &executor_core::BuildRequest,
    live: &mut (dyn std::io::Write + Send),
) -> Result<executor_core::BuildOutcome, Error> {
    use executor_core::Executor;
    let mut out = exec.build(req, live)?;
    let (Some(vary), Some(check)) = (&req.vary, out.check.as_mut()) else {
        return Ok(out);
    };
    if check.differences.is_empty() {
        return Ok(out);
    }
    let names: Vec<String> = vary.set.iter().map(|v| v.name().to_owned()).collect();
    if vary.set.len() == 1 {
        check.culprits = Some(names);
        return Ok(out);
    }
    let mut culprits = Vec::new();
    for v in &vary.set {
        let mut one = req.clone();
        one.vary = Some(vary.only(*v));
        one.diffoscope = false;
        let _ = writeln!(live, "fhsx: check: bisecting: {} alone", v.name());
        let o = exec.build(&one, live)?;
        if o.check.as_ref().is_some_and(|c| !c.differences.is_empty()) {
            culprits.push(v.name().to_owned());
        }
    }
    check.culprits = Some(if culprits.is_empty() { names } else { culprits });
    Ok(out)
}
