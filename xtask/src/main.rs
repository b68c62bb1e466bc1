//! Project tasks: `cargo xtask setup | test | vm-test | layers | sizes | run | bench <what>`.
//!
//! `setup` installs what is missing, idempotently, and says what it does. `test` is the
//! README's test command and what CI runs. `run` builds and starts the enforcer on this node.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

mod image;
mod layers;
mod report;
mod runner;
mod sizes;
mod vm;

/// The bound of one test on this host (the guest stretches it: `vm::GUEST_TEST_BOUND`). The
/// longest test here takes about a minute and a half; one past this is stopped, its stacks,
/// the machine's processes and the kernel's log reported, and counted as failed.
pub const HOST_TEST_BOUND: std::time::Duration = std::time::Duration::from_secs(300);

/// How many tests run at once on this host (each its own process). The tests wait on
/// containerd, the kernel and their daemons far more than they compute.
const HOST_PARALLEL: usize = 2;

/// Tiers whose tests run one at a time, with their serial group: a tier's tests hold the
/// node's memory or a fake API server's timing for their whole length; `companion` and
/// `install` also share the companion's fixed ports (127.0.0.1:10266, 10267). The others run
/// beside them.
const SERIAL_TIERS: &[(&str, &str)] = &[
    ("e2e_eviction", "e2e_eviction"),
    ("apiserver", "apiserver"),
    ("companion", "companion"),
    ("install", "companion"),
];

