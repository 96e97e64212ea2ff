//! `plinth`: see `plinth --help`.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = plinth::args::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("plinth: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    if cli.command.is_client() {
        return runtime.block_on(plinth::client::run(cli.command, cli.url));
    }
    match runtime.block_on(plinth::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("plinth: {error:#}");
            ExitCode::FAILURE
        }
    }
}
