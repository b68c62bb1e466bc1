//! `/debug`: log verbosity at run time and CPU profiles.
//!
//! **`PUT /debug/flags/v`** with a number (kubelet's klog verbosity) replaces the log filter:
//!
//! | v | filter | what appears |
//! |---|---|---|
//! | 0 to 2 | `info` | errors, warnings, info (the default) |
//! | 3 and 4 | `info,enforcer=debug` | the enforcer's debug lines too, among them one per HTTP request (kubelet logs requests from v=3) |
//! | 5 and more | `info,enforcer=trace` | the enforcer's trace lines too |
//!
//! The libraries' own debug lines stay off (a filter set with `RUST_LOG` at start is
//! replaced by the first `PUT`). The answer is kubelet's: `successfully set
//! klog.logging.verbosity to N`. The filter is changed through the reload handle main.rs
//! installs with [`install_verbosity`]; without one (the library in a test) it is 501.
//!
//! **`GET /debug/pprof/profile?seconds=N`** samples the CPU of every thread for N seconds
//! (default 30, at most [`MAX_PROFILE_SECONDS`]) at 99 Hz and answers a gzip-free pprof
//! protobuf (`go tool pprof` reads it). One profile at a time (409 while one runs).
//!
//! **`GET /debug/pprof/heap`** is 501: the daemon uses the system allocator, which keeps no
//! record of live allocations (a heap profile needs e.g. jemalloc with profiling).

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    extract::Query,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

/// Longest CPU profile served.
pub const MAX_PROFILE_SECONDS: u64 = 60;
/// Default profile length (Go's).
pub const DEFAULT_PROFILE_SECONDS: u64 = 30;
/// Sampling frequency of CPU profiles (Hz; 99, not 100, to avoid lockstep with timers).
pub const PROFILE_FREQUENCY: i32 = 99;

/// Changes the log filter (an `EnvFilter` directive string); the error is the filter's or
/// the reload's.
pub type VerbositySetter =
    Box<dyn Fn(&str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> + Send + Sync>;

/// Why a CPU profile is not taken (400 for the request, 500 for the profiler).
#[derive(Debug, thiserror::Error)]
enum DebugError {
    #[error(
        "seconds must be a whole number from 1 to {max}, got {0:?}\n",
        max = MAX_PROFILE_SECONDS
    )]
    Seconds(String),
    #[error("{0}")]
    Profiler(#[from] pprof::Error),
}

static VERBOSITY: OnceLock<VerbositySetter> = OnceLock::new();

/// Installs the log filter setter (main.rs, with the subscriber); false if one was already.
pub fn install_verbosity(setter: VerbositySetter) -> bool {
    VERBOSITY.set(setter).is_ok()
}

/// The log filter for kubelet's verbosity `v` (see the module doc).
#[must_use]
pub fn filter_for_verbosity(v: u32) -> &'static str {
    match v {
        0..=2 => "info",
        3 | 4 => "info,enforcer=debug",
        _ => "info,enforcer=trace",
    }
}

fn plain(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

pub(super) async fn set_verbosity(body: String) -> Response {
    let Ok(v) = body.trim().parse::<u32>() else {
        return plain(
            StatusCode::BAD_REQUEST,
            format!(
                "the body must be a verbosity number, got {:?}\n",
                body.trim()
            ),
        );
    };
    let Some(set) = VERBOSITY.get() else {
        return plain(
            StatusCode::NOT_IMPLEMENTED,
            "this process has no reloadable log filter\n".to_owned(),
        );
    };
    match set(filter_for_verbosity(v)) {
        Ok(()) => {
            tracing::info!(v, filter = filter_for_verbosity(v), "log verbosity changed");
            plain(
                StatusCode::OK,
                format!("successfully set klog.logging.verbosity to {v}"),
            )
        }
        Err(e) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("changing the log filter: {e}\n"),
        ),
    }
}

#[derive(Debug, serde::Deserialize)]
pub(super) struct ProfileParams {
    seconds: Option<String>,
}

static PROFILING: AtomicBool = AtomicBool::new(false);

/// Clears [`PROFILING`] when the profile ends (also when the request is dropped).
struct ProfilingSlot;

impl Drop for ProfilingSlot {
    fn drop(&mut self) {
        PROFILING.store(false, Ordering::Release);
    }
}

/// The requested length: `seconds` absent is the default; beyond the bound is an error.
fn profile_seconds(raw: Option<&str>) -> Result<u64, DebugError> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_PROFILE_SECONDS);
    };
    match raw.trim().parse::<u64>() {
        Ok(n) if (1..=MAX_PROFILE_SECONDS).contains(&n) => Ok(n),
        _ => Err(DebugError::Seconds(raw.to_owned())),
    }
}

pub(super) async fn profile(Query(p): Query<ProfileParams>) -> Response {
    let seconds = match profile_seconds(p.seconds.as_deref()) {
        Ok(s) => s,
        Err(e) => return plain(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if PROFILING
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return plain(
            StatusCode::CONFLICT,
            "a CPU profile is already being taken\n".to_owned(),
        );
    }
    let slot = ProfilingSlot;
    // The profiler's guard is not Send: the whole profile runs on a blocking thread.
    let task = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        take_profile(Duration::from_secs(seconds))
    });
    match task.await {
        Ok(Ok(body)) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile\"",
                ),
            ],
            body,
        )
            .into_response(),
        Ok(Err(e)) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("taking the CPU profile: {e}\n"),
        ),
        Err(e) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the profiling thread failed: {e}\n"),
        ),
    }
}

/// Samples every thread for `length` and encodes the pprof protobuf.
fn take_profile(length: Duration) -> Result<Vec<u8>, DebugError> {
    use pprof::protos::Message as _;
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(PROFILE_FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()?;
    std::thread::sleep(length);
    let report = guard.report().build()?;
    drop(guard);
    let profile = report.pprof()?;
    Ok(profile.encode_to_vec())
}

pub(super) async fn heap() -> Response {
    plain(
        StatusCode::NOT_IMPLEMENTED,
        "heap profiles are not available: the enforcer uses the system allocator, which keeps \
         no record of live allocations (a heap profile needs a profiling allocator such as \
         jemalloc with prof enabled); use /debug/pprof/profile for CPU\n"
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_levels_and_profile_bounds() {
        for (v, want) in [
            (0, "info"),
            (2, "info"),
            (3, "info,enforcer=debug"),
            (4, "info,enforcer=debug"),
            (5, "info,enforcer=trace"),
            (10, "info,enforcer=trace"),
        ] {
            assert_eq!(filter_for_verbosity(v), want, "v={v}");
            assert!(
                tracing_subscriber::EnvFilter::try_new(want).is_ok(),
                "{want}"
            );
        }
        assert_eq!(profile_seconds(None).ok(), Some(DEFAULT_PROFILE_SECONDS));
        assert_eq!(profile_seconds(Some("1")).ok(), Some(1));
        assert_eq!(profile_seconds(Some("60")).ok(), Some(60));
        assert_eq!(
            profile_seconds(Some("61")).map_err(|e| e.to_string()),
            Err("seconds must be a whole number from 1 to 60, got \"61\"\n".to_owned())
        );
        for bad in ["0", "61", "-1", "x", "1.5"] {
            assert!(profile_seconds(Some(bad)).is_err(), "{bad}");
        }
    }
}
