//! Environment commands: `env`, `push`, `import`, `build`, `versions`, `activate`.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use reqwest::Method;
use serde_json::{Value, json};

use super::api::{Api, ApiFailure};
use super::archive::{self, Counters};
use super::checkout;
use super::{Usage, output};
use crate::client_args::{
    ActivateArgs, BuildArgs, BuildCommand, BuildLogsArgs, EnvArgs, EnvCommand, EnvCreateArgs,
    EnvRmArgs, ImportArgs, OutputFormat, PushArgs,
};

/// An environment named by id (`henv_…`) or slug: its id. A slug is looked up in the list of
/// the caller's environments (the API addresses environments by id only); a name matches
/// too when it is exactly one environment's.
pub async fn environment_id(api: &Api, given: &str) -> anyhow::Result<String> {
    if given.starts_with(plinth_kit::ids::EnvironmentId::PREFIX) {
        return Ok(given.to_owned());
    }
    let list = api.get(["v1", "environments"]).await?;
    let all = list["data"].as_array().cloned().unwrap_or_default();
    if let Some(found) = all.iter().find(|env| env["slug"] == given) {
        return Ok(output::text(found, "id"));
    }
    let named: Vec<&Value> = all.iter().filter(|env| env["name"] == given).collect();
    if let [only] = named.as_slice() {
        return Ok(output::text(only, "id"));
    }
    anyhow::bail!(
        "no environment with the slug or id {given:?} in your scope; `plinth env list` shows them"
    )
}

pub async fn env(command: EnvCommand) -> anyhow::Result<ExitCode> {
    let api = Api::from_profile()?;
    match command {
        EnvCommand::Create(args) => create(&api, args).await,
        EnvCommand::List(output) => {
            let list = api.get(["v1", "environments"]).await?;
            if output.output == OutputFormat::Json {
                output::json(&list);
                return Ok(ExitCode::SUCCESS);
            }
            let rows: Vec<Vec<String>> = list["data"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|env| {
                    vec![
                        output::text(env, "slug"),
                        output::text(env, "status"),
                        output::text(env, "version"),
                        output::text(env, "id"),
                        output::text(env, "name"),
                    ]
                })
                .collect();
            output::table(&["SLUG", "STATUS", "VERSION", "ID", "NAME"], &rows);
            Ok(ExitCode::SUCCESS)
        }
        EnvCommand::Show(args) => {
            let id = environment_id(&api, &args.env).await?;
            let env = api.get(["v1", "environments", &id]).await?;
            if args.output.output == OutputFormat::Json {
                output::json(&env);
            } else {
                show(&env);
            }
            Ok(ExitCode::SUCCESS)
        }
        EnvCommand::Rm(args) => remove(&api, args).await,
    }
}

