//! The walk-through (`docs/guide/walkthrough.md`), run as written: every command of its
//! `console` blocks goes, in order, through `sh` (and the real `curl`) to a real
//! `plinth serve`, and each answer is held to what the page shows under the command. What a
//! new user copies must work, from the shell lines that make its inputs to the last call.
//!
//! A curl's shown answer is checked for its shape, not its every byte: the status (an
//! `HTTP nnn` line below the body, where curl's write-out prints it, else any 2xx), every
//! `"key":` it shows, and every value it shows in full, except
//! values that differ from run to run (times, durations, working directories). A value cut
//! with `…` must begin, continue and end as shown. An answer that is not JSON (a file, a build
//! log) is compared as text, `…` standing for anything.
//!
//! Ids differ too: the first answer that shows an id (`henv_3690…`, or in full) says which
//! real id it stands for, and later commands and answers are read with the real one.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::spawn_serve;

/// Where the walk-through is, from the repository's root.
const PAGE: &str = "docs/guide/walkthrough.md";

const WALK_THROUGH: &str = include_str!("../../docs/guide/walkthrough.md");

/// Commands of the walk-through this test does not run, each with the reason. Each must
/// still be in the walk-through, so the list cannot outlive what it excuses.
const NOT_RUN: &[(&str, &str)] = &[(
    "https://github.com/example/content-studio",
    "a git import from GitHub: tests send nothing beyond loopback",
)];

/// The sections the walk-through is expected to hold; a parse that loses one fails.
const SECTIONS: &[&str] = &[
    "## What the walk-through sends",
    "## Environments",
    "## Files and imports",
    "## Conditional and ranged requests",
    "## Builds and versions",
    "## Harnesses",
    "## Sessions and tasks",
    "## Workspace adapters",
];

/// How long one command may run (a followed build log ends with the build).
const COMMAND_LIMIT: Duration = Duration::from_secs(60);

/// How the walk-through spells the server's address.
const PAGE_ADDRESS: &str = "localhost:8080";

/// Prefixes of the ids (and generated credentials) the walk-through shows.
const ID_PREFIXES: &[&str] = &[
    "henv_",
    "sess_",
    "chrn_",
    "wadp_",
    "task_",
    "plinth_novo_",
    "plinth_brain_",
];

#[tokio::test]
async fn the_walk_through_runs_as_written() {
    if !crate::helpers::can_build() {
        return;
    }
    for heading in SECTIONS {
        assert!(
            WALK_THROUGH.lines().any(|line| line.starts_with(heading)),
            "{PAGE} has no {heading:?}"
        );
    }
    let steps = steps(WALK_THROUGH, 0);
    for (needle, reason) in NOT_RUN {
        let matching = steps
            .iter()
            .filter(|step| step.command.contains(needle))
            .count();
        assert_eq!(
            matching, 1,
            "NOT_RUN names {needle:?} ({reason}), which {matching} walk-through commands contain"
        );
    }

    let scratch = tempfile::tempdir().expect("temp dir");
    let (data, work, home) = (
        scratch.path().join("data"),
        scratch.path().join("work"),
        scratch.path().join("home"),
    );
    for dir in [&data, &work, &home] {
        std::fs::create_dir(dir).expect("mkdir");
    }
    // What `-w '\nHTTP %{http_code}\n'` adds, for every curl; and curl talks to nothing but
    // the server, whatever proxy the environment names.
    std::fs::write(
        home.join(".curlrc"),
        "write-out = \"\\nHTTP %{http_code}\\n\"\nnoproxy = \"*\"\nmax-time = 50\n",
    )
    .expect("curlrc");

    let (server, address) = spawn_serve(&mut serve_command("127.0.0.1:0", &data)).await;
    let address = address.to_string();

    let mut run = Run {
        address,
        work,
        home,
        variables: BTreeMap::new(),
        ids: Ids::default(),
    };
    let started = Instant::now();
    let mut ran = 0;
    for step in &steps {
        if let Some((_, reason)) = NOT_RUN
            .iter()
            .find(|(needle, _)| step.command.contains(needle))
        {
            eprintln!("{PAGE} line {}: not run: {reason}", step.line);
            continue;
        }
        run.step(step);
        ran += 1;
    }
    eprintln!(
        "{ran} commands of the walk-through ran in {:?}",
        started.elapsed()
    );
    assert!(ran >= 40, "only {ran} commands found in the walk-through");
    drop(server);
}

