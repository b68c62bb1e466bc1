//! Tracepoint `format` files -> where the fields the eBPF programs read sit in this kernel.
//!
//! The programs never use offsets fixed at build time: tracepoint records change between
//! kernels (`oom/mark_victim` is `int pid` alone on Debian's 6.1 and gained `comm`, the RSS
//! counters, `uid`, `pgtables` and `oom_score_adj` later, some of them in between). At load
//! the daemon reads `events/<category>/<name>/format` of every tracepoint it uses, looks up
//! each field a program reads ([`TRACEPOINTS`]), checks its size is one the program reads,
//! and hands the programs a [`TracepointFields`] table (a read-only global). A field the
//! kernel lacks, or has with another size or kind, is [`FieldLoc::ABSENT`]: the program never
//! reads it and flags the record's slot as absent.
//!
//! [`parse_format`] is pure; [`layout`] takes the format texts from a closure, so both are
//! tested on fixture texts (`testdata/tracefs-*`), and [`kernel_layout`] reads them from
//! tracefs (or debugfs's `tracing/`).

use std::{
    io,
    path::{Path, PathBuf},
};

use enforcer_common::{FieldLoc, TracepointFields};
use serde::Serialize;

/// Where the tracing directory is looked for, in order (tracefs, then debugfs's copy).
pub const TRACING_ROOTS: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// One `field:` line of a format file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatField {
    /// The C type as written, array suffix included: `int`, `unsigned long`,
    /// `__data_loc char[]`, `char[16]`.
    pub ty: String,
    pub name: String,
    /// Byte offset in the record the program gets.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// `signed:1` (absent on very old kernels: false).
    pub signed: bool,
}

impl FormatField {
    /// A `__data_loc` (or `__rel_loc`) dynamic array locator rather than a value.
    #[must_use]
    pub fn is_dynamic(&self) -> bool {
        self.ty.starts_with("__data_loc") || self.ty.starts_with("__rel_loc")
    }
}

/// A format text that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("line {line}: {what}: {text:?}")]
    Line {
        line: usize,
        what: &'static str,
        text: String,
    },
    #[error("no field lines")]
    NoFields,
    /// A field the program reads is not in the format.
    #[error("not in this kernel's format")]
    NoField,
    /// A `__data_loc` where the program reads an integer.
    #[error("is `{ty}`, the program reads an integer")]
    NotInt { ty: String },
    /// An integer of a size the program does not read.
    #[error("`{ty}` of {size} bytes, the program reads {sizes:?}")]
    IntSize {
        ty: String,
        size: u32,
        sizes: &'static [u32],
    },
    /// Not a 4-byte `__data_loc` where the program reads one.
    #[error("`{ty}` of {size} bytes, the program reads a 4-byte __data_loc")]
    NotDataLoc { ty: String, size: u32 },
    /// A field beyond the bound of the programs' context arithmetic.
    #[error("offset {offset} + size {size} past {bound} bytes")]
    PastBound { offset: u32, size: u32, bound: u32 },
}

/// Parses the text of a tracepoint's `format` file: every `field:` line (the common fields
/// included), in order. Other lines (`name:`, `ID:`, `print fmt:`) are skipped.
pub fn parse_format(text: &str) -> Result<Vec<FormatField>, FormatError> {
    let mut fields = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let err = |what| FormatError::Line {
            line: i + 1,
            what,
            text: line.to_owned(),
        };
        let mut parts = rest.split(';').map(str::trim);
        let decl = parts
            .next()
            .filter(|d| !d.is_empty())
            .ok_or_else(|| err("no declaration"))?;
        let (mut offset, mut size, mut signed) = (None, None, false);
        for part in parts.filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once(':').ok_or_else(|| err("not key:value"))?;
            let number = || value.trim().parse::<u32>().map_err(|_| err("not a number"));
            match key.trim() {
                "offset" => offset = Some(number()?),
                "size" => size = Some(number()?),
                "signed" => signed = number()? != 0,
                _ => {}
            }
        }
        let (ty, name) = split_decl(decl).ok_or_else(|| err("no field name"))?;
        fields.push(FormatField {
            ty,
            name,
            offset: offset.ok_or_else(|| err("no offset"))?,
            size: size.ok_or_else(|| err("no size"))?,
            signed,
        });
    }
    if fields.is_empty() {
        return Err(FormatError::NoFields);
    }
    Ok(fields)
}