/// Debian packages the build and the tests need.
const PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "busybox-static",
    "protobuf-compiler",
    "bpftool",
    "containernetworking-plugins",
    "iproute2",
    // systemd-analyze checks deploy/systemd (tests/tests/deploy.rs)
    "systemd",
    // the OCI registry the image-pull tests pull from (tests/src/registry.rs): CNCF
    // distribution 2.8, `docker-registry serve CONFIG`
    "docker-registry",
    // htpasswd -B: the bcrypt password file of the registry that wants a login
    "apache2-utils",
    // the test CA and the registries' server certificates
    "openssl",
    // pushes images to the test registries through the distribution API
    "curl",
    // cargo xtask image: the CA bundle in the image, the binary's debug information stripped
    // (strip), and the push to a registry
    "ca-certificates",
    "binutils",
    "skopeo",
    // the test runner's account of a test past its bound: its threads' stacks
    "gdb",
    // promtool checks the companion's alerting rules (tests/tests/deploy.rs)
    "prometheus",
];
const BPF_LINKER: &str = "0.10.3";

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing: Debian packages, rust-src, bpf-linker.
    Setup,
    /// Setup, then formatting, clippy (host and eBPF, warnings denied), every test tier on
    /// this host, then `vm-test` (the same binaries on a pure cgroup v2 kernel).
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// The test binaries, built here, run in Debian 12's 6.1 kernel (pure cgroup v2) under
    /// QEMU: `enforcer probe`, the unit tests, then the kernel-facing tiers.
    VmTest {
        /// Tiers to run (default: unit and the kernel-facing tiers; `all`: every tier).
        tiers: Vec<String>,
        /// libtest's --test-threads in the guest.
        #[arg(long, default_value_t = 1)]
        test_threads: u32,
        /// Boot systemd as PID 1 and run the tiers with the systemd cgroup driver.
        #[arg(long)]
        systemd: bool,
        /// Extra libtest arguments for every binary (after `--`), e.g. a name filter.
        #[arg(last = true)]
        test_args: Vec<String>,
    },
    /// The enforcer library's import graph: no upward import between its layers, no cycle.
    Layers,
    /// The production code's sizes: no function over 120 lines, no file over 900.
    Sizes,
    /// The release enforcer as an OCI image (an OCI image layout; `--push REF` to a
    /// registry): the binary, the libraries it links, CA certificates, nothing else.
    Image {
        /// The OCI image layout to write (made anew).
        #[arg(long, default_value = "target/image/enforcer")]
        out: PathBuf,
        /// Push it to this reference (`host:port/name:tag`) with skopeo.
        #[arg(long, value_name = "REF")]
        push: Option<String>,
        /// Push without TLS verification (a test registry).
        #[arg(long)]
        insecure: bool,
        /// The CA certificates (`*.crt`) of the registry pushed to.
        #[arg(long, value_name = "DIR")]
        cert_dir: Option<PathBuf>,
        /// Package this enforcer binary instead of building the release one.
        #[arg(long, value_name = "FILE")]
        binary: Option<PathBuf>,
    },
    /// The test runner (what `test` and the VM's guest use): a plan's tests, each in its own
    /// process under its bound, outcomes and logs in a directory.
    #[command(hide = true)]
    RunTests {
        #[arg(long)]
        plan: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1)]
        parallel: usize,
    },
    /// Build (release) and run the enforcer on this node; extra arguments go to `enforcer run`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks: `signals` (kernel -> daemon latency and throughput), `eviction` (threshold
    /// crossing -> SIGKILL per signal mode; `--vm`: in the cgroup v2 VM), `charge` (the
    /// crossing check's cost per page charged; `--vm` too), `reap` (kill -> memory released
    /// for 1 and 4 GiB victims against munmap), `policy`
    /// (criterion), `pods` (pods/s through the enforcer vs direct CRI, daemon RSS with 100
    /// pods), `step` (one eviction step with its I/O, 110 pods).
    Bench {
        #[arg(value_parser = ["signals", "eviction", "charge", "reap", "policy", "pods", "step"])]
        what: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = workspace_root()?;
    std::env::set_current_dir(&root).with_context(|| format!("cd {}", root.display()))?;
    match cli.task {
        Task::Setup => setup(),
        Task::Test { args } => test(&args),
        Task::VmTest {
            tiers,
            test_threads,
            systemd,
            test_args,
        } => {
            setup()?;
            let run = vm::vm_test(
                &target_dir(),
                &vm::Options {
                    init: if systemd {
                        vm::Init::Systemd
                    } else {
                        vm::Init::Busybox
                    },
                    tiers,
                    test_threads,
                    test_args,
                    build_args: None,
                },
            )?;
            if run.failed.is_empty() {
                Ok(())
            } else {
                bail!("vm-test failed: {}", run.failed.join(", "))
            }
        }
        Task::Layers => layers::check(Path::new("enforcer/src")),
        Task::Sizes => sizes::check(),
        Task::Image {
            out,
            push,
            insecure,
            cert_dir,
            binary,
        } => {
            if binary.is_none() {
                setup()?;
            }
            let built = image::build(&target_dir(), &out, binary.as_deref())?;
            println!(
                "image {}:{} digest {} ({:.1} MiB compressed)",
                built.layout.display(),
                built.tag,
                built.digest,
                built.compressed as f64 / f64::from(1 << 20)
            );
            if let Some(reference) = push {
                image::push(&built, &reference, !insecure, cert_dir.as_deref())?;
            }
            Ok(())
        }
        Task::RunTests {
            plan,
            out,
            parallel,
        } => {
            let jobs = runner::read_plan(&plan)?;
            let outcomes = runner::run(jobs, parallel, &out, &[])?;
            let failed = outcomes
                .iter()
                .filter(|o| o.verdict != runner::Verdict::Passed)
                .count();
            if failed == 0 {
                Ok(())
            } else {
                bail!("{failed} test(s) failed")
            }
        }
        Task::Run { args } => run(&args),
        Task::Bench { what, args } => bench(&what, &args),
    }
}

fn workspace_root() -> anyhow::Result<PathBuf> {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent directory")
}

fn say(msg: impl AsRef<str>) {
    eprintln!("xtask: {}", msg.as_ref());
}

