//! `enforcer evictions`: every kill recorded on this node (evictions and kernel OOM kills),
//! a table or JSON.

use std::path::PathBuf;

use super::{
    print,
    why::{Output, load, ms_since},
};
use crate::{
    kills::{KillKind, KillRecord},
    state_log::{self, cell},
};

/// `enforcer evictions`.
#[derive(Clone, Debug, clap::Args)]
pub struct EvictionsArgs {
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// The daemon's state directory.
    #[arg(long, default_value = crate::pods::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

/// `enforcer evictions`' table.
#[must_use]
pub fn render_list(records: &[KillRecord]) -> String {
    if records.is_empty() {
        return "No kills recorded.".to_owned();
    }
    let rows: Vec<[String; 7]> = records
        .iter()
        .map(|r| {
            let base = r.chain().first().map(|c| c.1);
            let to = |t: Option<u64>| match (base, t) {
                (Some(b), Some(t)) => ms_since(b, t),
                _ => "-".to_owned(),
            };
            [
                r.at.clone(),
                match r.kind {
                    KillKind::Eviction => "eviction".to_owned(),
                    KillKind::KernelOomKill => "kernel OOM".to_owned(),
                },
                cell(&format!("{}/{}", r.namespace, r.name)),
                r.qos.clone(),
                if r.threshold.is_empty() {
                    "-".to_owned()
                } else {
                    r.threshold.clone()
                },
                to(r.sigkill_ns),
                to(r.released_ns),
            ]
        })
        .collect();
    state_log::table(
        [
            "TIME",
            "KIND",
            "POD",
            "QOS",
            "THRESHOLD",
            "TO SIGKILL",
            "TO RELEASED",
        ],
        &rows,
    )
}

/// Runs `enforcer evictions`.
#[must_use]
pub fn evictions_main(args: &EvictionsArgs) -> std::process::ExitCode {
    let records = match load(&args.state_dir) {
        Ok(r) => r,
        Err(code) => return code,
    };
    match args.output {
        Output::Json => print(&serde_json::to_string_pretty(&records).unwrap_or_default()),
        Output::Text => print(&render_list(&records)),
    }
}
