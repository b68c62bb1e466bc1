//! kubelet's exec prober (`pkg/probe/exec`) through CRI `ExecSync`.

use std::time::Duration;

use super::Outcome;
use crate::cri::{ContainerRuntime, CriError, ExecOutput};

/// kubelet's exec probe keeps at most this much output (`maxReadLength`).
const MAX_EXEC_OUTPUT: usize = 10 * 1024;

/// Whether a CRI error is the exec's own timeout (kubelet's `DeadlineExceeded` check).
fn is_exec_timeout(e: &CriError) -> bool {
    match e {
        CriError::Timeout { .. } => true,
        CriError::Status { code, message, .. } => {
            *code == tonic::Code::DeadlineExceeded || message.contains("deadline exceeded")
        }
        _ => false,
    }
}

/// stdout then stderr, at most kubelet's `maxReadLength` (10 KiB) of them.
fn combined_output(out: &ExecOutput) -> String {
    let bytes: Vec<u8> = out
        .stdout
        .iter()
        .chain(&out.stderr)
        .take(MAX_EXEC_OUTPUT)
        .copied()
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// kubelet's exec probe through CRI `ExecSync`: exit 0 succeeds; the output is stdout then
/// stderr; a timeout fails with kubelet's `command "..." timed out`.
pub async fn exec_probe<R: ContainerRuntime>(
    rt: &R,
    container_id: &str,
    command: &[String],
    timeout: Duration,
) -> Outcome {
    match rt.exec_sync(container_id, command.to_vec(), timeout).await {
        Ok(out) => {
            let text = combined_output(&out);
            if out.exit_code == 0 {
                Outcome::Success(text)
            } else {
                Outcome::Failure(text)
            }
        }
        Err(e) if is_exec_timeout(&e) => {
            Outcome::Failure(format!("command {:?} timed out", command.join(" ")))
        }
        Err(e) => Outcome::Error(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_output_is_stdout_then_stderr_capped_at_10_kib() {
        let out = ExecOutput {
            exit_code: 1,
            stdout: b"out ".to_vec(),
            stderr: b"err".to_vec(),
        };
        assert_eq!(combined_output(&out), "out err");
        let big = ExecOutput {
            exit_code: 1,
            stdout: vec![b'x'; 8 * 1024],
            stderr: vec![b'y'; 8 * 1024],
        };
        let text = combined_output(&big);
        assert_eq!(text.len(), MAX_EXEC_OUTPUT);
        assert!(text.starts_with('x') && text.ends_with('y'));
    }
}
