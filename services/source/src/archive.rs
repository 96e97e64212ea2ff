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

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};
use zip::read::{ArchiveOffset, Config as ZipConfig};
use zip::result::ZipError;

use crate::links;
use crate::paths::{MAX_PATH_BYTES, SourcePath};

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
    let format =
        sniff(head.get(..head_len).unwrap_or_default()).ok_or(ArchiveError::Unrecognized)?;
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

// ---------------------------------------------------------------------------------------------
// Accounting shared by every reader of one archive.

/// What every layer of one read shares: the running byte total, and the first reason the
/// archive was refused. Readers can only report `io::Error`s up through the tar crate, the
/// decoders and the callback, so the precise cause is kept here and wins over whatever error
/// finally comes back.
struct Meter {
    limits: Limits,
    inflated: Cell<u64>,
    refused: Cell<bool>,
    failure: Cell<Option<ArchiveError>>,
    reading_tar_headers: Cell<bool>,
    tar_header_bytes_now: Cell<u64>,
    tar_header_bytes_total: Cell<u64>,
    tar_members: Cell<u64>,
    tar_ended_in_headers: Cell<bool>,
}

impl Meter {
    fn new(limits: Limits) -> Self {
        Meter {
            limits,
            inflated: Cell::new(0),
            refused: Cell::new(false),
            failure: Cell::new(None),
            reading_tar_headers: Cell::new(false),
            tar_header_bytes_now: Cell::new(0),
            tar_header_bytes_total: Cell::new(0),
            tar_members: Cell::new(0),
            tar_ended_in_headers: Cell::new(false),
        }
    }

    /// Records why the archive is refused (the first reason sticks) and returns the error the
    /// failing reader passes up.
    fn fail(&self, error: ArchiveError) -> io::Error {
        let message = error.to_string();
        if !self.refused.replace(true) {
            self.failure.set(Some(error));
        }
        io::Error::other(message)
    }

    /// Once refused, every reader fails, even if the callback swallowed the first error.
    fn refusal(&self) -> Option<io::Error> {
        self.refused
            .get()
            .then(|| io::Error::other("the archive was refused"))
    }

    /// A layer below failed. Unless something more precise was recorded first (a file read
    /// error, a cap), the archive is damaged, and that must win over whatever the callback
    /// makes of the error.
    fn damaged(&self, error: io::Error) -> io::Error {
        if self.refused.get() || error.kind() == io::ErrorKind::Interrupted {
            return error;
        }
        self.fail(corrupt_from_io(&error))
    }

    fn take_failure(&self) -> Option<ArchiveError> {
        self.failure.take()
    }

    /// The archive error behind an `io::Error` that came back up through the layers.
    fn resolve(&self, error: &io::Error) -> ArchiveError {
        self.take_failure()
            .unwrap_or_else(|| corrupt_from_io(error))
    }

    /// Header bytes (tar headers, long names and pax records; a zip's central directory and
    /// local headers) count against the import's byte limit like inflated content: they
    /// cost as much to read, and the tar reader holds a member's whole.
    fn count_header_bytes(&self, n: u64) -> io::Result<()> {
        let inflated = self.inflated.get().saturating_add(n);
        self.inflated.set(inflated);
        if inflated > self.limits.max_total_bytes {
            return Err(self.fail(ArchiveError::TooLarge {
                max: self.limits.max_total_bytes,
            }));
        }
        Ok(())
    }

    fn begin_tar_headers(&self) {
        self.tar_header_bytes_now.set(0);
        self.reading_tar_headers.set(true);
    }

    fn end_tar_headers(&self) {
        self.reading_tar_headers.set(false);
    }

    fn count_tar_header_bytes(&self, n: usize) -> io::Result<()> {
        if !self.reading_tar_headers.get() {
            return Ok(());
        }
        let n = n as u64;
        let now = self.tar_header_bytes_now.get().saturating_add(n);
        let total = self.tar_header_bytes_total.get().saturating_add(n);
        self.tar_header_bytes_now.set(now);
        self.tar_header_bytes_total.set(total);
        self.count_header_bytes(n)?;
        let allowed_total = TAR_HEADER_BYTES_BASE.saturating_add(
            self.tar_members
                .get()
                .saturating_mul(TAR_HEADER_BYTES_AVERAGE),
        );
        if now > TAR_HEADER_BYTES_PER_MEMBER_MAX || total > allowed_total {
            return Err(self.fail(ArchiveError::Corrupt(
                "the tar headers (long names, pax records) are far larger \
                 than any real archive needs"
                    .to_owned(),
            )));
        }
        Ok(())
    }
}

fn corrupt_from_io(error: &io::Error) -> ArchiveError {
    if error.kind() == io::ErrorKind::UnexpectedEof {
        ArchiveError::Corrupt("the archive ends too early (truncated upload?)".to_owned())
    } else {
        ArchiveError::Corrupt(error.to_string())
    }
}

/// Sits directly on the file so that a real read failure is reported as `Io` and not
/// mistaken for damaged data by the decoders above it.
struct FileGuard<'m, R> {
    inner: R,
    meter: &'m Meter,
}

impl<R: Read> Read for FileGuard<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|error| {
            if error.kind() != io::ErrorKind::Interrupted {
                let copy = io::Error::new(error.kind(), error.to_string());
                self.meter.fail(ArchiveError::Io(copy));
            }
        })
    }
}

/// Third-party decoders run on attacker-chosen bytes and some carry `expect`s on paths we
/// cannot prove unreachable; a panic there must refuse the upload, not unwind through the
/// service.
struct PanicFence<'m, R> {
    inner: R,
    meter: &'m Meter,
    crashed: bool,
}

