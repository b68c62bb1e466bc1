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

#[test]
fn scenarios_black_box() {
    let bin = enforcer_tests::enforcer_binary();
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
