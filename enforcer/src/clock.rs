//! The wall clock as the node's records write it: nanoseconds since the Unix epoch, and
//! Kubernetes' RFC 3339 time of whole seconds. (The monotonic clock of the signal path is
//! `signal::monotonic_ns`.)

/// Now, as nanoseconds since the Unix epoch.
#[must_use]
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// `nanos` since the Unix epoch as Kubernetes writes a time (`metav1.Time`: RFC 3339, whole
/// seconds, UTC); empty for a time not set (0 or before the epoch).
#[must_use]
pub fn rfc3339(nanos: i64) -> String {
    if nanos <= 0 {
        return String::new();
    }
    // Whole seconds: the fraction is dropped, as the format has none.
    k8s_openapi::jiff::Timestamp::from_second(nanos / 1_000_000_000)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn whole_seconds_in_utc_and_nothing_for_a_time_not_set() {
        assert_eq!(
            super::rfc3339(1_700_000_000_900_000_000),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(super::rfc3339(0), "");
        assert!(super::now_nanos() > 1_700_000_000_000_000_000);
    }
}
