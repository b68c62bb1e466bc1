//! The test runner of `cargo xtask test`, on this host and in the VM's guest: every test in a
//! process of its own, under a bound, several at once.
//!
//! libtest has no per-test timeout on stable, and one hung test held a whole tier (and the VM
//! around it) until the VM's own bound. Here each test runs as `BIN --exact NAME
//! --test-threads=1 --nocapture` with its output in a file. A test past its bound is reported
//! with what it was doing: its output so far (the daemon's log, the helpers' "waiting for"
//! lines), the stacks of its threads (`gdb`), the processes of the machine and the kernel's
//! log; then its process group is killed and what its fixtures left (processes and cgroups
//! named after its PID: `enforcer-test-<pid>-...`) is removed.
//!
//! Tests of one serial group (a tier that holds one lock in-process today: the node's memory,
//! one fake API server's timing; or tiers that share a fixed port) run one at a time; others
//! run beside them, `parallel` at once.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::Write as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// One test to run.
#[derive(Debug, Clone)]
pub struct Job {
    /// The tier (test binary) it belongs to: `unit`, `signals`, ...
    pub tier: String,
    pub bin: PathBuf,
    /// Where cargo would run it (the package directory).
    pub cwd: PathBuf,
    pub test: String,
    /// The tests of one group run one at a time (`None`: beside anything).
    pub group: Option<String>,
    /// Its bound.
    pub bound: Duration,
}

/// How a test ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    Failed,
    TimedOut,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Self::Passed => "ok",
            Self::Failed => "FAILED",
            Self::TimedOut => "TIMEOUT",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "ok" => Some(Self::Passed),
            "FAILED" => Some(Self::Failed),
            "TIMEOUT" => Some(Self::TimedOut),
            _ => None,
        }
    }
}

/// What one test did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub tier: String,
    pub test: String,
    pub verdict: Verdict,
    pub seconds: f64,
    /// Its output (and, past its bound, the diagnosis), in a file.
    pub log: PathBuf,
}

/// A plan as a file (one job a line, tab-separated: tier, serial group or `-`, bound in
/// seconds, cwd, binary, test), so the guest's runner gets the host's plan.
pub fn write_plan(path: &Path, jobs: &[Job]) -> anyhow::Result<()> {
    let mut s = String::new();
    for j in jobs {
        let _ = writeln!(
            s,
            "{}\t{}\t{}\t{}\t{}\t{}",
            j.tier,
            j.group.as_deref().unwrap_or("-"),
            j.bound.as_secs(),
            j.cwd.display(),
            j.bin.display(),
            j.test
        );
    }
    fs::write(path, s).with_context(|| format!("write {}", path.display()))
}

/// Reads a plan written by [`write_plan`].
pub fn read_plan(path: &Path) -> anyhow::Result<Vec<Job>> {
    let text = fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| {
            let f: Vec<&str> = l.splitn(6, '\t').collect();
            let [tier, group, bound, cwd, bin, test] = f[..] else {
                bail!("{}:{}: not 6 tab-separated fields", path.display(), i + 1);
            };
            Ok(Job {
                tier: tier.to_owned(),
                group: (group != "-").then(|| group.to_owned()),
                bound: Duration::from_secs(
                    bound.parse().with_context(|| {
                        format!("{}:{}: bound {bound:?}", path.display(), i + 1)
                    })?,
                ),
                cwd: PathBuf::from(cwd),
                bin: PathBuf::from(bin),
                test: test.to_owned(),
            })
        })
        .collect()
}

/// An outcome as a line of `outcomes.tsv` (tab-separated: tier, verdict, seconds, test,
/// log).
fn outcome_line(o: &Outcome) -> String {
    format!(
        "{}\t{}\t{:.2}\t{}\t{}",
        o.tier,
        o.verdict.word(),
        o.seconds,
        o.test,
        o.log.display()
    )
}

/// Reads the outcomes of a run ([`run`] writes them); the logs are looked for in `log_dir` (the
/// guest wrote its own paths). Lines that do not parse are skipped.
pub fn read_outcomes(path: &Path, log_dir: &Path) -> Vec<Outcome> {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(5, '\t').collect();
            let [tier, verdict, secs, test, log] = f[..] else {
                return None;
            };
            let name = Path::new(log).file_name()?;
            Some(Outcome {
                tier: tier.to_owned(),
                test: test.to_owned(),
                verdict: Verdict::parse(verdict)?,
                seconds: secs.parse().ok()?,
                log: log_dir.join(name),
            })
        })
        .collect()
}

