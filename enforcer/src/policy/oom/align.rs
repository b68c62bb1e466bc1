//! Aligning the kernel OOM killer's choice with kubelet's eviction ranking (companion mode).
//!
//! The kernel kills the task of the highest badness (`mm/oom_kill.c`, `oom_badness`):
//! `rss + swap entries + page tables / PAGE_SIZE`, plus `oom_score_adj * (totalpages / 1000)`,
//! a task at -1000 never. kubelet's formula gives a Burstable container a value in
//! `[3, 999]` from its memory request alone, so the kernel's choice follows resident memory
//! and can name a pod kubelet's ranking puts late (one below its request, or of a higher
//! priority). Within the Burstable range, every Burstable pod can be given the value that puts
//! its badness below the pod kubelet ranks before it; Guaranteed (-997), BestEffort (1000) and
//! node-critical pods keep kubelet's values. What no value in the range can fix is reported
//! as an inversion.

/// The lowest value of kubelet's Burstable range (`1000 + guaranteedOOMScoreAdj`).
pub const BURSTABLE_MIN: i64 = 3;
/// The highest value of kubelet's Burstable range (`besteffortOOMScoreAdj - 1`).
pub const BURSTABLE_MAX: i64 = 999;

/// One pod as the kernel would score it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Score {
    /// Its value is kubelet's and stays (Guaranteed, BestEffort, node-critical): its badness
    /// as the kernel computes it now (its highest task's).
    Fixed { badness: i64 },
    /// A Burstable pod: its highest task's points (pages) before the adjustment.
    Adjustable { points: i64 },
}

/// A pod in kubelet's eviction order (the first is the one kubelet evicts first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub uid: &'a str,
    pub score: Score,
}

/// The values to write and what stays out of order.
#[must_use]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Alignment {
    /// The value for each adjustable pod, in the candidates' order.
    pub values: Vec<(String, i64)>,
    /// Pairs `(first, later)` where the pod kubelet ranks later keeps a badness at or above
    /// the earlier one's with every value in the range: the kernel would kill `later` first.
    pub inversions: Vec<(String, String)>,
    /// The pod the kernel would kill first with these values.
    pub kernel_first: Option<String>,
}

/// The kernel's `adj * (totalpages / 1000)` unit, at least 1.
#[must_use]
pub fn unit(totalpages: u64) -> i64 {
    i64::try_from(totalpages / 1000).unwrap_or(i64::MAX).max(1)
}

