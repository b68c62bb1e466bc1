//! A swap area of the test's own, for the swap tests on a node that has none (the VM guest):
//! a zram device hot-added for the test (`/sys/class/zram-control/hot_add`), sized, given a
//! swap signature (`mkswap`) and switched on with swapon(2); on drop it is switched off with
//! swapoff(2), reset and hot-removed, even when the test failed. It never touches a swap area
//! or zram device it did not add.
//!
//! zram rather than a swap file: the guest's root is an overlay and its `/tmp` a tmpfs, and
//! neither holds a swap file. `cargo xtask vm-test` loads the module in the guest
//! (`modprobe zram num_devices=0`: no device of its own, the tests add theirs).
//!
//! Swap is node-wide: while one is on, `failSwapOn` (kubelet's default) refuses pods in any
//! other daemon on the machine. The VM runs each tier's tests one at a time
//! (`--test-threads=1`).

use std::{
    ffi::CString,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

const ZRAM_CONTROL: &str = "/sys/class/zram-control";

/// A zram swap area, on until dropped.
pub struct ZramSwap {
    /// The device number (`zram<id>`).
    id: u32,
    /// `/dev/zram<id>`.
    pub device: PathBuf,
    on: bool,
}

impl ZramSwap {
    /// Adds a zram device of `bytes`, makes it a swap area and switches it on; panics naming
    /// the step that failed (a test that needs swap must not run without it).
    pub fn on(bytes: u64) -> Self {
        let hot_add = Path::new(ZRAM_CONTROL).join("hot_add");
        let id: u32 = fs::read_to_string(&hot_add)
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}: the zram module is not loaded (`cargo xtask vm-test` loads it in \
                     the guest)",
                    hot_add.display()
                )
            })
            .trim()
            .parse()
            .expect("a zram device number from hot_add");
        // From here the device is ours: the drop removes it whatever fails below.
        let mut swap = Self {
            id,
            device: PathBuf::from(format!("/dev/zram{id}")),
            on: false,
        };
        let disksize = swap.sys().join("disksize");
        fs::write(&disksize, bytes.to_string())
            .unwrap_or_else(|e| panic!("write {bytes} to {}: {e}", disksize.display()));
        // devtmpfs makes the node when the kernel adds the disk.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !swap.device.exists() {
            assert!(
                Instant::now() < deadline,
                "{} did not appear",
                swap.device.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = Command::new("mkswap")
            .arg(&swap.device)
            .output()
            .unwrap_or_else(|e| panic!("mkswap {}: {e}", swap.device.display()));
        assert!(
            out.status.success(),
            "mkswap {}: {}{}",
            swap.device.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let path = swap.c_path();
        // SAFETY: swapon(2) on a NUL-terminated path that lives across the call.
        if unsafe { libc::swapon(path.as_ptr(), 0) } != 0 {
            panic!(
                "swapon {}: {}",
                swap.device.display(),
                std::io::Error::last_os_error()
            );
        }
        swap.on = true;
        swap
    }

    fn sys(&self) -> PathBuf {
        PathBuf::from(format!("/sys/block/zram{}", self.id))
    }

    fn c_path(&self) -> CString {
        CString::new(self.device.as_os_str().as_encoded_bytes()).expect("no NUL in a device path")
    }
}

impl Drop for ZramSwap {
    fn drop(&mut self) {
        if self.on {
            let path = self.c_path();
            // SAFETY: swapoff(2) on a NUL-terminated path that lives across the call.
            if unsafe { libc::swapoff(path.as_ptr()) } != 0 {
                eprintln!(
                    "swapoff {}: {} (left on)",
                    self.device.display(),
                    std::io::Error::last_os_error()
                );
                return;
            }
        }
        let reset = self.sys().join("reset");
        if let Err(e) = fs::write(&reset, "1") {
            eprintln!("write 1 to {}: {e}", reset.display());
        }
        let hot_remove = Path::new(ZRAM_CONTROL).join("hot_remove");
        if let Err(e) = fs::write(&hot_remove, self.id.to_string()) {
            eprintln!("write {} to {}: {e}", self.id, hot_remove.display());
        }
    }
}
