//! `fhsx`: the command-line front of the fhsx build sandbox.
//!
//! Thin by design: argument parsing, progress and output formatting. Every
//! piece of logic a library user would want lives in a crate under `crates/`.
//! Each subcommand is one module in `cmd/`.

mod cmd;
mod exit;
mod progress;
mod watch;

use clap::Parser;

fn main() {
    fixed_mmap_threshold();
    let cli = cmd::Cli::parse();
    if cli.command.holds_no_socket() {
        die_quietly_on_a_closed_pipe();
    }
    if cli.command.streams_objects() {
        heap_for_streaming();
    }
    let code = match cmd::dispatch(cli) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}

/// End quietly when what this prints goes to a closed pipe (`fhsx store
/// ls … | head`), like any Unix tool. Only for commands that hold no
/// socket: a peer that goes away must end in an error the command
/// handles, and rustls's vectored writes are not sent with
/// `MSG_NOSIGNAL` — with SIGPIPE at its default, a worker writing a
/// download to a client that had gone died of it
/// (`stalled_downloads_cost_the_worker_a_few_chunks_not_the_blob`).
fn die_quietly_on_a_closed_pipe() {
    // SAFETY: resetting a signal disposition to its default, before any
    // thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Serve every allocation of 1 MiB or more from a fresh mapping, for the
/// life of the process. glibc otherwise raises its mmap threshold to the
/// largest block freed so far (up to 32 MiB): once a build's FUSE session
/// has freed its 16 MiB request buffers, the next session's buffers come
/// from the heap and are zeroed by hand, page by page. In a worker, or a
/// graph build running several actions in one process, that made every
/// view mount after the first take 4.3 ms instead of 0.45 ms
/// (`bench/worker.sh` round trip). The threshold is the worker's
/// `HEAP_MESSAGE_MAX`, one number: every message carrying blob bytes
/// stays below it, so that message comes from the heap, not a fresh
/// mapping faulted in page by page.
fn fixed_mmap_threshold() {
    #[cfg(target_env = "gnu")]
    set_malloc_option(
        libc::M_MMAP_THRESHOLD,
        worker::HEAP_MESSAGE_MAX as libc::c_int,
    );
}

/// Grow and trim the heap 16 MiB beyond what is in use, for a process that
/// streams objects in batches just under 1 MiB. glibc otherwise hands the
/// heap's top back as soon as 128 KiB of it are free, and asks for it
/// again with the next batch, so every message was faulted in and zeroed
/// by the kernel page by page: an upload of the hello toolchain spent a
/// fifth of the worker's CPU there (`bench/worker.sh`, DESIGN). Only
/// these commands: keeping freed heap made `fhsx store import` slower.
///
/// And one arena per core, not glibc's eight: each arena keeps its padded
/// top and what it freed, and the worker's blocking threads (hundreds,
/// with many clients) each take one as they contend. 64 reads of an 8 MB
/// directory beside other tests grew the worker by 80 MiB, 25 MiB with
/// two arenas; uploads and round trips measured the same.
fn heap_for_streaming() {
    #[cfg(target_env = "gnu")]
    {
        set_malloc_option(libc::M_TOP_PAD, 16 << 20);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        set_malloc_option(
            libc::M_ARENA_MAX,
            cores.try_into().unwrap_or(libc::c_int::MAX),
        );
    }
}

/// One of glibc's allocator parameters, set in `main` before any thread
/// starts.
#[cfg(target_env = "gnu")]
fn set_malloc_option(param: libc::c_int, value: libc::c_int) {
    // SAFETY: mallopt only sets an allocator parameter, and no other
    // thread allocates yet.
    unsafe {
        libc::mallopt(param, value);
    }
}
