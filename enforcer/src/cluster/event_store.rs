//! The node's events kept in its state directory, in both modes (`enforcer events` reads them:
//! `cli::events`).
//!
//! Every event the node records goes through [`keep`]: aggregated as kubelet's recorder
//! aggregates them (identical events: one with `count` and `lastTimestamp`; similar ones
//! combined), appended as one core/v1 Event per line (JSON) to `events/events.jsonl` under
//! the state directory, and, in cluster mode, passed on to the API-server writer. A repeat is
//! a new line with the same name: the last line of a name wins when read. The files are
//! bounded: past [`MAX_FILE_BYTES`] the file becomes `events.jsonl.1` (the older one goes),
//! so at most twice that is kept. Standalone, this is where an operator reads them; in
//! cluster mode it is a local copy that outlives an unreachable API server.
//!
//! Writing never stops the node: a state directory that cannot be written is logged once and
//! the events still reach the API server.

use std::{collections::HashMap, path::Path};

use k8s_openapi::{api::core::v1::Event, apimachinery::pkg::apis::meta::v1::Time};
use tokio::sync::mpsc;

use super::events::{Key, Similar, event_object};
pub use crate::state_log::StoreError;
use crate::{
    recorder::{EventRecord, Recorder},
    state_log::{self, LineStore},
};

/// The directory under the state directory.
pub const DIR: &str = "events";
const FILE: &str = "events.jsonl";
/// One file's bound (the store keeps two).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The append end of the store.
#[derive(Debug)]
pub struct EventStore(LineStore);

impl EventStore {
    /// Opens (creating) `<state_dir>/events` for appending.
    ///
    /// # Errors
    /// The directory or file cannot be created or opened.
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        Self::with_limit(&state_dir.join(DIR), MAX_FILE_BYTES)
    }

    /// Opens `dir` with a per-file bound of `max_bytes`.
    ///
    /// # Errors
    /// The directory or file cannot be created or opened.
    pub fn with_limit(dir: &Path, max_bytes: u64) -> Result<Self, StoreError> {
        LineStore::open(dir, FILE, max_bytes).map(Self)
    }

    /// Appends one event (rotating first when the line would pass the bound).
    ///
    /// # Errors
    /// Writing or rotating failed.
    pub fn append(&mut self, event: &Event) -> Result<(), StoreError> {
        self.0.append(event)
    }
}

/// Keeps the recorded events until the recorders are gone: aggregated, appended to `store`
/// (when there is one) and passed on to `forward` (the API-server writer's queue, cluster
/// mode). `host` is the node's name (the events' `source.host`).
pub async fn keep(
    mut rx: mpsc::Receiver<EventRecord>,
    mut store: Option<EventStore>,
    host: String,
    forward: Option<Recorder>,
) {
    let mut seen: HashMap<Key, Event> = HashMap::new();
    let mut similar = Similar::default();
    let mut failed = false;
    while let Some(e) = rx.recv().await {
        if let Some(f) = &forward {
            f.record(e.clone());
        }
        let Some(s) = store.as_mut() else {
            continue;
        };
        let mut e = e;
        let key = similar.key(&mut e, tokio::time::Instant::now());
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = if let Some(ev) = seen.get_mut(&key) {
            ev.count = Some(ev.count.unwrap_or(1).saturating_add(1));
            ev.last_timestamp = Some(Time(now));
            ev.message = Some(e.message);
            ev.clone()
        } else {
            // client-go's cache is an LRU of 4096; clearing when full is enough here.
            if seen.len() >= 4096 {
                seen.clear();
            }
            let ev = event_object(&e, &host, Time(now), now.as_nanosecond());
            seen.insert(key, ev.clone());
            ev
        };
        match s.append(&event) {
            Ok(()) if failed => {
                tracing::info!("events are kept in the state directory again");
                failed = false;
            }
            Ok(()) => {}
            Err(err) if !failed => {
                tracing::warn!(error = %err, "keeping an event in the state directory failed; dropped (logged once until it works again)");
                failed = true;
            }
            Err(_) => {}
        }
    }
}