/// `env rm`: deletes once the person at the terminal typed the environment's slug, or with
/// `--yes`; without a terminal to ask on and without `--yes`, deletes nothing.
async fn remove(api: &Api, args: EnvRmArgs) -> anyhow::Result<ExitCode> {
    let id = environment_id(api, &args.env).await?;
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            return Err(Usage(format!(
                "standard input is not a terminal, so there is no one to confirm deleting {}; \
                 pass --yes to delete it and every version of it",
                args.env
            ))
            .into());
        }
        let env = api.get(["v1", "environments", &id]).await?;
        let slug = output::text(&env, "slug");
        let versions = env["versions"].as_array().map_or(0, Vec::len) as u64;
        let answer = prompt(&format!(
            "Delete {slug} ({id}) and {}? Sessions cannot start on it afterwards. Type its slug \
             to confirm: ",
            output::count(versions, "version", "versions")
        ))?;
        if answer.trim() != slug {
            eprintln!("plinth: {slug} was not deleted (the answer was not its slug)");
            return Ok(ExitCode::FAILURE);
        }
    }
    let deleted = api.delete(["v1", "environments", &id]).await?;
    if args.output.output == OutputFormat::Json {
        output::json(&deleted);
    } else {
        println!("deleted {} ({id})", args.env);
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks a question on standard error and reads one line of standard input.
fn prompt(question: &str) -> anyhow::Result<String> {
    let mut stderr = std::io::stderr().lock();
    stderr
        .write_all(question.as_bytes())
        .and_then(|()| stderr.flush())
        .context("cannot ask for confirmation")?;
    drop(stderr);
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("cannot read the confirmation")?;
    Ok(line)
}

async fn create(api: &Api, args: EnvCreateArgs) -> anyhow::Result<ExitCode> {
    let mut body = json!({ "name": args.name });
    if let Some(entry) = args.entry {
        body["entry"] = json!(entry);
    }
    if let Some(description) = args.description {
        body["description"] = json!(description);
    }
    let env = api.post(["v1", "environments"], &body).await?;
    if args.output.output == OutputFormat::Json {
        output::json(&env);
    } else {
        println!(
            "created {} ({}), mounted at {}",
            output::text(&env, "slug"),
            output::text(&env, "id"),
            output::text(&env, "mount")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// An environment as `key: value` lines, then its versions.
fn show(env: &Value) {
    let files = &env["files"];
    let lines = [
        ("id", output::text(env, "id")),
        ("name", output::text(env, "name")),
        ("slug", output::text(env, "slug")),
        ("mount", output::text(env, "mount")),
        ("status", output::text(env, "status")),
        (
            "version",
            match (env["version"].as_u64(), env["latestVersion"].as_u64()) {
                (Some(active), Some(latest)) => format!("{active} (latest {latest})"),
                (None, Some(latest)) => format!("none active (latest {latest})"),
                _ => "none built".to_owned(),
            },
        ),
        ("entry", output::text(env, "entry")),
        ("description", output::text(env, "description")),
        (
            "files",
            format!(
                "{} ({})",
                files["count"].as_u64().unwrap_or(0),
                output::bytes(files["bytes"].as_u64().unwrap_or(0))
            ),
        ),
        (
            "packages",
            env["packages"].as_array().map_or(0, Vec::len).to_string(),
        ),
    ];
    for (key, value) in lines {
        println!("{:<12} {value}", format!("{key}:"));
    }
    if let Some(versions) = env["versions"].as_array().filter(|v| !v.is_empty()) {
        println!();
        version_table(versions, env["version"].as_u64());
    }
}

fn version_table(versions: &[Value], active: Option<u64>) {
    let rows: Vec<Vec<String>> = versions
        .iter()
        .map(|v| {
            let is_active = v["active"].as_bool().unwrap_or(false)
                || (active.is_some() && v["version"].as_u64() == active);
            vec![
                output::text(v, "version"),
                output::text(v, "status"),
                if is_active { "*".into() } else { String::new() },
                output::text(v, "packages"),
                output::time(v["finished_at"].as_i64()),
            ]
        })
        .collect();
    output::table(
        &["VERSION", "STATUS", "ACTIVE", "PACKAGES", "FINISHED"],
        &rows,
    );
}

pub async fn push(args: PushArgs) -> anyhow::Result<ExitCode> {
    if !args.dir.is_dir() {
        return Err(Usage(format!(
            "{} is not a directory; push sends a project directory (cp copies one file into a \
             session)",
            args.dir.display()
        ))
        .into());
    }
    let api = Api::from_profile()?;
    let id = environment_id(&api, &args.env).await?;
    let checkout = {
        let dir = args.dir.clone();
        tokio::task::spawn_blocking(move || checkout::of(&dir))
            .await
            .unwrap_or(None)
    };
    let (report, walked, checkout) = match upload(&api, &id, &args, checkout.as_ref()).await {
        // A server of an earlier release refuses the origin's parameters: the files go alone.
        Err(error) if checkout.is_some() && takes_no_origin(&error) => {
            eprintln!(
                "warning: this server keeps no git origin for a push (an earlier release): the \
                 files go alone, and builds give no version from git"
            );
            let (report, walked) = upload(&api, &id, &args, None).await?;
            (report, walked, None)
        }
        answer => {
            let (report, walked) = answer?;
            (report, walked, checkout)
        }
    };
    for skipped in &walked.skipped {
        eprintln!(
            "skipped {}: not a file, directory or symlink",
            skipped.display()
        );
    }
    warnings(&report);
    let json = args.output.output == OutputFormat::Json;
    let left_out = left_out(&walked, !args.no_default_ignores);
    if json {
        output::json(&report);
        if let Some(left_out) = left_out {
            eprintln!("{left_out}");
        }
    } else {
        println!(
            "pushed {}, {} ({}) to {}{}{}",
            output::count(report["files"].as_u64().unwrap_or(0), "file", "files"),
            output::count(
                report["directories"].as_u64().unwrap_or(0),
                "directory",
                "directories"
            ),
            output::bytes(report["bytes"].as_u64().unwrap_or(0)),
            args.env,
            match &checkout {
                Some(checkout) => format!(
                    " from git {}{}",
                    checkout.describe,
                    if checkout.dirty {
                        " with uncommitted changes"
                    } else {
                        ""
                    }
                ),
                None => String::new(),
            },
            if args.keep_existing {
                ", over its source (files only the source had are kept)"
            } else {
                ", replacing its source (files the directory does not have are gone from it)"
            }
        );
        if let Some(left_out) = left_out {
            println!("{left_out}");
        }
        server_skipped(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// What the walk left out, by reason, as one line; none when it left out nothing.
fn left_out(walked: &archive::Walked, default_ignores: bool) -> Option<String> {
    let total = walked.total();
    if total == 0 {
        return None;
    }
    let mut reasons: Vec<String> = walked
        .by_default
        .iter()
        .filter(|(_, files)| **files > 0)
        .map(|(reason, files)| format!("{} {reason}", output::number(*files)))
        .collect();
    if walked.by_ignore_files > 0 {
        reasons.push(format!(
            "{} named by .gitignore, .ignore or {}",
            output::number(walked.by_ignore_files),
            archive::IGNORE_FILE
        ));
    }
    if !walked.skipped.is_empty() {
        reasons.push(format!(
            "{} not a file, directory or symlink",
            output::number(walked.skipped.len() as u64)
        ));
    }
    let mut line = format!(
        "skipped {}: {}",
        output::count(total, "file", "files"),
        reasons.join(", ")
    );
    if default_ignores && walked.by_default.values().any(|files| *files > 0) {
        line.push_str("; --no-default-ignores sends the default ones too");
    }
    Some(line)
}

/// What the server left out of an import, a line per reason (the answer counts members by
/// reason; it names no paths).
fn server_skipped(report: &Value) {
    let skipped = report["skipped"].as_u64().unwrap_or(0);
    if skipped == 0 {
        return;
    }
    println!(
        "the server left out {}:",
        output::count(skipped, "member", "members")
    );
    let Some(reasons) = report["skipped_by_reason"].as_object() else {
        return;
    };
    for (reason, count) in reasons {
        let count = count.as_u64().unwrap_or(0);
        let (one, many) = match reason.as_str() {
            "symlink" => (
                "symlink whose target leaves the project",
                "symlinks whose targets leave the project",
            ),
            "hard_link" => ("hard link", "hard links"),
            "device" => ("device", "devices"),
            "fifo" => ("FIFO", "FIFOs"),
            "unsafe_path" => (
                "path that leaves the project",
                "paths that leave the project",
            ),
            "submodule" => (
                "git submodule (its files are not fetched)",
                "git submodules (their files are not fetched)",
            ),
            other => (other, other),
        };
        println!("  {}", output::count(count, one, many));
    }
}

/// Sends `args.dir` as the environment's source, with where it came from by git when it is a
/// checkout; answers the import's report and what the walk skipped.
async fn upload(
    api: &Api,
    id: &str,
    args: &PushArgs,
    checkout: Option<&checkout::Checkout>,
) -> anyhow::Result<(Value, archive::Walked)> {
    let counters = Arc::new(Counters::default());
    let (body, walker) =
        archive::stream(args.dir.clone(), !args.no_default_ignores, counters.clone());
    let mut url = api.url(["v1", "environments", id, "import"]);
    // Replace: the source becomes exactly the directory, files deleted locally included.
    url.query_pairs_mut()
        .append_pair("replace", if args.keep_existing { "false" } else { "true" });
    // Where the files came from by git, recorded as a git import's origin is: builds give
    // setuptools-scm and hatch-vcs the version they would compute in the checkout.
    if let Some(checkout) = checkout {
        let mut query = url.query_pairs_mut();
        query
            .append_pair("commit", &checkout.commit)
            .append_pair("describe", &checkout.describe)
            .append_pair("dirty", if checkout.dirty { "true" } else { "false" });
        if !checkout.branch.is_empty() {
            query.append_pair("ref", &checkout.branch);
        }
        if checkout.commits > 0 {
            query.append_pair("commits", &checkout.commits.to_string());
        }
    }
    let request = api
        .request(Method::POST, url)
        .header(reqwest::header::CONTENT_TYPE, "application/gzip")
        .body(body);
    let progress = Progress::start(counters.clone());
    let answer = api.json(request).await;
    progress.finish();
    // The server's refusal (a quota, a size limit) is the reason, and the walk then only
    // stopped because the upload did: answer it without waiting for the walk.
    let report = match answer {
        Err(error) if error.is::<ApiFailure>() => return Err(error),
        answer => answer,
    };
    // Otherwise a walk that failed explains a cut-off upload better than the upload's error.
    let walked = walker.await.context("the directory walk stopped")??;
    Ok((report?, walked))
}

/// Whether a push was refused for the origin's query parameters, which a server of an earlier
/// release does not take.
fn takes_no_origin(error: &anyhow::Error) -> bool {
    error.downcast_ref::<ApiFailure>().is_some_and(|failure| {
        failure.code == "environment_invalid"
            && ["commit", "describe", "dirty", "ref", "commits"]
                .iter()
                .any(|name| {
                    failure
                        .message
                        .contains(&format!("unknown parameter \"{name}\""))
                })
    })
}

/// An import answer's warnings, on stderr: what the caller should know although it landed.
fn warnings(report: &Value) {
    for warning in report["warnings"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        if let Some(warning) = warning.as_str() {
            eprintln!("warning: {warning}");
        }
    }
}

/// What `push` shows while it sends: a live line on a terminal, a line every few seconds
/// otherwise (a log or CI output gains no redraws and still shows progress).
struct Progress {
    task: tokio::task::JoinHandle<()>,
    bar: Option<indicatif::ProgressBar>,
    counters: Arc<Counters>,
}

impl Progress {
    fn start(counters: Arc<Counters>) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = terminal.then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            {
                bar.set_style(style);
            }
            bar
        });
        let (ticked, ticker) = (bar.clone(), counters.clone());
        let task = plinth_kit::tasks::spawn(async move {
            let period = if ticked.is_some() {
                Duration::from_millis(100)
            } else {
                Duration::from_secs(5)
            };
            let mut interval = tokio::time::interval(period);
            interval.tick().await;
            loop {
                interval.tick().await;
                let line = Self::line(&ticker);
                match &ticked {
                    Some(bar) => {
                        bar.set_message(line);
                        bar.tick();
                    }
                    None => eprintln!("{line}"),
                }
            }
        });
        Progress {
            task,
            bar,
            counters,
        }
    }

    fn line(counters: &Counters) -> String {
        format!(
            "{}, {} read, {} sent",
            output::count(counters.files.load(Ordering::Relaxed), "file", "files"),
            output::bytes(counters.bytes.load(Ordering::Relaxed)),
            output::bytes(counters.sent.load(Ordering::Relaxed)),
        )
    }

    fn finish(self) {
        self.task.abort();
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
        eprintln!("sent {}", Self::line(&self.counters));
    }
}

pub async fn import(args: ImportArgs) -> anyhow::Result<ExitCode> {
    let api = Api::from_profile()?;
    let id = environment_id(&api, &args.env).await?;
    let mut git = json!({ "url": args.git });
    if let Some(reference) = args.reference {
        git["ref"] = json!(reference);
    }
    let report = api
        .post(
            ["v1", "environments", &id, "import"],
            &json!({ "git": git, "replace": args.replace }),
        )
        .await?;
    warnings(&report);
    if args.output.output == OutputFormat::Json {
        output::json(&report);
    } else {
        println!(
            "imported {} at {} ({}) into {}{}",
            output::count(report["files"].as_u64().unwrap_or(0), "file", "files"),
            output::text(&report, "commit"),
            output::text(&report, "describe"),
            args.env,
            if args.replace {
                ", replacing its source"
            } else {
                ", over its source (files only the source had are kept; --replace makes it \
                 equal the repository)"
            }
        );
        server_skipped(&report);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn build(args: BuildArgs) -> anyhow::Result<ExitCode> {
    let api = Api::from_profile()?;
    let env = match (args.command, args.env) {
        (Some(BuildCommand::Logs(logs)), _) => return build_logs(&api, logs).await,
        (None, Some(env)) => env,
        (None, None) => {
            return Err(Usage("name the environment to build: `plinth build ENV`".into()).into());
        }
    };
    let id = environment_id(&api, &env).await?;
    let body = if args.clean {
        json!({ "clean": true })
    } else {
        json!({})
    };
    let queued = api
        .post(["v1", "environments", &id, "build"], &body)
        .await?;
    let version = queued["version"]
        .as_u64()
        .context("the server's build answer has no version")?
        .to_string();
    let json = args.output.output == OutputFormat::Json;
    if !args.follow {
        if json {
            output::json(&queued);
        } else {
            println!("queued version {version} of {env}");
            eprintln!(
                "`plinth build logs {env} {version} --follow` prints its log as it is written"
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !json {
        eprintln!("building version {version} of {env}");
    }
    let record = follow_log(&api, &id, &version, json).await?;
    if json {
        output::json(&record);
    }
    match record["status"].as_str() {
        Some("ready") => {
            if !json {
                eprintln!("version {version} is ready and active");
            }
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprintln!(
                "plinth: version {version} failed: {}",
                output::text(&record, "error")
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `build logs`: a build's log, followed to the build's end with `--follow`; exits 1 when the
/// build failed.
async fn build_logs(api: &Api, args: BuildLogsArgs) -> anyhow::Result<ExitCode> {
    let id = environment_id(api, &args.env).await?;
    let version = match args.version {
        Some(version) => version.to_string(),
        None => {
            let list = api.get(["v1", "environments", &id, "versions"]).await?;
            // Newest first.
            match list["data"][0]["version"].as_u64() {
                Some(version) => version.to_string(),
                None => anyhow::bail!(
                    "{} has no build yet; `plinth build {} --follow` starts one",
                    args.env,
                    args.env
                ),
            }
        }
    };
    let json = args.output.output == OutputFormat::Json;
    let record = if args.follow {
        follow_log(api, &id, &version, json).await?
    } else {
        let record = api
            .get(["v1", "environments", &id, "builds", &version])
            .await?;
        if !json {
            let url = api.url(["v1", "environments", &id, "builds", &version, "log"]);
            let log = api
                .send(api.request(Method::GET, url))
                .await?
                .bytes()
                .await
                .map_err(|error| api.unreachable(error))?;
            output::stdout(&log).context("cannot print the build's log")?;
        }
        record
    };
    if json {
        output::json(&record);
    }
    match record["status"].as_str() {
        Some("failed") => {
            eprintln!(
                "plinth: version {version} failed: {}",
                output::text(&record, "error")
            );
            Ok(ExitCode::FAILURE)
        }
        Some("ready") => Ok(ExitCode::SUCCESS),
        _ => {
            if !json {
                eprintln!(
                    "version {version} is still being built; `plinth build logs {} {version} \
                     --follow` prints the rest as it is written",
                    args.env
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Streams a build's log (to stdout, or to stderr when stdout is for JSON) until the build
/// ends, and answers its record. A stream cut off early is resumed from the bytes already
/// printed.
async fn follow_log(api: &Api, id: &str, version: &str, json: bool) -> anyhow::Result<Value> {
    let mut offset: u64 = 0;
    loop {
        let mut url = api.url(["v1", "environments", id, "builds", version, "log"]);
        url.query_pairs_mut()
            .append_pair("follow", "true")
            .append_pair("offset", &offset.to_string());
        let response = api.send(api.request(Method::GET, url)).await?;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else {
                break;
            };
            offset += chunk.len() as u64;
            let written = if json {
                std::io::stderr().write_all(&chunk)
            } else {
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(&chunk).and_then(|()| stdout.flush())
            };
            written.context("cannot print the build's log")?;
        }
        let record = api
            .get(["v1", "environments", id, "builds", version])
            .await?;
        if matches!(record["status"].as_str(), Some("ready" | "failed")) {
            return Ok(record);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn versions(args: EnvArgs) -> anyhow::Result<ExitCode> {
    let api = Api::from_profile()?;
    let id = environment_id(&api, &args.env).await?;
    let list = api.get(["v1", "environments", &id, "versions"]).await?;
    if args.output.output == OutputFormat::Json {
        output::json(&list);
    } else {
        let versions = list["data"].as_array().cloned().unwrap_or_default();
        version_table(&versions, list["active"].as_u64());
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn activate(args: ActivateArgs) -> anyhow::Result<ExitCode> {
    let api = Api::from_profile()?;
    let id = environment_id(&api, &args.env).await?;
    let version = args.version.to_string();
    let env = api
        .post(
            ["v1", "environments", &id, "versions", &version, "activate"],
            &json!({}),
        )
        .await?;
    if args.output.output == OutputFormat::Json {
        output::json(&env);
    } else {
        println!("{} now serves version {version}", args.env);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(code: &str, message: &str) -> anyhow::Error {
        ApiFailure {
            status: 400,
            code: code.to_owned(),
            message: message.to_owned(),
            body: Value::Null,
        }
        .into()
    }

    #[test]
    fn a_server_that_takes_no_origin_is_told_from_other_refusals() {
        assert!(takes_no_origin(&refusal(
            "environment_invalid",
            "query: unknown parameter \"commit\"; this operation takes: replace"
        )));
        assert!(!takes_no_origin(&refusal(
            "environment_invalid",
            "origin: the commit must be a full commit id (40 or 64 hex digits), not \"abc\""
        )));
        assert!(!takes_no_origin(&refusal(
            "quota_exceeded",
            "query: unknown parameter \"commit\""
        )));
        assert!(!takes_no_origin(&anyhow::anyhow!(
            "query: unknown parameter \"commit\""
        )));
    }
}
