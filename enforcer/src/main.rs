//! The `enforcer` command line.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use enforcer::{
    cgroup::CgroupLayout,
    kernel::{self, Capabilities, PipelineOptions, SourceChoice, Watch},
    signal::SourceKind,
};

#[derive(Parser)]
#[command(
    name = "enforcer",
    version = enforcer::build::VERSION_LINE,
    about = "eBPF-accelerated node resource enforcer with kubelet's semantics"
)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon on this node.
    Run(Box<RunArgs>),
    /// Print decoded signals as JSON lines, live (an operator's tcpdump for pressure).
    Signals(SignalsArgs),
    /// Print what the kernel offers (the capability probe) as JSON, with the eBPF programs:
    /// per tracepoint, the fields found (offsets from this kernel's formats) or absent, and
    /// whether the program loaded and attached (they are detached again on exit).
    Probe,
    /// Replay a scenario through the decision core: one JSON line per step.
    Simulate {
        /// The scenario (YAML or JSON).
        scenario: PathBuf,
    },
    /// Explain a pod: QoS class, cgroup parent and values, per-container OOM score.
    Explain(enforcer::cli::ExplainArgs),
    /// Configuration commands.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The pods the daemon runs (from its state directory): a table, or `-o json`.
    Pods(enforcer::cli::pods::PodsArgs),
    /// The node's events (kept in its state directory): a table as `kubectl get events`
    /// prints it, or `-o json`; `--pod NAME` for one pod's.
    Events(enforcer::cli::events::EventsArgs),
    /// Why a pod died: the causal record of its latest kill (eviction or kernel OOM kill):
    /// trigger, threshold and observation, ranking, and the times from the kernel event to
    /// the memory released.
    Why(enforcer::cli::why::WhyArgs),
    /// Every kill recorded on this node (evictions and kernel OOM kills): a table, or `-o json`.
    Evictions(enforcer::cli::evictions::EvictionsArgs),
    /// One screen for an operator: node conditions, each threshold with its observation and
    /// margin, the signal sources with their delays, the last kills, pods by QoS class.
    Status(enforcer::cli::status::StatusArgs),
    /// Checks the node against what the enforcer expects (kernel features, capabilities,
    /// pod cgroups, OOM scores, leftover cgroups); each finding with its fix; exit 0 when clean.
    Doctor(Box<enforcer::cli::doctor::DoctorArgs>),
    /// Writes back kubelet's `oom_score_adj` values that a companion replaced (kept in its state
    /// directory): a companion does it itself when it stops; this is for one that could not
    /// (killed), before or after an uninstall.
    RestoreOomScores {
        /// The companion's state directory.
        #[arg(long, default_value = "/var/lib/enforcer-companion")]
        state_dir: PathBuf,
    },
    /// Shell completion for the enforcer's commands and flags, on standard output
    /// (`enforcer completion bash > /etc/bash_completion.d/enforcer`).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate the configuration (file and flags) and print the effective one.
    Check(Box<enforcer::config::ConfigArgs>),
}

#[derive(clap::Args)]
struct SourceArgs {
    /// Signal source: eBPF (default, falls back when it cannot load) or a fallback forced.
    #[arg(long, value_enum)]
    signal_source: Option<SourceKind>,
    /// Memory cgroup directories the fallback sources watch (absolute paths).
    #[arg(long = "watch")]
    watches: Vec<PathBuf>,
    /// Usage threshold in bytes for the watched cgroups (default: 90 % of their limit).
    #[arg(long)]
    threshold_bytes: Option<u64>,
    /// Period of the polling source, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    poll_interval_ms: u64,
}

impl SourceArgs {
    fn choice(&self) -> SourceChoice {
        self.signal_source
            .map_or(SourceChoice::Auto, SourceChoice::Only)
    }
}

