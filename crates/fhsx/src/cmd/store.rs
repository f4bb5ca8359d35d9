//! `fhsx store …`: import, inspect, export, verify, collect and copy the store.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::{Digest, Node};
use clap::Subcommand;
use serde_json::json;

use super::cache::{fetch_if_absent, CacheArgs};
use super::Globals;
use crate::exit::Classified;
use crate::progress::Bar;
use executor_core::ExitClass;

#[derive(Subcommand, Debug)]
#[command(defer = true)]
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
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Write a file of a stored tree to stdout (verified before the first byte).
    Cat {
        digest: Digest,
        path: String,
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Write a blob (a build log, a read set, a record) to stdout, verified.
    Blob { digest: Digest },
    /// Write a stored tree out to a new directory (with --cache, one the
    /// store lacks is fetched from the remote cache first).
    Export {
        digest: Digest,
        dest: PathBuf,
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Re-hash the whole store, or one tree, and report every corrupt or missing object by path.
    Verify { digest: Option<Digest> },
    /// Delete everything not reachable from a root: the persistent roots
    /// (`fhsx store root`), every running fhsx's temporary roots, and --keep.
    Gc {
        /// Extra roots for this collection only.
        #[arg(long, num_args = 1..)]
        keep: Vec<Digest>,
        /// Collect even when the store has no persistent root and no --keep
        /// is given (everything not held by a running process is deleted).
        #[arg(long)]
        no_roots_ok: bool,
    },
    /// Persistent gc roots: what `fhsx store gc` keeps.
    #[command(subcommand)]
    Root(RootCmd),
    /// Copy records with everything they name (output trees whole; log,
    /// stderr, read set, manifest, fetch lock, action and linked records
    /// where the source has them) to another store or a bundle file, or
    /// receive them into this store.
    #[command(after_long_help = COPY_HELP)]
    Copy(CopyArgs),
}

const COPY_HELP: &str = "\
DEST and SRC are a store's directory (DEST is made if absent), or file:PATH for a bundle: one file \
holding records and their objects, to carry to a machine no store can reach.

  fhsx store copy --to file:hello.bundle b3:…                  write a bundle of one record
  fhsx store copy --from file:hello.bundle --trust ed25519:…   receive it (on the other machine)
  fhsx store copy --to /mnt/store --trust ed25519:… b3:…       copy into another store

The receiving store takes a record only if it is signed by its own key or a --trust'ed one, every \
object hashes to its digest, and every output is whole; else nothing is written. Objects it has \
already are not copied again. A build there answers from the record when it trusts the signer \
(`fhsx build --trust KEY`). The bundle format (`fhsx-bundle 1`: a header line, then framed objects) \
is described in crates/fhs-executor/src/copy/bundle.rs.";

#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// Copy from this store (--store) to DEST: a store's directory, or file:PATH for a bundle.
    #[arg(
        long,
        value_name = "DEST",
        conflicts_with = "from",
        required_unless_present = "from"
    )]
    to: Option<String>,
    /// Receive into this store (--store) from SRC: a store's directory, or file:PATH for a bundle.
    #[arg(long, value_name = "SRC")]
    from: Option<String>,
    /// Accept records signed by this key (`ed25519:<hex>`, as `fhsx key show` prints it), besides
    /// the receiving store's own. Repeatable.
    #[arg(long, value_name = "KEY")]
    trust: Vec<String>,
    /// Record digests. Required with --to and with a store as SRC; from a bundle every record in
    /// it is received, and each RECORD named must be among them.
    #[arg(value_name = "RECORD")]
    records: Vec<Digest>,
}

/// Where `--to`/`--from` point.
enum Place {
    Store(PathBuf),
    Bundle(PathBuf),
}

