mod common;
use common::*;
use executor_sandbox::Outcome;

#[test]
fn smoke_runs_a_command() {
    let ws = workspace();
    let r = sh_in(ws.path(), "echo hello; id; pwd; echo $WF_RPC_SOCK; cat /proc/1/cmdline | tr '\\0' ' '; echo; ls -l /proc/self/fd; env; mount | head -50; exit 3");
    eprintln!("{}\n---\n{}", out(&r), err(&r));
    assert_eq!(r.outcome, Outcome::Exited(3));
}
