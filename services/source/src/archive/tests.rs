#![allow(clippy::unwrap_used)]

use std::io::{Cursor, Write};

use ::tar::{Builder, EntryType, Header};
use ::zip::CompressionMethod;
use ::zip::write::SimpleFileOptions;

use super::zip::ZIP_CENTRAL_MAX;
use super::*;

// ---------------------------------------------------------------------------------------------
// What a user observes: the entries handed out, and the result.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Dir(String),
    File {
        path: String,
        executable: bool,
        content: Vec<u8>,
    },
    Link {
        path: String,
        target: String,
    },
    Skipped {
        name: String,
        reason: SkipReason,
    },
}

struct Outcome {
    result: Result<(), ArchiveError>,
    seen: Vec<Seen>,
}

impl Outcome {
    fn content_bytes(&self) -> u64 {
        self.seen
            .iter()
            .map(|seen| match seen {
                Seen::File { content, .. } => content.len() as u64,
                _ => 0,
            })
            .sum()
    }
}

const ROOMY: Limits = Limits {
    max_entries: 10_000,
    max_total_bytes: 64 << 20,
    max_file_bytes: 16 << 20,
};

/// Reads `bytes` as an upload, with a sink that reads every file to its end.
fn read(bytes: &[u8], limits: Limits) -> Outcome {
    read_with(bytes, limits, true)
}

fn read_with(bytes: &[u8], limits: Limits, read_content: bool) -> Outcome {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(bytes).unwrap();
    let mut seen = Vec::new();
    let result = read_archive(file, &limits, &mut |entry| {
        match entry {
            Entry::Directory { path } => seen.push(Seen::Dir(path.as_str().to_owned())),
            Entry::Skipped { name, reason } => seen.push(Seen::Skipped { name, reason }),
            Entry::Symlink { path, target } => seen.push(Seen::Link {
                path: path.as_str().to_owned(),
                target,
            }),
            Entry::File {
                path,
                executable,
                content,
            } => {
                let mut bytes = Vec::new();
                let outcome = if read_content {
                    content.read_to_end(&mut bytes).map(drop)
                } else {
                    Ok(())
                };
                seen.push(Seen::File {
                    path: path.as_str().to_owned(),
                    executable,
                    content: bytes,
                });
                outcome?;
            }
        }
        Ok(())
    });
    assert_nothing_escapes(&seen);
    Outcome { result, seen }
}

fn assert_ambiguous(outcome: &Outcome, fragment: &str) {
    match &outcome.result {
        Err(ArchiveError::Ambiguous(message)) if message.contains(fragment) => {}
        other => panic!("expected Ambiguous(…{fragment}…), got {other:?}"),
    }
}

fn assert_nothing_escapes(seen: &[Seen]) {
    for entry in seen {
        let path = match entry {
            Seen::Dir(path) | Seen::File { path, .. } => path,
            Seen::Link { path, target } => {
                let link = SourcePath::parse(path).unwrap();
                assert!(
                    crate::links::kept_target(&link, target.as_bytes()).is_some(),
                    "kept {path:?} -> {target:?}"
                );
                path
            }
            Seen::Skipped { .. } => continue,
        };
        assert!(SourcePath::parse(path).is_ok(), "landed {path:?}");
        assert!(!path.starts_with('/'), "landed {path:?}");
        assert!(!path.contains('\\'), "landed {path:?}");
        assert!(
            path.split('/')
                .all(|component| component != ".." && component != "."),
            "landed {path:?}"
        );
    }
}

fn dir(path: &str) -> Seen {
    Seen::Dir(path.to_owned())
}

fn file(path: &str, executable: bool, content: &[u8]) -> Seen {
    Seen::File {
        path: path.to_owned(),
        executable,
        content: content.to_vec(),
    }
}

fn link(path: &str, target: &str) -> Seen {
    Seen::Link {
        path: path.to_owned(),
        target: target.to_owned(),
    }
}

fn skipped(name: &str, reason: SkipReason) -> Seen {
    Seen::Skipped {
        name: name.to_owned(),
        reason,
    }
}

// ---------------------------------------------------------------------------------------------
// Tar, built member by member with raw header bytes where the builder would refuse.

struct TarMaker(Builder<Vec<u8>>);

impl TarMaker {
    fn new() -> Self {
        TarMaker(Builder::new(Vec::new()))
    }

    fn member(
        mut self,
        name: &[u8],
        kind: EntryType,
        mode: u32,
        data: &[u8],
        link: Option<&str>,
    ) -> Self {
        let mut header = Header::new_ustar();
        let field = &mut header.as_old_mut().name;
        field[..name.len()].copy_from_slice(name);
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        header.set_mtime(1_700_000_000);
        if let Some(link) = link {
            header.set_link_name_literal(link).unwrap();
        }
        header.set_cksum();
        self.0.append(&header, data).unwrap();
        self
    }

    fn file(self, name: &str, mode: u32, data: &[u8]) -> Self {
        self.member(name.as_bytes(), EntryType::Regular, mode, data, None)
    }

    fn dir(self, name: &str, mode: u32) -> Self {
        self.member(name.as_bytes(), EntryType::Directory, mode, b"", None)
    }

    fn symlink(self, name: &str, target: &str) -> Self {
        self.member(
            name.as_bytes(),
            EntryType::Symlink,
            0o777,
            b"",
            Some(target),
        )
    }

    fn hard_link(self, name: &str, target: &str) -> Self {
        self.member(name.as_bytes(), EntryType::Link, 0o644, b"", Some(target))
    }

    fn special(self, name: &str, kind: EntryType) -> Self {
        self.member(name.as_bytes(), kind, 0o600, b"", None)
    }

