//! Every file eptwin reads or writes goes through this module (docs/results.md, "Files").
//!
//! Inputs — scenarios, routing files, result documents, sweep indexes, traces, logs — are
//! regular files of bounded size. The path is examined before it is opened (a device is never
//! opened: opening some has side effects), then opened without blocking (a FIFO swapped in
//! meanwhile cannot hang the open) and the opened file examined again, and at most the bound
//! plus one byte is read.
//!
//! Outputs replace regular files only, atomically: a temporary file in the same directory,
//! written, synced and renamed over the path, then the directory synced. A path that exists
//! and is anything else — a directory, device, FIFO, socket, or a symbolic link, whatever it
//! points to (renaming over a link replaces the link; writing through it writes wherever it
//! points, `/dev/stdout` included) — is refused, and so is a regular file without any write
//! permission. [`Outputs`] checks every path a command will write before the command does any
//! work, including that no two of its outputs are the same file and that none is one of its
//! inputs.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::EngineError;

/// What an input file is, for the bound and the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputKind {
    /// "a scenario", "a routing file", ...
    pub noun: &'static str,
    /// "a TOML file", "a JSON file", "text".
    pub format: &'static str,
    /// The most bytes one may have.
    pub max_bytes: u64,
    /// The bound in words ("16 MiB").
    pub max_text: &'static str,
}

/// JSON documents eptwin reads back: results, sweep indexes, Chrome traces, comparisons.
/// Results stay under ~40 MB (docs/scenario.md, "Limits"); a trace of a large run is bigger.
pub const DOCUMENT: InputKind = InputKind {
    noun: "an eptwin document",
    format: "a JSON file",
    max_bytes: 256 << 20,
    max_text: "256 MiB",
};

/// DeepEP's test logs (`eptwin deepep import`): a few KiB per configuration.
pub const LOG: InputKind =
    InputKind { noun: "a DeepEP log", format: "text", max_bytes: 64 << 20, max_text: "64 MiB" };

/// A file of a recorded node (`eptwin doctor --node DIR`): its TOML and the copies of `/proc`
/// and `/sys` files under `root/`, a few KiB each.
pub const SNAPSHOT: InputKind = InputKind {
    noun: "a node snapshot file",
    format: "text",
    max_bytes: 16 << 20,
    max_text: "16 MiB",
};

/// What a file system entry is, in words, for a refusal.
pub fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    let kind = meta.file_type();
    if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a pipe"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "not a plain file"
    }
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, message)
}