impl Place {
    fn parse(s: &str) -> anyhow::Result<Place> {
        let (place, path) = match s.strip_prefix("file:") {
            Some(p) => (Place::Bundle(PathBuf::from(p)), p),
            None => (Place::Store(PathBuf::from(s)), s),
        };
        if path.is_empty() {
            return Err(Classified(
                ExitClass::Usage,
                "give a path: a store's directory, or file:PATH for a bundle".into(),
            )
            .into());
        }
        Ok(place)
    }
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum RootCmd {
    /// Keep what each TARGET names until the root is removed: a digest (a
    /// tree, a composed view, a blob), a toolchain file (its atoms), or an
    /// action's output `FILE#NAME` (built, or taken from the cache, first).
    Add {
        #[arg(required = true, value_name = "TARGET")]
        targets: Vec<String>,
        /// The root's name (default: the first digest's hex).
        #[arg(long)]
        name: Option<String>,
    },
    /// List the persistent roots: NAME and the digests each keeps.
    List,
    /// Remove the roots named NAME (--name) or keeping DIGEST.
    Remove {
        digest: Option<Digest>,
        #[arg(long)]
        name: Option<String>,
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
        StoreCmd::Ls {
            digest,
            path,
            cache,
        } => {
            fetch_if_absent(&cache, &store, &digest)?;
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
        StoreCmd::Cat {
            digest,
            path,
            cache,
        } => match fetch_if_absent(&cache, &store, &digest)
            .and_then(|()| Ok(castore::walk::lookup(&store, &digest, &path)?))?
        {
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
        StoreCmd::Export {
            digest,
            dest,
            cache,
        } => {
            fetch_if_absent(&cache, &store, &digest)?;
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
        StoreCmd::Gc { keep, no_roots_ok } => {
            if keep.is_empty() && !no_roots_ok && store.roots()?.is_empty() {
                return Err(Classified(
                    ExitClass::Usage,
                    "the store has no persistent roots and no --keep was given: gc would delete \
                     everything not held by a running fhsx; add roots with `fhsx store root add`, \
                     pass --keep, or pass --no-roots-ok"
                        .into(),
                )
                .into());
            }
            let r = fhs_executor::cache::gc(&store, &keep)?;
            if g.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "kept {} objects ({} persistent and {} temporary root digests); deleted {} blobs and {} directories ({} bytes)",
                    r.kept_objects,
                    r.persistent_roots,
                    r.temp_roots,
                    r.deleted_blobs,
                    r.deleted_directories,
                    r.freed_bytes
                );
            }
            Ok(0)
        }
        StoreCmd::Root(cmd) => root(g, &store, cmd),
        StoreCmd::Copy(args) => copy(g, &store, args),
    }
}

fn copy(g: &Globals, store: &LocalStore, a: CopyArgs) -> anyhow::Result<i32> {
    use fhs_executor::copy;
    let usage = |m: &str| anyhow::Error::from(Classified(ExitClass::Usage, m.to_owned()));
    let (moved, place) = match (&a.to, &a.from) {
        (Some(to), None) => {
            if a.records.is_empty() {
                return Err(usage("name the records to copy (RECORD…, `b3:…`)"));
            }
            let moved = match Place::parse(to)? {
                Place::Bundle(path) => {
                    if !a.trust.is_empty() {
                        return Err(usage(
                            "--trust is for the receiving side: a bundle is checked when it is received (`fhsx store copy --from file:PATH --trust KEY` there)",
                        ));
                    }
                    copy::to_bundle(store, &a.records, &path)?
                }
                Place::Store(dir) => {
                    let dest = copy::open_receiving_store(&dir)?;
                    copy::to_store(store, &dest, &a.records, &a.trust)?
                }
            };
            (moved, format!("to {to}"))
        }
        (None, Some(from)) => {
            let moved = match Place::parse(from)? {
                Place::Bundle(path) => copy::from_bundle(&path, store, &a.records, &a.trust)?,
                Place::Store(dir) => {
                    if a.records.is_empty() {
                        return Err(usage(
                            "name the records to copy from a store (RECORD…, `b3:…`)",
                        ));
                    }
                    let source = copy::open_source_store(&dir)?;
                    copy::to_store(&source, store, &a.records, &a.trust)?
                }
            };
            (moved, format!("from {from}"))
        }
        _ => return Err(usage("give --to DEST or --from SRC")),
    };
    if g.json {
        println!("{}", serde_json::to_string_pretty(&moved)?);
    } else {
        let n = moved.records.len();
        println!(
            "copied {n} record{} {}: {} objects, {} bytes{}",
            if n == 1 { "" } else { "s" },
            castore::shown::escaped(place.as_bytes()),
            moved.objects,
            moved.bytes,
            if moved.present > 0 {
                format!(" ({} objects already there)", moved.present)
            } else {
                String::new()
            }
        );
    }
    Ok(0)
}

/// The digests a `store root add` target names.
fn root_target(g: &Globals, t: &str) -> anyhow::Result<Vec<Digest>> {
    if let Ok(d) = t.parse::<Digest>() {
        return Ok(vec![d]);
    }
    if t.ends_with(".toolchain") {
        let tc = debian::Toolchain::read(std::path::Path::new(t))
            .map_err(|e| Classified(ExitClass::Usage, castore::Chain(&e).to_string()))?;
        return Ok(tc.atoms());
    }
    if let Some((file, output)) = t.rsplit_once('#') {
        let outputs = super::build::outputs_of(g, std::path::Path::new(file))?;
        return outputs
            .iter()
            .find(|(n, _)| n.as_str() == output)
            .map(|(_, d)| vec![*d])
            .ok_or_else(|| {
                Classified(
                    ExitClass::Usage,
                    format!(
                        "{file} has no output {output:?} (it declares {})",
                        outputs
                            .keys()
                            .map(|k| k.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
                .into()
            });
    }
    Err(Classified(
        ExitClass::Usage,
        format!("{t:?} is not a digest, a toolchain file (.toolchain) or an action's output (FILE#NAME)"),
    )
    .into())
}

fn root(g: &Globals, store: &LocalStore, cmd: RootCmd) -> anyhow::Result<i32> {
    match cmd {
        RootCmd::Add { targets, name } => {
            let mut digests = Vec::new();
            for t in &targets {
                digests.extend(root_target(g, t)?);
            }
            let name = name.unwrap_or_else(|| digests[0].hex());
            store
                .add_root(&name, &digests)
                .with_context(|| format!("adding the root {name}"))?;
            if g.json {
                println!("{}", json!({"name": name, "digests": digests}));
            } else {
                println!("{name}");
            }
            Ok(0)
        }
        RootCmd::List => {
            let roots = store.roots()?;
            if g.json {
                println!("{}", serde_json::to_string_pretty(&roots)?);
            } else {
                for r in &roots {
                    for d in &r.digests {
                        println!("{}\t{d}", r.name);
                    }
                }
            }
            Ok(0)
        }
        RootCmd::Remove { digest, name } => {
            let names: Vec<String> = match (&digest, &name) {
                (None, Some(n)) => vec![n.clone()],
                (Some(d), None) => store
                    .roots()?
                    .into_iter()
                    .filter(|r| r.digests.contains(d))
                    .map(|r| r.name)
                    .collect(),
                _ => {
                    return Err(Classified(
                        ExitClass::Usage,
                        "give either a DIGEST or --name NAME".into(),
                    )
                    .into())
                }
            };
            let mut removed = Vec::new();
            for n in names {
                if store.remove_root(&n)? {
                    removed.push(n);
                }
            }
            if removed.is_empty() {
                return Err(Classified(ExitClass::Usage, "no such root".into()).into());
            }
            if g.json {
                println!("{}", json!({"removed": removed}));
            } else {
                for n in &removed {
                    println!("{n}");
                }
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
