//! Images in memory for the registries: the busybox layer of [`crate::image`], optional
//! layers of incompressible bytes, or an index listing only another platform.

use std::path::Path;

use super::{RegistryError, io_err};
use crate::image::{busybox_layer, header, image_config, oci_arch, sha256_hex};

/// Media types of the distribution API.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// A blob of an image: its media type, `sha256:<hex>` digest and bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    pub media_type: String,
    pub digest: String,
    pub data: Vec<u8>,
}

impl Blob {
    fn new(media_type: &str, data: Vec<u8>) -> Self {
        Self {
            media_type: media_type.to_owned(),
            digest: format!("sha256:{}", sha256_hex(&data)),
            data,
        }
    }

    fn json(media_type: &str, v: &serde_json::Value) -> Self {
        Self::new(media_type, v.to_string().into_bytes())
    }

    /// The OCI descriptor of this blob.
    #[must_use]
    pub fn descriptor(&self) -> serde_json::Value {
        serde_json::json!({
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.data.len(),
        })
    }
}

/// An image in memory, ready to push: its blobs (config and layers), the manifests an index
/// lists (pushed by digest), and the top manifest or index (pushed by tag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciImage {
    /// Config and layer blobs.
    pub blobs: Vec<Blob>,
    /// Manifests the top index lists (empty for a single-manifest image).
    pub manifests: Vec<Blob>,
    /// The manifest (or index) the tag names.
    pub top: Blob,
}

impl OciImage {
    /// The busybox image of [`crate::image`] (same layer, which containerd then has already
    /// from the local image; the same config plus a label naming the variant; `Cmd` sleeps)
    /// for this machine's platform, plus, when `extra_layer_bytes > 0`, a second layer holding
    /// `/extra/<seed>` with that many pseudo-random bytes (incompressible, deterministic from
    /// `seed`): variants with different layers and sizes.
    pub fn busybox(extra_layer_bytes: usize, seed: u64) -> Result<Self, RegistryError> {
        let (blobs, manifest) = busybox_manifest(oci_arch(), extra_layer_bytes, seed)?;
        Ok(Self {
            blobs,
            manifests: Vec::new(),
            top: manifest,
        })
    }

    /// An image index listing only a `linux/<arch>` manifest (busybox's layer under a config
    /// saying `arch`): containerd on another platform fails to pull it ("no match for
    /// platform in manifest"). `arch` is an OCI name such as `arm64` or `s390x`.
    pub fn only_platform(arch: &str) -> Result<Self, RegistryError> {
        let (blobs, manifest) = busybox_manifest(arch, 0, 0)?;
        let mut desc = manifest.descriptor();
        desc["platform"] = serde_json::json!({ "architecture": arch, "os": "linux" });
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [desc],
        });
        Ok(Self {
            blobs,
            manifests: vec![manifest],
            top: Blob::json(OCI_INDEX, &index),
        })
    }

    /// An index listing only an image for a platform other than this machine's (`s390x`).
    pub fn other_platform() -> Result<Self, RegistryError> {
        Self::only_platform(if oci_arch() == "s390x" {
            "arm64"
        } else {
            "s390x"
        })
    }

    /// Total bytes of the blobs (what a pull downloads besides the manifests).
    #[must_use]
    pub fn blob_bytes(&self) -> usize {
        self.blobs.iter().map(|b| b.data.len()).sum()
    }

    /// The layer digests, in order.
    #[must_use]
    pub fn layer_digests(&self) -> Vec<String> {
        self.blobs
            .iter()
            .filter(|b| b.media_type == OCI_LAYER_GZIP)
            .map(|b| b.digest.clone())
            .collect()
    }
}

/// The busybox layer (built once per process: the binary does not change under a test).
fn cached_busybox_layer() -> Result<(Vec<u8>, String), RegistryError> {
    static LAYER: std::sync::OnceLock<(Vec<u8>, String)> = std::sync::OnceLock::new();
    if let Some(l) = LAYER.get() {
        return Ok(l.clone());
    }
    let l = busybox_layer(Path::new("/bin/busybox"))?;
    Ok(LAYER.get_or_init(|| l).clone())
}

/// `n` pseudo-random bytes from `seed` (xorshift64*): incompressible, deterministic.
#[must_use]
pub fn pseudo_random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A layer holding `/extra/<seed>` with `bytes` pseudo-random bytes: `(gzip blob, diff_id)`.
fn extra_layer(bytes: usize, seed: u64) -> Result<(Vec<u8>, String), RegistryError> {
    let data = pseudo_random_bytes(bytes, seed);
    let here = Path::new("<extra layer>");
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(
        &mut header(tar::EntryType::Directory, 0o755, 0),
        "extra",
        &[][..],
    )
    .map_err(io_err(here))?;
    b.append_data(
        &mut header(tar::EntryType::Regular, 0o644, data.len() as u64),
        format!("extra/{seed}"),
        &data[..],
    )
    .map_err(io_err(here))?;
    let tar = b.into_inner().map_err(io_err(here))?;
    let diff_id = format!("sha256:{}", sha256_hex(&tar));
    // Stored, not compressed: the bytes are random anyway, and deflate in a debug build is
    // slow.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
    std::io::Write::write_all(&mut enc, &tar).map_err(io_err(here))?;
    Ok((enc.finish().map_err(io_err(here))?, diff_id))
}

/// The blobs and the manifest of a busybox image for `arch` with an optional extra layer.
fn busybox_manifest(
    arch: &str,
    extra_layer_bytes: usize,
    seed: u64,
) -> Result<(Vec<Blob>, Blob), RegistryError> {
    let mut layers = vec![cached_busybox_layer()?];
    if extra_layer_bytes > 0 {
        layers.push(extra_layer(extra_layer_bytes, seed)?);
    }
    let diff_ids: Vec<String> = layers.iter().map(|(_, d)| d.clone()).collect();
    let mut config = image_config(arch, &diff_ids);
    // A label per variant: no two variants (nor the local image containerd imported, whose
    // config is otherwise the same) share a config, so each pull fetches its own config.
    config["config"]["Labels"] = serde_json::json!({
        "org.enforcer.test.variant": format!("{arch}-{extra_layer_bytes}-{seed}"),
    });
    let config = Blob::json(OCI_CONFIG, &config);
    let layers: Vec<Blob> = layers
        .into_iter()
        .map(|(gz, _)| Blob::new(OCI_LAYER_GZIP, gz))
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.descriptor(),
        "layers": layers.iter().map(Blob::descriptor).collect::<Vec<_>>(),
    });
    let manifest = Blob::json(OCI_MANIFEST, &manifest);
    let mut blobs = vec![config];
    blobs.extend(layers);
    Ok((blobs, manifest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_layers_are_deterministic_and_incompressible() {
        let a = pseudo_random_bytes(100_000, 7);
        assert_eq!(a, pseudo_random_bytes(100_000, 7));
        assert_ne!(a, pseudo_random_bytes(100_000, 8));
        let (gz, _) = extra_layer(100_000, 7).expect("layer");
        assert!(gz.len() > 100_000, "gzip of random bytes: {}", gz.len());
    }
}
