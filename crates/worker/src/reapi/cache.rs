//! An REAPI ActionCache and CAS as fhsx's remote cache
//! ([`fhs_executor::remote::RemoteCache`]): any engine or cache server that
//! speaks REAPI v2 with SHA-256 (BuildGrid, bazel-remote, Buildbarn's
//! storage) holds fhsx's results beside Bazel's and BuildStream's.
//!
//! **Keys.** An fhsx key is the SHA-256 of the text
//! `fhsx-action-cache/v1 KIND DIGEST` (`KIND`: `action`, `command` or
//! `tree`; `DIGEST` a BLAKE3 digest, `b3:…`). A Bazel or BuildStream key
//! is the SHA-256 of an encoded `Action` message, and no such encoding
//! starts with the byte `f` (0x66: field 12 with wire type 6, which does
//! not exist), so the two sets of keys can only meet through a SHA-256
//! collision. The key's own text is never needed by a reader.
//!
//! **Values.** An `ActionResult` (exit code 0) whose paths under `fhsx/`
//! carry one or more signed records, newest first, as `fhsx/N/…`:
//! `record.json` and `read-set` (output files whose node property
//! `fhsx-b3` gives the BLAKE3 digest), and per output `NAME` an output
//! directory `outputs/NAME` (its `Tree`, and its root directory for
//! clients that walk) and an output file `outputs/NAME.files`, the map
//! from each file's BLAKE3 digest to its SHA-256 one (lines of `b3hex
//! sha256hex size`). `stdout_digest` and `stderr_digest` are the newest
//! record's logs. An action key holds its one record; a command key the
//! [`CANDIDATES`] newest records of that command (read, prepended to,
//! written: a race loses a candidate, never a result); a tree key holds
//! one output, so an output can be fetched by its digest alone (`fhsx
//! store export` on a machine that never saw its record).
//!
//! **Trust.** None of this is trusted. A record counts only through
//! `fhs_executor::cache` (signature, trusted key, action). An output is
//! fetched by converting its `Tree` with its map into castore directories
//! whose root must be the digest the signed record names — so every
//! file's BLAKE3 digest is the record's before a byte is fetched — then
//! each blob is checked against its SHA-256 on arrival and its BLAKE3
//! before it is committed; the directories are stored last.
//!
//! **Failure.** Every call has a deadline ([`ReapiCache::connect`]'s
//! `timeout`), and a streamed read that goes as long without data, or
//! whose connection breaks, resumes where it stopped (`cas::BlobRead`);
//! a remote that cannot be reached, or misses a deadline, is marked down
//! for the rest of the process, so a dead cache costs one timeout, not
//! one per action.
//!
//! Outputs seen held by a cache (the digests of their `Tree` and map) are
//! a memo of the store's (`remote-held`, per cache address and instance),
//! which makes a later pass a local one; a wrong entry costs a refused
//! fetch, and a gc drops them all (the next pass asks the cache again).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use castore::store::{BlobStore, DirectoryStore, LocalStore, ObjectKind};
use castore::{Digest, Directory, Node};
use fhs_executor::remote::{Key, Records, RemoteCache, RemoteError, Transfer};
use fhs_executor::sign;
use fhs_executor::validate::Listed;
use prost::Message;
use tonic::transport::Channel;

use super::cas::{self, Bearer, Cas, CasError, Transport, Upload};
use super::mapping::{self, sha256_digest};
use super::proto::re;
use bazel_remote_apis::build::bazel::remote::execution::v2::action_cache_client::ActionCacheClient;

/// Records a command key keeps, newest first.
pub const CANDIDATES: usize = 4;

/// The memo (`castore::store::memo`) of outputs a cache was seen holding.
const HELD: &str = "remote-held";

/// How an output file names the BLAKE3 digest of what it holds.
const B3_PROPERTY: &str = "fhsx-b3";

/// Where the cache is and how to talk to it (not `Debug`: it holds a
/// secret).
#[derive(Clone)]
pub struct CacheConfig {
    /// `grpc://HOST:PORT` or `grpcs://HOST:PORT`.
    pub url: String,
    pub instance: String,
    /// `Bearer` token sent with every call.
    pub token: Option<String>,
    /// PEM CA certificates to trust for `grpcs://`, besides the host's.
    pub ca: Option<Vec<u8>>,
    /// Every call's deadline, and the connection's.
    pub timeout: Duration,
}

/// An REAPI server as a remote cache for one local store.
pub struct ReapiCache {
    name: String,
    instance: String,
    rt: tokio::runtime::Runtime,
    cas: Cas,
    ac: ActionCacheClient<Transport>,
    store: LocalStore,
    /// Which cache this is (its address and instance), for the memo.
    id: String,
    /// Set at the first call that could not reach the server.
    down: AtomicBool,
}

