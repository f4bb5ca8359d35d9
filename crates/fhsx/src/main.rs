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
    let cli = cmd::Cli::parse();
    let code = match cmd::dispatch(cli) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}
