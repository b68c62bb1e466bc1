//! The memory manager's checkpoint (`state/checkpoint.go`: `MemoryManagerCheckpoint`, as 1.35
//! writes it; `state_checkpoint.go`): `{"policyName":"Static","machineState":{...},
//! "entries":{...},"checksum":N}`, the checksum being kubelet's FNV-32a of the object printed
//! by spew ([`crate::policy::checksum`]). Pure: the caller reads and writes the file.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::{Deserialize, Serialize};

use super::{ContainerMemoryAssignments, MemoryError, MemoryState, NumaNodeMap};

/// Kubelet's `memory_manager_state` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// `Static` or `None`.
    #[serde(rename = "policyName")]
    pub policy_name: String,
    /// `machineState`.
    #[serde(rename = "machineState", default)]
    pub machine_state: NumaNodeMap,
    /// `entries` (omitted when empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub entries: ContainerMemoryAssignments,
    /// FNV-32a of the spew print with checksum 0.
    pub checksum: u64,
}

impl Checkpoint {
    /// From a state, with its checksum.
    #[must_use]
    pub fn from_state(policy: &str, state: &MemoryState) -> Self {
        let mut cp = Self {
            policy_name: policy.to_owned(),
            machine_state: state.machine_state.clone(),
            entries: state.assignments.clone(),
            checksum: 0,
        };
        cp.checksum = crate::policy::checksum::of_spew(&cp.spew());
        cp
    }

    /// The text kubelet hashes: spew's `%#v` of `*state.MemoryManagerCheckpoint`, checksum 0.
    #[must_use]
    pub fn spew(&self) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "(*state.MemoryManagerCheckpoint){{PolicyName:(string){} MachineState:(state.NUMANodeMap)map[",
            self.policy_name
        );
        for (i, (id, node)) in self.machine_state.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            let _ = write!(
                s,
                "{id}:<*>{{NumberOfAssignments:(int){} MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[",
                node.number_of_assignments
            );
            for (j, (name, t)) in node.memory_map.iter().enumerate() {
                if j > 0 {
                    s.push(' ');
                }
                let _ = write!(
                    s,
                    "{name}:<*>{{TotalMemSize:(uint64){} SystemReserved:(uint64){} Allocatable:(uint64){} Reserved:(uint64){} Free:(uint64){}}}",
                    t.total_mem_size, t.system_reserved, t.allocatable, t.reserved, t.free
                );
            }
            let _ = write!(s, "] Cells:([]int){}}}", ints(&node.cells));
        }
        s.push_str("] Entries:(state.ContainerMemoryAssignments)map[");
        for (i, (pod, containers)) in self.entries.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            let _ = write!(s, "{pod}:map[");
            for (j, (name, blocks)) in containers.iter().enumerate() {
                if j > 0 {
                    s.push(' ');
                }
                let _ = write!(s, "{name}:[");
                for (k, b) in blocks.iter().enumerate() {
                    if k > 0 {
                        s.push(' ');
                    }
                    let _ = write!(
                        s,
                        "{{NUMAAffinity:([]int){} Type:(v1.ResourceName){} Size:(uint64){}}}",
                        ints(&b.numa_affinity),
                        b.resource,
                        b.size
                    );
                }
                s.push(']');
            }
            s.push(']');
        }
        s.push_str("] Checksum:(checksum.Checksum)0}");
        s
    }

    /// Parses and verifies a checkpoint file's JSON (a zero checksum is accepted, as kubelet
    /// accepts it from old files).
    pub fn from_json(text: &str) -> Result<Self, MemoryError> {
        let cp: Self =
            serde_json::from_str(text).map_err(|e| MemoryError::Checkpoint(e.to_string()))?;
        if cp.checksum != 0 && cp.checksum != crate::policy::checksum::of_spew(&cp.spew()) {
            return Err(MemoryError::Checkpoint("checkpoint is corrupted".into()));
        }
        Ok(cp)
    }

    /// The JSON to write.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The state it holds, for the configured policy (`restoreState`: another policy's
    /// checkpoint is refused).
    pub fn to_state(&self, configured: &str) -> Result<MemoryState, MemoryError> {
        if self.policy_name != configured {
            return Err(MemoryError::PolicyChanged {
                configured: configured.to_owned(),
                checkpoint: self.policy_name.clone(),
            });
        }
        Ok(MemoryState {
            machine_state: self.machine_state.clone(),
            assignments: self.entries.clone(),
        })
    }
}

