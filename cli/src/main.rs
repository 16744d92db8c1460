//! `tapyard`: the command line parsed ([`tapyard_cli::args`]) and handed to the library
//! ([`tapyard_cli`]), which does the work.

use std::process::ExitCode;

use tapyard_cli::args::{self, Cmd};
use tapyard_cli::commands::{self, Fail};
use tapyard_cli::{config, supervisor};

fn main() -> ExitCode {
    let cli = match args::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(args::Stop::Print(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(args::Stop::Usage(text)) => {
            eprint!("{text}");
            return ExitCode::from(2);
        }
        Err(args::Stop::Bad(line)) => {
            eprintln!("tapyard: {line}");
            return ExitCode::from(2);
        }
    };
    commands::init_logger();
    let r = match cli.cmd {
        Cmd::Check { config } => commands::check(&config),
        Cmd::Run {
            config,
            socket,
            metrics,
            takeover,
        } => supervisor::run(config, socket, metrics, takeover).map_err(|e| Fail(2, e.to_string())),
        Cmd::Show { what, json, client } => commands::show(what, json, &client),
        Cmd::Status { json, client } => commands::status(json, &client),
        Cmd::Reload { client } => commands::reload(&client),
        Cmd::Cleanup { config, socket } => commands::cleanup(&config, socket),
        Cmd::Port { op } => commands::port(op),
        Cmd::Capture {
            port,
            write,
            count,
            client,
        } => commands::capture(&port, &write, count, &client),
        Cmd::Keys => {
            print!("{}", config::schema::reference());
            Ok(())
        }
        Cmd::Version => {
            println!("tapyard {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(code, msg)) => {
            eprintln!("tapyard: {msg}");
            ExitCode::from(code)
        }
    }
}