/// One record of an `ActionResult`, as its paths describe it.
#[derive(Debug, Default)]
struct Filed {
    record: Option<(re::Digest, Option<Digest>)>,
    read_set: Option<(re::Digest, Option<Digest>)>,
    listings: Option<re::Digest>,
    /// Per output name: its `Tree` and its map.
    outputs: HashMap<String, (Option<re::Digest>, Option<re::Digest>)>,
}

/// An output's `Tree` and map, as held remotely.
#[derive(Debug, Clone, PartialEq)]
struct Held {
    tree: re::Digest,
    files: re::Digest,
}

impl ReapiCache {
    /// The cache at `config.url` for `store`. Nothing is dialled yet: a
    /// cache that is down costs its first call's deadline, not a failed
    /// start.
    pub fn connect(config: &CacheConfig, store: LocalStore) -> Result<ReapiCache, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fhsx-cache")
            .enable_all()
            .build()
            .map_err(|e| format!("starting the cache client's runtime: {e}"))?;
        let (scheme, rest) = config.url.split_once("://").unwrap_or(("", &config.url));
        let tls = match scheme {
            "grpc" | "http" => false,
            "grpcs" | "https" => true,
            _ => {
                return Err(format!(
                    "--cache {}: write the cache's address as grpc://HOST:PORT, or grpcs://HOST:PORT for TLS",
                    config.url
                ))
            }
        };
        let http = format!("{}://{rest}", if tls { "https" } else { "http" });
        let mut ep = tonic::transport::Endpoint::from_shared(http)
            .map_err(|e| format!("--cache {}: not a URL: {e}", config.url))?
            .connect_timeout(config.timeout)
            .timeout(config.timeout)
            .tcp_nodelay(true);
        if tls {
            let mut t = tonic::transport::ClientTlsConfig::new().with_native_roots();
            if let Some(pem) = &config.ca {
                t = t.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            ep = ep
                .tls_config(t)
                .map_err(|e| format!("--cache {}: TLS: {e}", config.url))?;
        }
        let channel: Channel = {
            let _guard = rt.enter();
            ep.connect_lazy()
        };
        let bearer = match &config.token {
            Some(t) => Bearer::new(t).map_err(|e| format!("the cache's token: {e}"))?,
            None => Bearer::default(),
        };
        let limit = crate::MAX_MESSAGE_BYTES;
        let ac = ActionCacheClient::with_interceptor(channel.clone(), bearer.clone())
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        let cas = Cas::with_bearer(channel, bearer, config.instance.clone(), store.clone(), 0)
            .with_stall(config.timeout);
        Ok(ReapiCache {
            name: config.url.clone(),
            instance: config.instance.clone(),
            rt,
            cas,
            ac,
            store,
            id: format!("{}\n{}", config.url, config.instance),
            down: AtomicBool::new(false),
        })
    }

    /// The ActionCache key of `kind` `digest`.
    pub fn key(kind: &str, digest: &Digest) -> re::Digest {
        sha256_digest(format!("fhsx-action-cache/v1 {kind} {digest}").as_bytes())
    }

    fn key_of(key: Key) -> re::Digest {
        match key {
            Key::Action(d) => Self::key("action", &d),
            Key::Command(d) => Self::key("command", &d),
        }
    }

    /// A failure: the server is down for the rest of the process if it
    /// could not be reached.
    fn failed(&self, e: CasError) -> RemoteError {
        match e {
            CasError::Rpc(s) => self.status(s),
            CasError::Refused(r) => RemoteError::Refused(r.message),
            CasError::Store(e) => store_error(e),
            CasError::Other(m) => RemoteError::Refused(m),
        }
    }

    fn status(&self, s: tonic::Status) -> RemoteError {
        use tonic::Code as C;
        match s.code() {
            C::Unavailable | C::DeadlineExceeded | C::Cancelled | C::Unknown => {
                self.down.store(true, Ordering::SeqCst);
                RemoteError::Unavailable(format!(
                    "unreachable ({}); not asked again in this run",
                    flat(&s)
                ))
            }
            C::Unauthenticated | C::PermissionDenied => {
                self.down.store(true, Ordering::SeqCst);
                RemoteError::Unavailable(format!(
                    "it refused our credentials ({}): give the token it expects (--cache-token-file); not asked again in this run",
                    flat(&s)
                ))
            }
            _ => RemoteError::Other(flat(&s)),
        }
    }

