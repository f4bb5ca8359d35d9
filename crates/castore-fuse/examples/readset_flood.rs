//! The read set under an absence flood: mount a small view, `stat` N
//! distinct absent paths through it, finish, and print time and peak RSS.
//!
//! `readset_flood [N] [STAT_THREADS] [full]` (default 2,000,000 and 2).
//! Prints VmHWM (peak resident set) before the flood, after it, and after
//! the read set is collected and stored, with bytes per entry for each
//! step. With `full`, finishes with `MountGuard::finish` (materialising a
//! `ReadSet`) instead of `finish_compact`.

use std::path::Path;
use std::time::Instant;

use castore::store::LocalStore;
use castore_fuse::MountOptions;

fn vm_hwm_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args
        .get(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2_000_000);
    let threads: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(2);
    let full = args.get(3).is_some_and(|a| a == "full");
    let tmp = tempfile::TempDir::new()?;
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("usr/include/sys"))?;
    std::fs::write(src.join("usr/include/stdio.h"), b"/* stdio */\n")?;
    std::fs::write(src.join("usr/include/sys/types.h"), b"/* types */\n")?;
    let store = LocalStore::open(tmp.path().join("store"))?;
    let root = castore::import::import_path(&store, &src, &())?.root;
    let mp = tmp.path().join("view");
    std::fs::create_dir(&mp)?;
    let opts = MountOptions {
        registry: tmp.path().join("registry"),
        ..MountOptions::default()
    };
    let guard = castore_fuse::mount(&store, &root, &mp, &opts)?;
    // Warm up the path to the flooded directory.
    std::fs::metadata(mp.join("usr/include/stdio.h"))?;
    let before = vm_hwm_kib();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let mp: &Path = &mp;
            s.spawn(move || {
                let dir = mp.join("usr/include");
                let mut i = t;
                while i < n {
                    let p = dir.join(format!("absent-header-{i:08}.h"));
                    if std::fs::symlink_metadata(&p).is_ok() {
                        eprintln!("unexpectedly present: {}", p.display());
                    }
                    i += threads;
                }
            });
        }
    });
    let flood = t0.elapsed();
    let after_flood = vm_hwm_kib();
    let t1 = Instant::now();
    let finish_start = t1;
    let (entries, digest, overflow, heap, check) = if full {
        let out = guard.finish(&store)?;
        let t = Instant::now();
        // What a per-entry containment check costs: one path walk each.
        for e in &out.read_set.entries {
            let found = castore::walk::lookup_bytes(&store, &root, &e.raw_path()).is_ok();
            if found != e.digest.is_some() {
                return Err(format!("{} is not as observed", e.path).into());
            }
        }
        (
            out.read_set.entries.len() as u64,
            out.read_set_digest,
            out.read_set_overflow,
            None,
            t.elapsed(),
        )
    } else {
        let out = guard.finish_compact(&store)?;
        let t = Instant::now();
        out.read_set.check_within(&store, &root)?;
        (
            out.read_set.len(),
            out.read_set_digest,
            out.read_set_overflow,
            Some(out.read_set.heap_bytes()),
            t.elapsed(),
        )
    };
    let after_finish = vm_hwm_kib();
    let per = |kib: u64| (kib.saturating_sub(before) * 1024) as f64 / n.max(1) as f64;
    println!("stats            {n} absent paths on {threads} threads");
    println!("read-set entries {entries}");
    println!(
        "flood            {:.2} s ({:.1} µs/stat)",
        flood.as_secs_f64(),
        flood.as_secs_f64() * 1e6 / n.max(1) as f64
    );
    let finish = finish_start.elapsed() - check;
    println!("finish           {:.2} s", finish.as_secs_f64());
    println!("check in view    {:.2} s", check.as_secs_f64());
    println!("VmHWM before     {before} KiB");
    println!(
        "VmHWM flood      {after_flood} KiB ({:.1} bytes/entry)",
        per(after_flood)
    );
    println!(
        "VmHWM finish     {after_finish} KiB ({:.1} bytes/entry)",
        per(after_finish)
    );
    if let Some(h) = heap {
        println!(
            "compact set      {h} bytes ({:.1} bytes/entry)",
            h as f64 / entries.max(1) as f64
        );
    }
    if let Some(o) = overflow {
        println!("INCOMPLETE       {o}");
    }
    println!("read set         {digest}");
    Ok(())
}
