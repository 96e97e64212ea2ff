//! Zip.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::ops::Range;

use zip::read::{ArchiveOffset, Config as ZipConfig};
use zip::result::ZipError;

use super::accounting::{Counted, FileGuard, Integrity, Meter, PanicFence, deliver, drain};
use super::names::{MemberKind, NameStyle, Names, Verdict};
use super::{ArchiveError, Entry, FileCursor, Sink, SkipReason, shown};
use crate::paths::MAX_PATH_BYTES;

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
pub(super) const ZIP_CENTRAL_MAX: u64 = 64 << 20;

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

pub(super) fn read_zip(
    file: &File,
    meter: &Meter,
    sink: &mut Sink<'_>,
) -> Result<(), ArchiveError> {
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