/// `unsigned long gfp_flags` -> (`unsigned long`, `gfp_flags`); `char comm[16]` ->
/// (`char[16]`, `comm`); `const char * name` -> (`const char *`, `name`).
fn split_decl(decl: &str) -> Option<(String, String)> {
    let decl = decl.trim();
    let (ty, last) = decl.rsplit_once(char::is_whitespace)?;
    let (stars, last) = last.split_at(last.len() - last.trim_start_matches('*').len());
    let (name, array) = match last.find('[') {
        Some(i) => last.split_at(i),
        None => (last, ""),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let ty = format!("{}{stars}{array}", ty.trim());
    Some((ty, name.to_owned()))
}

/// How a program reads a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// An integer of one of these sizes in bytes (the program reads exactly that many).
    Int(&'static [u32]),
    /// A `__data_loc char[]` string (a 4-byte locator).
    DataLoc,
}

/// One field a program reads, and where its location goes in the table.
#[derive(Clone, Copy, Debug)]
pub struct FieldSpec {
    pub name: &'static str,
    pub want: Want,
    pub slot: fn(&mut TracepointFields) -> &mut FieldLoc,
}

/// A tracepoint a program attaches to, and the fields it reads there.
#[derive(Clone, Copy, Debug)]
pub struct Tracepoint {
    pub category: &'static str,
    pub name: &'static str,
    pub program: &'static str,
    pub fields: &'static [FieldSpec],
}

const INT: Want = Want::Int(&[4]);
const SHORT: Want = Want::Int(&[2]);
/// `u64`/`unsigned long`, or the 4-byte `int` id / `gfp_t` of older kernels (the program
/// widens either).
const WORD: Want = Want::Int(&[8, 4]);

/// Every tracepoint the programs attach to (always; the benchmark-only `pipeline_probe` aside),
/// with the fields each reads (`sched_process_fork` reads none: the event is the signal).
pub const TRACEPOINTS: &[Tracepoint] = &[
    Tracepoint {
        category: "cgroup",
        name: "cgroup_mkdir",
        program: "cgroup_mkdir",
        fields: &[
            FieldSpec {
                name: "root",
                want: INT,
                slot: |t| &mut t.cgroup_mkdir.root,
            },
            FieldSpec {
                name: "level",
                want: INT,
                slot: |t| &mut t.cgroup_mkdir.level,
            },
            FieldSpec {
                name: "id",
                want: WORD,
                slot: |t| &mut t.cgroup_mkdir.id,
            },
            FieldSpec {
                name: "path",
                want: Want::DataLoc,
                slot: |t| &mut t.cgroup_mkdir.path,
            },
        ],
    },
    Tracepoint {
        category: "cgroup",
        name: "cgroup_rmdir",
        program: "cgroup_rmdir",
        fields: &[
            FieldSpec {
                name: "root",
                want: INT,
                slot: |t| &mut t.cgroup_rmdir.root,
            },
            FieldSpec {
                name: "level",
                want: INT,
                slot: |t| &mut t.cgroup_rmdir.level,
            },
            FieldSpec {
                name: "id",
                want: WORD,
                slot: |t| &mut t.cgroup_rmdir.id,
            },
            FieldSpec {
                name: "path",
                want: Want::DataLoc,
                slot: |t| &mut t.cgroup_rmdir.path,
            },
        ],
    },
    Tracepoint {
        category: "vmscan",
        name: "mm_vmscan_memcg_reclaim_begin",
        program: "memcg_reclaim",
        fields: &[
            FieldSpec {
                name: "order",
                want: INT,
                slot: |t| &mut t.memcg_reclaim.order,
            },
            FieldSpec {
                name: "gfp_flags",
                want: WORD,
                slot: |t| &mut t.memcg_reclaim.gfp_flags,
            },
        ],
    },
    Tracepoint {
        category: "vmscan",
        name: "mm_vmscan_direct_reclaim_begin",
        program: "direct_reclaim",
        fields: &[
            FieldSpec {
                name: "order",
                want: INT,
                slot: |t| &mut t.direct_reclaim.order,
            },
            FieldSpec {
                name: "gfp_flags",
                want: WORD,
                slot: |t| &mut t.direct_reclaim.gfp_flags,
            },
        ],
    },
    Tracepoint {
        category: "oom",
        name: "mark_victim",
        program: "oom_victim",
        fields: &[
            FieldSpec {
                name: "pid",
                want: INT,
                slot: |t| &mut t.oom_victim.pid,
            },
            FieldSpec {
                name: "comm",
                want: Want::DataLoc,
                slot: |t| &mut t.oom_victim.comm,
            },
            FieldSpec {
                name: "anon_rss",
                want: WORD,
                slot: |t| &mut t.oom_victim.anon_rss,
            },
            FieldSpec {
                name: "oom_score_adj",
                want: SHORT,
                slot: |t| &mut t.oom_victim.oom_score_adj,
            },
        ],
    },
    Tracepoint {
        category: "sched",
        name: "sched_process_fork",
        program: "process_fork",
        fields: &[],
    },
];

/// One field a program reads, as found (or not) in this kernel's format.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldStatus {
    pub name: &'static str,
    /// Offset in this kernel's record, when the program reads the field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u32>,
    /// Size in bytes, when the program reads the field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// Why the program does not read it (the record flags the slot as absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub absent: Option<String>,
}