    fn live(&self) -> Result<(), RemoteError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(RemoteError::Unavailable(
                "it failed earlier in this run (said above); not asked again".into(),
            ));
        }
        Ok(())
    }

    async fn get(&self, key: &re::Digest) -> Result<Option<re::ActionResult>, RemoteError> {
        let asked = self
            .ac
            .clone()
            .get_action_result(re::GetActionResultRequest {
                instance_name: self.instance.clone(),
                action_digest: Some(key.clone()),
                inline_stdout: false,
                inline_stderr: false,
                inline_output_files: Vec::new(),
                digest_function: re::digest_function::Value::Sha256 as i32,
            })
            .await;
        match asked {
            Ok(r) => Ok(Some(r.into_inner())),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(self.status(s)),
        }
    }

    async fn put(&self, key: re::Digest, result: re::ActionResult) -> Result<(), RemoteError> {
        self.ac
            .clone()
            .update_action_result(re::UpdateActionResultRequest {
                instance_name: self.instance.clone(),
                action_digest: Some(key),
                action_result: Some(result),
                results_cache_policy: None,
                digest_function: re::digest_function::Value::Sha256 as i32,
            })
            .await
            .map(|_| ())
            .map_err(|s| self.status(s))
    }

    // ---- the memo of held outputs ----

    /// The memo key of `output` held by this cache.
    fn held_key(&self, output: &Digest) -> Digest {
        Digest::of(format!("{} {output}", self.id).as_bytes())
    }

    fn held(&self, output: &Digest) -> Option<Held> {
        let text = self.store.recall(HELD, &self.held_key(output))?;
        let text = std::str::from_utf8(&text).ok()?;
        let mut parts = text.split_whitespace().map(parse_digest);
        Some(Held {
            tree: parts.next()??,
            files: parts.next()??,
        })
    }

    /// Remember that the cache holds `output` (a memo: losing it costs a
    /// lookup).
    fn remember(&self, output: &Digest, held: &Held) {
        let text = format!("{} {}\n", show(&held.tree), show(&held.files));
        let _ = self
            .store
            .remember(HELD, &self.held_key(output), text.as_bytes());
    }

    fn forget(&self, output: &Digest) {
        self.store.forget(HELD, &self.held_key(output));
    }

    // ---- reading ----

    /// Fetch what entries list: `keep` (records, read sets) into the
    /// store, each checked against its SHA-256 on arrival, and `loose`
    /// (listings) as bytes, never stored. A BLAKE3 digest an entry claims
    /// is only a hint that the blob is here already: what a record is,
    /// and whether it answers, is decided by its own bytes.
    async fn fetch_listed(
        &self,
        keep: &[(re::Digest, Option<Digest>)],
        loose: &[re::Digest],
    ) -> Result<(Vec<Digest>, Vec<Vec<u8>>), RemoteError> {
        let mut ask: Vec<re::Digest> = loose.to_vec();
        for (sha, b3) in keep {
            if !b3.is_some_and(|b| self.store.has(ObjectKind::Blob, &b)) {
                ask.push(sha.clone());
            }
        }
        let got = match ask.is_empty() {
            true => HashMap::new(),
            false => (self.cas.read_small(&ask).await).map_err(|e| self.failed(e))?,
        };
        let missing =
            |sha: &re::Digest| RemoteError::Refused(format!("blob {} did not arrive", show(sha)));
        let mut kept = Vec::with_capacity(keep.len());
        for (sha, b3) in keep {
            kept.push(match (got.get(sha), b3) {
                (Some(bytes), _) => self.store.put_blob(bytes).map_err(store_error)?,
                (None, Some(b)) => *b,
                (None, None) => return Err(missing(sha)),
            });
        }
        let loose = (loose.iter())
            .map(|sha| got.get(sha).cloned().ok_or_else(|| missing(sha)))
            .collect::<Result<_, _>>()?;
        Ok((kept, loose))
    }

    async fn records_async(&self, key: Key) -> Result<Records, RemoteError> {
        self.live()?;
        let mut found = Records::default();
        let Some(result) = self.get(&Self::key_of(key)).await? else {
            return Ok(found);
        };
        let entries: Vec<Filed> = listing(&result)
            .into_iter()
            .filter(|l| l.record.is_some())
            .collect();
        let validating = matches!(key, Key::Command(_));
        let mut keep = Vec::new();
        let mut loose = Vec::new();
        for l in &entries {
            keep.extend(l.record.clone());
            if validating {
                keep.extend(l.read_set.clone());
                loose.extend(l.listings.clone());
            }
        }
        let (kept, listings) = self.fetch_listed(&keep, &loose).await?;
        for bytes in &listings {
            found.listed.extend(decode_listings(bytes)?);
        }
        let mut kept = kept.into_iter();
        for l in &entries {
            let Some(record) = kept.next() else { break };
            if validating && l.read_set.is_some() {
                kept.next();
            }
            // The outputs the record names are held where the entry says
            // (a lie costs a refused fetch: the record's digests decide).
            if let Ok(rec) = sign::load_record(&self.store, &record) {
                for (name, out) in &rec.record.outputs {
                    if let Some((Some(tree), Some(files))) = l.outputs.get(name.as_str()) {
                        let held = Held {
                            tree: tree.clone(),
                            files: files.clone(),
                        };
                        self.remember(out, &held);
                    }
                }
            }
            found.records.push(record);
        }
        Ok(found)
    }

    /// The listings of the record whose read set is `read_set`: every
    /// directory its build listed, as it was, one length-prefixed encoding
    /// after another (what [`decode_listings`] reads); `None` if it listed
    /// none, or its read set is not here.
    fn listings_of(&self, read_set: &Digest) -> Result<Option<Vec<u8>>, RemoteError> {
        use castore_fuse::{Access, EntryKind};
        let Ok(rs) = castore_fuse::ReadSet::load(&self.store, read_set) else {
            return Ok(None);
        };
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for e in &rs.entries {
            let (EntryKind::Dir, Access::Read, Some(d)) = (e.kind, e.access, e.digest) else {
                continue;
            };
            if seen.insert(d) {
                let enc = self.store.get_directory(&d).map_err(store_error)?.encode();
                out.extend_from_slice(&(enc.len() as u32).to_be_bytes());
                out.extend_from_slice(&enc);
            }
        }
        Ok((!out.is_empty()).then_some(out))
    }

    /// Where `output` is held: the memo, else its tree key.
    async fn find_held(&self, output: &Digest) -> Result<Option<Held>, RemoteError> {
        if let Some(h) = self.held(output) {
            return Ok(Some(h));
        }
        let Some(result) = self.get(&Self::key("tree", output)).await? else {
            return Ok(None);
        };
        let found = listing(&result)
            .into_iter()
            .next()
            .and_then(|l| l.outputs.into_values().next())
            .and_then(|(t, f)| {
                Some(Held {
                    tree: t?,
                    files: f?,
                })
            });
        if let Some(h) = &found {
            self.remember(output, h);
        }
        Ok(found)
    }

    async fn fetch_tree(&self, output: &Digest) -> Result<Transfer, RemoteError> {
        let mut sent = Transfer::default();
        let Some(held) = self.find_held(output).await? else {
            return Err(RemoteError::Refused(format!("it does not hold {output}")));
        };
        let got = self
            .cas
            .read_small(&[held.tree.clone(), held.files.clone()])
            .await
            .map_err(|e| self.failed(e))?;
        sent.objects += got.len() as u64;
        sent.bytes += got.values().map(|b| b.len() as u64).sum::<u64>();
        let refused = |m: String| RemoteError::Refused(format!("output {output}: {m}"));
        let tree = got
            .get(&held.tree)
            .ok_or_else(|| refused("its tree did not arrive".into()))
            .and_then(|b| {
                re::Tree::decode(&b[..])
                    .map_err(|e| refused(format!("its tree does not decode: {e}")))
            })?;
        let files = got
            .get(&held.files)
            .ok_or_else(|| refused("its file map did not arrive".into()))
            .and_then(|b| parse_files(b).map_err(refused))?;
        // The castore tree, checked against the record before any file.
        let (dirs, blobs) = castore_tree(&tree, &files, output).map_err(|m| {
            self.forget(output);
            refused(m)
        })?;
        let missing: Vec<(re::Digest, Digest)> = blobs
            .into_iter()
            .filter(|(_, b3)| !self.store.has(ObjectKind::Blob, b3))
            .collect();
        let fetched = self.cas.fetch_expecting(missing).await.map_err(|e| {
            if matches!(e, CasError::Refused(_) | CasError::Other(_)) {
                self.forget(output);
            }
            self.failed(e)
        })?;
        sent.objects += fetched.blobs;
        sent.bytes += fetched.bytes;
        let store = self.store.clone();
        let put = move || -> Result<(), castore::Error> {
            let txn = store.txn()?;
            for d in &dirs {
                txn.put_directory(d)?;
            }
            txn.commit()
        };
        put().map_err(store_error)?;
        Ok(sent)
    }

    // ---- writing ----

    /// What to upload for `output` and how its entry lists it.
    fn output_upload(
        &self,
        output: &Digest,
        shas: &HashMap<Digest, re::Digest>,
        dirs: &HashMap<Digest, Directory>,
        blobs: &[Digest],
        uploads: &mut Vec<Upload>,
    ) -> Result<Held, RemoteError> {
        let t = mapping::tree(output, dirs, shas).map_err(|r| RemoteError::Other(r.message))?;
        let mut map = String::new();
        for b in blobs {
            let sha = &shas[b];
            map.push_str(&format!("{} {} {}\n", b.hex(), sha.hash, sha.size_bytes));
        }
        let files = sha256_digest(map.as_bytes());
        uploads.push(Upload::Bytes(files.clone(), map.into_bytes()));
        uploads.push(Upload::Bytes(t.digest.clone(), t.bytes));
        uploads.extend(t.directories.into_iter().map(|(d, b)| Upload::Bytes(d, b)));
        uploads.extend(blobs.iter().map(|b| Upload::Stored(*b)));
        Ok(Held {
            tree: t.digest,
            files,
        })
    }

    async fn push_async(
        &self,
        record: &Digest,
        command: Option<&Digest>,
    ) -> Result<Transfer, RemoteError> {
        self.live()?;
        let signed = sign::load_record(&self.store, record)
            .map_err(|e| RemoteError::Other(castore::Chain(&e).to_string()))?;
        let r = &signed.record;
        let mut uploads = vec![Upload::Stored(*record)];
        let listings = self.listings_of(&r.observed_read_set_digest)?.map(|bytes| {
            let sha = sha256_digest(&bytes);
            uploads.push(Upload::Bytes(sha.clone(), bytes));
            sha
        });
        let mut named: Vec<Digest> = r.kept_blobs();
        named.retain(|d| self.store.has(ObjectKind::Blob, d));
        uploads.extend(named.iter().map(|d| Upload::Stored(*d)));
        // Each output's directories and files.
        let mut trees = Vec::new();
        let mut all_blobs: Vec<Digest> = vec![*record];
        all_blobs.extend(&named);
        for (name, out) in &r.outputs {
            let (dirs, blobs) = cas::subtree(&self.store, out).map_err(|e| self.failed(e))?;
            all_blobs.extend(&blobs);
            trees.push((name.as_str().to_owned(), *out, dirs, blobs));
        }
        let shas = self
            .cas
            .sha_of_blobs(all_blobs)
            .await
            .map_err(|e| self.failed(e))?;
        let mut listed_outputs = Vec::new();
        for (name, out, dirs, blobs) in &trees {
            let held = self.output_upload(out, &shas, dirs, blobs, &mut uploads)?;
            listed_outputs.push((name.clone(), *out, held));
        }
        let sent = self.cas.upload(uploads).await.map_err(|e| self.failed(e))?;
        // The entries: the action's, each output's, the command's.
        let entry = Entry {
            record: Some((shas[record].clone(), *record)),
            read_set: shas
                .get(&r.observed_read_set_digest)
                .map(|s| (s.clone(), r.observed_read_set_digest)),
            listings,
            outputs: listed_outputs
                .iter()
                .map(|(n, _, h)| (n.clone(), h.clone()))
                .collect(),
            stdout: shas.get(&r.log_digest).cloned(),
            stderr: r.stderr_digest.and_then(|d| shas.get(&d).cloned()),
        };
        self.put(
            Self::key("action", &r.action_digest),
            result_of(std::slice::from_ref(&entry)),
        )
        .await?;
        for (name, out, held) in &listed_outputs {
            let one = Entry {
                outputs: vec![(name.clone(), held.clone())],
                ..Entry::default()
            };
            self.put(Self::key("tree", out), result_of(&[one])).await?;
            self.remember(out, held);
        }
        if let Some(command) = command {
            self.push_candidate(command, entry).await?;
        }
        Ok(Transfer {
            objects: sent.blobs,
            bytes: sent.bytes,
        })
    }

    /// Prepend `entry` to the command's candidates (at most [`CANDIDATES`]).
    async fn push_candidate(&self, command: &Digest, entry: Entry) -> Result<(), RemoteError> {
        let key = Self::key("command", command);
        let mut entries = vec![entry];
        if let Some(old) = self.get(&key).await? {
            for l in listing(&old) {
                let (Some(record), Some(read_set)) = (l.record, l.read_set) else {
                    continue;
                };
                let (Some(rb3), Some(sb3)) = (record.1, read_set.1) else {
                    continue;
                };
                if entries[0].record.as_ref().is_some_and(|(_, b)| *b == rb3) {
                    continue;
                }
                entries.push(Entry {
                    record: Some((record.0, rb3)),
                    read_set: Some((read_set.0, sb3)),
                    listings: l.listings,
                    outputs: l
                        .outputs
                        .into_iter()
                        .filter_map(|(n, (t, f))| {
                            Some((
                                n,
                                Held {
                                    tree: t?,
                                    files: f?,
                                },
                            ))
                        })
                        .collect(),
                    stdout: None,
                    stderr: None,
                });
                if entries.len() == CANDIDATES {
                    break;
                }
            }
        }
        self.put(key, result_of(&entries)).await
    }
}

