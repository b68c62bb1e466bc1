//! Pod status write-back: kubelet's status manager (`pkg/kubelet/status/status_manager.go`)
//! for the pods of the API-server source.
//!
//! Pure parts: [`api_status`] (a [`PodRecord`] as the API's `PodStatus`: phase, reason,
//! message, conditions, init and app container statuses, hostIP, podIP for host-network pods,
//! startTime, qosClass), [`finished`] (the status of a pod whose worker terminated: kubelet's
//! `getPhase` with `podIsTerminal`), [`merge`] (`mergePodStatus`: conditions kubelet does not
//! own kept, `DisruptionTarget` only once the pod is terminal and stopped, a terminal phase
//! never reverted, the times of unchanged conditions kept) and [`can_be_deleted`].
//!
//! The loop ([`run`]) keeps the newest status of each pod (the [`StatusManager`] is the
//! queue: newer statuses replace older ones), and syncs a pod whose status changed: GET,
//! merge, then kubelet's `PatchPodStatus`: the two-way strategic merge patch of
//! `pods/{name}/status` from the API's status to the merged one, the pod's uid in it as the
//! precondition, nothing sent when it is empty (a 409 reads the pod again and retries); then,
//! for a pod with a `deletionTimestamp` whose termination finished and whose API phase is
//! terminal, DELETE with grace 0 and its uid as precondition. A failed sync is retried with
//! backoff; nothing waits on it. A pod is synced again when its status changes, its last sync
//! failed or held its phase back (containers that could still run), it was not found (a
//! mirror pod not created yet), or, every 10 s, when the API's copy the pod watch shows
//! lacks what was delivered (kubelet's `needsReconcile`: another writer changed a field the
//! node owns).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{
        ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
    },
    apimachinery::pkg::apis::meta::v1::Time,
};

use super::{ClusterApi, ClusterError, backoff, now_time};
use crate::{
    policy::resources::{is_mirror, is_static},
    sources::apiserver::API_SOURCE,
    status_manager::{
        ContainerRecord, ContainerState, PodPhase, PodRecord, StatusManager,
        outbox::{Outbox, Pending},
    },
};

/// Conditions kubelet owns (`kubetypes.PodConditionByKubelet`).
const OWNED: [&str; 7] = [
    "PodScheduled",
    "Ready",
    "Initialized",
    "ContainersReady",
    "PodReadyToStartContainers",
    // In-place resize (`PodConditionsByKubelet` since 1.33): present while pending or in
    // progress, removed when the record no longer has them.
    "PodResizePending",
    "PodResizeInProgress",
];
/// The condition kubelet shares with other writers (`PodConditionSharedByKubelet`).
const DISRUPTION_TARGET: &str = "DisruptionTarget";

fn time(s: &str) -> Option<Time> {
    s.parse::<k8s_openapi::jiff::Timestamp>().ok().map(Time)
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn api_state(s: &ContainerState, container_id: &str) -> ApiState {
    match s {
        ContainerState::Waiting { reason, message } => ApiState {
            waiting: Some(ContainerStateWaiting {
                reason: non_empty(reason),
                message: non_empty(message),
            }),
            ..ApiState::default()
        },
        ContainerState::Running { started_at } => ApiState {
            running: Some(ContainerStateRunning {
                started_at: time(started_at),
            }),
            ..ApiState::default()
        },
        ContainerState::Terminated {
            exit_code,
            reason,
            message,
            started_at,
            finished_at,
        } => ApiState {
            terminated: Some(ContainerStateTerminated {
                exit_code: *exit_code,
                reason: non_empty(reason),
                message: non_empty(message),
                started_at: time(started_at),
                finished_at: time(finished_at),
                container_id: non_empty(container_id),
                signal: None,
            }),
            ..ApiState::default()
        },
    }
}

fn container_status(c: &ContainerRecord) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        container_id: non_empty(&c.container_id),
        image: c.image.clone(),
        image_id: c.image_id.clone(),
        ready: c.ready,
        restart_count: i32::try_from(c.restart_count).unwrap_or(i32::MAX),
        started: Some(
            c.started
                .unwrap_or(matches!(c.state, ContainerState::Running { .. })),
        ),
        state: Some(api_state(&c.state, &c.container_id)),
        last_state: Some(
            c.last_state
                .as_ref()
                .map(|s| api_state(s, ""))
                .unwrap_or_default(),
        ),
        allocated_resources: c.resources.api_allocated(),
        resources: c.resources.api_resources(),
        ..ContainerStatus::default()
    }
}

