//! The embedded static `fhsx-supervisor` executable (see build.rs and
//! `supervisor/main.rs`).

/// The supervisor's bytes: a statically linked executable for the target
/// this crate was built for.
pub static SUPERVISOR_BYTES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fhsx-supervisor"));

/// A content tag of [`SUPERVISOR_BYTES`] (hash and length), computed at
/// build time; names the installed copy.
pub static SUPERVISOR_TAG: &str = include_str!(concat!(env!("OUT_DIR"), "/fhsx-supervisor.tag"));

#[cfg(test)]
mod tests {
    use super::SUPERVISOR_BYTES;

    fn u16_at(b: &[u8], o: usize) -> u16 {
        u16::from_le_bytes([b[o], b[o + 1]])
    }
    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
    }
    fn u64_at(b: &[u8], o: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    }

    /// The sandbox root may hold no libc of the host: the supervisor must
    /// be an ELF executable with no program interpreter and no DT_NEEDED.
    #[test]
    fn supervisor_is_a_static_elf() {
        let b = SUPERVISOR_BYTES;
        assert_eq!(&b[..4], b"\x7fELF", "not an ELF file");
        assert_eq!(b[4], 2, "expected a 64-bit ELF");
        let phoff = u64_at(b, 0x20) as usize;
        let phentsize = u16_at(b, 0x36) as usize;
        let phnum = u16_at(b, 0x38) as usize;
        let mut dynamic = None;
        for i in 0..phnum {
            let ph = phoff + i * phentsize;
            match u32_at(b, ph) {
                3 => panic!("the supervisor has a PT_INTERP: it is dynamically linked"),
                2 => dynamic = Some((u64_at(b, ph + 8) as usize, u64_at(b, ph + 32) as usize)),
                _ => {}
            }
        }
        // A static-pie has a PT_DYNAMIC for self-relocation, but no DT_NEEDED.
        if let Some((off, size)) = dynamic {
            for e in b[off..off + size].chunks_exact(16) {
                let tag = u64_at(e, 0);
                assert_ne!(
                    tag, 1,
                    "the supervisor has DT_NEEDED: it links a shared library"
                );
                if tag == 0 {
                    break;
                }
            }
        }
    }
}
