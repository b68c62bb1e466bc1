//! The crossing thread: the signal pipeline's readers (the eBPF ring buffer's pump) and the
//! eviction manager on one OS thread of their own, with a single-threaded tokio runtime, at
//! real-time priority (`SCHED_FIFO`) where the kernel allows it. A crossing's record is read,
//! decided on and acted upon on this thread without a hop to another: no pod worker, HTTP
//! handler or API call of the daemon's main runtime runs before it, and no thread wakeup
//! stands between the ring buffer and the SIGKILL.

use std::{future::Future, pin::Pin, sync::Arc};

use tokio::sync::oneshot;

use super::EvictionManager;
use crate::{
    cgroup::CgroupLayout,
    health::Heartbeat,
    kernel::{
        self, Capabilities, KernelError, PipelineOptions,
        realtime::{PRIORITY, make_realtime},
    },
    signal::{PipelineStats, SourceKind},
};

/// How the crossing thread is scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scheduling {
    /// `SCHED_FIFO` at this priority.
    RealTime(i32),
    /// The ordinary scheduler; why real time was refused.
    Normal(String),
}

impl std::fmt::Display for Scheduling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::RealTime(p) => write!(f, "SCHED_FIFO priority {p}"),
            Self::Normal(why) => write!(f, "the ordinary scheduler ({why})"),
        }
    }
}

/// What the daemon learns of the pipeline started on the crossing thread.
#[derive(Clone, Debug)]
pub struct PipelineInfo {
    pub source: SourceKind,
    pub reason: String,
    pub stats: Arc<PipelineStats>,
    pub heartbeats: Vec<Arc<Heartbeat>>,
    pub scheduling: Scheduling,
    /// The crossing check on the memory charge path (eBPF).
    pub crossing: crate::kernel::ebpf::Crossing,
}

type Job = (EvictionManager, Pin<Box<dyn Future<Output = ()> + Send>>);

/// The crossing thread, its pipeline started, waiting for its eviction manager
/// ([`Runner::run`]); dropped without one, the thread ends and its pipeline stops.
pub struct Runner {
    job: oneshot::Sender<Job>,
    done: oneshot::Receiver<()>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").finish_non_exhaustive()
    }
}

impl Runner {
    /// Runs `manager` on the crossing thread until `stop` resolves; returns when it ended.
    pub async fn run(
        self,
        manager: EvictionManager,
        stop: impl Future<Output = ()> + Send + 'static,
    ) {
        if self.job.send((manager, Box::pin(stop))).is_ok() {
            let _ = self.done.await;
        }
    }
}

/// Why the crossing thread could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("starting the crossing thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error(transparent)]
    Pipeline(#[from] KernelError),
    #[error("the crossing thread ended before its pipeline started")]
    Ended,
}

/// Starts the crossing thread and the signal pipeline on it (`opts`, as [`kernel::start`]),
/// at real-time priority when `realtime` and the kernel allow it.
pub async fn start(
    opts: PipelineOptions,
    caps: Capabilities,
    layout: CgroupLayout,
    realtime: bool,
) -> Result<(PipelineInfo, Runner), StartError> {
    let (info_tx, info_rx) = oneshot::channel::<Result<PipelineInfo, KernelError>>();
    let (job_tx, job_rx) = oneshot::channel::<Job>();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("crossing".to_owned())
        .spawn(move || {
            let scheduling = if realtime {
                match make_realtime(PRIORITY) {
                    Ok(()) => Scheduling::RealTime(PRIORITY),
                    Err(e) => Scheduling::Normal(format!("SCHED_FIFO refused: {e}")),
                }
            } else {
                Scheduling::Normal("real time turned off".to_owned())
            };
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = info_tx.send(Err(KernelError::Io {
                        what: "the crossing thread's runtime".into(),
                        source: e,
                    }));
                    return;
                }
            };
            rt.block_on(async move {
                let pipeline = match kernel::start(&opts, &caps, &layout) {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = info_tx.send(Err(e));
                        return;
                    }
                };
                let info = PipelineInfo {
                    source: pipeline.source,
                    reason: pipeline.reason.clone(),
                    stats: pipeline.stats.clone(),
                    heartbeats: pipeline.heartbeats.clone(),
                    scheduling,
                    crossing: pipeline.crossing.clone(),
                };
                if info_tx.send(Ok(info)).is_err() {
                    return;
                }
                // The pipeline's readers run while the manager is being built.
                if let Ok((manager, stop)) = job_rx.await {
                    manager.run(pipeline, stop).await;
                }
                let _ = done_tx.send(());
            });
        })
        .map_err(StartError::Thread)?;
    let info = info_rx.await.map_err(|_| StartError::Ended)??;
    Ok((
        info,
        Runner {
            job: job_tx,
            done: done_rx,
        },
    ))
}
