//! The `enforcer` binary run as a process by a test, as a service manager runs it: its log
//! in a file, stopped by SIGTERM or killed by SIGKILL (by its PID only), the last lines of
//! its log shown when the test fails.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

/// One `enforcer` process the test started.
pub struct DaemonProcess {
    child: Child,
    log: PathBuf,
}

impl DaemonProcess {
    /// `enforcer <args>` (no `RUST_LOG` from the test's environment), its stderr to `log`.
    #[must_use]
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(args: &[S], log: &Path) -> Self {
        let mut cmd = Command::new(crate::enforcer_binary());
        cmd.args(args).env_remove("RUST_LOG");
        Self::spawn_cmd(cmd, log)
    }

    /// `cmd` (an `enforcer` command line), its stderr to `log` (appended: a restart's log
    /// follows the last run's).
    #[must_use]
    pub fn spawn_cmd(mut cmd: Command, log: &Path) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let child = cmd
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("the enforcer binary runs");
        Self {
            child,
            log: log.to_path_buf(),
        }
    }

    /// Its log so far.
    #[must_use]
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    #[must_use]
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid")
    }

    /// Whether it has ended (and how).
    pub fn ended(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until its log holds `needle` (bounded by `timeout`, scaled); fails the test if
    /// it ends first.
    pub async fn wait_for_log(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + crate::scaled(timeout);
        while !self.log_text().contains(needle) {
            let ended = self.ended();
            assert!(
                ended.is_none() && Instant::now() < deadline,
                "waiting for '{needle}' in the daemon's log (ended: {ended:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, and its exit (bounded by `timeout`, scaled).
    pub async fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        crate::kill(self.pid(), rustix::process::Signal::TERM);
        let deadline = Instant::now() + crate::scaled(timeout);
        loop {
            if let Some(s) = self.ended() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no exit {timeout:?} after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL, as an OOM kill or a crash ends it: nothing of it runs at its end.
    pub fn kill(&mut self) {
        crate::kill(self.pid(), rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!(
                "the daemon's log ({}), last lines:\n{}",
                self.log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if self.ended().is_some() {
            return;
        }
        crate::kill(self.pid(), rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.ended().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}