/// The API phase of a record (`Terminating` is not an API phase: `None` keeps the API's).
fn api_phase(p: PodPhase) -> Option<String> {
    match p {
        PodPhase::Terminating => None,
        other => Some(other.as_str().to_owned()),
    }
}

/// A record as the API's `PodStatus` (conditions without times: [`merge`] sets them).
#[must_use]
pub fn api_status(rec: &PodRecord, host_ip: Option<&str>, host_network: bool) -> PodStatus {
    let host_ip = host_ip.map(str::to_owned);
    PodStatus {
        phase: api_phase(rec.phase),
        reason: non_empty(&rec.reason),
        message: non_empty(&rec.message),
        qos_class: non_empty(&rec.qos_class),
        start_time: time(&rec.start_time),
        host_ip: host_ip.clone(),
        host_ips: host_ip.clone().map(|ip| vec![HostIP { ip }]),
        pod_ip: if host_network {
            host_ip.clone()
        } else {
            rec.pod_ips.first().cloned()
        },
        pod_ips: if host_network {
            host_ip.map(|ip| vec![PodIP { ip }])
        } else {
            (!rec.pod_ips.is_empty()).then(|| {
                rec.pod_ips
                    .iter()
                    .map(|ip| PodIP { ip: ip.clone() })
                    .collect()
            })
        },
        conditions: Some(
            rec.conditions
                .iter()
                .map(|c| PodCondition {
                    type_: c.kind.clone(),
                    status: c.status.clone(),
                    reason: non_empty(&c.reason),
                    message: non_empty(&c.message),
                    ..PodCondition::default()
                })
                .collect(),
        ),
        init_container_statuses: (!rec.init_container_statuses.is_empty()).then(|| {
            rec.init_container_statuses
                .iter()
                .map(container_status)
                .collect()
        }),
        container_statuses: Some(
            rec.container_statuses
                .iter()
                .map(container_status)
                .collect(),
        ),
        allocated_resources: rec.resources.api_allocated(),
        resources: rec.resources.api_resources(),
        ..PodStatus::default()
    }
}

/// The status of a pod whose worker terminated (containers stopped and removed): kubelet's
/// `getPhase` with `podIsTerminal` (Succeeded when the pod initialized and every container
/// ended with 0, else Failed; a terminal phase is kept), then its `TerminatePod`: once the pod
/// shows it initialized, a container with no final state is `ContainerStatusUnknown` (137);
/// of the init containers, those up to the last one that started are (the ones after it stay
/// waiting); nothing ready.
#[must_use]
pub fn finished(mut rec: PodRecord) -> PodRecord {
    let initialized = has_initialized(&rec);
    if initialized {
        for c in &mut rec.container_statuses {
            c.terminated_unknown();
        }
    }
    let started = initialized_containers(&rec.init_container_statuses);
    for c in rec.init_container_statuses.iter_mut().take(started) {
        c.terminated_unknown();
    }
    if !rec.phase.is_terminal() {
        let succeeded = initialized
            && !rec.container_statuses.is_empty()
            && rec
                .container_statuses
                .iter()
                .all(|c| matches!(c.state, ContainerState::Terminated { exit_code: 0, .. }));
        rec.phase = if succeeded {
            PodPhase::Succeeded
        } else {
            PodPhase::Failed
        };
    }
    for c in &mut rec.conditions {
        if matches!(
            c.kind.as_str(),
            "Ready" | "ContainersReady" | "PodReadyToStartContainers"
        ) {
            c.status = "False".to_owned();
        }
    }
    rec
}

/// kubelet's `hasPodInitialized`, from the record: no init containers; or an app container
/// that started (not waiting, or with a last termination); or the last init container done
/// (exited 0, now or as its last state) or, a sidecar, running and started.
fn has_initialized(rec: &PodRecord) -> bool {
    let terminated =
        |s: &Option<ContainerState>| matches!(s, Some(ContainerState::Terminated { .. }));
    if rec.init_container_statuses.is_empty()
        || rec.container_statuses.iter().any(|c| {
            terminated(&c.last_state) || !matches!(c.state, ContainerState::Waiting { .. })
        })
    {
        return true;
    }
    rec.init_container_statuses.last().is_some_and(|c| {
        matches!(c.state, ContainerState::Terminated { exit_code: 0, .. })
            || matches!(
                c.last_state,
                Some(ContainerState::Terminated { exit_code: 0, .. })
            )
            || (matches!(c.state, ContainerState::Running { .. }) && c.started == Some(true))
    })
}