impl FieldStatus {
    #[must_use]
    pub fn present(&self) -> bool {
        self.absent.is_none()
    }
}

/// A tracepoint as this kernel has it: its fields and (once the loader tried) whether the
/// program attached.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TracepointStatus {
    /// `category/name`.
    pub tracepoint: String,
    pub program: &'static str,
    /// Where the format was read (none when it could not be).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<PathBuf>,
    /// Whether the program loaded (passed the verifier) and attached here.
    pub attached: bool,
    /// Why the format could not be read or parsed (every field is then absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format_error: Option<String>,
    /// Why the program did not load or attach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_error: Option<String>,
    pub fields: Vec<FieldStatus>,
    #[serde(skip)]
    pub spec: &'static Tracepoint,
}

impl TracepointStatus {
    /// Names of the fields the program does not read here.
    #[must_use]
    pub fn absent_fields(&self) -> Vec<&'static str> {
        self.fields
            .iter()
            .filter(|f| !f.present())
            .map(|f| f.name)
            .collect()
    }
}

/// One line for logs: how many programs attached, and the fields this kernel lacks.
#[must_use]
pub fn summary(tracepoints: &[TracepointStatus]) -> String {
    let attached = tracepoints.iter().filter(|t| t.attached).count();
    let mut out = format!("{attached}/{} programs attached", tracepoints.len());
    let failed: Vec<&str> = tracepoints
        .iter()
        .filter(|t| !t.attached)
        .map(|t| t.tracepoint.as_str())
        .collect();
    if !failed.is_empty() {
        out.push_str(&format!(" (not: {})", failed.join(",")));
    }
    let absent: Vec<String> = tracepoints
        .iter()
        .filter(|t| !t.absent_fields().is_empty())
        .map(|t| format!("{} [{}]", t.tracepoint, t.absent_fields().join(",")))
        .collect();
    if absent.is_empty() {
        out.push_str("; every field read found in the kernel's formats");
    } else {
        out.push_str(&format!("; fields absent here: {}", absent.join(" ")));
    }
    out
}

/// The table the programs get, with the per-tracepoint account of how it was built.
#[derive(Clone, Debug)]
pub struct Layout {
    pub table: TracepointFields,
    pub tracepoints: Vec<TracepointStatus>,
}

