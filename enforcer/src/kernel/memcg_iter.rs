//! Every pod's memory usage in one call: the `memcg-usage` eBPF object's cgroup iterator,
//! linked to the kubepods memory cgroup (pre-order over its descendants), read into a map of
//! cgroup directory inode -> bytes. A crossing reads this instead of one usage file per pod:
//! one `bpf(BPF_ITER_CREATE)`, a `read(2)` or two and a `close(2)`, whatever the number of
//! pods, and the kernel's page counters are read without a file, a `seq_file` or a number
//! printed and parsed per cgroup.
//!
//! Needs the kernel's BTF (the offsets of the fields read) and cgroup iterators (Linux 6.1;
//! on a v1 memory hierarchy, 6.5's `cgroup_v1v2_get_from_fd`). Where either is missing,
//! [`MemcgIter::open`] fails and the caller keeps its per-pod files.

use std::{
    collections::HashMap,
    fs::File,
    io::Read as _,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{Ebpf, EbpfLoader, programs::Iter};
use enforcer_common::{GLOBAL_MEMCG_OFFSETS, MEMCG_USAGE_PROGRAM, MemcgOffsets, MemcgUsage};

use super::btf::{Btf, BtfError};

/// Why the iterator is not here (the caller keeps its per-pod files).
#[derive(Debug, thiserror::Error)]
pub enum MemcgIterError {
    /// A type, member or enum value the program reads is not in the kernel's BTF.
    #[error("{0}")]
    Btf(#[from] BtfError),
    #[error("memory_cgrp_id {0}")]
    MemoryId(i64),
    #[error("struct mem_cgroup does not begin with its css")]
    CssNotFirst,
    #[error("this binary was built without the eBPF object (AYA_BUILD_SKIP)")]
    NoObject,
    #[error("reading {path}: {source}")]
    ReadBtf {
        path: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    ParseBtf {
        path: &'static str,
        source: BtfError,
    },
    #[error("{} is not below {}", .root.display(), .mount.display())]
    NotBelow { root: PathBuf, mount: PathBuf },
    #[error("too deep")]
    TooDeep,
    #[error("the kernel's BTF: {0}")]
    SysBtf(#[source] Box<aya::BtfError>),
    #[error("loading the memcg-usage object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("no memcg_usage program in the object")]
    NoProgram,
    #[error("memcg_usage: {0}")]
    Program(#[source] Box<aya::programs::ProgramError>),
    #[error("loading the cgroup iterator: {0}")]
    LoadIter(#[source] Box<aya::programs::ProgramError>),
    #[error("opening {}: {source}", .path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "linking the cgroup iterator to {}: {source} (cgroup iterators need Linux 6.1, on \
         a v1 hierarchy 6.5)",
        .root.display()
    )]
    Link {
        root: PathBuf,
        source: std::io::Error,
    },
    #[error("reading the cgroup iterator: {0}")]
    Walk(#[source] std::io::Error),
    #[error("the cgroup iterator over {} read no memory cgroup", .root.display())]
    Empty { root: PathBuf },
    /// No memory cgroup of the pods to link the iterator to.
    #[error("no kubepods memory cgroup")]
    NoRoot,
}

/// The iterator's eBPF object, built by build.rs (empty when built with AYA_BUILD_SKIP=1).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memcg-usage"));

/// `BPF_LINK_CREATE`, `BPF_ITER_CREATE` (`enum bpf_cmd`), `BPF_TRACE_ITER`
/// (`enum bpf_attach_type`), `BPF_CGROUP_ITER_DESCENDANTS_PRE` (`enum bpf_cgroup_iter_order`).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_TRACE_ITER: u32 = 28;
const DESCENDANTS_PRE: u32 = 2;

/// The loaded iterator, linked to one memory cgroup.
pub struct MemcgIter {
    /// Keeps the program loaded.
    _ebpf: Ebpf,
    link: OwnedFd,
    /// Read buffer, reused (doubled when a walk fills it).
    buf: Vec<u8>,
    page_size: i64,
}

impl std::fmt::Debug for MemcgIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemcgIter")
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

/// The offsets the program reads at, from the running kernel's BTF; cgroups deeper than
/// `max_level` are passed over.
pub fn offsets(btf: &Btf, max_level: u32) -> Result<MemcgOffsets, MemcgIterError> {
    let memory_id = btf.enum_value("memory_cgrp_id")?;
    let memory_id = u32::try_from(memory_id).map_err(|_| MemcgIterError::MemoryId(memory_id))?;
    let field = |s: &str, m: &str| btf.member_offset(s, m);
    // The css the cgroup points at is the mem_cgroup's first member.
    if field("mem_cgroup", "css")? != 0 {
        return Err(MemcgIterError::CssNotFirst);
    }
    Ok(MemcgOffsets {
        cgroup_memory_css: field("cgroup", "subsys")? + memory_id * 8,
        cgroup_kn: field("cgroup", "kn")?,
        kn_id: field("kernfs_node", "id")?,
        memcg_usage: field("mem_cgroup", "memory")? + field("page_counter", "usage")?,
        cgroup_level: field("cgroup", "level")?,
        max_level,
    })
}

fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a zeroed `union bpf_attr` prefix of 128 bytes that outlives the
    // call; the kernel reads at most that many bytes (it checks the rest is zero).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::other("bpf(2) returned a bad fd"))?;
    // SAFETY: a new descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl MemcgIter {
    /// Loads the iterator and links it to the memory cgroup `root` of the hierarchy mounted
    /// at `mount` (a directory below it): its walk reports `root` and the cgroups down to
    /// `depth` levels below it (2 for kubepods: the QoS classes' cgroups and the pods').
    pub fn open(mount: &Path, root: &Path, depth: u32) -> Result<Self, MemcgIterError> {
        Self::open_with(mount, root, depth, || {})
    }

    /// [`Self::open`], with `before_kernel` called between the work in this process (the
    /// kernel's BTF read and parsed twice: the long part) and the work in the kernel (the
    /// program verified, linked and walked once: the walk holds the kernel's `cgroup_mutex`,
    /// which every cgroup made, removed or joined on the node waits for). A loader that runs
    /// the first part at low priority returns to normal there: a thread starved while it holds
    /// that mutex would stall the whole node's cgroups behind it.
    pub fn open_with(
        mount: &Path,
        root: &Path,
        depth: u32,
        before_kernel: impl FnOnce(),
    ) -> Result<Self, MemcgIterError> {
        use super::btf::VMLINUX;
        if OBJECT.is_empty() {
            return Err(MemcgIterError::NoObject);
        }
        let btf = Btf::vmlinux()
            .map_err(|source| MemcgIterError::ReadBtf {
                path: VMLINUX,
                source,
            })?
            .map_err(|source| MemcgIterError::ParseBtf {
                path: VMLINUX,
                source,
            })?;
        let level = root
            .strip_prefix(mount)
            .map_err(|_| MemcgIterError::NotBelow {
                root: root.to_path_buf(),
                mount: mount.to_path_buf(),
            })?
            .components()
            .count();
        let level = u32::try_from(level).map_err(|_| MemcgIterError::TooDeep)?;
        let offsets = offsets(&btf, level.saturating_add(depth))?;
        let btf = aya::Btf::from_sys_fs().map_err(|e| MemcgIterError::SysBtf(Box::new(e)))?;
        before_kernel();
        let mut ebpf = EbpfLoader::new()
            .override_global(GLOBAL_MEMCG_OFFSETS, &offsets, true)
            .load(OBJECT)
            .map_err(|e| MemcgIterError::Load(Box::new(e)))?;
        let program: &mut Iter = ebpf
            .program_mut(MEMCG_USAGE_PROGRAM)
            .ok_or(MemcgIterError::NoProgram)?
            .try_into()
            .map_err(|e| MemcgIterError::Program(Box::new(e)))?;
        program
            .load("cgroup", &btf)
            .map_err(|e| MemcgIterError::LoadIter(Box::new(e)))?;
        let prog = program
            .fd()
            .map_err(|e| MemcgIterError::Program(Box::new(e)))?
            .as_fd()
            .as_raw_fd();
        let dir = File::open(root).map_err(|source| MemcgIterError::Open {
            path: root.to_path_buf(),
            source,
        })?;
        // union bpf_iter_link_info { struct { order; cgroup_fd; cgroup_id } cgroup }.
        let info: [u32; 4] = [DESCENDANTS_PRE, dir.as_raw_fd().cast_unsigned(), 0, 0];
        let mut attr = [0u64; 16];
        // link_create: prog_fd, target_fd | attach_type, flags | iter_info | iter_info_len.
        attr[0] = u64::from(prog.cast_unsigned());
        attr[1] = u64::from(BPF_TRACE_ITER);
        attr[2] = info.as_ptr() as u64;
        attr[3] = std::mem::size_of_val(&info) as u64;
        let link = bpf(BPF_LINK_CREATE, &mut attr).map_err(|source| MemcgIterError::Link {
            root: root.to_path_buf(),
            source,
        })?;
        drop(dir);
        let mut it = Self {
            _ebpf: ebpf,
            link,
            buf: vec![0; 64 * 1024],
            page_size: i64::try_from(rustix::param::page_size()).unwrap_or(4096),
        };
        // One walk now: what does not work here fails here, not at a crossing.
        let mut probe = HashMap::new();
        it.read_into(&mut probe).map_err(MemcgIterError::Walk)?;
        if probe.is_empty() {
            return Err(MemcgIterError::Empty {
                root: root.to_path_buf(),
            });
        }
        Ok(it)
    }

    /// One walk: `out` (cleared first; its capacity kept) holds each memory cgroup's usage in
    /// bytes by its directory's inode number.
    pub fn read_into(&mut self, out: &mut HashMap<u64, i64>) -> std::io::Result<()> {
        let mut attr = [0u64; 16];
        attr[0] = u64::from(self.link.as_raw_fd().cast_unsigned());
        let mut file = File::from(bpf(BPF_ITER_CREATE, &mut attr)?);
        let mut filled = 0;
        loop {
            if filled == self.buf.len() {
                self.buf.resize((self.buf.len() * 2).max(4096), 0);
            }
            let n = file.read(self.buf.get_mut(filled..).unwrap_or_default())?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        out.clear();
        let size = std::mem::size_of::<MemcgUsage>();
        for rec in self
            .buf
            .get(..filled)
            .unwrap_or_default()
            .chunks_exact(size)
        {
            let word = |i: usize| {
                rec.get(i * 8..i * 8 + 8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_ne_bytes)
            };
            let pages = i64::try_from(word(1)).unwrap_or(i64::MAX);
            out.insert(word(0), pages.saturating_mul(self.page_size));
        }
        Ok(())
    }
}
