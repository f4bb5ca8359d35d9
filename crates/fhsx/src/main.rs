//! `fhsx`: the command-line front of the fhsx build sandbox.
//!
//! Thin by design: argument parsing, progress and output formatting. Every
//! piece of logic a library user would want lives in a crate under `crates/`.
//! Each subcommand is one module in `cmd/`.

mod cmd;
mod exit;
mod progress;

use clap::Parser;

fn main() {
    // Die quietly on a closed pipe (`fhsx store ls … | head`), like any Unix tool.
    // SAFETY: resetting a signal disposition to its default, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    fixed_mmap_threshold();
    let cli = cmd::Cli::parse();
    let code = match cmd::dispatch(cli) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}

/// Serve every allocation of 1 MiB or more from a fresh mapping, for the
/// life of the process. glibc otherwise raises its mmap threshold to the
/// largest block freed so far (up to 32 MiB): once a build's FUSE session
/// has freed its 16 MiB request buffers, the next session's buffers come
/// from the heap and are zeroed by hand, page by page. In a worker, or a
/// graph build running several actions in one process, that made every
/// view mount after the first take 4.3 ms instead of 0.45 ms
/// (`bench/worker.sh` round trip).
fn fixed_mmap_threshold() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; called before any
    // thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}