/// Finds `spec` in a parsed format and checks the program can read it.
pub fn resolve_field(spec: &FieldSpec, fields: &[FormatField]) -> Result<FieldLoc, FormatError> {
    let f = fields
        .iter()
        .find(|f| f.name == spec.name)
        .ok_or(FormatError::NoField)?;
    match spec.want {
        Want::Int(sizes) => {
            if f.is_dynamic() {
                return Err(FormatError::NotInt { ty: f.ty.clone() });
            }
            if !sizes.contains(&f.size) {
                return Err(FormatError::IntSize {
                    ty: f.ty.clone(),
                    size: f.size,
                    sizes,
                });
            }
        }
        Want::DataLoc => {
            if !f.ty.starts_with("__data_loc") || f.size != 4 {
                return Err(FormatError::NotDataLoc {
                    ty: f.ty.clone(),
                    size: f.size,
                });
            }
        }
    }
    let loc = FieldLoc::at(f.offset, f.size);
    if !loc.is_present() {
        return Err(FormatError::PastBound {
            offset: f.offset,
            size: f.size,
            bound: enforcer_common::MAX_FIELD_END,
        });
    }
    Ok(loc)
}

/// Builds the table from the tracepoints' format texts: `read(tp)` returns the text and where
/// it came from. A tracepoint whose format cannot be read or parsed has every field absent.
pub fn layout(read: impl Fn(&Tracepoint) -> io::Result<(PathBuf, String)>) -> Layout {
    let mut table = TracepointFields::ABSENT;
    let mut tracepoints = Vec::with_capacity(TRACEPOINTS.len());
    for spec in TRACEPOINTS {
        let (format, parsed) = match read(spec) {
            Ok((path, text)) => {
                let parsed = parse_format(&text).map_err(|e| format!("{}: {e}", path.display()));
                (Some(path), parsed)
            }
            Err(e) => (None, Err(format!("reading the format: {e}"))),
        };
        let fields = spec
            .fields
            .iter()
            .map(|f| {
                let loc = match &parsed {
                    Ok(fields) => resolve_field(f, fields).map_err(|e| e.to_string()),
                    Err(_) => Err("format unreadable".to_owned()),
                };
                *(f.slot)(&mut table) = loc.clone().unwrap_or(FieldLoc::ABSENT);
                match loc {
                    Ok(l) => FieldStatus {
                        name: f.name,
                        offset: Some(l.offset),
                        size: Some(l.size),
                        absent: None,
                    },
                    Err(why) => FieldStatus {
                        name: f.name,
                        offset: None,
                        size: None,
                        absent: Some(why),
                    },
                }
            })
            .collect();
        tracepoints.push(TracepointStatus {
            tracepoint: format!("{}/{}", spec.category, spec.name),
            program: spec.program,
            format,
            attached: false,
            format_error: parsed.err(),
            attach_error: None,
            fields,
            spec,
        });
    }
    Layout { table, tracepoints }
}

/// Reads `events/<category>/<name>/format` under the first of `roots` that has it.
pub fn read_format<P: AsRef<Path>>(
    roots: &[P],
    category: &str,
    name: &str,
) -> io::Result<(PathBuf, String)> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no tracing directory");
    for root in roots {
        let path = root
            .as_ref()
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        match std::fs::read_to_string(&path) {
            Ok(text) => return Ok((path, text)),
            Err(e) => {
                last = io::Error::new(e.kind(), format!("{}: {e}", path.display()));
            }
        }
    }
    Err(last)
}

/// The layout of the running kernel, from tracefs (or debugfs).
#[must_use]
pub fn kernel_layout() -> Layout {
    layout(|tp| read_format(TRACING_ROOTS, tp.category, tp.name))
}

#[cfg(test)]
mod tests {
    use enforcer_common::{CgroupFields, MAX_FIELD_END, OomFields, ReclaimFields};

    use super::*;

    fn testdata(dir: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(dir)
    }

    /// The running 6.18 kernel's formats, as `cat` showed them.
    fn layout_6_18() -> Layout {
        let roots = [testdata("tracefs-6.18")];
        layout(|tp| read_format(&roots, tp.category, tp.name))
    }

    /// Upstream 6.1: `oom/mark_victim` is `int pid` alone; the other formats are 6.18's (the
    /// cgroup and vmscan records are the same there). The 6.1 root comes first, so the rest
    /// falls back to the second root, as tracefs falls back to debugfs.
    fn layout_6_1() -> Layout {
        let roots = [testdata("tracefs-6.1"), testdata("tracefs-6.18")];
        layout(|tp| read_format(&roots, tp.category, tp.name))
    }

    fn fixture(category: &str, name: &str) -> String {
        read_format(&[testdata("tracefs-6.18")], category, name)
            .expect("fixture")
            .1
    }

