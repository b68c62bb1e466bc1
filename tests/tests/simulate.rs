//! `enforcer simulate` on the scenarios in `tests/scenarios`: every `NAME.yaml` must print
//! exactly `NAME.expected`; every `invalid/NAME.yaml` must fail with exit status 2 and a
//! message containing `invalid/NAME.error`, without a panic. The scenarios run in-process
//! through `enforcer::cli::simulate` and once more through the built binary, as a black box.

use enforcer_tests::yaml_files;
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

fn expected(path: &Path, ext: &str) -> String {
    let p = path.with_extension(ext);
    fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn scenarios_in_process() {
    for path in yaml_files(&scenarios_dir()) {
        let lines =
            enforcer::cli::simulate(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let got = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        assert_eq!(got, expected(&path, "expected"), "{}", path.display());
        for line in &lines {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(
                v["evicted"].as_array().is_some_and(|e| e.len() <= 1),
                "more than one eviction in a step: {line}"
            );
        }
    }
}

#[test]
fn invalid_scenarios_in_process() {
    for path in yaml_files(&scenarios_dir().join("invalid")) {
        let want = expected(&path, "error");
        let err = enforcer::cli::simulate(&path)
            .expect_err(&path.display().to_string())
            .to_string();
        assert!(
            err.contains(want.trim()),
            "{}: {err:?} does not contain {want:?}",
            path.display()
        );
        assert!(
            err.contains(&*path.file_name().unwrap().to_string_lossy()),
            "{err} does not name the file"
        );
    }
}

/// The `enforcer` binary next to this test's target directory, built if needed.
fn enforcer_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/simulate-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_owned();
    let target_dir = profile_dir.parent().expect("target dir").to_owned();
    let bin = profile_dir.join("enforcer");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = Command::new(cargo);
    build
        .args([
            "build",
            "-p",
            "enforcer",
            "--bin",
            "enforcer",
            "--target-dir",
        ])
        .arg(&target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo build");
    assert!(status.success(), "cargo build -p enforcer failed");
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

#[test]
fn scenarios_black_box() {
    let bin = enforcer_binary();
    for path in yaml_files(&scenarios_dir()) {
        let out = Command::new(&bin)
            .arg("simulate")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            expected(&path, "expected"),
            "{}",
            path.display()
        );
    }
    for path in yaml_files(&scenarios_dir().join("invalid")) {
        let out = Command::new(&bin)
            .arg("simulate")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", path.display());
        assert!(out.stdout.is_empty());
        assert!(
            stderr.contains(expected(&path, "error").trim()),
            "{}: {stderr}",
            path.display()
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
            "{stderr}"
        );
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "one message: {stderr}"
        );
    }
    // A missing file and a missing argument are invalid input too.
    let out = Command::new(&bin)
        .args(["simulate", "/nonexistent/scenario.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/scenario.yaml"));
    let out = Command::new(&bin).arg("simulate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