/// `plinth serve` as a user starts it, with no tokens and no config file, on `address`;
/// builds get no network.
/// `plinth serve` on `address` and `data` as a new user runs it: no `PLINTH_*` settings but a
/// quiet log, and builds without network; for a caller to add to before spawning it.
pub(crate) fn serve_command(address: &str, data: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args(["serve", "--listen", address, "--data-dir"])
        .arg(data)
        .args(["--builder-network", "false"])
        .stdin(Stdio::null());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PLINTH_") {
            command.env_remove(name);
        }
    }
    command.env("PLINTH_LOG", "warn");
    command
}

/// One command of a `console` block and the answer shown under it.
#[derive(Debug)]
struct Step {
    /// Where the command begins on the page, 1-based.
    line: usize,
    command: String,
    shown: String,
}

/// Every command of the section's `console` blocks, in order. A line `$ …` begins a command;
/// it goes on while the shell would read on (a trailing `\`, an open quote); the lines after
/// it, up to the next command or the block's end, are its answer. A comment after two
/// spaces ends an answer line. `first_line` is how many lines of the page come before
/// `section`.
fn steps(section: &str, first_line: usize) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut in_block = false;
    // Whether the block's last line so far belongs to a command of this block.
    let mut after_command = false;
    let mut lines = section.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        if !in_block {
            in_block = line.trim() == "```console";
            after_command = false;
            continue;
        }
        if line.trim() == "```" {
            in_block = false;
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            let mut command = command.to_owned();
            while reads_on(&command) {
                let (_, next) = lines
                    .next()
                    .unwrap_or_else(|| panic!("the command {command:?} never ends"));
                command.push('\n');
                command.push_str(next);
            }
            steps.push(Step {
                line: first_line + index + 1,
                command,
                shown: String::new(),
            });
            after_command = true;
        } else if let Some(step) = steps.last_mut().filter(|_| after_command) {
            let answer = strip_comment(line);
            if !answer.trim().is_empty() {
                if !step.shown.is_empty() {
                    step.shown.push('\n');
                }
                step.shown.push_str(answer);
            }
        } else if !line.trim().is_empty() {
            panic!("an answer with no command before it: {line:?}");
        }
    }
    assert!(!in_block, "a console block is not closed");
    steps
}

/// Whether `sh` would read another line after `text`: an open quote, or a trailing `\`.
fn reads_on(text: &str) -> bool {
    enum State {
        Plain,
        Single,
        Double,
        Comment,
    }
    let mut state = State::Plain;
    let mut escaped = false;
    let mut word_start = true;
    for c in text.chars() {
        if escaped {
            escaped = false;
            word_start = false;
            continue;
        }
        match (&state, c) {
            (State::Plain | State::Double, '\\') => escaped = true,
            (State::Plain, '\'') => state = State::Single,
            (State::Plain, '"') => state = State::Double,
            (State::Plain, '#') if word_start => state = State::Comment,
            (State::Single, '\'') | (State::Double, '"') | (State::Comment, '\n') => {
                state = State::Plain;
            }
            _ => {}
        }
        word_start = c.is_whitespace();
    }
    escaped || matches!(state, State::Single | State::Double)
}

/// An answer line without a trailing comment (`{"stdout":"…"}   # how it streams`).
fn strip_comment(line: &str) -> &str {
    match line.find("  #") {
        Some(at) if line[at..].trim_start().starts_with("# ") => line[..at].trim_end(),
        _ => line,
    }
}

/// Ids as the page shows them (whole, or the prefix before `…` and so cut) and the real ids they stand for.
#[derive(Debug, Default)]
struct Ids(Vec<Known>);

#[derive(Debug)]
struct Known {
    stem: String,
    cut: bool,
    real: String,
}

/// An id as the page writes it: its text, the part before any `…`, and whether it is cut.
#[derive(Debug, Clone, PartialEq)]
struct IdToken {
    range: std::ops::Range<usize>,
    kind: &'static str,
    stem: String,
    cut: bool,
}

impl IdToken {
    fn stem_has_digits(&self) -> bool {
        self.stem.len() > self.kind.len()
    }
}

