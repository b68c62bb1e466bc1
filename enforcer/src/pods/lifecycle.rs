//! Lifecycle hooks and the termination message, as kubelet runs and reads them
//! (`pkg/kubelet/lifecycle/handlers.go`, `kuberuntime_container.go`).
//!
//! - `postStart` runs right after `StartContainer`; the pod worker kills the container
//!   when it fails (`FailedPostStartHook`, waiting `PostStartHookError`).
//! - `preStop` runs before `StopContainer`, bounded by the grace period, and its time is
//!   taken from it ([`remaining_grace`]); a failure is an event and the stop goes on.
//! - The termination message: the file bind-mounted at `terminationMessagePath`
//!   ([`message_file`]), else with `FallbackToLogsOnError` and a failed container the tail of
//!   its log ([`log_tail`]).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Probe};

use k8s_cri::v1 as cri;

use crate::{
    cri::ContainerRuntime,
    pods::probe::{self, Handler, Outcome, ProbeSpec, ProbeSpecError, ProbeType},
};

/// kubelet's `MaxContainerTerminationMessageLength`: the last 4 KiB of the file.
pub const MAX_MESSAGE_BYTES: u64 = 4096;
/// kubelet's `MaxContainerTerminationMessageLogLines`.
pub const MAX_LOG_LINES: usize = 80;
/// kubelet's `MaxContainerTerminationMessageLogLength`: the last 2 KiB of those lines.
pub const MAX_LOG_BYTES: usize = 2048;
/// How long an exec `postStart` may run: kubelet passes no timeout, so its runtime request
/// timeout (2 min) bounds the `ExecSync`.
pub const POST_START_EXEC_TIMEOUT: Duration = Duration::from_secs(120);
/// The default `terminationMessagePath`.
pub const DEFAULT_MESSAGE_PATH: &str = "/dev/termination-log";

/// Why a lifecycle handler cannot run (kubelet's event: `Cannot run handler: <why>`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    #[error("may not specify more than 1 handler type")]
    TwoHandlers,
    /// Deprecated; kubelet does not run it.
    #[error("tcpSocket lifecycle hooks are not supported")]
    TcpSocket,
    /// An exec or httpGet handler that cannot run as a probe.
    #[error("{0}")]
    Handler(#[from] ProbeSpecError),
    /// kubelet's message for an exec hook that failed (`error`), with its output.
    #[error(
        "Exec lifecycle hook ({shown}) for Container {container:?} in Pod {pod:?} failed - error: {error}, message: {output:?}"
    )]
    Exec {
        shown: String,
        container: String,
        pod: String,
        error: String,
        output: String,
    },
    /// kubelet's message for an httpGet hook that got no answer.
    #[error(
        "HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - error: {error}"
    )]
    Http {
        path: String,
        container: String,
        pod: String,
        error: String,
    },
    #[error("Cannot run handler: invalid lifecycle handler {0:?}")]
    InvalidHandler(Handler),
}

/// A lifecycle handler, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hook {
    /// exec or httpGet, run as the probe runners run them.
    Probe(Handler),
    Sleep {
        seconds: i64,
    },
}

impl Hook {
    /// The handler of `h` in container `c`, or why it cannot run.
    pub fn parse(h: &LifecycleHandler, c: &Container) -> Result<Self, HookError> {
        if let Some(s) = &h.sleep {
            if h.exec.is_some() || h.http_get.is_some() || h.tcp_socket.is_some() {
                return Err(HookError::TwoHandlers);
            }
            return Ok(Self::Sleep { seconds: s.seconds });
        }
        if h.tcp_socket.is_some() {
            // Deprecated; kubelet does not run it.
            return Err(HookError::TcpSocket);
        }
        let as_probe = Probe {
            exec: h.exec.clone(),
            http_get: h.http_get.clone(),
            ..Probe::default()
        };
        let parsed = ProbeSpec::parse(ProbeType::Readiness, &as_probe, c).handler?;
        Ok(Self::Probe(match (parsed, &h.exec) {
            // kubelet runs a hook's command as written (no `$(VAR)` expansion, unlike probes).
            (Handler::Exec { .. }, Some(e)) => Handler::Exec {
                command: e.command.clone().unwrap_or_default(),
            },
            (other, _) => other,
        }))
    }
}