impl<'m, R> PanicFence<'m, R> {
    fn new(inner: R, meter: &'m Meter) -> Self {
        PanicFence {
            inner,
            meter,
            crashed: false,
        }
    }
}

impl<R: Read> Read for PanicFence<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.crashed {
            return Err(io::Error::other("the decompressor already failed"));
        }
        let inner = &mut self.inner;
        match panic::catch_unwind(AssertUnwindSafe(|| inner.read(buf))) {
            Ok(result) => result,
            Err(_) => {
                self.crashed = true;
                Err(self.meter.fail(ArchiveError::Corrupt(
                    "the decompressor failed on malformed data".to_owned(),
                )))
            }
        }
    }
}

/// What a member's bytes are checked against when they end.
enum Integrity {
    /// Tar: exactly this many bytes (the tar crate stops there; fewer means truncation).
    Length(u64),
    /// Zip: the central directory's size and CRC-32.
    Zip {
        size: u64,
        crc: u32,
        hasher: flate2::Crc,
    },
}

/// Every byte a member inflates to passes through here, read by the callback or drained
/// after it, so the caps hold whether or not anyone looks at the content.
struct Counted<'m, R> {
    inner: R,
    meter: &'m Meter,
    name: String,
    /// Files count against `max_file_bytes`; skipped members' data only against the total.
    is_file: bool,
    integrity: Integrity,
    produced: u64,
    finished: bool,
}

impl<'m, R: Read> Counted<'m, R> {
    fn new(inner: R, meter: &'m Meter, name: String, is_file: bool, integrity: Integrity) -> Self {
        Counted {
            inner,
            meter,
            name,
            is_file,
            integrity,
            produced: 0,
            finished: false,
        }
    }

    /// Bytes that may still be handed out before some cap is passed.
    fn room(&self) -> u64 {
        let limits = self.meter.limits;
        let mut room = limits
            .max_total_bytes
            .saturating_sub(self.meter.inflated.get());
        if self.is_file {
            room = room.min(limits.max_file_bytes.saturating_sub(self.produced));
        }
        if let Integrity::Zip { size, .. } = self.integrity {
            room = room.min(size.saturating_sub(self.produced));
        }
        room
    }

    /// One byte more than `room` exists: name the cap it passes.
    fn overflow(&self) -> io::Error {
        let limits = self.meter.limits;
        let error = match self.integrity {
            Integrity::Zip { size, .. } if self.produced >= size => {
                ArchiveError::Ambiguous(format!(
                    "{:?} inflates past its declared size of {size} bytes",
                    self.name
                ))
            }
            _ if self.is_file && self.produced >= limits.max_file_bytes => {
                ArchiveError::FileTooLarge {
                    path: self.name.clone(),
                    max: limits.max_file_bytes,
                }
            }
            _ => ArchiveError::TooLarge {
                max: limits.max_total_bytes,
            },
        };
        self.meter.fail(error)
    }

    /// The member's bytes ended: only now may the reader say so.
    fn finish(&mut self) -> io::Result<usize> {
        let problem = match &self.integrity {
            Integrity::Length(expected) if self.produced != *expected => Some(format!(
                "{:?} is cut short: {} of {expected} bytes",
                self.name, self.produced
            )),
            Integrity::Zip { size, .. } if self.produced != *size => Some(format!(
                "{:?} inflates to {} bytes but declares {size}",
                self.name, self.produced
            )),
            Integrity::Zip { crc, hasher, .. } if hasher.sum() != *crc => {
                Some(format!("{:?} fails its CRC-32 check", self.name))
            }
            _ => None,
        };
        if let Some(problem) = problem {
            return Err(self.meter.fail(ArchiveError::Corrupt(problem)));
        }
        self.finished = true;
        Ok(0)
    }
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(refused) = self.meter.refusal() {
            return Err(refused);
        }
        if self.finished || buf.is_empty() {
            return Ok(0);
        }
        let room = self.room();
        if room == 0 {
            // Probe for one byte past the cap without handing it to the caller.
            let mut probe = [0u8; 1];
            let probed = self.inner.read(&mut probe);
            return match probed.map_err(|error| self.meter.damaged(error))? {
                0 => self.finish(),
                _ => Err(self.overflow()),
            };
        }
        let want = usize::try_from(room).map_or(buf.len(), |room| room.min(buf.len()));
        let window = buf.get_mut(..want).unwrap_or_default();
        let n = self
            .inner
            .read(window)
            .map_err(|error| self.meter.damaged(error))?;
        if n == 0 {
            return self.finish();
        }
        let delivered = window.get(..n).unwrap_or_default();
        if let Integrity::Zip { hasher, .. } = &mut self.integrity {
            hasher.update(delivered);
        }
        self.produced = self.produced.saturating_add(n as u64);
        self.meter
            .inflated
            .set(self.meter.inflated.get().saturating_add(n as u64));
        Ok(n)
    }
}

fn deliver(meter: &Meter, sink: &mut Sink<'_>, entry: Entry<'_>) -> Result<(), ArchiveError> {
    let outcome = sink(entry);
    // A limit or integrity failure wins even when the callback turned it into its own error
    // or swallowed it.
    if let Some(failure) = meter.take_failure() {
        return Err(failure);
    }
    outcome.map_err(ArchiveError::Sink)
}

fn drain(reader: &mut impl Read, meter: &Meter) -> Result<(), ArchiveError> {
    io::copy(reader, &mut io::sink())
        .map(drop)
        .map_err(|error| meter.resolve(&error))
}