/// kubelet's `initializedContainers`: how many init container statuses, from the first, up to
/// the last one that is not waiting or has a last termination (at least the first).
fn initialized_containers(init: &[ContainerRecord]) -> usize {
    init.iter()
        .rposition(|c| {
            !matches!(c.state, ContainerState::Waiting { .. })
                || matches!(c.last_state, Some(ContainerState::Terminated { .. }))
        })
        .map_or(init.len().min(1), |i| i + 1)
}

fn is_terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// kubelet's `mergePodStatus` (plus `updateStatusInternal`'s rule that a terminal phase is
/// never reverted), with the conditions' `lastTransitionTime` kept while their status holds and
/// set to `now` when it changes.
#[must_use]
pub fn merge(
    old: &PodStatus,
    mut new: PodStatus,
    could_have_running_containers: bool,
    now: &Time,
) -> PodStatus {
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let stamp = |mut c: PodCondition| {
        c.last_transition_time = old_conditions
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status)
            .and_then(|o| o.last_transition_time.clone())
            .or_else(|| Some(now.clone()));
        c.last_probe_time = None;
        c
    };
    let mut conditions: Vec<PodCondition> = old_conditions
        .iter()
        .filter(|c| !OWNED.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    if is_terminal(old.phase.as_deref()) && !is_terminal(new.phase.as_deref()) {
        tracing::debug!(
            old = ?old.phase,
            new = ?new.phase,
            "a terminal pod phase is never reverted"
        );
        new.phase = old.phase.clone();
        new.reason = old.reason.clone();
        new.message = old.message.clone();
    }
    if new.phase.is_none() {
        new.phase = old.phase.clone().or_else(|| Some("Pending".to_owned()));
    }
    let to_terminal = !is_terminal(old.phase.as_deref()) && is_terminal(new.phase.as_deref());
    for c in new.conditions.take().unwrap_or_default() {
        if OWNED.contains(&c.type_.as_str()) {
            conditions.push(stamp(c));
        } else if c.type_ == DISRUPTION_TARGET && to_terminal && !could_have_running_containers {
            conditions.retain(|o| o.type_ != DISRUPTION_TARGET);
            conditions.push(stamp(c));
        }
    }
    new.conditions = Some(conditions);
    new.resource_claim_statuses = old.resource_claim_statuses.clone();
    new.nominated_node_name = old.nominated_node_name.clone();
    if to_terminal && could_have_running_containers {
        new.phase = old.phase.clone();
        new.reason = old.reason.clone();
        new.message = old.message.clone();
    }
    // kubelet: a terminal pod with Ready or ContainersReady true gets both false (reason
    // PodFailed / PodCompleted), ContainersReady then Ready, each replaced in place or
    // appended (`UpdatePodCondition`).
    let ready_true = |s: &PodStatus, t: &str| {
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == t && c.status == "True")
    };
    if is_terminal(new.phase.as_deref())
        && (ready_true(&new, "Ready") || ready_true(&new, "ContainersReady"))
    {
        let reason = if new.phase.as_deref() == Some("Succeeded") {
            "PodCompleted"
        } else {
            "PodFailed"
        };
        let conditions = new.conditions.get_or_insert_with(Vec::new);
        for t in ["ContainersReady", "Ready"] {
            let c = PodCondition {
                type_: t.to_owned(),
                status: "False".to_owned(),
                reason: Some(reason.to_owned()),
                last_transition_time: Some(now.clone()),
                ..PodCondition::default()
            };
            match conditions.iter_mut().find(|o| o.type_ == t) {
                // Replaced, its transition time kept when its status holds.
                Some(o) => {
                    let kept = (o.status == c.status).then(|| o.last_transition_time.clone());
                    *o = PodCondition {
                        last_transition_time: kept.flatten().or(c.last_transition_time.clone()),
                        ..c
                    };
                }
                None => conditions.push(c),
            }
        }
    }
    // Kept from the API where the node has nothing newer.
    if new.start_time.is_none() {
        new.start_time = old.start_time.clone();
    }
    if new.pod_ip.is_none() {
        new.pod_ip = old.pod_ip.clone();
        new.pod_ips = old.pod_ips.clone();
    }
    new
}

/// kubelet's `canBeDeleted`: the pod is being deleted, is no mirror pod, its API phase is
/// terminal and its termination finished on the node.
#[must_use]
pub fn can_be_deleted(pod: &Pod, finished: bool) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && !is_mirror(pod)
        && is_terminal(pod.status.as_ref().and_then(|s| s.phase.as_deref()))
        && finished
}