/// Runs a hook in a container whose pod answers at `pod_host`; the error is kubelet's
/// message (`Exec lifecycle hook (...) for Container "c" in Pod "p" failed - error: ...`).
/// `pod` is kubelet's `format.Pod` (`name_namespace(uid)`).
pub async fn run_hook<R: ContainerRuntime>(
    rt: &R,
    container_id: &str,
    container: &str,
    pod: &str,
    hook: &Hook,
    pod_host: &str,
    exec_timeout: Duration,
) -> Result<(), HookError> {
    match hook {
        Hook::Sleep { seconds } => {
            tokio::time::sleep(Duration::from_secs(u64::try_from(*seconds).unwrap_or(0))).await;
            Ok(())
        }
        Hook::Probe(Handler::Exec { command }) => {
            let shown = format!("[{}]", command.join(" "));
            let (error, output) = match rt
                .exec_sync(container_id, command.clone(), exec_timeout)
                .await
            {
                Ok(out) if out.exit_code == 0 => return Ok(()),
                Ok(out) => {
                    let mut all = out.stdout.clone();
                    all.extend_from_slice(&out.stderr);
                    (
                        format!(
                            "command '{}' exited with {}: {}",
                            command.join(" "),
                            out.exit_code,
                            String::from_utf8_lossy(&out.stderr)
                        ),
                        String::from_utf8_lossy(&all).into_owned(),
                    )
                }
                Err(e) => (e.to_string(), String::new()),
            };
            Err(HookError::Exec {
                shown,
                container: container.to_owned(),
                pod: pod.to_owned(),
                error,
                output,
            })
        }
        Hook::Probe(h @ Handler::Http { path, .. }) => {
            // kubelet's lifecycle HTTP client follows redirects and ignores the status
            // code: only a request that gets no answer fails.
            match probe::run_handler(rt, container_id, h, exec_timeout, pod_host).await {
                Outcome::Success(_) | Outcome::Warning(_) => Ok(()),
                Outcome::Failure(m) if m.starts_with("HTTP probe failed with statuscode") => Ok(()),
                Outcome::Failure(error) | Outcome::Error(error) => Err(HookError::Http {
                    path: path.clone(),
                    container: container.to_owned(),
                    pod: pod.to_owned(),
                    error,
                }),
            }
        }
        Hook::Probe(other) => Err(HookError::InvalidHandler(other.clone())),
    }
}

/// kubelet's `killContainer`: the grace period left after the preStop hook took `elapsed`
/// (whole seconds, as kubelet counts them), never below the 2 s minimum.
#[must_use]
pub fn remaining_grace(grace: i64, elapsed: Duration) -> i64 {
    let spent = i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX);
    grace
        .saturating_sub(spent)
        .max(crate::cri::spec::MIN_GRACE_SECONDS)
}

/// The host file bind-mounted at the container's termination message path
/// (`terminationMessagePath` from the container's annotation).
#[must_use]
pub fn message_file(status: &cri::ContainerStatus) -> Option<PathBuf> {
    let path = status
        .annotations
        .get(crate::cri::spec::TERMINATION_MESSAGE_PATH_ANNOTATION)?;
    if path.is_empty() {
        return None;
    }
    status
        .mounts
        .iter()
        .find(|m| &m.container_path == path)
        .map(|m| PathBuf::from(&m.host_path))
}

/// kubelet's `getTerminationMessage` and `readLastStringFromContainerLogs` for an exited
/// container: the last 4 KiB of the message file; with `FallbackToLogsOnError`, a non-zero
/// exit and no message, the tail of the log.
#[must_use]
pub fn termination_message(status: &cri::ContainerStatus) -> String {
    let fallback = status
        .annotations
        .get(crate::cri::spec::TERMINATION_MESSAGE_POLICY_ANNOTATION)
        .is_some_and(|p| p == "FallbackToLogsOnError")
        && status.exit_code != 0
        && status.reason != "ContainerCannotRun";
    let from_file = match message_file(status) {
        Some(path) => match read_last(&path, MAX_MESSAGE_BYTES) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return format!("Error on reading termination log {}: {e}", path.display());
            }
        },
        None => String::new(),
    };
    if !from_file.is_empty() || !fallback {
        return from_file;
    }
    match std::fs::read(&status.log_path) {
        Ok(content) => log_tail(&content),
        Err(e) => format!("Error on reading termination message from logs: {e}"),
    }
}