    #[test]
    fn parses_every_field_of_the_real_formats() {
        let f = parse_format(&fixture("oom", "mark_victim")).expect("parses");
        let got: Vec<(&str, &str, u32, u32, bool)> = f
            .iter()
            .map(|f| (f.ty.as_str(), f.name.as_str(), f.offset, f.size, f.signed))
            .collect();
        assert_eq!(
            got,
            [
                ("unsigned short", "common_type", 0, 2, false),
                ("unsigned char", "common_flags", 2, 1, false),
                ("unsigned char", "common_preempt_count", 3, 1, false),
                ("int", "common_pid", 4, 4, true),
                ("int", "pid", 8, 4, true),
                ("__data_loc char[]", "comm", 12, 4, false),
                ("unsigned long", "total_vm", 16, 8, false),
                ("unsigned long", "anon_rss", 24, 8, false),
                ("unsigned long", "file_rss", 32, 8, false),
                ("unsigned long", "shmem_rss", 40, 8, false),
                ("uid_t", "uid", 48, 4, false),
                ("unsigned long", "pgtables", 56, 8, false),
                ("short", "oom_score_adj", 64, 2, true),
            ]
        );
        assert!(f[5].is_dynamic() && !f[4].is_dynamic());

        let f = parse_format(&fixture("cgroup", "cgroup_mkdir")).expect("parses");
        let names: Vec<_> = f
            .iter()
            .skip(4)
            .map(|f| (f.name.as_str(), f.offset))
            .collect();
        assert_eq!(
            names,
            [("root", 8), ("level", 12), ("id", 16), ("path", 24)]
        );

        // The reclaim formats' huge `print fmt` line is skipped, not misparsed.
        let f = parse_format(&fixture("vmscan", "mm_vmscan_memcg_reclaim_begin")).expect("parses");
        assert_eq!(f.len(), 6);
        assert_eq!(
            (f[5].name.as_str(), f[5].offset, f[5].size),
            ("gfp_flags", 16, 8)
        );

        for (c, n) in [
            ("cgroup", "cgroup_rmdir"),
            ("vmscan", "mm_vmscan_direct_reclaim_begin"),
            ("sched", "sched_process_fork"),
            ("syscalls", "sys_enter_getppid"),
        ] {
            let f = parse_format(&fixture(c, n)).expect("parses");
            assert_eq!(f[0].name, "common_type", "{c}/{n}");
        }
    }

    #[test]
    fn declarations_with_arrays_and_pointers() {
        let text = "format:\n\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
                    \tfield:const char * name;\toffset:24;\tsize:8;\tsigned:0;\n\
                    \tfield:unsigned long *ptr;\toffset:32;\tsize:8;\n";
        let f = parse_format(text).expect("parses");
        assert_eq!((f[0].ty.as_str(), f[0].name.as_str()), ("char[16]", "comm"));
        assert_eq!(
            (f[1].ty.as_str(), f[1].name.as_str()),
            ("const char *", "name")
        );
        assert_eq!(
            (f[2].ty.as_str(), f[2].name.as_str()),
            ("unsigned long*", "ptr")
        );
        assert!(!f[2].signed, "no `signed:` (old kernels): unsigned");
    }

    #[test]
    fn malformed_formats_are_errors() {
        assert_eq!(parse_format(""), Err(FormatError::NoFields));
        assert_eq!(
            parse_format("name: x\nID: 1\nprint fmt: \"\""),
            Err(FormatError::NoFields)
        );
        for bad in [
            "\tfield:int pid;\tsize:4;",
            "\tfield:int pid;\toffset:8;",
            "\tfield:int pid;\toffset:x;\tsize:4;",
            "\tfield:;\toffset:8;\tsize:4;",
            "\tfield:int;\toffset:8;\tsize:4;",
            "\tfield:int pid;\toffset 8;\tsize:4;",
        ] {
            assert!(
                matches!(parse_format(bad), Err(FormatError::Line { line: 1, .. })),
                "{bad:?}: {:?}",
                parse_format(bad)
            );
        }
    }

