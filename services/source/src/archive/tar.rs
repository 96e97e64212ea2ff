//! Tar, plain or decompressed.

use std::collections::HashSet;
use std::io::{self, BufRead, Read};

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

use super::accounting::{Counted, Integrity, Meter, corrupt_from_io, deliver, drain};
use super::names::{MemberKind, NameStyle, Names, Verdict};
use super::{
    ArchiveError, Entry, Sink, SkipReason, TAR_BLOCK, TAR_HEADER_BYTES_PER_MEMBER_MAX,
    TAR_TRAILER_MAX, is_tar_start, read_up_to, shown,
};

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

pub(super) fn read_tar<'m>(
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
pub(super) struct ZstdFrames<R> {
    source: R,
    decoder: FrameDecoder,
    in_frame: bool,
}

impl<R> ZstdFrames<R> {
    pub(super) fn new(source: R) -> Self {
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
