//! Mapping errors to the exit codes DESIGN.md fixes: 0 success, 1 build
//! failed, 2 usage or input error, 3 containment or integrity violation.

use executor_core::ExitClass;

/// Print `err` with its causes and return the exit code its class calls for.
pub fn report(err: &anyhow::Error) -> i32 {
    eprintln!("fhsx: error: {err}");
    for cause in err.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
    class_of(err).code()
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
