//! One sync of the pod worker (kubelet's `SyncPod`): observe the runtime, ask the planner,
//! execute the plan, keep the probes and the `oom_score_adj` check up to date, and publish
//! the status the policy builds from what was observed.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::time::Instant;

use super::{
    CREATED, EXITED, PodWorker, PodWorkerState, RUNNING, SANDBOX_READY, WorkerError, label_filter,
    name_of, restart_count_of,
    terminate::{ignore_not_found, kill_pod, stop_container},
};
use crate::{
    cri::{
        ContainerRuntime,
        spec::{self, ContainerKind, PodIdent},
    },
    pods::{
        probe::{self, ProbeContext, ProbeType},
        records::blank_record,
    },
    policy::{
        pod_actions::{
            ContainerStart, ContainerView, CrashBackoff, FailedProbe, PodPhase, PodRuntime,
            ProbeKill, Replace, RuntimeState, SandboxPlan, SandboxView, compute_pod_actions,
            effective_exit_code, probe_kill,
        },
        pod_status::{
            ContainerObservation, PodStatusInput, ResourcesStatus, RuntimeStatus, pod_status,
        },
        resize::status,
    },
    recorder::EventType,
    status_manager::{now_nanos, rfc3339},
};

/// How soon a volume setup that failed is retried.
const VOLUME_RETRY: Duration = Duration::from_secs(2);

impl<R: ContainerRuntime> PodWorker<R> {
    /// What the runtime holds of this pod: its sandboxes and containers (newest first), and
    /// the view [`compute_pod_actions`] decides from (exit codes from the cached statuses).
    pub(super) async fn observe(
        &mut self,
        pod: &Pod,
        now: Instant,
    ) -> Result<(Vec<cri::PodSandbox>, Vec<cri::Container>, PodRuntime), WorkerError> {
        let rt = self.ctx.runtime.clone();
        let sandboxes = rt
            .list_pod_sandboxes(cri::PodSandboxFilter {
                label_selector: label_filter(&self.uid),
                ..Default::default()
            })
            .await
            .map_err(self.cri())?;
        let mut containers = self.pod_containers().await.map_err(self.cri())?;
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        self.probe_killed
            .retain(|id| containers.iter().any(|c| &c.id == id));
        let want_sandbox = spec::sandbox_hash(pod);
        let hashes: HashMap<&str, [String; 2]> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .map(|c| {
                let hashes = [spec::container_hash(c), spec::legacy_container_hash(c)];
                (c.name.as_str(), hashes)
            })
            .collect();
        let mut view = PodRuntime {
            sandboxes: sandboxes
                .iter()
                .map(|s| SandboxView {
                    id: s.id.clone(),
                    ready: s.state == SANDBOX_READY,
                    current: s.annotations.get(spec::SANDBOX_HASH_ANNOTATION)
                        == Some(&want_sandbox),
                    attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
                    created_at: s.created_at,
                })
                .collect(),
            containers: Vec::with_capacity(containers.len()),
        };
        for c in &containers {
            let state = match c.state {
                RUNNING => RuntimeState::Running,
                CREATED => RuntimeState::Created,
                EXITED => {
                    self.exit_seen.entry(c.id.clone()).or_insert(now);
                    let code = self.status_of(c).await?.exit_code;
                    RuntimeState::Exited {
                        code: effective_exit_code(code, self.probe_killed.contains(&c.id)),
                    }
                }
                _ => RuntimeState::Unknown,
            };
            view.containers.push(ContainerView {
                id: c.id.clone(),
                name: name_of(c).to_owned(),
                sandbox_id: c.pod_sandbox_id.clone(),
                state,
                // A container to restart for a resize (its `resizePolicy`) is not current.
                current: c
                    .annotations
                    .get(spec::CONTAINER_HASH_ANNOTATION)
                    .zip(hashes.get(name_of(c)))
                    .is_some_and(|(have, want)| want.contains(have))
                    && !self.resize.restart.contains(&c.id),
                restart_count: restart_count_of(c),
                created_at: c.created_at,
                started: false,
            });
        }
        // The prober's results as of the plan (read after the last await).
        let defs: Vec<&Container> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .collect();
        for v in &mut view.containers {
            v.started = defs
                .iter()
                .find(|d| d.name == v.name)
                .is_some_and(|d| self.probes.started(&v.id, d));
        }
        Ok((sandboxes, containers, view))
    }

