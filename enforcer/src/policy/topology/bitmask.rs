//! Kubelet's NUMA affinity bitmask (`pkg/kubelet/cm/topologymanager/bitmask`): a set of NUMA
//! node ids 0..=63 in a `u64`, with the order the topology manager ranks hints by
//! ([`BitMask::is_narrower_than`]), Go's printing (`String()`, pairs of binary digits) and
//! [`iterate_bit_masks`], every non-empty subset of a list of bits, smallest first.

use std::fmt;

use super::TopologyError;

/// A set of NUMA node ids (bits 0 to 63).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BitMask(pub u64);

impl BitMask {
    /// `NewBitMask(bits...)`: errors on a bit outside 0..=63.
    pub fn new(bits: &[usize]) -> Result<Self, TopologyError> {
        let mut m = Self(0);
        m.add(bits)?;
        Ok(m)
    }

    /// `Add`: sets bits (none is set when one is out of range).
    pub fn add(&mut self, bits: &[usize]) -> Result<(), TopologyError> {
        let mut mask = self.0;
        for &i in bits {
            if i >= 64 {
                return Err(TopologyError::BitOutOfRange);
            }
            mask |= 1 << i;
        }
        self.0 = mask;
        Ok(())
    }

    /// `Remove`: clears bits (none is cleared when one is out of range).
    pub fn remove(&mut self, bits: &[usize]) -> Result<(), TopologyError> {
        let mut mask = self.0;
        for &i in bits {
            if i >= 64 {
                return Err(TopologyError::BitOutOfRange);
            }
            mask &= !(1 << i);
        }
        self.0 = mask;
        Ok(())
    }

    /// `And` (package level): `self & every mask`.
    #[must_use]
    pub fn and(self, masks: &[Self]) -> Self {
        Self(masks.iter().fold(self.0, |a, m| a & m.0))
    }

    /// `Or` (package level): `self | every mask`.
    #[must_use]
    pub fn or(self, masks: &[Self]) -> Self {
        Self(masks.iter().fold(self.0, |a, m| a | m.0))
    }

    /// No bit set.
    #[must_use]
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// `IsSet` (false out of range).
    #[must_use]
    pub fn is_set(self, bit: usize) -> bool {
        bit < 64 && self.0 & (1 << bit) != 0
    }

    /// `AnySet`.
    #[must_use]
    pub fn any_set(self, bits: &[usize]) -> bool {
        bits.iter().any(|&b| self.is_set(b))
    }

    /// `Count`: bits set.
    #[must_use]
    pub fn count(self) -> usize {
        self.0.count_ones() as usize
    }

    /// `GetBits`: the bits set, ascending.
    #[must_use]
    pub fn bits(self) -> Vec<usize> {
        (0..64).filter(|&i| self.is_set(i)).collect()
    }

    /// `IsLessThan`: compares the masks as integers (more low bits wins).
    #[must_use]
    pub fn is_less_than(self, other: Self) -> bool {
        self.0 < other.0
    }

    /// `IsGreaterThan`.
    #[must_use]
    pub fn is_greater_than(self, other: Self) -> bool {
        self.0 > other.0
    }

    /// `IsNarrowerThan`: fewer bits set, or as many and [`Self::is_less_than`].
    #[must_use]
    pub fn is_narrower_than(self, other: Self) -> bool {
        if self.count() == other.count() {
            return self.is_less_than(other);
        }
        self.count() < other.count()
    }
}

impl fmt::Display for BitMask {
    /// Go's `String()`: binary, zero-padded to an even number of digits (at least 2).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let grouping = 2;
        let mut shift = 64 - grouping;
        while shift > 0 {
            if u128::from(self.0) > (1u128 << shift) {
                return write!(f, "{:0width$b}", self.0, width = shift + grouping);
            }
            shift -= grouping;
        }
        write!(f, "{:0width$b}", self.0, width = grouping)
    }
}

