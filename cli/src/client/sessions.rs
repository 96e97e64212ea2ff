//! Session commands: `session new|end`, `exec` and `cp`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use futures::StreamExt as _;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use super::api::Api;
use super::environments::environment_id;
use super::{Usage, output, shell};
use crate::client_args::{CpArgs, ExecArgs, OutputFormat, SessionCommand};

/// The exit status of a command stopped by Ctrl-C, as shells report it (128 + SIGINT).
pub(super) const INTERRUPTED: u8 = 130;

pub async fn session(command: SessionCommand) -> anyhow::Result<ExitCode> {
    let api = Api::from_profile()?;
    match command {
        SessionCommand::New(args) => {
            let session = start(&api, &args.env).await?;
            if args.output.output == OutputFormat::Json {
                output::json(&session);
            } else {
                println!("{}", output::text(&session, "id"));
            }
        }
        SessionCommand::List(args) => {
            let sessions = list(&api, args.env.as_deref(), args.state.as_deref()).await?;
            if args.output.output == OutputFormat::Json {
                output::json(
                    &json!({ "object": "list", "data": sessions, "has_more": false, "next": null }),
                );
            } else {
                let rows: Vec<Vec<String>> = sessions
                    .iter()
                    .map(|session| {
                        vec![
                            output::text(session, "id"),
                            output::text(session, "status"),
                            output::text(&session["environment"], "mount"),
                            output::text(&session["environment"], "version"),
                            output::text(session, "turns"),
                            output::time(session["createdAt"].as_i64().map(|ms| ms / 1000)),
                        ]
                    })
                    .collect();
                output::table(
                    &["ID", "STATUS", "ENVIRONMENT", "VERSION", "TURNS", "CREATED"],
                    &rows,
                );
            }
        }
        SessionCommand::End(args) => {
            let ended = api.delete(["v1", "sessions", &args.session]).await?;
            if args.output.output == OutputFormat::Json {
                output::json(&ended);
            } else {
                println!("ended {}", args.session);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Every session (following `next` to the last page), of environment `env` (slug or id) and
/// in `state` when given.
async fn list(api: &Api, env: Option<&str>, state: Option<&str>) -> anyhow::Result<Vec<Value>> {
    let environment = match env {
        Some(env) => Some(environment_id(api, env).await?),
        None => None,
    };
    let mut sessions = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = api.url(["v1", "sessions"]);
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("limit", "1000");
            if let Some(environment) = &environment {
                query.append_pair("environment", environment);
            }
            if let Some(state) = state {
                query.append_pair("state", state);
            }
            if let Some(after) = &after {
                query.append_pair("after", after);
            }
        }
        let page = api.json(api.request(Method::GET, url)).await?;
        sessions.extend(page["data"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(next) if page["has_more"].as_bool() == Some(true) => after = Some(next.to_owned()),
            _ => return Ok(sessions),
        }
    }
}

/// Starts a session on an environment (slug or id); answers the session object.
pub(super) async fn start(api: &Api, env: &str) -> anyhow::Result<Value> {
    let id = environment_id(api, env).await?;
    api.post(["v1", "sessions"], &json!({ "environment": id }))
        .await
}

/// The most standard input `exec` sends: the API takes it in the request's JSON body (at most
/// 1 MiB), base64-encoded.
const MAX_STDIN_BYTES: u64 = 700 * 1024;

/// Standard input, read to its end, unless it is a terminal (a person at it would have to
/// type Ctrl-D before anything ran) or `--no-stdin` says not to; refused past
/// [`MAX_STDIN_BYTES`] rather than held whole.
async fn piped_stdin(args: &ExecArgs) -> anyhow::Result<Option<Vec<u8>>> {
    use std::os::fd::AsFd as _;
    use tokio::io::AsyncReadExt as _;
    if args.no_stdin || rustix::termios::isatty(std::io::stdin().as_fd()) {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    tokio::io::stdin()
        .take(MAX_STDIN_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .context("cannot read standard input")?;
    if bytes.len() as u64 > MAX_STDIN_BYTES {
        return Err(Usage(format!(
            "standard input is larger than {} KiB, the most exec sends: copy it into the \
             session (`plinth cp - {}:input`) and have the command read it (`plinth exec {} \
             -- sh -c 'CMD < input'`), or pass --no-stdin",
            MAX_STDIN_BYTES / 1024,
            args.target,
            args.target
        ))
        .into());
    }
    Ok((!bytes.is_empty()).then_some(bytes))
}

pub async fn exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let api = Api::from_profile()?;
    let command = shell::join(&args.command);
    let mut body = json!({ "command": command });
    if let Some(stdin) = piped_stdin(&args).await? {
        use base64::Engine as _;
        body["stdin_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(stdin));
    }
    if let Some(seconds) = args.timeout {
        body["timeout_ms"] = json!(seconds.saturating_mul(1000));
    }
    let json = args.output.output == OutputFormat::Json;
    if args.target.starts_with(plinth_kit::ids::SessionId::PREFIX) {
        return tokio::select! {
            ran = run(&api, &args.target, &body, json) => ran,
            _ = tokio::signal::ctrl_c() => Ok(ExitCode::from(INTERRUPTED)),
        };
    }
    // A session of our own: ended whatever happens, Ctrl-C included, so nothing is left
    // holding a uid and a directory until its idle limit.
    let session = start(&api, &args.target).await?;
    let id = output::text(&session, "id");
    let ran = tokio::select! {
        ran = run(&api, &id, &body, json) => ran,
        _ = tokio::signal::ctrl_c() => Ok(ExitCode::from(INTERRUPTED)),
    };
    if let Err(error) = api.delete(["v1", "sessions", &id]).await {
        eprintln!(
            "plinth: could not end session {id}: {error:#}; end it with `plinth session end {id}`"
        );
    }
    ran
}

/// Runs `body` in session `id`, printing its output as it comes; answers its exit status.
async fn run(api: &Api, id: &str, body: &Value, json: bool) -> anyhow::Result<ExitCode> {
    let mut url = api.url(["v1", "sessions", id, "exec"]);
    url.query_pairs_mut().append_pair("stream", "true");
    let response = api.send(api.request(Method::POST, url).json(body)).await?;
    let mut stream = response.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    let mut result: Option<Value> = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| api.unreachable(error))?;
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Some(ended) = event(&line, json)? {
                result = Some(ended);
            }
        }
    }
    if !pending.is_empty()
        && let Some(ended) = event(&pending, json)?
    {
        result = Some(ended);
    }
    let result = result.context(
        "the server ended the command's stream without its result; the session's turns \
         (GET /v1/sessions/{id}/turns) say how it ended",
    )?;
    if result["timed_out"].as_bool() == Some(true) {
        eprintln!("plinth: the command ran out of time and was stopped");
    }
    if result["oom_killed"].as_bool() == Some(true) {
        eprintln!("plinth: the command ran out of memory and was killed");
    }
    let code = result["exit_code"].as_i64().unwrap_or(1);
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// Handles one NDJSON event: output is printed (or, for `--output json`, every line is passed
/// on as it came); answers the result when this is it.
fn event(line: &[u8], json: bool) -> anyhow::Result<Option<Value>> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let event: Value = serde_json::from_str(text)
        .with_context(|| format!("the server sent an exec event that is not JSON: {text:?}"))?;
    if json {
        output::json(&event);
    }
    if let Some(error) = event.get("error") {
        anyhow::bail!(
            "the command was cut off: {} ({})",
            output::text(error, "message"),
            output::text(error, "code")
        );
    }
    if event.get("exit_code").is_some() {
        return Ok(Some(event));
    }
    if !json {
        if let Some(out) = event["stdout"].as_str() {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(out.as_bytes())
                .and_then(|()| stdout.flush())
                .context("cannot print the command's output")?;
        }
        if let Some(err) = event["stderr"].as_str() {
            let _ = std::io::stderr().write_all(err.as_bytes());
        }
    }
    Ok(None)
}

/// One side of `cp`.
#[derive(Debug)]
enum Place {
    Local(PathBuf),
    /// A session's file as given: relative to its working directory, `~/…`, or absolute as
    /// the session's commands see it (resolved against the session by [`in_workdir`]).
    Session {
        id: String,
        path: String,
    },
}

/// `sess_…:path` is a session's file; anything else a local path.
fn place(given: &str) -> anyhow::Result<Place> {
    match given.split_once(':') {
        Some((id, path)) if id.starts_with(plinth_kit::ids::SessionId::PREFIX) => {
            if path.is_empty() {
                return Err(Usage(format!(
                    "{given:?} names no file: give a path in the session's working directory, \
                     e.g. {id}:out/report.md"
                ))
                .into());
            }
            Ok(Place::Session {
                id: id.to_owned(),
                path: path.to_owned(),
            })
        }
        _ => Ok(Place::Local(PathBuf::from(given))),
    }
}

/// Which way a file goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

/// `path` of a session as the files API names it: relative to the working directory. The
/// files API reaches the working directory (the session's `HOME`) and nothing else, so a
/// relative path, `~/…`, or an absolute path beneath `workdir` is taken; the environment's
/// mount (`mount`, read-only) and any other absolute path (`/tmp`, private to the session's
/// commands) are refused, saying so, rather than copied somewhere else. A trailing `/` (a
/// directory) is kept.
fn in_workdir(
    id: &str,
    path: &str,
    workdir: &str,
    mount: &str,
    direction: Direction,
) -> anyhow::Result<String> {
    let beneath = |dir: &str| -> Option<String> {
        let dir = dir.trim_end_matches('/');
        if dir.is_empty() {
            return None;
        }
        match path.strip_prefix(dir)? {
            "" => Some(String::new()),
            rest => rest.strip_prefix('/').map(str::to_owned),
        }
    };
    let relative = if path == "~" {
        String::new()
    } else if let Some(rest) = path.strip_prefix("~/") {
        rest.to_owned()
    } else if !path.starts_with('/') {
        path.to_owned()
    } else if let Some(rest) = beneath(workdir) {
        rest
    } else if beneath(mount).is_some() || beneath(plinth_kit::slug::MOUNT_ROOT).is_some() {
        return Err(Usage(match direction {
            Direction::Write => format!(
                "{path} is in the environment, which sessions read and never write ({mount} is \
                 read-only): copy to the session's working directory instead, e.g. \
                 {id}:{}",
                path.rsplit('/').next().unwrap_or_default()
            ),
            Direction::Read => format!(
                "{path} is in the environment, not in the session's working directory, and cp \
                 copies only the working directory's files: copy it there first \
                 (`plinth exec {id} -- cp {path} .`), or read the environment's files with \
                 `plinth env show`"
            ),
        })
        .into());
    } else {
        return Err(Usage(format!(
            "{path} is outside the session's working directory ({workdir}); cp reaches only the \
             working directory (relative paths, ~/…, or absolute beneath it). {}",
            match direction {
                Direction::Read => format!(
                    "Copy the file there first: `plinth exec {id} -- cp {path} {workdir}/`"
                ),
                Direction::Write => format!(
                    "Copy into it, then move the file in the session: `plinth exec {id} -- mv \
                     {workdir}/NAME {path}`"
                ),
            }
        ))
        .into());
    };
    let trimmed = relative.trim_start_matches("./").trim_start_matches('/');
    if trimmed.split('/').any(|part| part == "..") {
        return Err(Usage(format!(
            "{path}: a session path may not go up with `..`; name it from the working directory"
        ))
        .into());
    }
    Ok(trimmed.to_owned())
}

/// Resolves a session's path against the session itself (its working directory and mount).
async fn session_path(
    api: &Api,
    id: &str,
    path: &str,
    direction: Direction,
) -> anyhow::Result<String> {
    let needs_session = path.starts_with('/') || path.starts_with('~');
    let resolved = if needs_session {
        let session = api.get(["v1", "sessions", id]).await?;
        in_workdir(
            id,
            path,
            &output::text(&session, "workdir"),
            &output::text(&session["environment"], "mount"),
            direction,
        )?
    } else {
        in_workdir(id, path, "", "", direction)?
    };
    let is_dir = resolved.is_empty() || resolved.ends_with('/');
    if is_dir && direction == Direction::Read {
        return Err(Usage(format!(
            "{id}:{path} is a directory; cp copies one file: name the file, e.g. \
             {id}:out/report.md"
        ))
        .into());
    }
    Ok(resolved)
}

pub async fn cp(args: CpArgs) -> anyhow::Result<ExitCode> {
    let from = place(&args.from)?;
    let to = place(&args.to)?;
    let api = Api::from_profile()?;
    let answer = match (from, to) {
        (Place::Session { id, path }, Place::Local(local)) => {
            let path = session_path(&api, &id, &path, Direction::Read).await?;
            download(&api, &id, &path, &local).await?
        }
        (Place::Local(local), Place::Session { id, path }) => {
            let path = session_path(&api, &id, &path, Direction::Write).await?;
            upload(&api, &local, &id, &path).await?
        }
        _ => {
            return Err(Usage(
                "one side of cp must be a session's file (sess_…:path) and the other a local \
                 path"
                    .to_owned(),
            )
            .into());
        }
    };
    if args.output.output == OutputFormat::Json {
        output::json(&answer);
    }
    Ok(ExitCode::SUCCESS)
}

/// The URL of a session's file, each path segment encoded.
fn file_url(api: &Api, id: &str, path: &str) -> reqwest::Url {
    api.url(
        ["v1", "sessions", id, "files"]
            .into_iter()
            .chain(path.split('/').filter(|s| !s.is_empty())),
    )
}

async fn download(api: &Api, id: &str, path: &str, local: &Path) -> anyhow::Result<Value> {
    let response = api
        .send(api.request(Method::GET, file_url(api, id, path)))
        .await?;
    let mut stream = response.bytes_stream();
    let mut size: u64 = 0;
    if local == Path::new("-") {
        let mut stdout = tokio::io::stdout();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| api.unreachable(error))?;
            size += chunk.len() as u64;
            stdout
                .write_all(&chunk)
                .await
                .context("cannot write to standard output")?;
        }
        stdout
            .flush()
            .await
            .context("cannot write to standard output")?;
        return Ok(json!({ "path": "-", "size": size }));
    }
    let target = if local.is_dir() {
        let name = path.rsplit('/').next().unwrap_or(path);
        local.join(name)
    } else {
        local.to_path_buf()
    };
    let mut file = tokio::fs::File::create(&target)
        .await
        .with_context(|| format!("cannot write {}", target.display()))?;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| api.unreachable(error))?;
        size += chunk.len() as u64;
        file.write_all(&chunk)
            .await
            .with_context(|| format!("cannot write {}", target.display()))?;
    }
    file.flush()
        .await
        .with_context(|| format!("cannot write {}", target.display()))?;
    Ok(json!({ "path": target, "size": size }))
}

