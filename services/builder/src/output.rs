//! Installer output: the build log, capped to its head and tail, and the short tail an error
//! carries.
//!
//! A build log is the installers' own output, streamed to the caller as it comes. An installer
//! can print without bound (a compiler in a loop, a progress bar in a non-tty), so the log keeps
//! the first `head` bytes (streamed at once: that is where a failure's context usually starts)
//! and the last `tail` bytes (held back until the end, since what is last is not known before),
//! with one line between them saying how many bytes were cut.

use std::collections::VecDeque;

/// The last `cap` bytes written, and how many fell out before them.
#[derive(Debug)]
pub(crate) struct Tail {
    bytes: VecDeque<u8>,
    cap: usize,
    dropped: u64,
}

impl Tail {
    pub(crate) fn new(cap: usize) -> Self {
        Tail {
            bytes: VecDeque::new(),
            cap,
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= self.cap {
            self.dropped += (self.bytes.len() + bytes.len() - self.cap) as u64;
            self.bytes.clear();
            self.bytes.extend(&bytes[bytes.len() - self.cap..]);
            return;
        }
        self.bytes.extend(bytes);
        if self.bytes.len() > self.cap {
            let excess = self.bytes.len() - self.cap;
            self.bytes.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    pub(crate) fn contiguous(&mut self) -> &[u8] {
        self.bytes.make_contiguous()
    }

    /// The tail as text for an error message: lossy UTF-8, starting at a line boundary when it
    /// was cut (a half line reads as garbage), without surrounding blank space.
    pub(crate) fn text(&mut self) -> String {
        let dropped = self.dropped;
        let bytes = self.contiguous();
        let start = if dropped > 0 {
            bytes
                .iter()
                .position(|&byte| byte == b'\n')
                .map_or(0, |newline| newline + 1)
        } else {
            0
        };
        String::from_utf8_lossy(&bytes[start..]).trim().to_owned()
    }
}

/// The build log: streams the head to `sink`, keeps the tail until [`CappedLog::finish`].
pub(crate) struct CappedLog<'a> {
    sink: &'a mut (dyn FnMut(&[u8]) + Send),
    head_cap: usize,
    head_left: usize,
    tail: Tail,
}

impl<'a> CappedLog<'a> {
    pub(crate) fn new(sink: &'a mut (dyn FnMut(&[u8]) + Send), head: usize, tail: usize) -> Self {
        CappedLog {
            sink,
            head_cap: head,
            head_left: head,
            tail: Tail::new(tail),
        }
    }

    pub(crate) fn write(&mut self, mut bytes: &[u8]) {
        if self.head_left > 0 {
            let now = bytes.len().min(self.head_left);
            (self.sink)(&bytes[..now]);
            self.head_left -= now;
            bytes = &bytes[now..];
        }
        if !bytes.is_empty() {
            self.tail.push(bytes);
        }
    }

    /// Emits the cut line (if anything was cut) and the tail; returns how many bytes were cut.
    pub(crate) fn finish(mut self) -> u64 {
        let cut = self.tail.dropped();
        if cut > 0 {
            let line = format!(
                "\n==> [log cut: {cut} bytes omitted here; the first {} and the last {} bytes \
                 of output are kept]\n",
                self.head_cap, self.tail.cap
            );
            (self.sink)(line.as_bytes());
        }
        let tail = self.tail.contiguous();
        if !tail.is_empty() {
            (self.sink)(tail);
        }
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(head: usize, tail: usize, writes: &[&[u8]]) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let mut sink = |bytes: &[u8]| out.extend_from_slice(bytes);
        let mut log = CappedLog::new(&mut sink, head, tail);
        for bytes in writes {
            log.write(bytes);
        }
        let cut = log.finish();
        (out, cut)
    }

    #[test]
    fn short_output_passes_whole() {
        let (out, cut) = capped(4, 4, &[b"abc", b"def", b"gh"]);
        assert_eq!(out, b"abcdefgh");
        assert_eq!(cut, 0);
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_says_what_was_cut() {
        let (out, cut) = capped(3, 4, &[b"ab", b"cdefg", b"hij", b"klmnopqrstuvwxyz"]);
        assert_eq!(cut, 26 - 7);
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            text.starts_with("abc\n==> [log cut: 19 bytes omitted"),
            "{text}"
        );
        assert!(text.ends_with("]\nwxyz"), "{text}");
    }

    #[test]
    fn a_zero_cap_keeps_nothing_but_counts() {
        let (out, cut) = capped(0, 0, &[b"abc"]);
        assert_eq!(cut, 3);
        assert!(String::from_utf8_lossy(&out).contains("3 bytes omitted"));
    }

    #[test]
    fn an_error_tail_starts_at_a_line() {
        let mut tail = Tail::new(10);
        tail.push(b"first line\nsecond\nboom\n");
        assert_eq!(tail.text(), "boom");
        let mut whole = Tail::new(100);
        whole.push(b"  only\n");
        assert_eq!(whole.text(), "only");
    }
}
