//! kubelet's `CgroupManager`: how a cgroup comes to exist and goes away, behind one trait with
//! one implementation per `cgroupDriver`. The values are written to the cgroup files by
//! [`super::kubepods::Kubepods`] in both cases (runc's `Set` writes the files after the unit's
//! properties, so what systemd rounds or cannot express is exact there too).
//!
//! - [`Cgroupfs`]: directories made in each hierarchy, from the configured root down (on v2
//!   each parent delegates the controllers first), and removed deepest first.
//! - [`SystemdSlices`]: transient slice units through systemd's D-Bus API
//!   ([`super::systemd::Systemd`]), stopped to remove them (systemd removes the directories).

use std::{fmt, path::Path, sync::Arc};

use super::{
    CgroupError, CgroupLayout, CgroupVersion, WithPath as _, join_inside,
    systemd::Systemd,
    writer::{CgroupValues, CgroupWriter},
};
use crate::policy::cgroup_name::{CgroupDriver, CgroupName};

/// Creates and destroys cgroups for one driver.
pub trait CgroupManager: Send + Sync + fmt::Debug {
    fn driver(&self) -> CgroupDriver;
    /// Makes `name` exist where `values` are about to be written (the memory and cpu
    /// hierarchies, and pids when a limit is set); systemd also gets the values as the
    /// unit's properties.
    fn create(&self, name: &CgroupName, values: &CgroupValues) -> Result<(), CgroupError>;
    /// Removes `name` and every cgroup below it in every hierarchy; whether there was one.
    /// A cgroup the kernel still reports busy is an error (the caller retries).
    fn destroy(&self, name: &CgroupName) -> Result<bool, CgroupError>;
    /// Whether `name` exists in any hierarchy.
    fn exists(&self, name: &CgroupName) -> bool;
}

/// The controllers' hierarchies `values` are written to.
fn hierarchies<'a>(
    layout: &'a CgroupLayout,
    values: &CgroupValues,
) -> impl Iterator<Item = (&'a Path, CgroupVersion)> {
    let pids = values.pids_max.is_some();
    ["memory", "cpu", "pids"]
        .into_iter()
        .filter(move |c| *c != "pids" || pids)
        .filter_map(|c| layout.controller(c))
}

/// Every hierarchy mount (v1 mounts and the unified one).
fn mounts(layout: &CgroupLayout) -> Vec<&Path> {
    let mut out: Vec<&Path> = layout.v1.iter().map(|m| m.mount.as_path()).collect();
    if let Some(u) = &layout.unified {
        out.push(u);
    }
    out
}

fn exists_anywhere(layout: &CgroupLayout, rel: &str) -> bool {
    mounts(layout)
        .into_iter()
        .filter_map(|m| join_inside(m, rel).ok())
        .any(|d| d.exists())
}

/// The cgroupfs driver: directories below the configured root.
#[derive(Clone, Debug)]
pub struct Cgroupfs {
    /// Components of the cgroup root (nothing is created or delegated above it).
    root_depth: usize,
    layout: CgroupLayout,
    writer: Arc<dyn CgroupWriter>,
}

impl Cgroupfs {
    #[must_use]
    pub fn new(root: &str, layout: CgroupLayout, writer: Arc<dyn CgroupWriter>) -> Self {
        Self {
            root_depth: CgroupName::from_cgroupfs(root).components().len(),
            layout,
            writer,
        }
    }

    /// Creates every missing directory of `rel` in one hierarchy; on v2 delegates the cpu,
    /// memory and pids controllers from the configured root down (never above it).
    fn create_in(
        &self,
        mount: &Path,
        version: CgroupVersion,
        rel: &str,
    ) -> Result<(), CgroupError> {
        let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
        let mut dir = mount.to_path_buf();
        for (i, part) in parts.iter().enumerate() {
            if version == CgroupVersion::V2 && i >= self.root_depth {
                // `dir` is the parent of the next component, at or below the root.
                self.writer.delegate(&dir, &["cpu", "memory", "pids"]);
            }
            dir = join_inside(&dir, part)?;
            self.writer.create_dir(&dir)?;
        }
        Ok(())
    }
}

impl CgroupManager for Cgroupfs {
    fn driver(&self) -> CgroupDriver {
        CgroupDriver::Cgroupfs
    }

    fn create(&self, name: &CgroupName, values: &CgroupValues) -> Result<(), CgroupError> {
        let rel = name.to_cgroupfs();
        let mut done: Vec<&Path> = Vec::new();
        for (mount, version) in hierarchies(&self.layout, values) {
            if !done.contains(&mount) {
                self.create_in(mount, version, &rel)?;
                done.push(mount);
            }
        }
        Ok(())
    }

    fn destroy(&self, name: &CgroupName) -> Result<bool, CgroupError> {
        let rel = name.to_cgroupfs();
        let mut any = false;
        for mount in mounts(&self.layout) {
            let dir = join_inside(mount, &rel)?;
            if dir.exists() {
                remove_tree(self.writer.as_ref(), &dir)?;
                any = true;
            }
        }
        Ok(any)
    }

    fn exists(&self, name: &CgroupName) -> bool {
        exists_anywhere(&self.layout, &name.to_cgroupfs())
    }
}

/// rmdir of a cgroup directory and its child cgroups, deepest first.
fn remove_tree(writer: &dyn CgroupWriter, dir: &Path) -> Result<(), CgroupError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_path(dir),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(writer, &entry.path())?;
        }
    }
    writer.remove_dir(dir)
}

/// The systemd driver: transient slices.
#[derive(Clone, Debug)]
pub struct SystemdSlices {
    systemd: Systemd,
    layout: CgroupLayout,
}

impl SystemdSlices {
    /// Connects to systemd on the system bus.
    pub fn connect(layout: CgroupLayout) -> Result<Self, CgroupError> {
        Ok(Self {
            systemd: Systemd::connect()?,
            layout,
        })
    }

    #[must_use]
    pub fn systemd(&self) -> &Systemd {
        &self.systemd
    }

    fn version(&self) -> CgroupVersion {
        self.layout
            .controller("memory")
            .map_or(CgroupVersion::V2, |(_, v)| v)
    }
}

impl CgroupManager for SystemdSlices {
    fn driver(&self) -> CgroupDriver {
        CgroupDriver::Systemd
    }

    fn create(&self, name: &CgroupName, values: &CgroupValues) -> Result<(), CgroupError> {
        self.systemd.ensure_slice(name, values, self.version())
    }

    fn destroy(&self, name: &CgroupName) -> Result<bool, CgroupError> {
        let stopped = self.systemd.stop_slice(name)?;
        // systemd removes the directories it made; one it could not (a process left in a
        // child cgroup systemd does not know) is a busy cgroup like cgroupfs's.
        let rel = name.to_systemd();
        for mount in mounts(&self.layout) {
            let dir = join_inside(mount, &rel)?;
            if dir.exists() {
                return Err(CgroupError::Invalid {
                    path: dir,
                    what: "still there after systemd stopped its slice".to_owned(),
                });
            }
        }
        Ok(stopped)
    }

    fn exists(&self, name: &CgroupName) -> bool {
        exists_anywhere(&self.layout, &name.to_systemd())
    }
}
