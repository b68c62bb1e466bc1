//! Real-time scheduling of the threads on a crossing's path: the crossing thread
//! (`eviction_manager::thread`) and the signal readers it starts.

/// The `SCHED_FIFO` priority of the crossing thread (the lowest real-time one: above every
/// ordinary thread of the node, below the kernel's own real-time threads).
pub const PRIORITY: i32 = 1;

/// Why a thread of this process may not run at real-time priority.
#[derive(Debug, thiserror::Error)]
pub enum RealtimeError {
    #[error("spawning a thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// `sched_setscheduler(2)` refused `SCHED_FIFO`.
    #[error("{0}")]
    Refused(#[source] std::io::Error),
    #[error("the probe thread panicked")]
    Panicked,
}

/// Whether a thread of this process may run at real-time priority: tried on a throwaway
/// thread (`enforcer doctor`); why not when not.
pub fn realtime_allowed() -> Result<(), RealtimeError> {
    std::thread::Builder::new()
        .name("rt-probe".to_owned())
        .spawn(|| make_realtime(PRIORITY).map_err(RealtimeError::Refused))
        .map_err(RealtimeError::Spawn)?
        .join()
        .unwrap_or(Err(RealtimeError::Panicked))
}

/// Puts the calling thread under `SCHED_FIFO` at `priority` (reset to the ordinary scheduler
/// in children it forks). Refused without CAP_SYS_NICE (or an `RLIMIT_RTPRIO` allowing it),
/// or in a cgroup with no real-time runtime (`CONFIG_RT_GROUP_SCHED`).
pub fn make_realtime(priority: i32) -> Result<(), std::io::Error> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 is the calling thread; the kernel reads `param` during the call only, and
    // it lives on this stack frame for the whole call.
    let r = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Puts the calling thread in `SCHED_IDLE`: it runs only when nothing else wants the CPU
/// (background work that must not slow the node's processes, e.g. loading the memory cgroup
/// iterator).
pub fn make_idle() -> Result<(), std::io::Error> {
    set_policy(libc::SCHED_IDLE)
}

/// Puts the calling thread back in `SCHED_OTHER` (nice as it was): after low-priority work,
/// before work that holds a lock others wait for.
pub fn make_normal() -> Result<(), std::io::Error> {
    set_policy(libc::SCHED_OTHER)
}

/// The calling thread under a policy without a static priority (`SCHED_IDLE`, `SCHED_OTHER`).
fn set_policy(policy: libc::c_int) -> Result<(), std::io::Error> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; the kernel reads `param` during the call only, and
    // it lives on this stack frame for the whole call.
    let r = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The calling thread's `SCHED_FIFO` priority (`None`: another policy).
#[must_use]
pub fn current_priority() -> Option<i32> {
    // SAFETY: pid 0 is the calling thread; no memory is passed.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 || policy & !libc::SCHED_RESET_ON_FORK != libc::SCHED_FIFO {
        return None;
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; the kernel writes `param`, which lives on this
    // stack frame for the whole call.
    let r = unsafe { libc::sched_getparam(0, &mut param) };
    (r == 0).then_some(param.sched_priority)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread put in SCHED_IDLE for low-priority work returns to SCHED_OTHER.
    #[test]
    fn an_idle_thread_returns_to_normal() {
        let policies = std::thread::spawn(|| {
            make_idle().expect("SCHED_IDLE");
            // SAFETY: pid 0 is the calling thread; no memory is passed.
            let idle = unsafe { libc::sched_getscheduler(0) };
            make_normal().expect("SCHED_OTHER again");
            // SAFETY: as above.
            let normal = unsafe { libc::sched_getscheduler(0) };
            (idle, normal)
        })
        .join()
        .expect("thread");
        assert_eq!(policies, (libc::SCHED_IDLE, libc::SCHED_OTHER));
    }

    /// This test runs as root (the tests need it): a thread is put under SCHED_FIFO and
    /// reads its priority back; an ordinary thread has none.
    #[test]
    fn a_thread_made_realtime_reports_its_priority() {
        assert_eq!(current_priority(), None, "the test thread is ordinary");
        let got = std::thread::spawn(|| make_realtime(1).map(|()| current_priority()))
            .join()
            .expect("thread");
        match got {
            Ok(p) => assert_eq!(p, Some(1)),
            Err(e) => panic!("SCHED_FIFO refused as root: {e}"),
        }
    }
}
