//! The pod sources as the pod loop holds them: the manifest directory scanned by its own task
//! on the blocking pool ([`DirFeed`]), the API-server watch ([`ApiFeed`]), and the next batch
//! of events from either ([`next_pod_events`]), with whether each has listed completely yet
//! (orphan removal waits for both).

use std::{path::PathBuf, time::Duration};

use tokio::sync::mpsc;

use crate::sources::{ManifestDir, SourceEvent, apiserver};

/// The API-server source as the pod loop holds it.
pub(crate) struct ApiFeed {
    rx: mpsc::UnboundedReceiver<SourceEvent>,
    /// Its first complete list arrived (orphan removal waits for it).
    pub(crate) synced: bool,
    _task: tokio::task::JoinHandle<()>,
}

impl ApiFeed {
    pub(crate) fn start(
        kubeconfig: PathBuf,
        node_name: &str,
        health: std::sync::Arc<crate::health::Health>,
        status: crate::status_manager::StatusManager,
    ) -> Self {
        let (rx, task) =
            apiserver::spawn(kubeconfig, node_name.to_owned(), Some(health), Some(status));
        Self {
            rx,
            synced: false,
            _task: task,
        }
    }
}

/// The manifest directory as the pod loop holds it: scanned (read and parsed) by its own task,
/// on the blocking pool, every poll period; whatever one file holds, the pod loop only
/// receives finished batches of events.
pub(crate) struct DirFeed {
    rx: mpsc::Receiver<Vec<SourceEvent>>,
    /// Its first complete scan arrived (orphan removal waits for it).
    pub(crate) synced: bool,
    /// The scanning task still runs.
    open: bool,
    /// Dropped to end the scanning task before its next scan (also when the feed is).
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl DirFeed {
    pub(crate) fn start(dir: ManifestDir, poll: Duration) -> Self {
        let (tx, rx) = mpsc::channel(4);
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut dir = Some(dir);
            let mut tick = tokio::time::interval(poll);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stopped => return,
                    _ = tick.tick() => {}
                }
                let Some(mut d) = dir.take() else { return };
                let Ok((d, events)) = tokio::task::spawn_blocking(move || {
                    let events = d.scan();
                    (d, events)
                })
                .await
                else {
                    tracing::error!("the manifest directory scan panicked; the source stops");
                    return;
                };
                dir = Some(d);
                if (!events.is_empty() && tx.send(events).await.is_err()) || tx.is_closed() {
                    return;
                }
            }
        });
        Self {
            rx,
            synced: false,
            open: true,
            stop,
            task,
        }
    }

    /// Ends the scanning task and waits for it: a scan under way finishes, no other starts,
    /// so nothing (the uid ownership file) is written once the pod runtime has stopped.
    pub(crate) async fn stop(self) {
        let Self { stop, task, .. } = self;
        drop(stop);
        let _ = task.await;
    }
}

/// The next batch of pod source events: a manifest-directory scan, or what the API-server
/// source sent meanwhile. Cancel-safe (both are channel receives).
pub(crate) async fn next_pod_events(
    dir: &mut DirFeed,
    api: &mut Option<ApiFeed>,
) -> Vec<SourceEvent> {
    let from_api = async {
        match api.as_mut() {
            Some(feed) => feed.rx.recv().await,
            None => std::future::pending().await,
        }
    };
    let first = tokio::select! {
        events = dir.rx.recv(), if dir.open => {
            let Some(events) = events else {
                tracing::error!("the manifest directory source stopped");
                dir.open = false;
                return Vec::new();
            };
            dir.synced |= events.iter().any(|e| matches!(e, SourceEvent::Synced));
            return events;
        }
        ev = from_api => ev,
    };
    let Some(feed) = api.as_mut() else {
        return Vec::new();
    };
    let Some(first) = first else {
        tracing::warn!("the API-server pod source stopped");
        *api = None;
        return Vec::new();
    };
    let mut out = vec![first];
    while let Ok(ev) = feed.rx.try_recv() {
        out.push(ev);
    }
    feed.synced |= out.iter().any(|e| matches!(e, SourceEvent::Synced));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: u-1}\nspec:\n  containers: [{name: c, image: 'busybox:local'}]\n";

    /// Once stopped, the manifest scans are over: a manifest directory emptied afterwards
    /// writes no uid ownership file (a scan after the stop would record the empty directory
    /// and recreate a state directory already removed).
    #[tokio::test]
    async fn a_stopped_dir_feed_scans_and_writes_nothing_more() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let manifests = tmp.path().join("manifests");
        std::fs::create_dir(&manifests).expect("mkdir");
        std::fs::write(manifests.join("web.yaml"), POD).expect("write");
        let state = tmp.path().join("state");
        let owners = state.join(crate::sources::UID_OWNERS_FILE);
        let dir = ManifestDir::new(&manifests, "n").with_ownership_file(owners.clone());
        let mut feed = DirFeed::start(dir, Duration::from_millis(10));
        let events = next_pod_events(&mut feed, &mut None).await;
        assert!(!events.is_empty(), "the first scan's events");
        assert!(owners.exists(), "the pod's uid ownership persisted");
        feed.stop().await;
        std::fs::remove_dir_all(&state).expect("rm state");
        std::fs::remove_file(manifests.join("web.yaml")).expect("rm manifest");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !state.exists(),
            "a scan ran after the stop and wrote {}",
            owners.display()
        );
    }
}
