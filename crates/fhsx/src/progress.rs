//! A progress bar for long store operations: drawn on a terminal only, and
//! only once the operation has taken longer than a moment.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

const SHOW_AFTER: Duration = Duration::from_millis(400);

pub struct Bar {
    bar: ProgressBar,
    started: Instant,
    terminal: bool,
}

impl Bar {
    pub fn new(what: &str) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg}: {human_pos} entries, {total_bytes} in {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(what.to_owned());
        Bar {
            bar,
            started: Instant::now(),
            terminal: std::io::stderr().is_terminal(),
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl castore::Progress for Bar {
    fn advance(&self, entries: u64, bytes: u64) {
        self.bar.inc(entries);
        // The bar has no total; its length field carries the byte count.
        self.bar.inc_length(bytes);
        if self.terminal && self.bar.is_hidden() && self.started.elapsed() > SHOW_AFTER {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }
}