    fn finish(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

fn bzip2(data: &[u8]) -> Vec<u8> {
    let mut encoder = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn xz(data: &[u8]) -> Vec<u8> {
    let mut writer =
        lzma_rust2::XzWriter::new(Vec::new(), lzma_rust2::XzOptions::with_preset(1)).unwrap();
    writer.write_all(data).unwrap();
    writer.finish().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Zip: the zip crate's writer, or raw records where a test needs bytes the writer refuses.

fn zip_of(build: impl FnOnce(&mut ::zip::ZipWriter<Cursor<Vec<u8>>>)) -> Vec<u8> {
    let mut writer = ::zip::ZipWriter::new(Cursor::new(Vec::new()));
    build(&mut writer);
    writer.finish().unwrap().into_inner()
}

fn deflated(mode: u32) -> SimpleFileOptions {
    SimpleFileOptions::default()
        .compression_method(CompressionMethod::Deflated)
        .unix_permissions(mode)
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(data);
    crc.sum()
}

/// One stored member as a local header plus data, and the central header pointing at it.
struct RawMember {
    name: Vec<u8>,
    data: Vec<u8>,
    /// Full `st_mode` (file type and permissions); 0 writes no Unix attributes.
    mode: u32,
}

fn raw(name: &[u8], data: &[u8], mode: u32) -> RawMember {
    RawMember {
        name: name.to_vec(),
        data: data.to_vec(),
        mode,
    }
}

fn local_header(member: &RawMember) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(0x0403_4b50u32.to_le_bytes());
    out.extend(20u16.to_le_bytes());
    out.extend(0x0800u16.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(0x21u16.to_le_bytes());
    out.extend(crc32(&member.data).to_le_bytes());
    out.extend((member.data.len() as u32).to_le_bytes());
    out.extend((member.data.len() as u32).to_le_bytes());
    out.extend((member.name.len() as u16).to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(&member.name);
    out.extend(&member.data);
    out
}

fn central_header(member: &RawMember, local_offset: u32) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(0x0201_4b50u32.to_le_bytes());
    out.extend(((3u16 << 8) | 20).to_le_bytes());
    out.extend(20u16.to_le_bytes());
    out.extend(0x0800u16.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(0x21u16.to_le_bytes());
    out.extend(crc32(&member.data).to_le_bytes());
    out.extend((member.data.len() as u32).to_le_bytes());
    out.extend((member.data.len() as u32).to_le_bytes());
    out.extend((member.name.len() as u16).to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend((member.mode << 16).to_le_bytes());
    out.extend(local_offset.to_le_bytes());
    out.extend(&member.name);
    out
}

fn end_record(entries: u16, central_size: usize, central_offset: usize) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(entries.to_le_bytes());
    out.extend(entries.to_le_bytes());
    out.extend((central_size as u32).to_le_bytes());
    out.extend((central_offset as u32).to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

fn raw_zip(members: &[RawMember]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for member in members {
        central.extend(central_header(member, out.len() as u32));
        out.extend(local_header(member));
    }
    let central_offset = out.len();
    out.extend(&central);
    out.extend(end_record(
        members.len() as u16,
        central.len(),
        central_offset,
    ));
    out
}

/// Replaces a zip's end record by zip64 end records claiming `entries` entries.
fn with_zip64_end(mut bytes: Vec<u8>, entries: u64) -> Vec<u8> {
    let end = bytes.len() - 22;
    let central_size = u64::from(le32_at(&bytes, end + 12));
    let central_offset = u64::from(le32_at(&bytes, end + 16));
    bytes.truncate(end);
    let zip64_offset = bytes.len() as u64;
    bytes.extend(0x0606_4b50u32.to_le_bytes());
    bytes.extend(44u64.to_le_bytes());
    bytes.extend(45u16.to_le_bytes());
    bytes.extend(45u16.to_le_bytes());
    bytes.extend(0u32.to_le_bytes());
    bytes.extend(0u32.to_le_bytes());
    bytes.extend(entries.to_le_bytes());
    bytes.extend(entries.to_le_bytes());
    bytes.extend(central_size.to_le_bytes());
    bytes.extend(central_offset.to_le_bytes());
    bytes.extend(0x0706_4b50u32.to_le_bytes());
    bytes.extend(0u32.to_le_bytes());
    bytes.extend(zip64_offset.to_le_bytes());
    bytes.extend(1u32.to_le_bytes());
    bytes.extend(0x0605_4b50u32.to_le_bytes());
    bytes.extend([0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]);
    bytes.extend([0xFF; 8]);
    bytes.extend([0, 0]);
    bytes
}

fn le32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn put32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Offsets of the central headers of a zip without an archive comment.
fn central_headers(bytes: &[u8]) -> Vec<usize> {
    let end = bytes.len() - 22;
    let count = u16::from_le_bytes(bytes[end + 10..end + 12].try_into().unwrap());
    let mut at = le32_at(bytes, end + 16) as usize;
    let mut headers = Vec::new();
    for _ in 0..count {
        headers.push(at);
        let lengths: usize = [28, 30, 32]
            .iter()
            .map(|field| {
                u16::from_le_bytes(bytes[at + field..at + field + 2].try_into().unwrap()) as usize
            })
            .sum();
        at += 46 + lengths;
    }
    headers
}

fn replace_first(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let at = bytes
        .windows(from.len())
        .position(|window| window == from)
        .unwrap();
    bytes[at..at + to.len()].copy_from_slice(to);
}

// ---------------------------------------------------------------------------------------------
// A small project, in every format.

fn project_expected() -> Vec<Seen> {
    let binary: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    vec![
        dir("proj"),
        dir("proj/src"),
        file("proj/README.md", false, b"# Project\n"),
        file("proj/run.sh", true, b"#!/bin/sh\necho hi\n"),
        file("proj/src/main.rs", false, b"fn main() {}\n"),
        file("proj/empty", false, b""),
        file("proj/src/data.bin", false, &binary),
    ]
}

fn project_tar() -> Vec<u8> {
    let mut tar = TarMaker::new();
    for entry in project_expected() {
        tar = match entry {
            Seen::Dir(path) => tar.dir(&format!("{path}/"), 0o755),
            Seen::File {
                path,
                executable,
                content,
            } => tar.file(&path, if executable { 0o755 } else { 0o644 }, &content),
            Seen::Link { .. } | Seen::Skipped { .. } => unreachable!(),
        };
    }
    tar.finish()
}

fn project_zip(method: CompressionMethod) -> Vec<u8> {
    zip_of(|writer| {
        for entry in project_expected() {
            match entry {
                Seen::Dir(path) => writer
                    .add_directory(format!("{path}/"), SimpleFileOptions::default())
                    .unwrap(),
                Seen::File {
                    path,
                    executable,
                    content,
                } => {
                    let options = SimpleFileOptions::default()
                        .compression_method(method)
                        .unix_permissions(if executable { 0o755 } else { 0o644 });
                    writer.start_file(path, options).unwrap();
                    writer.write_all(&content).unwrap();
                }
                Seen::Link { .. } | Seen::Skipped { .. } => unreachable!(),
            }
        }
    })
}

#[test]
fn every_format_round_trips_a_small_project_exactly() {
    let tar = project_tar();
    let uploads = [
        ("tar", tar.clone()),
        ("tar.gz", gzip(&tar)),
        ("tar.zst", zstd(&tar)),
        ("tar.bz2", bzip2(&tar)),
        ("tar.xz", xz(&tar)),
        ("zip deflated", project_zip(CompressionMethod::Deflated)),
        ("zip stored", project_zip(CompressionMethod::Stored)),
    ];
    for (format, bytes) in uploads {
        let outcome = read(&bytes, ROOMY);
        assert!(outcome.result.is_ok(), "{format}: {:?}", outcome.result);
        assert_eq!(outcome.seen, project_expected(), "{format}");
    }
}

#[test]
fn zips_from_streaming_and_zip64_writers_round_trip() {
    fn write_project<W: Write + io::Seek>(
        writer: &mut ::zip::ZipWriter<W>,
        options: SimpleFileOptions,
    ) {
        writer.add_directory("proj/", options).unwrap();
        writer
            .start_file("proj/run.sh", options.unix_permissions(0o755))
            .unwrap();
        writer.write_all(b"#!/bin/sh\n").unwrap();
        writer
            .start_file("proj/data", options.unix_permissions(0o644))
            .unwrap();
        writer.write_all(&[7u8; 5000]).unwrap();
    }
    let expected = [
        dir("proj"),
        file("proj/run.sh", true, b"#!/bin/sh\n"),
        file("proj/data", false, &[7u8; 5000]),
    ];

    // Written without seeking: sizes and CRCs follow the data in data descriptors.
    let mut streamed = ::zip::ZipWriter::new_stream(Vec::new());
    write_project(&mut streamed, SimpleFileOptions::default());
    let streamed = streamed.finish().unwrap().into_inner();

    // Zip64 extra fields in every header, and an archive comment.
    let mut zip64 = ::zip::ZipWriter::new(Cursor::new(Vec::new()));
    write_project(&mut zip64, SimpleFileOptions::default().large_file(true));
    zip64.set_comment("made by a test").unwrap();
    let zip64 = zip64.finish().unwrap().into_inner();

    for (case, bytes) in [("streamed", streamed), ("zip64", zip64)] {
        let outcome = read(&bytes, ROOMY);
        assert!(outcome.result.is_ok(), "{case}: {:?}", outcome.result);
        assert_eq!(outcome.seen, expected, "{case}");
    }
}

#[test]
fn zip64_end_records_are_followed() {
    let bytes = with_zip64_end(raw_zip(&[raw(b"a.txt", b"alpha", 0o100_644)]), 1);
    let outcome = read(&bytes, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(outcome.seen, [file("a.txt", false, b"alpha")]);
}

#[test]
fn concatenated_compressed_streams_are_read_whole_like_the_command_line_tools() {
    let tar = project_tar();
    let (front, back) = tar.split_at(1500);
    let uploads = [
        ("gzip members", [gzip(front), gzip(back)].concat()),
        ("zstd frames", [zstd(front), zstd(back)].concat()),
        ("bzip2 streams", [bzip2(front), bzip2(back)].concat()),
        ("xz streams", [xz(front), xz(back)].concat()),
    ];
    for (format, bytes) in uploads {
        let outcome = read(&bytes, ROOMY);
        assert!(outcome.result.is_ok(), "{format}: {:?}", outcome.result);
        assert_eq!(outcome.seen, project_expected(), "{format}");
    }
}

#[test]
fn tar_made_with_dash_c_dot_drops_the_root_and_the_leading_dot_slash() {
    let tar = TarMaker::new()
        .dir("./", 0o755)
        .dir("./src/", 0o755)
        .file("./src/lib.rs", 0o644, b"pub fn f() {}\n")
        .finish();
    let outcome = read(&gzip(&tar), ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [dir("src"), file("src/lib.rs", false, b"pub fn f() {}\n")]
    );
}

#[test]
fn long_names_and_pax_paths_are_honoured_and_still_checked() {
    let long = format!("deep/{}/file.txt", "d".repeat(150));
    let mut builder = Builder::new(Vec::new());
    let mut header = Header::new_gnu();
    header.set_size(5);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, &long, &b"hello"[..])
        .unwrap();
    builder
        .append_pax_extensions([("path", b"../escaped".as_slice())])
        .unwrap();
    let mut header = Header::new_ustar();
    header.set_path("innocent").unwrap();
    header.set_size(4);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append(&header, &b"evil"[..]).unwrap();
    let outcome = read(&builder.into_inner().unwrap(), ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [
            file(&long, false, b"hello"),
            skipped("../escaped", SkipReason::UnsafePath)
        ]
    );
}

/// A name past the path limit (a GNU long name, a pax path, a zip name) is dropped and
/// counted like any refused name, and the members around it land; a duplicate of such a name
/// does not refuse the archive, since neither lands and neither is kept.
#[test]
fn names_past_the_path_limit_are_skipped_and_counted() {
    let too_long = format!("deep/{}/file.txt", "d/".repeat(MAX_PATH_BYTES));
    let mut builder = Builder::new(Vec::new());
    for name in [&too_long, &too_long, &"kept.txt".to_owned()] {
        let mut header = Header::new_gnu();
        header.set_size(2);
        header.set_mode(0o644);
        builder.append_data(&mut header, name, &b"hi"[..]).unwrap();
    }
    builder
        .append_pax_extensions([("path", too_long.as_bytes())])
        .unwrap();
    let mut header = Header::new_ustar();
    header.set_path("short").unwrap();
    header.set_size(0);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append(&header, &b""[..]).unwrap();
    let outcome = read(&gzip(&builder.into_inner().unwrap()), ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    let cut = shown(too_long.as_bytes());
    assert_eq!(
        outcome.seen,
        [
            skipped(&cut, SkipReason::UnsafePath),
            skipped(&cut, SkipReason::UnsafePath),
            file("kept.txt", false, b"hi"),
            skipped(&cut, SkipReason::UnsafePath),
        ]
    );

    let zip = zip_of(|writer| {
        writer
            .start_file(too_long.as_str(), deflated(0o644))
            .unwrap();
        writer.write_all(b"long").unwrap();
        writer.start_file("kept.txt", deflated(0o644)).unwrap();
        writer.write_all(b"hi").unwrap();
    });
    let outcome = read(&zip, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [
            skipped(&cut, SkipReason::UnsafePath),
            file("kept.txt", false, b"hi")
        ]
    );
}

/// What a tar spends on names (a flood of long names around empty files) counts against the
/// import's byte limit like inflated content; so does a zip's central directory.
#[test]
fn header_bytes_count_against_the_byte_limit() {
    let mut builder = Builder::new(Vec::new());
    for n in 0..64 {
        let name = format!("{n:04}-{}", "n".repeat(900));
        let mut header = Header::new_gnu();
        header.set_size(0);
        header.set_mode(0o644);
        builder.append_data(&mut header, &name, &b""[..]).unwrap();
    }
    let tar = gzip(&builder.into_inner().unwrap());
    let limits = Limits {
        max_total_bytes: 32 << 10,
        ..ROOMY
    };
    let outcome = read(&tar, limits);
    assert!(
        matches!(outcome.result, Err(ArchiveError::TooLarge { max }) if max == 32 << 10),
        "{:?}",
        outcome.result
    );
    assert_eq!(outcome.content_bytes(), 0, "no content was involved");
    assert!(read(&tar, ROOMY).result.is_ok(), "within a roomy limit");

    let zip = zip_of(|writer| {
        for n in 0..64 {
            let name = format!("{n:04}-{}", "n".repeat(900));
            writer.start_file(name, deflated(0o644)).unwrap();
        }
    });
    let outcome = read(&zip, limits);
    assert!(
        matches!(outcome.result, Err(ArchiveError::TooLarge { .. })),
        "{:?}",
        outcome.result
    );
    assert!(outcome.seen.is_empty(), "refused before any member");
}

/// A central directory larger than any archive of real files needs is refused before the
/// zip reader holds it in memory.
#[test]
fn an_oversized_zip_central_directory_is_refused_before_it_is_read() {
    let mut bytes = raw_zip(&[raw(b"a", b"x", 0o100_644)]);
    // The end record's central directory size, forged past the cap.
    let end = bytes.len() - 22;
    put32(&mut bytes, end + 12, (ZIP_CENTRAL_MAX + 1) as u32);
    let outcome = read(&bytes, ROOMY);
    match &outcome.result {
        Err(ArchiveError::Corrupt(message)) if message.contains("central directory is") => {}
        other => panic!("expected the central directory refused for its size, got {other:?}"),
    }
    assert!(outcome.seen.is_empty());
}

#[test]
fn a_pax_header_with_a_repeated_key_is_refused() {
    let mut builder = Builder::new(Vec::new());
    builder
        .append_pax_extensions([("path", b"a".as_slice()), ("path", b"b".as_slice())])
        .unwrap();
    let mut header = Header::new_ustar();
    header.set_path("x").unwrap();
    header.set_size(0);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append(&header, &b""[..]).unwrap();
    let outcome = read(&builder.into_inner().unwrap(), ROOMY);
    assert!(
        matches!(outcome.result, Err(ArchiveError::Ambiguous(_))),
        "{:?}",
        outcome.result
    );
    assert!(outcome.seen.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Names that try to leave the root.

const ESCAPING_NAMES: [&str; 8] = [
    "../evil",
    "..\\evil",
    "/etc/passwd",
    "C:\\x",
    "C:/x",
    "a/../../b",
    "a/./b",
    "ok\0hidden",
];

#[test]
fn tar_names_that_escape_are_skipped_and_nothing_lands_outside() {
    let mut tar = TarMaker::new();
    for name in ESCAPING_NAMES {
        tar = tar.file(name, 0o644, b"pwned");
    }
    let tar = tar.file("ok.txt", 0o644, b"fine").finish();
    let outcome = read(&tar, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    let mut expected: Vec<Seen> = ESCAPING_NAMES
        .iter()
        // The ustar name field ends at its first NUL, as in every tar reader.
        .filter(|name| !name.contains('\0'))
        .map(|name| skipped(name, SkipReason::UnsafePath))
        .collect();
    expected.push(file("ok", false, b"pwned"));
    expected.push(file("ok.txt", false, b"fine"));
    assert_eq!(outcome.seen, expected);
}

#[test]
fn zip_names_that_escape_are_skipped_and_nothing_lands_outside() {
    let mut members: Vec<RawMember> = ESCAPING_NAMES
        .iter()
        .map(|name| raw(name.as_bytes(), b"pwned", 0o100_644))
        .collect();
    members.push(raw(b"ok.txt", b"fine", 0o100_644));
    let outcome = read(&raw_zip(&members), ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    let mut expected: Vec<Seen> = ESCAPING_NAMES
        .iter()
        .map(|name| skipped(name, SkipReason::UnsafePath))
        .collect();
    expected.push(file("ok.txt", false, b"fine"));
    assert_eq!(outcome.seen, expected);
}

#[test]
fn names_that_are_not_utf8_are_skipped() {
    let tar = TarMaker::new()
        .member(b"caf\xe9.txt", EntryType::Regular, 0o644, b"x", None)
        .finish();
    let outcome = read(&tar, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [skipped("caf\u{fffd}.txt", SkipReason::UnsafePath)]
    );

    let outcome = read(&raw_zip(&[raw(b"caf\xe9.txt", b"x", 0o100_644)]), ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [skipped("caf\u{fffd}.txt", SkipReason::UnsafePath)]
    );
}

#[test]
fn a_tar_file_whose_name_ends_in_a_slash_is_skipped_not_guessed() {
    let tar = TarMaker::new().file("notadir/", 0o644, b"data").finish();
    let outcome = read(&tar, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(outcome.seen, [skipped("notadir/", SkipReason::UnsafePath)]);
}

// ---------------------------------------------------------------------------------------------
// Links, devices and FIFOs.

#[test]
fn tar_symlink_then_a_file_through_it_lands_the_file_beneath_the_root() {
    let tar = TarMaker::new()
        .symlink("link", "/etc")
        .file("link/passwd", 0o644, b"root:x:0:0")
        .finish();
    let outcome = read(&tar, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [
            skipped("link", SkipReason::Symlink),
            file("link/passwd", false, b"root:x:0:0")
        ]
    );
}

#[test]
fn zip_symlink_then_a_file_through_it_lands_the_file_beneath_the_root() {
    let bytes = zip_of(|writer| {
        writer
            .add_symlink("link", "/etc", SimpleFileOptions::default())
            .unwrap();
        writer.start_file("link/passwd", deflated(0o644)).unwrap();
        writer.write_all(b"root:x:0:0").unwrap();
    });
    let outcome = read(&bytes, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [
            skipped("link", SkipReason::Symlink),
            file("link/passwd", false, b"root:x:0:0")
        ]
    );
}

#[test]
fn tar_links_inside_the_root_are_kept_with_their_targets_and_escaping_ones_dropped() {
    let tar = TarMaker::new()
        .dir("docs/", 0o755)
        .file("docs/guide.md", 0o644, b"# guide\n")
        .symlink("README.md", "docs/guide.md")
        .dir("tests/fixtures/", 0o755)
        .symlink("tests/fixtures/root", "../..")
        .symlink("tests/fixtures/parent", "..")
        .symlink("escape", "../outside")
        .symlink("deep/escape", "../../outside")
        .symlink("absolute", "/etc/passwd")
        // Through a kept link that reaches the root: lexically inside, really outside.
        .symlink("tests/chained", "fixtures/root/..")
        .symlink("tests/sideways", "fixtures/../../x")
        .finish();
    let outcome = read(&tar, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [
            dir("docs"),
            file("docs/guide.md", false, b"# guide\n"),
            link("README.md", "docs/guide.md"),
            dir("tests/fixtures"),
            link("tests/fixtures/root", "../.."),
            link("tests/fixtures/parent", ".."),
            skipped("escape", SkipReason::Symlink),
            skipped("deep/escape", SkipReason::Symlink),
            skipped("absolute", SkipReason::Symlink),
            skipped("tests/chained", SkipReason::Symlink),
            skipped("tests/sideways", SkipReason::Symlink),
        ]
    );
}

#[test]
fn zip_links_inside_the_root_are_kept_with_their_targets_and_escaping_ones_dropped() {
    let bytes = zip_of(|writer| {
        writer.start_file("lib/index.js", deflated(0o644)).unwrap();
        writer.write_all(b"module.exports = 1;\n").unwrap();
        for (name, target) in [
            ("index.js", "lib/index.js"),
            ("lib/up", ".."),
            ("lib/escape", "../.."),
            ("absolute", "/etc"),
            ("lib/chained", "up/.."),
        ] {
            writer
                .add_symlink(name, target, SimpleFileOptions::default())
                .unwrap();
        }
    });
    let outcome = read(&bytes, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [
            file("lib/index.js", false, b"module.exports = 1;\n"),
            link("index.js", "lib/index.js"),
            link("lib/up", ".."),
            skipped("lib/escape", SkipReason::Symlink),
            skipped("absolute", SkipReason::Symlink),
            skipped("lib/chained", SkipReason::Symlink),
        ]
    );
}

/// The attack on an unpacker that follows links: plant a link, then write "through" it. A
/// kept link is a leaf, so a member beneath it refuses the whole archive; nothing is ever
/// handed out beneath a link.
#[test]
fn a_member_written_through_a_kept_link_refuses_the_archive() {
    let tar = TarMaker::new()
        .symlink("sub/up", "..")
        .file("sub/up/planted.txt", 0o644, b"through the link")
        .finish();
    let outcome = read(&tar, ROOMY);
    assert_ambiguous(&outcome, "both a file and a directory");
    assert!(
        !outcome
            .seen
            .iter()
            .any(|seen| matches!(seen, Seen::File { .. })),
        "{:?}",
        outcome.seen
    );

    let bytes = zip_of(|writer| {
        writer
            .add_symlink("up", ".", SimpleFileOptions::default())
            .unwrap();
        writer.start_file("up/x", deflated(0o644)).unwrap();
        writer.write_all(b"x").unwrap();
    });
    let outcome = read(&bytes, ROOMY);
    assert_ambiguous(&outcome, "both a file and a directory");
    assert!(outcome.seen.is_empty(), "zip is refused before any member");
}

#[test]
fn tar_hard_link_then_a_file_of_the_same_name_refuses_the_archive() {
    let tar = TarMaker::new()
        .hard_link("x", "/etc/passwd")
        .file("x", 0o644, b"overwrite")
        .finish();
    let outcome = read(&tar, ROOMY);
    assert!(
        matches!(&outcome.result, Err(ArchiveError::Duplicate(name)) if name == "x"),
        "{:?}",
        outcome.result
    );
    assert_eq!(outcome.seen, [skipped("x", SkipReason::HardLink)]);
}

#[test]
fn symlink_then_a_directory_of_the_same_name_refuses_the_archive() {
    let tar = TarMaker::new().symlink("d", "/").dir("d/", 0o777).finish();
    let outcome = read(&tar, ROOMY);
    assert!(
        matches!(&outcome.result, Err(ArchiveError::Duplicate(name)) if name == "d"),
        "{:?}",
        outcome.result
    );

    let bytes = raw_zip(&[raw(b"d", b"/", 0o120_777), raw(b"d/", b"", 0o040_777)]);
    let outcome = read(&bytes, ROOMY);
    assert!(
        matches!(&outcome.result, Err(ArchiveError::Duplicate(name)) if name == "d"),
        "{:?}",
        outcome.result
    );
    assert!(outcome.seen.is_empty(), "zip is refused before any member");
}

#[test]
fn tar_devices_and_fifos_are_skipped_with_their_reason() {
    let tar = TarMaker::new()
        .special("dev/null", EntryType::Char)
        .special("dev/sda", EntryType::Block)
        .special("pipe", EntryType::Fifo)
        .member(b"label", EntryType::new(b'V'), 0o644, b"", None)
        .file("kept", 0o644, b"ok")
        .finish();
    let outcome = read(&tar, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [
            skipped("dev/null", SkipReason::Device),
            skipped("dev/sda", SkipReason::Device),
            skipped("pipe", SkipReason::Fifo),
            skipped("label", SkipReason::Other),
            file("kept", false, b"ok"),
        ]
    );
}

#[test]
fn zip_special_file_types_are_skipped_with_their_reason() {
    let bytes = raw_zip(&[
        raw(b"dev/null", b"", 0o020_666),
        raw(b"dev/sda", b"", 0o060_660),
        raw(b"pipe", b"", 0o010_644),
        raw(b"socket", b"", 0o140_755),
        raw(b"kept", b"ok", 0o100_644),
    ]);
    let outcome = read(&bytes, ROOMY);
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(
        outcome.seen,
        [
            skipped("dev/null", SkipReason::Device),
            skipped("dev/sda", SkipReason::Device),
            skipped("pipe", SkipReason::Fifo),
            skipped("socket", SkipReason::Other),
            file("kept", false, b"ok"),
        ]
    );
}

#[test]
fn a_tar_link_or_directory_carrying_data_is_refused() {
    let tar = TarMaker::new()
        .member(
            b"link",
            EntryType::Symlink,
            0o777,
            &[b'x'; 600],
            Some("target"),
        )
        .finish();
    let outcome = read(&tar, ROOMY);
    assert!(
        matches!(outcome.result, Err(ArchiveError::Ambiguous(_))),
        "{:?}",
        outcome.result
    );
}

// ---------------------------------------------------------------------------------------------
// Duplicates and conflicts.

#[test]
fn duplicate_tar_members_refuse_the_archive() {
    for second in ["a", "./a", "a/"] {
        let tar = TarMaker::new()
            .file("a", 0o644, b"one")
            .member(
                second.as_bytes(),
                if second.ends_with('/') {
                    EntryType::Directory
                } else {
                    EntryType::Regular
                },
                0o644,
                b"",
                None,
            )
            .finish();
        let outcome = read(&tar, ROOMY);
        assert!(
            matches!(&outcome.result, Err(ArchiveError::Duplicate(name)) if name == "a"),
            "{second}: {:?}",
            outcome.result
        );
    }
}

#[test]
fn duplicate_zip_members_refuse_the_archive_before_any_member() {
    let mut bytes = zip_of(|writer| {
        writer.start_file("dup-one", deflated(0o644)).unwrap();
        writer.write_all(b"first").unwrap();
        writer.start_file("dup-two", deflated(0o644)).unwrap();
        writer.write_all(b"second").unwrap();
    });
    // The writer refuses duplicate names; rename the second in both of its headers.
    replace_first(&mut bytes, b"dup-two", b"dup-one");
    let central = central_headers(&bytes)[1];
    bytes[central + 46..central + 53].copy_from_slice(b"dup-one");
    let outcome = read(&bytes, ROOMY);
    assert!(
        matches!(&outcome.result, Err(ArchiveError::Duplicate(name)) if name == "dup-one"),
        "{:?}",
        outcome.result
    );
    assert!(outcome.seen.is_empty());

    // A file and a directory of the same name are duplicates too.
    let outcome = read(&raw_zip(&[raw(b"a", b"x", 0), raw(b"a/", b"", 0)]), ROOMY);
    assert!(
        matches!(&outcome.result, Err(ArchiveError::Duplicate(name)) if name == "a"),
        "{:?}",
        outcome.result
    );
}

#[test]
fn a_name_used_as_file_and_directory_is_ambiguous() {
    let file_then_child = TarMaker::new()
        .file("a", 0o644, b"x")
        .file("a/b", 0o644, b"y")
        .finish();
    let child_then_file = TarMaker::new()
        .file("a/b", 0o644, b"y")
        .file("a", 0o644, b"x")
        .finish();
    for tar in [file_then_child, child_then_file] {
        let outcome = read(&tar, ROOMY);
        assert!(
            matches!(outcome.result, Err(ArchiveError::Ambiguous(_))),
            "{:?}",
            outcome.result
        );
    }
    let bytes = raw_zip(&[raw(b"a/b", b"y", 0), raw(b"a", b"x", 0)]);
    let outcome = read(&bytes, ROOMY);
    assert!(
        matches!(outcome.result, Err(ArchiveError::Ambiguous(_))),
        "{:?}",
        outcome.result
    );
    assert!(outcome.seen.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Zip header consistency.

#[test]
fn zip_local_and_central_names_that_differ_refuse_the_archive() {
    let mut bytes = zip_of(|writer| {
        writer
            .start_file("good.txt", SimpleFileOptions::default())
            .unwrap();
        writer.write_all(b"content").unwrap();
    });
    // The local header comes first in the file.
    replace_first(&mut bytes, b"good.txt", b"evil.txt");
    let outcome = read(&bytes, ROOMY);
    assert_ambiguous(&outcome, "local header names");
    assert!(outcome.seen.is_empty());
}

#[test]
fn a_zip_member_inflating_past_its_declared_size_is_refused() {
    let mut bytes = zip_of(|writer| {
        writer.start_file("big", deflated(0o644)).unwrap();
        writer.write_all(&[b'a'; 1000]).unwrap();
    });
    let central = central_headers(&bytes)[0];
    let local = le32_at(&bytes, central + 42) as usize;
    put32(&mut bytes, central + 24, 10);
    put32(&mut bytes, local + 22, 10);
    let outcome = read(&bytes, ROOMY);
    assert_ambiguous(&outcome, "declared size");
    assert!(outcome.content_bytes() <= 10);
}

#[test]
fn a_zip_member_with_a_bad_crc_is_corrupt() {
    let mut bytes = zip_of(|writer| {
        writer.start_file("file", deflated(0o644)).unwrap();
        writer.write_all(b"some content").unwrap();
    });
    let central = central_headers(&bytes)[0];
    let local = le32_at(&bytes, central + 42) as usize;
    let wrong = le32_at(&bytes, central + 16) ^ 1;
    put32(&mut bytes, central + 16, wrong);
    put32(&mut bytes, local + 14, wrong);
    let outcome = read(&bytes, ROOMY);
    assert!(
        matches!(&outcome.result, Err(ArchiveError::Corrupt(message)) if message.contains("CRC")),
        "{:?}",
        outcome.result
    );
}

#[test]
fn an_overlapping_entry_zip_bomb_is_refused() {
    // "b" is quoted inside the stored data of "a", so its bytes are counted twice.
    let inner = raw(b"b", &[0u8; 100], 0o100_644);
    let outer = RawMember {
        name: b"a".to_vec(),
        data: local_header(&inner),
        mode: 0o100_644,
    };
    let mut bytes = local_header(&outer);
    let inner_offset = (30 + outer.name.len()) as u32;
    let central = [
        central_header(&outer, 0),
        central_header(&inner, inner_offset),
    ]
    .concat();
    let central_offset = bytes.len();
    bytes.extend(&central);
    bytes.extend(end_record(2, central.len(), central_offset));
    let outcome = read(&bytes, ROOMY);
    assert_ambiguous(&outcome, "share bytes");
    assert!(outcome.seen.is_empty());

    // Two central entries of one name on one local header: a duplicate, refused as such.
    let only = raw(b"a", &[0u8; 100], 0o100_644);
    let mut bytes = local_header(&only);
    let central = [central_header(&only, 0), central_header(&only, 0)].concat();
    let central_offset = bytes.len();
    bytes.extend(&central);
    bytes.extend(end_record(2, central.len(), central_offset));
    let outcome = read(&bytes, ROOMY);
    assert!(
        matches!(outcome.result, Err(ArchiveError::Duplicate(_))),
        "{:?}",
        outcome.result
    );
}

#[test]
fn data_around_a_zip_is_refused() {
    let zip = project_zip(CompressionMethod::Deflated);
    let mut prefixed = b"PK\x03\x04 a second archive hides here".to_vec();
    prefixed.extend(&zip);
    let mut appended = zip.clone();
    appended.extend(b"trailing bytes");
    for (case, bytes) in [("prefixed", prefixed), ("appended", appended)] {
        let outcome = read(&bytes, ROOMY);
        assert!(
            matches!(outcome.result, Err(ArchiveError::Ambiguous(_))),
            "{case}: {:?}",
            outcome.result
        );
        assert!(outcome.seen.is_empty(), "{case}");
    }
}

#[test]
fn an_encrypted_zip_member_is_refused() {
    let mut bytes = raw_zip(&[raw(b"secret", b"xxxx", 0o100_644)]);
    let central = central_headers(&bytes)[0];
    bytes[6] |= 1;
    bytes[central + 8] |= 1;
    let outcome = read(&bytes, ROOMY);
    assert!(
        matches!(outcome.result, Err(ArchiveError::Corrupt(_))),
        "{:?}",
        outcome.result
    );
}

// ---------------------------------------------------------------------------------------------
// Limits.

#[test]
fn a_zip_claiming_a_million_entries_is_refused_before_any_member_is_read() {
    let bytes = with_zip64_end(raw_zip(&[raw(b"a", b"x", 0o100_644)]), 1_000_000);
    let limits = Limits {
        max_entries: 1000,
        ..ROOMY
    };
    let outcome = read(&bytes, limits);
    assert!(
        matches!(
            outcome.result,
            Err(ArchiveError::TooManyEntries { max: 1000 })
        ),
        "{:?}",
        outcome.result
    );
    assert!(outcome.seen.is_empty());
}

#[test]
fn a_tar_gz_with_more_entries_than_the_cap_stops_at_the_cap() {
    let mut tar = TarMaker::new();
    for index in 0..5000 {
        tar = tar.file(&format!("f{index}"), 0o644, b"");
    }
    let bytes = gzip(&tar.finish());
    let limits = Limits {
        max_entries: 1000,
        ..ROOMY
    };
    let outcome = read(&bytes, limits);
    assert!(
        matches!(
            outcome.result,
            Err(ArchiveError::TooManyEntries { max: 1000 })
        ),
        "{:?}",
        outcome.result
    );
    assert_eq!(outcome.seen.len(), 1000);
}

#[test]
fn setuid_setgid_sticky_and_world_writable_bits_are_dropped_only_exec_survives() {
    let modes = [
        ("setuid-exec", 0o4755, true),
        ("setgid", 0o2644, false),
        ("sticky", 0o1644, false),
        ("world-writable", 0o666, false),
        ("everything", 0o7777, true),
        ("owner-exec-only", 0o100, true),
        ("setuid-only", 0o4000, false),
    ];
    let mut tar = TarMaker::new();
    for (name, mode, _) in modes {
        tar = tar.file(name, mode, b"#!");
    }
    let members: Vec<RawMember> = modes
        .iter()
        .map(|(name, mode, _)| raw(name.as_bytes(), b"#!", 0o100_000 | mode))
        .collect();
    let expected: Vec<Seen> = modes
        .iter()
        .map(|(name, _, executable)| file(name, *executable, b"#!"))
        .collect();
    for bytes in [tar.finish(), raw_zip(&members)] {
        let outcome = read(&bytes, ROOMY);
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        assert_eq!(outcome.seen, expected);
    }
}

#[test]
fn a_highly_compressible_member_stops_at_the_per_file_cap() {
    let zeros = vec![0u8; 8 << 20];
    let limits = Limits {
        max_file_bytes: 1 << 20,
        ..ROOMY
    };
    let tar_gz = gzip(&TarMaker::new().file("zeros", 0o644, &zeros).finish());
    let zip = zip_of(|writer| {
        writer.start_file("zeros", deflated(0o644)).unwrap();
        writer.write_all(&zeros).unwrap();
    });
    for bytes in [&tar_gz, &zip] {
        assert!(
            bytes.len() < 64 << 10,
            "the test needs a bomb, not a big file"
        );
        for read_content in [true, false] {
            let outcome = read_with(bytes, limits, read_content);
            match &outcome.result {
                Err(ArchiveError::FileTooLarge { path, max }) => {
                    assert_eq!((path.as_str(), *max), ("zeros", 1 << 20));
                }
                other => panic!("{other:?}"),
            }
            assert!(outcome.content_bytes() <= 1 << 20);
        }
    }
}

#[test]
fn members_together_stop_at_the_total_cap() {
    let chunk = vec![0u8; 700 << 10];
    let limits = Limits {
        max_total_bytes: 1 << 20,
        max_file_bytes: 1 << 20,
        ..ROOMY
    };
    let tar_gz = gzip(
        &TarMaker::new()
            .file("a", 0o644, &chunk)
            .file("b", 0o644, &chunk)
            .finish(),
    );
    let zip = zip_of(|writer| {
        for name in ["a", "b"] {
            writer.start_file(name, deflated(0o644)).unwrap();
            writer.write_all(&chunk).unwrap();
        }
    });
    for bytes in [tar_gz, zip] {
        let outcome = read(&bytes, limits);
        assert!(
            matches!(outcome.result, Err(ArchiveError::TooLarge { max }) if max == 1 << 20),
            "{:?}",
            outcome.result
        );
        assert!(outcome.content_bytes() <= 1 << 20);
    }
}

#[test]
fn bytes_of_skipped_members_count_toward_the_total() {
    let tar = TarMaker::new()
        .member(
            b"odd",
            EntryType::new(b'V'),
            0o644,
            &vec![0u8; 64 << 10],
            None,
        )
        .finish();
    let limits = Limits {
        max_total_bytes: 1 << 10,
        ..ROOMY
    };
    let outcome = read(&gzip(&tar), limits);
    assert!(
        matches!(outcome.result, Err(ArchiveError::TooLarge { .. })),
        "{:?}",
        outcome.result
    );
}

// ---------------------------------------------------------------------------------------------
// Damaged and foreign input.

#[test]
fn garbage_and_empty_input_are_unrecognized() {
    let inputs: [&[u8]; 6] = [
        b"",
        b"PK",
        b"hello, world",
        &[0xAB; 4096],
        b"BZh", // the magic alone
        &[0u8; 100],
    ];
    for bytes in inputs {
        let outcome = read(bytes, ROOMY);
        assert!(
            matches!(outcome.result, Err(ArchiveError::Unrecognized)),
            "{bytes:?}: {:?}",
            outcome.result
        );
    }
    // JSON is no archive either, and the error says how a git import is sent.
    let outcome = read(
        b" \n\t{\"git\": {\"url\": \"https://example.com/x.git\"}}",
        ROOMY,
    );
    assert!(
        matches!(outcome.result, Err(ArchiveError::LooksLikeJson)),
        "{:?}",
        outcome.result
    );
    assert!(
        ArchiveError::LooksLikeJson
            .to_string()
            .contains("Content-Type: application/json")
    );
    // A compressed stream must hold a tar.
    let outcome = read(&gzip(b"just some text, not a tar"), ROOMY);
    assert!(
        matches!(outcome.result, Err(ArchiveError::Unrecognized)),
        "{:?}",
        outcome.result
    );
}

#[test]
fn empty_archives_are_fine() {
    for bytes in [vec![0u8; 10240], gzip(&[0u8; 10240]), raw_zip(&[])] {
        let outcome = read(&bytes, ROOMY);
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        assert!(outcome.seen.is_empty());
    }
}

#[test]
fn truncated_archives_are_corrupt() {
    let tar = project_tar();
    let tar_gz = gzip(&tar);
    let zip = project_zip(CompressionMethod::Deflated);
    let cases = [
        ("tar.gz", tar_gz[..tar_gz.len() / 2].to_vec()),
        (
            "tar.gz without its trailer",
            tar_gz[..tar_gz.len() - 4].to_vec(),
        ),
        ("tar, inside a member", tar[..6000].to_vec()),
        ("tar, between members", tar[..2048].to_vec()),
        ("tar.zst", zstd(&tar)[..200].to_vec()),
        ("tar.xz", xz(&tar)[..200].to_vec()),
        ("tar.bz2", bzip2(&tar)[..200].to_vec()),
        ("zip", zip[..zip.len() - 30].to_vec()),
    ];
    for (case, bytes) in cases {
        let outcome = read(&bytes, ROOMY);
        assert!(
            matches!(outcome.result, Err(ArchiveError::Corrupt(_))),
            "{case}: {:?}",
            outcome.result
        );
    }
}

#[test]
fn data_after_the_end_of_a_tar_is_refused() {
    let mut tar = project_tar();
    tar.extend(
        TarMaker::new()
            .file("hidden", 0o644, b"tar -i sees me")
            .finish(),
    );
    let outcome = read(&gzip(&tar), ROOMY);
    assert!(
        matches!(outcome.result, Err(ArchiveError::Ambiguous(_))),
        "{:?}",
        outcome.result
    );
}

#[test]
fn a_callback_error_passes_through_unchanged() {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(&project_tar()).unwrap();
    let result = read_archive(file, &ROOMY, &mut |_entry| Err("quota exceeded".into()));
    match result {
        Err(ArchiveError::Sink(error)) => assert_eq!(error.to_string(), "quota exceeded"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn skip_reasons_have_stable_labels() {
    let labels = [
        SkipReason::Symlink,
        SkipReason::HardLink,
        SkipReason::Device,
        SkipReason::Fifo,
        SkipReason::UnsafePath,
        SkipReason::Other,
    ]
    .map(SkipReason::as_str);
    assert_eq!(
        labels,
        [
            "symlink",
            "hard_link",
            "device",
            "fifo",
            "unsafe_path",
            "other"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Generative: whatever the bytes, no panic, nothing escapes, no cap is passed.

mod generative {
    use std::sync::LazyLock;

    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    const SMALL: Limits = Limits {
        max_entries: 64,
        max_total_bytes: 48 << 10,
        max_file_bytes: 16 << 10,
    };

    fn seed_tar() -> Vec<u8> {
        TarMaker::new()
            .dir("p/", 0o755)
            .file("p/a.txt", 0o644, b"alpha")
            .file("p/run", 0o755, b"#!/bin/sh\n")
            .symlink("p/link", "../../etc")
            .file("p/zeros", 0o644, &[0u8; 20 << 10])
            .finish()
    }

    static SEEDS: LazyLock<[Vec<u8>; 4]> = LazyLock::new(|| {
        let zip = zip_of(|writer| {
            writer
                .add_directory("p/", SimpleFileOptions::default())
                .unwrap();
            writer.start_file("p/a.txt", deflated(0o644)).unwrap();
            writer.write_all(b"alpha").unwrap();
            writer
                .start_file(
                    "p/run",
                    SimpleFileOptions::default().unix_permissions(0o755),
                )
                .unwrap();
            writer.write_all(b"#!/bin/sh\n").unwrap();
            writer.start_file("p/zeros", deflated(0o644)).unwrap();
            writer.write_all(&[0u8; 20 << 10]).unwrap();
        });
        let zip64 = with_zip64_end(
            raw_zip(&[
                raw(b"p/", b"", 0o040_755),
                raw(b"p/a.txt", b"alpha", 0o100_644),
                raw(b"p/link", b"../../etc", 0o120_777),
            ]),
            3,
        );
        [zip, seed_tar(), gzip(&seed_tar()), zip64]
    });

    const MAGICS: [&[u8]; 7] = [
        b"PK\x03\x04",
        b"PK\x05\x06",
        &[0x1F, 0x8B],
        &[0x28, 0xB5, 0x2F, 0xFD],
        b"BZh9",
        &[0xFD, b'7', b'z', b'X', b'Z', 0x00],
        &[],
    ];

    #[derive(Debug, Clone)]
    enum Mutation {
        Flip(usize, u8),
        Truncate(usize),
        Insert(usize, Vec<u8>),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), 1..=255u8).prop_map(|(at, mask)| Mutation::Flip(at, mask)),
            any::<usize>().prop_map(Mutation::Truncate),
            (any::<usize>(), vec(any::<u8>(), 1..16))
                .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        ]
    }

    fn mutate(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
        let mut bytes = seed.to_vec();
        for mutation in mutations {
            let len = bytes.len().max(1);
            match mutation {
                Mutation::Flip(at, mask) => {
                    if let Some(byte) = bytes.get_mut(at % len) {
                        *byte ^= mask;
                    }
                }
                Mutation::Truncate(at) => bytes.truncate(at % len),
                Mutation::Insert(at, inserted) => {
                    let at = at % len;
                    bytes.splice(
                        at.min(bytes.len())..at.min(bytes.len()),
                        inserted.iter().copied(),
                    );
                }
            }
        }
        bytes
    }

    fn holds_invariants(bytes: &[u8]) {
        // `read` already checks that no landed path escapes.
        let outcome = read(bytes, SMALL);
        assert!(outcome.seen.len() as u64 <= SMALL.max_entries);
        assert!(outcome.content_bytes() <= SMALL.max_total_bytes);
        for seen in &outcome.seen {
            if let Seen::File { content, .. } = seen {
                assert!(content.len() as u64 <= SMALL.max_file_bytes);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn random_bytes_behind_any_magic(
            magic in 0..MAGICS.len(),
            tail in vec(any::<u8>(), 0..2048),
        ) {
            holds_invariants(&[MAGICS[magic], &tail].concat());
        }

        #[test]
        fn mutated_zip(mutations in vec(mutation(), 1..4)) {
            holds_invariants(&mutate(&SEEDS[0], &mutations));
        }

        #[test]
        fn mutated_zip64(mutations in vec(mutation(), 1..4)) {
            holds_invariants(&mutate(&SEEDS[3], &mutations));
        }

        #[test]
        fn mutated_tar(mutations in vec(mutation(), 1..4)) {
            holds_invariants(&mutate(&SEEDS[1], &mutations));
        }

        #[test]
        fn mutated_tar_gz(mutations in vec(mutation(), 1..4)) {
            holds_invariants(&mutate(&SEEDS[2], &mutations));
        }
    }
}
