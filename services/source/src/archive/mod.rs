//! Untrusted archives (project imports): zip, and tar either plain or compressed with gzip,
//! zstd, bzip2 or xz. This module owns every decision about what such an archive may hand
//! out: the format (by magic bytes only), member names (checked with [`SourcePath`], never
//! rewritten), member kinds (symlinks whose target stays inside the root are handed out as
//! links, never followed — see `links`; other links, devices and FIFOs are reported as
//! skipped), duplicate and conflicting names, entry and byte limits counted on inflated
//! bytes, and the consistency checks that stop two unpackers from seeing two different
//! archives in the same bytes. It never writes to disk: each member goes, in archive order,
//! to a callback.
//!
//! Callers must discard everything the callback received when [`read_archive`] fails. Tar is
//! a stream, so a duplicate name, a bad gzip checksum or trailing garbage near the end is only
//! found after earlier members were handed out. Zip is checked whole before its first member
//! is handed out, except for each member's own CRC and size, found while it is read.
//!
//! A tar, plain or once decompressed, is recognised by the POSIX `ustar` magic (which GNU and
//! pax archives also carry) with a valid header checksum, or by an all-zero first block (an
//! empty archive). Old v7 archives, which have no magic, are refused as unrecognised: a
//! checksum alone is too weak a signal to treat arbitrary uploads as tar, and no current tool
//! writes v7 by default.
//!
//! Layout: this file holds the entry point and the types callers see; `tar` and `zip` read
//! the two families, `names` judges every member's name for both, and `accounting` holds
//! what every reader of one archive shares (byte counts, caps, the first refusal).

mod accounting;
mod names;
mod tar;
mod zip;

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::ops::Range;

use crate::paths::{MAX_PATH_BYTES, SourcePath};

use self::accounting::{FileGuard, Meter, PanicFence};
use self::tar::{ZstdFrames, read_tar};
use self::zip::read_zip;

/// Caps counted against bytes actually inflated, never against sizes headers claim.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most members of any kind: directories, files, skipped members, and the tar members
    /// that are never reported (the root `./`, pax global headers).
    pub max_entries: u64,
    /// Most bytes inflated across all members, including members nobody reads, and their
    /// headers (tar headers, long names and pax records; a zip's central directory and local
    /// headers).
    pub max_total_bytes: u64,
    /// Most bytes one file may inflate to.
    pub max_file_bytes: u64,
}

/// Why a member was not handed out as a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    Symlink,
    HardLink,
    Device,
    Fifo,
    /// A name that is not UTF-8 or does not pass [`SourcePath::parse`].
    UnsafePath,
    Other,
}

impl SkipReason {
    /// A stable label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Symlink => "symlink",
            SkipReason::HardLink => "hard_link",
            SkipReason::Device => "device",
            SkipReason::Fifo => "fifo",
            SkipReason::UnsafePath => "unsafe_path",
            SkipReason::Other => "other",
        }
    }
}

/// One member, as handed to the callback.
pub enum Entry<'a> {
    Directory {
        path: SourcePath,
    },
    /// `content` yields the inflated bytes and fails once a limit is passed or the member
    /// turns out damaged; reaching its end means the member's checksum and size held.
    File {
        path: SourcePath,
        executable: bool,
        content: &'a mut dyn Read,
    },
    /// A symlink whose target stays inside the root as far as this archive's names can tell
    /// (`links::kept_target`; an import checks it again once a wrapping directory is
    /// stripped). Nothing is ever written through it: a later member beneath it refuses the
    /// archive.
    Symlink {
        path: SourcePath,
        target: String,
    },
    Skipped {
        /// Lossy UTF-8 of the raw name, cut to [`MAX_PATH_BYTES`]; for logs only.
        name: String,
        reason: SkipReason,
    },
}

