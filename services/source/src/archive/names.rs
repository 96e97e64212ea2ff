//! Names: shared by zip and tar.

use std::collections::{HashMap, HashSet};

use super::{ArchiveError, SkipReason, shown};
use crate::links;
use crate::paths::{MAX_PATH_BYTES, SourcePath};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MemberKind {
    Directory,
    File { executable: bool },
    Symlink,
    Skip(SkipReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NameStyle {
    Zip,
    Tar,
}

pub(super) enum Verdict {
    /// The tar root (`.`, `./`): says nothing about the content.
    Ignore,
    Directory(SourcePath),
    File(SourcePath, bool),
    Symlink(SourcePath, String),
    Skipped(SkipReason),
}

/// Every name seen so far, and the shape of what landed.
#[derive(Default)]
pub(super) struct Names {
    /// Digests of the normalized raw names of all members, landed or skipped: 32 bytes per
    /// member however long its name (a flood of 15 KB names must not be kept whole).
    seen: HashSet<[u8; 32]>,
    landed: Tree,
}

impl Names {
    /// `link_target`: a symlink's raw target (ignored for other kinds).
    pub(super) fn judge(
        &mut self,
        raw: &[u8],
        kind: MemberKind,
        link_target: &[u8],
        style: NameStyle,
    ) -> Result<Verdict, ArchiveError> {
        let (mut name, names_a_directory) = match raw.strip_suffix(b"/") {
            Some(name) => (name, true),
            None => (raw, false),
        };
        if style == NameStyle::Tar {
            if kind == MemberKind::Directory && name == b"." {
                return Ok(Verdict::Ignore);
            }
            // `tar -C dir .` writes every name as `./name`.
            if let Some(rest) = name.strip_prefix(b"./") {
                name = rest;
            }
        }
        // A name past the path limit can never land: dropped and counted before anything
        // of it is kept.
        if name.len() > MAX_PATH_BYTES {
            return Ok(Verdict::Skipped(SkipReason::UnsafePath));
        }
        if !self
            .seen
            .insert(plinth_blobs::Digest::of(name).as_bytes().to_owned())
        {
            return Err(ArchiveError::Duplicate(shown(name)));
        }
        let executable = match kind {
            MemberKind::Skip(reason) => return Ok(Verdict::Skipped(reason)),
            // A tar file whose name ends in '/': some readers make it a directory, some a
            // file; refuse to pick.
            MemberKind::File { .. } | MemberKind::Symlink if names_a_directory => {
                return Ok(Verdict::Skipped(SkipReason::UnsafePath));
            }
            MemberKind::File { executable } => Some(executable),
            MemberKind::Symlink => Some(false),
            MemberKind::Directory => None,
        };
        let Some(path) = std::str::from_utf8(name)
            .ok()
            .and_then(|name| SourcePath::parse(name).ok())
        else {
            return Ok(Verdict::Skipped(SkipReason::UnsafePath));
        };
        // A link that could leave the root is dropped before it lands, so the name stays
        // free for a real directory (`link/passwd` after `link -> /etc` lands beneath the
        // root); a kept one lands as a leaf, so nothing can be put beneath it.
        let target = match kind {
            MemberKind::Symlink => match links::kept_target(&path, link_target) {
                Some(target) => Some(target),
                None => return Ok(Verdict::Skipped(SkipReason::Symlink)),
            },
            _ => None,
        };
        self.landed.land(&path, executable.is_none())?;
        if let Some(target) = target {
            return Ok(Verdict::Symlink(path, target));
        }
        Ok(match executable {
            Some(executable) => Verdict::File(path, executable),
            None => Verdict::Directory(path),
        })
    }
}

/// Landed paths as a tree of components, each kept as 16 bytes of its SHA-256 under its
/// parent's node: memory grows with the number of components, not with their length (an
/// archive of 200,000 kilobyte-long names would otherwise be held twice over).
#[derive(Default)]
struct Tree {
    children: HashMap<(usize, [u8; 16]), usize>,
    /// Per node: whether it is a file. Node 0 is the root.
    is_file: Vec<bool>,
}

/// A component's key: the first 16 bytes of its SHA-256 (a collision would need 2^64
/// components).
fn component_key(component: &str) -> [u8; 16] {
    let digest = plinth_blobs::Digest::of(component.as_bytes());
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest.as_bytes()[..16]);
    key
}

impl Tree {
    fn land(&mut self, path: &SourcePath, is_dir: bool) -> Result<(), ArchiveError> {
        if self.is_file.is_empty() {
            self.is_file.push(false);
        }
        let text = path.as_str();
        let mut node = 0;
        let mut end = 0;
        let mut components = text.split('/').peekable();
        while let Some(component) = components.next() {
            let last = components.peek().is_none();
            end += component.len();
            let key = (node, component_key(component));
            node = match self.children.get(&key) {
                Some(&child) => {
                    let child_is_file = self.is_file.get(child).copied().unwrap_or(false);
                    if child_is_file || (last && !is_dir) {
                        return Err(ArchiveError::Ambiguous(format!(
                            "{:?} is both a file and a directory",
                            text.get(..end).unwrap_or(text)
                        )));
                    }
                    child
                }
                None => {
                    let child = self.is_file.len();
                    self.is_file.push(last && !is_dir);
                    self.children.insert(key, child);
                    child
                }
            };
            end += 1;
        }
        Ok(())
    }
}
