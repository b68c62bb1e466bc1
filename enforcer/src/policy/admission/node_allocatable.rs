//! What the node offers pods: allocatable resources (`capacity - kubeReserved -
//! systemReserved - hard eviction thresholds`) and the kubepods cgroup's memory limit
//! (kubelet's `getNodeAllocatableAbsolute`).

use crate::{
    policy::{
        eviction::{Signal, Threshold},
        resources::ResourceList,
    },
    quantity::Quantity,
};

/// kubelet's `getNodeAllocatableAbsolute` for memory: the kubepods cgroup's memory limit,
/// `capacity - systemReserved - kubeReserved`, floored at zero. It does NOT subtract the hard
/// eviction threshold: `allocatableMemory.available` is this limit minus the pods' working
/// set, and the copied hard `memory.available` threshold then fires when the pods' working
/// set passes [`allocatable`]'s memory. Subtracting the threshold here too counts it twice.
#[must_use]
pub fn kubepods_memory_limit(
    capacity: &ResourceList,
    system_reserved: &ResourceList,
    kube_reserved: &ResourceList,
) -> i64 {
    let reserved = [system_reserved, kube_reserved]
        .iter()
        .filter_map(|m| m.get("memory"))
        .fold(0i64, |a, q| a.saturating_add(q.value()));
    capacity
        .get("memory")
        .map_or(0, Quantity::value)
        .saturating_sub(reserved)
        .max(0)
}

/// What the hard eviction thresholds reserve (kubelet's `hardEvictionReservation`):
/// `memory.available` -> memory, `nodefs.available` -> ephemeral-storage, percentages of
/// capacity resolved.
fn eviction_reservation(capacity: &ResourceList, hard: &[Threshold]) -> ResourceList {
    let mut eviction = ResourceList::new();
    for t in hard.iter().filter(|t| t.is_hard()) {
        let resource = match t.signal {
            Signal::MemoryAvailable => "memory",
            Signal::NodeFsAvailable => "ephemeral-storage",
            _ => continue,
        };
        let cap = capacity.get(resource).map_or(0, Quantity::value);
        eviction.insert(resource.to_owned(), t.value.resolve(cap));
    }
    eviction
}

/// `allocatable = capacity - kubeReserved - systemReserved - hard eviction thresholds`
/// (`memory.available` -> memory, `nodefs.available` -> ephemeral-storage; percentages of
/// capacity), floored at zero; memory also less every hugepages pool's capacity (pre-allocated:
/// kubelet's node status setter). `hard` are the hard thresholds without allocatable copies.
#[must_use]
pub fn allocatable(
    capacity: &ResourceList,
    system_reserved: &ResourceList,
    kube_reserved: &ResourceList,
    hard: &[Threshold],
) -> ResourceList {
    let mut reservation: ResourceList = ResourceList::new();
    for list in [system_reserved, kube_reserved] {
        for (k, v) in list {
            reservation
                .entry(k.clone())
                .and_modify(|r| *r = r.saturating_add(*v))
                .or_insert(*v);
        }
    }
    let eviction = eviction_reservation(capacity, hard);
    for (k, v) in eviction {
        reservation
            .entry(k)
            .and_modify(|r| *r = r.saturating_add(v))
            .or_insert(v);
    }
    let hugepages = capacity
        .iter()
        .filter(|(k, _)| k.starts_with("hugepages-"))
        .fold(Quantity::default(), |a, (_, v)| a.saturating_add(*v));
    reservation
        .entry("memory".to_owned())
        .and_modify(|r| *r = r.saturating_add(hugepages))
        .or_insert(hugepages);
    capacity
        .iter()
        .map(|(k, cap)| {
            let reserved = reservation.get(k).copied().unwrap_or_default();
            let v = if reserved > *cap {
                Quantity::zero(cap.format())
            } else {
                cap.saturating_add(
                    Quantity::from_nanos(-reserved.nanos(), cap.format()).unwrap_or_default(),
                )
            };
            (k.clone(), v)
        })
        .collect()
}

/// kubelet's `GetNodeAllocatableReservation`: for each resource of `capacity`,
/// systemReserved + kubeReserved + the hard eviction threshold's reservation (`memory.available`
/// -> memory, `nodefs.available` -> ephemeral-storage; percentages of capacity), zeros left
/// out. Sums keep Go's formats (a zero takes the other's), so the memory manager's error texts
/// print them as kubelet does.
#[must_use]
pub fn reservation(
    capacity: &ResourceList,
    system_reserved: &ResourceList,
    kube_reserved: &ResourceList,
    hard: &[Threshold],
) -> ResourceList {
    let go_add = |a: Quantity, b: Quantity| {
        let format = if a.is_zero() { b.format() } else { a.format() };
        Quantity::from_nanos(a.nanos().saturating_add(b.nanos()), format).unwrap_or(a)
    };
    let eviction = eviction_reservation(capacity, hard);
    let mut out = ResourceList::new();
    for k in capacity.keys() {
        let mut value = Quantity::default();
        for list in [system_reserved, kube_reserved, &eviction] {
            if let Some(q) = list.get(k) {
                value = go_add(value, *q);
            }
        }
        if !value.is_zero() {
            out.insert(k.clone(), value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{admission::tests::list, eviction::ThresholdValue};

    #[test]
    fn allocatable_subtracts_reservations_and_hard_thresholds() {
        let hard = vec![
            Threshold {
                signal: Signal::MemoryAvailable,
                value: ThresholdValue::Quantity(Quantity::parse("500Mi").unwrap()),
                grace_period: Default::default(),
                min_reclaim: None,
            },
            Threshold {
                signal: Signal::NodeFsAvailable,
                value: ThresholdValue::Percentage(0.1),
                grace_period: Default::default(),
                min_reclaim: None,
            },
        ];
        let a = allocatable(
            &list("cpu=4,memory=8Gi,ephemeral-storage=100Gi"),
            &list("cpu=500m,memory=1Gi"),
            &list("cpu=500m"),
            &hard,
        );
        assert_eq!(a["cpu"].milli_value(), 3000);
        assert_eq!(a["memory"].value(), (8 << 30) - (1 << 30) - (500 << 20));
        // 10% is float32(0.1) x capacity, as kubelet computes it.
        assert_eq!(a["ephemeral-storage"].value(), 96_636_764_000);
    }

    /// kubelet's node status: each hugepages pool is pre-allocated, so it leaves allocatable
    /// memory (the pools themselves stay allocatable, less their own reservations).
    #[test]
    fn hugepages_pools_leave_allocatable_memory() {
        let a = allocatable(
            &list("cpu=4,memory=8Gi,hugepages-2Mi=1Gi,hugepages-1Gi=2Gi"),
            &list("memory=1Gi,hugepages-2Mi=256Mi"),
            &ResourceList::new(),
            &[],
        );
        assert_eq!(a["memory"].value(), (8 << 30) - (1 << 30) - (3 << 30));
        assert_eq!(a["hugepages-2Mi"].value(), 768 << 20);
        assert_eq!(a["hugepages-1Gi"].value(), 2 << 30);
        let none = allocatable(
            &list("memory=1Gi,hugepages-1Gi=2Gi"),
            &ResourceList::new(),
            &ResourceList::new(),
            &[],
        );
        assert_eq!(none["memory"].value(), 0, "floored at zero");
    }
}
