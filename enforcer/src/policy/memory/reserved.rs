//! `reservedMemory` (`memory_manager.go`: `getTotalMemoryTypeReserved`,
//! `validateReservedMemory`, `convertReserved`, `getSystemReservedMemory`): per NUMA node,
//! the memory and hugepages kept from pods. For each memory type the sum over the nodes must
//! equal node allocatable's reservation of that type (kube-reserved + system-reserved + the
//! hard `memory.available` eviction threshold, [`crate::policy::admission::node_allocatable::reservation`]).

use std::collections::BTreeMap;

use super::MemoryError;
use crate::{policy::resources::ResourceList, quantity::Quantity};

/// `MemoryReservation`: one entry of `reservedMemory`.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryReservation {
    /// `numaNode`.
    pub numa_node: i32,
    /// `limits`: resource -> quantity.
    pub limits: ResourceList,
}

/// `systemReservedMemory`: node id -> resource -> bytes.
pub type SystemReservedMemory = BTreeMap<usize, BTreeMap<String, u64>>;

/// Go's `Quantity.Add` as `a.Add(b)`: a zero receiver takes the other's format.
fn go_add(a: Quantity, b: Quantity) -> Quantity {
    let format = if a.is_zero() { b.format() } else { a.format() };
    Quantity::from_nanos(a.nanos().saturating_add(b.nanos()), format).unwrap_or(a)
}

fn is_memory_type(name: &str) -> bool {
    name == "memory" || name.starts_with("hugepages-")
}

/// `getTotalMemoryTypeReserved`: the sum per resource; a node the machine lacks is an error.
fn total_reserved(
    numa_nodes: &[usize],
    reserved: &[MemoryReservation],
) -> Result<BTreeMap<String, Quantity>, MemoryError> {
    let mut total: BTreeMap<String, Quantity> = BTreeMap::new();
    for r in reserved {
        let exists = usize::try_from(r.numa_node).is_ok_and(|n| numa_nodes.contains(&n));
        if !exists {
            return Err(MemoryError::ReservedNodeMissing(i64::from(r.numa_node)));
        }
        for (name, q) in &r.limits {
            let sum = match total.get(name) {
                Some(prev) => go_add(*q, *prev),
                None => *q,
            };
            total.insert(name.clone(), sum);
        }
    }
    Ok(total)
}

/// `validateReservedMemory`: for every memory type in either list, the sum of
/// `reservedMemory` equals node allocatable's reservation (`node_allocatable_reservation`).
pub fn validate_reserved_memory(
    numa_nodes: &[usize],
    node_allocatable_reservation: &ResourceList,
    reserved: &[MemoryReservation],
) -> Result<(), MemoryError> {
    let total = total_reserved(numa_nodes, reserved)?;
    let mut types: Vec<&String> = total.keys().collect();
    types.extend(
        node_allocatable_reservation
            .keys()
            .filter(|k| is_memory_type(k)),
    );
    types.sort();
    types.dedup();
    for t in types {
        let zero = Quantity::default();
        let allocatable = go_add(
            zero,
            node_allocatable_reservation.get(t).copied().unwrap_or(zero),
        );
        let sum = go_add(zero, total.get(t).copied().unwrap_or(zero));
        if allocatable != sum {
            return Err(MemoryError::ReservedNotEqual {
                total: sum.canonical(),
                resource: t.clone(),
                allocatable: allocatable.canonical(),
            });
        }
    }
    Ok(())
}

/// `convertReserved`: node -> resource -> bytes, every node of the machine present (a later
/// entry for the same node and resource replaces an earlier one, as in kubelet).
pub fn convert_reserved(
    numa_nodes: &[usize],
    reserved: &[MemoryReservation],
) -> Result<SystemReservedMemory, MemoryError> {
    let mut out: SystemReservedMemory = numa_nodes.iter().map(|n| (*n, BTreeMap::new())).collect();
    for r in reserved {
        let Ok(node) = usize::try_from(r.numa_node) else {
            return Err(MemoryError::ReservedNodeMissing(i64::from(r.numa_node)));
        };
        for (name, q) in &r.limits {
            let v = as_u64(q).ok_or(MemoryError::ReservedNotInt)?;
            out.entry(node).or_default().insert(name.clone(), v);
        }
    }
    Ok(out)
}

/// `getSystemReservedMemory`: validated, then converted.
pub fn system_reserved_memory(
    numa_nodes: &[usize],
    node_allocatable_reservation: &ResourceList,
    reserved: &[MemoryReservation],
) -> Result<SystemReservedMemory, MemoryError> {
    validate_reserved_memory(numa_nodes, node_allocatable_reservation, reserved)?;
    convert_reserved(numa_nodes, reserved)
}

/// `Quantity.AsInt64` as bytes: whole, non-negative values only.
#[must_use]
pub fn as_u64(q: &Quantity) -> Option<u64> {
    let nanos = q.nanos();
    if nanos % 1_000_000_000 != 0 {
        return None;
    }
    u64::try_from(nanos / 1_000_000_000).ok()
}

#[cfg(test)]
mod tests {
    //! memory_manager_test.go: `TestValidateReservedMemory`, `TestConvertPreReserved`,
    //! `TestGetSystemReservedMemory`.
    use super::*;
    use crate::quantity::Format;

    const NODES: &[usize] = &[0, 1];
    const GB: i64 = 1 << 30;

    fn dec(v: i64) -> Quantity {
        Quantity::from_int(v, Format::DecimalSI)
    }

