//! The `plinth` client: the commands a person types to talk to a running server (`login`,
//! `env`, `push`, `build`, `exec`, `cp`, …), over the same REST API any other client uses. It
//! owns nothing on the server; it turns arguments into requests and answers into lines.
//!
//! Exit statuses: 0 on success, 1 when the server refused (its code and message are printed)
//! or could not be reached, 2 for a command line that cannot work (clap's own usage errors
//! are 2 too), and for `exec` and `shell` the remote command's own status.

pub mod api;
pub mod archive;

mod checkout;
mod environments;
mod login;
mod output;
pub mod profile;
mod sessions;
pub mod shell;
mod terminal;

use std::fmt;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::args::{Cli, Command};
use crate::client_args::OutputFormat;
use api::ApiFailure;

/// A command line that cannot work as given (exit status 2), as opposed to a server that
/// refused it (1).
#[derive(Debug)]
pub struct Usage(pub String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Runs one client command and answers the process's exit status. `url` (`--url`) names the
/// server over `PLINTH_URL` and the saved one.
pub async fn run(mut command: Command, url: Option<String>) -> ExitCode {
    output::quiet_broken_pipes();
    if let Some(url) = url {
        api::use_url(url);
    }
    let format = command
        .output_args_mut()
        .map_or(OutputFormat::Text, |output| output.output);
    match dispatch(command).await {
        Ok(code) => code,
        Err(error) => report(&error, format),
    }
}

/// Prints why a command failed and answers its exit status.
fn report(error: &anyhow::Error, format: OutputFormat) -> ExitCode {
    if output::is_broken_pipe(error) {
        // The reader went away (`| head`): nobody is left to tell.
        return ExitCode::from(output::BROKEN_PIPE_STATUS);
    }
    if let Some(usage) = error.downcast_ref::<Usage>() {
        eprintln!("plinth: {usage}");
        return ExitCode::from(2);
    }
    if let Some(failure) = error.downcast_ref::<ApiFailure>() {
        if format == OutputFormat::Json {
            println!("{}", failure.body);
        }
        let (message, hint) = advice(failure);
        eprintln!(
            "plinth: {message} ({}, HTTP {})",
            failure.code, failure.status
        );
        if let Some(hint) = hint {
            eprintln!("hint: {hint}");
        }
        return ExitCode::FAILURE;
    }
    eprintln!("plinth: {error:#}");
    ExitCode::FAILURE
}

/// A refusal as the command line tells it: the server's message without the REST call it
/// names as the way out (the API speaks to every client), and the command that does it here.
fn advice(failure: &ApiFailure) -> (String, Option<String>) {
    let mut message = failure.message.clone();
    for method in ["(POST /", "(GET /", "(PUT /", "(DELETE /"] {
        while let Some(start) = message.find(method) {
            let Some(length) = message[start..].find(')') else {
                break;
            };
            let end = start + length + 1;
            let start = if message[..start].ends_with(' ') {
                start - 1
            } else {
                start
            };
            message.replace_range(start..end, "");
        }
    }
    // The environment the refusal is about, when the message names it.
    let env = message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|word| word.starts_with(plinth_kit::ids::EnvironmentId::PREFIX))
        .unwrap_or("ENV")
        .to_owned();
    let hint = match failure.code.as_str() {
        "environment_not_ready" => Some(format!(
            "`plinth build {env} --follow` builds a version (`plinth versions {env}` lists \
             those there are)"
        )),
        "environment_busy" => Some(format!(
            "`plinth build logs {env} --follow` follows the build that is running"
        )),
        "environment_not_found" => Some("`plinth env list` lists your environments".to_owned()),
        "unauthenticated" => {
            Some("`plinth login URL` saves a token (or set PLINTH_TOKEN)".to_owned())
        }
        _ => None,
    };
    (message, hint)
}

async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Login(args) => login::login(args).await,
        Command::Env(command) => environments::env(command).await,
        Command::Push(args) => environments::push(args).await,
        Command::Import(args) => environments::import(args).await,
        Command::Build(args) => environments::build(args).await,
        Command::Versions(args) => environments::versions(args).await,
        Command::Activate(args) => environments::activate(args).await,
        Command::Session(command) => sessions::session(command).await,
        Command::Exec(args) => sessions::exec(args).await,
        Command::Cp(args) => sessions::cp(args).await,
        Command::Shell(args) => terminal::shell(args).await,
        Command::Completions(args) => {
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut Cli::command(), "plinth", &mut script);
            output::stdout(&script).context("cannot print the completion script")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command())
                .render(&mut page)
                .context("cannot write the manual page")?;
            output::stdout(&page).context("cannot print the manual page")?;
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(Usage("not a client command".to_owned()).into()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn refusal(code: &str, message: &str) -> ApiFailure {
        ApiFailure {
            status: 409,
            code: code.to_owned(),
            message: message.to_owned(),
            body: serde_json::Value::Null,
        }
    }

    #[test]
    fn refusals_name_commands_not_rest_calls() {
        let (message, hint) = advice(&refusal(
            "environment_not_ready",
            "environment henv_0a1b has no ready version: build it (POST \
             /v1/environments/henv_0a1b/build) and wait for the build to be ready",
        ));
        assert_eq!(
            message,
            "environment henv_0a1b has no ready version: build it and wait for the build to be \
             ready"
        );
        let hint = hint.expect("a hint");
        assert!(
            hint.starts_with("`plinth build henv_0a1b --follow`"),
            "{hint}"
        );
        let (message, hint) = advice(&refusal("quota_exceeded", "too many (GET /x"));
        assert_eq!((message.as_str(), hint), ("too many (GET /x", None));
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_keeps_the_argv_after_the_separator_as_typed() {
        let cli = Cli::try_parse_from([
            "plinth", "exec", "studio", "--", "python3", "-c", "x", "--output", "json",
        ])
        .expect("parses");
        let Command::Exec(args) = cli.command else {
            panic!("not exec");
        };
        assert_eq!(args.command, ["python3", "-c", "x", "--output", "json"]);
        assert_eq!(args.output.output, OutputFormat::Text);
    }

    #[test]
    fn shell_takes_an_optional_command_after_the_separator() {
        let parse = |argv: &[&str]| match Cli::try_parse_from(argv).map(|cli| cli.command) {
            Ok(Command::Shell(args)) => (args.target, args.command),
            other => panic!("not shell: {other:?}"),
        };
        assert_eq!(
            parse(&["plinth", "shell", "studio"]),
            ("studio".to_owned(), Vec::<String>::new())
        );
        assert_eq!(
            parse(&["plinth", "shell", "sess_1", "--", "top", "-b"]).1,
            ["top", "-b"]
        );
    }
}