/// Why an archive was refused. Messages are shown to API users.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(
        "the upload is not a zip or tar archive \
         (tar may be compressed with gzip, zstd, bzip2 or xz)"
    )]
    Unrecognized,
    /// JSON sent as an archive: most likely a git import without its content type.
    #[error(
        "the upload is not a zip or tar archive but looks like JSON: a git import is sent \
         with `Content-Type: application/json`"
    )]
    LooksLikeJson,
    #[error("the archive lists {0:?} more than once")]
    Duplicate(String),
    #[error("the archive was refused because unpackers could read it differently: {0}")]
    Ambiguous(String),
    #[error("the archive has more than {max} entries")]
    TooManyEntries { max: u64 },
    #[error("the archive unpacks to more than {max} bytes")]
    TooLarge { max: u64 },
    #[error("{path:?} in the archive unpacks to more than {max} bytes")]
    FileTooLarge { path: String, max: u64 },
    #[error("the archive is damaged or uses an unsupported feature: {0}")]
    Corrupt(String),
    /// The callback's own error, unchanged.
    #[error(transparent)]
    Sink(Box<dyn std::error::Error + Send + Sync>),
    #[error("could not read the uploaded archive: {0}")]
    Io(io::Error),
}

type SinkError = Box<dyn std::error::Error + Send + Sync>;
type Sink<'s> = dyn FnMut(Entry<'_>) -> Result<(), SinkError> + 's;

/// Detects the format by magic bytes (never by file name or content type) and feeds every
/// member to `sink`, in archive order.
#[allow(
    clippy::type_complexity,
    reason = "the callback type is the interface other modules code against"
)]
pub fn read_archive(
    file: File,
    limits: &Limits,
    sink: &mut dyn FnMut(Entry<'_>) -> Result<(), Box<dyn std::error::Error + Send + Sync>>,
) -> Result<(), ArchiveError> {
    let meter = Meter::new(*limits);
    let mut head = [0u8; TAR_BLOCK];
    let head_len =
        read_up_to(&mut FileCursor::at(&file, 0), &mut head).map_err(ArchiveError::Io)?;
    let head = head.get(..head_len).unwrap_or_default();
    let format = sniff(head).ok_or_else(|| unrecognized(head))?;
    let source = || FileGuard {
        inner: FileCursor::at(&file, 0),
        meter: &meter,
    };
    match format {
        Format::Zip => read_zip(&file, &meter, sink),
        Format::Tar => read_tar(Box::new(BufReader::new(source())), &meter, sink),
        Format::Gzip => {
            let decoder = flate2::read::MultiGzDecoder::new(source());
            read_tar(Box::new(PanicFence::new(decoder, &meter)), &meter, sink)
        }
        Format::Zstd => {
            let decoder = ZstdFrames::new(BufReader::new(source()));
            read_tar(Box::new(PanicFence::new(decoder, &meter)), &meter, sink)
        }
        Format::Bzip2 => {
            let decoder = bzip2::read::MultiBzDecoder::new(source());
            read_tar(Box::new(PanicFence::new(decoder, &meter)), &meter, sink)
        }
        Format::Xz => {
            let decoder =
                lzma_rust2::XzReader::new_mem_limit(BufReader::new(source()), true, XZ_MEMORY_KIB);
            read_tar(Box::new(PanicFence::new(decoder, &meter)), &meter, sink)
        }
    }
}

/// Why `head` is no archive: a body whose first byte after whitespace is `{` is JSON sent
/// without its content type (a git import, as `curl -d` sends one), and the answer says so.
fn unrecognized(head: &[u8]) -> ArchiveError {
    match head.iter().find(|byte| !byte.is_ascii_whitespace()) {
        Some(b'{') => ArchiveError::LooksLikeJson,
        _ => ArchiveError::Unrecognized,
    }
}

const TAR_BLOCK: usize = 512;
/// Bytes the tar reader may consume between two members (padding, GNU long names, pax
/// records, the next header). Real archives need a few KiB; the tar crate holds long names
/// and pax records in memory, so this is also what one member's metadata may cost.
const TAR_HEADER_BYTES_PER_MEMBER_MAX: u64 = 1 << 20;
/// Header bytes allowed on average per member, plus a fixed allowance, so that a flood of
/// members with maximal headers cannot multiply the work.
const TAR_HEADER_BYTES_AVERAGE: u64 = 16 << 10;
const TAR_HEADER_BYTES_BASE: u64 = 1 << 20;
/// Zero padding allowed after the end-of-archive marker (tar pads to its record size, 10 KiB
/// by default, up to 1 MiB with a large blocking factor).
const TAR_TRAILER_MAX: u64 = 4 << 20;
/// xz's largest preset dictionary is 64 MiB; this leaves room for its decoder state and
/// refuses streams that would make us allocate more.
const XZ_MEMORY_KIB: u32 = 128 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Zip,
    Tar,
    Gzip,
    Zstd,
    Bzip2,
    Xz,
}