fn sh(cmd: &mut Command) -> anyhow::Result<()> {
    say(format!("running {cmd:?}"));
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs the Debian packages of `packages` that are missing (saying which).
fn install_packages(packages: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_none_or(|s| !s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        say(format!(
            "Debian packages: all present ({})",
            packages.join(" ")
        ));
    } else {
        say(format!("Debian packages missing: {}", missing.join(" ")));
        sh(Command::new("apt-get").args(["update", "-qq"]))?;
        sh(Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    Ok(())
}

fn setup() -> anyhow::Result<()> {
    install_packages(PACKAGES)?;
    // kubectl, the client of the secure port's tests (tests/tests/secure_port.rs): the one on
    // PATH, else Debian's kubernetes-client.
    let kubectl = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if kubectl {
        say("kubectl: present");
    } else {
        install_packages(&["kubernetes-client"])?;
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "stable",
    ]))
    .unwrap_or_default();
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        say("rust-src: present");
    } else {
        sh(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "stable"]))?;
    }
    let linker = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if linker.contains(BPF_LINKER) {
        say(format!("bpf-linker {BPF_LINKER}: present"));
    } else {
        sh(Command::new("cargo").args([
            "install",
            &format!("bpf-linker@{BPF_LINKER}"),
            "--locked",
            "--force",
        ]))?;
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
}

fn test(args: &[String]) -> anyhow::Result<()> {
    let started = Instant::now();
    setup()?;
    checks()?;
    let checks = started.elapsed();
    // Tests bound to the other cgroup version than this host's memory controller are
    // skipped here by name, each listed with where it runs; so are those that need systemd
    // as PID 1 (this host's PID 1 is not systemd).
    let (version, other, runs_it) = if host_memory_is_v2() {
        (
            "v2",
            "_v1only",
            "a host whose memory controller is on cgroup v1 runs it",
        )
    } else {
        (
            "v1",
            "_v2only",
            "cargo xtask vm-test runs it (Debian 12's 6.1 kernel, pure v2)",
        )
    };
    say(format!("host memory controller: cgroup {version}"));
    if !args.is_empty() {
        // A filter given: plain `cargo test` with it, on this host only.
        let mut cargo_args = args.to_vec();
        if !cargo_args.iter().any(|a| a == "--") {
            cargo_args.push("--".to_owned());
        }
        cargo_args.extend(["--skip".to_owned(), other.to_owned()]);
        cargo_args.extend(["--skip".to_owned(), vm::SYSTEMD_ONLY.to_owned()]);
        say("a test filter was given: the VM tiers are not run (cargo xtask vm-test runs them)");
        return sh(cargo()
            .args(["test", "--workspace", "--exclude", "enforcer-ebpf"])
            .args(&cargo_args));
    }
    let build_start = Instant::now();
    let workspace = ["--workspace", "--exclude", "enforcer-ebpf"];
    sh(cargo().args(["build", "--package", "enforcer", "--bin", "enforcer"]))?;
    let built = vm::build_tests(&workspace)?;
    let doc_passed = report::doc_tests(cargo(), &workspace)?;
    let build = build_start.elapsed();
    let jobs = host_jobs(&built, other, runs_it)?;
    let host_start = Instant::now();
    let logs = target_dir().join("test-logs/host");
    let host = runner::run(jobs, HOST_PARALLEL, &logs, &[])?;
    let host_wall = host_start.elapsed();
    let mut failures: Vec<String> = host
        .iter()
        .filter(|o| o.verdict != runner::Verdict::Passed)
        .map(|o| format!("{}::{} ({:?})", o.tier, o.test, o.verdict))
        .collect();
    // The same binaries on a pure cgroup v2 kernel (run even when a host tier failed, so one
    // run reports all): booted with busybox (the cgroupfs driver), then with systemd as PID 1
    // (what depends on systemd or the driver).
    let mut boots = Vec::new();
    for init in [vm::Init::Busybox, vm::Init::Systemd] {
        let run = vm::vm_test(
            &target_dir(),
            &vm::Options {
                init,
                tiers: Vec::new(),
                test_threads: 1,
                test_args: Vec::new(),
                // The binaries the host tiers just ran (same features, no rebuild).
                build_args: Some(workspace.map(str::to_owned).to_vec()),
            },
        );
        match run {
            Ok(r) => {
                failures.extend(
                    r.failed
                        .iter()
                        .map(|f| format!("VM ({}): {f}", init.name())),
                );
                boots.push((init, r));
            }
            Err(e) => failures.push(format!("VM tier ({}): {e:#}", init.name())),
        }
    }
    report::print_times(
        checks,
        build,
        &host,
        host_wall,
        &boots,
        doc_passed,
        started.elapsed(),
    );
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("failed: {}", failures.join("; "))
    }
}

