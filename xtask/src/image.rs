//! `cargo xtask image`: the release enforcer as an OCI image, as an OCI image layout on disk
//! (and `--push REF` to a registry through Debian's `skopeo`).
//!
//! One layer holds the binary (`/usr/local/bin/enforcer`), the shared libraries it links as
//! `ldd` resolves them here (at the paths the dynamic loader looks for them), and Debian's CA
//! bundle; nothing else: no shell, no package manager. The layout's documents are youki's
//! `oci-spec` types; the layer a tar (`tar`) gzipped (`flate2`). Everything in it is
//! reproducible: entries in path order, owner root, times the commit's time, the gzip header
//! without a time or name, and every JSON document with its keys sorted (oci-spec keeps labels
//! and annotations in hash maps). So two builds of one commit give the same digest.

use std::{
    collections::BTreeMap,
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
    str::FromStr as _,
};

use anyhow::{Context as _, bail};
use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, HistoryBuilder, ImageConfiguration,
    ImageConfigurationBuilder, ImageIndexBuilder, ImageManifestBuilder, MediaType,
    OciLayoutBuilder, Os, PlatformBuilder, RootFsBuilder, Sha256Digest,
};
use sha2::{Digest as _, Sha256};

use crate::{output, say, sh};

/// Where the binary is in the image.
pub const BINARY_PATH: &str = "usr/local/bin/enforcer";
/// Debian's CA bundle (package `ca-certificates`), at the same path in the image.
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// The image that was built.
#[derive(Debug)]
pub struct Built {
    /// The OCI image layout.
    pub layout: PathBuf,
    /// Its tag (the version) in the layout's index.
    pub tag: String,
    /// The manifest's digest (`sha256:...`): what a pod references.
    pub digest: String,
    /// The bytes a pull moves: the manifest, the config and the compressed layer.
    pub compressed: u64,
}

/// The version and commit `enforcer --version` prints (`enforcer 0.1.0 (commit abc)`).
fn version_of(bin: &Path) -> anyhow::Result<(String, String)> {
    let out = output(Command::new(bin).arg("--version"))
        .with_context(|| format!("{} --version", bin.display()))?;
    let rest = out.trim().strip_prefix("enforcer ").unwrap_or(out.trim());
    let (version, commit) = rest
        .split_once(" (commit ")
        .with_context(|| format!("unexpected --version output {out:?}"))?;
    Ok((version.to_owned(), commit.trim_end_matches(')').to_owned()))
}

/// The commit's time (seconds since the epoch): the image's `created` and every file's time.
/// `SOURCE_DATE_EPOCH` wins when set.
fn source_epoch() -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .or_else(|| output(Command::new("git").args(["show", "-s", "--format=%ct", "HEAD"])))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// RFC 3339 of `secs` (UTC), without a date library: days to a civil date.
fn rfc3339(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The shared objects `ldd` resolves for `bin`, as (path in the image, file here).
fn libraries(bin: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let out =
        output(Command::new("ldd").arg(bin)).with_context(|| format!("ldd {}", bin.display()))?;
    let mut libs = Vec::new();
    for line in out.lines() {
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            continue;
        };
        libs.push((path.trim_start_matches('/').to_owned(), PathBuf::from(path)));
    }
    if !libs.iter().any(|(p, _)| p.contains("ld-linux")) {
        bail!("ldd {} named no dynamic loader:\n{out}", bin.display());
    }
    Ok(libs)
}

/// A JSON document with every object's keys in order (oci-spec's maps are hash maps).
fn canonical_json(doc: &impl serde::Serialize) -> anyhow::Result<Vec<u8>> {
    fn sort(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => {
                let sorted: BTreeMap<String, serde_json::Value> =
                    m.into_iter().map(|(k, v)| (k, sort(v))).collect();
                serde_json::Value::Object(sorted.into_iter().collect())
            }
            serde_json::Value::Array(a) => {
                serde_json::Value::Array(a.into_iter().map(sort).collect())
            }
            other => other,
        }
    }
    Ok(serde_json::to_vec(&sort(serde_json::to_value(doc)?))?)
}

