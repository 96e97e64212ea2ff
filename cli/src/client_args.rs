//! The client commands' flags. They live apart from the services' flags so that nothing a
//! person types to talk to a server can be mistaken for a service setting: the client reads
//! only `PLINTH_URL` and `PLINTH_TOKEN`, which no service reads.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

/// How a command prints what the server answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Tables and lines for people.
    #[default]
    Text,
    /// The API's own JSON, for scripts.
    Json,
}

/// Where a client command that prints an answer gets the global `--output` (`-o`), which
/// parsing hands it (see `crate::args`).
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct OutputArgs {
    /// `text` for people, `json` for the API's own answers (one JSON document per line when a
    /// command streams).
    #[arg(skip)]
    pub output: OutputFormat,
}

/// `plinth login`.
#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The server's REST URL; the saved one (or `http://127.0.0.1:8080`) when absent.
    pub url: Option<String>,
    /// Read the token from standard input (one line) instead of prompting. There is no flag
    /// that takes the token itself: it would land in the shell's history.
    #[arg(long)]
    pub token_stdin: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth env …`.
#[derive(Debug, Subcommand)]
pub enum EnvCommand {
    /// Create an environment; its slug (and mount path) comes from its name.
    Create(EnvCreateArgs),
    /// List the environments of your scope.
    List(OutputArgs),
    /// Show one environment, with its versions.
    Show(EnvArgs),
    /// Delete an environment and every version of it, once you confirm (or with --yes).
    Rm(EnvRmArgs),
}

/// `plinth env create`.
#[derive(Debug, Args)]
pub struct EnvCreateArgs {
    /// Its name, e.g. "Content Studio" (slug `content-studio`).
    pub name: String,
    /// How the project is run, for agents, e.g. `python3 run.py --episode <id>`.
    #[arg(long)]
    pub entry: Option<String>,
    /// What the project is for.
    #[arg(long)]
    pub description: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A command that names one environment.
#[derive(Debug, Args)]
pub struct EnvArgs {
    /// The environment: its slug (`content-studio`) or its id (`henv_…`).
    pub env: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth env rm`.
#[derive(Debug, Args)]
pub struct EnvRmArgs {
    /// The environment: its slug (`content-studio`) or its id (`henv_…`).
    pub env: String,
    /// Delete without asking. Without a terminal to ask on, `rm` deletes nothing unless given
    /// this.
    #[arg(long, short = 'y')]
    pub yes: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The environment: its slug or its id.
    pub env: String,
    /// The project directory. Left out: what its `.gitignore`, `.ignore` and `.plinthignore`
    /// files name (gitignore syntax), `.git`, and by default the directories a build makes
    /// again from the manifests (`.venv`, `venv`, `node_modules`, `__pycache__`). In a git
    /// checkout, its commit, `git describe` and whether it has uncommitted changes are sent
    /// with it, so a build gives setuptools-scm and hatch-vcs the version they would compute
    /// here.
    pub dir: PathBuf,
    /// Send `.venv`, `venv`, `node_modules` and `__pycache__` too (ignore files still apply).
    #[arg(long)]
    pub no_default_ignores: bool,
    /// Land the files over the environment's source instead of replacing it (files the
    /// directory no longer has are then kept).
    #[arg(long)]
    pub keep_existing: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The environment: its slug or its id.
    pub env: String,
    /// The git repository's URL.
    #[arg(long)]
    pub git: String,
    /// A branch, tag or commit; the repository's default branch when absent.
    #[arg(long = "ref", value_name = "REF")]
    pub reference: Option<String>,
    /// Clear the environment's source first, so it equals the repository (as `push` does).
    /// Without it the repository's files land over the source, and files only the source has
    /// are kept.
    #[arg(long)]
    pub replace: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth build`: build the next version, or (`build logs`) read a build's log.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BuildArgs {
    #[command(subcommand)]
    pub command: Option<BuildCommand>,
    /// The environment: its slug or its id.
    #[arg(required = true)]
    pub env: Option<String>,
    /// Print the build's log as it is written and wait for the build to end; exits 0 when
    /// the version is ready, 1 when it failed.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Reuse nothing from earlier builds.
    #[arg(long)]
    pub clean: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth build …`.
#[derive(Debug, Subcommand)]
pub enum BuildCommand {
    /// Print a build's log (the latest build's by default); --follow prints a running build's
    /// log as it is written until the build ends. Exits 1 when the build failed.
    Logs(BuildLogsArgs),
}

/// `plinth build logs`.
#[derive(Debug, Args)]
pub struct BuildLogsArgs {
    /// The environment: its slug or its id.
    pub env: String,
    /// The build's version; the latest build when absent.
    pub version: Option<u32>,
    /// Keep printing the log as it is written until the build ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth activate`.
#[derive(Debug, Args)]
pub struct ActivateArgs {
    /// The environment: its slug or its id.
    pub env: String,
    /// The version to make active (a ready one).
    pub version: u32,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth session …`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Start a session on an environment's active version; prints its id.
    New(EnvArgs),
    /// End a session: its processes are killed and its working directory removed.
    End(SessionArgs),
    /// List sessions, oldest first (every page).
    List(SessionListArgs),
}

/// `plinth session list`.
#[derive(Debug, Args)]
pub struct SessionListArgs {
    /// Only the sessions of this environment (slug or id).
    #[arg(long)]
    pub env: Option<String>,
    /// Only the sessions in this state.
    #[arg(long, value_parser = ["active", "ended"])]
    pub state: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A command that names one session.
#[derive(Debug, Args)]
pub struct SessionArgs {
    /// The session's id (`sess_…`).
    pub session: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// A session's id (`sess_…`), or an environment (slug or id) to run in a new session that
    /// is ended afterwards.
    pub target: String,
    /// The command and its arguments, passed exactly: each is quoted for the remote shell, so
    /// nothing is expanded, here or there.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
    /// Seconds the command may run (the server's default when absent).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Do not send standard input. Without it, standard input that is not a terminal (a pipe,
    /// a file) is read to its end and is what the command reads (at most 700 KiB).
    #[arg(long, short = 'n')]
    pub no_stdin: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth shell`.
#[derive(Debug, Args)]
pub struct ShellArgs {
    /// A session's id (`sess_…`), or an environment (slug or id) to open a new session on,
    /// ended when the shell exits.
    pub target: String,
    /// A command to run on the terminal instead of an interactive shell; its arguments are
    /// quoted for the remote shell, as `exec` quotes them.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `plinth cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// `SESSION:path` (relative to the session's working directory) or a local path (`-`:
    /// standard input).
    pub from: String,
    /// `SESSION:path` or a local path (a directory: the file keeps its name; `-`: standard
    /// output).
    pub to: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `plinth completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    pub shell: clap_complete::Shell,
}