// ---------------------------------------------------------------------------------------------
// Names: shared by zip and tar.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemberKind {
    Directory,
    File { executable: bool },
    Symlink,
    Skip(SkipReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameStyle {
    Zip,
    Tar,
}

enum Verdict {
    /// The tar root (`.`, `./`): says nothing about the content.
    Ignore,
    Directory(SourcePath),
    File(SourcePath, bool),
    Symlink(SourcePath, String),
    Skipped(SkipReason),
}

/// Every name seen so far, and the shape of what landed.
#[derive(Default)]
struct Names {
    /// Digests of the normalized raw names of all members, landed or skipped: 32 bytes per
    /// member however long its name (a flood of 15 KB names must not be kept whole).
    seen: HashSet<[u8; 32]>,
    landed: Tree,
}

impl Names {
    /// `link_target`: a symlink's raw target (ignored for other kinds).
    fn judge(
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

// ---------------------------------------------------------------------------------------------
// Tar, plain or decompressed.

/// The decompressed tar stream, as the tar crate reads it: counts what it reads for headers.
struct TarStream<'m> {
    inner: Box<dyn Read + 'm>,
    meter: &'m Meter,
}

impl Read for TarStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(refused) = self.meter.refusal() {
            return Err(refused);
        }
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() && self.meter.reading_tar_headers.get() {
            self.meter.tar_ended_in_headers.set(true);
        }
        self.meter.count_tar_header_bytes(n)?;
        Ok(n)
    }
}

enum TarKind {
    Member(MemberKind),
    /// A pax global header: metadata for the whole archive, not a member.
    Global,
}

fn read_tar<'m>(
    mut stream: Box<dyn Read + 'm>,
    meter: &'m Meter,
    sink: &mut Sink<'_>,
) -> Result<(), ArchiveError> {
    let mut first = [0u8; TAR_BLOCK];
    let got = read_up_to(&mut stream, &mut first).map_err(|error| meter.resolve(&error))?;
    if !is_tar_start(first.get(..got).unwrap_or_default()) {
        return Err(ArchiveError::Unrecognized);
    }
    let mut archive = tar::Archive::new(TarStream {
        inner: Box::new(io::Cursor::new(first).chain(stream)),
        meter,
    });
    read_tar_members(&mut archive, meter, sink)?;
    check_tar_trailer(&mut archive.into_inner(), meter)
}

fn read_tar_members(
    archive: &mut tar::Archive<TarStream<'_>>,
    meter: &Meter,
    sink: &mut Sink<'_>,
) -> Result<(), ArchiveError> {
    let mut names = Names::default();
    let mut members: u64 = 0;
    let mut entries = archive.entries().map_err(|error| meter.resolve(&error))?;
    loop {
        meter.begin_tar_headers();
        let next = entries.next();
        meter.end_tar_headers();
        let entry = match next {
            // The tar crate also ends quietly when the input ends between two members; only
            // the zero block tells an end from a truncated upload.
            None if meter.tar_ended_in_headers.get() => {
                return Err(ArchiveError::Corrupt(
                    "the tar archive has no end-of-archive marker (truncated upload?)".to_owned(),
                ));
            }
            None => return Ok(()),
            Some(Ok(entry)) => entry,
            Some(Err(error)) => return Err(meter.resolve(&error)),
        };
        members += 1;
        if members > meter.limits.max_entries {
            return Err(ArchiveError::TooManyEntries {
                max: meter.limits.max_entries,
            });
        }
        meter.tar_members.set(members);
        read_tar_member(entry, &mut names, meter, sink)?;
    }
}

