//! Accounting shared by every reader of one archive.

use std::cell::Cell;
use std::io::{self, Read};
use std::panic::{self, AssertUnwindSafe};

use super::{
    ArchiveError, Entry, Limits, Sink, TAR_HEADER_BYTES_AVERAGE, TAR_HEADER_BYTES_BASE,
    TAR_HEADER_BYTES_PER_MEMBER_MAX,
};

/// What every layer of one read shares: the running byte total, and the first reason the
/// archive was refused. Readers can only report `io::Error`s up through the tar crate, the
/// decoders and the callback, so the precise cause is kept here and wins over whatever error
/// finally comes back.
pub(super) struct Meter {
    pub(super) limits: Limits,
    pub(super) inflated: Cell<u64>,
    refused: Cell<bool>,
    failure: Cell<Option<ArchiveError>>,
    pub(super) reading_tar_headers: Cell<bool>,
    tar_header_bytes_now: Cell<u64>,
    tar_header_bytes_total: Cell<u64>,
    pub(super) tar_members: Cell<u64>,
    pub(super) tar_ended_in_headers: Cell<bool>,
}

impl Meter {
    pub(super) fn new(limits: Limits) -> Self {
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
    pub(super) fn refusal(&self) -> Option<io::Error> {
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
    pub(super) fn resolve(&self, error: &io::Error) -> ArchiveError {
        self.take_failure()
            .unwrap_or_else(|| corrupt_from_io(error))
    }

    /// Header bytes (tar headers, long names and pax records; a zip's central directory and
    /// local headers) count against the import's byte limit like inflated content: they
    /// cost as much to read, and the tar reader holds a member's whole.
    pub(super) fn count_header_bytes(&self, n: u64) -> io::Result<()> {
        let inflated = self.inflated.get().saturating_add(n);
        self.inflated.set(inflated);
        if inflated > self.limits.max_total_bytes {
            return Err(self.fail(ArchiveError::TooLarge {
                max: self.limits.max_total_bytes,
            }));
        }
        Ok(())
    }

    pub(super) fn begin_tar_headers(&self) {
        self.tar_header_bytes_now.set(0);
        self.reading_tar_headers.set(true);
    }

    pub(super) fn end_tar_headers(&self) {
        self.reading_tar_headers.set(false);
    }

    pub(super) fn count_tar_header_bytes(&self, n: usize) -> io::Result<()> {
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

pub(super) fn corrupt_from_io(error: &io::Error) -> ArchiveError {
    if error.kind() == io::ErrorKind::UnexpectedEof {
        ArchiveError::Corrupt("the archive ends too early (truncated upload?)".to_owned())
    } else {
        ArchiveError::Corrupt(error.to_string())
    }
}

/// Sits directly on the file so that a real read failure is reported as `Io` and not
/// mistaken for damaged data by the decoders above it.
pub(super) struct FileGuard<'m, R> {
    pub(super) inner: R,
    pub(super) meter: &'m Meter,
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
pub(super) struct PanicFence<'m, R> {
    inner: R,
    meter: &'m Meter,
    crashed: bool,
}

impl<'m, R> PanicFence<'m, R> {
    pub(super) fn new(inner: R, meter: &'m Meter) -> Self {
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
pub(super) enum Integrity {
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
pub(super) struct Counted<'m, R> {
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
    pub(super) fn new(
        inner: R,
        meter: &'m Meter,
        name: String,
        is_file: bool,
        integrity: Integrity,
    ) -> Self {
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

pub(super) fn deliver(
    meter: &Meter,
    sink: &mut Sink<'_>,
    entry: Entry<'_>,
) -> Result<(), ArchiveError> {
    let outcome = sink(entry);
    // A limit or integrity failure wins even when the callback turned it into its own error
    // or swallowed it.
    if let Some(failure) = meter.take_failure() {
        return Err(failure);
    }
    outcome.map_err(ArchiveError::Sink)
}

pub(super) fn drain(reader: &mut impl Read, meter: &Meter) -> Result<(), ArchiveError> {
    io::copy(reader, &mut io::sink())
        .map(drop)
        .map_err(|error| meter.resolve(&error))
}