/// `IterateBitMasks`: every non-empty subset of `bits` as a mask, by size, then in the order
/// of `bits` (lexicographic combinations).
#[must_use]
pub fn iterate_bit_masks(bits: &[usize]) -> Vec<BitMask> {
    fn go(bits: &[usize], accum: &mut Vec<usize>, size: usize, out: &mut Vec<BitMask>) {
        if accum.len() == size {
            // Bits come from the caller's list; out-of-range ones yield an empty mask as
            // Go's ignored error does.
            out.push(BitMask::new(accum).unwrap_or_default());
            return;
        }
        for i in 0..bits.len() {
            accum.push(bits[i]);
            go(&bits[i + 1..], accum, size, out);
            accum.pop();
        }
    }
    let mut out = Vec::new();
    for size in 1..=bits.len() {
        go(bits, &mut Vec::new(), size, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    //! bitmask_test.go, table by table.
    use super::*;

    fn bm(bits: &[usize]) -> BitMask {
        BitMask::new(bits).unwrap()
    }

    #[test]
    fn new_add_remove_print() {
        // TestNewEmptyiBitMask, TestNewBitMask
        assert_eq!(BitMask::default().to_string(), "00");
        for (bits, want) in [(&[0][..], "01"), (&[1], "10"), (&[0, 1], "11")] {
            assert_eq!(bm(bits).to_string(), want);
        }
        // TestAdd (out of range: an error and nothing set)
        for (bits, want) in [
            (&[0][..], "01"),
            (&[1], "10"),
            (&[0, 1], "11"),
            (&[64, 65], "00"),
        ] {
            let mut m = BitMask::default();
            let r = m.add(bits);
            assert_eq!(r.is_err(), want == "00");
            assert_eq!(m.to_string(), want);
        }
        // TestRemove
        for (set, remove, want) in [
            (&[0][..], &[0][..], "00"),
            (&[0, 1], &[1], "01"),
            (&[0, 1], &[0, 1], "00"),
            (&[0], &[64, 65], "01"),
        ] {
            let mut m = bm(set);
            let _ = m.remove(remove);
            assert_eq!(m.to_string(), want);
        }
        // Printing pads to pairs of digits, except a power of 4 (Go's `>` in `String()`).
        assert_eq!(bm(&[2]).to_string(), "100");
        assert_eq!(bm(&[0, 2]).to_string(), "0101");
        assert_eq!(bm(&[0, 1, 2, 3]).to_string(), "1111");
    }

    #[test]
    fn and_or_clear_fill() {
        // TestAnd
        let and: &[(&[&[usize]], &str)] = &[
            (&[&[0, 1], &[0, 1]], "11"),
            (&[&[0, 1], &[1]], "10"),
            (&[&[0], &[0, 1]], "01"),
            (&[&[0, 1], &[0, 1], &[1]], "10"),
            (&[&[0], &[0], &[1], &[0, 1]], "00"),
            (&[&[0, 1, 2, 3], &[1, 2, 3], &[2, 3], &[3]], "1000"),
        ];
        for (masks, want) in and {
            let ms: Vec<BitMask> = masks.iter().map(|b| bm(b)).collect();
            assert_eq!(ms[0].and(&ms).to_string(), *want);
        }
        // TestOr
        let or: &[(&[&[usize]], &str)] = &[
            (&[&[0], &[]], "01"),
            (&[&[1], &[1]], "10"),
            (&[&[0], &[1]], "11"),
            (&[&[0, 1], &[0, 1]], "11"),
            (&[&[0], &[1], &[0, 1]], "11"),
            (&[&[3], &[2], &[1], &[0]], "1111"),
        ];
        for (masks, want) in or {
            let ms: Vec<BitMask> = masks.iter().map(|b| bm(b)).collect();
            assert_eq!(ms[0].or(&ms).to_string(), *want);
        }
        // TestClear, TestFill
        for bits in [&[0][..], &[1], &[0, 1]] {
            let mut m = bm(bits);
            m.0 = 0;
            assert_eq!(m.to_string(), "00");
        }
        assert_eq!(BitMask(u64::MAX).to_string(), "1".repeat(64));
    }

    #[test]
    fn predicates_and_counts() {
        // TestIsEmpty
        assert!(bm(&[]).is_empty());
        assert!(!bm(&[0]).is_empty());
        assert!(!bm(&[0, 1]).is_empty());
        // TestIsSet
        assert!(!bm(&[]).is_set(0));
        assert!(bm(&[0]).is_set(0));
        assert!(bm(&[0, 1]).is_set(1));
        assert!(!bm(&[0, 1]).is_set(64));
        // TestAnySet
        assert!(!bm(&[]).any_set(&[0, 1]));
        assert!(bm(&[0]).any_set(&[0, 1]));
        assert!(bm(&[0, 1]).any_set(&[0, 1]));
        assert!(!bm(&[0, 1]).any_set(&[64, 65]));
        assert!(!bm(&[1, 2]).any_set(&[0, 3]));
        // TestIsEqual
        assert_eq!(bm(&[]), bm(&[]));
        assert_ne!(bm(&[]), bm(&[0]));
        assert_eq!(bm(&[0]), bm(&[0]));
        assert_ne!(bm(&[0]), bm(&[1]));
        assert_eq!(bm(&[0, 1]), bm(&[0, 1]));
        // TestCount, TestGetBits
        for (bits, n) in [(&[][..], 0), (&[0], 1), (&[0, 1], 2)] {
            assert_eq!(bm(bits).count(), n);
            assert_eq!(bm(bits).bits(), bits.to_vec());
        }
        // TestIsNarrowerThan
        assert!(bm(&[0]).is_narrower_than(bm(&[0, 1])));
        assert!(!bm(&[0, 1]).is_narrower_than(bm(&[0])));
        assert!(bm(&[0]).is_narrower_than(bm(&[1])));
        assert!(!bm(&[1]).is_narrower_than(bm(&[0])));
        // IsLessThan / IsGreaterThan
        assert!(bm(&[0]).is_less_than(bm(&[1])));
        assert!(bm(&[1]).is_greater_than(bm(&[0])));
    }

    #[test]
    fn iterate_all_masks() {
        // TestIterateBitMasks: 2^n - 1 masks of n bits.
        for n in [1usize, 2, 4, 8, 16] {
            let bits: Vec<usize> = (0..n).collect();
            assert_eq!(iterate_bit_masks(&bits).len(), (1 << n) - 1);
        }
        // Smallest first, then in the order of the bits.
        let order: Vec<String> = iterate_bit_masks(&[0, 1, 2])
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(order, ["01", "10", "100", "11", "0101", "0110", "0111"]);
    }
}