/// One pod the writer keeps.
#[derive(Debug)]
struct Entry {
    rec: PodRecord,
    /// The worker terminated (containers stopped and removed).
    finished: bool,
    /// The record last delivered (`None`: not yet).
    delivered: Option<PodRecord>,
    failures: u32,
    retry_at: Option<tokio::time::Instant>,
    /// The pod's `hostNetwork` as the API has it (learned at its first sync).
    host_network: bool,
    /// From the outbox of the last run: kept until delivered.
    replayed: bool,
}

/// What a sync did.
#[derive(Debug, PartialEq, Eq)]
enum Synced {
    /// Delivered (or nothing to send); the entry stays while the pod runs.
    Current,
    /// Sent with its phase held back (`mergePodStatus`: containers that could still run):
    /// not delivered, synced again at the resync.
    Held,
    /// The pod is gone from the API (or was deleted now): forget it.
    Gone,
}

/// kubelet's `PodCouldHaveRunningContainers`, as the record tells it: the worker has not
/// terminated and a container is running.
fn could_run(entry: &Entry) -> bool {
    !entry.finished
        && entry
            .rec
            .container_statuses
            .iter()
            .chain(&entry.rec.init_container_statuses)
            .any(|c| matches!(c.state, ContainerState::Running { .. }))
}

/// kubelet's `needsReconcile` (`isPodStatusByKubeletEqual`): whether the API's copy of a
/// delivered status (`api`, as the pod watch shows it) lacks what the node's record says:
/// a condition the node owns (or `DisruptionTarget`) not there with its status, reason and
/// message, or any other field differing (as the API holds it: times to the second).
/// Conditions of other writers, their order, and the times of conditions never count.
fn needs_reconcile(api: &PodStatus, entry: &Entry, host_ip: Option<&str>) -> bool {
    let ours = merge(
        api,
        api_status(&entry.rec, host_ip, entry.host_network),
        could_run(entry),
        &now_time(),
    );
    let api_conditions = api.conditions.clone().unwrap_or_default();
    let condition_missing = ours.conditions.iter().flatten().any(|c| {
        (OWNED.contains(&c.type_.as_str()) || c.type_ == DISRUPTION_TARGET)
            && !api_conditions.iter().any(|a| {
                a.type_ == c.type_
                    && a.status == c.status
                    && a.reason == c.reason
                    && a.message == c.message
            })
    });
    let without_conditions = |s: &PodStatus| PodStatus {
        conditions: None,
        ..s.clone()
    };
    condition_missing
        || super::strategic::pod_status_patch(
            "",
            &without_conditions(api),
            &without_conditions(&ours),
        )
        .is_ok_and(|p| p.is_some())
}

/// GET, merge, PATCH when changed (kubelet's `PatchPodStatus`: the two-way strategic merge
/// patch from the API's status, the uid as its precondition; 409: again, on a fresh GET),
/// DELETE when it can be deleted.
async fn sync_one<A: ClusterApi>(
    api: &A,
    entry: &mut Entry,
    host_ip: Option<&str>,
) -> Result<Synced, ClusterError> {
    let rec = entry.rec.clone();
    for _ in 0..5 {
        let Some(mut pod) = api.get_pod(&rec.namespace, &rec.name).await? else {
            return Ok(Synced::Gone);
        };
        // A static pod's status goes to its mirror (whose hash is the static pod's uid).
        let mirror_of_it = super::mirror::mirror_hash(&pod) == Some(rec.uid.as_str());
        if pod.metadata.uid.as_deref() != Some(rec.uid.as_str()) && !mirror_of_it {
            tracing::debug!(pod = %rec.name, uid = %rec.uid, "pod was deleted and then recreated; skipping its status");
            return Ok(Synced::Gone);
        }
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        entry.host_network = host_network;
        let old = pod.status.clone().unwrap_or_default();
        let could_run = could_run(entry);
        let merged = merge(
            &old,
            api_status(&rec, host_ip, host_network),
            could_run,
            &now_time(),
        );
        // The record's phase held back while its containers could still run: sent again
        // once they cannot (not taken as delivered).
        let held = could_run && rec.phase.is_terminal() && !is_terminal(old.phase.as_deref());
        let api_uid = pod.metadata.uid.clone().unwrap_or_default();
        let patch = super::strategic::pod_status_patch(&api_uid, &old, &merged).map_err(|e| {
            ClusterError::Transport {
                op: "patch pod status",
                object: format!("{}/{}", rec.namespace, rec.name),
                message: format!("encoding the patch: {e}"),
            }
        })?;
        if let Some(patch) = patch {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            match api.patch_pod_status(&ns, &name, &patch).await {
                Ok(p) => pod = p,
                // Another pod under the name now (the uid precondition): read it again.
                Err(e) if e.is_conflict() => continue,
                Err(e) if e.is_not_found() => return Ok(Synced::Gone),
                Err(e) => return Err(e),
            }
        }
        if can_be_deleted(&pod, entry.finished) {
            match api.delete_pod(&rec.namespace, &rec.name, &rec.uid).await {
                Ok(()) => {
                    tracing::info!(pod = %rec.name, namespace = %rec.namespace, uid = %rec.uid, "pod fully terminated and removed from the API server");
                    return Ok(Synced::Gone);
                }
                Err(e) if e.is_not_found() || e.is_conflict() => return Ok(Synced::Gone),
                Err(e) => return Err(e),
            }
        }
        return Ok(if entry.finished {
            Synced::Gone
        } else if held {
            Synced::Held
        } else {
            Synced::Current
        });
    }
    Err(ClusterError::Status {
        op: "update pod status",
        object: format!("{}/{}", rec.namespace, rec.name),
        code: 409,
        reason: "Conflict".to_owned(),
        message: "still conflicting after 5 attempts".to_owned(),
    })
}

