//! The daemon's main loop (`enforcer run`): probe the kernel, start the signal pipeline, serve
//! metrics, and act on signals until shut down.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use crate::{
    cgroup::CgroupLayout,
    kernel::{self, Capabilities, PipelineOptions, SourceChoice, Watch},
    server,
    signal::{Signal, SignalKind},
};

/// Options of `enforcer run` that the daemon loop needs.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    pub source: SourceChoice,
    pub watches: Vec<PathBuf>,
    pub http_address: SocketAddr,
    pub poll_interval: Duration,
}

/// Errors that stop the daemon at start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Kernel(#[from] kernel::KernelError),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    #[error("HTTP server on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Runs until `shutdown` resolves.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    let layout = CgroupLayout::discover()?;
    if let Err(e) = kernel::ebpf::ensure_tracefs() {
        tracing::warn!(error = %e, "tracefs is not mounted and could not be mounted");
    }
    let caps = Capabilities::probe(&layout);
    tracing::info!(capabilities = %caps.summary(), "kernel probed");
    if !caps.cap_sys_resource {
        tracing::warn!(
            "no CAP_SYS_RESOURCE: negative oom_score_adj values are clamped and PSI windows widened to 2 s"
        );
    }
    let pipeline_opts = PipelineOptions {
        source: opts.source,
        watches: opts
            .watches
            .iter()
            .map(|c| Watch {
                cgroup: c.clone(),
                threshold_bytes: None,
            })
            .collect(),
        poll_interval: opts.poll_interval,
        ..PipelineOptions::default()
    };
    let mut pipeline = kernel::start(&pipeline_opts, &caps, &layout)?;
    tracing::info!(source = ?pipeline.source, reason = %pipeline.reason, "signal pipeline started");

    let stats = pipeline.stats.clone();
    let pages = Arc::new(server::Pages {
        metrics: Box::new(move || stats.render()),
        capabilities: serde_json::to_string(&caps).unwrap_or_default(),
    });
    let (addr, _server) = server::serve(opts.http_address, pages)
        .await
        .map_err(|source| DaemonError::Http {
            addr: opts.http_address,
            source,
        })?;
    tracing::info!(%addr, "serving /metrics, /healthz, /capabilities");

    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            s = pipeline.signals.recv() => match s {
                Some(s) => log_signal(&s),
                None => {
                    tracing::error!("signal pipeline ended");
                    break;
                }
            },
        }
    }
    tracing::info!("shutting down");
    Ok(())
}

fn log_signal(s: &Signal) {
    let cgroup = s.cgroup.as_deref().unwrap_or("");
    let pod = s.pod_uid.as_deref().unwrap_or("");
    match s.kind {
        SignalKind::CgroupCreated
        | SignalKind::CgroupRemoved
        | SignalKind::Fork
        | SignalKind::Probe => {
            tracing::debug!(signal = ?s.kind, cgroup, pod, count = s.count, "signal");
        }
        _ => tracing::info!(
            signal = ?s.kind,
            source = ?s.source,
            cgroup,
            pod,
            pid = s.pid,
            count = s.count,
            delay_us = s.delay_ns().map(|d| d / 1000),
            "signal"
        ),
    }
}
