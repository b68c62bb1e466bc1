//! Events, as kubelet's recorder writes them (client-go's `record` package): core/v1 Events
//! with `source.component` `kubelet` and this node as `source.host`, named
//! `<object name>.<hex nanoseconds>`, repeated events aggregated into one (`count` +1,
//! `lastTimestamp` now, as client-go's `EventCorrelator` does for identical events), written
//! behind their own rate limit (`eventRecordQPS` / `eventBurst`).
//!
//! The node's parts record through [`crate::recorder::Recorder`], which never waits. The daemon's recorder feeds
//! [`super::event_store::keep`], which keeps them in the state directory (both modes) and
//! passes them on to this writer in cluster mode.
//!
//! Similar events (one object, type and reason, 10 different messages within 10 minutes) are
//! combined as client-go's `EventAggregator` does: "(combined from similar events): ...". Not
//! done: client-go's per-object spam filter (a token bucket per object).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use tokio::sync::mpsc;

use crate::recorder::{EventRecord, EventType, Involved};

use super::{
    ClusterApi,
    limiter::{Limiter, Priority},
};

/// The Event object of a first occurrence.
#[must_use]
pub fn event_object(e: &EventRecord, host: &str, now: Time, nanos: i128) -> Event {
    let namespace = if e.involved.namespace.is_empty() {
        "default".to_owned()
    } else {
        e.involved.namespace.clone()
    };
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", e.involved.name, nanos.max(0))),
            namespace: Some(namespace),
            annotations: (!e.annotations.is_empty()).then(|| e.annotations.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some(e.involved.kind.clone()),
            namespace: opt(&e.involved.namespace),
            name: Some(e.involved.name.clone()),
            uid: opt(&e.involved.uid),
            field_path: opt(&e.involved.field_path),
            ..ObjectReference::default()
        },
        reason: Some(e.reason.clone()),
        message: Some(e.message.clone()),
        type_: Some(e.type_.as_str().to_owned()),
        source: Some(EventSource {
            component: Some("kubelet".to_owned()),
            host: Some(host.to_owned()),
        }),
        reporting_component: Some("kubelet".to_owned()),
        reporting_instance: Some(host.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    }
}

/// The aggregation key: identical events (object, type, reason, message) are one.
pub(super) type Key = (Involved, EventType, String, String);

/// client-go's `EventAggregator`: when 10 events of one object, type and reason with
/// different messages come within 10 minutes, the next ones are one event, "(combined from
/// similar events): <message>".
#[derive(Debug, Default)]
pub(super) struct Similar {
    /// (object, type, reason) -> (first seen, the distinct messages).
    groups: HashMap<(Involved, EventType, String), (tokio::time::Instant, HashSet<String>)>,
}

/// client-go's `maxEvents` and `maxIntervalInSeconds`.
const SIMILAR_MAX: usize = 10;
const SIMILAR_INTERVAL: std::time::Duration = std::time::Duration::from_secs(600);
const COMBINED: &str = "(combined from similar events): ";

impl Similar {
    /// The aggregation key of `e` (rewriting its message when it is combined).
    pub(super) fn key(&mut self, e: &mut EventRecord, now: tokio::time::Instant) -> Key {
        let group = (e.involved.clone(), e.type_, e.reason.clone());
        if self.groups.len() >= 4096 {
            self.groups.clear();
        }
        let (since, messages) = self
            .groups
            .entry(group)
            .or_insert_with(|| (now, HashSet::new()));
        if now.saturating_duration_since(*since) > SIMILAR_INTERVAL {
            *since = now;
            messages.clear();
        }
        messages.insert(e.message.clone());
        if messages.len() >= SIMILAR_MAX {
            e.message = format!("{COMBINED}{}", e.message);
            return (
                e.involved.clone(),
                e.type_,
                e.reason.clone(),
                COMBINED.to_owned(),
            );
        }
        (
            e.involved.clone(),
            e.type_,
            e.reason.clone(),
            e.message.clone(),
        )
    }
}