/// Every id in `text`, in order.
fn id_tokens(text: &str) -> Vec<IdToken> {
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let boundary = text[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let kind = ID_PREFIXES
            .iter()
            .copied()
            .find(|prefix| boundary && text[at..].starts_with(prefix));
        let Some(kind) = kind else {
            at += text[at..].chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let digits = text[at + kind.len()..]
            .bytes()
            .take_while(u8::is_ascii_hexdigit)
            .count();
        let stem_end = at + kind.len() + digits;
        let cut = text[stem_end..].starts_with('…');
        let end = if cut {
            stem_end + '…'.len_utf8()
        } else {
            stem_end
        };
        tokens.push(IdToken {
            range: at..end,
            kind,
            stem: text[at..stem_end].to_owned(),
            cut,
        });
        at = end;
    }
    tokens
}

impl Ids {
    /// The real id a shown id stands for, if an earlier answer said. Ids match when they
    /// are equal, or one is cut and the other begins with it.
    fn resolve(&self, token: &IdToken) -> Option<String> {
        if !token.stem_has_digits() {
            return None;
        }
        let mut found: Vec<&String> = self
            .0
            .iter()
            .filter(|known| {
                known.stem == token.stem
                    || (token.cut && known.stem.starts_with(&token.stem))
                    || (known.cut && token.stem.starts_with(&known.stem))
            })
            .map(|known| &known.real)
            .collect();
        found.sort();
        found.dedup();
        assert!(
            found.len() <= 1,
            "{} could stand for any of {found:?}",
            token.stem
        );
        found.first().map(|real| (*real).clone())
    }

    /// `text` with every id an earlier answer resolved written as the real one.
    fn substitute(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for token in id_tokens(text) {
            if let Some(real) = self.resolve(&token) {
                out.push_str(&text[last..token.range.start]);
                out.push_str(&real);
                last = token.range.end;
            }
        }
        out.push_str(&text[last..]);
        out
    }

    /// Learns what the ids a shown answer gives (`"id":"sess_5b0c…"`) stand for: the first
    /// value of the same key and kind in the real answer not already known.
    fn learn(&mut self, shown: &str, real: &str) {
        let real_pairs = pairs(real);
        for (key, value) in pairs(shown) {
            let Value::Str(value) = value else { continue };
            let tokens = id_tokens(&value);
            let [token] = tokens.as_slice() else { continue };
            if token.range != (0..value.len())
                || !token.stem_has_digits()
                || self.resolve(token).is_some()
            {
                continue;
            }
            let real_id = real_pairs
                .iter()
                .find_map(|(real_key, real_value)| match real_value {
                    Value::Str(candidate)
                        if *real_key == key
                            && candidate.starts_with(token.kind)
                            && !self.0.iter().any(|known| known.real == *candidate) =>
                    {
                        Some(candidate.clone())
                    }
                    _ => None,
                });
            if let Some(real_id) = real_id {
                self.0.push(Known {
                    stem: token.stem.clone(),
                    cut: token.cut,
                    real: real_id,
                });
            }
        }
    }
}

/// A value as the lexer sees it, after its key.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    /// A string, as written between its quotes (escapes kept).
    Str(String),
    /// A number, `true`, `false` or `null`, as written.
    Scalar(String),
    /// An object or array (its keys are pairs of their own) or an elided value (`…`).
    Other,
}

/// Every `"key": value` in JSON-like text (the page's answers elide with `…` and are not
/// JSON; real answers may be several JSON documents, one a line), in order.
fn pairs(text: &str) -> Vec<(String, Value)> {
    let chars: Vec<char> = text.chars().collect();
    let string_at = |start: usize| -> (String, usize) {
        let mut out = String::new();
        let mut at = start + 1;
        while let Some(&c) = chars.get(at) {
            match c {
                '\\' => {
                    out.push(c);
                    if let Some(&next) = chars.get(at + 1) {
                        out.push(next);
                    }
                    at += 2;
                }
                '"' => return (out, at + 1),
                _ => {
                    out.push(c);
                    at += 1;
                }
            }
        }
        (out, at)
    };
    let skip_space = |mut at: usize| {
        while chars.get(at).is_some_and(|c| c.is_whitespace()) {
            at += 1;
        }
        at
    };
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(&c) = chars.get(at) {
        if c != '"' {
            at += 1;
            continue;
        }
        let (key, after) = string_at(at);
        let colon = skip_space(after);
        if chars.get(colon) != Some(&':') {
            at = after;
            continue;
        }
        let start = skip_space(colon + 1);
        let value = match chars.get(start) {
            Some('"') => Value::Str(string_at(start).0),
            Some('{' | '[' | '…') | None => Value::Other,
            Some(_) => Value::Scalar(
                chars[start..]
                    .iter()
                    .take_while(|c| !(matches!(c, ',' | '}' | ']' | '…') || c.is_whitespace()))
                    .collect(),
            ),
        };
        out.push((key, value));
        // A string value is read again as a string not followed by `:`, so skipped.
        at = start;
    }
    out
}

