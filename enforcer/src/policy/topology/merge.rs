//! The topology manager's policies and hint merging (`policy.go`, `policy_none.go`,
//! `policy_best_effort.go`, `policy_restricted.go`, `policy_single_numa_node.go`): every
//! permutation of one hint per provider and resource is merged by a bitwise AND (preferred
//! only when every hint is preferred and all affinities are equal), and the best merged hint
//! is kept: preferred over not, then the narrowest mask; among non-preferred ones, the mask
//! closest to the widest of the providers' narrowest masks (`bestNonPreferredAffinityCount`).
//! `restricted` and `single-numa-node` admit only a preferred result; `single-numa-node`
//! considers only single-node (or any-node) preferred hints and reports the all-nodes mask
//! as "any" (no affinity).

use std::{collections::BTreeMap, fmt};

use super::{BitMask, TopologyError};

/// A hint: the NUMA nodes (`None`: no preference) and whether the placement is preferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopologyHint {
    /// `NUMANodeAffinity`; `None` is Go's nil (any node).
    pub affinity: Option<BitMask>,
    /// `Preferred`.
    pub preferred: bool,
}

impl TopologyHint {
    /// A hint on the given nodes.
    #[must_use]
    pub fn new(affinity: BitMask, preferred: bool) -> Self {
        Self {
            affinity: Some(affinity),
            preferred,
        }
    }
}

impl fmt::Display for TopologyHint {
    /// Go's `{<mask> <preferred>}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.affinity {
            Some(m) => write!(f, "{{{m} {}}}", self.preferred),
            None => write!(f, "{{<nil> {}}}", self.preferred),
        }
    }
}

/// One provider's hints by resource name. A resource mapped to `None` has no preference (Go's
/// nil slice); to `Some(vec![])`, no possible placement. An empty map: no preference at all.
pub type ProviderHints = BTreeMap<String, Option<Vec<TopologyHint>>>;

/// `topologyManagerPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Policy {
    /// `none`: no alignment; every pod is admitted.
    #[default]
    #[serde(rename = "none")]
    None,
    /// `best-effort`: align when possible, admit anyway.
    #[serde(rename = "best-effort")]
    BestEffort,
    /// `restricted`: admit only a preferred alignment.
    #[serde(rename = "restricted")]
    Restricted,
    /// `single-numa-node`: admit only a preferred alignment on one NUMA node.
    #[serde(rename = "single-numa-node")]
    SingleNumaNode,
}

impl Policy {
    /// From kubelet's name.
    pub fn parse(name: &str) -> Result<Self, TopologyError> {
        match name {
            "none" => Ok(Self::None),
            "best-effort" => Ok(Self::BestEffort),
            "restricted" => Ok(Self::Restricted),
            "single-numa-node" => Ok(Self::SingleNumaNode),
            other => Err(TopologyError::UnknownPolicy(other.to_owned())),
        }
    }

    /// Kubelet's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::BestEffort => "best-effort",
            Self::Restricted => "restricted",
            Self::SingleNumaNode => "single-numa-node",
        }
    }

    /// `canAdmitPodResult`.
    #[must_use]
    pub fn can_admit(self, hint: &TopologyHint) -> bool {
        match self {
            Self::None | Self::BestEffort => true,
            Self::Restricted | Self::SingleNumaNode => hint.preferred,
        }
    }

    /// `Merge`: the best hint of the providers' hints on a machine with `numa_nodes`, and
    /// whether the policy admits it.
    #[must_use]
    pub fn merge(self, numa_nodes: &[usize], providers: &[ProviderHints]) -> (TopologyHint, bool) {
        let default_affinity = BitMask::new(numa_nodes).unwrap_or_default();
        let best = match self {
            Self::None => return (TopologyHint::default(), true),
            Self::BestEffort | Self::Restricted => {
                HintMerger::new(default_affinity, filter_providers_hints(providers)).merge()
            }
            Self::SingleNumaNode => {
                let single = filter_single_numa_hints(filter_providers_hints(providers));
                let best = HintMerger::new(default_affinity, single).merge();
                if best.affinity == Some(default_affinity) {
                    TopologyHint {
                        affinity: None,
                        preferred: best.preferred,
                    }
                } else {
                    best
                }
            }
        };
        (best, self.can_admit(&best))
    }
}

/// `filterProvidersHints`: one list of hints per provider and resource; a provider without
/// hints, or a resource without preference, counts as one preferred any-node hint; a resource
/// with no possible placement as one non-preferred any-node hint.
#[must_use]
pub fn filter_providers_hints(providers: &[ProviderHints]) -> Vec<Vec<TopologyHint>> {
    let mut all = Vec::new();
    for hints in providers {
        if hints.is_empty() {
            all.push(vec![TopologyHint {
                affinity: None,
                preferred: true,
            }]);
            continue;
        }
        for resource_hints in hints.values() {
            match resource_hints {
                None => all.push(vec![TopologyHint {
                    affinity: None,
                    preferred: true,
                }]),
                Some(h) if h.is_empty() => all.push(vec![TopologyHint {
                    affinity: None,
                    preferred: false,
                }]),
                Some(h) => all.push(h.clone()),
            }
        }
    }
    all
}

