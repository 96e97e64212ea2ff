//! What the session benches share (`sessions` and `sessions_cold`): the version tree they
//! generate, and percentiles.

use std::io::Write as _;
use std::path::Path;

pub(crate) fn percentile(values: &[f64], fraction: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// A deterministic generator, so every run materializes the same version.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// Writes a venv-shaped project under `dir` (median ~2 KB, a few large files) and answers the
/// relative paths and total bytes.
pub(crate) fn generate(dir: &Path, files: usize, total: u64) -> anyhow::Result<(Vec<String>, u64)> {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut sizes: Vec<u64> = (0..files)
        .map(|i| match i % 100 {
            0 => 0,
            1..=14 => 8 * 1024 + rng.next() % (192 * 1024),
            _ => 200 + rng.next() % 3800,
        })
        .collect();
    let small: u64 = sizes.iter().sum();
    let large = sizes.iter().filter(|size| **size == 0).count().max(1) as u64;
    for size in &mut sizes {
        if *size == 0 {
            *size = total.saturating_sub(small) / large;
        }
    }
    let mut paths = Vec::with_capacity(files);
    let mut bytes = 0;
    for (i, size) in sizes.iter().enumerate() {
        let path = match i % 10 {
            0..=5 => format!(
                ".venv/lib/python3.12/site-packages/pkg{}/mod{i}.py",
                i % 400
            ),
            6..=8 => format!("node_modules/lib{}/dist/file{i}.js", i % 300),
            _ => format!("src/module{}/part{i}.py", i % 50),
        };
        let full = dir.join(&path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = std::io::BufWriter::new(std::fs::File::create(&full)?);
        let mut written = 0u64;
        let line = format!("# {path} {i}\n");
        while written < *size {
            let word = format!("w{} ", rng.next() % 100_000);
            let piece = if written == 0 { &line } else { &word };
            let take = (piece.len() as u64).min(size - written) as usize;
            file.write_all(&piece.as_bytes()[..take])?;
            written += take as u64;
        }
        file.flush()?;
        bytes += size;
        paths.push(path);
    }
    Ok((paths, bytes))
}