    /// A pod whose volumes cannot be set up: held in `ContainerCreating` with `message`, its
    /// status published, retried after [`VOLUME_RETRY`].
    async fn wait_for_volumes(
        &mut self,
        pod: &Pod,
        qos: spec::Qos,
        cgroup: &str,
        message: &str,
        now: Instant,
    ) -> Result<Option<Instant>, WorkerError> {
        let (_, containers, view) = self.observe(pod, now).await?;
        let sandbox = view
            .sandboxes
            .iter()
            .find(|s| s.ready && s.current)
            .map(|s| s.id.clone())
            .unwrap_or_default();
        for c in pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        {
            self.waiting.insert(
                c.name.clone(),
                ("ContainerCreating".to_owned(), message.to_owned()),
            );
        }
        self.publish(pod, qos, cgroup, &sandbox, &containers, false)
            .await?;
        Ok(Some(now + VOLUME_RETRY))
    }

    /// The containers the plan holds in their restart backoff: a `BackOff` event each, and
    /// waiting with `CrashLoopBackOff`.
    fn crash_loop_backoff(&mut self, pod: &Pod, backoff: &[CrashBackoff]) {
        for b in backoff {
            self.event(
                Some(&b.name),
                EventType::Warning,
                "BackOff",
                format!(
                    "Back-off restarting failed container {} in pod {}",
                    b.name,
                    crate::policy::security::format_pod(pod)
                ),
            );
            self.waiting.insert(
                b.name.clone(),
                ("CrashLoopBackOff".to_owned(), b.message.clone()),
            );
        }
    }

    /// A new sandbox for the pod (the old one killed first when the plan says so), its log
    /// directory made; the pod's start time set when it has none.
    async fn create_sandbox(
        &mut self,
        pod: &Pod,
        attempt: u32,
        kill_first: bool,
        cgroup: &str,
    ) -> Result<String, WorkerError> {
        let rt = self.ctx.runtime.clone();
        let uid = self.uid.clone();
        let log_dir = self.ctx.log_root.join(&uid);
        let log_dir_s = log_dir.display().to_string();
        if kill_first {
            tracing::info!(uid = %uid, "sandbox changed or not ready; restarting the pod");
            let hooks = self.pre_stop(pod).await;
            kill_pod(&rt, &uid, spec::grace_seconds(pod), true, Some(&hooks))
                .await
                .map_err(self.cri())?;
        }
        std::fs::create_dir_all(&log_dir).map_err(|source| WorkerError::Io {
            uid: uid.clone(),
            path: log_dir.clone(),
            source,
        })?;
        let mut config = spec::sandbox_config(pod, attempt, cgroup, &log_dir_s);
        config.dns_config = Some(self.pod_dns(pod)?);
        let sid = rt.run_pod_sandbox(config).await.map_err(self.cri())?;
        tracing::info!(uid = %uid, pod = %PodIdent::of(pod).name, sandbox = %sid, "sandbox started");
        if self.start_time.is_empty() {
            self.start_time = rfc3339(now_nanos());
        }
        Ok(sid)
    }

