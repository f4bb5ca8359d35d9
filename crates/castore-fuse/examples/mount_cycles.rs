//! Time mount + unmount of a view: `mount_cycles STORE VIEW MOUNTPOINT [N]`.
//! Prints the median and worst mount, first-stat and unmount times in ms.
//! Used by `bench/fuse_mount.sh`.

use std::path::Path;
use std::time::Instant;

use castore::store::LocalStore;
use castore_fuse::MountOptions;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: mount_cycles STORE VIEW MOUNTPOINT [N]".into());
    }
    let store = LocalStore::open(&args[1])?;
    let view = args[2].parse()?;
    let mp = Path::new(&args[3]);
    let n: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(20);
    let opts = MountOptions::default();
    let (mut mount, mut unmount, mut total) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t0 = Instant::now();
        let g = castore_fuse::mount(&store, &view, mp, &opts)?;
        std::fs::read_dir(mp)?.count();
        let t1 = Instant::now();
        g.finish(&store)?;
        let t2 = Instant::now();
        mount.push((t1 - t0).as_secs_f64() * 1e3);
        unmount.push((t2 - t1).as_secs_f64() * 1e3);
        total.push((t2 - t0).as_secs_f64() * 1e3);
    }
    for (name, v) in [
        ("mount+readdir", &mut mount),
        ("unmount+read-set", &mut unmount),
        ("total", &mut total),
    ] {
        v.sort_by(|a, b| a.total_cmp(b));
        println!(
            "{name:18} median {:7.2} ms   max {:7.2} ms",
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
    Ok(())
}