fn read_tar_member<R: Read>(
    mut entry: tar::Entry<'_, R>,
    names: &mut Names,
    meter: &Meter,
    sink: &mut Sink<'_>,
) -> Result<(), ArchiveError> {
    let raw = entry.path_bytes().into_owned();
    let size = entry.size();
    let kind = match tar_kind(entry.header(), &raw)? {
        TarKind::Global => return check_pax_global(&mut entry, meter),
        TarKind::Member(kind) => kind,
    };
    // An extended header surfaced as a member (its header lacked the ustar magic) is
    // skipped as Other; asking the tar crate for its records would buffer it whole.
    if !entry.header().entry_type().is_pax_local_extensions() {
        check_pax_records(&mut entry, &raw)?;
    }
    let must_be_empty = match kind {
        MemberKind::Directory | MemberKind::Symlink => true,
        MemberKind::Skip(reason) => reason != SkipReason::Other,
        MemberKind::File { .. } => false,
    };
    if size != 0 && must_be_empty {
        return Err(ArchiveError::Ambiguous(format!(
            "{:?} is not a regular file but carries {size} bytes of data, \
             which tar readers skip or read differently",
            shown(&raw)
        )));
    }

    let link_target = match kind {
        MemberKind::Symlink => entry
            .link_name_bytes()
            .map(std::borrow::Cow::into_owned)
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    match names.judge(&raw, kind, &link_target, NameStyle::Tar)? {
        Verdict::Ignore => {}
        Verdict::Directory(path) => deliver(meter, sink, Entry::Directory { path })?,
        Verdict::Symlink(path, target) => {
            deliver(meter, sink, Entry::Symlink { path, target })?;
        }
        Verdict::Skipped(reason) => {
            let name = shown(&raw);
            deliver(meter, sink, Entry::Skipped { name, reason })?;
        }
        Verdict::File(path, executable) => {
            let name = path.as_str().to_owned();
            let mut content = Counted::new(&mut entry, meter, name, true, Integrity::Length(size));
            let handed = Entry::File {
                path,
                executable,
                content: &mut content,
            };
            deliver(meter, sink, handed)?;
            return drain(&mut content, meter);
        }
    }
    // Whatever was not handed out is still inflated to reach the next header, and counts.
    let mut rest = Counted::new(
        &mut entry,
        meter,
        shown(&raw),
        false,
        Integrity::Length(size),
    );
    drain(&mut rest, meter)
}

fn tar_kind(header: &tar::Header, raw: &[u8]) -> Result<TarKind, ArchiveError> {
    use tar::EntryType;
    let kind = match header.entry_type() {
        EntryType::Regular => {
            let mode = header.mode().map_err(|_| {
                ArchiveError::Corrupt(format!("{:?} has an unreadable mode field", shown(raw)))
            })?;
            MemberKind::File {
                executable: mode & 0o111 != 0,
            }
        }
        EntryType::Directory => MemberKind::Directory,
        EntryType::Symlink => MemberKind::Symlink,
        EntryType::Link => MemberKind::Skip(SkipReason::HardLink),
        EntryType::Char | EntryType::Block => MemberKind::Skip(SkipReason::Device),
        EntryType::Fifo => MemberKind::Skip(SkipReason::Fifo),
        EntryType::XGlobalHeader => return Ok(TarKind::Global),
        _ => MemberKind::Skip(SkipReason::Other),
    };
    Ok(TarKind::Member(kind))
}

/// The tar crate takes the first `path` record and skips malformed ones; other readers take
/// the last, or stop. Refuse anything where that choice would matter.
fn check_pax_records<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    raw: &[u8],
) -> Result<(), ArchiveError> {
    let records = entry
        .pax_extensions()
        .map_err(|error| corrupt_from_io(&error))?;
    let Some(records) = records else {
        return Ok(());
    };
    let mut keys = HashSet::new();
    let mut pax_path = None;
    for record in records {
        let record = record.map_err(|_| {
            ArchiveError::Corrupt(format!("a malformed pax record precedes {:?}", shown(raw)))
        })?;
        if !keys.insert(record.key_bytes()) {
            return Err(ArchiveError::Ambiguous(format!(
                "the pax header of {:?} repeats the key {:?}",
                shown(raw),
                shown(record.key_bytes())
            )));
        }
        if record.key_bytes() == b"path" {
            pax_path = Some(record.value_bytes());
        }
    }
    if pax_path.is_some_and(|path| path != raw) {
        return Err(ArchiveError::Ambiguous(format!(
            "{:?} has both a GNU long name and a different pax path",
            shown(raw)
        )));
    }
    Ok(())
}

/// Readers disagree on whether a global header's `path`, `linkpath` or `size` applies to the
/// members that follow, so those are refused; anything else in it (git's commit comment) is
/// harmless.
fn check_pax_global<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    meter: &Meter,
) -> Result<(), ArchiveError> {
    let size = entry.size();
    if size > TAR_HEADER_BYTES_PER_MEMBER_MAX {
        return Err(ArchiveError::Corrupt(format!(
            "a pax global header of {size} bytes is far larger than any real archive needs"
        )));
    }
    let mut records = Vec::new();
    Counted::new(
        entry,
        meter,
        "pax global header".to_owned(),
        false,
        Integrity::Length(size),
    )
    .read_to_end(&mut records)
    .map_err(|error| meter.resolve(&error))?;
    for record in tar::PaxExtensions::new(&records) {
        let record = record.map_err(|_| {
            ArchiveError::Corrupt("the pax global header has a malformed record".to_owned())
        })?;
        if matches!(record.key_bytes(), b"path" | b"linkpath" | b"size") {
            return Err(ArchiveError::Ambiguous(format!(
                "a pax global header sets {:?}, which tar readers apply differently",
                shown(record.key_bytes())
            )));
        }
    }
    Ok(())
}

/// After the end-of-archive block only zero padding may follow: anything else is content
/// that a reader ignoring zero blocks (`tar -i`) would unpack and we would not. Reading to
/// the end also makes the decompressor check its own trailer (gzip CRC, xz index).
fn check_tar_trailer(stream: &mut impl Read, meter: &Meter) -> Result<(), ArchiveError> {
    let mut buf = [0u8; 8192];
    let mut seen: u64 = 0;
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(meter.resolve(&error)),
        };
        seen = seen.saturating_add(n as u64);
        if buf
            .get(..n)
            .unwrap_or_default()
            .iter()
            .any(|&byte| byte != 0)
        {
            return Err(ArchiveError::Ambiguous(
                "data follows the end of the tar archive".to_owned(),
            ));
        }
        if seen > TAR_TRAILER_MAX {
            return Err(ArchiveError::Ambiguous(format!(
                "more than {TAR_TRAILER_MAX} bytes of padding follow the end of the tar archive"
            )));
        }
    }
}

/// Zstandard allows several frames (and skippable frames) back to back, as `cat a.zst b.zst`
/// makes; `zstd -d` decodes them all, so we must too. Each frame's checksum, when present,
/// is verified.
struct ZstdFrames<R> {
    source: R,
    decoder: FrameDecoder,
    in_frame: bool,
}

impl<R> ZstdFrames<R> {
    fn new(source: R) -> Self {
        ZstdFrames {
            source,
            decoder: FrameDecoder::new(),
            in_frame: false,
        }
    }
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if self.source.fill_buf()?.is_empty() {
                    return Ok(0);
                }
                match self.decoder.reset(&mut self.source) {
                    Ok(()) => self.in_frame = true,
                    Err(FrameDecoderError::ReadFrameHeaderError(
                        ReadFrameHeaderError::SkipFrame { length, .. },
                    )) => {
                        let length = u64::from(length);
                        let skipped =
                            io::copy(&mut (&mut self.source).take(length), &mut io::sink())?;
                        if skipped != length {
                            return Err(io::ErrorKind::UnexpectedEof.into());
                        }
                    }
                    Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error)),
                }
                continue;
            }
            while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                self.decoder
                    .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                    .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
            }
            let n = self.decoder.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if !self.decoder.is_finished() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the zstd decoder stopped making progress",
                ));
            }
            if let Some(stored) = self.decoder.get_checksum_from_data()
                && Some(stored) != self.decoder.get_calculated_checksum()
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a zstd frame fails its checksum",
                ));
            }
            self.in_frame = false;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Zip.