    /// One sync: observe the runtime, plan ([`compute_pod_actions`]), execute the plan,
    /// publish the status. Returns when the worker wants to be woken next (backoff expiry).
    pub(super) async fn sync(&mut self, pod: &Pod) -> Result<Option<Instant>, WorkerError> {
        let now = Instant::now();
        let rt = self.ctx.runtime.clone();
        let uid = self.uid.clone();
        let qos = spec::pod_qos(pod);
        self.waiting.clear();
        self.message.clear();
        // The pod cgroup (created and limited before the sandbox, as kubelet does), its
        // values re-written on every sync so they stay as decided; an allocated resize is
        // actuated first, in kubelet's order.
        let target = spec::pod_cgroup_values(pod, self.ctx.cgroups.options());
        let values = self.actuate_resize(pod, qos, &target).await?;
        let cgroup = self
            .ctx
            .cgroups
            .ensure(&uid, qos, &values)
            .map_err(|source| WorkerError::Cgroup {
                uid: uid.clone(),
                source,
            })?;
        self.pod_values_written(&values);
        // The API objects the pod reads, for its volumes and environment.
        self.objects = Some(Arc::new(self.read_objects(pod).await));
        // The volumes, before the sandbox and every container (kubelet's
        // WaitForAttachAndMount): a volume that cannot be set up holds the pod in
        // ContainerCreating and is retried.
        if let Err(e) = self.setup_volumes(pod, values.memory_limit_bytes) {
            let message = e.to_string();
            tracing::warn!(uid = %uid, error = %message, "volume setup failed");
            return self
                .wait_for_volumes(pod, qos, &cgroup, &message, now)
                .await;
        }
        // Containers that failed their liveness or startup probe are killed first; the plan
        // then restarts them as their restart policy says (kubelet's computePodActions).
        self.probe_kills(pod).await?;
        let (sandboxes, containers, view) = self.observe(pod, now).await?;
        let actions = compute_pod_actions(
            pod,
            &view,
            &spec::container_hash,
            &self.backoff,
            &self.exit_seen,
            now,
        );
        self.crash_loop_backoff(pod, &actions.backoff);
        let log_dir = self.ctx.log_root.join(&uid);
        let log_dir_s = log_dir.display().to_string();
        let (sandbox_id, attempt) = match &actions.sandbox {
            SandboxPlan::Finished(old) => {
                self.state = PodWorkerState::Terminated;
                self.probes.clear();
                self.publish(pod, qos, &cgroup, old, &containers, false)
                    .await?;
                return Ok(None);
            }
            SandboxPlan::Keep(id) => {
                let attempt = view
                    .sandboxes
                    .iter()
                    .find(|s| &s.id == id)
                    .map_or(0, |s| s.attempt);
                (id.clone(), attempt)
            }
            SandboxPlan::Create {
                attempt,
                kill_first,
            } => (
                self.create_sandbox(pod, *attempt, *kill_first, &cgroup)
                    .await?,
                *attempt,
            ),
        };
        if self.start_time.is_empty() {
            self.start_time = sandboxes
                .iter()
                .max_by_key(|s| s.created_at)
                .map(|s| rfc3339(s.created_at))
                .unwrap_or_default();
        }
        let sandbox_config = spec::sandbox_config(pod, attempt, &cgroup, &log_dir_s);
        for start in &actions.start {
            self.execute(pod, start, &sandbox_id, &sandbox_config, now)
                .await?;
        }
        // Status from a fresh listing.
        let mut after = self.pod_containers().await.map_err(self.cri())?;
        after.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        self.check_oom(pod, &cgroup, &sandbox_id, &after);
        self.sync_probes(pod, &sandbox_id, &after).await?;
        let phase = self
            .publish(pod, qos, &cgroup, &sandbox_id, &after, actions.init_failed)
            .await?;
        if phase.is_terminal() {
            tracing::info!(uid = %uid, %phase, "pod finished; stopping its sandbox");
            self.state = PodWorkerState::Terminated;
            self.probes.clear();
            let hooks = self.pre_stop(pod).await;
            kill_pod(&rt, &uid, spec::grace_seconds(pod), false, Some(&hooks))
                .await
                .map_err(self.cri())?;
        }
        Ok(actions.wake)
    }