/// The checks before any build: formatting, the layers, the sizes, clippy on the workspace
/// and on the kernel programs.
fn checks() -> anyhow::Result<()> {
    sh(cargo().args(["fmt", "--all", "--", "--check"]))?;
    layers::check(Path::new("enforcer/src"))?;
    sizes::check()?;
    sh(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "enforcer-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    sh(cargo()
        .args([
            "clippy",
            "--package",
            "enforcer-ebpf",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--",
            "-D",
            "warnings",
        ])
        .env("RUSTC_BOOTSTRAP", "1"))?;
    Ok(())
}

/// The host's jobs: every test of every built tier but those needing the `other` cgroup
/// version or systemd as PID 1 (each said, with where it runs), the serial tiers first.
fn host_jobs(
    built: &[vm::TestBinary],
    other: &str,
    runs_it: &str,
) -> anyhow::Result<Vec<runner::Job>> {
    // Every tier: unit and pipeline tests in the crates, the black-box suite in tests/, each
    // test in its own process under its bound, HOST_PARALLEL at once.
    let mut jobs = Vec::new();
    for b in built {
        for t in vm::list_tests(&b.path)? {
            if t.contains(other) {
                say(format!(
                    "skipping {}::{t} on this host: it needs the other cgroup version; {runs_it}",
                    b.name
                ));
                continue;
            }
            if t.contains(vm::SYSTEMD_ONLY) {
                say(format!(
                    "skipping {}::{t} on this host: it needs systemd as PID 1; the VM's \
                     systemd boot (cargo xtask vm-test --systemd) runs it",
                    b.name
                ));
                continue;
            }
            jobs.push(runner::Job {
                tier: b.name.clone(),
                bin: b.path.clone(),
                cwd: b.cwd.clone(),
                test: t,
                group: SERIAL_TIERS
                    .iter()
                    .find(|(t, _)| *t == b.name)
                    .map(|(_, g)| (*g).to_owned()),
                bound: HOST_TEST_BOUND,
            });
        }
    }
    // The serial tiers first (their chains are the longest), the rest in tier order.
    jobs.sort_by_key(|j| {
        (
            SERIAL_TIERS
                .iter()
                .position(|(t, _)| *t == j.tier)
                .unwrap_or(SERIAL_TIERS.len()),
            j.tier.clone(),
        )
    });
    Ok(jobs)
}

/// Whether this host's memory controller is on cgroup v2 (a cgroup2 mount offers it).
fn host_memory_is_v2() -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo.lines().any(|l| {
        let Some((left, right)) = l.split_once(" - ") else {
            return false;
        };
        right.starts_with("cgroup2 ")
            && left.split_whitespace().nth(4).is_some_and(|mount| {
                std::fs::read_to_string(Path::new(mount).join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
            })
    })
}

/// The CRI socket `enforcer run` uses by default.
const DEFAULT_CRI_SOCKET: &str = "/run/containerd/containerd.sock";

/// The value of `--flag VALUE` or `--flag=VALUE` in `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let eq = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            args.get(i + 1).cloned()
        } else {
            a.strip_prefix(&eq).map(str::to_owned)
        }
    })
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}

/// The PID of the `enforcer run` child, for the signal handler to forward to.
static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// Set when `run` was asked to stop.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Ctrl-C, SIGTERM and SIGHUP stop the enforcer child and let `run` clean up after it:
/// signal-hook's handlers (not SIG_IGN, so the child gets the default disposition back at
/// exec) wake a thread that marks the run interrupted and sends the child SIGTERM.
fn forward_signals_to_child() -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("install the signal handlers")?;
    std::thread::spawn(move || {
        for _ in signals.forever() {
            INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
            let pid = CHILD.load(std::sync::atomic::Ordering::SeqCst);
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                // The PID is the enforcer this task started; it may have exited already.
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
    });
    Ok(())
}