const ZIP_END_SIGNATURE: u32 = 0x0605_4b50;
const ZIP_END_LEN: usize = 22;
const ZIP64_LOCATOR_SIGNATURE: u32 = 0x0706_4b50;
const ZIP64_LOCATOR_LEN: usize = 20;
const ZIP64_END_SIGNATURE: u32 = 0x0606_4b50;
const ZIP64_END_LEN: usize = 56;
const ZIP_CENTRAL_SIGNATURE: u32 = 0x0201_4b50;
const ZIP_CENTRAL_LEN: usize = 46;
const ZIP_LOCAL_SIGNATURE: u32 = 0x0403_4b50;
const ZIP_LOCAL_LEN: usize = 30;
const ZIP_FLAG_ENCRYPTED: u16 = 1;
const ZIP_FLAG_DATA_DESCRIPTOR: u16 = 1 << 3;
const ZIP_METHOD_STORED: u16 = 0;
const ZIP_METHOD_DEFLATED: u16 = 8;
const ZIP64_EXTRA_ID: u16 = 0x0001;
/// Largest central directory read: 200,000 entries (the default entry cap) of a few hundred
/// bytes each, which real archives stay far below.
const ZIP_CENTRAL_MAX: u64 = 64 << 20;

const S_IFMT: u32 = 0o170_000;
const S_IFIFO: u32 = 0o010_000;
const S_IFCHR: u32 = 0o020_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFBLK: u32 = 0o060_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;

fn le16(bytes: &[u8], at: usize) -> u16 {
    bytes
        .get(at..at + 2)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u16::from_le_bytes)
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn le64(bytes: &[u8], at: usize) -> Option<u64> {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
}

fn zip_io(error: io::Error) -> ArchiveError {
    if error.kind() == io::ErrorKind::UnexpectedEof {
        ArchiveError::Corrupt("the zip is truncated".to_owned())
    } else {
        ArchiveError::Io(error)
    }
}

fn zip_error(error: ZipError) -> ArchiveError {
    match error {
        ZipError::Io(error) => zip_io(error),
        other => ArchiveError::Corrupt(other.to_string()),
    }
}

fn read_exact_at(file: &File, offset: u64, buf: &mut [u8]) -> Result<(), ArchiveError> {
    FileCursor::at(file, offset).read_exact(buf).map_err(zip_io)
}

/// Where the end records say the archive's parts are.
struct ZipEnd {
    entries: u64,
    central_offset: u64,
    central_size: u64,
    /// Where the central directory must end: the zip64 end record, or the end record.
    central_end: u64,
    comment: Vec<u8>,
}

/// One central-directory header as written, before the zip crate applies a Unicode Path
/// extra field to the name.
struct CentralRecord {
    name: Vec<u8>,
    flags: u16,
    method: u16,
    local_offset: u32,
}

struct ZipMember {
    name: Vec<u8>,
    kind: MemberKind,
    method: u16,
    data_start: u64,
    compressed_size: u64,
    size: u64,
    crc: u32,
}

