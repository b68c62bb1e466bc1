//! Killing a pod through its cgroup: what a hard memory eviction does first; then reclaiming
//! the victims' memory without waiting for them to exit.

use crate::cgroup::{CgroupLayout, PodCgroup, writer::CgroupWriter};

/// Sends SIGKILL to every process in a pod cgroup (and its container cgroups) of the memory
/// hierarchy, through `writer` (`cgroup.kill` where cgroup v2 offers it). Returns how many
/// processes were signalled (1 for cgroup.kill); 0 when the path is not inside the hierarchy.
pub fn kill_pod_cgroup(writer: &dyn CgroupWriter, layout: &CgroupLayout, rel: &str) -> usize {
    PodCgroup::resolve(layout, rel).map_or(0, |p| p.kill(writer))
}

/// What reclaiming a killed pod's memory did ([`reap_pod_cgroup`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Processes whose memory process_mrelease(2) reclaimed.
    pub processes: usize,
    /// The kernel has no process_mrelease (before 5.15): the victims free their memory as
    /// they exit.
    pub unsupported: bool,
    /// Processes it refused (not dying: a pid reused since the kill), or could not open.
    pub refused: usize,
}

impl std::fmt::Display for Reaped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.unsupported {
            return f.write_str("no process_mrelease on this kernel: freed as the processes exit");
        }
        write!(f, "process_mrelease: {} processes reaped", self.processes)?;
        if self.refused > 0 {
            write!(f, ", {} refused", self.refused)?;
        }
        Ok(())
    }
}

impl Reaped {
    /// Counts one process's [`Outcome`].
    pub fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Reaped => self.processes += 1,
            Outcome::Gone => {}
            Outcome::NotDying | Outcome::Refused => self.refused += 1,
            Outcome::Unsupported => self.unsupported = true,
        }
    }
}

/// `process_mrelease(2)`: reclaims the address space of the dying process behind `pidfd` in
/// the caller's context (what Android's lmkd does after its SIGKILL), instead of waiting for
/// the victim to be scheduled and exit.
fn process_mrelease(pidfd: &std::os::fd::OwnedFd) -> Result<(), std::io::Error> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a raw system call with an fd this function borrows (open for the whole call)
    // and flags 0; it reads and writes no memory of this process.
    let r = unsafe { libc::syscall(libc::SYS_process_mrelease, pidfd.as_raw_fd(), 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// After the SIGKILL of [`kill_pod_cgroup`]: the memory of every process still in the pod
/// cgroup (and its container cgroups) reclaimed now ([`reap_dir`]).
#[must_use]
pub fn reap_pod_cgroup(layout: &CgroupLayout, rel: &str) -> Reaped {
    PodCgroup::resolve(layout, rel).map_or_else(Reaped::default, |p| p.reap())
}

/// The memory of every process still in `dir` and below reclaimed now through
/// `process_mrelease(2)`, each process named by a pidfd (a pid reused since the kill belongs
/// to a process that is not dying, which the kernel refuses: nothing else is touched).
#[must_use]
pub fn reap_dir(dir: &std::path::Path) -> Reaped {
    let mut out = Reaped::default();
    crate::cgroup::writer::for_each_process(dir, |pid| {
        let fd = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
            Ok(fd) => fd,
            // Exited since the listing: its memory is already freed.
            Err(rustix::io::Errno::SRCH) => return true,
            Err(_) => {
                out.refused += 1;
                return true;
            }
        };
        let outcome = mrelease_one(&fd);
        out.count(outcome);
        outcome != Outcome::Unsupported
    });
    out
}

/// What one `process_mrelease(2)` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Reaped,
    /// Exited already: its memory is freed.
    Gone,
    /// Not dying (EINVAL: not killed yet, or a pid reused since the kill).
    NotDying,
    /// The call failed otherwise.
    Refused,
    /// No `process_mrelease` on this kernel (before 5.15).
    Unsupported,
}

/// `process_mrelease(2)` of the process behind `fd`.
pub(super) fn mrelease_one(fd: &std::os::fd::OwnedFd) -> Outcome {
    match process_mrelease(fd) {
        Ok(()) => Outcome::Reaped,
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => Outcome::Unsupported,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Outcome::Gone,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Outcome::NotDying,
        Err(_) => Outcome::Refused,
    }
}

/// Whether this kernel has `process_mrelease(2)` (`enforcer doctor`): asked with an fd that
/// is no pidfd, which a kernel with the call refuses with EBADF or EINVAL, one without it
/// with ENOSYS.
#[must_use]
pub fn process_mrelease_supported() -> bool {
    // SAFETY: a raw system call with fd -1 and flags 0: it touches no memory of this process.
    let r = unsafe { libc::syscall(libc::SYS_process_mrelease, -1, 0) };
    !(r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{V1Mount, writer::RecordingCgroups};

    /// This machine's kernels (the host's and the VM tier's 6.1) have it: Linux 5.15+.
    #[test]
    fn process_mrelease_is_found_on_this_kernel() {
        assert!(
            process_mrelease_supported(),
            "Linux 5.15+ has process_mrelease(2)"
        );
    }

    /// A process killed in a cgroup is reaped through its pidfd (or found gone already); a
    /// live process is refused, not touched; nothing outside the hierarchy is read.
    #[test]
    fn reaping_names_each_process_by_a_pidfd() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cg = dir.path().join("kubepods/podu");
        std::fs::create_dir_all(&cg).expect("mkdir");
        let mut live = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        std::fs::write(cg.join("cgroup.procs"), format!("{}\n", live.id())).expect("procs");
        let layout = CgroupLayout {
            v1: vec![V1Mount {
                mount: dir.path().to_path_buf(),
                controllers: vec!["memory".to_owned()],
                hierarchy_id: Some(4),
            }],
            ..CgroupLayout::default()
        };
        let r = reap_pod_cgroup(&layout, "/kubepods/podu");
        assert_eq!(
            (r.processes, r.refused),
            (0, 1),
            "a live process is refused: {r:?}"
        );
        assert!(live.kill().is_ok());
        let r = reap_pod_cgroup(&layout, "/kubepods/podu");
        assert_eq!(r.refused, 0, "a killed process is reaped or gone: {r:?}");
        let _ = live.wait();
        assert_eq!(
            reap_pod_cgroup(&layout, "/kubepods/../../etc"),
            Reaped::default()
        );
    }

    #[test]
    fn the_kill_goes_to_the_pod_cgroup_of_the_memory_hierarchy_only() {
        let layout = CgroupLayout {
            v1: vec![V1Mount {
                mount: "/m".into(),
                controllers: vec!["memory".to_owned()],
                hierarchy_id: Some(4),
            }],
            ..CgroupLayout::default()
        };
        let w = RecordingCgroups::default();
        assert_eq!(kill_pod_cgroup(&w, &layout, "/kubepods/podu"), 1);
        assert_eq!(kill_pod_cgroup(&w, &layout, "/kubepods/../../etc"), 0);
        assert_eq!(
            kill_pod_cgroup(&w, &CgroupLayout::default(), "/kubepods/podu"),
            0
        );
        assert_eq!(w.ops(), ["kill /m/kubepods/podu V1"]);
    }
}