/// `filterSingleNumaHints`: only preferred hints on one node or on any node.
fn filter_single_numa_hints(all: Vec<Vec<TopologyHint>>) -> Vec<Vec<TopologyHint>> {
    all.into_iter()
        .map(|hints| {
            hints
                .into_iter()
                .filter(|h| h.preferred && h.affinity.is_none_or(|m| m.count() == 1))
                .collect()
        })
        .collect()
}

/// `mergePermutation`: the AND of the affinities (any-node hints left out); preferred when
/// every hint is preferred and every set affinity equals the first.
#[must_use]
pub fn merge_permutation(default_affinity: BitMask, permutation: &[TopologyHint]) -> TopologyHint {
    let mut preferred = true;
    let mut affinities: Vec<BitMask> = Vec::new();
    for hint in permutation {
        if let Some(a) = hint.affinity {
            affinities.push(a);
            if affinities.first().is_some_and(|first| *first != a) {
                preferred = false;
            }
        }
        if !hint.preferred {
            preferred = false;
        }
    }
    TopologyHint::new(default_affinity.and(&affinities), preferred)
}

/// `narrowestHint` of one list (any-node hints skipped).
fn narrowest(hints: &[TopologyHint]) -> Option<BitMask> {
    let mut best: Option<BitMask> = None;
    for m in hints.iter().filter_map(|h| h.affinity) {
        match best {
            Some(b) if !m.is_narrower_than(b) => {}
            _ => best = Some(m),
        }
    }
    best
}

/// `maxOfMinAffinityCounts`.
pub(super) fn max_of_min_affinity_counts(filtered: &[Vec<TopologyHint>]) -> usize {
    filtered
        .iter()
        .filter_map(|h| narrowest(h))
        .map(BitMask::count)
        .max()
        .unwrap_or(0)
}

/// `HintMerger` with the default comparison (the narrowest mask; the
/// `prefer-closest-numa-nodes` option is not supported).
pub(super) struct HintMerger {
    pub(super) default_affinity: BitMask,
    pub(super) hints: Vec<Vec<TopologyHint>>,
    pub(super) best_non_preferred_affinity_count: usize,
}

impl HintMerger {
    pub(super) fn new(default_affinity: BitMask, hints: Vec<Vec<TopologyHint>>) -> Self {
        let best_non_preferred_affinity_count = max_of_min_affinity_counts(&hints);
        Self {
            default_affinity,
            hints,
            best_non_preferred_affinity_count,
        }
    }

    /// `CompareNUMAAffinityMasks` (narrowest): the current hint unless the candidate's mask
    /// is narrower.
    fn compare_masks(current: TopologyHint, candidate: TopologyHint) -> TopologyHint {
        let (Some(c), Some(n)) = (current.affinity, candidate.affinity) else {
            return current;
        };
        if c == n || !n.is_narrower_than(c) {
            current
        } else {
            candidate
        }
    }

    /// `compare`: kubelet's choice between the best so far and a candidate.
    pub(super) fn compare(
        &self,
        current: Option<TopologyHint>,
        candidate: TopologyHint,
    ) -> Option<TopologyHint> {
        let count = |h: &TopologyHint| h.affinity.map_or(0, BitMask::count);
        if count(&candidate) == 0 {
            return current;
        }
        let Some(current) = current else {
            return Some(candidate);
        };
        Some(self.compare_some(current, candidate))
    }

    /// `compare` once there is a best hint and the candidate's mask is not empty.
    fn compare_some(&self, current: TopologyHint, candidate: TopologyHint) -> TopologyHint {
        let count = |h: &TopologyHint| h.affinity.map_or(0, BitMask::count);
        if !current.preferred && candidate.preferred {
            return candidate;
        }
        if current.preferred && !candidate.preferred {
            return current;
        }
        if current.preferred && candidate.preferred {
            return Self::compare_masks(current, candidate);
        }
        let best = self.best_non_preferred_affinity_count;
        let (cur, cand) = (count(&current), count(&candidate));
        if cur > best {
            return Self::compare_masks(current, candidate);
        }
        if cur == best {
            if cand != best {
                return current;
            }
            return Self::compare_masks(current, candidate);
        }
        if cand > best {
            return current;
        }
        if cand == best {
            return candidate;
        }
        if cand > cur {
            return candidate;
        }
        if cand < cur {
            return current;
        }
        Self::compare_masks(current, candidate)
    }

    /// `Merge`: the best merged permutation, or the non-preferred all-nodes hint.
    fn merge(&self) -> TopologyHint {
        let mut best: Option<TopologyHint> = None;
        let mut permutation = Vec::with_capacity(self.hints.len());
        self.iterate(0, &mut permutation, &mut best);
        best.unwrap_or(TopologyHint::new(self.default_affinity, false))
    }

    /// `iterateAllProviderTopologyHints`, folding each permutation into `best`.
    fn iterate(
        &self,
        i: usize,
        permutation: &mut Vec<TopologyHint>,
        best: &mut Option<TopologyHint>,
    ) {
        let Some(hints) = self.hints.get(i) else {
            let merged = merge_permutation(self.default_affinity, permutation);
            *best = self.compare(*best, merged);
            return;
        };
        for h in hints {
            permutation.push(*h);
            self.iterate(i + 1, permutation, best);
            permutation.pop();
        }
    }
}
