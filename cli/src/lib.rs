//! plinth: the one binary. It parses flags, resolves configuration (defaults → file →
//! environment → flags), starts telemetry, and runs one service or all of them. The services
//! themselves live in their own crates; this crate only composes them, and tests and
//! benchmarks start them through the same functions `main` uses.

pub mod args;
pub mod client;
pub mod client_args;
pub mod config;
pub mod gc;
pub mod internal;
pub mod serve;

use anyhow::Context as _;
use plinth_kit::tasks;

use crate::args::{Cli, Command};
use crate::config::Config;

/// Runs a parsed command line to completion.
pub async fn run(mut cli: Cli) -> anyhow::Result<()> {
    let (name, config, dump) = match &cli.command {
        Command::Credential(command) => return internal::credential_command(command),
        Command::Gc(args) if args.common.ready_file.is_some() => {
            anyhow::bail!("--ready-file does not apply to `plinth gc`: it listens on nothing")
        }
        Command::Node(args) if args.drain && args.common.ready_file.is_some() => {
            anyhow::bail!(
                "--ready-file does not apply to `plinth node --drain`: it listens on nothing"
            )
        }
        Command::Gc(args) => {
            let config = Config::for_gc(args)?;
            if args.common.dump_config {
                print!("{}", config.dump()?);
                return Ok(());
            }
            let _telemetry = plinth_kit::telemetry::init("plinth-gc", &config.log)?;
            return gc::command(&config, args.dry_run).await;
        }
        Command::Serve(args) => ("plinth", Config::for_serve(args)?, args.common.dump_config),
        Command::Catalog(args) => (
            "plinth-catalog",
            Config::for_catalog(args)?,
            args.common.dump_config,
        ),
        Command::Source(args) => (
            "plinth-source",
            Config::for_source(args)?,
            args.common.dump_config,
        ),
        Command::Builder(args) => (
            "plinth-builder",
            Config::for_builder(args)?,
            args.common.dump_config,
        ),
        Command::Node(args) if args.drain => {
            let config = Config::for_node(args)?;
            let _telemetry = plinth_kit::telemetry::init("plinth-node", &config.log)?;
            return serve::drain_node(&config).await;
        }
        Command::Node(args) => (
            "plinth-node",
            Config::for_node(args)?,
            args.common.dump_config,
        ),
        Command::Gateway(args) => (
            "plinth-gateway",
            Config::for_gateway(args)?,
            args.common.dump_config,
        ),
        // Client commands give exit statuses of their own (2 for usage, the command's for
        // exec): `main` sends them to `client::run`.
        _ => anyhow::bail!("a client command runs through plinth::client::run"),
    };
    if dump {
        print!("{}", config.dump()?);
        return Ok(());
    }
    let _telemetry = plinth_kit::telemetry::init(name, &config.log)?;
    let ready_file = cli
        .command
        .common_mut()
        .and_then(|common| common.ready_file.take());
    let running = match cli.command {
        Command::Serve(_) => {
            // The data directory first: a second server on it is refused before it listens.
            let locks = serve::lock_state(&config, "serve")?;
            let listen = config.gateway.listen;
            let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| {
                format!("cannot listen on {listen}; choose another address with --listen or PLINTH_LISTEN")
            })?;
            locks.listening(listener.local_addr()?);
            serve::start_all_locked(&config, listener, locks).await?
        }
        Command::Catalog(_) => serve::start_catalog(&config).await?,
        Command::Source(_) => serve::start_source(&config).await?,
        Command::Gateway(_) => serve::start_gateway(&config).await?,
        Command::Builder(_) => serve::start_builder(&config).await?,
        Command::Node(args) => serve::start_node(&config, args.admin_listen).await?,
        _ => return Ok(()),
    };
    if let Some(path) = ready_file {
        running.write_ready_file(&path)?;
    }
    tasks::cancel_on_signal(running.shutdown.clone());
    running.wait().await
}
