//! Images: the pull knobs and the image garbage collector, validated as kubelet's
//! `ValidateKubeletConfiguration` validates them.

use std::{path::PathBuf, time::Duration};

use super::{Key, Namer, Sourced, duration_setting, key};
use crate::config::{ConfigArgs, ConfigError, ImageConfig, KubeletConfiguration};

fn percent(
    n: &Namer<'_>,
    key: Key,
    flag: Option<i32>,
    file: Option<i32>,
    default: i32,
) -> Result<(u8, bool), ConfigError> {
    let v = Sourced::pick(flag, file);
    let value = v.value.unwrap_or(default);
    u8::try_from(value)
        .ok()
        .filter(|p| *p <= 100)
        .map(|p| (p, v.from_flag))
        .ok_or_else(|| {
            n.invalid(
                key,
                v.from_flag,
                value.to_string(),
                "must be between 0 and 100, inclusive",
            )
        })
}

/// `maxParallelImagePulls` and the image garbage collector's settings.
pub(super) fn images(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
    serialize_image_pulls: bool,
) -> Result<ImageConfig, ConfigError> {
    let max_parallel_image_pulls = match doc.max_parallel_image_pulls {
        None => None,
        Some(v) if v < 1 => {
            return Err(n.invalid(
                key::MAX_PARALLEL_IMAGE_PULLS,
                false,
                v.to_string(),
                "must be a positive number",
            ));
        }
        Some(v) if v > 1 && serialize_image_pulls => {
            return Err(n.invalid(
                key::MAX_PARALLEL_IMAGE_PULLS,
                false,
                v.to_string(),
                "cannot be larger than 1 unless serializeImagePulls (--serialize-image-pulls) is set to false",
            ));
        }
        Some(v) => u32::try_from(v).ok(),
    };
    let (high, _) = percent(
        n,
        key::IMAGE_GC_HIGH_THRESHOLD_PERCENT,
        args.image_gc_high_threshold,
        doc.image_gc_high_threshold_percent,
        85,
    )?;
    let (low, low_from_flag) = percent(
        n,
        key::IMAGE_GC_LOW_THRESHOLD_PERCENT,
        args.image_gc_low_threshold,
        doc.image_gc_low_threshold_percent,
        80,
    )?;
    if low >= high {
        return Err(n.invalid(
            key::IMAGE_GC_LOW_THRESHOLD_PERCENT,
            low_from_flag,
            low.to_string(),
            format!(
                "must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"
            ),
        ));
    }
    let min_age = duration_setting(
        n,
        key::IMAGE_MINIMUM_GC_AGE,
        args.minimum_image_ttl_duration.as_ref(),
        doc.image_minimum_gc_age.as_ref(),
        Duration::from_secs(120),
    )?;
    let max_age = duration_setting(
        n,
        key::IMAGE_MAXIMUM_GC_AGE,
        None,
        doc.image_maximum_gc_age.as_ref(),
        Duration::ZERO,
    )?;
    if !max_age.is_zero() && min_age >= max_age {
        return Err(n.invalid(
            key::IMAGE_MAXIMUM_GC_AGE,
            false,
            doc.image_maximum_gc_age
                .as_ref()
                .map(|s| s.0.clone())
                .unwrap_or_default(),
            format!(
                "must be greater than imageMinimumGCAge {}",
                crate::duration::format(min_age)
            ),
        ));
    }
    Ok(ImageConfig {
        max_parallel_image_pulls,
        image_gc_high_threshold_percent: high,
        image_gc_low_threshold_percent: low,
        image_minimum_gc_age: min_age,
        image_maximum_gc_age: max_age,
    })
}

/// The `enforcer:` section's image settings: the collector's period (kubelet's fixed 5m) and
/// where standalone pull secrets are.
pub(super) fn section(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
) -> Result<(Duration, PathBuf), ConfigError> {
    let e = doc.enforcer.clone().unwrap_or_default();
    let period = duration_setting(
        n,
        key::IMAGE_GC_PERIOD,
        None,
        e.image_gc_period.as_ref(),
        crate::policy::images::gc::GC_PERIOD,
    )?;
    if period.is_zero() {
        return Err(n.invalid(
            key::IMAGE_GC_PERIOD,
            false,
            "0s",
            "must be greater than zero",
        ));
    }
    let dir = e
        .image_pull_secret_dir
        .unwrap_or_else(|| PathBuf::from("/etc/enforcer/pull-secrets"));
    if !dir.is_absolute() {
        return Err(n.invalid(
            key::IMAGE_PULL_SECRET_DIR,
            false,
            dir.display().to_string(),
            "must be an absolute path",
        ));
    }
    Ok((period, dir))
}