/// Keys whose values differ from run to run: only that they are there is checked.
fn varies(key: &str) -> bool {
    key.ends_with("At")
        || key.ends_with("_at")
        || matches!(key, "at" | "duration_ms" | "workdir" | "cwd")
}

/// Whether `text` is `pattern` with each `…` standing for anything.
fn matches_elided(pattern: &str, text: &str) -> bool {
    let pieces: Vec<&str> = pattern.split('…').collect();
    let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else {
        return pattern == text;
    };
    if pieces.len() == 1 {
        return pattern == text;
    }
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    for piece in &pieces[1..pieces.len() - 1] {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// What differs between a curl's answer the page shows and the real one (status and body),
/// one line each; empty when the real answer has the shape shown. The status line is where
/// curl's write-out prints it: after the body, the last line.
fn mismatches(shown: &str, status: Option<u16>, body: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut expected_status = None;
    let mut shown_body = Vec::new();
    let lines: Vec<&str> = shown.lines().collect();
    for (at, line) in lines.iter().enumerate() {
        match line
            .strip_prefix("HTTP ")
            .and_then(|code| code.trim().parse::<u16>().ok())
        {
            Some(code) => {
                if at + 1 != lines.len() {
                    problems.push(format!(
                        "`HTTP {code}` is shown above the body: curl prints it below, last"
                    ));
                }
                expected_status = Some(code);
            }
            None => shown_body.push(*line),
        }
    }
    let shown_body = shown_body.join("\n");
    // A curl's write-out ends its output.
    match (expected_status, status) {
        (Some(expected), Some(real)) if expected != real => {
            problems.push(format!("status {real}, the page shows {expected}"));
        }
        (None, Some(real)) if !(200..300).contains(&real) => {
            problems.push(format!("status {real}, the page shows success"));
        }
        (_, None) => problems.push("no `HTTP nnn` line ends the output".to_owned()),
        _ => {}
    }
    let shown_body = shown_body.trim();
    if shown_body.is_empty() {
        return problems;
    }
    if !(shown_body.starts_with('{') || shown_body.starts_with('[')) {
        if !matches_elided(shown_body, body.trim_end()) {
            problems.push("the text differs from the page's".to_owned());
        }
        return problems;
    }
    let is_json = serde_json::from_str::<serde_json::Value>(body).is_ok()
        || body
            .lines()
            .filter(|line| !line.trim().is_empty())
            .all(|line| serde_json::from_str::<serde_json::Value>(line).is_ok());
    if !is_json || body.trim().is_empty() {
        problems.push("the answer is not JSON".to_owned());
        return problems;
    }
    let real = pairs(body);
    for (key, value) in pairs(shown_body) {
        let candidates: Vec<&Value> = real
            .iter()
            .filter(|(real_key, _)| *real_key == key)
            .map(|(_, value)| value)
            .collect();
        if candidates.is_empty() {
            problems.push(format!("no {key:?} in the answer"));
            continue;
        }
        if varies(&key) {
            continue;
        }
        let found = match &value {
            Value::Str(pattern) => candidates.iter().any(
                |candidate| matches!(candidate, Value::Str(text) if matches_elided(pattern, text)),
            ),
            Value::Scalar(_) => candidates.contains(&&value),
            Value::Other => true,
        };
        if !found {
            problems.push(format!(
                "{key:?} is {}, the page shows {}",
                candidates
                    .iter()
                    .map(|value| show(value))
                    .collect::<Vec<_>>()
                    .join(" or "),
                show(&value)
            ));
        }
    }
    problems
}

fn show(value: &Value) -> String {
    match value {
        Value::Str(text) => format!("\"{text}\""),
        Value::Scalar(text) => text.clone(),
        Value::Other => "an object, an array or elided".to_owned(),
    }
}

/// The running walk-through: the server, the directory commands run in, the shell
/// variables set so far, the ids learned so far.
struct Run {
    address: String,
    work: std::path::PathBuf,
    home: std::path::PathBuf,
    variables: BTreeMap<String, String>,
    ids: Ids,
}

/// What a command printed and how it ended.
struct Output {
    stdout: String,
    stderr: String,
    success: bool,
}

impl Run {
    /// Runs one command and holds its answer to the page's.
    fn step(&mut self, step: &Step) {
        if let Some(token) = id_tokens(&step.command)
            .into_iter()
            .find(|token| self.ids.resolve(token).is_none())
        {
            panic!(
                "{PAGE} line {}: {} is used before an answer gives it\n$ {}",
                step.line, token.stem, step.command
            );
        }
        let command = self
            .ids
            .substitute(&step.command.replace(PAGE_ADDRESS, &self.address));
        if let Some(name) = assignment(&command) {
            assert!(
                step.shown.is_empty(),
                "{PAGE} line {}: an assignment answers nothing, yet the page shows\n{}",
                step.line,
                step.shown
            );
            let output = self.shell(&format!("{command}\nprintf %s \"${name}\""));
            assert!(
                output.success,
                "{PAGE} line {}: $ {}\nfailed: {}",
                step.line, step.command, output.stderr
            );
            self.variables.insert(name.to_owned(), output.stdout);
            return;
        }
        let output = self.shell(&command);
        if !command.contains("curl ") {
            // A shell line that makes the walk-through's inputs: it must succeed, and print
            // what is shown (nothing, when nothing is).
            assert!(
                output.success && output.stdout.trim_end() == step.shown,
                "{PAGE} line {}: $ {}\nprinted: {}\nstderr: {}\nthe page shows:\n{}",
                step.line,
                step.command,
                output.stdout,
                output.stderr,
                step.shown
            );
            return;
        }
        let (status, body) = split_status(&output.stdout);
        let shown = step.shown.replace(PAGE_ADDRESS, &self.address);
        self.ids.learn(&shown, body);
        let shown = self.ids.substitute(&shown);
        let mut problems = mismatches(&shown, status, body);
        if !output.success {
            problems.insert(0, "the command failed".to_owned());
        }
        assert!(
            problems.is_empty(),
            "{PAGE} line {line}: the answer is not what the page shows\n\
             $ {shown_command}\n\
             ran as:\n$ {command}\n\
             the page shows:\n{expected}\n\
             the answer:\n{stdout}{stderr}\n\
             what differs:\n- {problems}",
            line = step.line,
            shown_command = step.command,
            expected = step.shown,
            stdout = output.stdout,
            stderr = if output.stderr.is_empty() {
                String::new()
            } else {
                format!("stderr: {}", output.stderr)
            },
            problems = problems.join("\n- "),
        );
    }

    /// `sh -c script` in the working directory with the variables set so far, bounded by
    /// [`COMMAND_LIMIT`] (then it and everything it started are killed).
    fn shell(&self, script: &str) -> Output {
        let outputs = tempfile::tempdir().expect("temp dir");
        let (stdout_path, stderr_path) = (outputs.path().join("out"), outputs.path().join("err"));
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(&self.work)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("CURL_HOME", &self.home)
            .envs(&self.variables)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
            .process_group(0)
            .spawn()
            .expect("spawn sh");
        let deadline = Instant::now() + COMMAND_LIMIT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let read = |path: &Path| {
            String::from_utf8_lossy(&std::fs::read(path).expect("output")).into_owned()
        };
        let mut stderr = read(&stderr_path);
        if status.is_none() {
            stderr.push_str("(killed: it ran past the limit of one command)");
        }
        Output {
            stdout: read(&stdout_path),
            stderr,
            success: status.is_some_and(|status| status.success()),
        }
    }
}

/// The variable a command sets, when it is a shell assignment (`ID=henv_…`).
fn assignment(command: &str) -> Option<&str> {
    let (name, _) = command.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    ((first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_'))
    .then_some(name)
}

/// The status curl's `write-out` added at the end of the output, and the answer before it.
fn split_status(stdout: &str) -> (Option<u16>, &str) {
    let Some(trimmed) = stdout.strip_suffix('\n') else {
        return (None, stdout);
    };
    let Some((body, last)) = trimmed.rsplit_once('\n') else {
        return (None, stdout);
    };
    match last
        .strip_prefix("HTTP ")
        .and_then(|code| code.parse::<u16>().ok())
    {
        Some(code) => (Some(code), body),
        None => (None, stdout),
    }
}

// The checks above must be able to fail: each kind of difference is caught.

#[test]
fn walkthrough_checks_catch_each_kind_of_difference() {
    let shown = "{\"id\":\"henv_f…\",\"object\":\"environment\",\"files\":{\"count\":0},\
                 \"name\":\"Co…io\",\"createdAt\":1}\nHTTP 201";
    let real = "{\"id\":\"henv_ff\",\"object\":\"environment\",\"files\":{\"count\":0},\
                \"name\":\"Content Studio\",\"createdAt\":99}";
    assert_eq!(mismatches(shown, Some(201), real), Vec::<String>::new());
    assert_eq!(mismatches(shown, Some(200), real).len(), 1, "status");
    let above = "HTTP 201\n{\"id\":\"henv_f…\"}";
    assert_eq!(
        mismatches(above, Some(201), real).len(),
        1,
        "the status line above the body, where curl never prints it"
    );
    assert_eq!(
        mismatches(&shown.replace("environment", "harness"), Some(201), real).len(),
        1,
        "object"
    );
    assert_eq!(
        mismatches(
            shown,
            Some(201),
            &real.replace("\"count\":0", "\"count\":1")
        )
        .len(),
        1,
        "a number"
    );
    assert_eq!(
        mismatches(shown, Some(201), &real.replace("\"files\"", "\"tree\"")).len(),
        1,
        "a key"
    );
    assert_eq!(
        mismatches(shown, Some(201), &real.replace("Content", "Teaser")).len(),
        1,
        "a cut string"
    );
    assert_eq!(mismatches(shown, Some(201), "not json").len(), 1, "JSON");
    assert_eq!(mismatches("", None, "").len(), 1, "no write-out");
    assert_eq!(
        mismatches("{…}", Some(404), "{}").len(),
        1,
        "no status shown: 2xx"
    );
    assert_eq!(
        mismatches("print(\"hi\")", Some(200), "print(\"hi\")\n").len(),
        0
    );
    assert_eq!(
        mismatches("print(\"hi\")", Some(200), "print(\"ho\")\n").len(),
        1
    );
    assert_eq!(
        mismatches("==> a …\n==> b\n…", Some(200), "==> a 1 s\n==> b\nc\n").len(),
        0
    );
    assert_eq!(
        mismatches("==> a …\n==> b\n…", Some(200), "==> a 1 s\n==> c\n").len(),
        1
    );
}

#[test]
fn walkthrough_commands_and_answers_are_read_as_the_shell_reads_them() {
    let section = "```console\n\
                   $ curl -s x \\\n    -d '{\"a\":\n  1}'   # the caller's\n\
                   {\"b\":2}   # comment\n\
                   HTTP 201\n\n\
                   $ ID=henv_12\n\
                   ```\n";
    let parsed = steps(section, 10);
    assert_eq!(parsed.len(), 2, "{parsed:?}");
    assert_eq!((parsed[0].line, parsed[1].line), (12, 18));
    assert_eq!(
        parsed[0].command,
        "curl -s x \\\n    -d '{\"a\":\n  1}'   # the caller's"
    );
    assert_eq!(parsed[0].shown, "{\"b\":2}\nHTTP 201");
    assert_eq!(parsed[1].command, "ID=henv_12");
    assert_eq!(assignment(&parsed[1].command), Some("ID"));
    assert_eq!(assignment("curl -d a=b"), None);
    assert_eq!(
        split_status("{}\nHTTP 404\n"),
        (Some(404), "{}"),
        "write-out's line"
    );
}

#[test]
fn walkthrough_ids_stand_for_the_real_ones_once_an_answer_gives_them() {
    let mut ids = Ids::default();
    ids.learn(
        "{\"id\":\"sess_5b0c…\",\"environment\":{\"id\":\"henv_3690…\"}}",
        "{\"id\":\"sess_aa\",\"environment\":{\"id\":\"henv_bb\"}}",
    );
    assert_eq!(ids.substitute("x/sess_5b0c…/exec"), "x/sess_aa/exec");
    assert_eq!(
        ids.substitute("henv_369018f9 henv_3690…"),
        "henv_bb henv_bb"
    );
    // An id already known is not learned again from a later answer.
    ids.learn("{\"id\":\"henv_369018f9\"}", "{\"id\":\"henv_cc\"}");
    assert_eq!(ids.substitute("henv_369018f9"), "henv_bb");
    ids.learn("{\"id\":\"chrn_8c…\"}", "{\"id\":\"chrn_dd\"}");
    assert_eq!(ids.substitute("chrn_8c0d2f"), "chrn_dd", "whole after cut");
    assert_eq!(
        ids.substitute("task_… plinth_novo_9f…"),
        "task_… plinth_novo_9f…"
    );
}