/// spew's `[0 1]` of a `[]int`.
fn ints(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(" "))
}

#[cfg(test)]
mod tests {
    //! After `state/state_checkpoint_test.go` (`TestCheckpointStateRestore`, its 1.35-format
    //! cases) and `TestCheckpointStateStore`.
    use super::*;
    use crate::policy::memory::{Block, MemoryTable, NumaNodeState};

    const V1: &str = r#"{
        "policyName":"static",
        "machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},
        "entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},
        "checksum": 4215593881
    }"#;

    fn expected() -> MemoryState {
        let mut state = MemoryState::default();
        state.machine_state.insert(
            0,
            NumaNodeState {
                number_of_assignments: 0,
                memory_map: [(
                    "memory".to_owned(),
                    MemoryTable {
                        total_mem_size: 2048,
                        system_reserved: 512,
                        allocatable: 1536,
                        reserved: 512,
                        free: 1024,
                    },
                )]
                .into(),
                cells: vec![],
            },
        );
        state.set_blocks(
            "pod",
            "container1",
            vec![Block {
                numa_affinity: vec![0],
                resource: "memory".into(),
                size: 512,
            }],
        );
        state
    }

    #[test]
    fn restore_valid_checkpoint() {
        // "Restore checkpoint from v1": kubelet's checksum of a 1.35-format file.
        let cp = Checkpoint::from_json(V1).unwrap();
        assert_eq!(cp.to_state("static").unwrap(), expected());
        assert_eq!(
            Checkpoint::from_state("static", &expected()).checksum,
            4_215_593_881
        );
        // "... with checksum zeroed": accepted.
        let zero = V1.replace("4215593881", "0");
        assert_eq!(
            Checkpoint::from_json(&zero)
                .unwrap()
                .to_state("static")
                .unwrap(),
            expected()
        );
    }

    #[test]
    fn refusals() {
        // "Fail to restore checkpoint from v1 with invalid checksum" (its numaAffinity key is
        // also unknown, so the affinity reads empty and the checksum cannot match).
        let bad = V1
            .replace("4215593881", "101010")
            .replace("numaAffinity", "affinity");
        assert_eq!(
            Checkpoint::from_json(&bad).unwrap_err().to_string(),
            "checkpoint is corrupted"
        );
        // "Fail to restore checkpoint with invalid JSON".
        assert!(Checkpoint::from_json("{").is_err());
        // "Fail to restore checkpoint with invalid policy name".
        assert_eq!(
            Checkpoint::from_json(V1)
                .unwrap()
                .to_state("none")
                .unwrap_err()
                .to_string(),
            r#"[memorymanager] configured policy "none" differs from state checkpoint policy "static""#
        );
    }

    #[test]
    fn store_then_restore() {
        // TestCheckpointStateStore: what is written reads back equal.
        let cp = Checkpoint::from_state("Static", &expected());
        let json = cp.to_json();
        assert!(json.starts_with(r#"{"policyName":"Static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},"checksum":"#), "{json}");
        assert_eq!(Checkpoint::from_json(&json).unwrap(), cp);
        // Empty entries are omitted, as Go's omitempty does.
        let none = Checkpoint::from_state("None", &MemoryState::default());
        assert_eq!(
            none.to_json(),
            format!(
                r#"{{"policyName":"None","machineState":{{}},"checksum":{}}}"#,
                none.checksum
            )
        );
        assert!(Checkpoint::from_json(&none.to_json()).is_ok());
    }
}
