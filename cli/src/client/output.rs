//! Printing answers: the API's JSON as it came for `--output json`, aligned columns and
//! `key: value` lines for people, counts with their nouns in the right number.
//!
//! A reader that goes away (`plinth env list | head -1`) ends the command quietly, with the
//! status a shell gives a command killed by SIGPIPE (141), as `cat` or `ls` end: no panic and
//! no error message. The process keeps ignoring SIGPIPE itself, so a server that closes a
//! connection mid-request is still an error the command reports.

use serde_json::Value;

/// The exit status of a command whose reader went away: 128 + SIGPIPE, what a shell reports
/// for a command the signal ended.
pub const BROKEN_PIPE_STATUS: u8 = 141;

/// Makes a write to a closed standard output or error (a `println!` anywhere in the client)
/// end the process quietly with [`BROKEN_PIPE_STATUS`] instead of a panic's message; every
/// other panic is reported as before.
pub fn quiet_broken_pipes() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if payload.contains("Broken pipe") || payload.contains("BrokenPipe") {
            std::process::exit(i32::from(BROKEN_PIPE_STATUS));
        }
        previous(info);
    }));
}

/// Whether an error is a write to a reader that went away.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|error| error.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Writes `bytes` to standard output and flushes it.
pub fn stdout(bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes).and_then(|()| stdout.flush())
}

/// `1 file`, `2 files`, `1,478 files`.
pub fn count(count: u64, one: &str, many: &str) -> String {
    format!("{} {}", number(count), if count == 1 { one } else { many })
}

/// A count with thousands separated: `1,478`.
pub fn number(count: u64) -> String {
    let digits = count.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Prints an answer as JSON, one document per line so a stream of them is NDJSON.
pub fn json(value: &Value) {
    println!("{value}");
}

/// A string field, or "" (a missing or null one prints as nothing rather than `null`).
pub fn text(value: &Value, field: &str) -> String {
    match value.get(field) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// Prints rows under a header, each column as wide as its widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (index, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if index + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Milliseconds since the Unix epoch (every time the API gives) as `YYYY-MM-DD HH:MM:SSZ`
/// (UTC); "" for none.
pub fn time(ms: Option<i64>) -> String {
    let Some(ms) = ms else {
        return String::new();
    };
    let (year, month, day, hour, minute, second) = plinth_kit::clock::civil(ms.div_euclid(1000));
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}Z")
}

/// Bytes for people: `512 B`, `4.1 KiB`, `3.0 MiB`.
pub fn bytes(count: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if count < 1024 {
        return format!("{count} B");
    }
    let mut value = count as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(time(Some(0)), "1970-01-01 00:00:00Z");
        assert_eq!(time(Some(1_790_570_094_999)), "2026-09-28 04:34:54Z");
        assert_eq!(time(Some(951_782_400_000)), "2000-02-29 00:00:00Z");
        assert_eq!(time(None), "");
    }

    #[test]
    fn counts_take_the_noun_in_the_right_number() {
        assert_eq!(count(0, "file", "files"), "0 files");
        assert_eq!(count(1, "file", "files"), "1 file");
        assert_eq!(count(2, "directory", "directories"), "2 directories");
        assert_eq!(count(1478, "file", "files"), "1,478 files");
        assert_eq!(number(999), "999");
        assert_eq!(number(1_000_000), "1,000,000");
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(4200), "4.1 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
    }
}
