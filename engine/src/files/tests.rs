//! Inputs and outputs on every kind of file system entry, made in a temporary directory
//! (never the machine's own `/dev` nodes: tests may run as root, where a bug would replace
//! them).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::*;

pub(crate) fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

/// Every kind of entry an output path may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Missing,
    Regular,
    ReadOnly,
    Directory,
    Fifo,
    Socket,
    /// A link to a regular file.
    LinkToFile,
    LinkToFifo,
    Dangling,
    /// A link to a directory that stands for `/dev` (holding a FIFO named `stdout`).
    LinkToDir,
}

pub(crate) const ENTRIES: [Entry; 10] = [
    Entry::Missing,
    Entry::Regular,
    Entry::ReadOnly,
    Entry::Directory,
    Entry::Fifo,
    Entry::Socket,
    Entry::LinkToFile,
    Entry::LinkToFifo,
    Entry::Dangling,
    Entry::LinkToDir,
];

/// Make `entry` at `path` (with its targets beside it); the listener keeps a socket alive.
pub(crate) fn make(entry: Entry, path: &Path) -> Option<std::os::unix::net::UnixListener> {
    let side = |suffix: &str| PathBuf::from(format!("{}.{suffix}", path.display()));
    match entry {
        Entry::Missing => {}
        Entry::Regular => std::fs::write(path, "old").unwrap(),
        Entry::ReadOnly => {
            std::fs::write(path, "old").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444)).unwrap();
        }
        Entry::Directory => std::fs::create_dir(path).unwrap(),
        Entry::Fifo => mkfifo(path),
        Entry::Socket => return Some(std::os::unix::net::UnixListener::bind(path).unwrap()),
        Entry::LinkToFile => {
            std::fs::write(side("target"), "old").unwrap();
            std::os::unix::fs::symlink(side("target"), path).unwrap();
        }
        Entry::LinkToFifo => {
            mkfifo(&side("fifo"));
            std::os::unix::fs::symlink(side("fifo"), path).unwrap();
        }
        Entry::Dangling => std::os::unix::fs::symlink(side("nowhere"), path).unwrap(),
        Entry::LinkToDir => {
            std::fs::create_dir(side("dev")).unwrap();
            mkfifo(&side("dev").join("stdout"));
            std::os::unix::fs::symlink(side("dev").join("stdout"), path).unwrap();
        }
    }
    None
}

/// What is at `path` now: its type, inode and (regular files) its text.
fn snapshot(path: &Path) -> Option<(String, u64, Option<String>)> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let kind = format!("{:?}", meta.file_type());
    let text = meta.file_type().is_file().then(|| std::fs::read_to_string(path).unwrap());
    Some((kind, meta.ino(), text))
}

fn is_regular_or_missing(entry: Entry) -> bool {
    matches!(entry, Entry::Missing | Entry::Regular)
}

#[test]
fn outputs_replace_only_regular_files() {
    for entry in ENTRIES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        let _socket = make(entry, &path);
        let before = snapshot(&path);
        let linked = std::fs::read_link(&path).ok();
        let got = write_output(&path, b"new");
        if is_regular_or_missing(entry) {
            got.unwrap_or_else(|e| panic!("{entry:?}: {e}"));
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "new", "{entry:?}");
        } else {
            let message = got.expect_err(&format!("{entry:?} was replaced")).to_string();
            assert!(message.contains(&path.display().to_string()), "{entry:?}: {message}");
            assert_eq!(snapshot(&path), before, "{entry:?} changed");
            assert_eq!(std::fs::read_link(&path).ok(), linked, "{entry:?}");
        }
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{entry:?}: {names:?}");
        // What a link pointed to is untouched.
        if entry == Entry::LinkToFile {
            let target = dir.path().join("out.json.target");
            assert_eq!(std::fs::read_to_string(target).unwrap(), "old");
        }
        if entry == Entry::LinkToDir {
            let fifo = dir.path().join("out.json.dev").join("stdout");
            assert!(std::fs::symlink_metadata(fifo).unwrap().file_type().is_fifo());
        }
    }
}

#[test]
fn claims_refuse_what_writing_would_refuse() {
    for entry in ENTRIES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        let _socket = make(entry, &path);
        let mut outputs = Outputs::new();
        let got = outputs.claim(&path, "--trace");
        assert_eq!(got.is_ok(), is_regular_or_missing(entry), "{entry:?}: {got:?}");
        if let Err(e) = got {
            let text = e.to_string();
            assert!(text.starts_with(&format!("--trace {}: ", path.display())), "{text}");
        }
    }
}

