//! The machine's filesystems as cAdvisor serves them for the root container
//! (`container_fs_{usage,limit}_bytes`, `container_fs_inodes_{free,total}` with `device`):
//! each block-device filesystem of the mount table (ext2/3/4, xfs, btrfs), once per device
//! (its first mount point), from statvfs. Containers of containerd have none (cAdvisor's
//! containerd handler reads no filesystem), so only `id="/"` carries them.

use std::path::Path;

/// One filesystem's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filesystem {
    /// The device (`/dev/vda1`).
    pub device: String,
    /// Bytes in use (blocks less free blocks) and in all.
    pub usage: u64,
    pub limit: u64,
    pub inodes_free: u64,
}

const TYPES: [&str; 6] = ["ext2", "ext3", "ext4", "xfs", "btrfs", "zfs"];

/// The (device, mount point) of each block-device filesystem in a `mountinfo` text, once per
/// device.
#[must_use]
pub fn mounts(mountinfo: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let (Some(point), Some(kind), Some(source)) = (
            left.split_whitespace().nth(4),
            right.split_whitespace().next(),
            right.split_whitespace().nth(1),
        ) else {
            continue;
        };
        if !source.starts_with("/dev/") || !TYPES.contains(&kind) {
            continue;
        }
        if out.iter().any(|(d, _)| d == source) {
            continue;
        }
        out.push((source.to_owned(), point.replace("\\040", " ")));
    }
    out
}

/// The machine's filesystems now (none where the mount table cannot be read).
#[must_use]
pub fn read() -> Vec<Filesystem> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts(&text)
        .into_iter()
        .filter_map(|(device, point)| {
            let st = rustix::fs::statvfs(Path::new(&point)).ok()?;
            let size = st.f_frsize.max(1);
            Some(Filesystem {
                device,
                usage: st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(size),
                limit: st.f_blocks.saturating_mul(size),
                inodes_free: st.f_ffree,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_device_filesystems_once_per_device() {
        let text = "\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
23 22 0:5 / /dev rw shared:2 - devtmpfs udev rw
24 22 0:22 / /run rw shared:5 - tmpfs tmpfs rw
25 22 253:1 /var/lib/x /mnt/x rw shared:1 - ext4 /dev/vda1 rw
26 22 253:16 / /data\\040disk rw shared:9 - xfs /dev/vdb rw
27 22 7:0 / /snap/a ro shared:10 - squashfs /dev/loop0 ro
bad line
";
        assert_eq!(
            mounts(text),
            [
                ("/dev/vda1".to_owned(), "/".to_owned()),
                ("/dev/vdb".to_owned(), "/data disk".to_owned())
            ]
        );
    }
}
