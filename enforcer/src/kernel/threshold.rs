//! One usage threshold on a cgroup v1 memory cgroup, notified through a non-blocking eventfd
//! (`cgroup.event_control`): what the eviction manager's v1 tripwire waits on in its own
//! reactor. Dropping it closes the eventfd, which unregisters the threshold in the kernel.

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd},
    path::Path,
};

/// A registered usage threshold of one memory cgroup (v1).
#[derive(Debug)]
pub struct UsageThreshold {
    efd: OwnedFd,
    /// The usage file the threshold is on: kept open while registered, and read after
    /// registering (a usage already past the threshold fires nothing).
    usage: File,
    /// The threshold, in bytes of `memory.usage_in_bytes`.
    pub bytes: u64,
}

impl UsageThreshold {
    /// Registers a threshold at `bytes` of the v1 memory cgroup directory `dir`. The kernel
    /// signals the eventfd when the usage crosses it, upwards or downwards.
    pub fn register(dir: &Path, bytes: u64) -> std::io::Result<Self> {
        let efd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        let usage = File::open(dir.join("memory.usage_in_bytes"))?;
        // One write(2) per command: cgroup.event_control rejects a command split in pieces.
        OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.event_control"))?
            .write_all(format!("{} {} {bytes}", efd.as_raw_fd(), usage.as_raw_fd()).as_bytes())?;
        Ok(Self { efd, usage, bytes })
    }

    /// Into the current tokio reactor (readable when the threshold is crossed).
    pub fn into_async(self) -> std::io::Result<tokio::io::unix::AsyncFd<Self>> {
        // SAFETY: `register` (tokio has no safe constructor since its I/O-safety fix,
        // tokio#8587) needs the fd to stay open and the same for the AsyncFd's lifetime: it is
        // the eventfd this value owns (an OwnedFd closed only on drop, returned by every
        // `as_raw_fd`), and the AsyncFd owns this value.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(self, tokio::io::Interest::READABLE)
        }
        .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// The usage now (`None`: unreadable).
    #[must_use]
    pub fn usage(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt as _;
        let mut buf = [0u8; 24];
        let n = self.usage.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(buf.get(..n)?).ok()?.trim().parse().ok()
    }

    /// Reads (and so resets) the eventfd's counter: how many crossings it counted (0: none
    /// since the last read).
    pub fn drain(&self) -> std::io::Result<u64> {
        let mut buf = [0u8; 8];
        match rustix::io::read(&self.efd, &mut buf) {
            Ok(8) => Ok(u64::from_ne_bytes(buf)),
            Ok(_) => Ok(0),
            Err(rustix::io::Errno::AGAIN) => {
                Err(std::io::Error::from(std::io::ErrorKind::WouldBlock))
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl AsRawFd for UsageThreshold {
    fn as_raw_fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }
}

impl AsFd for UsageThreshold {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }
}