#[test]
fn an_output_is_neither_another_output_nor_an_input() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("out/x.json");
    let scenario = dir.path().join("x.toml");
    std::fs::write(&scenario, "s").unwrap();
    let hard = dir.path().join("hard.toml");
    std::fs::hard_link(&scenario, &hard).unwrap();
    let mut outputs = Outputs::new();
    outputs.input(&scenario, "the scenario x.toml");
    outputs.claim(&result, "the result").unwrap();
    assert!(dir.path().join("out").is_dir(), "its directory is made");
    // The same file by another spelling.
    let again = dir.path().join("out/../out/./x.json");
    let e = outputs.claim(&again, "--trace").unwrap_err().to_string();
    assert!(e.contains("the same file as the result"), "{e}");
    let e = outputs.claim(&scenario, "--trace").unwrap_err().to_string();
    assert!(e.contains("the scenario x.toml, which this command reads"), "{e}");
    let e = outputs.claim(&hard, "--trace").unwrap_err().to_string();
    assert!(e.contains("which this command reads"), "{e}");
    outputs.claim(&dir.path().join("trace.json"), "--trace").unwrap();
}

#[test]
fn output_directories_are_directories_that_take_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let mut outputs = Outputs::new();
    let e = outputs.directory(&file, "--out").unwrap_err().to_string();
    assert!(e.contains("a regular file, not a directory"), "{e}");
    let e = outputs.claim(&file.join("x.json"), "--trace").unwrap_err().to_string();
    assert!(e.contains("is a regular file, not a directory"), "{e}");
    let fifo = dir.path().join("p");
    mkfifo(&fifo);
    assert!(outputs.directory(&fifo, "--out").is_err());
    outputs.directory(&dir.path().join("a/b"), "--out").unwrap();
    assert!(dir.path().join("a/b").is_dir());
    assert_eq!(std::fs::read_dir(dir.path().join("a/b")).unwrap().count(), 0, "no probe left");
}

#[test]
fn inputs_are_regular_files_read_within_their_bound() {
    let dir = tempfile::tempdir().unwrap();
    let small = InputKind { noun: "a test file", format: "text", max_bytes: 8, max_text: "8 B" };
    let ok = dir.path().join("ok.json");
    std::fs::write(&ok, "12345678").unwrap();
    assert_eq!(read_input(&ok, &small).unwrap(), b"12345678");
    std::fs::write(&ok, "123456789").unwrap();
    let e = read_input(&ok, &small).unwrap_err().to_string();
    assert_eq!(e, "9 bytes is more than a test file may have (8 bytes, 8 B)");
    // A FIFO, a link to one and a link to a device are refused without blocking or reading.
    let fifo = dir.path().join("fifo.json");
    mkfifo(&fifo);
    let e = read_input(&fifo, &small).unwrap_err().to_string();
    assert_eq!(e, "not a regular file (a pipe); a test file is text");
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    assert!(read_input(&link, &small).is_err());
    let zero = dir.path().join("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let e = read_input(&zero, &small).unwrap_err().to_string();
    assert_eq!(e, "not a regular file (a character device); a test file is text");
    let e = read_input(dir.path(), &small).unwrap_err().to_string();
    assert!(e.starts_with("not a regular file (a directory)"), "{e}");
    let missing = read_input(&dir.path().join("none"), &small).unwrap_err();
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
}

proptest! {
    #![proptest_config(crate::testing::proptest_config(64))]
    /// Whatever mix of entries the paths name, and in whatever order they are written, every
    /// non-regular entry is left exactly as it was, every regular or missing path ends up
    /// holding what was written, and no temporary file stays behind.
    #[test]
    fn writes_never_replace_what_is_not_a_regular_file(
        picks in prop::collection::vec((0..ENTRIES.len(), 0usize..4), 1..12),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut sockets = Vec::new();
        let mut made = Vec::new();
        for (i, (entry, _)) in picks.iter().enumerate() {
            let path = dir.path().join(format!("p{i}"));
            sockets.push(make(ENTRIES[*entry], &path));
            made.push((path.clone(), ENTRIES[*entry], snapshot(&path)));
        }
        for (round, (_, which)) in picks.iter().enumerate() {
            let (path, entry, before) = &made[*which % made.len()];
            let text = format!("round {round}");
            let got = write_output(path, text.as_bytes());
            if is_regular_or_missing(*entry) {
                prop_assert!(got.is_ok(), "{entry:?}: {got:?}");
                prop_assert_eq!(std::fs::read_to_string(path).unwrap(), text);
            } else {
                prop_assert!(got.is_err(), "{:?} replaced", entry);
                prop_assert_eq!(&snapshot(path), before);
            }
        }
        let leftovers = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp"))
            .count();
        prop_assert_eq!(leftovers, 0);
        drop(sockets);
    }
}
