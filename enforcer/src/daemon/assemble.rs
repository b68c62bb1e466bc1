//! The daemon's modes (standalone, cluster, companion), told apart once, and one assembler
//! each: what runs the pods (or watches kubelet's) and writes back to the API server.

use std::{collections::BTreeMap, sync::Arc};

use super::{CompanionMode, DaemonError, DaemonOptions, image_options, tripwire_cgroup};
use crate::{
    cgroup::CgroupLayout,
    config::Config,
    cri::CriRuntime,
    health::Health,
    kernel::Capabilities,
    node::NodeObserver,
    pods::{Admission, NodeLink, RunPodsOptions},
    policy::admission::{self, SecurityPolicy},
    quantity::Quantity,
    status_manager::StatusManager,
};

/// The three ways the daemon runs, told apart once (`enforcer run`'s flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// No API server: the manifest directory's pods, the node's events kept locally.
    Standalone,
    /// `--kubeconfig`: the API server's pods too, the node, its lease and pod status written
    /// back.
    Cluster,
    /// `--companion`: beside a running kubelet, its pods watched, none run.
    Companion(CompanionMode),
}

impl Mode {
    pub(super) fn of(opts: &DaemonOptions) -> Self {
        match (opts.companion, &opts.kubeconfig) {
            (Some(c), _) => Self::Companion(c),
            (None, Some(_)) => Self::Cluster,
            (None, None) => Self::Standalone,
        }
    }

    /// The configuration this mode runs with (companion mode adjusts it, logging each
    /// change).
    pub(super) fn config(self, config: Config) -> Result<Config, DaemonError> {
        match self {
            Self::Companion(c) => {
                let (config, changes) = crate::companion::adjust_config(config, c.soft)?;
                for change in changes {
                    tracing::info!("companion mode: {change}");
                }
                Ok(config)
            }
            Self::Standalone | Self::Cluster => Ok(config),
        }
    }

    pub(super) const fn is_companion(self) -> bool {
        matches!(self, Self::Companion(_))
    }
}

/// The tasks a mode's assembler started, and what the eviction manager gets from them.
#[derive(Default)]
pub(super) struct Started {
    pub(super) pods: Option<tokio::task::JoinHandle<Result<(), crate::pods::RuntimeError>>>,
    pub(super) cluster: Option<tokio::task::JoinHandle<()>>,
    pub(super) companion: Vec<tokio::task::JoinHandle<()>>,
    /// The runtime whose images node-level reclaim deletes (where the enforcer runs pods).
    pub(super) node_reclaim: Option<Arc<CriRuntime>>,
    pub(super) image_gc: Option<Arc<crate::cri::images::ImageGc>>,
}

/// The daemon's stop, as many futures as its tasks need.
#[derive(Clone)]
pub(super) struct Stop(pub(super) tokio::sync::watch::Receiver<bool>);

impl Stop {
    /// Resolves once the daemon stops.
    pub(super) fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }
}

/// What the modes' assemblers share: the node as started.
pub(super) struct Assembly<'a> {
    pub(super) mode: Mode,
    pub(super) config: &'a Config,
    pub(super) opts: &'a DaemonOptions,
    pub(super) layout: &'a CgroupLayout,
    pub(super) caps: &'a Capabilities,
    pub(super) health: &'a Arc<Health>,
    pub(super) link: &'a NodeLink,
    pub(super) status: &'a StatusManager,
    pub(super) recorder: &'a crate::recorder::Recorder,
    pub(super) stop: &'a Stop,
}