impl RemoteCache for ReapiCache {
    fn name(&self) -> &str {
        &self.name
    }

    fn records(&self, key: Key) -> Result<Records, RemoteError> {
        self.rt.block_on(self.records_async(key))
    }

    fn holds(&self, output: &Digest) -> bool {
        self.held(output).is_some()
    }

    fn fetch_trees(&self, outputs: &[Digest]) -> Result<Transfer, RemoteError> {
        self.live()?;
        // Each one tried: one the cache lacks (a toolchain never pushed)
        // does not keep the others from coming.
        let mut sent = Transfer::default();
        let mut failed = None;
        for o in outputs {
            match self.rt.block_on(self.fetch_tree(o)) {
                Ok(t) => sent += t,
                Err(e) => {
                    let down = matches!(e, RemoteError::Unavailable(_));
                    failed.get_or_insert(e);
                    if down {
                        break;
                    }
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(sent),
        }
    }

    fn push(&self, record: &Digest, command: Option<&Digest>) -> Result<Transfer, RemoteError> {
        self.rt.block_on(self.push_async(record, command))
    }
}

/// One record as an entry lists it.
#[derive(Debug, Clone, Default)]
struct Entry {
    record: Option<(re::Digest, Digest)>,
    read_set: Option<(re::Digest, Digest)>,
    /// The directories of the record's view its build listed (what
    /// validating its read set elsewhere compares with).
    listings: Option<re::Digest>,
    outputs: Vec<(String, Held)>,
    stdout: Option<re::Digest>,
    stderr: Option<re::Digest>,
}

fn with_b3(path: String, sha: &re::Digest, b3: &Digest) -> re::OutputFile {
    re::OutputFile {
        path,
        digest: Some(sha.clone()),
        is_executable: false,
        contents: Vec::new(),
        node_properties: Some(re::NodeProperties {
            properties: vec![re::NodeProperty {
                name: B3_PROPERTY.into(),
                value: b3.to_string(),
            }],
            mtime: None,
            unix_mode: None,
        }),
    }
}

/// The `ActionResult` listing `entries`, newest first.
fn result_of(entries: &[Entry]) -> re::ActionResult {
    let mut r = re::ActionResult::default();
    for (i, e) in entries.iter().enumerate() {
        if let Some((sha, b3)) = &e.record {
            r.output_files
                .push(with_b3(format!("fhsx/{i}/record.json"), sha, b3));
        }
        if let Some((sha, b3)) = &e.read_set {
            r.output_files
                .push(with_b3(format!("fhsx/{i}/read-set"), sha, b3));
        }
        if let Some(sha) = &e.listings {
            r.output_files.push(re::OutputFile {
                path: format!("fhsx/{i}/listings"),
                digest: Some(sha.clone()),
                ..Default::default()
            });
        }
        for (name, held) in &e.outputs {
            r.output_directories.push(re::OutputDirectory {
                path: format!("fhsx/{i}/outputs/{name}"),
                tree_digest: Some(held.tree.clone()),
                is_topologically_sorted: false,
                root_directory_digest: None,
            });
            r.output_files.push(re::OutputFile {
                path: format!("fhsx/{i}/outputs/{name}.files"),
                digest: Some(held.files.clone()),
                ..Default::default()
            });
        }
    }
    if let Some(e) = entries.first() {
        r.stdout_digest = e.stdout.clone();
        r.stderr_digest = e.stderr.clone();
    }
    r.output_files.sort_by(|a, b| a.path.cmp(&b.path));
    r.output_directories.sort_by(|a, b| a.path.cmp(&b.path));
    r
}

/// The records an `ActionResult` lists, in order; what is not fhsx's is
/// ignored.
fn listing(r: &re::ActionResult) -> Vec<Filed> {
    let mut by: std::collections::BTreeMap<usize, Filed> = Default::default();
    let split = |path: &str| -> Option<(usize, String)> {
        let rest = path.strip_prefix("fhsx/")?;
        let (i, tail) = rest.split_once('/')?;
        Some((i.parse().ok().filter(|i| *i < 64)?, tail.to_owned()))
    };
    for f in &r.output_files {
        let (Some((i, tail)), Some(d)) = (split(&f.path), well_formed(&f.digest)) else {
            continue;
        };
        let b3 = (f.node_properties.iter())
            .flat_map(|p| &p.properties)
            .find(|p| p.name == B3_PROPERTY)
            .and_then(|p| p.value.parse::<Digest>().ok());
        let l = by.entry(i).or_default();
        match tail.as_str() {
            "record.json" => l.record = Some((d, b3)),
            "read-set" => l.read_set = Some((d, b3)),
            "listings" => l.listings = Some(d),
            t => {
                if let Some(name) = t
                    .strip_prefix("outputs/")
                    .and_then(|n| n.strip_suffix(".files"))
                {
                    l.outputs.entry(name.to_owned()).or_default().1 = Some(d);
                }
            }
        }
    }
    for o in &r.output_directories {
        let (Some((i, tail)), Some(d)) = (split(&o.path), well_formed(&o.tree_digest)) else {
            continue;
        };
        if let Some(name) = tail.strip_prefix("outputs/") {
            by.entry(i)
                .or_default()
                .outputs
                .entry(name.to_owned())
                .or_default()
                .0 = Some(d);
        }
    }
    by.into_values().collect()
}

/// The directories a listings blob carries, each under the digest of its
/// own encoding (so none can be what it is not); a malformed blob is
/// refused. Bounded by the blob, which no read takes past
/// `MAX_MESSAGE_BYTES`.
fn decode_listings(bytes: &[u8]) -> Result<Listed, RemoteError> {
    let bad = || RemoteError::Refused("its listings are malformed".into());
    let mut rest = bytes;
    let mut dirs = Listed::new();
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(bad)?;
        let len = u32::from_be_bytes(*len) as usize;
        if len > tail.len() {
            return Err(bad());
        }
        let (one, tail) = tail.split_at(len);
        let dir = Directory::decode(one).map_err(|_| bad())?;
        dirs.insert(dir.digest(), dir);
        rest = tail;
    }
    Ok(dirs)
}

fn store_error(e: castore::Error) -> RemoteError {
    RemoteError::Other(castore::Chain(&e).to_string())
}

/// A digest an entry names, if it is one (a server's other strings are
/// never used, nor shown).
fn well_formed(d: &Option<re::Digest>) -> Option<re::Digest> {
    d.clone().filter(|d| mapping::check_digest("", d).is_ok())
}

/// A file map: each BLAKE3 digest's SHA-256 one.
fn parse_files(bytes: &[u8]) -> Result<HashMap<re::Digest, Digest>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "its file map is not text".to_owned())?;
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut f = line.split(' ');
        let parsed = (|| {
            let b3: Digest = format!("b3:{}", f.next()?).parse().ok()?;
            let hash = f.next()?.to_owned();
            let size: i64 = f.next()?.parse().ok()?;
            let sha = re::Digest {
                hash,
                size_bytes: size,
            };
            mapping::check_digest("", &sha).ok()?;
            Some((sha, b3))
        })();
        let (sha, b3) = parsed.ok_or_else(|| "its file map has a malformed line".to_owned())?;
        out.insert(sha, b3);
    }
    Ok(out)
}