    /// Executes one container start of the plan: deals with the earlier instance as the plan
    /// says, then creates and starts the container.
    pub(super) async fn execute(
        &mut self,
        pod: &Pod,
        s: &ContainerStart,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        now: Instant,
    ) -> Result<(), WorkerError> {
        let Some(def) = pod
            .spec
            .iter()
            .flat_map(|p| p.init_containers.iter().flatten().chain(&p.containers))
            .find(|c| c.name == s.name)
            .cloned()
        else {
            return Ok(());
        };
        let rt = self.ctx.runtime.clone();
        match &s.replace {
            Replace::Nothing => {}
            Replace::StartCreated(id) => match rt.start_container(id).await {
                Ok(()) => {
                    tracing::info!(uid = %self.uid, container = %s.name, id = %id, "started a container created earlier");
                    return Ok(());
                }
                Err(e) if e.is_not_found() => {
                    ignore_not_found(rt.remove_container(id).await).map_err(self.cri())?;
                }
                Err(e) => return Err(self.cri()(e)),
            },
            Replace::Remove(id) => {
                ignore_not_found(rt.remove_container(id).await).map_err(self.cri())?;
            }
            Replace::Stop(id) => {
                tracing::info!(uid = %self.uid, container = %s.name, "container definition changed; restarting it");
                let hooks = self.pre_stop(pod).await;
                ignore_not_found(
                    stop_container(
                        &*rt,
                        id,
                        &s.name,
                        spec::grace_seconds(pod),
                        hooks.for_container(&s.name),
                    )
                    .await,
                )
                .map_err(self.cri())?;
            }
            Replace::Restart { backoff_key, .. } => self.backoff.next(backoff_key, now),
        }
        self.start(
            pod,
            &def,
            s.kind,
            s.restart_count,
            sandbox_id,
            sandbox_config,
            now,
        )
        .await?;
        if let Replace::Restart { remove_older, .. } = &s.replace {
            // Keep the exited instance just replaced (last state); remove older ones.
            for old in remove_older {
                ignore_not_found(rt.remove_container(old).await).map_err(self.cri())?;
                self.statuses.remove(old);
                self.exit_seen.remove(old);
            }
        }
        Ok(())
    }

    /// Kills the containers whose liveness or startup probe failed past its threshold, as
    /// [`probe_kill`] decides (kubelet's `Killing` event and message, the grace period).
    async fn probe_kills(&mut self, pod: &Pod) -> Result<(), WorkerError> {
        for k in self.probes.take_kills() {
            let probe = match k.probe {
                ProbeType::Startup => FailedProbe::Startup,
                _ => FailedProbe::Liveness,
            };
            let ProbeKill { message, grace } = probe_kill(
                pod,
                &k.name,
                probe,
                k.grace,
                spec::grace_seconds(pod),
                spec::MIN_GRACE_SECONDS,
            );
            tracing::info!(uid = %self.uid, container = %k.name, id = %k.container_id, grace, "{message}");
            self.event(Some(&k.name), EventType::Normal, "Killing", message);
            let hooks = self.pre_stop(pod).await;
            if let Err(e) = ignore_not_found(
                stop_container(
                    &*self.ctx.runtime,
                    &k.container_id,
                    &k.name,
                    grace,
                    hooks.for_container(&k.name),
                )
                .await,
            ) {
                // Asked again at the next sync.
                self.probes.requeue(k);
                return Err(self.cri()(e));
            }
            self.probe_killed.insert(k.container_id);
        }
        Ok(())
    }

    /// Where the pod's network probes go without a `host`: the pod IP; for host-network
    /// pods the node's IP; 127.0.0.1 without either (kubelet dials the empty host, local).
    pub(super) async fn probe_host(&mut self, pod: &Pod, sandbox_id: &str) -> String {
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let ips = if host_network {
            self.ctx.downward.host_ips.clone()
        } else {
            self.pod_ips(pod, sandbox_id).await
        };
        ips.into_iter()
            .next()
            .unwrap_or_else(|| "127.0.0.1".to_owned())
    }