/// The events kept under `state_dir`, oldest last-seen first, the last line of each name
/// winning; with the count of lines that could not be read (a line being written, the last
/// without its newline, is not counted).
///
/// # Errors
/// The directory cannot be read (a missing one: no events).
pub fn read(state_dir: &Path) -> Result<(Vec<Event>, usize), StoreError> {
    let (lines, bad) = state_log::read::<Event>(&state_dir.join(DIR), FILE)?;
    let mut events = state_log::last_by_key(lines, |ev| {
        format!(
            "{}/{}",
            ev.metadata.namespace.as_deref().unwrap_or(""),
            ev.metadata.name.as_deref().unwrap_or("")
        )
    });
    events.sort_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0));
    Ok((events, bad))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{collections::BTreeMap, path::PathBuf};

    use super::*;
    use crate::recorder::{EventType, Involved};

    /// A fresh state directory for one test (also for `cli::events`' tests).
    pub(crate) fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "enforcer-events-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// An `Evicted` event of pod `ns/NAME`.
    pub(crate) fn evicted(name: &str) -> EventRecord {
        EventRecord {
            involved: Involved::pod("ns", name, "u1", None),
            type_: EventType::Warning,
            reason: "Evicted".to_owned(),
            message: "The node was low on resource: memory. ".to_owned(),
            annotations: BTreeMap::from([("starved_resource".to_owned(), "memory".to_owned())]),
        }
    }

    /// Keeps, in a store at `state` of node `n1`, three identical `BackOff` events of pod
    /// `ns/web` and the eviction of `ns/hog` (also for `cli::events`' tests), passing them on
    /// to `forward`.
    pub(crate) async fn keep_sample(state: &Path, forward: Option<Recorder>) {
        let (rec, rx) = Recorder::channel();
        let store = EventStore::open(state).expect("store");
        let task = tokio::spawn(keep(rx, Some(store), "n1".to_owned(), forward));
        for _ in 0..3 {
            rec.event(
                Involved::pod("ns", "web", "u2", Some("app")),
                EventType::Warning,
                "BackOff",
                "Back-off restarting failed container app in pod web_ns(u2)".to_owned(),
            );
        }
        rec.record(evicted("hog"));
        drop(rec);
        task.await.expect("keep");
    }

    /// Repeats aggregate into one event (count 3), every event is passed on to the API
    /// writer's queue, and they are read back whole.
    #[tokio::test]
    async fn kept_aggregated_forwarded_and_read_back() {
        let state = tmp("keep");
        let (fwd, mut fwd_rx) = Recorder::channel();
        keep_sample(&state, Some(fwd)).await;
        let mut forwarded = 0;
        while fwd_rx.try_recv().is_ok() {
            forwarded += 1;
        }
        assert_eq!(forwarded, 4, "every event reaches the API writer");
        let (events, bad) = read(&state).expect("read");
        assert_eq!(bad, 0);
        assert_eq!(events.len(), 2, "{events:?}");
        let backoff = events
            .iter()
            .find(|e| e.reason.as_deref() == Some("BackOff"))
            .expect("BackOff");
        assert_eq!(backoff.count, Some(3));
        assert_eq!(
            backoff.source.as_ref().and_then(|s| s.host.as_deref()),
            Some("n1")
        );
        let _ = std::fs::remove_dir_all(&state);
    }

    /// The files stay bounded: past the bound the current file becomes the previous one and
    /// the oldest events go; what is kept is read back whole.
    #[test]
    fn bounded_and_rotating() {
        let dir = tmp("rotate");
        let mut store = EventStore::with_limit(&dir.join(DIR), 4096).expect("store");
        let t = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).expect("t"));
        for i in 0..200 {
            let ev = event_object(&evicted(&format!("p{i}")), "n1", t.clone(), i);
            store.append(&ev).expect("append");
        }
        let total: u64 = [FILE, "events.jsonl.1"]
            .iter()
            .map(|f| std::fs::metadata(dir.join(DIR).join(f)).map_or(0, |m| m.len()))
            .sum();
        assert!(total <= 2 * 4096, "bounded: {total} bytes");
        let (events, bad) = read(&dir).expect("read");
        assert_eq!(bad, 0);
        assert!(events.len() > 5 && events.len() < 200, "{}", events.len());
        let last = events
            .iter()
            .filter_map(|e| e.involved_object.name.clone())
            .any(|n| n == "p199");
        assert!(last, "the newest is kept");
        assert!(
            !events
                .iter()
                .any(|e| e.involved_object.name.as_deref() == Some("p0")),
            "the oldest went"
        );
        // Reopened (a daemon restart): appends continue, nothing lost.
        drop(store);
        let mut store = EventStore::with_limit(&dir.join(DIR), 4096).expect("reopen");
        store
            .append(&event_object(&evicted("after"), "n1", t, 999))
            .expect("append");
        let (events2, _) = read(&dir).expect("read");
        assert!(
            events2
                .iter()
                .any(|e| e.involved_object.name.as_deref() == Some("after"))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A damaged line is counted and skipped; a last line being written (no newline) is
    /// skipped without counting; a hostile name cannot break the table.
    #[test]
    fn damaged_lines_and_hostile_names() {
        let dir = tmp("damaged");
        let d = dir.join(DIR);
        std::fs::create_dir_all(&d).expect("dir");
        let t = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).expect("t"));
        let good = serde_json::to_string(&event_object(&evicted("a\u{1b}[2Jb"), "n1", t, 1))
            .expect("json");
        std::fs::write(d.join(FILE), format!("{{not json\n{good}\n{{\"metad")).expect("write");
        let (events, bad) = read(&dir).expect("read");
        assert_eq!((events.len(), bad), (1, 1));
        // No directory at all: no events, not an error.
        assert_eq!(read(&tmp("none")).expect("none").0.len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
