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
//! combined as client-go's `EventAggregator` does: "(combined from similar events): ...".
//! Then client-go's `EventSourceObjectSpamFilter`: every occurrence takes a token from its
//! object's bucket (25, one back every 5 minutes); one that finds it empty is dropped, as
//! client-go drops it (logged at debug). A write the API server does not answer (down,
//! timed out) is tried again as client-go's `recordToSink` does: 12 tries, 10 s apart (the
//! first wait random in 0-10 s); one it refuses (a status) is not.

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
use crate::status_manager::outbox::Outbox;

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

/// client-go's `defaultSpamBurst` and `defaultSpamQPS` (one token every 300 s).
const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL: std::time::Duration = std::time::Duration::from_secs(300);

/// client-go's `EventSourceObjectSpamFilter`: a token bucket per involved object (the source
/// is this node's kubelet for every event here).
#[derive(Debug, Default)]
pub(super) struct SpamFilter {
    buckets: HashMap<(String, String, String, String), (f64, tokio::time::Instant)>,
}

impl SpamFilter {
    /// Whether the event may go (a token taken), or is dropped as spam.
    pub(super) fn allow(&mut self, e: &EventRecord, now: tokio::time::Instant) -> bool {
        let i = &e.involved;
        let key = (
            i.kind.clone(),
            i.namespace.clone(),
            i.name.clone(),
            i.uid.clone(),
        );
        if self.buckets.len() >= 4096 && !self.buckets.contains_key(&key) {
            self.buckets.clear();
        }
        let (tokens, last) = self.buckets.entry(key).or_insert((SPAM_BURST, now));
        let refilled =
            now.saturating_duration_since(*last).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        *tokens = (*tokens + refilled).min(SPAM_BURST);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// client-go's `maxTriesPerEvent` and the wait between tries.
const MAX_TRIES: u32 = 12;
const RETRY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a failed write is worth another try: no answer, or the server's own trouble (429,
/// 5xx). client-go drops an event the server answered with any error status; the node keeps
/// trying those as it does a silent server (nothing lost to a restarting API server).
fn transient(e: &super::ClusterError) -> bool {
    e.code().is_none_or(|c| c == 429 || c >= 500)
}

/// Tries `write` as client-go's `recordToSink`: again while the API server does not answer
/// (or answers 429 / 5xx), at most [`MAX_TRIES`] times, [`RETRY_WAIT`] apart (the first wait
/// random, so nodes do not retry in step); a refusal ends it.
async fn with_retries<T, F, Fut>(what: &str, mut write: F) -> Result<T, super::ClusterError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, super::ClusterError>>,
{
    let mut tries = 0;
    loop {
        match write().await {
            Ok(v) => return Ok(v),
            Err(e) if !transient(&e) => return Err(e),
            Err(e) => {
                tries += 1;
                if tries >= MAX_TRIES {
                    return Err(e);
                }
                tracing::debug!(error = %e, tries, "{what}: the API server did not take it; trying again");
                let wait = if tries == 1 {
                    RETRY_WAIT.mul_f64(f64::from(rand_fraction()))
                } else {
                    RETRY_WAIT
                };
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// A fraction in [0, 1) from the clock's nanoseconds (enough to spread the nodes' retries).
fn rand_fraction() -> f32 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (n % 1000) as f32 / 1000.0
}

/// The event writer's outbox file in the state directory.
pub const OUTBOX_FILE: &str = "event_outbox";
/// Events waiting for the API server at most (client-go's `maxQueuedEvents`); one past it is
/// dropped, as client-go drops it.
const MAX_QUEUED: usize = 1000;

/// One write to make: the event as it is to be (its name and first timestamp fixed when it
/// was recorded, so a replay after a restart is the same object), and whether it repeats one
/// already written (a patch of `count`, `lastTimestamp`, `message`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Queued {
    pub event: Event,
    #[serde(default)]
    pub repeat: bool,
}

/// The writer's state: what aggregation and the spam filter decided, and the queue of writes
/// not yet acknowledged (kept in the outbox, when there is one, before each is sent).
struct Writer {
    host: String,
    /// Key -> the event written for it.
    seen: HashMap<Key, Event>,
    similar: Similar,
    spam: SpamFilter,
    queue: std::collections::VecDeque<Queued>,
    outbox: Option<Outbox>,
}

impl Writer {
    /// A recorded event: aggregated, filtered, queued.
    fn take(&mut self, mut e: EventRecord) {
        let key = self.similar.key(&mut e, tokio::time::Instant::now());
        if !self.spam.allow(&e, tokio::time::Instant::now()) {
            tracing::debug!(reason = %e.reason, object = %e.involved.name, "event dropped by the spam filter (25 per object, one more every 5 minutes)");
            return;
        }
        if self.queue.len() >= MAX_QUEUED {
            tracing::warn!(reason = %e.reason, object = %e.involved.name, "event dropped: {MAX_QUEUED} are waiting for the API server");
            return;
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        let queued = if let Some(ev) = self.seen.get_mut(&key) {
            ev.count = Some(ev.count.unwrap_or(1).saturating_add(1));
            ev.last_timestamp = Some(Time(now));
            ev.message = Some(e.message);
            Queued {
                event: ev.clone(),
                repeat: true,
            }
        } else {
            // client-go's cache is an LRU of 4096; clearing when full is enough here.
            if self.seen.len() >= 4096 {
                self.seen.clear();
            }
            let ev = event_object(&e, &self.host, Time(now), now.as_nanosecond());
            self.seen.insert(key, ev.clone());
            Queued {
                event: ev,
                repeat: false,
            }
        };
        self.queue.push_back(queued);
    }

    fn save(&mut self) {
        if let Some(o) = self.outbox.as_mut() {
            o.keep(self.queue.make_contiguous());
        }
    }
}

/// Writes one queued event: a repeat patches the written one (created whole when it is gone);
/// a first occurrence is created (one the server already has, a replay, is done).
async fn deliver<A: ClusterApi>(api: &A, q: &Queued) {
    let ev = &q.event;
    let ns = ev.metadata.namespace.clone().unwrap_or_default();
    let name = ev.metadata.name.clone().unwrap_or_default();
    let reason = ev.reason.clone().unwrap_or_default();
    if q.repeat {
        let patch = serde_json::json!({
            "count": ev.count,
            "lastTimestamp": ev.last_timestamp,
            "message": ev.message,
        });
        match with_retries("patching an event", || api.patch_event(&ns, &name, &patch)).await {
            Ok(_) => return,
            Err(err) if err.is_not_found() => {}
            Err(err) => {
                tracing::debug!(error = %err, %reason, "writing an event failed; dropped");
                return;
            }
        }
    }
    match with_retries("writing an event", || api.create_event(ev)).await {
        Ok(_) => {}
        Err(err) if err.code() == Some(409) => {
            tracing::debug!(%name, "the event was written before the restart");
        }
        Err(err) => tracing::debug!(error = %err, %reason, "writing an event failed; dropped"),
    }
}

/// Writes recorded events until the recorders are gone, behind the event rate limit. With an
/// `outbox`, what the last run left undelivered goes first, and every event waiting is kept
/// there before it is sent.
pub async fn run<A: ClusterApi>(
    api: Arc<A>,
    mut rx: mpsc::Receiver<EventRecord>,
    host: String,
    qps: u32,
    burst: u32,
    mut outbox: Option<Outbox>,
) {
    let limiter = Limiter::new(qps, burst);
    let queue = outbox
        .as_mut()
        .map(Outbox::load::<Queued>)
        .unwrap_or_default()
        .into();
    let mut w = Writer {
        host,
        seen: HashMap::new(),
        similar: Similar::default(),
        spam: SpamFilter::default(),
        queue,
        outbox,
    };
    let mut open = true;
    loop {
        if w.queue.is_empty() {
            if !open {
                return;
            }
            match rx.recv().await {
                Some(e) => w.take(e),
                None => return,
            }
        }
        while let Ok(e) = rx.try_recv() {
            w.take(e);
        }
        w.save();
        let Some(next) = w.queue.front().cloned() else {
            continue;
        };
        // Recorded events keep coming (and are kept) while one waits for the server.
        let write = async {
            limiter.acquire(Priority::Normal).await;
            deliver(api.as_ref(), &next).await;
        };
        tokio::pin!(write);
        loop {
            tokio::select! {
                () = &mut write => break,
                e = rx.recv(), if open => match e {
                    Some(e) => {
                        w.take(e);
                        w.save();
                    }
                    None => open = false,
                },
            }
        }
        w.queue.pop_front();
        w.save();
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
        let task = tokio::spawn(run(api.clone(), rx, "n1".to_owned(), 1, 1, None));
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

    /// client-go's spam filter: 25 occurrences per object go, the rest are dropped until a
    /// token comes back (one every 5 minutes); another object has its own bucket.
    #[tokio::test(start_paused = true)]
    async fn the_spam_filter_lets_25_per_object_through_then_one_per_5_minutes() {
        let api = Arc::new(FakeApi::default());
        let (rec, rx) = Recorder::channel();
        let task = tokio::spawn(run(api.clone(), rx, "n1".to_owned(), 0, 0, None));
        let backoff = |uid: &str| {
            rec.event(
                Involved::pod("ns", "web", uid, Some("app")),
                EventType::Warning,
                "BackOff",
                "Back-off restarting failed container app".to_owned(),
            );
        };
        for _ in 0..30 {
            backoff("u1");
        }
        backoff("u2");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let count = |uid: &str| {
            api.events()
                .iter()
                .find(|e| e.involved_object.uid.as_deref() == Some(uid))
                .and_then(|e| e.count)
        };
        assert_eq!(count("u1"), Some(25));
        assert_eq!(count("u2"), Some(1));
        backoff("u1");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(count("u1"), Some(25), "no token yet");
        tokio::time::sleep(Duration::from_secs(300)).await;
        backoff("u1");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(count("u1"), Some(26), "a token came back");
        task.abort();
    }

    /// An API server that does not answer: the event is tried again (client-go's 12 tries,
    /// 10 s apart) and written once it answers, not dropped.
    #[tokio::test(start_paused = true)]
    async fn an_event_waits_for_an_api_server_that_does_not_answer() {
        let api = Arc::new(FakeApi::default());
        let (rec, rx) = Recorder::channel();
        let task = tokio::spawn(run(api.clone(), rx, "n1".to_owned(), 0, 0, None));
        api.set_down(true);
        rec.event(
            Involved::pod("ns", "web", "u1", None),
            EventType::Warning,
            "Evicted",
            "The node was low on resource: memory. ".to_owned(),
        );
        tokio::time::sleep(Duration::from_secs(45)).await;
        assert!(api.events().is_empty());
        assert!(api.count(|c| matches!(c, Call::Failed(_))) >= 4);
        api.set_down(false);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(api.events().len(), 1, "delivered once the server answers");
        task.abort();
    }

    /// Kept before it is sent: an event recorded while the API server is gone is in the
    /// outbox; a writer started on that outbox (the daemon restarted) writes it once, and one
    /// the server took before the restart (its answer lost) is not written twice.
    #[tokio::test(start_paused = true)]
    async fn an_event_the_server_did_not_take_survives_a_restart_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outbox = || Some(Outbox::at(dir.path().join(OUTBOX_FILE)));
        let api = Arc::new(FakeApi::default());
        api.set_down(true);
        let (rec, rx) = Recorder::channel();
        let task = tokio::spawn(run(api.clone(), rx, "n1".to_owned(), 0, 0, outbox()));
        rec.event(
            Involved::pod("ns", "web", "u1", None),
            EventType::Warning,
            "Evicted",
            "The node was low on resource: memory. ".to_owned(),
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        // The daemon killed: the writer gone, the server back.
        task.abort();
        let _ = task.await;
        let kept: Vec<Queued> = Outbox::at(dir.path().join(OUTBOX_FILE)).load();
        assert_eq!(kept.len(), 1, "{kept:?}");
        api.set_down(false);
        let (_rec, rx) = Recorder::channel();
        let task = tokio::spawn(run(api.clone(), rx, "n1".to_owned(), 0, 0, outbox()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let events = api.events();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].reason.as_deref(), Some("Evicted"));
        assert_eq!(events[0].metadata.name, kept[0].event.metadata.name);
        let left: Vec<Queued> = Outbox::at(dir.path().join(OUTBOX_FILE)).load();
        assert!(left.is_empty(), "delivered: out of the outbox");
        task.abort();
        let _ = task.await;
        // The server took it but the answer was lost: the replay is answered 409, no second.
        Outbox::at(dir.path().join(OUTBOX_FILE))
            .save(&kept)
            .expect("outbox");
        let (_rec, rx) = Recorder::channel();
        let task = tokio::spawn(run(api.clone(), rx, "n1".to_owned(), 0, 0, outbox()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(api.events().len(), 1);
        assert!(
            Outbox::at(dir.path().join(OUTBOX_FILE))
                .load::<Queued>()
                .is_empty()
        );
        task.abort();
    }

    /// A 503 is tried again (client-go would drop it); a 403 is not.
    #[tokio::test(start_paused = true)]
    async fn a_server_error_is_tried_again_and_a_refusal_is_not() {
        let err = |code| super::super::ClusterError::Status {
            op: "create event",
            object: "e".to_owned(),
            code,
            reason: String::new(),
            message: String::new(),
        };
        assert!(transient(&err(503)) && transient(&err(429)) && transient(&err(500)));
        assert!(!transient(&err(403)) && !transient(&err(409)) && !transient(&err(422)));
    }
}