/// Writes recorded events until the recorders are gone.
pub async fn run<A: ClusterApi>(
    api: Arc<A>,
    mut rx: mpsc::Receiver<EventRecord>,
    host: String,
    qps: u32,
    burst: u32,
) {
    let limiter = Limiter::new(qps, burst);
    // Key -> (namespace, name, count) of the event written for it.
    let mut seen: HashMap<Key, (String, String, i32)> = HashMap::new();
    let mut similar = Similar::default();
    while let Some(mut e) = rx.recv().await {
        limiter.acquire(Priority::Normal).await;
        let now = k8s_openapi::jiff::Timestamp::now();
        let key = similar.key(&mut e, tokio::time::Instant::now());
        if let Some((ns, name, count)) = seen.get(&key).cloned() {
            let count = count.saturating_add(1);
            let patch = serde_json::json!({
                "count": count,
                "lastTimestamp": Time(now),
                "message": e.message,
            });
            match api.patch_event(&ns, &name, &patch).await {
                Ok(_) => {
                    seen.insert(key, (ns, name, count));
                    continue;
                }
                Err(err) if err.is_not_found() => {}
                Err(err) => {
                    tracing::debug!(error = %err, reason = %e.reason, "writing an event failed; dropped");
                    continue;
                }
            }
        }
        let obj = event_object(&e, &host, Time(now), now.as_nanosecond());
        match api.create_event(&obj).await {
            Ok(created) => {
                // client-go's cache is an LRU of 4096; clearing when full is enough here.
                if seen.len() >= 4096 {
                    seen.clear();
                }
                seen.insert(
                    key,
                    (
                        created.metadata.namespace.unwrap_or_default(),
                        created.metadata.name.unwrap_or_default(),
                        1,
                    ),
                );
            }
            Err(err) => {
                tracing::debug!(error = %err, reason = %e.reason, "writing an event failed; dropped");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, time::Duration};

    use super::*;
    use crate::{
        cluster::fake::{Call, FakeApi},
        recorder::Recorder,
    };

    #[test]
    fn the_event_object() {
        let t = Time(k8s_openapi::jiff::Timestamp::from_second(7).expect("t"));
        let e = EventRecord {
            involved: Involved::pod("ns", "web", "u1", Some("app")),
            type_: EventType::Warning,
            reason: "Evicted".to_owned(),
            message: "The node was low on resource: memory. ".to_owned(),
            annotations: BTreeMap::from([("starved_resource".to_owned(), "memory".to_owned())]),
        };
        let ev = event_object(&e, "n1", t.clone(), 255);
        assert_eq!(ev.metadata.name.as_deref(), Some("web.ff"));
        assert_eq!(ev.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(
            ev.involved_object.field_path.as_deref(),
            Some("spec.containers{app}")
        );
        assert_eq!(
            ev.source.and_then(|s| s.host).as_deref(),
            Some("n1"),
            "source host"
        );
        assert_eq!(
            ev.metadata.annotations.expect("annotations")["starved_resource"],
            "memory"
        );
        let node = event_object(
            &EventRecord {
                involved: Involved::node("n1"),
                type_: EventType::Normal,
                reason: "Starting".to_owned(),
                message: "Starting kubelet.".to_owned(),
                annotations: BTreeMap::new(),
            },
            "n1",
            t,
            1,
        );
        assert_eq!(
            node.metadata.namespace.as_deref(),
            Some("default"),
            "node events"
        );
    }

    /// Identical events become one with a count; the rate limit applies.
    /// The 10th different message of one reason on one object: combined.
    #[test]
    fn similar_events_are_combined() {
        let mut similar = Similar::default();
        let now = tokio::time::Instant::now();
        let mut keys = Vec::new();
        for i in 0..12 {
            let mut e = EventRecord {
                involved: Involved::pod("ns", "web", "u1", None),
                type_: EventType::Warning,
                reason: "Failed".to_owned(),
                message: format!("error {i}"),
                annotations: BTreeMap::new(),
            };
            keys.push(similar.key(&mut e, now).3);
            if i >= 9 {
                assert_eq!(
                    e.message,
                    format!("(combined from similar events): error {i}")
                );
            }
        }
        assert_eq!(keys[8], "error 8");
        assert_eq!(keys[9], keys[11], "one combined event");
    }

    #[tokio::test(start_paused = true)]
    async fn repeats_are_aggregated_and_rate_limited() {
        let api = Arc::new(FakeApi::default());
        let (rec, rx) = Recorder::channel();
        let task = tokio::spawn(run(api.clone(), rx, "n1".to_owned(), 1, 1));
        let backoff = || {
            rec.event(
                Involved::pod("ns", "web", "u1", Some("app")),
                EventType::Warning,
                "BackOff",
                "Back-off restarting failed container app in pod web_ns(u1)".to_owned(),
            );
        };
        let start = tokio::time::Instant::now();
        backoff();
        backoff();
        backoff();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let events = api.events();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].count, Some(3));
        // One write per second (qps 1, burst 1): the create, then the two count patches.
        let writes: Vec<(u128, Call)> = api
            .timed_calls()
            .into_iter()
            .map(|(at, c)| (at.duration_since(start).as_millis(), c))
            .collect();
        assert_eq!(
            writes,
            [
                (0, Call::CreateEvent("BackOff".to_owned())),
                (1000, Call::PatchEvent),
                (2000, Call::PatchEvent)
            ]
        );
        task.abort();
    }
}
