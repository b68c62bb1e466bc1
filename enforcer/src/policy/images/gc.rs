//! The image garbage collector's decisions (`image_gc_manager.go`): the records kept per
//! image (first detected, last used, size, pinned), the eviction order of the unused ones,
//! the age rule (`imageMaximumGCAge`) and the space rule (above `imageGCHighThresholdPercent`
//! of the image filesystem, free down to `imageGCLowThresholdPercent`, never an image younger
//! than `imageMinimumGCAge`). Time is a parameter: a `Duration` since an epoch the caller
//! keeps.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

/// `ImageGCPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcPolicy {
    /// `imageGCHighThresholdPercent` (85): at or above this usage the collector runs.
    pub high_percent: u8,
    /// `imageGCLowThresholdPercent` (80): it frees down to this usage.
    pub low_percent: u8,
    /// `imageMinimumGCAge` (2m): an image detected more recently is never removed.
    pub min_age: Duration,
    /// `imageMaximumGCAge` (0: off): an image unused for longer is removed whatever the
    /// disk usage.
    pub max_age: Duration,
}

impl Default for GcPolicy {
    fn default() -> Self {
        Self {
            high_percent: 85,
            low_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
        }
    }
}

/// kubelet's `ImageGCPeriod`: how often the collector runs.
pub const GC_PERIOD: Duration = Duration::from_secs(300);

/// What the runtime says of one image (CRI `Image`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub id: String,
    pub size: u64,
    pub pinned: bool,
}

/// `imageRecord`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub first_detected: Duration,
    /// Zero until a container was seen using it.
    pub last_used: Duration,
    pub size: u64,
    pub pinned: bool,
}

/// The records by image id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Records {
    pub by_id: BTreeMap<String, Record>,
}

/// An unused image in eviction order (`evictionInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub record: Record,
}

impl Records {
    /// `detectImages` at `now`: new images are first detected now, images in use were last
    /// used now, sizes and pins follow the runtime, images gone are forgotten.
    pub fn detect(&mut self, images: &[ImageInfo], in_use: &BTreeSet<String>, now: Duration) {
        let current: BTreeSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.by_id.retain(|id, _| current.contains(id.as_str()));
        for i in images {
            let r = self.by_id.entry(i.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: Duration::ZERO,
                size: 0,
                pinned: false,
            });
            if in_use.contains(&i.id) {
                r.last_used = now;
            }
            r.size = i.size;
            r.pinned = i.pinned;
        }
    }

    /// `imagesInEvictionOrder`: the images neither in use nor pinned, least recently used
    /// first, ties by first detection.
    #[must_use]
    pub fn eviction_order(&self, in_use: &BTreeSet<String>) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = self
            .by_id
            .iter()
            .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
            .map(|(id, r)| Candidate {
                id: id.clone(),
                record: *r,
            })
            .collect();
        out.sort_by(|a, b| {
            (a.record.last_used, a.record.first_detected)
                .cmp(&(b.record.last_used, b.record.first_detected))
        });
        out
    }
}

/// `freeOldImages`: whether `c` is to be removed for its age at `now` (the collector began
/// at `began`: nothing is removed for age before `max_age` has passed since, so an image a
/// restarted node has not seen used yet is not taken for unused).
#[must_use]
pub fn too_old(c: &Candidate, policy: &GcPolicy, now: Duration, began: Duration) -> bool {
    !policy.max_age.is_zero()
        && now.saturating_sub(began) > policy.max_age
        && now.saturating_sub(c.record.last_used) > policy.max_age
}

/// Why the space rule cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GcError {
    /// kubelet's `InvalidDiskCapacity` event.
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
}

/// The space rule: the bytes to free when the image filesystem's usage is at or above the
/// high threshold (`capacity * (100 - low) / 100 - available`), else `None`.
pub fn amount_to_free(
    capacity: u64,
    available: u64,
    policy: &GcPolicy,
) -> Result<Option<u64>, GcError> {
    if capacity == 0 {
        return Err(GcError::InvalidCapacity);
    }
    let available = available.min(capacity);
    let usage_percent = 100 - u128::from(available) * 100 / u128::from(capacity);
    if usage_percent < u128::from(policy.high_percent) {
        return Ok(None);
    }
    let target_free = u128::from(capacity) * u128::from(100 - policy.low_percent.min(100)) / 100;
    let amount = target_free.saturating_sub(u128::from(available));
    Ok(Some(u64::try_from(amount).unwrap_or(u64::MAX)))
}

/// `freeSpace`'s test for one candidate: not used at or after `now` (an image in use got a
/// newer last use) and detected at least `min_age` ago.
#[must_use]
pub fn may_free_for_space(c: &Candidate, policy: &GcPolicy, now: Duration) -> bool {
    c.record.last_used < now && now.saturating_sub(c.record.first_detected) >= policy.min_age
}

/// kubelet's `FreeDiskSpaceFailed` message when not enough was eligible.
#[must_use]
pub fn free_failed_message(amount: u64, freed: u64) -> String {
    format!(
        "Failed to garbage collect required amount of images. Attempted to free {amount} bytes, but only found {freed} bytes eligible to free."
    )
}
