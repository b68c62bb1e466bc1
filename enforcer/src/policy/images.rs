//! kubelet's image manager, the pure half (`pkg/kubelet/images`, `pkg/credentialprovider`):
//! image references and their default tag, the registry pull limiter, the pull errors as the
//! container's waiting reason, the pull secrets' keyring, and the image garbage collector's
//! choices. The I/O half (CRI pulls, the serial or parallel puller, the collector's loop) is
//! `crate::cri::images`.
//!
//! - [`reference`]: `applyDefaultImageTag` and the reference grammar behind it.
//! - [`keyring`]: docker config files and `imagePullSecrets` as credentials per registry.
//! - [`gc`]: `image_gc_manager.go`'s records, eviction order, age and space decisions.

pub mod gc;
pub mod keyring;
pub mod reference;

use std::time::Duration;

/// kubelet's waiting reasons for a container whose image is not there (`images/types.go`).
pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
/// The pull failed recently and its backoff has not passed.
pub const ERR_IMAGE_PULL_BACKOFF: &str = "ImagePullBackOff";
/// Not present and the pull policy is `Never`.
pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
/// The reference does not parse.
pub const ERR_INVALID_IMAGE_NAME: &str = "InvalidImageName";
/// The runtime said the registry is unavailable (CRI's `RegistryUnavailable` prefix).
pub const ERR_REGISTRY_UNAVAILABLE: &str = "RegistryUnavailable";
/// The runtime said the image's signature did not validate.
pub const ERR_SIGNATURE_VALIDATION_FAILED: &str = "SignatureValidationFailed";

/// The error text of kubelet's throttled image service when the token bucket is empty.
pub const PULL_QPS_EXCEEDED: &str = "pull QPS exceeded";

/// kubelet's `evalCRIPullErr`: the container's waiting reason and message for a failed pull.
#[must_use]
pub fn pull_error(image: &str, error: &str) -> (&'static str, String) {
    if let Some(rest) = error.strip_prefix(ERR_REGISTRY_UNAVAILABLE) {
        return (
            ERR_REGISTRY_UNAVAILABLE,
            format!("image pull failed for {image} because the registry is unavailable{rest}"),
        );
    }
    if let Some(rest) = error.strip_prefix(ERR_SIGNATURE_VALIDATION_FAILED) {
        return (
            ERR_SIGNATURE_VALIDATION_FAILED,
            format!("image pull failed for {image} because the signature validation failed{rest}"),
        );
    }
    (ERR_IMAGE_PULL, error.to_owned())
}

/// `utilerrors.NewAggregate(errs).Error()`: one error (or several with the same text) as it
/// is, else the distinct texts as `[a, b]`.
#[must_use]
pub fn aggregate(errors: &[String]) -> String {
    let mut distinct: Vec<&String> = Vec::new();
    for e in errors {
        if !distinct.contains(&e) {
            distinct.push(e);
        }
    }
    match distinct.as_slice() {
        [one] => (*one).clone(),
        many => format!(
            "[{}]",
            many.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A Go `time.Duration` printed as Go prints it (`1.234s`, `567ms`, `2m3.5s`), truncated to
/// the millisecond first as kubelet's pull event does.
#[must_use]
pub fn go_duration_ms(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let total_s = ms / 1000;
    let frac = ms % 1000;
    let (h, m, s) = (total_s / 3600, (total_s / 60) % 60, total_s % 60);
    let secs = if frac == 0 {
        format!("{s}s")
    } else {
        let f = format!("{frac:03}");
        format!("{s}.{}s", f.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// kubelet's `Successfully pulled` event text.
#[must_use]
pub fn pulled_message(
    image: &str,
    pull: Duration,
    including_waiting: Duration,
    size: u64,
) -> String {
    format!(
        "Successfully pulled image \"{image}\" in {} ({} including waiting). Image size: {size} bytes.",
        go_duration_ms(pull),
        go_duration_ms(including_waiting),
    )
}

/// `metrics.GetImageSizeBucket`: the `image_size_in_bytes` label of
/// `kubelet_image_pull_duration_seconds` (`N/A` for 0; a size on a boundary belongs to the
/// lower bucket).
#[must_use]
pub fn image_size_bucket(size: u64) -> &'static str {
    const MB: u64 = 1024 * 1024;
    const GB: u64 = 1024 * MB;
    const BUCKETS: [(u64, &str); 12] = [
        (100 * GB, "GT100GB"),
        (60 * GB, "60GB-100GB"),
        (40 * GB, "40GB-60GB"),
        (30 * GB, "30GB-40GB"),
        (20 * GB, "20GB-30GB"),
        (10 * GB, "10GB-20GB"),
        (5 * GB, "5GB-10GB"),
        (GB, "1GB-5GB"),
        (500 * MB, "500MB-1GB"),
        (100 * MB, "100MB-500MB"),
        (10 * MB, "10MB-100MB"),
        (0, "0-10MB"),
    ];
    if size == 0 {
        return "N/A";
    }
    BUCKETS
        .iter()
        .find(|(lower, _)| size > *lower)
        .map_or("", |(_, label)| label)
}

/// kubelet's `kubelet_image_pull_duration_seconds` buckets.
pub const IMAGE_PULL_DURATION_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];

/// The registry pull limiter (`registryPullQPS`, `registryBurst`): client-go's token bucket
/// (`flowcontrol.NewTokenBucketRateLimiter`, golang.org/x/time/rate underneath), full at the
/// start, refilled at `qps` tokens a second up to `burst`. kubelet's throttled image service
/// asks it with `TryAccept`: a pull past the limit fails at once with
/// [`PULL_QPS_EXCEEDED`] (and the pod goes to backoff); it never waits.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Option<Duration>,
}

impl TokenBucket {
    /// The limiter for `registryPullQPS` and `registryBurst`; `None` when `qps` is 0 (no limit,
    /// as kubelet wraps the image service only for a positive QPS).
    #[must_use]
    pub fn new(qps: u32, burst: u32) -> Option<Self> {
        (qps > 0).then(|| Self {
            qps: f64::from(qps),
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last: None,
        })
    }

    /// `TryAccept` at `now` (any monotonic epoch): takes a token if there is one.
    pub fn try_accept(&mut self, now: Duration) -> bool {
        if let Some(last) = self.last
            && now > last
        {
            let refill = (now - last).as_secs_f64() * self.qps;
            self.tokens = (self.tokens + refill).min(self.burst);
        }
        if self.last.is_none_or(|l| now > l) {
            self.last = Some(now);
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests;
