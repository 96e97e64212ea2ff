//! `plinth login`: checks a URL and token against the server, then saves them. The token is
//! read from standard input or typed at a prompt that does not echo; never from a flag, which
//! the shell's history and every process listing would keep.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use anyhow::Context as _;
use serde_json::json;

use super::api::{self, Api, ApiFailure};
use super::profile::{self, Profile};
use super::{Usage, output};
use crate::client_args::{LoginArgs, OutputFormat};

pub async fn login(args: LoginArgs) -> anyhow::Result<ExitCode> {
    // A broken file is what login rewrites: do not let it stop the login.
    let saved = profile::load().unwrap_or_default();
    let url = args
        .url
        .or(saved.url)
        .unwrap_or_else(|| profile::DEFAULT_URL.to_owned());
    let url = api::parse_url(&url)?.to_string();
    let token = if args.token_stdin {
        read_line(&mut std::io::stdin().lock())?
    } else if std::io::stdin().is_terminal() {
        prompt(&format!(
            "Token for {url} (empty for a server without tokens): "
        ))?
    } else {
        return Err(Usage(
            "standard input is not a terminal, so there is no prompt for the token; pass \
             --token-stdin to read it from standard input"
                .to_owned(),
        )
        .into());
    };
    let profile = Profile {
        url: Some(url.clone()),
        token: (!token.is_empty()).then_some(token),
    };
    // Prove the pair works before saving it: a typo found now is not found by the next command.
    let api = Api::new(&profile)?;
    match api.get(["v1", "environments"]).await {
        Ok(_) => {}
        Err(error) => match error.downcast_ref::<ApiFailure>() {
            Some(failure) if failure.status == 401 => {
                anyhow::bail!("{failure}; nothing was saved: check the token and log in again")
            }
            // Environments switched off answer 404; the token was still accepted.
            Some(_) => {}
            None => return Err(error.context("nothing was saved")),
        },
    }
    let path = profile::save(&profile)?;
    if args.output.output == OutputFormat::Json {
        output::json(&json!({
            "url": url,
            "token": profile.token.is_some(),
            "path": path,
        }));
    } else {
        println!(
            "logged in to {url}; saved in {} (mode 0600)",
            path.display()
        );
        for variable in [profile::URL_VARIABLE, profile::TOKEN_VARIABLE] {
            if std::env::var_os(variable).is_some() {
                eprintln!("note: {variable} is set and overrides the saved setting");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One line without its line ending.
fn read_line(input: &mut impl std::io::BufRead) -> anyhow::Result<String> {
    let mut line = String::new();
    input
        .read_line(&mut line)
        .context("cannot read the token from standard input")?;
    Ok(line.trim_end_matches(['\r', '\n']).trim().to_owned())
}

/// Asks on the terminal with echo off, and puts the terminal back as it was (also when the
/// read fails).
fn prompt(question: &str) -> anyhow::Result<String> {
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    let stdin = std::io::stdin();
    let before = tcgetattr(&stdin).context("cannot read the terminal's settings")?;
    let mut quiet = before.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    // Echo goes off before the question is shown, so nothing typed after it is echoed.
    tcsetattr(&stdin, OptionalActions::Flush, &quiet)
        .context("cannot turn the terminal's echo off")?;
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    let line = read_line(&mut stdin.lock());
    let restored = tcsetattr(&stdin, OptionalActions::Now, &before);
    eprintln!();
    restored.context("cannot restore the terminal's settings")?;
    line
}