#[derive(clap::Args)]
struct RunArgs {
    /// Configuration: `--config FILE` (a KubeletConfiguration) and kubelet-style flags.
    #[command(flatten)]
    config: enforcer::config::ConfigArgs,
    /// Extra memory cgroup directories the fallback signal sources watch.
    #[arg(long = "watch")]
    watches: Vec<PathBuf>,
    /// Do not run pods: signals and eviction decisions only.
    #[arg(long)]
    no_pods: bool,
    /// Treat manifest-directory pods as kubelet static pods (critical: always admitted, never
    /// evicted), as kubelet does.
    #[arg(long)]
    static_pods: bool,
    /// Cluster mode: also run the pods the API server assigns to this node (watched with this
    /// kubeconfig), and write the Node, its Lease, pod status, mirror pods and events back.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Companion mode beside a running kubelet: kernel-speed hard evictions with kubelet's
    /// decisions, OOM scores aligned with kubelet's ranking; no pod run, no cgroup limit
    /// written (read kubelet's file with `--kubelet-config`).
    #[arg(long)]
    companion: bool,
    /// With `--companion`: act on soft thresholds too (left to kubelet otherwise).
    #[arg(long, requires = "companion")]
    companion_soft: bool,
}

#[derive(clap::Args)]
struct SignalsArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Only signals whose cgroup path starts with this (relative to its hierarchy, e.g. /kubepods).
    #[arg(long)]
    cgroup: Option<String>,
    /// Stop after this many signals.
    #[arg(long)]
    count: Option<u64>,
}

/// Installs the subscriber (text or JSON on stderr, filtered by `RUST_LOG`, default `info`)
/// with a reloadable filter: `PUT /debug/flags/v` changes it at run time
/// (`enforcer::server::debug` maps kubelet's verbosity numbers to filters).
fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let builder = builder.with_env_filter(filter).with_filter_reloading();
            install_reload(builder.reload_handle());
            builder.init();
        }
        LogFormat::Json => {
            let builder = builder
                .json()
                .with_env_filter(filter)
                .with_filter_reloading();
            install_reload(builder.reload_handle());
            builder.init();
        }
    }
}

fn install_reload<S: 'static>(
    handle: tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, S>,
) {
    enforcer::server::debug::install_verbosity(Box::new(move |spec| {
        let filter = tracing_subscriber::EnvFilter::try_new(spec)?;
        Ok(handle.reload(filter)?)
    }));
}