/// The castore directories of `tree` (children before parents) and every
/// file as (SHA-256, BLAKE3), if its root is `expected`; else why not.
#[allow(clippy::type_complexity)]
fn castore_tree(
    tree: &re::Tree,
    files: &HashMap<re::Digest, Digest>,
    expected: &Digest,
) -> Result<(Vec<Directory>, Vec<(re::Digest, Digest)>), String> {
    let root = tree.root.clone().ok_or("its tree has no root")?;
    let mut by_digest: HashMap<re::Digest, re::Directory> = HashMap::new();
    for c in &tree.children {
        by_digest.insert(sha256_digest(&c.encode_to_vec()), c.clone());
    }
    let root_digest = sha256_digest(&root.encode_to_vec());
    by_digest.insert(root_digest.clone(), root);
    // Children before parents, without recursion.
    let mut done: HashMap<re::Digest, (Digest, u64)> = HashMap::new();
    let mut order = Vec::new();
    let mut stack = vec![(root_digest.clone(), false)];
    let mut seen = HashSet::new();
    while let Some((d, expanded)) = stack.pop() {
        let dir = by_digest
            .get(&d)
            .ok_or("its tree lacks a directory it names")?;
        if expanded {
            let c = mapping::castore_directory(dir, &done, files).map_err(|r| r.message)?;
            done.insert(d, (c.digest(), c.size()));
            order.push(c);
            continue;
        }
        if !seen.insert(d.clone()) {
            continue;
        }
        stack.push((d, true));
        for c in &dir.directories {
            let cd = c.digest.clone().ok_or("a directory without a digest")?;
            if !done.contains_key(&cd) {
                stack.push((cd, false));
            }
        }
    }
    let got = done
        .get(&root_digest)
        .map(|(d, _)| *d)
        .ok_or("its tree did not convert")?;
    if got != *expected {
        return Err(format!(
            "the tree the cache holds for it is {got}: not the record's output; refused"
        ));
    }
    let mut blobs = Vec::new();
    for dir in &order {
        for (_, n) in dir.entries() {
            if let Node::File { digest, .. } = n {
                blobs.push(*digest);
            }
        }
    }
    let by_b3: HashMap<Digest, re::Digest> = files.iter().map(|(s, b)| (*b, s.clone())).collect();
    blobs.sort();
    blobs.dedup();
    let pairs = blobs
        .into_iter()
        .filter_map(|b| Some((by_b3.get(&b)?.clone(), b)))
        .collect();
    Ok((order, pairs))
}

