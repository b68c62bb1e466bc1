//! Mutation fuzzing of the input parsers, as a test: the scenario files, the example pod
//! manifests and a full KubeletConfiguration are mutated byte-wise and token-wise (spans
//! deleted, duplicated, replaced by hostile tokens: negative and huge numbers, NaN-like strings,
//! YAML punctuation, `..`, NUL) and fed to `simulate`, `explain`, `config::load` and the
//! manifest-directory parser. Every mutant must give `Ok` or a clear error: never a panic. The
//! generator is a fixed-seed xorshift, so a failure names a mutant that can be replayed.

use enforcer_tests::yaml_files;
use std::{
    fs,
    panic::{AssertUnwindSafe, catch_unwind},
    path::{Path, PathBuf},
};

use enforcer::{
    cli::{ExplainArgs, explain, simulate},
    config::{self, ConfigArgs},
    sources::parse_manifest,
};

/// Mutants per input file.
const MUTANTS: usize = 150;

const TOKENS: &[&str] = &[
    "-1",
    "0",
    "1e30",
    "1e-30",
    "NaN",
    "-Inf",
    "99999999999999999999999Ki",
    "0.0000000001m",
    "18446744073709551616",
    "%",
    "100%",
    "<",
    ">",
    ":",
    "{",
    "}",
    "[",
    "]",
    "- ",
    "\n",
    "\n  ",
    "\t",
    "'",
    "\"",
    "&a",
    "*a",
    "!!binary",
    "~",
    "null",
    "true",
    "../../etc",
    "/",
    "\0",
    "é",
    "-9223372036854775808",
    "1h99999999999999s",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n.max(1)).unwrap_or(1)).unwrap_or(0)
    }
}

/// One mutant of `text`: one to three edits at char boundaries.
fn mutate(text: &str, rng: &mut Rng) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for _ in 0..=rng.below(3) {
        let at = rng.below(chars.len() + 1);
        let len = rng.below(12).min(chars.len().saturating_sub(at));
        match rng.below(4) {
            0 => {
                chars.drain(at..at + len);
            }
            1 => {
                let span: Vec<char> = chars[at..at + len].to_vec();
                let to = rng.below(chars.len() + 1);
                chars.splice(to..to, span);
            }
            _ => {
                let token = TOKENS[rng.below(TOKENS.len())];
                chars.splice(at..at + len, token.chars());
            }
        }
    }
    chars.into_iter().collect()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf()
}

/// Runs `f` on mutants of every file; panics (failing the test) naming the first mutant that
/// made `f` panic. Returns how many mutants were accepted and how many refused.
fn fuzz(files: &[PathBuf], seed: u64, f: impl Fn(&Path) -> bool) -> (usize, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng(seed);
    let (mut ok, mut refused) = (0, 0);
    for file in files {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for n in 0..MUTANTS {
            let mutant = mutate(&text, &mut rng);
            let path = dir.path().join(format!("mutant-{n}.yaml"));
            fs::write(&path, &mutant).expect("write mutant");
            match catch_unwind(AssertUnwindSafe(|| f(&path))) {
                Ok(true) => ok += 1,
                Ok(false) => refused += 1,
                Err(_) => panic!(
                    "mutant {n} of {} made the parser panic:\n{mutant}",
                    file.display()
                ),
            }
        }
    }
    (ok, refused)
}

#[test]
fn mutated_scenarios_never_panic_simulate() {
    let files = yaml_files(&repo().join("tests/scenarios"));
    let (ok, refused) = fuzz(&files, 0x5eed_0001, |p| match simulate(p) {
        Ok(_) => true,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    });
    // The mutants exercise both sides: some still valid, most refused.
    assert!(ok > 0 && refused > 0, "accepted {ok}, refused {refused}");
}

#[test]
fn mutated_manifests_never_panic_explain_or_the_manifest_source() {
    let files = yaml_files(&repo().join("examples/manifests"));
    let (ok, refused) = fuzz(&files, 0x5eed_0002, |p| {
        let text = fs::read_to_string(p).expect("read mutant");
        let source = parse_manifest(p, &text, "node-1");
        let explained = explain(&ExplainArgs {
            pod: p.to_path_buf(),
            node_cpu: Some("4".into()),
            node_memory: Some("8Gi".into()),
            cgroup_version: Some(2),
            config: None,
        });
        // A mutant the source accepts is explained (explain adds no rule of its own).
        if source.is_ok() {
            assert!(explained.is_ok(), "{p:?}: {explained:?}");
        }
        explained.is_ok()
    });
    assert!(ok > 0 && refused > 0, "accepted {ok}, refused {refused}");
}

#[test]
fn mutated_kubelet_configurations_never_panic_the_loader() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("kubelet.yaml");
    fs::write(
        &base,
        "apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         evictionHard: {memory.available: 500Mi, nodefs.available: 10%}\n\
         evictionSoft: {memory.available: 1Gi}\n\
         evictionSoftGracePeriod: {memory.available: 1m30s}\n\
         evictionMinimumReclaim: {memory.available: 0Mi}\n\
         evictionMaxPodGracePeriod: 30\n\
         evictionPressureTransitionPeriod: 5m\n\
         systemReserved: {cpu: 500m, memory: 1Gi}\n\
         kubeReserved: {cpu: 100m, memory: 512Mi, pid: '1000'}\n\
         enforceNodeAllocatable: [pods]\n\
         cgroupRoot: /\n\
         cgroupDriver: cgroupfs\n\
         cpuManagerPolicy: static\n\
         reservedSystemCPUs: '0'\n\
         maxPods: 110\n\
         kubeAPIQPS: 50\n\
         kubeAPIBurst: 100\n\
         serializeImagePulls: true\n\
         enforcer:\n  housekeepingInterval: 10s\n  nodeCapacity: {memory: 2Gi}\n",
    )
    .expect("write config");
    assert!(
        config::load(&ConfigArgs {
            config: Some(base.clone()),
            ..ConfigArgs::default()
        })
        .is_ok(),
        "the base configuration must load"
    );
    let (ok, refused) = fuzz(&[base], 0x5eed_0003, |p| {
        config::load(&ConfigArgs {
            config: Some(p.to_path_buf()),
            ..ConfigArgs::default()
        })
        .is_ok()
    });
    assert!(ok > 0 && refused > 0, "accepted {ok}, refused {refused}");
}
