use executor_sandbox::*;
use std::time::Instant;
fn main() {
    let ws = std::env::current_dir().unwrap();
    let env = current_host_env();
    let cmd = vec![std::ffi::OsString::from("/bin/true")];
    for pref in [
        ReaperPreference::Auto,
        ReaperPreference::PidfdOnly,
        ReaperPreference::Auto,
        ReaperPreference::PidfdOnly,
    ] {
        let n = 100;
        let mut t_rt = 0.0;
        let mut t_spec = 0.0;
        let mut t_run = 0.0;
        let mut t_drop = 0.0;
        for _ in 0..n {
            let a = Instant::now();
            let rt = Runtime::new().unwrap();
            let b = Instant::now();
            let spec = rt.host_spec(&ws).unwrap();
            let c = Instant::now();
            let r = rt
                .run(
                    &spec,
                    &env,
                    &cmd,
                    RunOptions {
                        reaper: pref,
                        stdin: Stdin::Null,
                        ..Default::default()
                    },
                )
                .unwrap();
            let d = Instant::now();
            drop(rt);
            let e = Instant::now();
            assert_eq!(r.outcome, Outcome::Exited(0));
            t_rt += (b - a).as_secs_f64();
            t_spec += (c - b).as_secs_f64();
            t_run += (d - c).as_secs_f64();
            t_drop += (e - d).as_secs_f64();
        }
        let f = 1000.0 / n as f64;
        println!(
            "{pref:?}: runtime {:.2}ms spec {:.2}ms run {:.2}ms drop {:.2}ms",
            t_rt * f,
            t_spec * f,
            t_run * f,
            t_drop * f
        );
    }
}