    #[test]
    fn the_6_18_table_has_every_field_at_the_kernel_offsets() {
        let l = layout_6_18();
        let c = CgroupFields {
            root: FieldLoc::at(8, 4),
            level: FieldLoc::at(12, 4),
            id: FieldLoc::at(16, 8),
            path: FieldLoc::at(24, 4),
        };
        let r = ReclaimFields {
            order: FieldLoc::at(8, 4),
            gfp_flags: FieldLoc::at(16, 8),
        };
        assert_eq!(
            l.table,
            TracepointFields {
                cgroup_mkdir: c,
                cgroup_rmdir: c,
                memcg_reclaim: r,
                direct_reclaim: r,
                oom_victim: OomFields {
                    pid: FieldLoc::at(8, 4),
                    comm: FieldLoc::at(12, 4),
                    anon_rss: FieldLoc::at(24, 8),
                    oom_score_adj: FieldLoc::at(64, 2),
                },
            }
        );
        for tp in &l.tracepoints {
            assert_eq!(tp.format_error, None, "{}", tp.tracepoint);
            assert!(tp.absent_fields().is_empty(), "{}", tp.tracepoint);
            assert!(!tp.attached, "nothing attached by the pure layout");
        }
        assert_eq!(l.tracepoints.len(), TRACEPOINTS.len());
    }

    #[test]
    fn upstream_6_1_mark_victim_has_only_pid_and_the_rest_is_absent() {
        let l = layout_6_1();
        assert_eq!(
            l.table.oom_victim,
            OomFields {
                pid: FieldLoc::at(8, 4),
                comm: FieldLoc::ABSENT,
                anon_rss: FieldLoc::ABSENT,
                oom_score_adj: FieldLoc::ABSENT,
            }
        );
        // Everything else as on 6.18.
        assert_eq!(l.table.cgroup_mkdir, layout_6_18().table.cgroup_mkdir);
        assert_eq!(l.table.memcg_reclaim, layout_6_18().table.memcg_reclaim);
        let oom = l
            .tracepoints
            .iter()
            .find(|t| t.tracepoint == "oom/mark_victim")
            .expect("listed");
        assert_eq!(oom.absent_fields(), ["comm", "anon_rss", "oom_score_adj"]);
        assert!(
            oom.format
                .as_deref()
                .is_some_and(|p| p.starts_with(testdata("tracefs-6.1")))
        );
        assert_eq!(
            oom.fields[1].absent.as_deref(),
            Some("not in this kernel's format")
        );
        assert_eq!(
            (oom.fields[0].offset, oom.fields[0].size),
            (Some(8), Some(4))
        );
    }

    #[test]
    fn other_layouts_move_fields_and_the_table_follows() {
        // An intermediate mark_victim (pid, uid, comm, oom_score_adj: no RSS), and 4.19's
        // cgroup events (root, an `int` id, level, path).
        let oom = "format:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                   \tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n\
                   \tfield:uid_t uid;\toffset:12;\tsize:4;\tsigned:0;\n\
                   \tfield:__data_loc char[] comm;\toffset:16;\tsize:4;\tsigned:0;\n\
                   \tfield:short oom_score_adj;\toffset:20;\tsize:2;\tsigned:1;\n";
        let cgroup = "format:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                      \tfield:int root;\toffset:8;\tsize:4;\tsigned:1;\n\
                      \tfield:int id;\toffset:12;\tsize:4;\tsigned:1;\n\
                      \tfield:int level;\toffset:16;\tsize:4;\tsigned:1;\n\
                      \tfield:__data_loc char[] path;\toffset:20;\tsize:4;\tsigned:0;\n";
        let l = layout(|tp| {
            let text = match tp.category {
                "oom" => oom.to_owned(),
                "cgroup" => cgroup.to_owned(),
                _ => fixture(tp.category, tp.name),
            };
            Ok((PathBuf::from("inline"), text))
        });
        assert_eq!(
            l.table.oom_victim,
            OomFields {
                pid: FieldLoc::at(8, 4),
                comm: FieldLoc::at(16, 4),
                anon_rss: FieldLoc::ABSENT,
                oom_score_adj: FieldLoc::at(20, 2),
            }
        );
        assert_eq!(
            l.table.cgroup_rmdir,
            CgroupFields {
                root: FieldLoc::at(8, 4),
                level: FieldLoc::at(16, 4),
                id: FieldLoc::at(12, 4),
                path: FieldLoc::at(20, 4),
            },
            "a 4-byte id is read (and widened) as 4 bytes"
        );
    }