fn read_zip(file: &File, meter: &Meter, sink: &mut Sink<'_>) -> Result<(), ArchiveError> {
    let file_len = file.metadata().map_err(ArchiveError::Io)?.len();
    let end = find_zip_end(file, file_len)?;
    // Before anything else looks at the central directory, so a million-entry claim costs
    // nothing.
    if end.entries > meter.limits.max_entries {
        return Err(ArchiveError::TooManyEntries {
            max: meter.limits.max_entries,
        });
    }
    // The zip reader holds the whole central directory (every name and extra field) in
    // memory: bounded here, before it is read, and counted like inflated bytes.
    if end.central_size > ZIP_CENTRAL_MAX {
        return Err(ArchiveError::Corrupt(format!(
            "the central directory is {} bytes, more than the {ZIP_CENTRAL_MAX} bytes \
             any archive of real files needs (names are at most {MAX_PATH_BYTES} bytes)",
            end.central_size
        )));
    }
    if end.central_offset.checked_add(end.central_size) != Some(end.central_end) {
        return Err(ArchiveError::Ambiguous(
            "the central directory is not where the end record says: \
             data was added before or inside the zip"
                .to_owned(),
        ));
    }
    if end.entries.saturating_mul(ZIP_CENTRAL_LEN as u64) > end.central_size {
        return Err(ArchiveError::Corrupt(
            "the central directory is too small for the entries it claims".to_owned(),
        ));
    }
    meter
        .count_header_bytes(end.central_size)
        .map_err(|error| meter.resolve(&error))?;
    let central = read_central_directory(file, &end)?;
    let mut raw_names = HashSet::new();
    for record in &central {
        if !raw_names.insert(record.name.as_slice()) {
            let name = record.name.strip_suffix(b"/").unwrap_or(&record.name);
            return Err(ArchiveError::Duplicate(shown(name)));
        }
    }

    let config = ZipConfig {
        archive_offset: ArchiveOffset::Known(0),
    };
    let mut archive = zip::ZipArchive::with_config(config, BufReader::new(FileCursor::at(file, 0)))
        .map_err(zip_error)?;
    if archive.offset() != 0
        || archive.len() != central.len()
        || archive.central_directory_start() != end.central_offset
        || archive.comment() != end.comment.as_slice()
    {
        return Err(ArchiveError::Ambiguous(
            "the zip reader and the end record disagree on the central directory".to_owned(),
        ));
    }

    let mut members = Vec::with_capacity(central.len());
    let mut ranges = Vec::with_capacity(central.len());
    for (index, record) in central.iter().enumerate() {
        let entry = archive.by_index_data(index).map_err(zip_error)?;
        let header_start = entry.header_start();
        if record.local_offset != u32::MAX && u64::from(record.local_offset) != header_start {
            return Err(ArchiveError::Ambiguous(format!(
                "zip readers disagree on where {:?} starts",
                shown(&record.name)
            )));
        }
        if record.flags & ZIP_FLAG_ENCRYPTED != 0 {
            return Err(ArchiveError::Corrupt(format!(
                "{:?} is encrypted; encrypted zips are not supported",
                shown(&record.name)
            )));
        }
        let local = read_local_header(file, header_start, record)?;
        let (crc, compressed_size, size) = (entry.crc32(), entry.compressed_size(), entry.size());
        if record.flags & ZIP_FLAG_DATA_DESCRIPTOR == 0
            && (local.crc, local.compressed_size, local.size) != (crc, compressed_size, size)
        {
            return Err(ArchiveError::Ambiguous(format!(
                "the local header of {:?} disagrees with the central directory on CRC or sizes",
                shown(&record.name)
            )));
        }
        meter
            .count_header_bytes(local.data_start.saturating_sub(header_start))
            .map_err(|error| meter.resolve(&error))?;
        let data_end = local
            .data_start
            .checked_add(compressed_size)
            .ok_or_else(|| ArchiveError::Corrupt("a zip entry ends past 2^64".to_owned()))?;
        ranges.push(header_start..data_end);

        let name = entry.name_raw().to_vec();
        let kind = zip_kind(&name, entry.unix_mode());
        if matches!(kind, MemberKind::File { .. } | MemberKind::Symlink)
            && !matches!(record.method, ZIP_METHOD_STORED | ZIP_METHOD_DEFLATED)
        {
            return Err(ArchiveError::Corrupt(format!(
                "{:?} uses zip compression method {}; only stored and deflate are supported",
                shown(&name),
                record.method
            )));
        }
        members.push(ZipMember {
            name,
            kind,
            method: record.method,
            data_start: local.data_start,
            compressed_size,
            size,
            crc,
        });
    }
    check_zip_ranges(&mut ranges, end.central_offset)?;
    // The zip crate's own check adds what ours does not cover: Unicode Path fields that
    // differ between local and central headers, and local headers hidden in the gaps
    // between entries that a streaming unzipper would find.
    archive
        .validate_header_consistency()
        .map_err(|error| match error {
            ZipError::Io(error) => zip_io(error),
            other => ArchiveError::Ambiguous(other.to_string()),
        })?;
    drop(archive);

    // A zip link's target is its content: read (and checked against its CRC) before any
    // name is judged, since whether it stays decides whether a name beneath it may land.
    let mut link_targets: Vec<Vec<u8>> = Vec::with_capacity(members.len());
    for member in &members {
        let mut target = Vec::new();
        if member.kind == MemberKind::Symlink {
            let mut content = zip_content(file, meter, member, shown(&member.name), false);
            (&mut content)
                .take(MAX_PATH_BYTES as u64 + 1)
                .read_to_end(&mut target)
                .map_err(|error| meter.resolve(&error))?;
            drain(&mut content, meter)?;
        }
        link_targets.push(target);
    }
    let mut names = Names::default();
    let verdicts = members
        .iter()
        .zip(&link_targets)
        .map(|(member, target)| names.judge(&member.name, member.kind, target, NameStyle::Zip))
        .collect::<Result<Vec<_>, _>>()?;

    for (member, verdict) in members.iter().zip(verdicts) {
        match verdict {
            Verdict::Ignore => {}
            Verdict::Directory(path) => deliver(meter, sink, Entry::Directory { path })?,
            Verdict::Symlink(path, target) => {
                deliver(meter, sink, Entry::Symlink { path, target })?;
            }
            Verdict::Skipped(reason) => {
                let name = shown(&member.name);
                deliver(meter, sink, Entry::Skipped { name, reason })?;
            }
            Verdict::File(path, executable) => {
                let name = path.as_str().to_owned();
                let mut content = zip_content(file, meter, member, name, true);
                let handed = Entry::File {
                    path,
                    executable,
                    content: &mut content,
                };
                deliver(meter, sink, handed)?;
                // Read to the end even if the callback did not: the CRC and size checks, and
                // the caps, hold for every member.
                drain(&mut content, meter)?;
            }
        }
    }
    Ok(())
}

/// A zip member's inflated bytes, counted and checked against its CRC and size.
fn zip_content<'a>(
    file: &'a File,
    meter: &'a Meter,
    member: &ZipMember,
    name: String,
    is_file: bool,
) -> Counted<'a, Box<dyn Read + 'a>> {
    let source = FileGuard {
        inner: FileCursor::at(file, member.data_start),
        meter,
    };
    let compressed = BufReader::new(source).take(member.compressed_size);
    let inflated: Box<dyn Read + 'a> = if member.method == ZIP_METHOD_STORED {
        Box::new(compressed)
    } else {
        let decoder = flate2::bufread::DeflateDecoder::new(compressed);
        Box::new(PanicFence::new(decoder, meter))
    };
    let integrity = Integrity::Zip {
        size: member.size,
        crc: member.crc,
        hasher: flate2::Crc::new(),
    };
    Counted::new(inflated, meter, name, is_file, integrity)
}

