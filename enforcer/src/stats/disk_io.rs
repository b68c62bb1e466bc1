//! A cgroup's block I/O by device, as cAdvisor reads it for its `DiskIOMetrics`
//! (`container_fs_{reads,writes}{,_bytes}_total`): on cgroup v2 `io.stat` (`rbytes`,
//! `wbytes`, `rios`, `wios`); on v1 `blkio.throttle.io_service_bytes_recursive` and
//! `blkio.throttle.io_serviced_recursive` (`Read` / `Write`). Devices are named as cAdvisor
//! names them: `/dev/<disk>` for a disk of `/sys/block` (loop, ram and sr devices left out),
//! `""` for another.

use std::{collections::BTreeMap, path::Path};

use crate::cgroup::CgroupVersion;

/// One device's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceIo {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// A device's `major:minor`.
pub type DeviceNumber = (u32, u32);

fn device_number(text: &str) -> Option<DeviceNumber> {
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// cgroup v2's `io.stat`: `8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0` per line.
#[must_use]
pub fn parse_io_stat(text: &str) -> BTreeMap<DeviceNumber, DeviceIo> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(dev) = fields.next().and_then(device_number) else {
            continue;
        };
        let io: &mut DeviceIo = out.entry(dev).or_default();
        for kv in fields {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let Ok(v) = v.parse::<u64>() else {
                continue;
            };
            match k {
                "rbytes" => io.read_bytes = v,
                "wbytes" => io.write_bytes = v,
                "rios" => io.reads = v,
                "wios" => io.writes = v,
                _ => {}
            }
        }
    }
    out
}

/// cgroup v1's blkio throttle files: `8:0 Read 4096` per line (`Total` lines left out).
/// `bytes`: the file counts bytes (`io_service_bytes`), else operations (`io_serviced`).
pub fn parse_blkio(text: &str, bytes: bool, out: &mut BTreeMap<DeviceNumber, DeviceIo>) {
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(dev), Some(op), Some(v)) = (
            fields.next().and_then(device_number),
            fields.next(),
            fields.next().and_then(|v| v.parse::<u64>().ok()),
        ) else {
            continue;
        };
        let io = out.entry(dev).or_default();
        match (op, bytes) {
            ("Read", true) => io.read_bytes = v,
            ("Write", true) => io.write_bytes = v,
            ("Read", false) => io.reads = v,
            ("Write", false) => io.writes = v,
            _ => {}
        }
    }
}

/// The block I/O of the cgroup directory `dir` of the `io` (v2) or `blkio` (v1) hierarchy.
#[must_use]
pub fn read(dir: &Path, version: CgroupVersion) -> BTreeMap<DeviceNumber, DeviceIo> {
    match version {
        CgroupVersion::V2 => std::fs::read_to_string(dir.join("io.stat"))
            .map(|t| parse_io_stat(&t))
            .unwrap_or_default(),
        CgroupVersion::V1 => {
            let mut out = BTreeMap::new();
            for (file, bytes) in [
                ("blkio.throttle.io_service_bytes_recursive", true),
                ("blkio.throttle.io_serviced_recursive", false),
            ] {
                if let Ok(t) = std::fs::read_to_string(dir.join(file)) {
                    parse_blkio(&t, bytes, &mut out);
                }
            }
            out
        }
    }
}

/// The machine's disks by device number (cAdvisor's disk map): `/sys/block/<name>/dev`, loop,
/// ram and sr devices left out.
#[must_use]
pub fn disks(sys_block: &Path) -> BTreeMap<DeviceNumber, String> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(sys_block) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if ["loop", "ram", "sr"].iter().any(|p| name.starts_with(p)) {
            continue;
        }
        if let Some(dev) = std::fs::read_to_string(e.path().join("dev"))
            .ok()
            .as_deref()
            .and_then(device_number)
        {
            out.insert(dev, format!("/dev/{name}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_stat_and_blkio_read_as_cadvisor_reads_them() {
        let v2 = parse_io_stat(
            "253:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n\
             8:0 rbytes=10 wbytes=20 rios=3 wios=4 dbytes=5 dios=6\nbad line\n7:1 rbytes=x\n",
        );
        assert_eq!(
            v2.get(&(253, 0)),
            Some(&DeviceIo {
                read_bytes: 4096,
                write_bytes: 8192,
                reads: 1,
                writes: 2
            })
        );
        assert_eq!(v2.get(&(8, 0)).map(|d| d.writes), Some(4));
        assert_eq!(v2.get(&(7, 1)), Some(&DeviceIo::default()));
        assert_eq!(v2.len(), 3, "a line without a device is left out");
        let mut v1 = BTreeMap::new();
        parse_blkio(
            "8:0 Read 4096\n8:0 Write 512\n8:0 Sync 1\n8:0 Total 4608\nTotal 4608\n",
            true,
            &mut v1,
        );
        parse_blkio("8:0 Read 2\n8:0 Write 1\n", false, &mut v1);
        assert_eq!(
            v1.get(&(8, 0)),
            Some(&DeviceIo {
                read_bytes: 4096,
                write_bytes: 512,
                reads: 2,
                writes: 1
            })
        );
        assert_eq!(v1.len(), 1);
    }

    #[test]
    fn disks_are_named_from_sys_block_without_loop_ram_or_sr() {
        let d = tempfile::tempdir().expect("tempdir");
        for (name, dev) in [
            ("vda", "253:0"),
            ("loop0", "7:0"),
            ("sr0", "11:0"),
            ("ram1", "1:1"),
        ] {
            std::fs::create_dir(d.path().join(name)).expect("mkdir");
            std::fs::write(d.path().join(name).join("dev"), format!("{dev}\n")).expect("write");
        }
        let disks = disks(d.path());
        assert_eq!(
            disks.into_iter().collect::<Vec<_>>(),
            [((253, 0), "/dev/vda".to_owned())]
        );
    }
}
