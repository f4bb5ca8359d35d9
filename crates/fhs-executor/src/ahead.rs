//! What a build opens first, found in its view before the sandbox starts:
//! the command's executable and that one's ELF interpreter. The view
//! verifies a blob at its first open, and the first open of all is the
//! command's `execve`, which waits for the hash (~0.5 ms for a 2 MB
//! busybox, tens for a compiler), and then on page faults that each come
//! back as a `READ`; reading and hashing these two while bwrap sets the
//! sandbox up takes that wait off the critical path
//! (`castore_fuse::MountGuard::warm`).
//!
//! A guess, never a grant: a wrong one costs a hash and, in the read set,
//! entries of the declared view the build did not use (see
//! `castore_fuse`'s `warm.rs`).

use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::{Digest, Node};
use castore_fuse::FirstOpen;
#[cfg(test)]
use std::path::Path;

/// How many symlinks one lookup follows (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// The ELF header and program headers are read from this much of a file.
const ELF_HEAD: usize = 4096;

/// Where `command`'s executable is in the view `root` (a bare name is
/// looked up along `path`, as `execvp` does) and its ELF interpreter, with
/// their blobs: symlinks resolved, so each path names the file itself.
pub fn first_opens(store: &LocalStore, root: &Digest, command: &str, path: &str) -> Vec<FirstOpen> {
    let Some((exe, digest)) = find_command(store, root, command, path) else {
        return Vec::new();
    };
    let interp = interpreter(store, &digest).and_then(|p| resolve(store, root, &p));
    std::iter::once(exe).chain(interp.map(|(f, _)| f)).collect()
}

/// The executable `command` names: a path, or a name on `path`.
fn find_command(
    store: &LocalStore,
    root: &Digest,
    command: &str,
    path: &str,
) -> Option<(FirstOpen, Digest)> {
    if command.contains('/') {
        return resolve(store, root, command);
    }
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .find_map(|d| resolve(store, root, &format!("{d}/{command}")))
}

/// The `PT_INTERP` path of the ELF file `exe`, if it is one with one
/// within its first [`ELF_HEAD`] bytes (where linkers put it).
fn interpreter(store: &LocalStore, exe: &Digest) -> Option<String> {
    use goblin::container::{Container, Ctx, Endian};
    use goblin::elf::header::{EI_CLASS, EI_DATA, ELFCLASS64, ELFDATA2LSB};
    use std::io::Read;
    // Straight from the store's file, unverified (`open_blob` would hash
    // all of it here): this only guesses which blob to verify next.
    let mut head = Vec::with_capacity(ELF_HEAD);
    std::fs::File::open(store.blob_path(exe)?)
        .ok()?
        .take(ELF_HEAD as u64)
        .read_to_end(&mut head)
        .ok()?;
    let elf = goblin::elf::Elf::parse_header(&head).ok()?;
    let container = match elf.e_ident[EI_CLASS] {
        ELFCLASS64 => Container::Big,
        _ => Container::Little,
    };
    let endian = Endian::from(elf.e_ident[EI_DATA] == ELFDATA2LSB);
    let phdrs = goblin::elf::ProgramHeader::parse(
        &head,
        usize::try_from(elf.e_phoff).ok()?,
        usize::from(elf.e_phnum),
        Ctx::new(container, endian),
    )
    .ok()?;
    let p = phdrs
        .iter()
        .find(|p| p.p_type == goblin::elf::program_header::PT_INTERP)?;
    let start = usize::try_from(p.p_offset).ok()?;
    let raw = head.get(start..start.checked_add(usize::try_from(p.p_filesz).ok()?)?)?;
    let raw = raw.split(|b| *b == 0).next()?;
    String::from_utf8(raw.to_vec()).ok()
}

