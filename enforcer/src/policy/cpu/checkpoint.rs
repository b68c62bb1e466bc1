//! The static policy's state and its checkpoint, after kubelet's
//! `pkg/kubelet/cm/cpumanager/state` (`state.go`, `checkpoint.go`: `CPUManagerCheckpointV2`,
//! `state_checkpoint.go`) and `pkg/kubelet/checkpointmanager/checksum`: the shared pool and
//! the exclusive assignments, encoded as kubelet's `cpu_manager_state` JSON with its FNV-32a
//! checksum of Go's `spew` print, decoded and verified. Pure: the caller reads and writes the
//! file ([`crate::container_manager`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CpuError, CpuSet};

/// The static policy's state: the shared pool and the exclusive assignments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuState {
    /// The shared (default) pool.
    pub default_cpu_set: CpuSet,
    /// pod uid -> container -> exclusive CPUs.
    pub assignments: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

/// Kubelet's `cpu_manager_state` file (`CPUManagerCheckpointV2`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// `static` or `none`.
    #[serde(rename = "policyName")]
    pub policy_name: String,
    /// The shared pool.
    #[serde(rename = "defaultCpuSet")]
    pub default_cpu_set: String,
    /// pod uid -> container -> cpuset.
    #[serde(rename = "entries", default, skip_serializing_if = "no_entries")]
    pub entries: Option<BTreeMap<String, BTreeMap<String, String>>>,
    /// FNV-32a of the checkpoint as Go's spew prints it, with checksum 0.
    pub checksum: u64,
}

/// Go's `omitempty` on the entries map: absent when empty.
fn no_entries(e: &Option<BTreeMap<String, BTreeMap<String, String>>>) -> bool {
    e.as_ref().is_none_or(BTreeMap::is_empty)
}

impl Checkpoint {
    /// From a state, with its checksum.
    #[must_use]
    pub fn from_state(policy: &str, state: &CpuState) -> Self {
        let entries = state
            .assignments
            .iter()
            .map(|(uid, m)| {
                (
                    uid.clone(),
                    m.iter().map(|(c, s)| (c.clone(), s.to_string())).collect(),
                )
            })
            .collect();
        let mut cp = Self {
            policy_name: policy.to_owned(),
            default_cpu_set: state.default_cpu_set.to_string(),
            entries: Some(entries),
            checksum: 0,
        };
        cp.checksum = cp.compute_checksum();
        cp
    }

    /// The text kubelet hashes: `spew` `%#v` of `*state.CPUManagerCheckpoint` (its v2 format;
    /// `CPUManagerCheckpointV2` is an alias, so reflection names it so), sorted keys, map
    /// values untyped, the checksum field 0. Kubelet's entries map is never nil (it reads into
    /// a checkpoint made with an empty map), so absent entries hash as `map[]`.
    #[must_use]
    pub fn spew(&self) -> String {
        let entries = match &self.entries {
            None => "map[]".to_owned(),
            Some(e) => {
                let inner: Vec<String> = e
                    .iter()
                    .map(|(uid, m)| {
                        let cs: Vec<String> = m.iter().map(|(c, s)| format!("{c}:{s}")).collect();
                        format!("{uid}:map[{}]", cs.join(" "))
                    })
                    .collect();
                format!("map[{}]", inner.join(" "))
            }
        };
        format!(
            "(*state.CPUManagerCheckpoint){{PolicyName:(string){} DefaultCPUSet:(string){} Entries:(map[string]map[string]string){} Checksum:(checksum.Checksum)0}}",
            self.policy_name, self.default_cpu_set, entries
        )
    }

    fn compute_checksum(&self) -> u64 {
        crate::policy::checksum::of_spew(&self.spew())
    }

    /// Parses and verifies a checkpoint file's JSON.
    pub fn from_json(text: &str) -> Result<Self, CpuError> {
        let cp: Self =
            serde_json::from_str(text).map_err(|e| CpuError::Checkpoint(e.to_string()))?;
        if cp.checksum != 0 && cp.checksum != cp.compute_checksum() {
            return Err(CpuError::Checkpoint(
                "checkpoint is corrupted: checksum mismatch".into(),
            ));
        }
        Ok(cp)
    }

    /// The JSON to write.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The state it holds.
    pub fn to_state(&self) -> Result<CpuState, CpuError> {
        let mut assignments = BTreeMap::new();
        for (uid, m) in self.entries.iter().flatten() {
            let mut cs = BTreeMap::new();
            for (c, s) in m {
                cs.insert(c.clone(), CpuSet::parse(s)?);
            }
            assignments.insert(uid.clone(), cs);
        }
        Ok(CpuState {
            default_cpu_set: CpuSet::parse(&self.default_cpu_set)?,
            assignments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_of_checkpoints_a_kubelet_wrote() {
        // A cpu_manager_state file written by a real kubelet (quoted in public notes on the
        // CPU manager): our spew + FNV-32a gives its checksum, and a changed byte is refused.
        let text = r#"{"policyName":"static","defaultCpuSet":"0,2-12,14-23","entries":{"235148fe-393f-47a8-a17d-bd55bc1a836b":{"cgroup1-0":"1,13"}},"checksum":1552716370}"#;
        let cp = Checkpoint::from_json(text).unwrap();
        assert_eq!(cp.checksum, 1_552_716_370);
        let state = cp.to_state().unwrap();
        assert_eq!(
            Checkpoint::from_state("static", &state).checksum,
            1_552_716_370
        );
        assert!(Checkpoint::from_json(&text.replace("1,13", "1,14")).is_err());
        // Without entries (kubelet's none policy writes none): hashed as an empty map, the
        // same as written with an empty map.
        let empty = Checkpoint::from_state(
            "none",
            &CpuState {
                default_cpu_set: CpuSet::default(),
                assignments: BTreeMap::new(),
            },
        );
        let json = format!(
            r#"{{"policyName":"none","defaultCpuSet":"","checksum":{}}}"#,
            empty.checksum
        );
        assert!(Checkpoint::from_json(&json).is_ok(), "{json}");
        // Written as kubelet writes it: an empty map is omitted.
        assert_eq!(empty.to_json(), json);
    }
}
