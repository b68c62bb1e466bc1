//! The kernel side of the daemon: probe what the kernel offers, load and attach the eBPF
//! programs, read their ring buffer, and fall back to eventfd / PSI / polling sources that
//! produce the same signal stream when eBPF cannot load.

pub mod ebpf;
pub mod fallback;
pub mod probe;

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::mpsc;

pub use probe::Capabilities;

use crate::{
    cgroup::{CgroupError, CgroupLayout},
    signal::{PipelineStats, Signal, SourceKind},
};

/// Errors of the kernel module.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("this binary was built without the eBPF object (AYA_BUILD_SKIP)")]
    NoObject,
    #[error("loading the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("eBPF program {program}: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("eBPF map {map}: {what}")]
    Map { map: &'static str, what: String },
    #[error("mounting tracefs at {path}: {source}")]
    Tracefs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("signal source {signal_source:?} is not available here: {why}")]
    Unavailable {
        signal_source: SourceKind,
        why: String,
    },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Which source to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SourceChoice {
    /// eBPF, else the best fallback for this cgroup layout.
    #[default]
    Auto,
    /// Exactly this source, or an error.
    Only(SourceKind),
}

/// A memory cgroup the fallback sources watch (eBPF sees every cgroup without being told).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watch {
    /// Absolute directory of the cgroup (in the memory controller's hierarchy).
    pub cgroup: PathBuf,
    /// Usage threshold in bytes; `None`: 90 % of the cgroup's memory limit.
    pub threshold_bytes: Option<u64>,
}

/// How to start the signal pipeline.
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    pub source: SourceChoice,
    pub watches: Vec<Watch>,
    /// Minimum time between two reclaim/fork records of one cgroup (eBPF).
    pub burst_window: Duration,
    /// Tgid whose getppid() calls the probe program reports (benchmarks; 0 = off).
    pub probe_tgid: u32,
    /// Period of the polling source.
    pub poll_interval: Duration,
    /// Signals buffered between the sources and the consumer.
    pub channel_capacity: usize,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            source: SourceChoice::Auto,
            watches: Vec::new(),
            burst_window: Duration::from_nanos(enforcer_common::DEFAULT_BURST_WINDOW_NS),
            probe_tgid: 0,
            poll_interval: Duration::from_secs(10),
            channel_capacity: 65_536,
        }
    }
}

/// A running signal pipeline.
pub struct Pipeline {
    /// The source in use.
    pub source: SourceKind,
    /// Why this source was chosen (for the log).
    pub reason: String,
    pub stats: Arc<PipelineStats>,
    pub signals: mpsc::Receiver<Signal>,
    _guard: Guard,
}

enum Guard {
    Ebpf(tokio::task::JoinHandle<()>),
    Threads(fallback::Stop),
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        match &self._guard {
            Guard::Ebpf(h) => h.abort(),
            Guard::Threads(stop) => stop.stop(),
        }
    }
}

/// Starts the signal pipeline with the chosen (or best available) source.
pub fn start(
    opts: &PipelineOptions,
    caps: &Capabilities,
    layout: &CgroupLayout,
) -> Result<Pipeline, KernelError> {
    let stats = Arc::new(PipelineStats::default());
    let (tx, rx) = mpsc::channel(opts.channel_capacity.max(1));
    let fallback_kind = || fallback::best_for(layout, caps);
    let (source, reason) = match opts.source {
        SourceChoice::Only(SourceKind::Ebpf) => (SourceKind::Ebpf, "requested".to_owned()),
        SourceChoice::Only(k) => (k, "requested".to_owned()),
        SourceChoice::Auto => (SourceKind::Ebpf, "eBPF preferred".to_owned()),
    };
    if source == SourceKind::Ebpf {
        match ebpf::start(opts, layout, tx.clone(), stats.clone()) {
            Ok(handle) => {
                return Ok(Pipeline {
                    source,
                    reason,
                    stats,
                    signals: rx,
                    _guard: Guard::Ebpf(handle),
                });
            }
            Err(e) if opts.source == SourceChoice::Auto => {
                let k = fallback_kind();
                let reason = format!("eBPF unavailable ({e}); falling back to {k:?}");
                let stop = fallback::start(k, opts, caps, layout, tx, stats.clone())?;
                return Ok(Pipeline {
                    source: k,
                    reason,
                    stats,
                    signals: rx,
                    _guard: Guard::Threads(stop),
                });
            }
            Err(e) => return Err(e),
        }
    }
    let stop = fallback::start(source, opts, caps, layout, tx, stats.clone())?;
    Ok(Pipeline {
        source,
        reason,
        stats,
        signals: rx,
        _guard: Guard::Threads(stop),
    })
}
