//! `fhsx run`: contain an arbitrary command over a workspace, on the host's
//! own toolchain (read-only), with no network and a whitelisted environment.
//!
//! With `--view VIEW` the root is that view instead of the host: its
//! Fast-tier tree (a read-only hard-link farm, kept per store and reused,
//! see `castore::tier::fast`), with the workspace at /build — for trying
//! what a build produced without FUSE or a copy.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use executor_core::SandboxError;
use executor_sandbox::{current_host_env, Outcome, RunOptions, Runtime};

use super::Globals;

/// Variables `fhsx run` sets unless `--set-env` overrides them.
const DEFAULT_SET: &[(&str, &str)] = &[("PATH", "/usr/local/bin:/usr/bin:/bin"), ("HOME", "/tmp")];
/// Variables `fhsx run` lets through by default (if the host has them).
const DEFAULT_ALLOW: &[&str] = &["TERM"];

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The directory the command may write; it appears at /workspace (at /build with --view) (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Run on this view (a tree's root digest) as the root filesystem, materialized at the Fast tier, instead of the host's toolchain.
    #[arg(long, value_name = "VIEW")]
    pub view: Option<castore::Digest>,
    /// Let this host environment variable through if set (repeatable). TERM passes by default.
    #[arg(long = "allow-env", value_name = "NAME")]
    pub allow_env: Vec<String>,
    /// Set a variable inside (repeatable). PATH and HOME=/tmp are set by default.
    #[arg(long = "set-env", value_name = "K=V")]
    pub set_env: Vec<String>,
    /// Mask one more in-sandbox path (repeatable): an empty read-only directory, or /dev/null.
    #[arg(long, value_name = "PATH")]
    pub mask: Vec<PathBuf>,
    /// Wall-clock limit such as 90s, 20m or 1h; then SIGTERM, and SIGKILL 5 s later.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Print the exact bwrap argv, one argument per line, and exit without running.
    #[arg(long)]
    pub print_argv: bool,
    /// With --print-argv: also write the seccomp filter the argv's `--seccomp 5` reads (classic BPF, as bwrap takes it) to FILE, to run that argv by hand (`5<FILE`).
    #[arg(long, value_name = "FILE", requires = "print_argv")]
    pub save_seccomp: Option<PathBuf>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `90`, `90s`, `500ms`, `20m`, `1h`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: use e.g. 90s, 20m, 1h"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => return Ok(Duration::from_millis(n)),
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use ms, s, m or h")),
    };
    Ok(Duration::from_secs(secs))
}

pub fn run(g: &Globals, a: RunArgs) -> anyhow::Result<i32> {
    let workspace = match a.workspace {
        Some(w) => w,
        None => std::env::current_dir().context("finding the current directory for --workspace")?,
    };
    let rt = Runtime::new()?;
    let mut spec = match &a.view {
        None => rt.host_spec(&workspace)?,
        Some(view) => {
            let store = super::store::open_store(g)?;
            let bar = crate::progress::Bar::new("materializing the view");
            let root = castore::tier::fast::cached_root(&store, view, &bar);
            bar.finish();
            let root = root.map_err(|e| match e {
                castore::tier::Error::Store(inner) => anyhow::Error::from(inner),
                other => anyhow::Error::new(other),
            })?;
            rt.view_spec(&root, &workspace)?
        }
    };
    for name in DEFAULT_ALLOW
        .iter()
        .copied()
        .chain(a.allow_env.iter().map(String::as_str))
    {
        spec.allow_env(name)?;
    }
    for (k, v) in DEFAULT_SET {
        spec.set_env(k, v)?;
    }
    for kv in &a.set_env {
        let (k, v) = kv.split_once('=').ok_or_else(|| SandboxError::BadEnv {
            name: kv.clone(),
            reason: "--set-env takes NAME=VALUE".into(),
        })?;
        spec.set_env(k, v)?;
    }
    for m in a.mask {
        spec.mask(m);
    }
    let host_env = current_host_env();

    if a.print_argv {
        if let Some(path) = &a.save_seccomp {
            let bytes = executor_sandbox::seccomp::filter_bytes()
                .context("this architecture has no seccomp filter to save")?;
            std::fs::write(path, bytes)
                .with_context(|| format!("writing the seccomp filter to {}", path.display()))?;
        }
        let argv = spec.bwrap_argv(&host_env, &a.command);
        let bwrap = rt.bwrap().as_os_str().to_os_string();
        let all: Vec<OsString> = std::iter::once(bwrap).chain(argv).collect();
        if g.json {
            let v: Vec<String> = all
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            for s in &all {
                println!("{}", s.to_string_lossy());
            }
        }
        return Ok(0);
    }

    let opts = RunOptions {
        timeout: a.timeout,
        ..RunOptions::default()
    };
    let report = rt.run(&spec, &host_env, &a.command, opts)?;
    if report.lingering_killed > 0 {
        eprintln!(
            "fhsx: killed {} process(es) still running when the command ended",
            report.lingering_killed
        );
    }
    match report.outcome {
        Outcome::Exited(code) => Ok(code),
        Outcome::Signaled(sig) => {
            eprintln!("fhsx: {}", SandboxError::KilledBySignal(sig));
            Ok(128 + sig)
        }
        Outcome::TimedOut { killed } => {
            if killed {
                eprintln!(
                    "fhsx: the command ignored SIGTERM and was killed after the grace period"
                );
            }
            Err(SandboxError::Timeout(a.timeout.unwrap_or_default()).into())
        }
        // `fhsx run` sets no stop flag.
        Outcome::Stopped { killed } => Err(SandboxError::Cancelled { killed }.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5d").is_err());
    }
}
