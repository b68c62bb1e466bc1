//! `enforcer doctor`: the node checked against what the enforcer expects (kernel features,
//! capabilities, pod cgroups, OOM scores, leftover cgroups), each finding with its fix.

use crate::{config::ConfigArgs, node_report::doctor};

/// `enforcer doctor`: the configuration the daemon runs with (its file and flags).
#[derive(Clone, Debug, clap::Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `enforcer doctor`: exit 0 when clean, 1 with findings, 2 on a bad configuration.
#[must_use]
pub fn doctor_main(args: &DoctorArgs) -> std::process::ExitCode {
    let config = match crate::config::load(&args.config) {
        Ok(l) => l.config,
        Err(e) => {
            eprintln!("enforcer: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let report = doctor(&config);
    // Where the crossing check attaches, said whether or not it is a finding.
    if !report.crossing.is_empty() {
        eprintln!("crossing check: {}", report.crossing);
    }
    let findings = report.findings;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&findings).unwrap_or_default()
        );
    } else if findings.is_empty() {
        println!("No findings: the node is as the enforcer expects.");
    } else {
        for f in &findings {
            println!("[{}] {}\n    fix: {}", f.check, f.problem, f.fix);
        }
    }
    if findings.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