/// Keeps what the API has not acknowledged in the outbox: every status not delivered, every
/// final one, and the final status of each pod being evicted (its worker still stopping).
fn save_outbox(outbox: &mut Outbox, entries: &BTreeMap<String, Entry>, status: &StatusManager) {
    let mut pending: Vec<Pending> = entries
        .values()
        .filter(|e| e.finished || e.delivered.as_ref() != Some(&e.rec))
        .map(|e| Pending {
            record: e.rec.clone(),
            finished: e.finished,
        })
        .collect();
    for rec in status.evictions() {
        if rec.source == API_SOURCE && !entries.get(&rec.uid).is_some_and(|e| e.finished) {
            pending.retain(|p| p.record.uid != rec.uid);
            pending.push(Pending {
                record: rec,
                finished: false,
            });
        }
    }
    outbox.keep(&pending);
}

/// How often the writer wakes without a change (kubelet's status manager syncs every 10 s):
/// pods not delivered yet (their pod missing from the API at the last try, e.g. a mirror not
/// created yet) are tried again; delivered ones are not read back.
const RESYNC: Duration = Duration::from_secs(10);

impl Entry {
    fn new(rec: PodRecord, finished: bool, replayed: bool) -> Self {
        Self {
            rec,
            finished,
            delivered: None,
            failures: 0,
            retry_at: None,
            host_network: false,
            replayed,
        }
    }
}

/// Folds the records into the entries: the final status of each removed API pod (a static
/// pod's entry goes: its mirror reports no terminal phase), the newest status of each live one.
fn fold_records(
    entries: &mut BTreeMap<String, Entry>,
    removed: Vec<PodRecord>,
    mut live: HashMap<String, PodRecord>,
    static_uids: &mut std::collections::BTreeSet<String>,
) {
    for rec in removed {
        if static_uids.remove(&rec.uid) {
            entries.remove(&rec.uid);
            continue;
        }
        if rec.source != API_SOURCE || live.contains_key(&rec.uid) {
            continue;
        }
        let rec = finished(rec);
        let e = entries
            .entry(rec.uid.clone())
            .or_insert_with(|| Entry::new(rec.clone(), true, false));
        e.rec = rec;
        e.finished = true;
        // A held phase's wait ends: the final status goes now.
        if e.failures == 0 {
            e.retry_at = None;
        }
    }
    for (uid, rec) in live.drain() {
        let e = entries
            .entry(uid)
            .or_insert_with(|| Entry::new(rec.clone(), false, false));
        if !e.finished && e.rec != rec {
            e.rec = rec;
            if e.failures == 0 {
                e.retry_at = None;
            }
        }
    }
}