/// Standalone mode: when nothing answers on the CRI socket, a private containerd (with the
/// local busybox image) is started in `<target>/local-containerd` by the `local-containerd`
/// binary of `enforcer-tests` (development tooling the daemon does not carry) and stopped, by
/// PID, when the enforcer exits; the example manifests run unless `--manifest-dir` is given.
fn run(args: &[String]) -> anyhow::Result<()> {
    setup()?;
    sh(cargo().args(["build", "--release", "--package", "enforcer"]))?;
    let bin = target_dir().join("release/enforcer");
    let mut extra: Vec<String> = Vec::new();
    let socket = flag_value(args, "--cri-socket")
        .or_else(|| flag_value(args, "--container-runtime-endpoint"))
        .unwrap_or_else(|| DEFAULT_CRI_SOCKET.to_owned());
    let socket = socket.strip_prefix("unix://").unwrap_or(&socket).to_owned();
    let mut local_dir = None;
    forward_signals_to_child()?;
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        say(format!("using the containerd answering on {socket}"));
    } else {
        let dir = std::env::current_dir()?
            .join(target_dir())
            .join("local-containerd");
        say(format!(
            "nothing answers on {socket}: starting a private containerd in {}",
            dir.display()
        ));
        let launcher = build_local_containerd()?;
        let out = Command::new(&launcher)
            .args(["start", "--dir"])
            .arg(&dir)
            .stderr(std::process::Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", launcher.display()))?;
        if !out.status.success() || INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            stop_local_containerd(&launcher, &dir);
            bail!(
                "starting the private containerd failed or was interrupted: {}",
                out.status
            );
        }
        let private = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        say(format!("private containerd on {private}"));
        if flag_value(args, "--cri-socket").is_none()
            && flag_value(args, "--container-runtime-endpoint").is_none()
        {
            extra.extend(["--cri-socket".to_owned(), private]);
        } else {
            say(format!(
                "warning: --cri-socket {socket} was given but nothing answers there; \
                 the private containerd is not used"
            ));
        }
        local_dir = Some((launcher, dir));
    }
    if flag_value(args, "--manifest-dir").is_none() {
        let manifests = std::env::current_dir()?.join("examples/manifests");
        say(format!(
            "running the example manifests in {}",
            manifests.display()
        ));
        extra.extend(["--manifest-dir".to_owned(), manifests.display().to_string()]);
    }
    if !args
        .iter()
        .any(|a| a.starts_with("--allow-host-namespaces"))
    {
        // The example pods use the host network (pods need no CNI that way); the default
        // pod-security rules refuse host namespaces, so this standalone run allows them.
        say("allowing host namespaces for the example pods (--allow-host-namespaces=true)");
        extra.push("--allow-host-namespaces=true".to_owned());
    }
    // The pod cgroups this run makes (with the private containerd, its pods die with it): to
    // remove once it is stopped, leaving the machine as it was.
    let cgroups_before = kubepods_dirs();
    let mut cmd = Command::new(&bin);
    cmd.arg("run").args(&extra).args(args);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    say(format!("running {cmd:?}"));
    let status = match cmd.spawn() {
        Ok(mut child) => {
            CHILD.store(
                i32::try_from(child.id()).unwrap_or(0),
                std::sync::atomic::Ordering::SeqCst,
            );
            let status = child.wait();
            CHILD.store(0, std::sync::atomic::Ordering::SeqCst);
            status.with_context(|| format!("waiting for {cmd:?}"))
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("starting {cmd:?}"))),
    };
    if let Some((launcher, dir)) = &local_dir {
        stop_local_containerd(launcher, dir);
        remove_new_cgroups(&cgroups_before);
    }
    let status = status?;
    // 130/143: stopped by Ctrl-C / SIGTERM, which is how a standalone run ends.
    if !status.success() && !matches!(status.code(), Some(130 | 143) | None) {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Builds (release) the private-containerd launcher, `local-containerd` of `enforcer-tests`,
/// and returns its path. xtask runs it rather than linking it: `setup` installs protoc, which
/// that crate (through the daemon library) needs to build.
fn build_local_containerd() -> anyhow::Result<PathBuf> {
    build_tests_bin("local-containerd")
}

/// Builds (release) one binary of `enforcer-tests` and returns its path.
fn build_tests_bin(name: &str) -> anyhow::Result<PathBuf> {
    sh(cargo().args([
        "build",
        "--release",
        "--package",
        "enforcer-tests",
        "--bin",
        name,
    ]))?;
    Ok(target_dir().join("release").join(name))
}

/// Every directory below a `kubepods` cgroup (either driver's name) in every hierarchy.
fn kubepods_dirs() -> std::collections::BTreeSet<PathBuf> {
    fn walk(dir: &Path, out: &mut std::collections::BTreeSet<PathBuf>) {
        out.insert(dir.to_path_buf());
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    let root = Path::new("/sys/fs/cgroup");
    let mut hierarchies = vec![root.to_path_buf()];
    if let Ok(rd) = std::fs::read_dir(root) {
        hierarchies.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    for h in hierarchies {
        for name in ["kubepods", "kubepods.slice"] {
            let k = h.join(name);
            if k.is_dir() {
                walk(&k, &mut out);
            }
        }
    }
    out
}

/// Removes the pod cgroups that appeared since `before` (deepest first; a cgroup still in
/// use is left, and said).
fn remove_new_cgroups(before: &std::collections::BTreeSet<PathBuf>) {
    let mut new: Vec<PathBuf> = kubepods_dirs()
        .into_iter()
        .filter(|d| !before.contains(d))
        .collect();
    new.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    let (mut removed, mut left) = (0, Vec::new());
    for d in &new {
        match std::fs::remove_dir(d) {
            Ok(()) => removed += 1,
            Err(e) => left.push(format!("{} ({e})", d.display())),
        }
    }
    say(format!("removed the {removed} pod cgroups this run made"));
    if !left.is_empty() {
        say(format!("warning: left in place: {}", left.join(", ")));
    }
}

/// `local-containerd stop`: its pods, shims and containerd, by PID.
fn stop_local_containerd(launcher: &Path, dir: &Path) {
    say(format!(
        "stopping the private containerd in {}",
        dir.display()
    ));
    match Command::new(launcher)
        .args(["stop", "--dir"])
        .arg(dir)
        .status()
    {
        Ok(s) if s.success() => {}
        Ok(s) => say(format!("warning: stopping the private containerd: {s}")),
        Err(e) => say(format!("warning: stopping the private containerd: {e}")),
    }
}

fn bench(what: &str, args: &[String]) -> anyhow::Result<()> {
    match what {
        "signals" | "eviction" | "charge" | "reap" => {
            setup()?;
            // The daemon (measured idle and in a storm) and the benchmark binaries, release.
            sh(cargo().args([
                "build",
                "--release",
                "--package",
                "enforcer",
                "--package",
                "enforcer-tests",
                "--bins",
            ]))?;
            let bin = std::path::absolute(target_dir().join(format!("release/bench_{what}")))?;
            if matches!(what, "eviction" | "charge") && args.iter().any(|a| a == "--vm") {
                // In Debian's 6.1 kernel on pure cgroup v2 (the v2 modes), under QEMU;
                // `--systemd`: booted with systemd as PID 1, each mode with both drivers'
                // pods (unless `--drivers` says otherwise).
                let systemd = args.iter().any(|a| a == "--systemd");
                let mut rest: Vec<String> = args
                    .iter()
                    .filter(|a| *a != "--vm" && *a != "--systemd")
                    .cloned()
                    .collect();
                if systemd && !rest.iter().any(|a| a == "--drivers") {
                    rest.extend(["--drivers".to_owned(), "cgroupfs,systemd".to_owned()]);
                }
                let init = if systemd {
                    vm::Init::Systemd
                } else {
                    vm::Init::Busybox
                };
                return vm::run_in_vm(&target_dir(), init, &bin, &rest);
            }
            sh(Command::new(bin).args(args))
        }
        "pods" | "step" => {
            setup()?;
            if what == "pods" {
                // The daemon too, for its RSS with pods running.
                sh(cargo().args(["build", "--release", "--package", "enforcer"]))?;
            }
            sh(Command::new(build_tests_bin(&format!("bench_{what}"))?).args(args))
        }
        "policy" => sh(cargo()
            .args(["bench", "--package", "enforcer", "--bench", "policy", "--"])
            .args(args)),
        other => bail!("unknown benchmark {other}"),
    }
}
