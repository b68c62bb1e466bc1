//! Builds the eBPF programs (enforcer-ebpf, for bpfel-unknown-none) with aya-build and leaves
//! the object in OUT_DIR, from where `src/kernel` embeds it into the binary.
//!
//! The eBPF crate needs `-Z build-std=core`: we build it with the stable toolchain and
//! RUSTC_BOOTSTRAP=1 (the versions that work are in ../shared/ENVIRONMENT.md). Set
//! AYA_BUILD_SKIP=1 to build the daemon without eBPF (the decision core and the fallback
//! signal sources still work; loading eBPF then fails with a clear error).
use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
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
