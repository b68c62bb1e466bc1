//! `enforcer events`: the node's events kept in its state directory, as a table the way
//! `kubectl get events` prints it, or an EventList as JSON; `--pod NAME` for one pod's.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Event;

use crate::{
    cluster::event_store::{DIR, read},
    state_log::{self, cell},
};

/// `enforcer events`: the node's events from its state directory.
#[derive(Clone, Debug, clap::Args)]
pub struct EventsArgs {
    /// Output format: a table as `kubectl get events` prints it, or `json` (an EventList).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = EventsOutput::Table)]
    pub output: EventsOutput,
    /// Only the events of this pod (by name; every namespace unless `--namespace`).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only the events in this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The daemon's state directory.
    #[arg(long, default_value = crate::pods::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

/// `enforcer events -o ...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EventsOutput {
    Table,
    Json,
}

/// Whether `e` passes the `--pod` / `--namespace` filters.
fn selected(e: &Event, args: &EventsArgs) -> bool {
    let o = &e.involved_object;
    let ns = e.metadata.namespace.as_deref().unwrap_or("");
    args.namespace.as_deref().is_none_or(|n| n == ns)
        && args
            .pod
            .as_deref()
            .is_none_or(|p| o.kind.as_deref() == Some("Pod") && o.name.as_deref() == Some(p))
}

/// kubectl's `duration.HumanDuration`.
#[must_use]
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".to_owned();
    }
    let s = secs.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86_400);
    let y = d / 365;
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 192 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if y < 2 {
        format!("{d}d")
    } else if y < 8 {
        if d % 365 == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{}d", d % 365)
        }
    } else {
        format!("{y}y")
    }
}

/// The table or JSON for `events` (selected by `args`), `now` for the ages.
#[must_use]
pub fn render(events: &[Event], args: &EventsArgs, now: k8s_openapi::jiff::Timestamp) -> String {
    let picked: Vec<&Event> = events.iter().filter(|e| selected(e, args)).collect();
    if args.output == EventsOutput::Json {
        let list = serde_json::json!({
            "apiVersion": "v1",
            "kind": "EventList",
            "items": picked,
        });
        return serde_json::to_string_pretty(&list).unwrap_or_default();
    }
    if picked.is_empty() {
        return "No events found.".to_owned();
    }
    let rows: Vec<[String; 6]> = picked
        .iter()
        .map(|e| {
            let o = &e.involved_object;
            let age = e.last_timestamp.as_ref().map_or_else(String::new, |t| {
                human_duration(now.duration_since(t.0).as_secs())
            });
            let count = e.count.unwrap_or(1);
            let message = e.message.as_deref().unwrap_or("");
            let message = if count > 1 {
                format!("{message} (x{count})")
            } else {
                message.to_owned()
            };
            [
                cell(e.metadata.namespace.as_deref().unwrap_or("")),
                age,
                cell(e.type_.as_deref().unwrap_or("")),
                cell(e.reason.as_deref().unwrap_or("")),
                cell(&format!(
                    "{}/{}",
                    o.kind.as_deref().unwrap_or("").to_lowercase(),
                    o.name.as_deref().unwrap_or("")
                )),
                cell(message.trim_end()),
            ]
        })
        .collect();
    state_log::table(
        [
            "NAMESPACE",
            "LAST SEEN",
            "TYPE",
            "REASON",
            "OBJECT",
            "MESSAGE",
        ],
        &rows,
    )
}

/// Runs `enforcer events`: exit 2 when the state directory cannot be read.
#[must_use]
pub fn events_main(args: &EventsArgs) -> std::process::ExitCode {
    match super::loaded(read(&args.state_dir), &args.state_dir.join(DIR)) {
        Ok(events) => super::print(&render(&events, args, k8s_openapi::jiff::Timestamp::now())),
        Err(code) => code,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::cluster::{
        event_store::tests::{evicted, keep_sample, tmp},
        events::event_object,
    };

    fn args(pod: Option<&str>, output: EventsOutput) -> EventsArgs {
        EventsArgs {
            output,
            pod: pod.map(str::to_owned),
            namespace: None,
            state_dir: PathBuf::new(),
        }
    }

    /// Repeats aggregate into one event, shown once with `(x3)`; filtered by pod, as JSON
    /// an EventList.
    #[tokio::test]
    async fn filtered_by_pod_as_json_and_as_a_table() {
        let state = tmp("cli");
        keep_sample(&state, None).await;
        let (events, _) = read(&state).expect("read");
        let text = render(
            &events,
            &args(Some("hog"), EventsOutput::Json),
            k8s_openapi::jiff::Timestamp::now(),
        );
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["kind"], "EventList");
        let items = v["items"].as_array().expect("items");
        assert_eq!(items.len(), 1, "{text}");
        assert_eq!(items[0]["reason"], "Evicted");
        assert_eq!(items[0]["type"], "Warning");
        assert_eq!(
            items[0]["metadata"]["annotations"]["starved_resource"],
            "memory"
        );
        let table = render(
            &events,
            &args(None, EventsOutput::Table),
            k8s_openapi::jiff::Timestamp::now(),
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("NAMESPACE   LAST SEEN"), "{table}");
        assert!(
            table.contains("pod/web") && table.contains("(x3)"),
            "{table}"
        );
        let _ = std::fs::remove_dir_all(&state);
    }

    /// A hostile name cannot break the table; the age as kubectl prints it.
    #[test]
    fn hostile_names_and_ages_in_the_table() {
        let t = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).expect("t"));
        let events = vec![event_object(&evicted("a\u{1b}[2Jb"), "n1", t, 1)];
        let table = render(
            &events,
            &args(None, EventsOutput::Table),
            k8s_openapi::jiff::Timestamp::from_second(1_000 + 300).expect("now"),
        );
        assert!(!table.contains('\u{1b}'), "{table:?}");
        assert!(table.contains("pod/a\\u{1b}[2Jb"), "{table}");
        assert!(table.contains("   5m   "), "the age: {table}");
        assert_eq!(
            render(
                &events,
                &args(Some("other"), EventsOutput::Table),
                k8s_openapi::jiff::Timestamp::now()
            ),
            "No events found."
        );
    }

    #[test]
    fn kubectl_ages() {
        for (s, want) in [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 + 120, "3h2m"),
            (10 * 3600, "10h"),
            (50 * 3600, "2d2h"),
            (10 * 86_400, "10d"),
            (3 * 365 * 86_400, "3y"),
        ] {
            assert_eq!(human_duration(s), want, "{s}");
        }
    }
}