fn sniff(head: &[u8]) -> Option<Format> {
    // Tar is tested before the two- and three-byte magics so that a tar whose first member
    // is named "BZh…" stays a tar; its five-byte magic plus checksum is the stronger signal.
    if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
        Some(Format::Zip)
    } else if head.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]) {
        Some(Format::Zstd)
    } else if head.starts_with(&[0xFD, b'7', b'z', b'X', b'Z', 0x00]) {
        Some(Format::Xz)
    } else if is_tar_start(head) {
        Some(Format::Tar)
    } else if head.starts_with(&[0x1F, 0x8B]) {
        Some(Format::Gzip)
    } else if head.starts_with(b"BZh") && head.get(3).is_some_and(|b| (b'1'..=b'9').contains(b)) {
        Some(Format::Bzip2)
    } else {
        None
    }
}

fn is_tar_start(head: &[u8]) -> bool {
    let Some(block) = head.get(..TAR_BLOCK) else {
        return false;
    };
    // An empty archive is nothing but its end-of-archive zero blocks.
    if block.iter().all(|&byte| byte == 0) {
        return true;
    }
    block.get(257..262) == Some(b"ustar".as_slice()) && tar_checksum_holds(block)
}

/// The checksum rule tar readers apply: the header's bytes summed with the checksum field
/// counted as spaces, stored as octal.
fn tar_checksum_holds(block: &[u8]) -> bool {
    const FIELD: Range<usize> = 148..156;
    let Some(stored) = block.get(FIELD).and_then(parse_octal) else {
        return false;
    };
    let computed: u64 = block
        .iter()
        .enumerate()
        .map(|(at, &byte)| u64::from(if FIELD.contains(&at) { b' ' } else { byte }))
        .sum();
    stored == computed
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let digits = field.split(|&byte| byte == 0).next()?;
    u64::from_str_radix(std::str::from_utf8(digits).ok()?.trim(), 8).ok()
}

/// A reader over the uploaded file with a position of its own. The zip crate's reader and
/// ours share one descriptor, hence one OS file offset; seeking to our own position before
/// every read keeps each from moving the other's (a `BufReader` whose file moved under it
/// even panics when asked for its position).
struct FileCursor<'f> {
    file: &'f File,
    position: u64,
}

impl<'f> FileCursor<'f> {
    fn at(file: &'f File, position: u64) -> Self {
        FileCursor { file, position }
    }
}

impl Read for FileCursor<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut file = self.file;
        file.seek(SeekFrom::Start(self.position))?;
        let n = file.read(buf)?;
        self.position = self.position.saturating_add(n as u64);
        Ok(n)
    }
}

impl Seek for FileCursor<'_> {
    fn seek(&mut self, target: SeekFrom) -> io::Result<u64> {
        let position = match target {
            SeekFrom::Start(offset) => Some(offset),
            SeekFrom::End(delta) => self.file.metadata()?.len().checked_add_signed(delta),
            SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        self.position = position.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the file",
            )
        })?;
        Ok(self.position)
    }
}

/// Reads until `buf` is full or the input ends.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while let Some(rest) = buf.get_mut(filled..) {
        if rest.is_empty() {
            break;
        }
        match reader.read(rest) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// A raw name for messages and logs: lossy UTF-8, cut to a sane length.
fn shown(raw: &[u8]) -> String {
    let cut = raw.get(..MAX_PATH_BYTES).unwrap_or(raw);
    let mut text = String::from_utf8_lossy(cut).into_owned();
    if cut.len() < raw.len() {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests;