/// The last `max` bytes of a file.
fn read_last(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len > max {
        f.seek(SeekFrom::Start(len - max))?;
    }
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The content of a CRI log file (`<time> <stream> <P|F> <text>` lines) from its last 80
/// lines, keeping the last 2 KiB (kubelet's `ReadLogs` with `TailLines: 80` into a
/// circular buffer).
#[must_use]
pub fn log_tail(content: &[u8]) -> String {
    let lines: Vec<&[u8]> = content
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let start = lines.len().saturating_sub(MAX_LOG_LINES);
    let mut out = Vec::new();
    for line in &lines[start..] {
        let mut fields = line.splitn(4, |b| *b == b' ');
        let (_time, _stream, tag, text) =
            (fields.next(), fields.next(), fields.next(), fields.next());
        let Some(text) = text else {
            continue;
        };
        out.extend_from_slice(text);
        if tag != Some(b"P".as_slice()) {
            out.push(b'\n');
        }
    }
    let keep = out.len().saturating_sub(MAX_LOG_BYTES);
    String::from_utf8_lossy(&out[keep..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_left_after_pre_stop_never_below_the_minimum() {
        for (grace, spent, left) in [(30, 0, 30), (30, 3, 27), (10, 9, 2), (5, 60, 2), (1, 0, 2)] {
            assert_eq!(
                remaining_grace(grace, Duration::from_millis(spent * 1000 + 999)),
                left,
                "{grace} {spent}"
            );
        }
    }

    fn handler(yaml: &str) -> Result<Hook, HookError> {
        let c: Container = serde_yaml_ng::from_str(
            "{name: c, env: [{name: X, value: x}], ports: [{name: web, containerPort: 8080}]}",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let h: LifecycleHandler = serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}"));
        Hook::parse(&h, &c)
    }

    #[test]
    fn hooks_parse_as_kubelet_runs_them() {
        assert_eq!(
            handler("{exec: {command: [echo, '$(X)']}}"),
            Ok(Hook::Probe(Handler::Exec {
                command: vec!["echo".to_owned(), "$(X)".to_owned()]
            }))
        );
        assert_eq!(
            handler("{sleep: {seconds: 4}}"),
            Ok(Hook::Sleep { seconds: 4 })
        );
        assert!(matches!(
            handler("{httpGet: {port: web, path: drain}}"),
            Ok(Hook::Probe(Handler::Http { port: 8080, ref path, host: None, .. })) if path == "/drain"
        ));
        assert!(handler("{tcpSocket: {port: 80}}").is_err());
        assert!(handler("{sleep: {seconds: 1}, exec: {command: [x]}}").is_err());
        assert!(handler("{}").is_err());
    }

    /// kubelet's lifecycle HTTP client does not look at the status code: any answer is a
    /// success; no answer is a failure with kubelet's message.
    #[tokio::test]
    async fn an_http_hook_fails_only_without_an_answer() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = l.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
                    .await;
            }
        });
        let rt = crate::cri::fake::FakeRuntime::with_images(&[]);
        let hook = |port: u16| {
            Hook::Probe(Handler::Http {
                scheme: probe::Scheme::Http,
                host: None,
                port,
                path: "/drain".to_owned(),
                headers: Vec::new(),
            })
        };
        let run = |h: Hook| {
            let rt = rt.clone();
            async move {
                run_hook(
                    &rt,
                    "id",
                    "c",
                    "p_ns(u)",
                    &h,
                    "127.0.0.1",
                    Duration::from_secs(2),
                )
                .await
            }
        };
        assert_eq!(run(hook(port)).await, Ok(()));
        server.abort();
        let _ = server.await;
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("{e}"));
        let err = run(hook(closed))
            .await
            .expect_err("nothing listens")
            .to_string();
        assert!(
            err.starts_with(
                "HTTP lifecycle hook (/drain) for Container \"c\" in Pod \"p_ns(u)\" failed - error: "
            ),
            "{err}"
        );
    }

    #[test]
    fn log_tail_strips_the_cri_framing_and_keeps_the_last_lines_and_bytes() {
        let mut log = String::new();
        for i in 0..100 {
            log.push_str(&format!(
                "2026-01-01T00:00:00.000000000Z stdout F line {i}\n"
            ));
        }
        log.push_str("2026-01-01T00:00:01Z stderr P part \n2026-01-01T00:00:01Z stderr F end\n");
        let tail = log_tail(log.as_bytes());
        assert!(tail.starts_with("line 22\n"), "{tail}");
        assert!(tail.ends_with("line 99\npart end\n"), "{tail}");
        let long: String = (0..80)
            .map(|i| format!("t stdout F {}\n", "x".repeat(50) + &i.to_string()))
            .collect();
        let tail = log_tail(long.as_bytes());
        assert_eq!(tail.len(), MAX_LOG_BYTES);
        assert!(tail.ends_with("x79\n"));
    }

    fn exited(code: i32, policy: &str, file: Option<&Path>, log: &Path) -> cri::ContainerStatus {
        let mut st = cri::ContainerStatus {
            exit_code: code,
            log_path: log.display().to_string(),
            ..Default::default()
        };
        st.annotations.insert(
            crate::cri::spec::TERMINATION_MESSAGE_PATH_ANNOTATION.to_owned(),
            "/dev/termination-log".to_owned(),
        );
        st.annotations.insert(
            crate::cri::spec::TERMINATION_MESSAGE_POLICY_ANNOTATION.to_owned(),
            policy.to_owned(),
        );
        if let Some(f) = file {
            st.mounts.push(cri::Mount {
                container_path: "/dev/termination-log".to_owned(),
                host_path: f.display().to_string(),
                ..Default::default()
            });
        }
        st
    }

    #[test]
    fn the_message_file_then_the_log_only_on_failure_with_fallback() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("msg");
        let log = dir.path().join("0.log");
        std::fs::write(&log, "2026-01-01T00:00:00Z stdout F boom\n")
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&file, "").unwrap_or_else(|e| panic!("{e}"));
        let fb = "FallbackToLogsOnError";
        assert_eq!(
            termination_message(&exited(1, fb, Some(&file), &log)),
            "boom\n"
        );
        assert_eq!(termination_message(&exited(0, fb, Some(&file), &log)), "");
        assert_eq!(
            termination_message(&exited(1, "File", Some(&file), &log)),
            ""
        );
        assert_eq!(termination_message(&exited(1, fb, None, &log)), "boom\n");
        std::fs::write(&file, "y".repeat(5000) + "bye").unwrap_or_else(|e| panic!("{e}"));
        let m = termination_message(&exited(1, fb, Some(&file), &log));
        assert_eq!(m.len(), 4096);
        assert!(m.ends_with("bye"));
    }
}