/// The end record whose comment reaches exactly the end of the file. None means truncation
/// or appended data; two mean a forged record hidden in a comment.
fn find_zip_end(file: &File, file_len: u64) -> Result<ZipEnd, ArchiveError> {
    let window_start = file_len.saturating_sub((ZIP_END_LEN + usize::from(u16::MAX)) as u64);
    let window_len = usize::try_from(file_len - window_start).unwrap_or(0);
    let mut tail = vec![0u8; window_len];
    read_exact_at(file, window_start, &mut tail)?;

    let mut consistent = Vec::new();
    let mut followed_by_data = false;
    for at in 0..tail.len().saturating_sub(ZIP_END_LEN - 1) {
        if le32(&tail, at) != ZIP_END_SIGNATURE {
            continue;
        }
        let record_end = at + ZIP_END_LEN + usize::from(le16(&tail, at + 20));
        match record_end.cmp(&tail.len()) {
            std::cmp::Ordering::Equal => consistent.push(at),
            std::cmp::Ordering::Less => followed_by_data = true,
            std::cmp::Ordering::Greater => {}
        }
    }
    let at = match consistent.as_slice() {
        [at] => *at,
        [] if followed_by_data => {
            return Err(ArchiveError::Ambiguous(
                "data follows the end of the zip archive".to_owned(),
            ));
        }
        [] => {
            return Err(ArchiveError::Corrupt(
                "the zip end record is missing (truncated upload?)".to_owned(),
            ));
        }
        _ => {
            return Err(ArchiveError::Ambiguous(
                "the zip has more than one end record".to_owned(),
            ));
        }
    };
    let record = tail.get(at..at + ZIP_END_LEN).unwrap_or_default();
    let comment = tail.get(at + ZIP_END_LEN..).unwrap_or_default().to_vec();
    let end_offset = window_start + at as u64;
    let multi_disk =
        || ArchiveError::Corrupt("split (multi-disk) zip archives are not supported".to_owned());

    let mut locator = [0u8; ZIP64_LOCATOR_LEN];
    let zip64_locator_offset = match end_offset.checked_sub(ZIP64_LOCATOR_LEN as u64) {
        Some(offset) => {
            read_exact_at(file, offset, &mut locator)?;
            (le32(&locator, 0) == ZIP64_LOCATOR_SIGNATURE).then_some(offset)
        }
        None => None,
    };
    let Some(locator_offset) = zip64_locator_offset else {
        if le16(record, 4) != 0 || le16(record, 6) != 0 || le16(record, 8) != le16(record, 10) {
            return Err(multi_disk());
        }
        return Ok(ZipEnd {
            entries: u64::from(le16(record, 10)),
            central_size: u64::from(le32(record, 12)),
            central_offset: u64::from(le32(record, 16)),
            central_end: end_offset,
            comment,
        });
    };
    let zip64_offset = le64(&locator, 8).unwrap_or(u64::MAX);
    if le32(&locator, 4) != 0 || le32(&locator, 16) > 1 {
        return Err(multi_disk());
    }
    if zip64_offset.saturating_add(ZIP64_END_LEN as u64) > locator_offset {
        return Err(ArchiveError::Corrupt(
            "the zip64 end record is out of place".to_owned(),
        ));
    }
    let mut zip64 = [0u8; ZIP64_END_LEN];
    read_exact_at(file, zip64_offset, &mut zip64)?;
    let field = |at| le64(&zip64, at).unwrap_or(u64::MAX);
    if le32(&zip64, 0) != ZIP64_END_SIGNATURE {
        return Err(ArchiveError::Corrupt(
            "the zip64 end record is missing".to_owned(),
        ));
    }
    if zip64_offset
        .checked_add(12)
        .and_then(|start| start.checked_add(field(4)))
        != Some(locator_offset)
    {
        return Err(ArchiveError::Ambiguous(
            "data lies between the zip64 end record and its locator".to_owned(),
        ));
    }
    if le32(&zip64, 16) != 0 || le32(&zip64, 20) != 0 || field(24) != field(32) {
        return Err(multi_disk());
    }
    Ok(ZipEnd {
        entries: field(32),
        central_size: field(40),
        central_offset: field(48),
        central_end: zip64_offset,
        comment,
    })
}

fn read_central_directory(file: &File, end: &ZipEnd) -> Result<Vec<CentralRecord>, ArchiveError> {
    let mut reader =
        BufReader::new(FileCursor::at(file, end.central_offset).take(end.central_size));
    // `entries` is already capped by the limits, but the allocation need not trust it.
    let mut records = Vec::with_capacity(usize::try_from(end.entries.min(4096)).unwrap_or(0));
    for _ in 0..end.entries {
        let mut fixed = [0u8; ZIP_CENTRAL_LEN];
        reader.read_exact(&mut fixed).map_err(zip_io)?;
        if le32(&fixed, 0) != ZIP_CENTRAL_SIGNATURE {
            return Err(ArchiveError::Corrupt(
                "a central directory header has a bad signature".to_owned(),
            ));
        }
        let mut name = vec![0u8; usize::from(le16(&fixed, 28))];
        reader.read_exact(&mut name).map_err(zip_io)?;
        let skip = u64::from(le16(&fixed, 30)) + u64::from(le16(&fixed, 32));
        if io::copy(&mut (&mut reader).take(skip), &mut io::sink()).map_err(zip_io)? != skip {
            return Err(ArchiveError::Corrupt(
                "the central directory is truncated".to_owned(),
            ));
        }
        records.push(CentralRecord {
            name,
            flags: le16(&fixed, 8),
            method: le16(&fixed, 10),
            local_offset: le32(&fixed, 42),
        });
    }
    let mut leftover = [0u8; 1];
    if reader.read(&mut leftover).map_err(zip_io)? != 0 {
        return Err(ArchiveError::Ambiguous(
            "the central directory holds data beyond its listed entries".to_owned(),
        ));
    }
    Ok(records)
}

