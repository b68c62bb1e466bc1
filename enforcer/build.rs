//! Builds the eBPF programs (enforcer-ebpf, for bpfel-unknown-none) with aya-build and leaves
//! the object in OUT_DIR, from where `src/kernel` embeds it into the binary.
//!
//! The eBPF crate needs `-Z build-std=core`: we build it with the stable toolchain and
//! RUSTC_BOOTSTRAP=1 (the versions that work are in ../shared/ENVIRONMENT.md). Set
//! AYA_BUILD_SKIP=1 to build the daemon without eBPF (the decision core and the fallback
//! signal sources still work; loading eBPF then fails with a clear error).
use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, anyhow};

/// The commit the binary is built from (`git rev-parse`), or `ENFORCER_COMMIT` when set (a
/// build from a source archive), else `unknown`: `enforcer --version`, the start log line,
/// `enforcer_build_info` and the image's labels carry it.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=ENFORCER_COMMIT");
    if let Ok(c) = env::var("ENFORCER_COMMIT") {
        return c;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    // Rebuilt when HEAD moves: HEAD itself, the branch it names, and the packed refs.
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])),
        git(&["rev-parse", "--git-path", "packed-refs"]),
    ]
    .into_iter()
    .flatten()
    {
        let p = PathBuf::from(&path);
        let p = if p.is_absolute() {
            p
        } else {
            PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default()).join(p)
        };
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
}

fn main() -> anyhow::Result<()> {
    let commit = commit();
    println!("cargo:rustc-env=ENFORCER_COMMIT={commit}");
    println!(
        "cargo:rustc-env=ENFORCER_VERSION_LINE={} (commit {commit})",
        env::var("CARGO_PKG_VERSION").unwrap_or_default()
    );
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?);
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-env-changed=ENFORCER_EBPF_TOOLCHAIN");
    if skip {
        // An empty object: the loader reports "built without eBPF" at run time.
        for name in ["enforcer", "memcg-usage"] {
            fs::write(out_dir.join(name), b"").context("writing the empty eBPF placeholder")?;
        }
        return Ok(());
    }
    let manifest = PathBuf::from(
        env::var_os("CARGO_MANIFEST_DIR").ok_or_else(|| anyhow!("no CARGO_MANIFEST_DIR"))?,
    );
    let ebpf_dir = manifest
        .parent()
        .ok_or_else(|| anyhow!("no workspace root"))?
        .join("enforcer-ebpf");
    let root_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    let toolchain = env::var("ENFORCER_EBPF_TOOLCHAIN").unwrap_or_else(|_| "stable".to_owned());
    if env::var_os("RUSTC_BOOTSTRAP").is_none() {
        // SAFETY: the build script is single-threaded here; aya-build reads this variable to
        // decide on -Z build-std, and the child cargo inherits it.
        unsafe { env::set_var("RUSTC_BOOTSTRAP", "1") };
    }
    // aya-build forwards every line the child cargo writes to stderr as a build warning
    // ("Compiling enforcer-ebpf ...", "Finished ..."): a quiet child keeps only what matters
    // (the compiler's own warnings and errors come through its JSON messages).
    // SAFETY: as above, single-threaded; the child cargo inherits it.
    unsafe { env::set_var("CARGO_TERM_QUIET", "true") };
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "enforcer-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
    .context(
        "building the eBPF programs (run `cargo xtask setup` if bpf-linker or rust-src is missing)",
    )
}