fn sha256_hex(data: &[u8]) -> String {
    let d = Sha256::digest(data);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `data` as a blob of the layout; returns its descriptor.
fn blob(layout: &Path, media: MediaType, data: &[u8]) -> anyhow::Result<Descriptor> {
    let hex = sha256_hex(data);
    let path = layout.join("blobs/sha256").join(&hex);
    fs::write(&path, data).with_context(|| format!("write {}", path.display()))?;
    let digest = Sha256Digest::from_str(&hex).context("a sha256 digest")?;
    Ok(Descriptor::new(media, u64::try_from(data.len())?, digest))
}

/// The layer: `files` (path in the image, file here, mode) and their parent directories, as
/// a reproducible tar; returns (tar, gzipped tar).
fn layer(files: &[(String, PathBuf, u32)], mtime: u64) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let mut entries: BTreeMap<String, Option<(PathBuf, u32)>> = BTreeMap::new();
    for (path, src, mode) in files {
        let mut parent = Path::new(path).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            entries.insert(format!("{}/", p.display()), None);
            parent = p.parent();
        }
        entries.insert(path.clone(), Some((src.clone(), *mode)));
    }
    // /tmp, sticky and world-writable, as every image has it (the root file system itself is
    // read-only in the DaemonSet).
    entries.insert("tmp/".to_owned(), None);
    let mut tar = tar::Builder::new(Vec::new());
    tar.mode(tar::HeaderMode::Deterministic);
    for (path, file) in &entries {
        let mut h = tar::Header::new_ustar();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(mtime);
        match file {
            None => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(if path == "tmp/" { 0o1777 } else { 0o755 });
                h.set_size(0);
                tar.append_data(&mut h, path, std::io::empty())
                    .with_context(|| format!("tar {path}"))?;
            }
            Some((src, mode)) => {
                let data = fs::read(src).with_context(|| format!("read {}", src.display()))?;
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(u64::try_from(data.len())?);
                tar.append_data(&mut h, path, data.as_slice())
                    .with_context(|| format!("tar {path}"))?;
            }
        }
    }
    let tar = tar.into_inner()?;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar)?;
    Ok((tar, gz.finish()?))
}

/// Builds the release enforcer and its image into `out` (an OCI image layout, made anew); with
/// `binary`, that enforcer binary instead (the install test packages the one it tests).
pub fn build(target_dir: &Path, out: &Path, binary: Option<&Path>) -> anyhow::Result<Built> {
    let bin = match binary {
        Some(b) => std::path::absolute(b)?,
        None => {
            sh(crate::cargo().args([
                "build",
                "--release",
                "--package",
                "enforcer",
                "--bin",
                "enforcer",
            ]))?;
            std::path::absolute(target_dir.join("release/enforcer"))?
        }
    };
    let (version, commit) = version_of(&bin)?;
    let epoch = source_epoch();
    let created = rfc3339(epoch);
    // Without its debug information (kept: the symbols, for pprof's profiles): a debug build
    // is mostly DWARF. `strip` writes the same bytes for the same input.
    let stripped = out.with_extension("binary");
    if let Some(parent) = out.parent() {
        fs::create_dir_all(parent).with_context(|| format!("mkdir {}", parent.display()))?;
    }
    sh(Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&stripped)
        .arg(&bin))?;
    let mut files = vec![(BINARY_PATH.to_owned(), stripped.clone(), 0o755)];
    for (path, src) in libraries(&bin)? {
        files.push((path, src, 0o755));
    }
    let ca = Path::new("/").join(CA_BUNDLE);
    if !ca.exists() {
        bail!(
            "{} is missing: install Debian's ca-certificates (cargo xtask setup)",
            ca.display()
        );
    }
    files.push((CA_BUNDLE.to_owned(), ca, 0o644));
    let (tar, gz) = layer(&files, epoch)?;

    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("rm -r {}", out.display()))?;
    }
    fs::create_dir_all(out.join("blobs/sha256"))
        .with_context(|| format!("mkdir {}", out.display()))?;
    let layer = blob(out, MediaType::ImageLayerGzip, &gz)?;
    let labels: std::collections::HashMap<String, String> = [
        ("org.opencontainers.image.title", "enforcer".to_owned()),
        (
            "org.opencontainers.image.description",
            "eBPF-accelerated node resource enforcer with kubelet's semantics".to_owned(),
        ),
        ("org.opencontainers.image.version", version.clone()),
        ("org.opencontainers.image.revision", commit.clone()),
        ("org.opencontainers.image.created", created.clone()),
        ("org.opencontainers.image.licenses", "Apache-2.0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let config = image_config(&version, &commit, &created, &labels, &tar)?;
    let config = blob(out, MediaType::ImageConfig, &canonical_json(&config)?)?;
    let manifest = ImageManifestBuilder::default()
        .schema_version(2_u32)
        .media_type(MediaType::ImageManifest)
        .config(config.clone())
        .layers(vec![layer.clone()])
        .annotations(labels)
        .build()?;
    let manifest_json = canonical_json(&manifest)?;
    let manifest_blob = blob(out, MediaType::ImageManifest, &manifest_json)?;
    let tag = version.clone();
    let listed = DescriptorBuilder::default()
        .media_type(MediaType::ImageManifest)
        .digest(manifest_blob.digest().clone())
        .size(manifest_blob.size())
        .platform(
            PlatformBuilder::default()
                .architecture(Arch::Amd64)
                .os(Os::Linux)
                .build()?,
        )
        .annotations(std::collections::HashMap::from([(
            "org.opencontainers.image.ref.name".to_owned(),
            tag.clone(),
        )]))
        .build()?;
    let index = ImageIndexBuilder::default()
        .schema_version(2_u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![listed])
        .build()?;
    fs::write(out.join("index.json"), canonical_json(&index)?)?;
    let layout = OciLayoutBuilder::default()
        .image_layout_version("1.0.0")
        .build()?;
    fs::write(out.join("oci-layout"), canonical_json(&layout)?)?;
    Ok(Built {
        layout: out.to_path_buf(),
        tag,
        digest: manifest_blob.digest().to_string(),
        compressed: manifest_blob.size() + config.size() + layer.size(),
    })
}

/// The image's configuration: its entrypoint (`enforcer run`), environment, labels, the
/// layer's diff id (the uncompressed `tar`'s digest) and how it was made.
fn image_config(
    version: &str,
    commit: &str,
    created: &str,
    labels: &std::collections::HashMap<String, String>,
    tar: &[u8],
) -> anyhow::Result<ImageConfiguration> {
    Ok(ImageConfigurationBuilder::default()
        .created(created)
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .entrypoint(vec![format!("/{BINARY_PATH}")])
                .cmd(vec!["run".to_owned()])
                .env(vec![
                    "PATH=/usr/local/bin".to_owned(),
                    format!("SSL_CERT_FILE=/{CA_BUNDLE}"),
                ])
                .working_dir("/")
                .labels(labels.clone())
                .build()?,
        )
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![format!("sha256:{}", sha256_hex(tar))])
                .build()?,
        )
        .history(vec![
            HistoryBuilder::default()
                .created(created)
                .created_by(format!(
                    "cargo xtask image (enforcer {version}, commit {commit})"
                ))
                .build()?,
        ])
        .build()?)
}

