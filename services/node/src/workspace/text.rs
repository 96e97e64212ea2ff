//! Line ranges of a file's bytes, for reading files and commands' kept output: whole lines
//! up to a byte budget, with the count of lines in the file.

use plinth_kit::{ErrorCode, PlinthError};

/// Bytes answered when the caller names no limit.
pub const DEFAULT_MAX_BYTES: u64 = 256 * 1024;
/// Bytes looked at to tell text from binary (as git and ripgrep do: a NUL byte).
const SNIFF_BYTES: usize = 8 * 1024;

/// What to answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Range {
    /// First line, from 1; 0: the first.
    pub start_line: u64,
    /// Last line, inclusive; 0: the end.
    pub end_line: u64,
    /// Most bytes; 0: [`DEFAULT_MAX_BYTES`].
    pub max_bytes: u64,
    /// With no line range, at most this many lines; 0: no limit.
    pub lines_threshold: u64,
}

/// Part of a file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slice {
    /// The bytes answered.
    pub content: Vec<u8>,
    /// Not UTF-8 text: the line fields are unset.
    pub binary: bool,
    /// Whether content stops before what was asked for.
    pub truncated: bool,
    /// First line answered.
    pub start_line: u64,
    /// Last line answered (start_line - 1 when none).
    pub end_line: u64,
    /// Lines in what was read.
    pub total_lines: u64,
    /// Whether what was read is only the start of the file.
    pub total_lines_partial: bool,
}

/// Whether `bytes` (the start of a file, cut or not) is binary: a NUL byte early on, or
/// bytes that are not UTF-8 (a character cut by the end of `bytes` is not held against it).
pub fn is_binary(bytes: &[u8]) -> bool {
    if bytes[..bytes.len().min(SNIFF_BYTES)].contains(&0) {
        return true;
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => false,
        Err(error) => error.error_len().is_some(),
    }
}

/// The lines of `bytes` asked for. `partial`: `bytes` is only the start of the file.
pub fn slice(bytes: &[u8], partial: bool, range: Range) -> Result<Slice, PlinthError> {
    let max = if range.max_bytes == 0 {
        DEFAULT_MAX_BYTES
    } else {
        range.max_bytes
    };
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    if is_binary(bytes) {
        let keep = bytes.len().min(max);
        return Ok(Slice {
            content: bytes[..keep].to_vec(),
            binary: true,
            truncated: keep < bytes.len() || partial,
            ..Slice::default()
        });
    }
    let lines: Vec<&[u8]> = bytes.split_inclusive(|b| *b == b'\n').collect();
    let total = lines.len() as u64;
    if range.end_line > 0 && range.start_line > range.end_line {
        return Err(PlinthError::new(
            ErrorCode::WorkspaceInvalidRequest,
            format!(
                "start_line {} is after end_line {}",
                range.start_line, range.end_line
            ),
        ));
    }
    let start = range.start_line.max(1);
    if start > total.max(1) {
        return Err(PlinthError::new(
            ErrorCode::WorkspaceInvalidRequest,
            format!("start_line {start} is past the end: the file has {total} lines"),
        ));
    }
    let mut end = if range.end_line == 0 {
        total
    } else {
        range.end_line.min(total)
    };
    let mut truncated = false;
    if range.start_line == 0
        && range.end_line == 0
        && range.lines_threshold > 0
        && total > range.lines_threshold
    {
        end = range.lines_threshold;
        truncated = true;
    }
    let mut content = Vec::new();
    let mut last = start - 1;
    for number in start..=end {
        let Some(line) = usize::try_from(number - 1).ok().and_then(|i| lines.get(i)) else {
            break;
        };
        if content.len() + line.len() > max {
            truncated = true;
            if content.is_empty() {
                // One line longer than the budget: its start, cut at a character.
                let mut cut = max;
                while cut > 0 && std::str::from_utf8(&line[..cut]).is_err() {
                    cut -= 1;
                }
                content.extend_from_slice(&line[..cut]);
                last = number;
            }
            break;
        }
        content.extend_from_slice(line);
        last = number;
    }
    Ok(Slice {
        content,
        binary: false,
        truncated,
        start_line: start,
        end_line: last,
        total_lines: total,
        total_lines_partial: partial,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u64, end: u64, max: u64) -> Range {
        Range {
            start_line: start,
            end_line: end,
            max_bytes: max,
            lines_threshold: 0,
        }
    }

    #[test]
    fn lines_are_answered_whole_within_the_budget() {
        let text = b"one\ntwo\nthree\nfour";
        let all = slice(text, false, Range::default()).expect("all");
        assert_eq!(
            (all.content.as_slice(), all.total_lines, all.end_line),
            (&text[..], 4, 4)
        );
        assert!(!all.truncated);
        let middle = slice(text, false, range(2, 3, 0)).expect("range");
        assert_eq!(middle.content, b"two\nthree\n");
        assert_eq!((middle.start_line, middle.end_line), (2, 3));
        let budget = slice(text, false, range(0, 0, 9)).expect("budget");
        assert_eq!(budget.content, b"one\ntwo\n");
        assert!(budget.truncated);
        assert_eq!(budget.end_line, 2);
        let long = slice("ééééé\n".as_bytes(), false, range(0, 0, 3)).expect("cut");
        assert_eq!(long.content, "é".as_bytes());
        let threshold = slice(
            text,
            false,
            Range {
                lines_threshold: 2,
                ..Range::default()
            },
        )
        .expect("threshold");
        assert_eq!((threshold.end_line, threshold.truncated), (2, true));
        assert!(slice(text, false, range(9, 0, 0)).is_err());
        assert!(slice(text, false, range(3, 2, 0)).is_err());
        let empty = slice(b"", false, Range::default()).expect("empty");
        assert_eq!(
            (empty.total_lines, empty.start_line, empty.end_line),
            (0, 1, 0)
        );
    }

    #[test]
    fn binary_is_told_from_text() {
        assert!(is_binary(b"a\0b"));
        assert!(is_binary(&[0xff, 0xfe, b'a']));
        assert!(!is_binary("héllo".as_bytes()));
        assert!(
            !is_binary(&"é".as_bytes()[..1]),
            "a cut character is not binary"
        );
        let binary = slice(&[0u8, 1, 2, 3], false, range(0, 0, 2)).expect("binary");
        assert_eq!(
            (binary.binary, binary.truncated, binary.content.len()),
            (true, true, 2)
        );
    }
}
