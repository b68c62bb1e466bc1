//! `cargo xtask vm-test`: the test binaries, built here, run inside Debian 12's own 6.1
//! kernel (pure cgroup v2, PSI, BTF) under QEMU with software emulation (TCG; KVM does not
//! work on these machines). See `../shared/VM.md` for what was measured to work.
//!
//! The guest sees this machine's root file system read-only over 9p, under an overlay whose
//! upper layer is a tmpfs, so every binary, tool and path is where the host has it; results
//! come out through a second, writable 9p share (`<target>/vm/share`). Everything the VM
//! needs lives in `<target>/vm/`: the unpacked kernel package (never installed on the
//! host), its module index, and a busybox initramfs.

use std::{
    fmt::Write as _,
    fs,
    io::{BufRead as _, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

mod report;
mod tiers;

use crate::{output, runner::Outcome, say, sh};
use report::report;
pub use tiers::SYSTEMD_ONLY;

/// Loaded with `insmod` by the initramfs, in this order (virtio PCI, 9p, overlay).
const INITRAMFS_MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "9pnet",
    "9pnet_virtio",
    "netfs",
    "fscache",
    "9p",
    "overlay",
];

/// The kernel command line (serial console, pure cgroup v2, power off on panic).
const KERNEL_CMDLINE: &str = "console=ttyS0 rdinit=/init cgroup_no_v1=all mitigations=off \
                              panic=-1 loglevel=4 tsc=reliable no_timer_check 8250.nr_uarts=1";

/// Guest memory (MiB) and CPUs.
const GUEST_MEMORY_MIB: u32 = 4096;
const GUEST_CPUS: u32 = 2;

/// The whole VM run, boot to power-off (QEMU is killed after it).
const VM_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// Stage 1, the initramfs's `/init`: modules, the 9p host root under an overlay, switch_root.
const INIT_STAGE1: &str = r#"#!/bin/busybox sh
# enforcer vm-test, stage 1 (initramfs): load the modules, mount the host root (9p,
# read-only) as the lower layer of an overlay with a tmpfs upper layer, switch_root into it.
/bin/busybox mkdir -p /proc /sys /dev /bin
/bin/busybox mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "vm-init: $*"; poweroff -f; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
for m in @MODULES@; do
    insmod "/modules/$m.ko" || fail "insmod $m failed"
done
mkdir -p /lower /upper /newroot
n=0
until mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot /lower; do
    n=$((n + 1)); [ "$n" -lt 50 ] || fail "cannot mount the host root (9p tag hostroot)"
    sleep 0.1
done
mount -t tmpfs -o mode=755 upper /upper || fail "tmpfs for the overlay"
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot \
    || fail "overlay of the host root"
mkdir -p /newroot/.vm/share
cp /bin/busybox /newroot/.vm/busybox
cp /stage2 /newroot/.vm/stage2
chmod 755 /newroot/.vm/stage2
umount /proc /sys
mkdir -p /newroot/dev
mount --move /dev /newroot/dev || fail "moving /dev"
exec switch_root /newroot /.vm/busybox sh /.vm/stage2
"#;

/// Stage 2, in the overlay root: the node's mounts, the fixes VM.md lists, the command.
const INIT_STAGE2: &str = r#"# enforcer vm-test, stage 2 (in the overlay of the host root)
B=/.vm/busybox
fail() { echo "vm-init: $*"; $B sync; $B poweroff -f; }
$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mkdir -p /dev/pts /dev/shm
$B mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
$B mount -t tmpfs -o mode=1777 shm /dev/shm
$B mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup || fail "cgroup2"
$B mount -t tracefs tracefs /sys/kernel/tracing || fail "tracefs"
$B mount -t debugfs debugfs /sys/kernel/debug || fail "debugfs"
$B mount -t bpf bpf /sys/fs/bpf || fail "bpffs"
$B mount -t tmpfs -o mode=755 run /run
# containerd's overlayfs snapshotter cannot put its upper directory on an overlay: a real
# tmpfs for /tmp, where the tests keep containerd's root and state.
$B mount -t tmpfs -o mode=1777 tmp /tmp
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 vmshare /.vm/share || fail "share"
echo "+memory +cpu +io +pids +cpuset" > /sys/fs/cgroup/cgroup.subtree_control \
    || fail "enabling controllers in the root cgroup"
# Bridges and veths load modules on demand: the unpacked module tree and a modprobe wrapper.
$B mkdir -p /lib/modules
$B mount --bind @MODULE_TREE@ /lib/modules || fail "module tree"
printf '#!/.vm/busybox sh\nexec /.vm/busybox modprobe "$@"\n' > /.vm/modprobe
$B chmod 755 /.vm/modprobe
echo /.vm/modprobe > /proc/sys/kernel/modprobe
# zram for the swap tests (enforcement's LimitedSwap test): no device of its own, a test adds
# its swap device (hot_add) and removes it. Not fatal here: that test fails without it.
$B modprobe zram num_devices=0 || echo "vm-init: modprobe zram failed (the swap tests will fail)"
$B hostname enforcer-vm
$B ip link set lo up
# (The runner below exports PATH and HOME, and CARGO=/bin/true: a test that calls cargo would
# rebuild everything under emulation.)
# The command's runner: its exit code to the share, then power off (both boots).
$B cat > /.vm/run <<'RUN'
B=/.vm/busybox
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb
export CARGO=/bin/true
echo "vm-init: ready after $($B cut -d' ' -f1 /proc/uptime) s ($($B uname -r), init $($B cat /proc/1/comm), cgroup2 controllers: $($B cat /sys/fs/cgroup/cgroup.subtree_control))"
$B sh /.vm/share/command.sh
echo "$?" > /.vm/share/command.rc
echo "vm-init: command ended after $($B cut -d' ' -f1 /proc/uptime) s"
$B sync
$B umount /.vm/share
$B poweroff -f
RUN
if ! $B grep -q 'enforcer.init=systemd' /proc/cmdline; then
    exec $B sh /.vm/run
fi
# systemd as PID 1 (the host's own systemd, the overlay's /etc): only the units the run
# needs (journald and D-Bus sockets, then the command as a service with every controller
# delegated), nothing of the host's default target.
$B mkdir -p /etc/systemd/system /etc/systemd/system.conf.d
$B cat > /etc/systemd/system.conf.d/enforcer-vm.conf <<'CONF'
[Manager]
DefaultCPUAccounting=yes
DefaultIOAccounting=yes
DefaultMemoryAccounting=yes
DefaultTasksAccounting=yes
ShowStatus=no
CONF
$B cat > /etc/systemd/system/enforcer-vm.target <<'UNIT'
[Unit]
Description=enforcer vm-test
Requires=systemd-journald.socket dbus.socket enforcer-vm.service
After=systemd-journald.socket dbus.socket
UNIT
$B cat > /etc/systemd/system/enforcer-vm.service <<'UNIT'
[Unit]
Description=enforcer vm-test command
DefaultDependencies=no
Requires=dbus.socket
After=dbus.socket systemd-journald.socket
[Service]
Type=oneshot
ExecStart=/.vm/busybox sh /.vm/run
StandardOutput=tty
StandardError=tty
TTYPath=/dev/console
Delegate=yes
TimeoutStartSec=infinity
LimitNOFILE=1048576
LimitMEMLOCK=infinity
UNIT
echo "vm-init: starting systemd as PID 1 after $($B cut -d' ' -f1 /proc/uptime) s"
exec /lib/systemd/systemd --unit=enforcer-vm.target --log-level=warning --log-target=console
"#;

/// What the VM needs, all under `<target>/vm/`.
pub struct Vm {
    /// `<target>/vm`, absolute.
    pub dir: PathBuf,
    pub kernel_version: String,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
    /// The writable share, `<target>/vm/share`.
    pub share: PathBuf,
}

/// Installs what the VM needs, idempotently, saying what it does: QEMU, the Debian 12 kernel
/// package (unpacked under `<target>/vm`), its module index, the initramfs.
pub fn setup(target_dir: &Path) -> anyhow::Result<Vm> {
    crate::install_packages(&["qemu-system-x86", "busybox-static"])?;
    let dir = std::path::absolute(target_dir.join("vm"))?;
    fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    let package = kernel_package()?;
    let kernel_version = package
        .strip_prefix("linux-image-")
        .context("kernel package name")?
        .to_owned();
    let tree = dir.join(format!("kernel-{kernel_version}"));
    let vmlinuz = tree.join(format!("boot/vmlinuz-{kernel_version}"));
    let modules = tree.join("lib/modules").join(&kernel_version);
    if vmlinuz.exists() && modules.join("modules.dep").exists() {
        say(format!(
            "vm kernel {kernel_version}: present in {}",
            tree.display()
        ));
    } else {
        unpack_kernel(&dir, &package, &tree)?;
        say(format!(
            "vm kernel: building the module index (busybox depmod -b {})",
            tree.display()
        ));
        sh(Command::new("busybox")
            .arg("depmod")
            .arg("-b")
            .arg(&tree)
            .arg(&kernel_version))?;
    }
    let initrd = dir.join("initrd.cpio");
    let archive = initramfs(&modules, &tree.join("lib/modules"))?;
    if fs::read(&initrd).is_ok_and(|old| old == archive) {
        say(format!("vm initramfs: up to date ({})", initrd.display()));
    } else {
        fs::write(&initrd, &archive).with_context(|| format!("write {}", initrd.display()))?;
        say(format!(
            "vm initramfs: wrote {} ({} KiB: busybox, {} modules, /init)",
            initrd.display(),
            archive.len() / 1024,
            INITRAMFS_MODULES.len()
        ));
    }
    Ok(Vm {
        share: dir.join("share"),
        dir,
        kernel_version,
        vmlinuz,
        initrd,
    })
}

/// The kernel package Debian 12's `linux-image-amd64` depends on (6.1.0-NN-amd64).
fn kernel_package() -> anyhow::Result<String> {
    let find = || {
        output(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .find(|p| p.starts_with("linux-image-") && p.ends_with("-amd64"))
            .map(str::to_owned)
    };
    let package = match find() {
        Some(p) => p,
        None => {
            say("apt-cache knows no linux-image-amd64: updating the package lists");
            sh(Command::new("apt-get").args(["update", "-qq"]))?;
            find().context("apt-cache depends linux-image-amd64 names no kernel package")?
        }
    };
    if !package.starts_with("linux-image-6.1.") {
        bail!(
            "linux-image-amd64 depends on {package}, not Debian 12's 6.1 kernel: \
             the VM tier is measured on 6.1 (check the apt sources)"
        );
    }
    Ok(package)
}

/// `apt-get download` the kernel package into `dir` and unpack it (`dpkg-deb -x`) to `tree`.
fn unpack_kernel(dir: &Path, package: &str, tree: &Path) -> anyhow::Result<()> {
    let debs = |dir: &Path| -> Vec<PathBuf> {
        fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                            n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    if debs(dir).is_empty() {
        say(format!(
            "vm kernel: downloading {package} into {} (not installed on this host)",
            dir.display()
        ));
        sh(Command::new("apt-get")
            .args(["download", "-q", package])
            .current_dir(dir))?;
    }
    let deb = debs(dir).into_iter().next().with_context(|| {
        format!(
            "apt-get download left no {package}_*.deb in {}",
            dir.display()
        )
    })?;
    let partial = tree.with_extension("partial");
    if partial.exists() {
        fs::remove_dir_all(&partial).with_context(|| format!("rm -r {}", partial.display()))?;
    }
    say(format!(
        "vm kernel: unpacking {} into {}",
        deb.display(),
        tree.display()
    ));
    sh(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    if tree.exists() {
        fs::remove_dir_all(tree).with_context(|| format!("rm -r {}", tree.display()))?;
    }
    fs::rename(&partial, tree)
        .with_context(|| format!("mv {} {}", partial.display(), tree.display()))?;
    fs::remove_file(&deb).with_context(|| format!("rm {}", deb.display()))?;
    Ok(())
}

/// The initramfs (a `newc` cpio, deterministic): static busybox, the modules, both stages.
fn initramfs(modules: &Path, module_tree: &Path) -> anyhow::Result<Vec<u8>> {
    let busybox = fs::read("/bin/busybox").context("read /bin/busybox (busybox-static)")?;
    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "proc", "sys", "modules"] {
        cpio.dir(d);
    }
    cpio.file("bin/busybox", 0o755, &busybox);
    let stage1 = INIT_STAGE1.replace("@MODULES@", &INITRAMFS_MODULES.join(" "));
    cpio.file("init", 0o755, stage1.as_bytes());
    let stage2 = INIT_STAGE2.replace(
        "@MODULE_TREE@",
        &shell_quote(&module_tree.display().to_string()),
    );
    cpio.file("stage2", 0o755, stage2.as_bytes());
    let dep = fs::read_to_string(modules.join("modules.dep")).context("modules.dep")?;
    for m in INITRAMFS_MODULES {
        let rel = dep
            .lines()
            .filter_map(|l| l.split_once(':').map(|(k, _)| k))
            .find(|k| Path::new(k).file_name().and_then(|n| n.to_str()) == Some(&format!("{m}.ko")))
            .with_context(|| format!("module {m} is not in {}", modules.display()))?;
        let ko = fs::read(modules.join(rel)).with_context(|| format!("read module {rel}"))?;
        cpio.file(&format!("modules/{m}.ko"), 0o644, &ko);
    }
    Ok(cpio.finish())
}

/// A minimal `newc` cpio writer (uid/gid 0, mtime 0: the same inputs give the same bytes).
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let nlink = if mode & 0o040_000 != 0 { 2 } else { 1 };
        let size = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let namesize = u32::try_from(name.len() + 1).unwrap_or(u32::MAX);
        let header = format!(
            "070701{:08x}{mode:08x}{:08x}{:08x}{nlink:08x}{:08x}{size:08x}{:08x}{:08x}{:08x}{:08x}{namesize:08x}{:08x}",
            self.ino, 0, 0, 0, 0, 0, 0, 0, 0
        );
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.ino = 0;
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// `'...'` for sh, with embedded single quotes escaped.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Holds `<target>/vm/lock` (flock): one VM at a time on this machine's target directory.
struct VmLock {
    _file: fs::File,
}

impl VmLock {
    fn take(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("lock");
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        match f.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                say(format!(
                    "another VM run holds {}: waiting for it (one VM at a time)",
                    path.display()
                ));
                f.lock()
                    .with_context(|| format!("lock {}", path.display()))?;
            }
            Err(fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("lock {}", path.display()));
            }
        }
        Ok(Self { _file: f })
    }
}