/// The bytes of the regular file at `path`, at most `kind.max_bytes` of them. A path that is
/// not a regular file (after following links) or is larger is refused without reading it; the
/// error's text says why (`not a regular file (a pipe); a scenario is a TOML file`).
pub fn read_input(path: &Path, kind: &InputKind) -> std::io::Result<Vec<u8>> {
    let not_regular = |meta: &std::fs::Metadata| {
        invalid(format!("not a regular file ({}); {} is {}", kind_of(meta), kind.noun, kind.format))
    };
    let too_large = |len: u64| {
        invalid(format!(
            "{len} bytes is more than {} may have ({} bytes, {})",
            kind.noun, kind.max_bytes, kind.max_text
        ))
    };
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    if meta.len() > kind.max_bytes {
        return Err(too_large(meta.len()));
    }
    // Non-blocking: the path may have become a FIFO since it was examined.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let mut bytes = Vec::with_capacity(meta.len().min(kind.max_bytes) as usize);
    file.take(kind.max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > kind.max_bytes {
        // The file grew after it was measured.
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Why the existing entry at `path` may not be replaced by an output, or `None` when it may
/// (it is missing, or a writable regular file).
pub fn output_refusal(path: &Path) -> Option<String> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(format!("cannot examine it: {e}")),
    };
    let kind = meta.file_type();
    if kind.is_file() {
        if meta.permissions().mode() & 0o222 == 0 {
            return Some(format!(
                "a read-only file (mode {:o}): eptwin does not replace a file nobody may write",
                meta.permissions().mode() & 0o7777
            ));
        }
        return None;
    }
    if kind.is_symlink() {
        let target =
            std::fs::read_link(path).map(|t| format!(" to {}", t.display())).unwrap_or_default();
        return Some(format!(
            "a symbolic link{target}: eptwin replaces regular files only, never a link or \
             what it points to; give the file's own path"
        ));
    }
    if kind.is_dir() {
        return Some(format!(
            "a directory: eptwin writes regular files only; give a file name such as {}",
            path.join("out.json").display()
        ));
    }
    Some(format!(
        "{}: eptwin writes regular files only and never replaces anything else",
        kind_of(&meta)
    ))
}

fn refused(what: &str, path: &Path, message: String) -> EngineError {
    EngineError::Output { what: what.to_string(), path: path.to_path_buf(), message }
}

/// The directory a file goes in (`.` for a bare name).
pub fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Write `bytes` to `path`, replacing a regular file atomically and durably (see the module
/// documentation); refused when `path` is anything but a writable regular file or missing.
/// A reader sees the old file or the new one, never half of one; a failed write leaves no
/// temporary file behind.
pub fn write_output(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let fail = |message: String| refused("writing", path, message);
    if path.file_name().is_none() {
        return Err(fail("not a file name".into()));
    }
    if let Some(why) = output_refusal(path) {
        return Err(fail(why));
    }
    let dir = parent_dir(path);
    std::fs::create_dir_all(dir)
        .map_err(|e| fail(format!("cannot create its directory {}: {e}", dir.display())))?;
    // A temporary file is private (0600) by default; results are shared files, so ask for what
    // `File::create` gives (0666 less the umask). Its name is random and created exclusively.
    let mut file = tempfile::Builder::new()
        .prefix(".eptwin-")
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| fail(format!("cannot create a temporary file in {}: {e}", dir.display())))?;
    file.write_all(bytes).map_err(|e| fail(e.to_string()))?;
    file.as_file().sync_all().map_err(|e| fail(e.to_string()))?;
    // Examined again just before the rename: the path may have changed while writing.
    if let Some(why) = output_refusal(path) {
        return Err(fail(why));
    }
    file.persist(path).map_err(|e| fail(e.error.to_string()))?;
    // The rename is durable once the directory is; a directory that cannot be synced (some
    // file systems refuse) still holds the renamed file.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// A path's identity for comparing outputs with each other and with inputs: its directory
/// made canonical (links and `..` resolved) and its file name.
fn identity(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let dir = std::fs::canonicalize(parent_dir(path)).ok()?;
    Some(dir.join(name))
}

/// The file an existing path names (device and inode): a hard link is the same file.
fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// The outputs of one command, checked before it does any work (module documentation).
#[derive(Debug, Default)]
pub struct Outputs {
    /// (identity, what it is) of every claimed output.
    claimed: Vec<(PathBuf, String)>,
    /// (canonical path, file id, what it is) of every input named so far.
    inputs: Vec<(PathBuf, (u64, u64), String)>,
}

impl Outputs {
    pub fn new() -> Outputs {
        Outputs::default()
    }

    /// Record a file the command reads (`what`: "the scenario", "measured result"), so no
    /// output replaces it. Links are followed: it is the file that must not be replaced.
    pub fn input(&mut self, path: &Path, what: &str) {
        if let (Ok(canonical), Ok(meta)) = (std::fs::canonicalize(path), std::fs::metadata(path)) {
            self.inputs.push((canonical, file_id(&meta), what.to_string()));
        }
    }

    /// `dir` is a directory outputs can be written in: created when missing, and a file
    /// created and removed there (permissions alone do not tell: read-only mounts, ACLs).
    pub fn directory(&mut self, dir: &Path, what: &str) -> Result<(), EngineError> {
        let fail = |message: String| refused(what, dir, message);
        match std::fs::metadata(dir) {
            Ok(m) if !m.is_dir() => {
                return Err(fail(format!("{}, not a directory; give a directory", kind_of(&m))));
            }
            _ => {}
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| fail(format!("cannot create the directory: {e}")))?;
        tempfile::Builder::new()
            .prefix(".eptwin-write-test-")
            .tempfile_in(dir)
            .map(drop)
            .map_err(|e| fail(format!("cannot write there: {e}")))
    }

    /// Claim `path` as an output (`what`: "--trace", "the result of x"): refused when it exists
    /// and may not be replaced ([`output_refusal`]), when it is an input or another output
    /// of this command, or when its directory cannot be written.
    pub fn claim(&mut self, path: &Path, what: &str) -> Result<(), EngineError> {
        let fail = |message: String| refused(what, path, message);
        if path.file_name().is_none() || path.as_os_str().to_string_lossy().ends_with('/') {
            return Err(fail("not a file name; give a file path".into()));
        }
        let dir = parent_dir(path);
        if let Ok(m) = std::fs::metadata(dir)
            && !m.is_dir()
        {
            return Err(fail(format!("{} is {}, not a directory", dir.display(), kind_of(&m))));
        }
        if let Some(why) = output_refusal(path) {
            return Err(fail(why));
        }
        let key = match identity(path) {
            Some(k) => k,
            None => {
                self.directory(dir, &format!("{what}: the directory"))?;
                identity(path).ok_or_else(|| fail("cannot resolve its directory".into()))?
            }
        };
        if let Some((_, other)) = self.claimed.iter().find(|(k, _)| *k == key) {
            return Err(fail(format!(
                "the same file as {other}: this command would write it twice"
            )));
        }
        let id = std::fs::symlink_metadata(path).ok().map(|m| file_id(&m));
        if let Some((_, _, other)) =
            self.inputs.iter().find(|(k, i, _)| *k == key || Some(*i) == id)
        {
            return Err(fail(format!("{other}, which this command reads: it is not replaced")));
        }
        if !self.claimed.iter().any(|(k, _)| k.parent() == key.parent()) {
            self.directory(dir, &format!("{what}: the directory"))?;
        }
        self.claimed.push((key, what.to_string()));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
