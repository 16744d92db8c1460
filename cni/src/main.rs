//! The `tapyard-cni` executable: reads the `CNI_*` environment and stdin, prints a result or a
//! CNI error object on stdout, and exits non-zero on error.

use std::io::Read;
use tapyard_cni::config::{peek_version, SUPPORTED_VERSIONS};
use tapyard_cni::error::{CniError, IO_FAILURE};
use tapyard_cni::{args::CniArgs, plugin};

fn main() {
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin).map_err(|e| {
        CniError::new(IO_FAILURE, "cannot read the network configuration").with_details(e)
    });
    let outcome = read
        .and_then(|_| CniArgs::parse(|name| std::env::var(name).ok()))
        .and_then(|args| plugin::run(&args, &stdin));
    match outcome {
        Ok(Some(out)) => println!("{out}"),
        Ok(None) => {}
        Err(e) => {
            let version = peek_version(&stdin)
                .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
                .unwrap_or_else(|| "1.0.0".into());
            println!("{}", e.to_json(&version));
            eprintln!("tapyard-cni: {e}");
            std::process::exit(1);
        }
    }
}