/// Values for the adjustable pods of `ranked` (kubelet's order) so that, where the range
/// allows, each pod's badness is below the badness of the pod ranked before it, with a
/// margin: a pod between others is put halfway between the badness of the pod before it and
/// the lowest badness the pods after it can reach (so that memory growing or shrinking
/// between two alignments does not flip the order), the last one at the range's bottom, the
/// first at its top. `unit` is [`unit`] of the OOM domain's total pages.
pub fn align(ranked: &[Candidate<'_>], unit: i64) -> Alignment {
    let mut out = Alignment::default();
    // From the bottom: the lowest badness each pod can have with the pods after it kept in
    // order below it (`floor[i]`), and the value that gives it (`lowest[i]`).
    let n = ranked.len();
    let mut floor = vec![0i64; n];
    let mut lowest = vec![BURSTABLE_MIN; n];
    let mut below: Option<i64> = None;
    for i in (0..n).rev() {
        floor[i] = match ranked[i].score {
            Score::Fixed { badness } => badness,
            Score::Adjustable { points } => {
                let need = below.map_or(BURSTABLE_MIN, |b| {
                    // The smallest value with `points + v * unit > b`.
                    (b.saturating_sub(points))
                        .div_euclid(unit)
                        .saturating_add(1)
                });
                lowest[i] = need.clamp(BURSTABLE_MIN, BURSTABLE_MAX);
                points.saturating_add(lowest[i].saturating_mul(unit))
            }
        };
        below = Some(floor[i]);
    }
    // From the top: each adjustable pod below the lowest badness before it.
    let mut ceiling: Option<(i64, &str)> = None;
    let mut best: Option<(i64, &str)> = None;
    for (i, c) in ranked.iter().enumerate() {
        let badness = match c.score {
            Score::Fixed { badness } => badness,
            Score::Adjustable { points } => {
                let v = match ceiling {
                    None => BURSTABLE_MAX,
                    Some((b, _)) => {
                        // The highest value that keeps it below `b`.
                        let highest = (b.saturating_sub(1).saturating_sub(points))
                            .div_euclid(unit)
                            .clamp(BURSTABLE_MIN, BURSTABLE_MAX);
                        let target = if i + 1 == n {
                            floor[i]
                        } else {
                            b / 2 + floor[i + 1] / 2
                        };
                        let mid = (target.saturating_sub(points)).div_euclid(unit);
                        if lowest[i] <= highest {
                            mid.clamp(lowest[i], highest)
                        } else {
                            highest
                        }
                    }
                };
                out.values.push((c.uid.to_owned(), v));
                points.saturating_add(v.saturating_mul(unit))
            }
        };
        if let Some((b, first)) = ceiling
            && badness >= b
        {
            out.inversions.push((first.to_owned(), c.uid.to_owned()));
        }
        if best.is_none_or(|(b, _)| badness > b) {
            best = Some((badness, c.uid));
        }
        // The next pod must stay below the lowest badness so far, so that every pod ranked
        // before it goes first.
        ceiling = Some(match ceiling {
            Some((b, u)) if b <= badness => (b, u),
            _ => (badness, c.uid),
        });
    }
    out.kernel_first = best.map(|(_, u)| u.to_owned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adj(uid: &str, points: i64) -> Candidate<'_> {
        Candidate {
            uid,
            score: Score::Adjustable { points },
        }
    }

    /// The example kubelet gets wrong: `a` is over its small request (ranked first) with
    /// less resident memory than `b`, under its large one. kubelet's formula (999 and 992 on
    /// a 24 GiB node) lets the kernel kill `b`; aligned, `a` is killed first.
    #[test]
    fn the_pod_kubelet_ranks_first_gets_the_highest_badness() {
        let unit = unit(65_536); // a 256 MiB kubepods limit in 4 KiB pages
        let (a, b) = (15_360, 38_400); // 60 MiB and 150 MiB resident
        assert!(b + 992 * unit > a + 999 * unit, "kubelet's values pick b");
        let al = align(&[adj("a", a), adj("b", b)], unit);
        let va = al.values[0].1;
        let vb = al.values[1].1;
        assert_eq!(va, BURSTABLE_MAX);
        assert!(b + vb * unit < a + va * unit, "{al:?}");
        assert!(vb >= BURSTABLE_MIN);
        assert_eq!(al.kernel_first.as_deref(), Some("a"));
        assert!(al.inversions.is_empty());
    }

    /// A BestEffort pod (1000, kubelet's) ranked after a Burstable one with more resident
    /// memory than the range can make up for: reported, not hidden.
    #[test]
    fn what_the_range_cannot_fix_is_an_inversion() {
        let unit = 65;
        let al = align(
            &[
                adj("burstable", 100),
                Candidate {
                    uid: "besteffort",
                    score: Score::Fixed {
                        badness: 50_000 + 1000 * unit,
                    },
                },
                adj("later", 10),
            ],
            unit,
        );
        assert_eq!(
            al.inversions,
            [("burstable".to_owned(), "besteffort".to_owned())]
        );
        assert_eq!(al.kernel_first.as_deref(), Some("besteffort"));
        // The later pod still goes below both.
        let later = al.values.iter().find(|(u, _)| u == "later").map(|v| v.1);
        assert!(later.is_some_and(|v| 10 + v * unit < 100 + 999 * unit));
    }

    /// A Burstable pod whose resident memory alone is above the earlier pod's badness stays
    /// at the range's bottom, and is reported.
    #[test]
    fn the_range_floor_holds() {
        let al = align(&[adj("small", 10), adj("huge", 1_000_000)], 10);
        assert_eq!(al.values[1].1, BURSTABLE_MIN);
        assert_eq!(al.inversions.len(), 1);
        assert_eq!(unit(999), 1);
        assert_eq!(unit(6_291_456), 6291);
    }

    /// The order is kept with a margin: the last pod at the range's bottom, a middle one
    /// halfway between its neighbours' reach, so a few MiB of growth do not flip it.
    #[test]
    fn the_order_keeps_a_margin() {
        let unit = 65;
        let (a, b, c) = (15_360, 38_400, 20_000);
        let al = align(&[adj("a", a), adj("b", b), adj("c", c)], unit);
        let v: Vec<i64> = al.values.iter().map(|x| x.1).collect();
        assert_eq!(v[0], BURSTABLE_MAX);
        assert_eq!(v[2], BURSTABLE_MIN, "the last pod at the bottom: {al:?}");
        let (ba, bb, bc) = (a + v[0] * unit, b + v[1] * unit, c + v[2] * unit);
        assert!(ba > bb && bb > bc, "{al:?}");
        // 4 MiB (1024 pages) more for b or less for a keeps the order.
        assert!(ba - bb > 1024 && bb - bc > 1024, "{ba} {bb} {bc}");
        assert!(al.inversions.is_empty());
        // Two pods: the second at the bottom.
        let two = align(&[adj("a", a), adj("b", b)], unit);
        assert_eq!(two.values[1].1, BURSTABLE_MIN);
    }
}