async fn upload(api: &Api, local: &Path, id: &str, path: &str) -> anyhow::Result<Value> {
    let body = if local == Path::new("-") {
        reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(tokio::io::stdin()))
    } else {
        let file = tokio::fs::File::open(local)
            .await
            .with_context(|| format!("cannot read {}", local.display()))?;
        let metadata = file
            .metadata()
            .await
            .with_context(|| format!("cannot read {}", local.display()))?;
        if !metadata.is_file() {
            return Err(Usage(format!(
                "{} is not a file; cp copies one file (push sends a directory to an environment)",
                local.display()
            ))
            .into());
        }
        reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file))
    };
    // A session path ending in `/` (or the working directory itself) is a directory: the
    // file keeps its local name there.
    let path = if path.is_empty() || path.ends_with('/') {
        let name = local
            .file_name()
            .and_then(|name| name.to_str())
            .context("standard input has no name: give the session path in full")?;
        format!("{path}{name}")
    } else {
        path.to_owned()
    };
    api.json(
        api.request(Method::PUT, file_url(api, id, &path))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sess_0123";

    fn resolve(path: &str, direction: Direction) -> Result<String, String> {
        in_workdir(ID, path, "/home/session", "/env/studio", direction)
            .map_err(|error| error.to_string())
    }

    #[test]
    fn paths_in_the_working_directory_are_relative_to_it_however_they_are_written() {
        for direction in [Direction::Read, Direction::Write] {
            for (given, relative) in [
                ("out/report.md", "out/report.md"),
                ("./out/report.md", "out/report.md"),
                ("/home/session/out/report.md", "out/report.md"),
                ("/home/session/", ""),
                ("/home/session", ""),
                ("~/out/report.md", "out/report.md"),
                ("~", ""),
                ("out/", "out/"),
            ] {
                assert_eq!(
                    resolve(given, direction).as_deref(),
                    Ok(relative),
                    "{given}"
                );
            }
        }
    }

    #[test]
    fn the_environment_and_other_absolute_paths_are_refused_saying_why() {
        let write = resolve("/env/studio/run.py", Direction::Write).expect_err("refused");
        assert!(write.contains("read-only"), "{write}");
        let read = resolve("/env/studio/run.py", Direction::Read).expect_err("refused");
        assert!(read.contains("in the environment"), "{read}");
        let other_env = resolve("/env/other/x", Direction::Write).expect_err("refused");
        assert!(other_env.contains("read-only"), "{other_env}");
        for outside in ["/tmp/x", "/home/sessionx/y", "/etc/passwd", "/"] {
            for direction in [Direction::Read, Direction::Write] {
                let refused = resolve(outside, direction).expect_err("refused");
                assert!(
                    refused.contains("outside the session's working directory"),
                    "{outside}: {refused}"
                );
            }
        }
        let up = resolve("/home/session/../etc/passwd", Direction::Read).expect_err("refused");
        assert!(up.contains(".."), "{up}");
    }

    #[test]
    fn a_session_side_is_a_sess_prefix_and_a_colon() {
        assert!(matches!(
            place("sess_0123:/home/session/x"),
            Ok(Place::Session { path, .. }) if path == "/home/session/x"
        ));
        assert!(matches!(place("./local:file"), Ok(Place::Local(_))));
        assert!(place("sess_0123:").is_err());
    }
}
