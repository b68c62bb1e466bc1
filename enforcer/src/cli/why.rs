//! `enforcer why POD`: the causal record of a pod's latest kill (trigger, threshold and
//! observation, ranking, the times from the kernel event to the memory released), from the
//! kill records in the state directory. Also what `enforcer evictions` shares with it: the
//! output choice and the reading of the records.

use std::path::{Path, PathBuf};

use super::print;
use crate::{
    kills::{DIR, KillKind, KillRecord, read},
    quantity::{Format, Quantity},
    state_log::{self, cell},
};

/// Output of `enforcer why` / `enforcer evictions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// `enforcer why POD`.
#[derive(Clone, Debug, clap::Args)]
pub struct WhyArgs {
    /// The pod: its name, `namespace/name`, or uid (the latest kill of it is shown).
    pub pod: String,
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// The daemon's state directory.
    #[arg(long, default_value = crate::pods::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

fn matches(r: &KillRecord, pod: &str) -> bool {
    r.uid == pod || r.name == pod || format!("{}/{}", r.namespace, r.name) == pod
}

/// An amount of `signal`'s resource, as kubelet prints it.
fn amount(signal: &str, v: i64) -> String {
    if signal.contains("inodes") || signal.starts_with("pid") {
        v.to_string()
    } else {
        Quantity::from_int(v, Format::BinarySI).to_string()
    }
}

pub(super) fn ms_since(base: u64, t: u64) -> String {
    #[expect(clippy::cast_precision_loss, reason = "a printed figure")]
    let ms = t.saturating_sub(base) as f64 / 1e6;
    format!("+{ms:.3} ms")
}

/// `enforcer why`'s text for one record.
#[must_use]
pub fn render_why(r: &KillRecord) -> String {
    let mut out = Vec::new();
    let pod = if r.name.is_empty() {
        "(no pod)".to_owned()
    } else {
        format!("{}/{}", r.namespace, r.name)
    };
    out.push(format!(
        "Pod:         {} (uid {}){}",
        cell(&pod),
        cell(&r.uid),
        if r.qos.is_empty() {
            String::new()
        } else {
            format!(", {}", r.qos)
        }
    ));
    out.push(format!(
        "Killed by:   {} at {}",
        match r.kind {
            KillKind::Eviction => "the enforcer's eviction manager",
            KillKind::KernelOomKill => "the kernel's OOM killer",
        },
        r.at
    ));
    if !r.threshold.is_empty() {
        let observed = r.observed.map_or_else(String::new, |o| {
            format!(
                "; observed {} available of {}",
                amount(&r.signal, o.available),
                amount(&r.signal, o.capacity)
            )
        });
        out.push(format!("Threshold:   {}{observed}", r.threshold));
        out.push(format!("Grace:       {} s", r.grace_period_seconds));
    }
    out.push(format!("Message:     {}", cell(r.message.trim_end())));
    let step = if r.step.is_empty() {
        String::new()
    } else {
        format!("{} step", r.step)
    };
    match &r.trigger {
        Some(t) => out.push(format!(
            "Trigger:     {step}{}{} from {}{}{}{}",
            if step.is_empty() { "" } else { ": " },
            t.kind,
            t.source,
            t.pid.map_or_else(String::new, |p| format!(", pid {p}")),
            t.cgroup
                .as_deref()
                .map_or_else(String::new, |c| format!(", cgroup {}", cell(c))),
            match (t.usage_bytes, t.threshold_bytes) {
                (Some(u), Some(l)) => format!(
                    ", usage {u} bytes at the level {l} ({} KiB past it)",
                    u.saturating_sub(l) >> 10
                ),
                _ => String::new(),
            }
        )),
        None if !step.is_empty() => out.push(format!("Trigger:     {step}")),
        None => {}
    }
    let chain = r.chain();
    if let Some(&(_, base)) = chain.first() {
        out.push("Timeline:".to_owned());
        for (what, t) in &chain {
            out.push(format!("  {what:<24}{}", ms_since(base, *t)));
        }
        if r.kind == KillKind::Eviction && r.released_ns.is_none() {
            out.push(format!(
                "  memory released         {}",
                if r.release.is_empty() {
                    "(not yet)"
                } else {
                    r.release.as_str()
                }
            ));
        }
    }
    if !r.candidates.is_empty() {
        out.push(format!("Ranking ({}, kubelet's order):", r.signal));
        let rows: Vec<[String; 7]> = r
            .candidates
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mark = if c.uid == r.uid {
                    "evicted"
                } else if c.critical {
                    "critical: skipped"
                } else {
                    ""
                };
                [
                    format!("  {}", i + 1),
                    cell(&format!("{}/{}", c.namespace, c.name)),
                    c.qos.clone(),
                    c.priority.to_string(),
                    c.usage
                        .map_or_else(|| "-".to_owned(), |u| amount(&r.signal, u)),
                    amount(&r.signal, c.request),
                    mark.to_owned(),
                ]
            })
            .collect();
        out.push(state_log::table(
            ["  #", "POD", "QOS", "PRIORITY", "USAGE", "REQUEST", ""],
            &rows,
        ));
    }
    out.join("\n")
}

