//! The commands beside `run`, one file each, named after its subcommand.
//!
//! The decision core from the command line: `enforcer simulate`, `enforcer explain`,
//! `enforcer config check` (formats in `docs/simulate.md`). No kernel, cgroup or runtime
//! access; the functions return the lines to print, and main.rs prints them (exit 2 on
//! [`CliError`]).
//!
//! The operator's commands, reading what the daemon keeps in its state directory (and, for
//! `doctor`, the node itself): `enforcer pods`, `events`, `why`, `evictions`, `status` and
//! `doctor`; each `*_main` prints and returns the exit code.

pub mod config_check;
pub mod doctor;
pub mod events;
pub mod evictions;
pub mod explain;
pub mod pods;
pub mod simulate;
pub mod status;
pub mod why;

use std::path::{Path, PathBuf};

pub use config_check::config_check;
pub use explain::{ExplainArgs, explain};
pub use simulate::simulate;

use crate::config::ConfigError;

/// Prints a command's text on standard output: exit 0, or 1 when standard output is gone.
pub(crate) fn print(text: &str) -> std::process::ExitCode {
    use std::io::Write as _;
    if writeln!(std::io::stdout().lock(), "{text}").is_err() {
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}

/// Exit 2 for a state directory that cannot be read, saying so.
pub(crate) fn unreadable(e: impl std::fmt::Display) -> std::process::ExitCode {
    eprintln!("enforcer: {e} (is the daemon running with this --state-dir?)");
    std::process::ExitCode::from(2)
}

/// A line store of the state directory as read (`(records, unreadable lines)`): the records,
/// having said how many lines of `store` were skipped; exit 2 when it cannot be read.
pub(crate) fn loaded<T, E: std::fmt::Display>(
    read: Result<(Vec<T>, usize), E>,
    store: &Path,
) -> Result<Vec<T>, std::process::ExitCode> {
    match read {
        Ok((records, bad)) => {
            if bad > 0 {
                eprintln!(
                    "enforcer: skipped {bad} unreadable line(s) in {}",
                    store.display()
                );
            }
            Ok(records)
        }
        Err(e) => Err(unreadable(e)),
    }
}

/// An invalid input: it names the file, the place in it, and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The file cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Something in the file is wrong.
    #[error("{path}: {place}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Where (`steps[3].observe`).
        place: String,
        /// What.
        message: String,
    },
    /// The configuration is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl CliError {
    fn invalid(path: &Path, place: impl Into<String>, message: impl ToString) -> Self {
        Self::Invalid {
            path: path.to_owned(),
            place: place.into(),
            message: message.to_string(),
        }
    }
}

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The place of a YAML error: the YAML crate's own path when its message starts with one (it
/// names map keys that `serde_path_to_error` shows as `?`), else `serde_path_to_error`'s, else
/// the line and column.
fn yaml_error(path: &Path, e: serde_path_to_error::Error<serde_yaml_ng::Error>) -> CliError {
    let place = e.path().to_string();
    let inner = e.into_inner();
    let message = inner.to_string();
    if let Some((p, rest)) = message.split_once(": ")
        && !p.contains(' ')
        && p != "."
    {
        return CliError::invalid(path, p, rest);
    }
    let place = place.trim_end_matches(".?").to_owned();
    let place = if place == "." || place == "?" {
        inner.location().map_or(place, |l| {
            format!("line {} column {}", l.line(), l.column())
        })
    } else {
        place
    };
    CliError::invalid(path, place, message)
}