/// `enforcer restore-oom-scores`.
fn restore_oom_scores(state_dir: &std::path::Path) -> anyhow::Result<()> {
    let originals = enforcer::companion::oom::Originals::load(state_dir)?;
    if originals.is_empty() {
        println!(
            "no oom_score_adj values recorded in {}: nothing to restore",
            state_dir.display()
        );
        return Ok(());
    }
    let layout = CgroupLayout::discover()?;
    let done = enforcer::companion::restore_recorded(&layout, state_dir, &originals)?;
    println!(
        "kubelet's oom_score_adj restored on {} processes of {} containers",
        done.processes,
        originals.len()
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let result = match cli.command {
        Command::Run(args) => run(*args),
        Command::Signals(args) => signals(args),
        Command::Probe => probe(),
        Command::Pods(args) => return enforcer::cli::pods::pods_main(&args),
        Command::Events(args) => return enforcer::cli::events::events_main(&args),
        Command::Why(args) => return enforcer::cli::why::why_main(&args),
        Command::Evictions(args) => return enforcer::cli::evictions::evictions_main(&args),
        Command::Status(args) => return enforcer::cli::status::status_main(&args),
        Command::Doctor(args) => return enforcer::cli::doctor::doctor_main(&args),
        Command::Simulate { scenario } => return print_lines(enforcer::cli::simulate(&scenario)),
        Command::Explain(args) => return print_lines(enforcer::cli::explain(&args)),
        Command::RestoreOomScores { state_dir } => restore_oom_scores(&state_dir),
        Command::Completion { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "enforcer", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Command::Config(ConfigCommand::Check(args)) => {
            return print_lines(enforcer::cli::config_check(&args).map(|(text, warnings)| {
                for w in warnings {
                    eprintln!("enforcer: warning: {w}");
                }
                vec![text]
            }));
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("enforcer: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the lines of a decision-core command; an invalid input exits 2 with its message.
fn print_lines(result: Result<Vec<String>, enforcer::cli::CliError>) -> ExitCode {
    match result {
        Ok(lines) => {
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            for line in lines {
                if writeln!(out, "{line}").is_err() {
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("enforcer: {e}");
            ExitCode::from(2)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Resolves at SIGTERM or SIGINT. The handlers are installed when this is called (within the
/// runtime), not when the future is first polled: the daemon awaits it only once started, and a
/// SIGTERM during its start (a service stopped right away) must be a clean stop, not the
/// default action's death.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind as Sig, signal};
    let streams = (signal(Sig::terminate()), signal(Sig::interrupt()));
    async move {
        match streams {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            }
            _ => std::future::pending::<()>().await,
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let loaded = match enforcer::config::load(&args.config) {
        Ok(l) => l,
        Err(e) => {
            // An invalid configuration is the operator's input: a clear message, exit 2.
            eprintln!("enforcer: {e}");
            std::process::exit(2);
        }
    };
    for w in &loaded.warnings {
        tracing::warn!("configuration: {w}");
    }
    let opts = enforcer::daemon::DaemonOptions {
        config: loaded.config,
        watches: args.watches,
        run_pods: !args.no_pods,
        static_pods: args.static_pods,
        kubeconfig: args.kubeconfig,
        companion: args.companion.then_some(enforcer::daemon::CompanionMode {
            soft: args.companion_soft,
        }),
    };
    runtime()?.block_on(async { enforcer::daemon::run(opts, shutdown_signal()).await })?;
    Ok(())
}

fn signals(args: SignalsArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        let layout = CgroupLayout::discover()?;
        let caps = Capabilities::probe(&layout);
        let opts = PipelineOptions {
            source: args.source.choice(),
            watches: args
                .source
                .watches
                .iter()
                .map(|c| Watch {
                    cgroup: c.clone(),
                    threshold_bytes: args.source.threshold_bytes,
                })
                .collect(),
            poll_interval: Duration::from_millis(args.source.poll_interval_ms),
            ..PipelineOptions::default()
        };
        let mut pipeline = kernel::start(&opts, &caps, &layout)?;
        tracing::info!(source = ?pipeline.source, reason = %pipeline.reason, "printing signals");
        let mut printed = 0;
        let shutdown = shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            let s = tokio::select! {
                () = &mut shutdown => break,
                s = pipeline.signals.recv() => match s { Some(s) => s, None => break },
            };
            if let Some(prefix) = &args.cgroup
                && !s
                    .cgroup
                    .as_deref()
                    .is_some_and(|c| c.starts_with(prefix.as_str()))
            {
                continue;
            }
            println!("{}", serde_json::to_string(&s)?);
            printed += 1;
            if args.count.is_some_and(|c| printed >= c) {
                break;
            }
        }
        Ok(())
    })
}

fn probe() -> anyhow::Result<()> {
    #[derive(serde::Serialize)]
    struct Probe {
        #[serde(flatten)]
        caps: Capabilities,
        ebpf: kernel::ebpf::ProgramsProbe,
    }
    let layout = CgroupLayout::discover()?;
    if let Err(e) = kernel::ebpf::ensure_tracefs() {
        eprintln!("tracefs is not mounted and could not be mounted: {e}");
    }
    let caps = Capabilities::probe(&layout);
    let ebpf = kernel::ebpf::probe_programs();
    eprintln!("eBPF: {}", ebpf.summary);
    if let Some(c) = &ebpf.crossing {
        eprintln!("crossing check: {}", c.summary());
    }
    println!("{}", serde_json::to_string_pretty(&Probe { caps, ebpf })?);
    Ok(())
}