pub(super) fn load(state_dir: &Path) -> Result<Vec<KillRecord>, std::process::ExitCode> {
    super::loaded(read(state_dir), &state_dir.join(DIR))
}

/// Runs `enforcer why`: exit 1 when the pod has no record, 2 when the store is unreadable.
#[must_use]
pub fn why_main(args: &WhyArgs) -> std::process::ExitCode {
    let records = match load(&args.state_dir) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let Some(r) = records.iter().rev().find(|r| matches(r, &args.pod)) else {
        eprintln!(
            "enforcer: no kill of pod {:?} recorded in {}",
            args.pod,
            args.state_dir.join(DIR).display()
        );
        return std::process::ExitCode::FAILURE;
    };
    match args.output {
        Output::Json => print(&serde_json::to_string_pretty(r).unwrap_or_default()),
        Output::Text => print(&render_why(r)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kills::{KillLog, tests::record};

    /// A record written at the decision and again at the release is shown by `why` with the
    /// threshold, the chain's times and the ranking, and listed by `evictions`.
    #[test]
    fn why_and_evictions_show_the_whole_chain() {
        let dir = std::env::temp_dir().join(format!("enforcer-why-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut log = KillLog::open(&dir);
        log.evicted(record("u1"));
        log.released("u1", true, Some(5));
        let (records, _) = read(&dir).expect("read");
        let r = &records[0];
        let text = render_why(r);
        assert!(
            text.contains(
                "Threshold:   memory.available<250Mi (hard); observed 200Mi available of 1Gi"
            ),
            "{text}"
        );
        assert!(text.contains("kernel event            +0.000 ms"), "{text}");
        assert!(text.contains("SIGKILL sent            +1.100 ms"), "{text}");
        assert!(text.contains("evicted"), "{text}");
        let list = crate::cli::evictions::render_list(&records);
        assert!(list.starts_with("TIME"), "{list}");
        assert!(list.contains("default/hog"), "{list}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_crossing_record_shows_how_far_past_its_level_the_charge_was() {
        let mut r = record("u3");
        if let Some(t) = r.trigger.as_mut() {
            "thresholdCrossed".clone_into(&mut t.kind);
            t.usage_bytes = Some((100 << 20) + (8 << 10));
            t.threshold_bytes = Some(100 << 20);
        }
        assert!(
            render_why(&r)
                .contains(", usage 104865792 bytes at the level 104857600 (8 KiB past it)"),
            "{}",
            render_why(&r)
        );
    }

    #[test]
    fn a_timed_out_wait_says_so() {
        let mut r = record("u2");
        "timed out".clone_into(&mut r.release);
        assert!(render_why(&r).contains("memory released         timed out"));
        assert!(matches(&r, "default/hog") && matches(&r, "u2") && !matches(&r, "web"));
    }
}
