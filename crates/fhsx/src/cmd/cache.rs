//! `--cache URL` and its companions: a remote cache on an REAPI server
//! (`worker::reapi::cache`), shared by `fhsx build` and the store commands
//! that read outputs. Each flag can come from the environment, so a CI
//! job or a shell profile sets it once.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use fhs_executor::remote::{Remote, RemoteCache};

use crate::exit::Classified;
use executor_core::ExitClass;

#[derive(Args, Debug, Clone, Default)]
pub struct CacheArgs {
    /// A remote cache: an REAPI ActionCache and CAS at `grpc://HOST:PORT`
    /// (`grpcs://` for TLS), such as BuildGrid, bazel-remote or Buildbarn.
    /// A result counts only if its record is signed by a trusted key (this
    /// store's, or --trust); outputs are fetched only when needed.
    #[arg(long, value_name = "URL", env = "FHSX_CACHE")]
    pub cache: Option<String>,
    /// Also upload what this build makes: records, outputs, read sets and
    /// logs (a failed upload is reported; the build stands). Without it
    /// the cache is only read.
    #[arg(long, env = "FHSX_CACHE_PUSH", requires = "cache")]
    pub cache_push: bool,
    /// The cache's REAPI instance name.
    #[arg(
        long,
        value_name = "NAME",
        env = "FHSX_CACHE_INSTANCE",
        default_value = ""
    )]
    pub cache_instance: String,
    /// A file holding the bearer token the cache expects (sent as
    /// `authorization: Bearer TOKEN`).
    #[arg(long, value_name = "FILE", env = "FHSX_CACHE_TOKEN_FILE")]
    pub cache_token_file: Option<PathBuf>,
    /// PEM certificates to trust for a `grpcs://` cache, besides the host's.
    #[arg(long, value_name = "FILE", env = "FHSX_CACHE_CA")]
    pub cache_ca: Option<PathBuf>,
    /// Seconds the cache may take to answer a call (and to connect) before
    /// it is taken as down for the rest of the run and fhsx goes on locally.
    #[arg(
        long,
        value_name = "SECONDS",
        env = "FHSX_CACHE_TIMEOUT",
        default_value_t = 5.0
    )]
    pub cache_timeout: f64,
}

impl CacheArgs {
    /// The remote cache over `store`, if one is configured.
    pub fn open(&self, store: &castore::LocalStore) -> anyhow::Result<Option<Remote>> {
        let Some(url) = &self.cache else {
            return Ok(None);
        };
        let usage = |m: String| anyhow::Error::from(Classified(ExitClass::Usage, m));
        if !(self.cache_timeout > 0.0 && self.cache_timeout <= 3600.0) {
            return Err(usage(format!(
                "--cache-timeout {}: give a number of seconds above 0 and at most 3600",
                self.cache_timeout
            )));
        }
        let token = match &self.cache_token_file {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    usage(format!(
                        "--cache-token-file {}: {e}: give the file holding the cache's token",
                        p.display()
                    ))
                })?;
                Some(text.trim().to_owned())
            }
            None => None,
        };
        let ca = match &self.cache_ca {
            Some(p) => Some(std::fs::read(p).map_err(|e| {
                usage(format!(
                    "--cache-ca {}: {e}: give a PEM file of CA certificates",
                    p.display()
                ))
            })?),
            None => None,
        };
        let config = worker::reapi::cache::CacheConfig {
            url: url.clone(),
            instance: self.cache_instance.clone(),
            token,
            ca,
            timeout: Duration::from_secs_f64(self.cache_timeout),
        };
        let cache =
            worker::reapi::cache::ReapiCache::connect(&config, store.clone()).map_err(usage)?;
        Ok(Some(Remote {
            cache: Arc::new(cache) as Arc<dyn RemoteCache>,
            push: self.cache_push,
        }))
    }
}

/// Bring the tree `digest` into `store` from the remote cache, if it is
/// not here and a cache is configured (what `store export`, `store cat`
/// and `store ls` read). Without a cache, or when the cache cannot give
/// it, the store's own error follows.
pub fn fetch_if_absent(
    args: &CacheArgs,
    store: &castore::LocalStore,
    digest: &castore::Digest,
) -> anyhow::Result<()> {
    if castore::DirectoryStore::has_directory(store, digest)? {
        return Ok(());
    }
    let Some(remote) = args.open(store)? else {
        return Ok(());
    };
    if let Err(e) = remote.cache.fetch_trees(std::slice::from_ref(digest)) {
        eprintln!(
            "fhsx: warning: the remote cache {} could not give {digest}: {e}",
            remote.cache.name()
        );
    }
    Ok(())
}