/// The regular file `path` names in the tree `root`, symlinks followed as
/// the kernel would (at most [`MAX_LINKS`]), as its path without links;
/// `None` for anything else.
fn resolve(store: &LocalStore, root: &Digest, path: &str) -> Option<(FirstOpen, Digest)> {
    // Still to walk, first component last; and the directories walked,
    // with their names.
    let mut todo: Vec<Vec<u8>> = components(path.as_bytes()).rev().collect();
    let mut dirs: Vec<(Digest, Vec<u8>)> = vec![(*root, Vec::new())];
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == b".." {
            if dirs.len() > 1 {
                dirs.pop();
            }
            continue;
        }
        let here = store.get_directory(&dirs.last()?.0).ok()?;
        match here.get(&name)? {
            Node::Directory { digest, .. } => dirs.push((*digest, name)),
            Node::File { digest, .. } if todo.is_empty() => {
                let mut path: Vec<u8> = Vec::new();
                for (_, n) in dirs.iter().skip(1).chain([&(*digest, name)]) {
                    path.push(b'/');
                    path.extend_from_slice(n);
                }
                return Some((FirstOpen { path }, *digest));
            }
            Node::File { .. } => return None,
            Node::Symlink { target } => {
                links += 1;
                if links > MAX_LINKS {
                    return None;
                }
                let target = target.as_bytes();
                if target.starts_with(b"/") {
                    dirs.truncate(1);
                }
                todo.extend(components(target).rev());
            }
        }
    }
    None
}

/// The components of a path, without empty ones and `.`.
fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = Vec<u8>> + '_ {
    path.split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A merged-/usr tree with a real dynamic executable (the host's
    /// `true`): a bare name is found along PATH through the `/bin` link,
    /// its interpreter through the `/lib64` link and a relative link, and
    /// what is not a regular file at the end of its links is found nowhere.
    #[test]
    fn the_command_and_its_interpreter_are_found_through_links() {
        let host_true = ["/usr/bin/true", "/bin/true"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists())
            .expect("coreutils' true is needed: apt-get install coreutils");
        let interp = "/lib64/ld-linux-x86-64.so.2";
        let t = tempfile::tempdir().unwrap();
        let tree = t.path().join("tree");
        for d in ["usr/bin", "usr/lib/x86_64-linux-gnu", "usr/lib64"] {
            std::fs::create_dir_all(tree.join(d)).unwrap();
        }
        std::fs::copy(host_true, tree.join("usr/bin/true")).unwrap();
        std::fs::write(tree.join("usr/lib/x86_64-linux-gnu/ld.so"), b"loader").unwrap();
        symlink(
            "../lib/x86_64-linux-gnu/ld.so",
            tree.join("usr/lib64/ld-linux-x86-64.so.2"),
        )
        .unwrap();
        symlink("usr/bin", tree.join("bin")).unwrap();
        symlink("usr/lib64", tree.join("lib64")).unwrap();
        symlink("loop", tree.join("loop")).unwrap();
        let store = LocalStore::open(t.path().join("store")).unwrap();
        let root = castore::import::import_path(&store, &tree, &())
            .unwrap()
            .root;
        let blob = |p: &str| FirstOpen {
            path: format!("/{p}").into_bytes(),
        };
        let dynamic = String::from_utf8_lossy(&std::fs::read(host_true).unwrap()).contains(interp);

        let found = first_opens(&store, &root, "true", "/usr/local/bin:/bin");
        assert_eq!(found.first(), Some(&blob("usr/bin/true")), "{found:?}");
        if dynamic {
            assert_eq!(found.get(1), Some(&blob("usr/lib/x86_64-linux-gnu/ld.so")));
        }
        assert_eq!(first_opens(&store, &root, "/bin/true", ""), found);
        assert_eq!(first_opens(&store, &root, "/bin/../bin/./true", ""), found);
        for nothing in ["/loop", "/usr/bin", "/bin/none", "none"] {
            assert!(
                first_opens(&store, &root, nothing, "/bin").is_empty(),
                "{nothing}"
            );
        }
        // Not an ELF: the file alone.
        assert_eq!(
            first_opens(&store, &root, "/lib64/ld-linux-x86-64.so.2", ""),
            vec![blob("usr/lib/x86_64-linux-gnu/ld.so")]
        );
    }
}
