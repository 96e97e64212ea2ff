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

/// Runs one client command and answers the process's exit status.
pub async fn run(command: Command) -> ExitCode {
    let format = output_format(&command);
    match dispatch(command).await {
        Ok(code) => code,
        Err(error) => report(&error, format),
    }
}

/// Prints why a command failed and answers its exit status.
fn report(error: &anyhow::Error, format: OutputFormat) -> ExitCode {
    if let Some(usage) = error.downcast_ref::<Usage>() {
        eprintln!("plinth: {usage}");
        return ExitCode::from(2);
    }
    if let Some(failure) = error.downcast_ref::<ApiFailure>() {
        if format == OutputFormat::Json {
            println!("{}", failure.body);
        }
        eprintln!("plinth: {failure}");
        return ExitCode::FAILURE;
    }
    eprintln!("plinth: {error:#}");
    ExitCode::FAILURE
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
            clap_complete::generate(
                args.shell,
                &mut Cli::command(),
                "plinth",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command())
                .render(&mut std::io::stdout())
                .map_err(|error| anyhow::anyhow!("cannot write the manual page: {error}"))?;
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(Usage("not a client command".to_owned()).into()),
    }
}

/// The `--output` a command was given (text for those without one).
fn output_format(command: &Command) -> OutputFormat {
    use crate::client_args::{EnvCommand, SessionCommand};
    let output = match command {
        Command::Login(args) => args.output,
        Command::Env(EnvCommand::Create(args)) => args.output,
        Command::Env(EnvCommand::List(output)) => *output,
        Command::Env(EnvCommand::Show(args) | EnvCommand::Rm(args)) => args.output,
        Command::Push(args) => args.output,
        Command::Import(args) => args.output,
        Command::Build(args) => args.output,
        Command::Versions(args) => args.output,
        Command::Activate(args) => args.output,
        Command::Session(SessionCommand::New(args)) => args.output,
        Command::Session(SessionCommand::End(args)) => args.output,
        Command::Session(SessionCommand::List(args)) => args.output,
        Command::Exec(args) => args.output,
        Command::Cp(args) => args.output,
        _ => return OutputFormat::Text,
    };
    output.output
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

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