struct LocalHeader {
    data_start: u64,
    crc: u32,
    compressed_size: u64,
    size: u64,
}

fn read_local_header(
    file: &File,
    header_start: u64,
    record: &CentralRecord,
) -> Result<LocalHeader, ArchiveError> {
    let name = || shown(&record.name);
    let mut fixed = [0u8; ZIP_LOCAL_LEN];
    read_exact_at(file, header_start, &mut fixed)?;
    if le32(&fixed, 0) != ZIP_LOCAL_SIGNATURE {
        return Err(ArchiveError::Corrupt(format!(
            "no local header where the central directory puts {:?}",
            name()
        )));
    }
    let name_len = usize::from(le16(&fixed, 26));
    let extra_len = usize::from(le16(&fixed, 28));
    let mut variable = vec![0u8; name_len + extra_len];
    // The fixed part was just read from `header_start`, so these sums stay inside the file.
    let variable_start = header_start.saturating_add(ZIP_LOCAL_LEN as u64);
    read_exact_at(file, variable_start, &mut variable)?;
    let local_name = variable.get(..name_len).unwrap_or_default();
    let extra = variable.get(name_len..).unwrap_or_default();
    if local_name != record.name.as_slice() {
        return Err(ArchiveError::Ambiguous(format!(
            "the local header names {:?} but the central directory names {:?}",
            shown(local_name),
            name()
        )));
    }
    let flags = le16(&fixed, 6);
    if le16(&fixed, 8) != record.method
        || (flags ^ record.flags) & (ZIP_FLAG_ENCRYPTED | ZIP_FLAG_DATA_DESCRIPTOR) != 0
    {
        return Err(ArchiveError::Ambiguous(format!(
            "the local header of {:?} disagrees with the central directory on method or flags",
            name()
        )));
    }
    let short_compressed = le32(&fixed, 18);
    let short_size = le32(&fixed, 22);
    let mut compressed_size = u64::from(short_compressed);
    let mut size = u64::from(short_size);
    if short_compressed == u32::MAX || short_size == u32::MAX {
        let zip64 = find_extra_field(extra, ZIP64_EXTRA_ID).ok_or_else(|| {
            ArchiveError::Corrupt(format!(
                "the local header of {:?} lacks its zip64 sizes",
                name()
            ))
        })?;
        let truncated =
            || ArchiveError::Corrupt(format!("the zip64 sizes of {:?} are truncated", name()));
        let mut at = 0;
        if short_size == u32::MAX {
            size = le64(zip64, at).ok_or_else(truncated)?;
            at += 8;
        }
        if short_compressed == u32::MAX {
            compressed_size = le64(zip64, at).ok_or_else(truncated)?;
        }
    }
    Ok(LocalHeader {
        data_start: variable_start.saturating_add((name_len + extra_len) as u64),
        crc: le32(&fixed, 14),
        compressed_size,
        size,
    })
}

fn find_extra_field(mut extra: &[u8], id: u16) -> Option<&[u8]> {
    while extra.len() >= 4 {
        let len = usize::from(le16(extra, 2));
        let body = extra.get(4..4 + len)?;
        if le16(extra, 0) == id {
            return Some(body);
        }
        extra = extra.get(4 + len..)?;
    }
    None
}

/// Every entry's bytes, header through data, must be its own: shared bytes are how a small
/// zip expands to terabytes (the overlapping-entry bomb), and bytes before the first entry
/// are a second archive hiding in front of this one.
fn check_zip_ranges(ranges: &mut [Range<u64>], central_offset: u64) -> Result<(), ArchiveError> {
    ranges.sort_unstable_by_key(|range| (range.start, range.end));
    if ranges.first().map_or(central_offset, |range| range.start) != 0 {
        return Err(ArchiveError::Ambiguous(
            "data precedes the first zip entry".to_owned(),
        ));
    }
    for pair in ranges.windows(2) {
        if let [earlier, later] = pair
            && earlier.end > later.start
        {
            return Err(ArchiveError::Ambiguous(
                "two zip entries share bytes (an overlapping-entry zip bomb)".to_owned(),
            ));
        }
    }
    if ranges.iter().any(|range| range.end > central_offset) {
        return Err(ArchiveError::Ambiguous(
            "a zip entry runs into the central directory".to_owned(),
        ));
    }
    Ok(())
}

fn zip_kind(name: &[u8], unix_mode: Option<u32>) -> MemberKind {
    let mode = unix_mode.unwrap_or(0);
    match mode & S_IFMT {
        S_IFLNK => MemberKind::Symlink,
        S_IFCHR | S_IFBLK => MemberKind::Skip(SkipReason::Device),
        S_IFIFO => MemberKind::Skip(SkipReason::Fifo),
        S_IFDIR => MemberKind::Directory,
        // A trailing '/' is how zip marks a directory; many writers leave the mode at 0.
        0 | S_IFREG if name.ends_with(b"/") => MemberKind::Directory,
        0 | S_IFREG => MemberKind::File {
            executable: mode & 0o111 != 0,
        },
        _ => MemberKind::Skip(SkipReason::Other),
    }
}

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
