//! A lean HTTP/1.1 client for latency figures: one keep-alive connection, driven with
//! blocking calls on the measuring thread, so what is timed is the service and the loopback
//! socket rather than a client runtime's own tasks (a pooled async client adds a hand-off to
//! its connection task on each request and each response).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;

use anyhow::Context as _;

/// One connection to a `http://host:port` base URL.
pub struct Http1 {
    reader: BufReader<TcpStream>,
    host: String,
}

impl Http1 {
    /// Connects to `base` (`http://host:port`).
    pub fn connect(base: &str) -> anyhow::Result<Self> {
        let host = base
            .strip_prefix("http://")
            .context("only http:// bases")?
            .trim_end_matches('/')
            .to_owned();
        let stream = TcpStream::connect(&host).with_context(|| format!("connecting to {host}"))?;
        stream.set_nodelay(true)?;
        Ok(Http1 {
            reader: BufReader::new(stream),
            host,
        })
    }

    /// Sends `method path` with an optional JSON body; answers the status and the JSON body
    /// (null when empty).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        let body = match body {
            Some(value) => serde_json::to_vec(value)?,
            None => Vec::new(),
        };
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n",
            self.host,
            body.len()
        )
        .into_bytes();
        if !body.is_empty() {
            request.extend_from_slice(b"content-type: application/json\r\n");
        }
        request.extend_from_slice(b"\r\n");
        request.extend_from_slice(&body);
        self.reader.get_mut().write_all(&request)?;

        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .with_context(|| format!("bad status line {line:?}"))?;
        let (mut length, mut chunked) = (0usize, false);
        loop {
            line.clear();
            anyhow::ensure!(self.reader.read_line(&mut line)? > 0, "connection closed");
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().context("content-length")?;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            }
        }
        let mut answer = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim_end(), 16).context("chunk size")?;
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..size]);
            }
        } else {
            answer.resize(length, 0);
            self.reader.read_exact(&mut answer)?;
        }
        let value = if answer.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&answer).context("the answer is not JSON")?
        };
        Ok((status, value))
    }
}
