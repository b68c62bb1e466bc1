//! `enforcer status`: one screen for an operator (node conditions, each threshold with its
//! observation and margin, the signal sources with their delays, the last kills, pods by QoS
//! class), from the state directory.

use std::{collections::BTreeMap, path::PathBuf};

use crate::{
    node_report::{Report, read},
    quantity::{Format, Quantity},
    state_log::{cell, table},
};

fn amount(signal: &str, v: i64) -> String {
    if signal.contains("inodes") || signal.starts_with("pid") {
        v.to_string()
    } else {
        let q = Quantity::from_int(v.abs(), Format::BinarySI).to_string();
        if v < 0 { format!("-{q}") } else { q }
    }
}

fn us(v: Option<u64>) -> String {
    #[expect(clippy::cast_precision_loss, reason = "a printed figure")]
    v.map_or_else(
        || "-".to_owned(),
        |v| format!("{:.3} ms", v as f64 / 1000.0),
    )
}

/// `enforcer status`.
#[derive(Clone, Debug, clap::Args)]
pub struct StatusArgs {
    /// The daemon's state directory.
    #[arg(long, default_value = crate::pods::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

/// The screen of `enforcer status` (`now_ns`: wall clock, for ages).
#[must_use]
pub fn render_status(
    pods: Option<&crate::status_manager::StatusFile>,
    report: Option<&Report>,
    kills: &[crate::kills::KillRecord],
    now_ns: i64,
) -> String {
    let mut out = Vec::new();
    let node_conditions = pods.map_or_else(Vec::new, |p| {
        p.node
            .conditions
            .iter()
            .map(|c| format!("{} {}", c.kind, c.status))
            .collect()
    });
    out.push(format!(
        "Conditions:  {}",
        if node_conditions.is_empty() {
            "(none reported)".to_owned()
        } else {
            node_conditions.join(", ")
        }
    ));
    match report {
        Some(r) => {
            let age = (now_ns - r.updated_ns).max(0) / 1_000_000_000;
            out.push(format!(
                "Thresholds (the eviction manager's last step, {age}s ago):"
            ));
            let rows: Vec<[String; 6]> = r
                .thresholds
                .iter()
                .map(|t| {
                    let observed = t.available.map_or_else(
                        || "-".to_owned(),
                        |a| {
                            format!(
                                "{} of {}",
                                amount(&t.signal, a),
                                amount(&t.signal, t.capacity.unwrap_or(0))
                            )
                        },
                    );
                    let margin = t
                        .available
                        .zip(t.threshold_value)
                        .map_or_else(|| "-".to_owned(), |(a, v)| amount(&t.signal, a - v));
                    [
                        format!("  {}", t.signal),
                        format!("<{} ({})", t.threshold, t.kind),
                        observed,
                        margin,
                        if t.met { "MET" } else { "ok" }.to_owned(),
                        String::new(),
                    ]
                })
                .collect();
            out.push(table(
                ["  SIGNAL", "THRESHOLD", "AVAILABLE", "MARGIN", "STATE", ""],
                &rows,
            ));
            out.push("Signal sources (kernel event -> daemon):".to_owned());
            let rows: Vec<[String; 4]> = r
                .sources
                .iter()
                .map(|s| {
                    [
                        format!("  {}", s.source),
                        s.signals.to_string(),
                        us(s.p50_us),
                        us(s.p99_us),
                    ]
                })
                .collect();
            if rows.is_empty() {
                out.push("  (no signal yet)".to_owned());
            } else {
                out.push(table(["  SOURCE", "SIGNALS", "P50", "P99"], &rows));
            }
        }
        None => out.push("Thresholds:  (the eviction manager has not reported yet)".to_owned()),
    }
    out.push("Last kills:".to_owned());
    if kills.is_empty() {
        out.push("  (none)".to_owned());
    } else {
        let start = kills.len().saturating_sub(5);
        for line in super::evictions::render_list(&kills[start..]).lines() {
            out.push(format!("  {line}"));
        }
    }
    let mut by_qos: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for p in pods.map_or(&[][..], |f| &f.pods[..]) {
        let e = by_qos.entry(p.qos_class.clone()).or_default();
        if matches!(
            p.phase,
            crate::status_manager::PodPhase::Succeeded | crate::status_manager::PodPhase::Failed
        ) {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
    }
    let qos: Vec<String> = by_qos
        .iter()
        .map(|(q, (live, done))| format!("{} {live} ({done} ended)", cell(q)))
        .collect();
    out.push(format!(
        "Pods:        {}",
        if qos.is_empty() {
            "none".to_owned()
        } else {
            qos.join(", ")
        }
    ));
    out.join("\n")
}

/// Runs `enforcer status`: exit 2 when the state directory cannot be read.
#[must_use]
pub fn status_main(args: &StatusArgs) -> std::process::ExitCode {
    let pods = match crate::status_manager::read(&args.state_dir) {
        Ok(p) => Some(p),
        Err(crate::status_manager::StatusError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            None
        }
        Err(e) => {
            eprintln!("enforcer: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let report = match read(&args.state_dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("enforcer: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if pods.is_none() && report.is_none() {
        eprintln!(
            "enforcer: nothing in {} (is the daemon running with this --state-dir?)",
            args.state_dir.display()
        );
        return std::process::ExitCode::from(2);
    }
    let kills = crate::kills::read(&args.state_dir).map_or_else(|_| Vec::new(), |k| k.0);
    println!(
        "{}",
        render_status(
            pods.as_ref(),
            report.as_ref(),
            &kills,
            crate::clock::now_nanos()
        )
    );
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_report::{ThresholdLine, tests::sample_delays};

    #[test]
    fn the_status_screen() {
        let d = sample_delays();
        let s = d.summary();
        let report = Report {
            updated: String::new(),
            updated_ns: 1_000_000_000,
            conditions: vec![],
            thresholds: vec![ThresholdLine {
                signal: "memory.available".to_owned(),
                threshold: "100Mi".to_owned(),
                kind: "hard".to_owned(),
                threshold_value: Some(100 << 20),
                available: Some(300 << 20),
                capacity: Some(1 << 30),
                met: false,
            }],
            sources: s,
        };
        let text = render_status(None, Some(&report), &[], 4_000_000_000);
        assert!(text.contains("last step, 3s ago"), "{text}");
        assert!(text.contains("memory.available"), "{text}");
        assert!(text.contains("300Mi of 1Gi"), "{text}");
        assert!(text.contains("200Mi"), "the margin: {text}");
        assert!(text.contains("0.050 ms"), "{text}");
    }
}
