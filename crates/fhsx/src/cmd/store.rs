//! `fhsx store …`: import, inspect, export, verify and collect the store.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::{Digest, Node};
use clap::Subcommand;
use serde_json::json;

use super::Globals;
use crate::exit::Classified;
use crate::progress::Bar;
use executor_core::ExitClass;

#[derive(Subcommand, Debug)]
pub enum StoreCmd {
    /// Import directories, tarballs (.tar, .tar.gz, .tar.xz, .tar.zst) or .debs; print each root digest.
    Import {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// List a directory of a stored tree.
    Ls {
        digest: Digest,
        path: Option<String>,
    },
    /// Write a file of a stored tree to stdout (verified before the first byte).
    Cat { digest: Digest, path: String },
    /// Write a blob (a build log, a read set, a record) to stdout, verified.
    Blob { digest: Digest },
    /// Write a stored tree out to a new directory.
    Export { digest: Digest, dest: PathBuf },
    /// Re-hash the whole store, or one tree, and report every corrupt or missing object by path.
    Verify { digest: Option<Digest> },
    /// Delete everything not reachable from the kept roots.
    Gc {
        #[arg(long, required = true, num_args = 1..)]
        keep: Vec<Digest>,
    },
}

/// Open the store the user chose (or the default one).
pub fn open_store(g: &Globals) -> anyhow::Result<LocalStore> {
    let root = match &g.store {
        Some(p) => p.clone(),
        None => LocalStore::default_root().context(
            "no store directory: pass --store DIR or set FHSX_STORE (or XDG_DATA_HOME / HOME)",
        )?,
    };
    LocalStore::open(&root).with_context(|| format!("opening the store at {}", root.display()))
}

pub fn run(g: &Globals, cmd: StoreCmd) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    match cmd {
        StoreCmd::Import { paths } => {
            let mut results = Vec::new();
            for p in &paths {
                let bar = Bar::new(&format!("importing {}", p.display()));
                let r = castore::import::import_path(&store, p, &bar);
                bar.finish();
                let r = r.with_context(|| format!("importing {}", p.display()))?;
                if !g.json {
                    println!("{}\t{}", r.root, p.display());
                }
                results.push(json!({"path": p, "root": r.root, "entries": r.size}));
            }
            if g.json {
                println!("{}", serde_json::to_string_pretty(&results)?);
            }
            Ok(0)
        }
        StoreCmd::Ls { digest, path } => {
            let path = path.unwrap_or_default();
            let node = castore::walk::lookup(&store, &digest, &path)?;
            let rows: Vec<(String, Node)> = match &node {
                Node::Directory { digest, .. } => store
                    .get_directory(digest)?
                    .entries()
                    .map(|(n, node)| (n.to_string(), node.clone()))
                    .collect(),
                other => vec![(
                    path.rsplit('/').next().unwrap_or_default().to_owned(),
                    other.clone(),
                )],
            };
            if g.json {
                let v: Vec<_> = rows.iter().map(|(n, node)| node_json(n, node)).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for (n, node) in rows {
                    println!("{}", node_line(&n, &node));
                }
            }
            Ok(0)
        }
        StoreCmd::Cat { digest, path } => match castore::walk::lookup(&store, &digest, &path)? {
            Node::File { digest: d, .. } => {
                let mut r = store.open_blob(&d).map_err(|e| e.at_path(&path))?;
                let mut out = std::io::stdout().lock();
                std::io::copy(&mut r, &mut out).context("writing to stdout")?;
                out.flush()?;
                Ok(0)
            }
            other => Err(Classified(
                ExitClass::Usage,
                format!(
                    "/{path} is {}, not a file; use `fhsx store ls`",
                    other.kind()
                ),
            )
            .into()),
        },
        StoreCmd::Blob { digest } => {
            let mut r = store.open_blob(&digest)?;
            let mut out = std::io::stdout().lock();
            std::io::copy(&mut r, &mut out).context("writing to stdout")?;
            out.flush()?;
            Ok(0)
        }
        StoreCmd::Export { digest, dest } => {
            let bar = Bar::new("exporting");
            let r = castore::export::export(&store, &digest, &dest, &bar);
            bar.finish();
            r?;
            if g.json {
                println!("{}", json!({"root": digest, "dest": dest}));
            }
            Ok(0)
        }
        StoreCmd::Verify { digest } => {
            let bar = Bar::new("verifying");
            let r = castore::verify::verify(&store, digest.as_ref(), &bar);
            bar.finish();
            let report = r?;
            if g.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                for p in &report.problems {
                    println!("{} {}", p.kind, p.object);
                    for u in &p.used_at {
                        println!("    used at {u}");
                    }
                }
                eprintln!(
                    "checked {} blobs ({} bytes) and {} directories: {}",
                    report.blobs_checked,
                    report.bytes_checked,
                    report.directories_checked,
                    if report.is_clean() {
                        "clean".to_owned()
                    } else {
                        format!("{} problems", report.problems.len())
                    }
                );
            }
            Ok(if report.is_clean() {
                0
            } else {
                ExitClass::Integrity.code()
            })
        }
        StoreCmd::Gc { keep } => {
            let r = castore::gc::gc(&store, &keep)?;
            if g.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "kept {} objects; deleted {} blobs and {} directories ({} bytes)",
                    r.kept_objects, r.deleted_blobs, r.deleted_directories, r.freed_bytes
                );
            }
            Ok(0)
        }
    }
}

fn node_line(name: &str, node: &Node) -> String {
    match node {
        Node::Directory { digest, size } => format!("d {size:>12} {digest} {name}/"),
        Node::File {
            digest,
            size,
            executable,
        } => format!(
            "{} {size:>12} {digest} {name}",
            if *executable { 'x' } else { '-' }
        ),
        Node::Symlink { target } => format!("l {:>12} {:67}{name} -> {target}", "", ""),
    }
}

fn node_json(name: &str, node: &Node) -> serde_json::Value {
    match node {
        Node::Directory { digest, size } => {
            json!({"name": name, "type": "directory", "digest": digest, "size": size})
        }
        Node::File {
            digest,
            size,
            executable,
        } => {
            json!({"name": name, "type": "file", "digest": digest, "size": size, "executable": executable})
        }
        Node::Symlink { target } => {
            json!({"name": name, "type": "symlink", "target": target.to_string()})
        }
    }
}
