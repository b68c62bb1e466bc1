//! A local busybox OCI image, built from the node's `busybox-static` binary with tar, gzip and
//! sha256 alone (no registry is needed): one gzip layer with `/bin/busybox` and its applet links,
//! a config whose `Cmd` is `["/bin/sleep", "infinity"]` (so it also serves as the sandbox
//! image), and an `index.json` whose entry carries the `io.containerd.image.name` annotation, as
//! `ctr images import` expects. The build is deterministic: the same binary gives the same
//! digests.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use sha2::{Digest as _, Sha256};

/// The name the local image is imported under (pods may say `busybox:local`).
pub const LOCAL_IMAGE: &str = "docker.io/library/busybox:local";

/// Errors of the image builder; each names the file or step it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What was built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltImage {
    /// The image name recorded in `index.json`.
    pub name: String,
    /// The OCI archive (an uncompressed tar of the image layout).
    pub archive: PathBuf,
    /// `sha256:<hex>` of the manifest.
    pub manifest_digest: String,
    /// Number of applet links in the layer.
    pub applets: usize,
}

/// The applets a busybox binary offers (`busybox --list`).
pub fn applets(busybox: &Path) -> Result<Vec<String>, ImageError> {
    let out = Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(io_err(busybox))?;
    if !out.status.success() {
        return Err(ImageError::Invalid {
            path: busybox.to_path_buf(),
            what: format!("`--list` failed: {}", out.status),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/') && *a != "..")
        .map(str::to_owned)
        .collect())
}

/// The uncompressed root filesystem layer.
fn layer(busybox: &Path, applets: &[String]) -> Result<Vec<u8>, ImageError> {
    let bin = std::fs::read(busybox).map_err(io_err(busybox))?;
    let layer_path = Path::new("<layer>");
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |h: &mut tar::Header, path: &str, data: &[u8]| {
        b.append_data(h, path, data).map_err(io_err(layer_path))
    };
    for (dir, mode) in [
        ("bin", 0o755),
        ("dev", 0o755),
        ("etc", 0o755),
        ("proc", 0o555),
        ("root", 0o700),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("var", 0o755),
    ] {
        add(&mut header(tar::EntryType::Directory, mode, 0), dir, &[])?;
    }
    let passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n";
    let group = b"root:x:0:\nnogroup:x:65534:\n";
    for (path, data) in [("etc/passwd", &passwd[..]), ("etc/group", &group[..])] {
        add(
            &mut header(tar::EntryType::Regular, 0o644, data.len() as u64),
            path,
            data,
        )?;
    }
    add(
        &mut header(tar::EntryType::Regular, 0o755, bin.len() as u64),
        "bin/busybox",
        &bin,
    )?;
    for applet in applets {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        h.set_link_name("busybox").map_err(io_err(layer_path))?;
        add(&mut h, &format!("bin/{applet}"), &[])?;
    }
    b.into_inner().map_err(io_err(layer_path))
}

/// The busybox root filesystem layer: `(gzip blob, diff_id)` where the diff_id is
/// `sha256:<hex>` of the uncompressed tar (deterministic: the same binary gives the same bytes).
pub fn busybox_layer(busybox: &Path) -> Result<(Vec<u8>, String), ImageError> {
    let applets = applets(busybox)?;
    let layer_tar = layer(busybox, &applets)?;
    let diff_id = format!("sha256:{}", sha256_hex(&layer_tar));
    Ok((gzip(&layer_tar, busybox)?, diff_id))
}

/// The image config of a busybox image for `architecture` (OCI names: `amd64`, `arm64`)
/// whose layers have `diff_ids`: `Cmd ["/bin/sleep", "infinity"]`.
#[must_use]
pub fn image_config(architecture: &str, diff_ids: &[String]) -> serde_json::Value {
    serde_json::json!({
        "architecture": architecture,
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["/bin/sleep", "infinity"],
            "WorkingDir": "/",
        },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
        "history": [{ "created_by": "enforcer: busybox-static from the node", "comment": "local" }],
    })
}

/// The sha256 of `data` in hex (a digest without its `sha256:` prefix).
#[must_use]
pub fn sha256_hex(data: &[u8]) -> String {
    let d = Sha256::digest(data);
    d.iter().fold(String::with_capacity(64), |mut s, b| {
        use std::fmt::Write as _;
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Gzips `data` (fast level); `path` names it in errors.
pub fn gzip(data: &[u8], path: &Path) -> Result<Vec<u8>, ImageError> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).map_err(io_err(path))?;
    enc.finish().map_err(io_err(path))
}

/// This machine's architecture in OCI's names (`amd64`, `arm64`, ...).
#[must_use]
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A tar header owned by root with mtime 0 (deterministic archives).
#[must_use]
pub fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

/// Builds the busybox OCI archive at `out` from the binary at `busybox` (normally
/// `/bin/busybox` of `busybox-static`), naming the image `name`.
pub fn build_busybox_image(
    busybox: &Path,
    name: &str,
    out: &Path,
) -> Result<BuiltImage, ImageError> {
    let applets = applets(busybox)?;
    let layer_tar = layer(busybox, &applets)?;
    let diff_id = format!("sha256:{}", sha256_hex(&layer_tar));
    let layer_gz = gzip(&layer_tar, out)?;
    let layer_hex = sha256_hex(&layer_gz);
    let config = image_config(oci_arch(), &[diff_id]);
    let config = serde_json::to_vec(&config).map_err(|e| ImageError::Invalid {
        path: out.to_path_buf(),
        what: e.to_string(),
    })?;
    let config_hex = sha256_hex(&config);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_hex}"),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{layer_hex}"),
            "size": layer_gz.len(),
        }],
    });
    let manifest = serde_json::to_vec(&manifest).map_err(|e| ImageError::Invalid {
        path: out.to_path_buf(),
        what: e.to_string(),
    })?;
    let manifest_hex = sha256_hex(&manifest);
    let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_hex}"),
            "size": manifest.len(),
            "platform": { "architecture": oci_arch(), "os": "linux" },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    });
    let index = serde_json::to_vec(&index).map_err(|e| ImageError::Invalid {
        path: out.to_path_buf(),
        what: e.to_string(),
    })?;

    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8], mode: u32| {
        let kind = if data.is_empty() && mode == 0o755 {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        };
        b.append_data(&mut header(kind, mode, data.len() as u64), path, data)
            .map_err(io_err(out))
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644)?;
    add("index.json", &index, 0o644)?;
    add("blobs", &[], 0o755)?;
    add("blobs/sha256", &[], 0o755)?;
    add(&format!("blobs/sha256/{config_hex}"), &config, 0o644)?;
    add(&format!("blobs/sha256/{manifest_hex}"), &manifest, 0o644)?;
    add(&format!("blobs/sha256/{layer_hex}"), &layer_gz, 0o644)?;
    let archive = b.into_inner().map_err(io_err(out))?;
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, &archive).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, out).map_err(io_err(out))?;
    Ok(BuiltImage {
        name: name.to_owned(),
        archive: out.to_path_buf(),
        manifest_digest: format!("sha256:{manifest_hex}"),
        applets: applets.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_image_from_busybox() {
        let busybox = Path::new("/bin/busybox");
        if !busybox.exists() {
            // The black-box suite fails loudly without busybox; unit tests stay portable.
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let a = build_busybox_image(busybox, LOCAL_IMAGE, &dir.path().join("a.tar")).expect("a");
        let b = build_busybox_image(busybox, LOCAL_IMAGE, &dir.path().join("b.tar")).expect("b");
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert!(a.applets > 100, "{} applets", a.applets);
        let mut ar = tar::Archive::new(std::fs::File::open(&a.archive).expect("open"));
        let names: Vec<String> = ar
            .entries()
            .expect("entries")
            .filter_map(Result::ok)
            .filter_map(|e| e.path().ok().map(|p| p.display().to_string()))
            .collect();
        assert!(names.iter().any(|n| n == "index.json"), "{names:?}");
        assert_eq!(
            names
                .iter()
                .filter(|n| n.starts_with("blobs/sha256/"))
                .count(),
            3
        );
    }
}