    /// Probes exactly the running app containers and sidecars that have probes (new
    /// instances get new probes; the probes of stopped ones end).
    async fn sync_probes(
        &mut self,
        pod: &Pod,
        sandbox_id: &str,
        all: &[cri::Container],
    ) -> Result<(), WorkerError> {
        // The API refuses probes on regular init containers; a static pod may still carry
        // them: they are not run, and the log says so once.
        if !self.init_probes_reported {
            let ignored: Vec<&str> = pod
                .spec
                .iter()
                .flat_map(|s| s.init_containers.iter().flatten())
                .filter(|c| ContainerKind::of_init(c) != ContainerKind::Sidecar)
                .filter(|c| probe::has_probes(c))
                .map(|c| c.name.as_str())
                .collect();
            if !ignored.is_empty() {
                tracing::warn!(uid = %self.uid, containers = ?ignored, "probes on init containers without restartPolicy Always are not run (the API server refuses them)");
                self.init_probes_reported = true;
            }
        }
        let defs: Vec<Container> = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .filter(|c| ContainerKind::of_init(c) == ContainerKind::Sidecar)
                    .chain(&s.containers)
            })
            .filter(|c| probe::has_probes(c))
            .cloned()
            .collect();
        let mut targets = Vec::new();
        let mut host = None;
        for def in defs {
            let Some(c) = all.iter().find(|x| {
                x.pod_sandbox_id == sandbox_id && x.state == RUNNING && name_of(x) == def.name
            }) else {
                continue;
            };
            let started_at = self.status_of(c).await?.started_at;
            let pod_host = match &host {
                Some(h) => String::clone(h),
                None => {
                    let h = self.probe_host(pod, sandbox_id).await;
                    host = Some(h.clone());
                    h
                }
            };
            targets.push(probe::Target {
                container_id: c.id.clone(),
                container: def,
                started_at,
                pod_host,
            });
        }
        let id = PodIdent::of(pod);
        let ctx = ProbeContext {
            runtime: self.ctx.runtime.clone(),
            events: self.ctx.events.clone(),
            namespace: id.namespace,
            name: id.name,
            uid: self.uid.clone(),
        };
        self.probes.sync(&ctx, &targets);
        Ok(())
    }

    /// Verifies the `oom_score_adj` of the running containers' processes (corrects it when
    /// the runtime did not set the decided value, clamped where the node forbids it).
    fn check_oom(&mut self, pod: &Pod, cgroup: &str, sandbox_id: &str, all: &[cri::Container]) {
        let floor = spec::oom_score_adj_floor(self.ctx.node.cap_sys_resource);
        let spec_ref = pod.spec.as_ref();
        let defs = spec_ref.into_iter().flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        });
        let mut seen = HashMap::new();
        for def in defs {
            let Some(c) = all.iter().find(|x| {
                x.pod_sandbox_id == sandbox_id && x.state == RUNNING && name_of(x) == def.name
            }) else {
                continue;
            };
            let decided = spec::decided_oom_score_adj(pod, def, self.ctx.node.memory_capacity);
            let got = self.ctx.enforce.verify_oom(
                self.ctx.cgroups.kubepods(),
                cgroup,
                &c.id,
                decided,
                floor,
            );
            seen.insert(c.id.clone(), (decided, got));
        }
        self.oom = seen;
    }

    /// Builds and publishes the pod status; returns the phase. The worker only gathers the
    /// values ([`Self::container_observations`], the pod's IPs); [`pod_status`] builds it.
    pub(super) async fn publish(
        &mut self,
        pod: &Pod,
        qos: spec::Qos,
        cgroup: &str,
        sandbox_id: &str,
        all: &[cri::Container],
        init_failed: bool,
    ) -> Result<PodPhase, WorkerError> {
        let containers = self.container_observations(pod, sandbox_id, all).await?;
        let pod_ips = self.pod_ips(pod, sandbox_id).await;
        let record = pod_status(PodStatusInput {
            pod,
            uid: self.uid.clone(),
            source: self.source.clone(),
            message: self.message.clone(),
            qos_class: qos.as_str().to_owned(),
            start_time: self.start_time.clone(),
            pod_ips,
            sandbox_id: sandbox_id.to_owned(),
            cgroup: cgroup.to_owned(),
            containers,
            waiting: &self.waiting,
            init_failed,
            syncing: self.state == PodWorkerState::Syncing,
        });
        let mut record = record;
        if self.ctx.enforce.pod_level_resize() {
            record.resources = self.pod_level_status(pod);
        }
        let generation = pod.metadata.generation.unwrap_or(0);
        let pending = self.ctx.resizes.pending(&self.uid);
        record
            .conditions
            .extend(self.resize.conditions(pending, generation));
        let phase = record.phase;
        crate::metrics::global().pod_phase(&self.uid, phase);
        self.ctx.status.set(record);
        Ok(phase)
    }

    /// The pod-level `allocatedResources` and `resources` (KEP-5419): the allocated pod's, with
    /// the pod cgroup's values once the pod runs (the phase of the last status, as kubelet
    /// reads the API's).
    fn pod_level_status(&self, pod: &Pod) -> ResourcesStatus {
        let old = self
            .ctx
            .status
            .get(&self.uid)
            .filter(|o| o.phase == PodPhase::Running);
        let old_resources = old.as_ref().and_then(|o| o.resources.api_resources());
        let actual = self.resize.pod_values().map(status::pod_cgroup_actual);
        ResourcesStatus::new(
            Some(status::pod_allocated_resources(pod)),
            &status::pod_status_resources(pod, old.is_some(), actual, old_resources.as_ref()),
        )
    }

    /// The sandbox's container instances the status shows (each spec container's newest
    /// instance and the one before it), newest first: the runtime's status of the newest and
    /// of an exited one before it (read in the spec's order, cached), the prober's results
    /// and the last `oom_score_adj` check.
    pub(super) async fn container_observations(
        &mut self,
        pod: &Pod,
        sandbox_id: &str,
        all: &[cri::Container],
    ) -> Result<Vec<ContainerObservation>, WorkerError> {
        let defs: Vec<&Container> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .collect();
        let in_sandbox: Vec<&cri::Container> = all
            .iter()
            .filter(|c| c.pod_sandbox_id == sandbox_id)
            .collect();
        let mut shown = HashSet::new();
        let mut statuses = HashMap::new();
        for c in defs.iter().copied() {
            let instances = in_sandbox.iter().filter(|x| name_of(x) == c.name).take(2);
            for (i, x) in instances.enumerate() {
                shown.insert(x.id.clone());
                if i == 0 || x.state == EXITED {
                    let st = self.status_of(x).await?;
                    statuses.insert(x.id.clone(), st);
                }
            }
        }
        let mut out = Vec::new();
        for x in in_sandbox.into_iter().filter(|x| shown.contains(&x.id)) {
            let Some(def) = defs.iter().find(|c| c.name == name_of(x)) else {
                continue;
            };
            let st = statuses.get(&x.id);
            let state = match x.state {
                RUNNING => RuntimeState::Running,
                CREATED => RuntimeState::Created,
                EXITED => RuntimeState::Exited {
                    code: st.map_or(0, |s| s.exit_code),
                },
                _ => RuntimeState::Unknown,
            };
            out.push(ContainerObservation {
                id: x.id.clone(),
                name: def.name.clone(),
                state,
                restart_count: restart_count_of(x),
                status: st.map_or_else(RuntimeStatus::default, |s| RuntimeStatus {
                    reason: crate::policy::pod_status::exit_reason(
                        &s.reason,
                        s.exit_code,
                        x.state == EXITED && self.ctx.link.oom_killed(&self.uid, &x.id),
                    ),
                    message: s.message.clone(),
                    started_at: s.started_at,
                    finished_at: s.finished_at,
                    image_ref: s.image_ref.clone(),
                }),
                probe_killed: self.probe_killed.contains(&x.id),
                started: self.probes.started(&x.id, def),
                ready: self.probes.ready(&x.id, def),
                oom_score_adj: self.oom.get(&x.id).copied(),
                actual: if x.state == RUNNING {
                    self.resize.actual_of(x)
                } else {
                    None
                },
            });
        }
        Ok(out)
    }

    /// The sandbox's IPs (none for host-network pods); asked once per sandbox, again after
    /// a failed answer.
    pub(super) async fn pod_ips(&mut self, pod: &Pod, sandbox_id: &str) -> Vec<String> {
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        if host_network || sandbox_id.is_empty() {
            return Vec::new();
        }
        if let Some((id, ips)) = &self.sandbox_ips
            && id == sandbox_id
        {
            return ips.clone();
        }
        match self.ctx.runtime.pod_sandbox_ips(sandbox_id).await {
            Ok(ips) => {
                self.sandbox_ips = Some((sandbox_id.to_owned(), ips.clone()));
                ips
            }
            Err(e) => {
                tracing::debug!(uid = %self.uid, error = %e, "sandbox status");
                Vec::new()
            }
        }
    }

    pub(super) fn publish_error(&self, pod: &Pod) {
        let mut rec = self
            .ctx
            .status
            .get(&self.uid)
            .unwrap_or_else(|| blank_record(pod, &self.uid, &self.source, PodPhase::Pending));
        rec.message = self.message.clone();
        self.ctx.status.set(rec);
    }
}
