//! Reporting an error once, and mapping it to the exit codes DESIGN.md
//! fixes: 0 success, 1 build (or I/O) failed, 2 usage or input error, 3
//! containment or integrity violation, 4 a `--check` rebuild differs.
//!
//! The libraries' error types name their cause either in their message or
//! as `source()`, never both; [`report`] prints the chain, each cause that
//! says something new on a line of its own. `tests/errors.rs` keeps what
//! the CLI says to bad inputs, golden.

use executor_core::ExitClass;

/// Print `err` with its causes and return the exit code its class calls for.
pub fn report(err: &anyhow::Error) -> i32 {
    eprint!("{}", chain_lines(err));
    class_of(err).code()
}

/// `fhsx: error: WHAT`, then a `  caused by: WHY` line for each cause that
/// says something new: a cause whose text is already printed is left out.
/// The operating system's reason (an `io::Error` that ends the chain) ends
/// the line it explains: `cannot read action file X: No such file or
/// directory (os error 2)`.
fn chain_lines(err: &anyhow::Error) -> String {
    let mut lines = vec![format!("fhsx: error: {err}")];
    for cause in err.chain().skip(1) {
        let text = cause.to_string();
        if text.is_empty() || lines.iter().any(|l| l.contains(&text)) {
            continue;
        }
        let ends = cause.source().is_none() && cause.downcast_ref::<std::io::Error>().is_some();
        match lines.last_mut() {
            Some(last) if ends && !last.contains('\n') && !text.contains('\n') => {
                last.push_str(": ");
                last.push_str(&text);
            }
            _ => lines.push(format!("  caused by: {text}")),
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// Find the most specific class any error in the chain declares.
pub fn class_of(err: &anyhow::Error) -> ExitClass {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<castore::Error>() {
            return match e.kind() {
                castore::ErrorKind::Integrity => ExitClass::Integrity,
                castore::ErrorKind::Input => ExitClass::Usage,
                castore::ErrorKind::Io => ExitClass::BuildFailed,
            };
        }
        if let Some(e) = cause.downcast_ref::<executor_core::SandboxError>() {
            return e.exit_class();
        }
        if let Some(e) = cause.downcast_ref::<fhs_executor::Error>() {
            return e.exit_class();
        }
        if let Some(c) = cause.downcast_ref::<Classified>() {
            return c.0;
        }
    }
    ExitClass::Usage
}

/// An error the binary itself raises with an explicit class.
#[derive(Debug)]
pub struct Classified(pub ExitClass, pub String);

impl std::fmt::Display for Classified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}

impl std::error::Error for Classified {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_once_and_the_os_reason_on_its_line() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::from(io).context("cannot read action file /x.toml");
        assert_eq!(
            chain_lines(&e),
            format!(
                "fhsx: error: cannot read action file /x.toml: {}\n",
                std::io::Error::from(std::io::ErrorKind::NotFound)
            )
        );
        let e = anyhow::anyhow!("a.toml: TOML parse error\n  |\nbad")
            .context("a.toml: TOML parse error\n  |\nbad")
            .context("importing a.toml");
        assert_eq!(
            chain_lines(&e),
            "fhsx: error: importing a.toml\n  caused by: a.toml: TOML parse error\n  |\nbad\n"
        );
    }
}