/// What runs as the guest's PID 1 around the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// The initramfs's busybox shell runs the command itself.
    Busybox,
    /// The host's systemd, with D-Bus and journald, runs the command as a service (every
    /// controller delegated to it): the systemd cgroup driver's node.
    Systemd,
}

impl Init {
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Busybox => "busybox init",
            Self::Systemd => "systemd as PID 1",
        }
    }
}

/// Boots the VM with `command` (a sh script) as the guest's work, streams the serial
/// console (prefixed `vm| `, also kept in `<target>/vm/console.log`), and returns the
/// command's exit code (None when the guest never got to write it) and the wall time.
pub fn boot(
    vm: &Vm,
    init: Init,
    command: &str,
    prepare: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<(Option<i32>, Duration)> {
    let _lock = VmLock::take(&vm.dir)?;
    if vm.share.exists() {
        fs::remove_dir_all(&vm.share).with_context(|| format!("rm -r {}", vm.share.display()))?;
    }
    fs::create_dir_all(&vm.share)?;
    prepare(&vm.share)?;
    let script = vm.share.join("command.sh");
    fs::write(&script, command)?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "30", &VM_TIMEOUT.as_secs().to_string()])
        .arg("qemu-system-x86_64")
        .args(["-accel", "tcg,thread=multi", "-M", "q35", "-cpu", "max"])
        .args(["-m", &GUEST_MEMORY_MIB.to_string()])
        .args(["-smp", &GUEST_CPUS.to_string()])
        .arg("-kernel")
        .arg(&vm.vmlinuz)
        .arg("-initrd")
        .arg(&vm.initrd)
        .arg("-append")
        .arg(match init {
            Init::Busybox => KERNEL_CMDLINE.to_owned(),
            Init::Systemd => format!("{KERNEL_CMDLINE} enforcer.init=systemd"),
        })
        .args(["-nographic", "-monitor", "none", "-serial", "stdio"])
        .args(["-no-reboot", "-nic", "none"])
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ])
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=vmshare,security_model=none,multidevs=remap",
            vm.share.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    say(format!(
        "booting Debian's {} under QEMU (TCG, {GUEST_CPUS} CPUs, {GUEST_MEMORY_MIB} MiB; \
         at most {} min): {cmd:?}",
        vm.kernel_version,
        VM_TIMEOUT.as_secs() / 60
    ));
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let log_path = vm.dir.join("console.log");
    let mut log =
        fs::File::create(&log_path).with_context(|| format!("create {}", log_path.display()))?;
    if let Some(out) = child.stdout.take() {
        let mut reader = std::io::BufReader::new(out);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            let text = strip_escapes(&String::from_utf8_lossy(&line));
            let text = text.trim_end_matches(['\n', '\r']);
            eprintln!("vm| {text}");
            let _ = writeln!(log, "{text}");
            line.clear();
        }
    }
    let status = child.wait().context("waiting for QEMU")?;
    let wall = start.elapsed();
    if status.code() == Some(124) || status.code() == Some(137) {
        say(format!(
            "the VM did not power off within {} min: QEMU was killed",
            VM_TIMEOUT.as_secs() / 60
        ));
    } else if !status.success() {
        say(format!("QEMU exited with {status}"));
    }
    let rc = fs::read_to_string(vm.share.join("command.rc"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    Ok((rc, wall))
}

/// The console line without terminal escape sequences (the firmware clears the screen).
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        // ESC [ parameters final-byte, or ESC and one character.
        if chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

/// One test binary built on the host.
#[derive(Debug, Clone)]
pub struct TestBinary {
    /// `unit` (the enforcer library) or the tier's name (`signals`, ...).
    pub name: String,
    pub path: PathBuf,
    /// The package directory (cargo runs tests there).
    pub cwd: PathBuf,
}

/// Runs `cargo test --no-run --message-format=json` with `args` and returns the test
/// executables it built.
pub fn build_tests(args: &[&str]) -> anyhow::Result<Vec<TestBinary>> {
    let mut cmd = crate::cargo();
    cmd.args([
        "test",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
    .args(args)
    .stderr(Stdio::inherit());
    say(format!("running {cmd:?}"));
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else {
            continue;
        };
        let kinds = &v["target"]["kind"];
        let target = v["target"]["name"].as_str().unwrap_or("?");
        let kind = kinds
            .as_array()
            .and_then(|k| k.first())
            .and_then(|k| k.as_str())
            .unwrap_or("?");
        let name = match (kind, target) {
            ("test", _) => target.to_owned(),
            ("lib", "enforcer") => "unit".to_owned(),
            _ => format!("{target}-{kind}-unit"),
        };
        let cwd = v["manifest_path"]
            .as_str()
            .and_then(|m| Path::new(m).parent())
            .map(Path::to_path_buf)
            .unwrap_or_default();
        bins.push(TestBinary {
            name,
            path: PathBuf::from(exe),
            cwd,
        });
    }
    Ok(bins)
}

/// The tests of `bin` (`--list`, run on the host; ignored ones included).
pub fn list_tests(bin: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(bin)
        .args(["--list", "--format", "terse"])
        .output()
        .with_context(|| format!("{} --list", bin.display()))?;
    if !out.status.success() {
        bail!("{} --list failed: {}", bin.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// Timed bounds in the tests stretch by this factor in the guest
/// (`ENFORCER_TEST_TIME_SCALE`, see `enforcer_tests::time_scale`): software emulation is
/// 4-30x slower than the host.
pub const GUEST_TIME_SCALE: u32 = 3;

/// The bound of one test in the guest: the host's bound stretched by the emulation's
/// factor ([`GUEST_TIME_SCALE`]).
pub const GUEST_TEST_BOUND: Duration =
    Duration::from_secs(crate::HOST_TEST_BOUND.as_secs() * GUEST_TIME_SCALE as u64);

/// The guest's command: `enforcer probe`, then the plan's tests through xtask's runner
/// (each in its own process, under its bound), outcomes and logs in the share.
pub fn guest_command(enforcer: &Path, xtask: &Path, init: Init, parallel: usize) -> String {
    let mut s = String::from(
        "# written by cargo xtask vm-test\n\
         S=/.vm/share\n\
         up() { /.vm/busybox cut -d' ' -f1 /proc/uptime; }\n\
         export RUST_BACKTRACE=1\n",
    );
    let _ = writeln!(s, "export ENFORCER_TEST_TIME_SCALE={GUEST_TIME_SCALE}");
    if init == Init::Systemd {
        // The enforcer's --cgroup-driver and the fixtures' containerd (SystemdCgroup).
        s.push_str("export ENFORCER_CGROUP_DRIVER=systemd\n");
        s.push_str(
            "echo \"vm-test: systemd $(systemctl --version | head -n1 | cut -d' ' -f2), \
             $(systemctl is-system-running 2>&1)\"\n",
        );
    }
    if let Ok(log) = std::env::var("RUST_LOG") {
        let _ = writeln!(s, "export RUST_LOG={}", shell_quote(&log));
    }
    s.push_str(
        "echo \"$(up)\" > $S/start\n\
         echo \"vm-test: enforcer probe\"\n",
    );
    let _ = writeln!(
        s,
        "{} probe > $S/probe.out 2>&1; echo $? > $S/probe.rc",
        shell_quote(&enforcer.display().to_string())
    );
    let _ = writeln!(
        s,
        "{} run-tests --plan $S/plan.tsv --out $S/tests --parallel {parallel}\n\
         echo \"vm-test: the runner exited $? (at $(up) s)\"",
        shell_quote(&xtask.display().to_string()),
    );
    s.push_str("echo \"$(up)\" > $S/end\n");
    s
}

/// Guest seconds from the command's start to its end, when both were written.
pub fn guest_total(vm: &Vm) -> Option<f64> {
    let read = |f: &str| -> Option<f64> {
        fs::read_to_string(vm.share.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(read("end")? - read("start")?)
}

/// Options of `cargo xtask vm-test`.
pub struct Options {
    /// The guest's init: busybox (cgroupfs driver) or systemd as PID 1 (the tiers run with
    /// `ENFORCER_CGROUP_DRIVER=systemd`, containerd with `SystemdCgroup = true`).
    pub init: Init,
    /// Tiers to run (empty: the boot's default tiers); `all` runs every tier in full.
    pub tiers: Vec<String>,
    /// How many tests run at once in the guest.
    pub test_threads: u32,
    /// Name filters (substrings) that replace the tiers' own.
    pub test_args: Vec<String>,
    /// How the test binaries are built: `None` for `-p enforcer --lib` and
    /// `-p enforcer-tests --test '*'`; `cargo xtask test` passes its own `cargo test`
    /// arguments so the host's binaries are reused, not rebuilt with other features.
    pub build_args: Option<Vec<String>>,
}

/// One program (built on the host) run in the guest, its standard output printed here after
/// the run (its standard error streams on the console); fails when it fails or never ran.
/// `cargo xtask bench eviction --vm` runs the eviction benchmark this way.
pub fn run_in_vm(
    target_dir: &Path,
    init: Init,
    program: &Path,
    args: &[String],
) -> anyhow::Result<()> {
    let vm = setup(target_dir)?;
    let mut command = String::from("# written by cargo xtask (one program in the guest)\n");
    let quoted: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    let _ = writeln!(
        command,
        "cd / && {} {} > /.vm/share/program.out",
        shell_quote(&program.display().to_string()),
        quoted.join(" ")
    );
    let (rc, wall) = boot(&vm, init, &command, |_| Ok(()))?;
    let out = fs::read_to_string(vm.share.join("program.out")).unwrap_or_default();
    println!("{out}");
    say(format!(
        "{} in the VM ({}): exit {}, {:.0} s wall",
        program.display(),
        vm.kernel_version,
        rc.map_or_else(|| "none (it never finished)".to_owned(), |c| c.to_string()),
        wall.as_secs_f64()
    ));
    match rc {
        Some(0) => Ok(()),
        Some(c) => bail!("{} failed in the VM with exit {c}", program.display()),
        None => bail!(
            "{} did not finish in the VM (see {})",
            program.display(),
            vm.dir.join("console.log").display()
        ),
    }
}

/// What one boot of `vm-test` did: each test's outcome, the VM's wall time, and what failed.
pub struct VmRun {
    pub outcomes: Vec<Outcome>,
    pub wall: Duration,
    pub failed: Vec<String>,
}

/// `cargo xtask vm-test`: build on the host, run in the guest, report. The run's failures
/// are in [`VmRun::failed`]; an error is a run that could not be made at all.
pub fn vm_test(target_dir: &Path, opts: &Options) -> anyhow::Result<VmRun> {
    let start = Instant::now();
    let vm = setup(target_dir)?;
    // The binary the tiers run (`enforcer_tests::enforcer_binary`: `cargo build -p enforcer`;
    // in the guest cargo is a no-op, so it must be there already).
    sh(crate::cargo().args(["build", "--package", "enforcer", "--bin", "enforcer"]))?;
    let enforcer = std::path::absolute(target_dir.join("debug/enforcer"))?;
    let xtask = std::env::current_exe().context("xtask's own path")?;
    let built: Vec<TestBinary> = match &opts.build_args {
        Some(args) => {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            build_tests(&args)?
        }
        None => {
            let mut b = build_tests(&["--package", "enforcer", "--lib"])?;
            b.extend(build_tests(&[
                "--package",
                "enforcer-tests",
                "--test",
                "*",
            ])?);
            b
        }
    };
    let jobs = tiers::plan_jobs(&built, opts)?;
    let parallel = usize::try_from(opts.test_threads).unwrap_or(1);
    let command = guest_command(&enforcer, &xtask, opts.init, parallel);
    let (rc, wall) = boot(&vm, opts.init, &command, |share| {
        crate::runner::write_plan(&share.join("plan.tsv"), &jobs)
    })?;
    let outcomes = crate::runner::read_outcomes(
        &vm.share.join("tests/outcomes.tsv"),
        &vm.share.join("tests"),
    );
    let failed = report(&vm, opts.init, &jobs, &outcomes, rc, wall, start.elapsed());
    Ok(VmRun {
        outcomes,
        wall,
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_entries_are_aligned_and_end_with_the_trailer() {
        let mut c = Cpio::default();
        c.dir("bin");
        c.file("init", 0o755, b"#!/bin/sh\n");
        let out = c.finish();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("init\0"));
        assert!(text.contains("TRAILER!!!\0"));
        // The file's header: mode 0100755, size 10.
        let i = text.find("000081ed").expect("regular file mode");
        assert_eq!(&text[i + 40..i + 48], "0000000a");
    }

    #[test]
    fn console_escapes_are_stripped() {
        assert_eq!(
            strip_escapes("\u{1b}c\u{1b}[?7l\u{1b}[2JSeaBIOS"),
            "SeaBIOS".to_owned()
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