/// Pushes the layout's image to `reference` (`host:port/name:tag`) with skopeo; `tls_verify`
/// false for a plain-HTTP or self-signed test registry, `cert_dir` for its CA.
pub fn push(
    built: &Built,
    reference: &str,
    tls_verify: bool,
    cert_dir: Option<&Path>,
) -> anyhow::Result<()> {
    let mut cmd = Command::new("skopeo");
    cmd.args(["copy", "--quiet", "--preserve-digests"]);
    if let Some(d) = cert_dir {
        cmd.arg(format!("--dest-cert-dir={}", d.display()));
    }
    cmd.arg(format!("--dest-tls-verify={tls_verify}"))
        .arg(format!("oci:{}:{}", built.layout.display(), built.tag))
        .arg(format!("docker://{reference}"));
    sh(&mut cmd)?;
    say(format!("pushed {} to {reference}", built.digest));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_576_645), "2026-12-06T17:04:05Z");
    }

    #[test]
    fn json_keys_are_sorted_at_every_level() {
        let v = serde_json::json!({"b": 1, "a": {"y": [{"d": 1, "c": 2}], "x": 0}});
        let s = String::from_utf8(canonical_json(&v).unwrap()).unwrap();
        assert_eq!(s, r#"{"a":{"x":0,"y":[{"c":2,"d":1}]},"b":1}"#);
    }

    #[test]
    fn the_layer_is_the_same_bytes_twice_and_has_its_parents() {
        let dir = std::env::temp_dir().join(format!("xtask-layer-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("f");
        fs::write(&f, b"hello").unwrap();
        let files = vec![("usr/local/bin/x".to_owned(), f.clone(), 0o755)];
        let (tar1, gz1) = layer(&files, 1_700_000_000).unwrap();
        // Touched again: the file's own time does not reach the layer.
        fs::write(&f, b"hello").unwrap();
        let (tar2, gz2) = layer(&files, 1_700_000_000).unwrap();
        assert_eq!(sha256_hex(&tar1), sha256_hex(&tar2));
        assert_eq!(sha256_hex(&gz1), sha256_hex(&gz2));
        let mut a = tar::Archive::new(tar1.as_slice());
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "tmp/",
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "usr/local/bin/x"
            ]
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
