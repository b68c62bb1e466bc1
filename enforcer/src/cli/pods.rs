//! `enforcer pods`: the pods the daemon runs, from its state directory (`pods.json`), as a
//! table or JSON.

use std::path::PathBuf;

use crate::status_manager::{ContainerState, PodPhase, StatusFile, read};

/// `enforcer pods`: a table (or JSON) of the pods in a state directory.
pub fn render(file: &StatusFile, json: bool) -> String {
    if json {
        return serde_json::to_string_pretty(file).unwrap_or_default();
    }
    let mut rows = vec![[
        "NAMESPACE".to_owned(),
        "NAME".to_owned(),
        "READY".to_owned(),
        "STATUS".to_owned(),
        "RESTARTS".to_owned(),
        "QOS".to_owned(),
        "UID".to_owned(),
    ]];
    for p in &file.pods {
        let ready = p.container_statuses.iter().filter(|c| c.ready).count();
        let restarts: u32 = p.container_statuses.iter().map(|c| c.restart_count).sum();
        // Like kubectl: a waiting or terminated container's reason wins over the phase.
        let status = p
            .container_statuses
            .iter()
            .chain(&p.init_container_statuses)
            .find_map(|c| match &c.state {
                ContainerState::Waiting { reason, .. }
                    if !reason.is_empty() && reason != "ContainerCreating" =>
                {
                    Some(reason.clone())
                }
                ContainerState::Terminated { reason, .. } if p.phase != PodPhase::Running => {
                    Some(reason.clone())
                }
                _ => None,
            })
            .or_else(|| (!p.reason.is_empty()).then(|| p.reason.clone()))
            .unwrap_or_else(|| p.phase.to_string());
        rows.push([
            p.namespace.clone(),
            p.name.clone(),
            format!("{ready}/{}", p.container_statuses.len()),
            status,
            restarts.to_string(),
            p.qos_class.clone(),
            p.uid.clone(),
        ]);
    }
    let mut widths = [0usize; 7];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    for r in &file.rejected {
        out.push_str(&format!("rejected {}: {}\n", r.file, r.message));
    }
    let pressure = file.node.true_conditions();
    if !pressure.is_empty() {
        out.push_str(&format!("node conditions: {}\n", pressure.join(", ")));
    }
    out
}

/// `enforcer pods`: the pods the daemon runs, from its state directory.
#[derive(Clone, Debug, clap::Args)]
pub struct PodsArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = PodsOutput::Table)]
    pub output: PodsOutput,
    /// The daemon's state directory (where it writes pods.json).
    #[arg(long, default_value = crate::pods::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

/// `enforcer pods -o ...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PodsOutput {
    Table,
    Json,
}

/// Runs `enforcer pods`: prints the table or JSON; exit code 2 when the state is unreadable.
#[must_use]
pub fn pods_main(args: &PodsArgs) -> std::process::ExitCode {
    match read(&args.state_dir) {
        Ok(file) => super::print(render(&file, args.output == PodsOutput::Json).trim_end()),
        Err(e) => super::unreadable(e),
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::status_manager::{
        Condition, ContainerRecord, NodeRecord, PODS_FILE, PodRecord, Rejection, rfc3339,
        write_atomic,
    };

    #[test]
    fn table_and_json_round_trip() {
        let rec = PodRecord {
            uid: "u".into(),
            name: "web".into(),
            namespace: "default".into(),
            source: "/m/web.yaml".into(),
            phase: PodPhase::Running,
            reason: String::new(),
            message: String::new(),
            qos_class: "BestEffort".into(),
            start_time: rfc3339(1_000_000_000),
            pod_ips: vec![],
            sandbox_id: "s".into(),
            cgroup: String::new(),
            conditions: vec![],
            init_container_statuses: vec![],
            container_statuses: vec![ContainerRecord {
                name: "c".into(),
                container_id: "x".into(),
                image: "busybox:local".into(),
                image_id: String::new(),
                ready: false,
                started: Some(false),
                restart_count: 4,
                state: ContainerState::Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: "back-off 40s".into(),
                },
                last_state: None,
                oom_score_adj: None,
                oom_score_adj_decided: None,
                resources: Default::default(),
            }],
            resources: Default::default(),
        };
        let file = StatusFile {
            pods: vec![rec],
            rejected: vec![Rejection {
                file: "bad.yaml".into(),
                message: "invalid".into(),
            }],
            node: NodeRecord {
                conditions: vec![
                    Condition::new("MemoryPressure", true),
                    Condition::new("DiskPressure", false),
                ],
            },
        };
        let table = render(&file, false);
        assert!(
            table.contains("node conditions: MemoryPressure\n"),
            "{table}"
        );
        assert!(table.contains("CrashLoopBackOff"), "{table}");
        assert!(table.contains("0/1"), "{table}");
        assert!(table.contains("rejected bad.yaml: invalid"), "{table}");
        let json = render(&file, true);
        let back: StatusFile = serde_json::from_str(&json).expect("json");
        assert_eq!(back, file);
        let dir = tempfile::tempdir().expect("tempdir");
        write_atomic(&dir.path().join(PODS_FILE), json.as_bytes()).expect("write");
        assert_eq!(read(dir.path()).expect("read"), file);
    }
}