/// A test's log file name in the output directory.
fn log_name(job: &Job) -> String {
    let t: String = job
        .test
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("{}__{t}.log", job.tier)
}

struct Running {
    job: Job,
    child: Child,
    started: Instant,
    log: PathBuf,
}

/// Runs `jobs`, `parallel` at once (a serial tier's tests one at a time), each under its
/// bound, logs in `out_dir`; prints a line per test as it ends (a failure with its log) and
/// appends each outcome to `<out_dir>/outcomes.tsv` as it comes (so a run cut short still
/// tells what it did). `env` is set for every test.
pub fn run(
    jobs: Vec<Job>,
    parallel: usize,
    out_dir: &Path,
    env: &[(String, String)],
) -> anyhow::Result<Vec<Outcome>> {
    fs::create_dir_all(out_dir).with_context(|| format!("mkdir {}", out_dir.display()))?;
    let parallel = parallel.max(1);
    let total = jobs.len();
    let mut queue: std::collections::VecDeque<Job> = jobs.into();
    let mut running: Vec<Running> = Vec::new();
    let mut done: Vec<Outcome> = Vec::new();
    let tsv = out_dir.join("outcomes.tsv");
    let _ = fs::remove_file(&tsv);
    loop {
        // Start what may start: a free slot, and no test of the same serial tier running.
        while running.len() < parallel {
            let pos = queue.iter().position(|j| {
                j.group
                    .as_ref()
                    .is_none_or(|g| !running.iter().any(|r| r.job.group.as_ref() == Some(g)))
            });
            let Some(job) = pos.and_then(|p| queue.remove(p)) else {
                break;
            };
            running.push(start(job, out_dir, env)?);
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
        let mut i = 0;
        while i < running.len() {
            let r = &mut running[i];
            let exited = r.child.try_wait().ok().flatten();
            let elapsed = r.started.elapsed();
            let verdict = match exited {
                Some(status) if status.success() => Some(ran_it(&r.log)),
                Some(_) => Some(Verdict::Failed),
                None if elapsed > r.job.bound => {
                    diagnose_and_kill(r);
                    Some(Verdict::TimedOut)
                }
                None => None,
            };
            let Some(verdict) = verdict else {
                i += 1;
                continue;
            };
            let r = running.swap_remove(i);
            let outcome = Outcome {
                tier: r.job.tier.clone(),
                test: r.job.test.clone(),
                verdict,
                seconds: elapsed.as_secs_f64(),
                log: r.log.clone(),
            };
            report_one(&outcome, done.len() + 1, total);
            if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(&tsv) {
                let _ = writeln!(f, "{}", outcome_line(&outcome));
            }
            done.push(outcome);
        }
    }
    Ok(done)
}

fn start(job: Job, out_dir: &Path, env: &[(String, String)]) -> anyhow::Result<Running> {
    let log = out_dir.join(log_name(&job));
    let out = fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(&job.bin);
    cmd.args(["--exact", &job.test, "--test-threads=1", "--nocapture"])
        .current_dir(&job.cwd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {} {}", job.bin.display(), job.test))?;
    Ok(Running {
        job,
        child,
        started: Instant::now(),
        log,
    })
}

/// A test that exited 0 passed when libtest says it ran it (`1 passed`); a name that
/// matched nothing, or an ignored test, ran nothing and fails here, saying so.
fn ran_it(log: &Path) -> Verdict {
    let text = fs::read_to_string(log).unwrap_or_default();
    let ran = text
        .lines()
        .rev()
        .find(|l| l.starts_with("test result:"))
        .is_some_and(|l| l.contains(" 1 passed;"));
    if ran {
        Verdict::Passed
    } else {
        if let Ok(mut f) = fs::OpenOptions::new().append(true).open(log) {
            let _ = writeln!(
                f,
                "\n==== xtask: the binary exited 0 but libtest ran no test of this name \
                 (no `1 passed`): counted as failed ===="
            );
        }
        Verdict::Failed
    }
}

fn report_one(o: &Outcome, n: usize, total: usize) {
    eprintln!(
        "test [{n}/{total}] {:<8} {:>7.1} s  {}::{}",
        o.verdict.word(),
        o.seconds,
        o.tier,
        o.test
    );
    if o.verdict != Verdict::Passed {
        let text = fs::read_to_string(&o.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(400);
        eprintln!(
            "---- {}::{} ({}; last {} lines of {}) ----",
            o.tier,
            o.test,
            o.verdict.word(),
            lines.len() - from,
            o.log.display()
        );
        for l in &lines[from..] {
            eprintln!("{l}");
        }
        eprintln!("---- end of {}::{} ----", o.tier, o.test);
    }
}

/// A test past its bound: what it was doing, into its log; then its process group killed
/// and what its fixtures left removed.
fn diagnose_and_kill(r: &mut Running) {
    let pid = r.child.id();
    let mut d = format!(
        "\n==== xtask: {}::{} passed its bound of {} s: killed. What it was doing: ====\n\
         (its output above ends where it was waiting; below, its threads' stacks, the \
         machine's processes and the kernel's log)\n",
        r.job.tier,
        r.job.test,
        r.job.bound.as_secs()
    );
    let capture = |d: &mut String, title: &str, cmd: &mut Command| {
        let _ = writeln!(d, "\n---- {title} ----");
        match cmd.stdin(Stdio::null()).output() {
            Ok(o) => {
                d.push_str(&String::from_utf8_lossy(&o.stdout));
                d.push_str(&String::from_utf8_lossy(&o.stderr));
            }
            Err(e) => {
                let _ = writeln!(d, "({title} could not run: {e})");
            }
        }
    };
    capture(
        &mut d,
        "threads of the test process (gdb)",
        Command::new("timeout").args([
            "120",
            "gdb",
            "-p",
            &pid.to_string(),
            "-batch",
            "-nx",
            "-ex",
            "set pagination off",
            "-ex",
            "thread apply all bt 30",
        ]),
    );
    capture(
        &mut d,
        "processes (ps)",
        Command::new("ps").args(["-eo", "pid,ppid,pgid,stat,etimes,wchan:24,args"]),
    );
    capture(
        &mut d,
        "kernel log (last 60 lines)",
        Command::new("sh").args(["-c", "dmesg | tail -n 60"]),
    );
    if let Ok(mut f) = fs::OpenOptions::new().append(true).open(&r.log) {
        let _ = f.write_all(d.as_bytes());
    }
    if let Some(p) = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap_or(0)) {
        let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
    }
    let _ = r.child.kill();
    let _ = r.child.wait();
    clean_after(pid);
}

/// Processes and cgroups a killed test's fixtures left: the fixtures name them after the
/// test's PID (`enforcer_tests::unique_name`: `enforcer-test-<pid>-<n>-<tag>`, in systemd's
/// form `enforcer_test_<pid>_...`).
fn clean_after(pid: u32) {
    let marks = [
        format!("enforcer-test-{pid}-"),
        format!("enforcer_test_{pid}_"),
    ];
    // Processes whose command line names one of its directories (its containerd, shims).
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if marks.iter().any(|m| cmdline.contains(m.as_str()))
                && let Some(p) = rustix::process::Pid::from_raw(p)
            {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
    }
    // Its cgroups, in every hierarchy: processes killed, then removed, deepest first.
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
    if let Ok(rd) = fs::read_dir("/sys/fs/cgroup") {
        roots.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    for root in roots {
        let Ok(rd) = fs::read_dir(&root) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if marks.iter().any(|m| name.starts_with(m.as_str())) {
                for _ in 0..50 {
                    kill_and_remove(&e.path());
                    if !e.path().exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

fn kill_and_remove(dir: &Path) {
    // The whole subtree at once where the kernel can (cgroup v2): a fork loop cannot outrun it.
    let _ = fs::write(dir.join("cgroup.kill"), "1");
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                kill_and_remove(&e.path());
            }
        }
    }
    for pid in fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
    {
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    let _ = fs::remove_dir(dir);
}

/// Per tier: tests passed, failed (timed out included), and seconds (the tests' own times
/// added up), in the order tiers first appear.
pub fn by_tier(outcomes: &[Outcome]) -> Vec<(String, usize, usize, f64)> {
    let mut order: Vec<String> = Vec::new();
    let mut m: BTreeMap<String, (usize, usize, f64)> = BTreeMap::new();
    for o in outcomes {
        if !m.contains_key(&o.tier) {
            order.push(o.tier.clone());
        }
        let e = m.entry(o.tier.clone()).or_default();
        if o.verdict == Verdict::Passed {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
        e.2 += o.seconds;
    }
    order
        .into_iter()
        .filter_map(|t| m.get(&t).map(|&(p, f, s)| (t, p, f, s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(tier: &str, test: &str, serial: bool) -> Job {
        Job {
            tier: tier.into(),
            bin: "/bin/x".into(),
            cwd: "/tmp".into(),
            test: test.into(),
            group: serial.then(|| tier.to_owned()),
            bound: Duration::from_secs(7),
        }
    }

    #[test]
    fn a_plan_reads_back_as_written() {
        let dir = std::env::temp_dir().join(format!("xtask-plan-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let jobs = vec![job("a", "m::t one", true), job("b", "u", false)];
        write_plan(&dir.join("plan"), &jobs).unwrap();
        let back = read_plan(&dir.join("plan")).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].test, "m::t one");
        assert!(back[0].group.as_deref() == Some("a") && back[1].group.is_none());
        assert_eq!(back[1].bound, Duration::from_secs(7));
        fs::write(dir.join("bad"), "a\t1\n").unwrap();
        let e = read_plan(&dir.join("bad")).unwrap_err().to_string();
        assert!(e.contains("bad:1"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_test_past_its_bound_is_killed_and_diagnosed_and_serial_tiers_wait() {
        let dir = std::env::temp_dir().join(format!("xtask-run-{}", std::process::id()));
        // A "test binary" that ignores libtest's arguments: sleeps as long as its name says.
        let bin = dir.join("fake-test");
        fs::create_dir_all(&dir).unwrap();
        let seq = dir.join("seq");
        fs::write(
            &bin,
            format!(
                "#!/bin/sh\necho \"running $2\"\necho \"start $2\" >> {seq}\n\
                 case \"$2\" in\n  hang) sleep 30 ;;\n  fail) exit 101 ;;\n  \
                 nothing) echo 'test result: ok. 0 passed; 0 failed'; exit 0 ;;\n  \
                 *) sleep 0.3 ;;\nesac\necho \"end $2\" >> {seq}\n\
                 echo 'test result: ok. 1 passed; 0 failed'\n",
                seq = seq.display()
            ),
        )
        .unwrap();
        fs::set_permissions(
            &bin,
            <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
        )
        .unwrap();
        let mk = |tier: &str, test: &str, serial: bool, bound: u64| Job {
            tier: tier.into(),
            bin: bin.clone(),
            cwd: dir.clone(),
            test: test.into(),
            group: serial.then(|| tier.to_owned()),
            bound: Duration::from_secs(bound),
        };
        let jobs = vec![
            mk("s", "a", true, 10),
            mk("s", "b", true, 10),
            mk("p", "hang", false, 1),
            mk("p", "fail", false, 10),
            mk("p", "nothing", false, 10),
        ];
        let t0 = Instant::now();
        let out = run(jobs, 3, &dir.join("out"), &[]).unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the hang was not cut"
        );
        let get = |t: &str| out.iter().find(|o| o.test == t).unwrap();
        assert_eq!(get("a").verdict, Verdict::Passed);
        assert_eq!(get("fail").verdict, Verdict::Failed);
        assert_eq!(get("hang").verdict, Verdict::TimedOut);
        assert_eq!(get("nothing").verdict, Verdict::Failed, "ran no test");
        let log = fs::read_to_string(&get("hang").log).unwrap();
        assert!(log.contains("running hang"), "{log}");
        assert!(log.contains("passed its bound of 1 s"), "{log}");
        assert!(log.contains("---- processes (ps) ----"), "{log}");
        // The serial tier's two tests did not overlap (three slots were free).
        let seq = fs::read_to_string(&seq).unwrap();
        let order: Vec<&str> = seq
            .lines()
            .filter(|l| l.ends_with(" a") || l.ends_with(" b"))
            .collect();
        assert!(
            order == ["start a", "end a", "start b", "end b"],
            "serial tests overlapped: {order:?}"
        );
        let back = read_outcomes(&dir.join("out/outcomes.tsv"), &dir.join("out"));
        assert_eq!(back.len(), 5);
        let tiers = by_tier(&out);
        let s = tiers.iter().find(|t| t.0 == "s").unwrap();
        assert_eq!((s.1, s.2), (2, 0));
        let p = tiers.iter().find(|t| t.0 == "p").unwrap();
        assert_eq!((p.1, p.2), (0, 3));
        fs::remove_dir_all(&dir).unwrap();
    }
}