impl Assembly<'_> {
    /// Standalone, the node's own events (cluster mode records them as it builds the Node's
    /// status; beside kubelet they are kubelet's).
    pub(super) fn record_node_events(&self) {
        tokio::spawn(crate::cluster::node_status::record_node_events(
            self.status.clone(),
            self.health.clone(),
            self.config.node_name(),
            self.config.node_status_update_frequency,
            self.recorder.clone(),
            self.stop.stopped(),
        ));
    }

    /// The eviction manager, every mode's: it acts on what the mode started.
    pub(super) fn eviction_manager(
        &self,
        observer: NodeObserver,
        kubepods: &str,
        started: &Started,
        levels: Option<crate::kernel::crossing::CrossingLevels>,
    ) -> Result<crate::eviction_manager::EvictionManager, DaemonError> {
        let config = self.config;
        Ok(crate::eviction_manager::EvictionManager {
            config: config.clone(),
            layout: observer.layout.clone(),
            cgroups: Arc::new(crate::cgroup::writer::KernelCgroups),
            tripwire: tripwire_cgroup(config, self.layout, kubepods, levels),
            stats: crate::stats::StatsCollector::spawn(observer).map_err(|source| {
                DaemonError::Thread {
                    what: "the stats collector",
                    source,
                }
            })?,
            link: self.link.clone(),
            status: self.status.clone(),
            housekeeping: config.enforcer.housekeeping_interval,
            node_reclaim: started.node_reclaim.clone(),
            image_gc: started.image_gc.clone(),
            health: self.health.clone(),
            events: self.recorder.clone(),
            companion: self.mode.is_companion(),
        })
    }

    /// Companion mode: kubelet's pods watched, their evictions made known (through the API
    /// server when there is one), the OOM scores aligned.
    pub(super) fn assemble_companion(
        &self,
        cri: Arc<CriRuntime>,
        mut events: Option<crate::cluster::EventQueue>,
    ) -> Started {
        let config = self.config;
        let mut companion_tasks = Vec::new();
        let reports =
            self.opts
                .kubeconfig
                .clone()
                .zip(events.take())
                .map(|(kubeconfig, events)| {
                    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                    let config = config.clone();
                    let stop = self.stop.stopped();
                    let state_dir = config.enforcer.state_dir.clone();
                    companion_tasks.push(tokio::spawn(async move {
                        crate::companion::run_api_writers(
                            &config, kubeconfig, state_dir, rx, events, stop,
                        )
                        .await;
                    }));
                    tx
                });
        let c = crate::companion::Companion {
            node_name: config.node_name(),
            cgroup_root: config.cgroup_root.clone(),
            driver: config.cgroup_driver,
            layout: self.layout.clone(),
            cri,
            kubeconfig: self.opts.kubeconfig.clone(),
            static_dir: config.enforcer.manifest_dir.clone(),
            state_dir: config.enforcer.state_dir.clone(),
            link: self.link.clone(),
            cgroups: Arc::new(crate::cgroup::writer::KernelCgroups),
            relist: crate::companion::RELIST,
            align_oom: true,
            health: Some(self.health.clone()),
        };
        companion_tasks.push(tokio::spawn(c.run(reports, self.stop.stopped())));
        Started {
            companion: companion_tasks,
            ..Started::default()
        }
    }

    /// Standalone and cluster mode: the pods run through their workers (with `run_pods`).
    pub(super) fn assemble_pods(
        &self,
        cri: Option<Arc<CriRuntime>>,
        enforcer: Option<Arc<crate::container_manager::Enforcer>>,
        run_pods: bool,
        capacity: &BTreeMap<String, Quantity>,
        allocatable: &BTreeMap<String, Quantity>,
    ) -> Started {
        let (Some(cri), Some(enforcer), true) = (cri, enforcer, run_pods) else {
            return Started::default();
        };
        let ro = self.run_pods_options(enforcer, capacity, allocatable);
        Started {
            image_gc: Some(ro.images.gc.clone()),
            node_reclaim: Some(cri.clone()),
            pods: Some(tokio::spawn(crate::pods::run_pods_with(
                cri,
                ro,
                self.status.clone(),
                self.stop.stopped(),
            ))),
            ..Started::default()
        }
    }

    /// The pod runtime's options: the node's configuration, its admission (the registered
    /// Node's labels, allocatable, the security policy).
    fn run_pods_options(
        &self,
        enforcer: Arc<crate::container_manager::Enforcer>,
        capacity: &BTreeMap<String, Quantity>,
        allocatable: &BTreeMap<String, Quantity>,
    ) -> RunPodsOptions {
        let config = self.config;
        let mut ro = RunPodsOptions::for_node(self.layout.clone(), self.caps);
        ro.node_name = config.node_name();
        ro.cri_socket = config.enforcer.cri_socket.clone();
        ro.cgroup_root = config.cgroup_root.clone();
        ro.cgroup_driver = config.cgroup_driver;
        ro.manifest_dir = config.enforcer.manifest_dir.clone();
        ro.state_dir = config.enforcer.state_dir.clone();
        ro.node.memory_capacity = capacity.get("memory").map_or(0, Quantity::value);
        ro.static_pods = self.opts.static_pods;
        ro.kubeconfig = self.opts.kubeconfig.clone();
        ro.resync = config.sync_frequency;
        ro.images = Arc::new(crate::cri::images::ImageManager::new(&image_options(
            config,
        )));
        ro.dns = crate::policy::dns::DnsSettings {
            cluster_dns: config.cluster_dns.clone(),
            cluster_domain: config.cluster_domain.clone(),
            resolv_conf: config.resolv_conf.clone(),
        };
        ro.enforce = enforcer;
        ro.link = self.link.clone();
        ro.health = self.health.clone();
        ro.events = self.recorder.clone();
        ro.admission = Some(Admission {
            node: admission::Node {
                name: ro.node_name.clone(),
                // The registered Node's labels (cluster mode writes the same).
                labels: crate::cluster::node_status::node_labels(
                    &ro.node_name,
                    &config.node_labels,
                ),
                taints: Vec::new(),
                allocatable: allocatable.clone(),
            },
            security: SecurityPolicy {
                allow_privileged: config.enforcer.allow_privileged,
                allow_host_namespaces: config.enforcer.allow_host_namespaces,
                allow_host_pid: config.enforcer.allow_host_pid,
                allow_host_ipc: config.enforcer.allow_host_ipc,
                allow_host_paths: config.enforcer.allow_host_paths,
                sysctls: config.sysctl_allowlist(),
                apparmor_enabled: self.caps.apparmor,
            },
        });
        ro
    }

    /// Cluster mode: node, lease and pod status written back to the API server (beside
    /// kubelet: only the companion's writers).
    pub(super) fn assemble_cluster(
        &self,
        events: Option<crate::cluster::EventQueue>,
        capacity: &BTreeMap<String, Quantity>,
        allocatable: &BTreeMap<String, Quantity>,
        node_reclaim: Option<Arc<CriRuntime>>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let config = self.config;
        self.opts
            .kubeconfig
            .clone()
            .zip(events)
            .map(|(kubeconfig, events)| {
                crate::cluster::spawn_for_daemon(
                    config,
                    crate::cluster::DaemonStart {
                        kubeconfig,
                        resources: crate::cluster::NodeResources {
                            capacity: capacity.clone(),
                            allocatable: allocatable.clone(),
                        },
                        runtime: node_reclaim,
                        events,
                        link: self.link.clone(),
                    },
                    self.status.clone(),
                    self.health.clone(),
                    self.stop.stopped(),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--companion` decides the mode whatever else is given; then `--kubeconfig`.
    #[test]
    fn the_mode_is_told_once_from_the_flags() {
        let opts = |companion: Option<CompanionMode>, kubeconfig: Option<&str>| DaemonOptions {
            config: crate::config::load(&crate::config::ConfigArgs::default())
                .expect("config")
                .config,
            watches: Vec::new(),
            run_pods: true,
            static_pods: false,
            kubeconfig: kubeconfig.map(std::path::PathBuf::from),
            companion,
        };
        let soft = CompanionMode { soft: true };
        for (companion, kubeconfig, mode) in [
            (None, None, Mode::Standalone),
            (None, Some("/k"), Mode::Cluster),
            (Some(soft), None, Mode::Companion(soft)),
            (Some(soft), Some("/k"), Mode::Companion(soft)),
        ] {
            let m = Mode::of(&opts(companion, kubeconfig));
            assert_eq!(m, mode);
            assert_eq!(m.is_companion(), companion.is_some());
        }
    }
}
