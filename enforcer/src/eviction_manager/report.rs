//! What the eviction manager reports besides its decisions: the node's pressure conditions
//! for the status file, `eviction.json` and `cgroups.json` for `enforcer status`.

use std::time::Duration;

use super::EvictionManager;
use crate::{
    policy::eviction::{NodeCondition, State},
    status_manager::{Condition as StatusCondition, NodeRecord},
};

/// The node's pressure conditions for the status file: each `True` or `False`.
pub(super) fn node_record(conditions: &[NodeCondition]) -> NodeRecord {
    let conditions = [
        NodeCondition::MemoryPressure,
        NodeCondition::DiskPressure,
        NodeCondition::PidPressure,
    ]
    .into_iter()
    .map(|c| StatusCondition::new(c.as_str(), conditions.contains(&c)))
    .collect();
    NodeRecord { conditions }
}

/// What the manager last reported: when `eviction.json` was written and with which
/// conditions, the cgroup-value ledger's generation in `cgroups.json`, and the signal delays
/// per source that `enforcer status` shows.
#[derive(Debug, Default)]
pub(super) struct Reporter {
    reported: Option<(tokio::time::Instant, Vec<NodeCondition>)>,
    cgroups_written: Option<u64>,
    pub(super) delays: crate::node_report::Delays,
}

impl EvictionManager {
    /// Writes `eviction.json` for `enforcer status` (`node_report`): at most once a second,
    /// and at once when the conditions change.
    pub(super) fn report(&self, state: &State, reporter: &mut Reporter) {
        let now = tokio::time::Instant::now();
        if reporter.reported.as_ref().is_some_and(|(at, conds)| {
            now.duration_since(*at) < Duration::from_secs(1) && *conds == state.conditions
        }) {
            return;
        }
        reporter.reported = Some((now, state.conditions.clone()));
        let met: Vec<usize> = state.first_observed.keys().copied().collect();
        let nanos = crate::clock::now_nanos();
        let report = crate::node_report::Report {
            updated: crate::clock::rfc3339(nanos),
            updated_ns: nanos,
            conditions: state.conditions.iter().map(ToString::to_string).collect(),
            thresholds: crate::node_report::threshold_lines(
                &self.config.eviction,
                &state.last_observations,
                &met,
            ),
            sources: reporter.delays.summary(),
        };
        if let Err(e) = crate::node_report::write(&self.config.enforcer.state_dir, &report) {
            tracing::debug!(error = %e, "writing eviction.json");
        }
        let (generation, files) = crate::cgroup::writer::written();
        if reporter.cgroups_written != Some(generation) {
            reporter.cgroups_written = Some(generation);
            if let Err(e) =
                crate::node_report::write_cgroups(&self.config.enforcer.state_dir, &files)
            {
                tracing::debug!(error = %e, "writing cgroups.json");
            }
        }
    }
}