/// Syncs every entry that is due (not delivered, final, its retry time come); the ones gone
/// from the API are forgotten. When the next retry is due.
async fn sync_due<A: ClusterApi>(
    api: &A,
    entries: &mut BTreeMap<String, Entry>,
    host_ip: Option<&str>,
) -> Option<tokio::time::Instant> {
    let now = tokio::time::Instant::now();
    let mut next_retry: Option<tokio::time::Instant> = None;
    let mut retry_at = |e: &mut Entry, at: tokio::time::Instant| {
        e.retry_at = Some(at);
        next_retry = Some(next_retry.map_or(at, |n| n.min(at)));
    };
    let mut gone = Vec::new();
    for (uid, e) in entries.iter_mut() {
        if e.delivered.as_ref() == Some(&e.rec) && !e.finished {
            continue;
        }
        if let Some(at) = e.retry_at
            && at > now
        {
            retry_at(e, at);
            continue;
        }
        match sync_one(api, e, host_ip).await {
            Ok(Synced::Gone) => gone.push(uid.clone()),
            Ok(Synced::Held) => {
                // Synced again at the resync, or at once when the record changes or the
                // pod's worker ends.
                tracing::debug!(uid = %uid, "pod status phase held back while its containers could run");
                e.delivered = None;
                retry_at(e, tokio::time::Instant::now() + RESYNC);
            }
            Ok(Synced::Current) => {
                if e.failures > 0 {
                    tracing::info!(uid = %uid, "pod status delivered again");
                }
                e.delivered = Some(e.rec.clone());
                e.failures = 0;
                e.retry_at = None;
                e.replayed = false;
            }
            Err(err) => {
                e.failures = e.failures.saturating_add(1);
                if e.failures == 1 {
                    tracing::warn!(uid = %uid, error = %err, "writing the pod status failed; kept and retried");
                }
                retry_at(e, tokio::time::Instant::now() + backoff(e.failures));
            }
        }
    }
    for uid in gone {
        entries.remove(&uid);
    }
    next_retry
}

/// Writes the status of the API-server source's pods, and of the static pods (`link`: the
/// pod loop's active pods) to their mirror pods, until cancelled.
pub async fn run<A: ClusterApi>(
    api: Arc<A>,
    status: StatusManager,
    host_ip: Option<String>,
    link: Option<crate::pods::NodeLink>,
    mut outbox: Option<Outbox>,
) {
    let changed = status.subscribe();
    let mut static_uids: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    status.track_removed();
    // What the last run left undelivered goes first; kept until delivered, whatever the pod
    // loop knows of the pod yet.
    let mut entries: BTreeMap<String, Entry> = outbox
        .as_mut()
        .map(Outbox::load::<Pending>)
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.record.uid.clone(), Entry::new(p.record, p.finished, true)))
        .collect();
    let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reconcile = false;
    loop {
        // The final status of pods that terminated, taken before the snapshot: a pod removed
        // between the two would be in neither (its final status and DELETE lost).
        let removed = status.take_removed();
        if let Some(link) = &link {
            static_uids.extend(
                link.active()
                    .iter()
                    .filter(|(_, e)| is_static(&e.pod))
                    .map(|(uid, _)| uid.clone()),
            );
        }
        let live: HashMap<String, PodRecord> = status
            .snapshot()
            .1
            .pods
            .into_iter()
            .filter(|r| r.source == API_SOURCE || static_uids.contains(&r.uid))
            .map(|r| (r.uid.clone(), r))
            .collect();
        fold_records(&mut entries, removed, live, &mut static_uids);
        // At the resync, kubelet's `needsReconcile`: a delivered status the API's copy no
        // longer carries (another writer changed it) is synced again.
        if std::mem::take(&mut reconcile) {
            for (uid, e) in &mut entries {
                if e.delivered.is_some()
                    && !e.finished
                    && status
                        .api_copy(uid)
                        .is_some_and(|api| needs_reconcile(&api, e, host_ip.as_deref()))
                {
                    tracing::info!(uid = %uid, "the API's pod status differs from the node's; syncing it again");
                    e.delivered = None;
                }
            }
        }
        // Kept before it is sent: a daemon killed while the write is on its way still has it.
        if let Some(o) = outbox.as_mut() {
            save_outbox(o, &entries, &status);
        }
        let next_retry = sync_due(api.as_ref(), &mut entries, host_ip.as_deref()).await;
        // Pods no longer known anywhere (deleted from the source before they ran).
        let known = status.snapshot().1;
        entries
            .retain(|uid, e| e.finished || e.replayed || known.pods.iter().any(|r| &r.uid == uid));
        if let Some(o) = outbox.as_mut() {
            save_outbox(o, &entries, &status);
        }
        let retry = async {
            match next_retry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = changed.notified() => {}
            () = retry => {}
            _ = resync.tick() => reconcile = true,
        }
    }
}

#[cfg(test)]
mod terminate_tests;
#[cfg(test)]
mod tests;