    #[test]
    fn wrong_sizes_and_kinds_are_absent_never_read_past() {
        let text = "format:\n\tfield:long pid;\toffset:8;\tsize:8;\tsigned:1;\n\
                    \tfield:char comm[16];\toffset:16;\tsize:16;\tsigned:0;\n\
                    \tfield:__data_loc char[] anon_rss;\toffset:32;\tsize:4;\tsigned:0;\n\
                    \tfield:int oom_score_adj;\toffset:36;\tsize:4;\tsigned:1;\n";
        let fields = parse_format(text).expect("parses");
        let oom = &TRACEPOINTS[4];
        assert_eq!(oom.name, "mark_victim");
        for spec in oom.fields {
            let got = resolve_field(spec, &fields);
            assert!(got.is_err(), "{}: {got:?}", spec.name);
        }
        let why = resolve_field(&oom.fields[3], &fields)
            .unwrap_err()
            .to_string();
        assert!(why.contains("4 bytes") && why.contains("[2]"), "{why}");
        // Beyond the bound the programs use for context arithmetic.
        let far = format!("format:\n\tfield:int pid;\toffset:{MAX_FIELD_END};\tsize:4;\n");
        assert!(resolve_field(&oom.fields[0], &parse_format(&far).expect("parses")).is_err());
    }

    #[test]
    fn an_unreadable_format_leaves_its_fields_absent() {
        let l = layout(|tp| {
            if tp.category == "oom" {
                Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "no such tracepoint",
                ))
            } else {
                read_format(&[testdata("tracefs-6.18")], tp.category, tp.name)
            }
        });
        assert_eq!(l.table.oom_victim, TracepointFields::ABSENT.oom_victim);
        let oom = &l.tracepoints[4];
        assert!(
            oom.format_error
                .as_deref()
                .is_some_and(|e| e.contains("no such tracepoint"))
        );
        assert_eq!(oom.absent_fields().len(), 4);
        assert!(l.tracepoints[0].format_error.is_none());
        // A tracing root that does not exist is skipped for the next one.
        let (path, _) = read_format(
            &[
                Path::new("/nonexistent"),
                testdata("tracefs-6.18").as_path(),
            ],
            "oom",
            "mark_victim",
        )
        .expect("second root");
        assert!(path.ends_with("events/oom/mark_victim/format"));
        assert!(read_format(&[Path::new("/nonexistent")], "oom", "mark_victim").is_err());
    }

    #[test]
    fn every_slot_of_the_table_is_filled_by_exactly_one_spec() {
        // Each spec writes a distinct marker; every slot must end up holding one.
        let mut t = TracepointFields::ABSENT;
        let mut n = 0;
        for tp in TRACEPOINTS {
            for f in tp.fields {
                n += 1;
                let slot = (f.slot)(&mut t);
                assert_eq!(
                    *slot,
                    FieldLoc::ABSENT,
                    "{}.{} written twice",
                    tp.name,
                    f.name
                );
                *slot = FieldLoc::at(n, 1);
            }
        }
        assert_eq!(
            n as usize * std::mem::size_of::<FieldLoc>(),
            std::mem::size_of::<TracepointFields>()
        );
        // And through the public fields: none left absent.
        let all = [
            t.cgroup_mkdir.root,
            t.cgroup_mkdir.level,
            t.cgroup_mkdir.id,
            t.cgroup_mkdir.path,
            t.cgroup_rmdir.root,
            t.cgroup_rmdir.level,
            t.cgroup_rmdir.id,
            t.cgroup_rmdir.path,
            t.memcg_reclaim.order,
            t.memcg_reclaim.gfp_flags,
            t.direct_reclaim.order,
            t.direct_reclaim.gfp_flags,
            t.oom_victim.pid,
            t.oom_victim.comm,
            t.oom_victim.anon_rss,
            t.oom_victim.oom_score_adj,
        ];
        assert!(all.iter().all(FieldLoc::is_present));
    }
}
