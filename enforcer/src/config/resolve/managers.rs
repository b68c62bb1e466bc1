//! The resource managers' settings beside the CPU manager's: `memoryManagerPolicy` (`None`,
//! `Static`), `reservedMemory` (per NUMA node; validated as kubelet's
//! `validateReservedMemoryConfiguration` does: memory or hugepages only, not zero, no
//! duplicate), `topologyManagerPolicy` and `topologyManagerScope`. The sum of `reservedMemory`
//! against node allocatable needs the machine, so it is checked when the memory manager
//! starts ([`crate::policy::memory::reserved::validate_reserved_memory`]).

use std::collections::BTreeSet;

use super::{Namer, Sourced, key};
use crate::{
    config::{ConfigArgs, ConfigError, KubeletConfiguration},
    policy::{
        memory::{MemoryManagerPolicy, MemoryReservation},
        topology::{Policy as TopologyPolicy, Scope},
    },
    quantity::Quantity,
};

/// The validated settings.
pub(super) struct Managers {
    pub memory_manager_policy: MemoryManagerPolicy,
    pub reserved_memory: Vec<MemoryReservation>,
    pub topology_manager_policy: TopologyPolicy,
    pub topology_manager_scope: Scope,
}

/// Reservations as written: `(numa node, [(resource, quantity text)])`.
type RawReservations = Vec<(i32, Vec<(String, String)>)>;

/// A `--reserved-memory` value that is not `<numa node>:<resource>=<quantity>,...`.
#[derive(Debug, thiserror::Error)]
enum ReservedFlagError {
    #[error("{0:?} is not <numa node>:<resource>=<quantity>,...")]
    Entry(String),
    #[error("{0:?} is not a NUMA node number")]
    Node(String),
    #[error("{0:?} is not <resource>=<quantity>")]
    Pair(String),
}

/// `--reserved-memory 0:memory=1Gi,hugepages-2Mi=2Gi;1:memory=2Gi` (repeatable) as
/// `(numa node, [(resource, quantity text)])`.
fn parse_reserved_flag(values: &[String]) -> Result<RawReservations, ReservedFlagError> {
    let mut out = Vec::new();
    for part in values.iter().flat_map(|v| v.split(';')) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (node, limits) = part
            .split_once(':')
            .ok_or_else(|| ReservedFlagError::Entry(part.to_owned()))?;
        let node: i32 = node
            .trim()
            .parse()
            .map_err(|_| ReservedFlagError::Node(node.to_owned()))?;
        let mut pairs = Vec::new();
        for pair in limits.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| ReservedFlagError::Pair(pair.to_owned()))?;
            pairs.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        out.push((node, pairs));
    }
    Ok(out)
}

fn is_memory_type(name: &str) -> bool {
    name == "memory" || name.starts_with("hugepages-")
}

/// reservedMemory, validated: the flag's entries replace the file's.
fn reserved_memory(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<Vec<MemoryReservation>, ConfigError> {
    let (raw, from_flag): (RawReservations, bool) = if args.reserved_memory.is_empty() {
        let raw = doc
            .reserved_memory
            .iter()
            .flatten()
            .map(|r| {
                (
                    r.numa_node.unwrap_or(0),
                    r.limits
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.0.clone()))
                        .collect(),
                )
            })
            .collect();
        (raw, false)
    } else {
        let raw = parse_reserved_flag(&args.reserved_memory).map_err(|e| {
            n.invalid(
                key::RESERVED_MEMORY,
                true,
                args.reserved_memory.join(" "),
                e,
            )
        })?;
        (raw, true)
    };
    let mut reserved_memory = Vec::new();
    let mut seen = BTreeSet::new();
    for (node, limits) in raw {
        if node < 0 {
            return Err(n.invalid(
                key::RESERVED_MEMORY,
                from_flag,
                node.to_string(),
                "the NUMA node must not be negative",
            ));
        }
        let mut reservation = MemoryReservation {
            numa_node: node,
            ..MemoryReservation::default()
        };
        for (resource, text) in limits {
            let entry = || format!("{node}:{resource}={text}");
            if !is_memory_type(&resource) {
                return Err(n.invalid(
                    key::RESERVED_MEMORY,
                    from_flag,
                    entry(),
                    format!(
                        "the limit type {resource:?} for NUMA node {node} is not supported, only [memory hugepages-<HugePageSize>] is accepted"
                    ),
                ));
            }
            let q = Quantity::parse(&text)
                .map_err(|e| n.invalid(key::RESERVED_MEMORY, from_flag, entry(), e))?;
            if q.signum() < 0 {
                return Err(n.invalid(
                    key::RESERVED_MEMORY,
                    from_flag,
                    entry(),
                    "must not be negative",
                ));
            }
            if q.is_zero() {
                return Err(n.invalid(
                    key::RESERVED_MEMORY,
                    from_flag,
                    entry(),
                    format!("reserved memory may not be zero for NUMA node {node} and resource {resource:?}"),
                ));
            }
            if !seen.insert((node, resource.clone())) {
                return Err(n.invalid(
                    key::RESERVED_MEMORY,
                    from_flag,
                    entry(),
                    format!("the reserved memory has a duplicate value for NUMA node {node} and resource {resource:?}"),
                ));
            }
            reservation.limits.insert(resource, q);
        }
        reserved_memory.push(reservation);
    }
    Ok(reserved_memory)
}

/// The four settings, validated.
pub(super) fn managers(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<Managers, ConfigError> {
    let policy = Sourced::pick(
        args.memory_manager_policy.clone(),
        doc.memory_manager_policy.clone(),
    );
    let memory_manager_policy = match policy.value.as_deref() {
        None => MemoryManagerPolicy::None,
        Some(v) => MemoryManagerPolicy::parse(v).map_err(|_| {
            n.invalid(
                key::MEMORY_MANAGER_POLICY,
                policy.from_flag,
                v,
                "must be None or Static",
            )
        })?,
    };

    let reserved_memory = reserved_memory(n, doc, args)?;
    if memory_manager_policy == MemoryManagerPolicy::Static
        && !reserved_memory
            .iter()
            .any(|r| r.limits.get("memory").is_some_and(|q| !q.is_zero()))
    {
        return Err(n.invalid(
            key::MEMORY_MANAGER_POLICY,
            policy.from_flag,
            "Static",
            "[memorymanager] you should specify the system reserved memory (reservedMemory, --reserved-memory)",
        ));
    }

    let tp = Sourced::pick(
        args.topology_manager_policy.clone(),
        doc.topology_manager_policy.clone(),
    );
    let topology_manager_policy = match tp.value.as_deref() {
        None => TopologyPolicy::None,
        Some(v) => TopologyPolicy::parse(v).map_err(|_| {
            n.invalid(
                key::TOPOLOGY_MANAGER_POLICY,
                tp.from_flag,
                v,
                "must be one of none, best-effort, restricted, single-numa-node",
            )
        })?,
    };
    let ts = Sourced::pick(
        args.topology_manager_scope.clone(),
        doc.topology_manager_scope.clone(),
    );
    let topology_manager_scope = match ts.value.as_deref() {
        None => Scope::Container,
        Some(v) => Scope::parse(v).map_err(|_| {
            n.invalid(
                key::TOPOLOGY_MANAGER_SCOPE,
                ts.from_flag,
                v,
                "must be container or pod",
            )
        })?,
    };
    Ok(Managers {
        memory_manager_policy,
        reserved_memory,
        topology_manager_policy,
        topology_manager_scope,
    })
}
