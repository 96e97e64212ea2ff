//! Printing answers: the API's JSON as it came for `--output json`, aligned columns and
//! `key: value` lines for people.

use serde_json::Value;

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
    fn sizes_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(4200), "4.1 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
    }
}
