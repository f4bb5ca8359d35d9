//! The fuzz properties over random and mutated inputs, on stable Rust
//! (`cd fuzz && cargo test --release`). `FUZZ_ITERS` sets the inputs per
//! target (default 3000); `FUZZ_SEED` the seed. libFuzzer (`fuzz/run.sh`)
//! explores far more; this keeps the properties exercised in plain CI.

fn iters() -> u64 {
    std::env::var("FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000)
}

struct Rng(u64);

impl Rng {
    fn new(salt: u64) -> Rng {
        let seed = std::env::var("FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        Rng(seed ^ salt.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// A mutation of `seed`: flip, insert, delete, splice dictionary tokens.
    fn mutate(&mut self, seed: &[u8], dict: &[&[u8]]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..1 + self.below(6) {
            match self.below(5) {
                0 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] ^= 1 << self.below(8);
                }
                1 => {
                    let i = self.below(v.len() + 1);
                    v.insert(i, self.next() as u8);
                }
                2 if !v.is_empty() => {
                    let i = self.below(v.len());
                    let n = self.below(v.len() - i + 1);
                    v.drain(i..i + n);
                }
                3 if !dict.is_empty() => {
                    let t = dict[self.below(dict.len())];
                    let i = self.below(v.len() + 1);
                    v.splice(i..i, t.iter().copied());
                }
                _ => {
                    let n = self.below(64);
                    v = (0..n).map(|_| self.next() as u8).collect();
                }
            }
        }
        v
    }
}

fn drive(salt: u64, seeds: &[Vec<u8>], dict: &[&[u8]], f: fn(&[u8])) {
    let mut r = Rng::new(salt);
    for s in seeds {
        f(s);
    }
    for _ in 0..iters() {
        let seed = &seeds[r.below(seeds.len())];
        let input = r.mutate(seed, dict);
        f(&input);
    }
}

fn directory_seed() -> Vec<u8> {
    use castore::{Digest, Directory, Name, Node, SymlinkTarget};
    let mut d = Directory::new();
    d.insert(
        Name::new("bin").unwrap(),
        Node::Directory {
            digest: Digest::of(b"x"),
            size: 3,
        },
    )
    .unwrap();
    d.insert(
        Name::new("file").unwrap(),
        Node::File {
            digest: Digest::of(b"y"),
            size: 10,
            executable: true,
        },
    )
    .unwrap();
    d.insert(
        Name::new("link").unwrap(),
        Node::Symlink {
            target: SymlinkTarget::new(b"../bin".as_slice()).unwrap(),
        },
    )
    .unwrap();
    d.encode()
}

#[test]
fn fuzz_directory_decode() {
    drive(
        1,
        &[directory_seed(), Vec::new()],
        &[b"\x0a", b"\x12", b"\x1a", b"\x20\x01", b".", b"..", b"/", b"\0"],
        fhsx_fuzz::directory_decode,
    );
}

fn tar_seed() -> Vec<u8> {
    // One regular file and one symlink, ustar.
    fn header(name: &str, typ: u8, size: usize, link: &str) -> [u8; 512] {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = typ;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }
    let mut t = Vec::new();
    t.extend_from_slice(&header("usr/bin/hello", b'0', 5, ""));
    let mut body = [0u8; 512];
    body[..5].copy_from_slice(b"hello");
    t.extend_from_slice(&body);
    t.extend_from_slice(&header("usr/bin/hi", b'2', 0, "hello"));
    t.extend_from_slice(&[0u8; 1024]);
    t
}

#[test]
fn fuzz_archive_import() {
    let n = (iters() / 100).max(20);
    let mut r = Rng::new(2);
    let seed = tar_seed();
    let dict: &[&[u8]] = &[b"../", b"/etc/", b"\x1f\x8b", b"!<arch>\n", b"debian-binary", b"data.tar"];
    fhsx_fuzz::archive_import(&seed);
    for _ in 0..n {
        let input = r.mutate(&seed, dict);
        fhsx_fuzz::archive_import(&input);
    }
}

#[test]
fn fuzz_action_parse() {
    let good = b"[inputs]\nclosure = [\"b3:abababababababababababababababababababababababababababababababab\"]\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"make\"]\nenv = { PATH = \"/usr/bin\" }\nworkdir = \"/build/src\"\ntimeout = \"20m\"\n[network]\nmode = \"replay\"\nlock = \"fetch.lock\"\n[outputs]\npaths = [\"out\"]\n[limits]\npids = 64\nmemory = 67108864\n".to_vec();
    drive(
        3,
        &[good],
        &[b"[limits]\n", b"timeout = \"", b"../", b"= 0\n", b"\"\\u0000\"", b"[[", b"18446744073709551615"],
        fhsx_fuzz::action_parse,
    );
}

#[test]
fn fuzz_lock_parse() {
    let good = b"version = 1\n\n[[entry]]\nmethod = \"GET\"\nurl = \"http://example.com/a?b=1&a=2\"\nstatus = 200\nblake3 = \"b3:abababababababababababababababababababababababababababababababab\"\nsha256 = \"abababababababababababababababababababababababababababababababab\"\nsize = 10\n".to_vec();
    drive(
        4,
        &[good, b"version = 1\n".to_vec()],
        &[b"[[entry]]\n", b"%2F", b"https://", b":443", b"#frag", b"headers = {", b"\"\\u0000\""],
        fhsx_fuzz::lock_parse,
    );
}

#[test]
fn fuzz_url_normalise() {
    let seeds: Vec<Vec<u8>> = [
        "http://Example.COM:80/a/%7Euser/%2F?b=2&a=1&b=1#f",
        "https://user:pw@[::1]:443/x?X-Amz-Signature=s",
        "http://h/",
        "https://h:8443/%41%zz?",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    drive(
        5,
        &seeds,
        &[b"%", b"%2", b"%FF", b"[", b"]", b":", b"@", b"?", b"&", b"=", b"#", b"\xc3\xa9", b"//"],
        fhsx_fuzz::url_normalise,
    );
}

#[test]
fn fuzz_rpc_frame() {
    let mut good = Vec::new();
    for body in [&br#""Ping""#[..], br#"{"Log":{"level":"info","message":"hi"}}"#] {
        good.extend_from_slice(&(body.len() as u32).to_be_bytes());
        good.extend_from_slice(body);
    }
    drive(
        6,
        &[good],
        &[b"\xff\xff\xff\xff", b"\x00\x10\x00\x01", b"\x00\x00\x00\x00", b"{", b"\"Status\""],
        fhsx_fuzz::rpc_frame,
    );
}

/// Every input a fuzzer once crashed on (fuzz/regressions/<target>/).
#[test]
fn fuzz_regressions_replay() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let targets: [(&str, fn(&[u8])); 6] = [
        ("directory_decode", fhsx_fuzz::directory_decode),
        ("archive_import", fhsx_fuzz::archive_import),
        ("action_parse", fhsx_fuzz::action_parse),
        ("lock_parse", fhsx_fuzz::lock_parse),
        ("url_normalise", fhsx_fuzz::url_normalise),
        ("rpc_frame", fhsx_fuzz::rpc_frame),
    ];
    for (name, f) in targets {
        let Ok(rd) = std::fs::read_dir(root.join(name)) else {
            continue;
        };
        for e in rd.flatten() {
            f(&std::fs::read(e.path()).unwrap());
        }
    }
}

#[test]
fn fuzz_ingest_tree() {
    // Each input makes and removes a tree on disk: fewer of them.
    let n = (iters() / 30).max(20);
    let mut r = Rng::new(7);
    // Into a directory, a file, a link into the output, a hard link, a
    // sparse file, a deep chain, back up, a FIFO, a mode 000 directory.
    let seed: Vec<u8> = vec![
        0, 1, b'd', 2, 4, b'f', b'i', b'l', b'e', 4, 0, b'l', 5, 1, b'h', 3, 255, b's', 8, 200,
        b'c', 1, 0, b'x', 6, 0, b'p', 0, 0, b'z', 7, 0, b'm',
    ];
    fhsx_fuzz::ingest_tree(&seed);
    for _ in 0..n {
        let input = r.mutate(&seed, &[&[8, 255], &[0, 0, b'a'], &[4, 2, b'l']]);
        fhsx_fuzz::ingest_tree(&input);
    }
}
