//! `local-containerd start|stop --dir DIR`: a private containerd with the local busybox image,
//! for standalone runs (`cargo xtask run`) and by hand. Development tooling, not part of the
//! daemon: see [`enforcer_tests::local`].

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use enforcer_tests::local::{LocalContainerd, LocalError};

#[derive(Parser)]
#[command(
    name = "local-containerd",
    about = "A private containerd with the local busybox image (standalone runs, `cargo xtask run`)"
)]
struct Cli {
    #[command(subcommand)]
    action: Action,
}

/// What to do with the private containerd.
#[derive(Subcommand)]
enum Action {
    /// Start containerd in DIR (its own root, state, socket), import the local busybox image,
    /// print the socket path; containerd keeps running after this command returns.
    Start {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
    /// Stop the containerd started in DIR (by its PID): remove its pods, kill its shims,
    /// unmount, and remove DIR (except the log).
    Stop {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Keep DIR's contents.
        #[arg(long)]
        keep: bool,
    },
}

fn start(dir: &std::path::Path) -> Result<(), LocalError> {
    // Dropping the handle leaves containerd running (its PID file says where).
    let cd = LocalContainerd::start(dir, None)?;
    let _ = writeln!(std::io::stdout().lock(), "{}", cd.socket().display());
    Ok(())
}

fn stop(dir: &std::path::Path, keep: bool) -> Result<(), LocalError> {
    let mut cd = LocalContainerd::attach(dir)?;
    if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        rt.block_on(cd.remove_all_pods());
    }
    if keep {
        cd.teardown();
        Ok(())
    } else {
        cd.remove(true)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.action {
        Action::Start { dir } => start(dir),
        Action::Stop { dir, keep } => stop(dir, *keep),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("local-containerd: {e}");
            ExitCode::FAILURE
        }
    }
}
