//! A set of CPU ids, as kubelet's `cpuset.CPUSet` (`k8s.io/utils/cpuset`, formerly
//! `pkg/kubelet/cm/cpuset`) that `pkg/kubelet/cm/cpumanager` works with: parsed from and
//! printed in the Linux list format (`0-3,8,10-11`) of `cpuset.cpus` and sysfs, with the set
//! operations the static policy and the assignment need.

use std::{collections::BTreeSet, fmt};

use super::CpuError;

/// A set of CPU ids, printed as kubelet does (`0-3,8,10-11`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(pub(super) BTreeSet<u32>);

impl CpuSet {
    /// Parses `0-3,8` (the empty string is the empty set).
    pub fn parse(s: &str) -> Result<Self, CpuError> {
        let mut set = BTreeSet::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let a: u32 = a
                .trim()
                .parse()
                .map_err(|_| CpuError::CpuSet(s.to_owned()))?;
            let b: u32 = b
                .trim()
                .parse()
                .map_err(|_| CpuError::CpuSet(s.to_owned()))?;
            if a > b || b - a > 65_536 {
                return Err(CpuError::CpuSet(s.to_owned()));
            }
            set.extend(a..=b);
        }
        Ok(Self(set))
    }

    /// The ids.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// Number of CPUs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Membership.
    #[must_use]
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    /// `self ∪ other`.
    #[must_use]
    pub fn union(&self, other: &Self) -> Self {
        Self(self.0.union(&other.0).copied().collect())
    }

    /// `self ∩ other`.
    #[must_use]
    pub fn intersection(&self, other: &Self) -> Self {
        Self(self.0.intersection(&other.0).copied().collect())
    }

    /// `self \ other`.
    #[must_use]
    pub fn difference(&self, other: &Self) -> Self {
        Self(self.0.difference(&other.0).copied().collect())
    }

    /// `self ⊆ other`.
    #[must_use]
    pub fn is_subset(&self, other: &Self) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?
            } else {
                write!(f, "{start}-{end}")?
            }
        }
        Ok(())
    }
}

/// A cpuset from its text, for tests.
#[cfg(test)]
pub(super) fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpusets() {
        assert_eq!(set("0-3,8,10-11").to_string(), "0-3,8,10-11");
        assert_eq!(set("").to_string(), "");
        assert_eq!(set("3,1,2").to_string(), "1-3");
        assert!(CpuSet::parse("3-1").is_err());
        assert!(CpuSet::parse("a").is_err());
        assert!(CpuSet::parse("0-4294967295").is_err());
    }
}