    fn list(items: &[(&str, Quantity)]) -> ResourceList {
        items.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn res(node: i32, items: &[(&str, Quantity)]) -> MemoryReservation {
        MemoryReservation {
            numa_node: node,
            limits: list(items),
        }
    }

    fn not_equal(total: &str, t: &str, alloc: &str) -> String {
        format!(
            "the total amount {total:?} of type {t:?} is not equal to the value {alloc:?} determined by Node Allocatable feature"
        )
    }

    #[test]
    fn validate_reserved_memory_table() {
        let both = vec![
            res(
                0,
                &[
                    ("memory", dec(12)),
                    ("hugepages-2Mi", dec(70)),
                    ("hugepages-1Gi", dec(13)),
                ],
            ),
            res(1, &[("memory", dec(5)), ("hugepages-2Mi", dec(7))]),
        ];
        let cases: Vec<(&str, ResourceList, Vec<MemoryReservation>, String)> = vec![
            ("Node Allocatable not set, reserved not set", list(&[]), vec![], String::new()),
            (
                "Node Allocatable set to zero, reserved set to zero",
                list(&[("memory", dec(0))]),
                vec![res(0, &[("memory", dec(0))])],
                String::new(),
            ),
            (
                "Node Allocatable not set (equal zero), reserved set",
                list(&[]),
                vec![res(0, &[("memory", dec(12))])],
                not_equal("12", "memory", "0"),
            ),
            (
                "Node Allocatable set, reserved not set",
                list(&[("hugepages-2Mi", dec(5))]),
                vec![],
                not_equal("0", "hugepages-2Mi", "5"),
            ),
            (
                "Reserved not equal to Node Allocatable",
                list(&[("memory", dec(5))]),
                vec![res(0, &[("memory", dec(12))])],
                not_equal("12", "memory", "5"),
            ),
            (
                "Reserved contains the NUMA node that does not exist under the machine",
                list(&[("memory", dec(17))]),
                vec![res(0, &[("memory", dec(12))]), res(2, &[("memory", dec(5))])],
                "the reserved memory configuration references a NUMA node 2 that does not exist on this machine".into(),
            ),
            (
                "Reserved total equal to Node Allocatable",
                list(&[("memory", dec(17)), ("hugepages-2Mi", dec(77)), ("hugepages-1Gi", dec(13))]),
                both.clone(),
                String::new(),
            ),
            (
                "Reserved total hugapages-2M not equal to Node Allocatable",
                list(&[("memory", dec(17)), ("hugepages-2Mi", dec(14)), ("hugepages-1Gi", dec(13))]),
                both,
                not_equal("77", "hugepages-2Mi", "14"),
            ),
        ];
        for (name, alloc, reserved, want) in cases {
            let got = validate_reserved_memory(NODES, &alloc, &reserved);
            match got {
                Ok(()) => assert!(want.is_empty(), "{name}: expected {want}"),
                Err(e) => assert_eq!(e.to_string(), want, "{name}"),
            }
        }
    }

    #[test]
    fn convert_pre_reserved() {
        let empty = convert_reserved(NODES, &[]).unwrap();
        assert_eq!(empty, [(0, BTreeMap::new()), (1, BTreeMap::new())].into());
        let one = convert_reserved(
            NODES,
            &[res(
                0,
                &[
                    ("memory", dec(12)),
                    ("hugepages-2Mi", dec(70)),
                    ("hugepages-1Gi", dec(13)),
                ],
            )],
        )
        .unwrap();
        assert_eq!(one[&0]["memory"], 12);
        assert_eq!(one[&0]["hugepages-2Mi"], 70);
        assert_eq!(one[&0]["hugepages-1Gi"], 13);
        assert!(one[&1].is_empty());
        let both = convert_reserved(
            NODES,
            &[
                res(
                    0,
                    &[
                        ("memory", dec(12)),
                        ("hugepages-2Mi", dec(70)),
                        ("hugepages-1Gi", dec(13)),
                    ],
                ),
                res(1, &[("memory", dec(5)), ("hugepages-2Mi", dec(7))]),
            ],
        )
        .unwrap();
        assert_eq!(
            both[&1],
            [("memory".to_owned(), 5), ("hugepages-2Mi".to_owned(), 7)].into()
        );
    }

    #[test]
    fn get_system_reserved_memory() {
        let bin = |v| Quantity::from_int(v, Format::BinarySI);
        // "Should return empty map when reservation is not done"
        assert_eq!(
            system_reserved_memory(NODES, &list(&[]), &[]).unwrap(),
            [(0, BTreeMap::new()), (1, BTreeMap::new())].into()
        );
        // "Should return error when Allocatable reservation is not equal to the reserved memory"
        assert_eq!(
            system_reserved_memory(NODES, &list(&[]), &[res(0, &[("memory", bin(GB))])])
                .unwrap_err()
                .to_string(),
            not_equal("1Gi", "memory", "0")
        );
        // "Reserved should be equal to systemReservedMemory"
        let got = system_reserved_memory(
            NODES,
            &list(&[("memory", bin(2 * GB))]),
            &[
                res(0, &[("memory", bin(GB))]),
                res(1, &[("memory", bin(GB))]),
            ],
        )
        .unwrap();
        let gb = u64::try_from(GB).unwrap();
        assert_eq!(got[&0]["memory"], gb);
        assert_eq!(got[&1]["memory"], gb);
        // Not whole bytes.
        assert_eq!(
            convert_reserved(
                NODES,
                &[res(0, &[("memory", Quantity::parse("1500m").unwrap())])]
            ),
            Err(MemoryError::ReservedNotInt)
        );
    }
}