fn show(d: &re::Digest) -> String {
    format!("{}/{}", d.hash, d.size_bytes)
}

fn parse_digest(s: &str) -> Option<re::Digest> {
    let (hash, size) = s.split_once('/')?;
    Some(re::Digest {
        hash: hash.to_owned(),
        size_bytes: size.parse().ok()?,
    })
}

/// A status on one line, its message escaped (a server's words).
fn flat(s: &tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message().escape_debug())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_not_encoded_actions_and_differ_by_kind() {
        let d = Digest::of(b"x");
        let a = ReapiCache::key("action", &d);
        let c = ReapiCache::key("command", &d);
        assert_ne!(a, c);
        // What is hashed never decodes as an Action: its first byte, 'f',
        // is field 12 with the wire type 6, which does not exist.
        let text = format!("fhsx-action-cache/v1 action {d}");
        assert!(re::Action::decode(text.as_bytes()).is_err());
        assert_eq!(a.size_bytes as usize, text.len());
    }

    #[test]
    fn a_listing_reads_back_what_was_written() {
        let sha = |s: &str| sha256_digest(s.as_bytes());
        let e = Entry {
            record: Some((sha("r"), Digest::of(b"r"))),
            read_set: Some((sha("s"), Digest::of(b"s"))),
            listings: None,
            outputs: vec![(
                "out".into(),
                Held {
                    tree: sha("t"),
                    files: sha("f"),
                },
            )],
            stdout: None,
            stderr: None,
        };
        let two = Entry {
            record: Some((sha("r2"), Digest::of(b"r2"))),
            ..e.clone()
        };
        let l = listing(&result_of(&[e, two]));
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].record, Some((sha("r"), Some(Digest::of(b"r")))));
        assert_eq!(l[1].record, Some((sha("r2"), Some(Digest::of(b"r2")))));
        assert_eq!(l[0].outputs["out"], (Some(sha("t")), Some(sha("f"))));
    }

    #[test]
    fn a_tree_that_is_not_the_records_is_refused() {
        let store_dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(store_dir.path()).unwrap();
        let blob = store.put_blob(b"hello\n").unwrap();
        let sha = sha256_digest(b"hello\n");
        let mut dir = Directory::new();
        dir.insert(
            castore::Name::new(b"f").unwrap(),
            Node::File {
                digest: blob,
                size: 6,
                executable: false,
            },
        )
        .unwrap();
        let root = store.put_directory(&dir).unwrap();
        let dirs: HashMap<Digest, Directory> = [(root, dir)].into();
        let shas: HashMap<Digest, re::Digest> = [(blob, sha.clone())].into();
        let t = mapping::tree(&root, &dirs, &shas).unwrap();
        let tree = re::Tree::decode(&t.bytes[..]).unwrap();
        let files: HashMap<re::Digest, Digest> = [(sha.clone(), blob)].into();
        let (order, pairs) = castore_tree(&tree, &files, &root).unwrap();
        assert_eq!(order.len(), 1);
        assert_eq!(pairs, vec![(sha.clone(), blob)]);
        // A map that names another file for the same SHA-256.
        let lie: HashMap<re::Digest, Digest> = [(sha, Digest::of(b"other"))].into();
        let e = castore_tree(&tree, &lie, &root).unwrap_err();
        assert!(e.contains("not the record's output"), "{e}");
    }
}
