//! Project tasks: `cargo xtask setup | test | run | bench <what>`.
//!
//! `setup` installs what is missing, idempotently, and says what it does. `test` is the
//! README's test command and what CI runs. `run` builds and starts the enforcer on this node.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

/// Debian packages the build and the tests need.
const PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "busybox-static",
    "protobuf-compiler",
    "bpftool",
    "containernetworking-plugins",
    "iproute2",
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
    /// Setup, then formatting, clippy (host and eBPF, warnings denied) and every test tier.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Build (release) and run the enforcer on this node; extra arguments go to `enforcer run`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks: `signals` (kernel -> daemon latency and throughput), `policy` (criterion).
    Bench {
        #[arg(value_parser = ["signals", "policy"])]
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

fn setup() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_none_or(|s| !s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        say("Debian packages: all present");
    } else {
        say(format!("Debian packages missing: {}", missing.join(" ")));
        sh(Command::new("apt-get").args(["update", "-qq"]))?;
        sh(Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
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
    setup()?;
    sh(cargo().args(["fmt", "--all", "--", "--check"]))?;
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
    // Every tier: unit and pipeline tests in the crates, the black-box suite in tests/.
    sh(cargo()
        .args(["test", "--workspace", "--exclude", "enforcer-ebpf"])
        .args(args))?;
    Ok(())
}

fn run(args: &[String]) -> anyhow::Result<()> {
    setup()?;
    sh(cargo().args(["build", "--release", "--package", "enforcer"]))?;
    let bin = PathBuf::from("target/release/enforcer");
    let mut cmd = Command::new(&bin);
    cmd.arg("run").args(args);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    sh(&mut cmd)
}

fn bench(what: &str, args: &[String]) -> anyhow::Result<()> {
    match what {
        "signals" => {
            setup()?;
            sh(cargo()
                .args([
                    "run",
                    "--release",
                    "--package",
                    "enforcer-tests",
                    "--bin",
                    "bench-signals",
                    "--",
                ])
                .args(args))
        }
        "policy" => sh(cargo()
            .args(["bench", "--package", "enforcer", "--bench", "policy", "--"])
            .args(args)),
        other => bail!("unknown benchmark {other}"),
    }
}
