//! The little of the kernel's BTF (`/sys/kernel/btf/vmlinux`) the memory cgroup iterator
//! needs: a struct member's byte offset and an enum value, by name. A reader of the format
//! (`Documentation/bpf/btf.rst`), not a library: types are walked once, names compared in
//! place, nothing kept but the bytes.

use std::{fs, path::Path};

/// Where the running kernel's BTF is.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// A BTF blob, indexed by type id.
#[derive(Debug)]
pub struct Btf {
    data: Vec<u8>,
    /// Where the string section starts in `data`.
    strings: usize,
    strings_len: usize,
    /// Each type's start in `data`, by id (id 0 is `void`, not stored).
    types: Vec<usize>,
}

/// What is wrong with a BTF blob or what it lacks.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not a BTF blob (bad magic, version or header)")]
    Header,
    #[error("truncated BTF blob at byte {0}")]
    Truncated(usize),
    #[error("BTF type kind {kind} (type {id}) is unknown")]
    Kind { kind: u32, id: usize },
    #[error("no struct {0} in the kernel's BTF")]
    NoStruct(String),
    #[error("struct {strukt} has no member {member} (or it is a bit field)")]
    NoMember { strukt: String, member: String },
    #[error("no enum value {0} in the kernel's BTF")]
    NoEnumValue(String),
}

fn u32_at(d: &[u8], at: usize) -> Result<u32, BtfError> {
    d.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or(BtfError::Truncated(at))
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn vmlinux() -> std::io::Result<Result<Self, BtfError>> {
        Self::read(Path::new(VMLINUX))
    }

    pub fn read(path: &Path) -> std::io::Result<Result<Self, BtfError>> {
        Ok(Self::parse(fs::read(path)?))
    }

    pub fn parse(data: Vec<u8>) -> Result<Self, BtfError> {
        let magic = data
            .get(0..2)
            .and_then(|b| b.try_into().ok())
            .map(u16::from_ne_bytes);
        if magic != Some(MAGIC) || data.get(2) != Some(&1) {
            return Err(BtfError::Header);
        }
        let hdr_len = u32_at(&data, 4)? as usize;
        let type_off = u32_at(&data, 8)? as usize;
        let type_len = u32_at(&data, 12)? as usize;
        let str_off = u32_at(&data, 16)? as usize;
        let strings_len = u32_at(&data, 20)? as usize;
        let types_start = hdr_len.checked_add(type_off).ok_or(BtfError::Header)?;
        let types_end = types_start.checked_add(type_len).ok_or(BtfError::Header)?;
        let strings = hdr_len.checked_add(str_off).ok_or(BtfError::Header)?;
        if types_end > data.len() || strings.saturating_add(strings_len) > data.len() {
            return Err(BtfError::Truncated(data.len()));
        }
        let mut types = Vec::new();
        let mut at = types_start;
        while at < types_end {
            let info = u32_at(&data, at + 4)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => vlen * 12,
                KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
                2 | 7..=12 | 16 | 18 => 0,
                _ => {
                    return Err(BtfError::Kind {
                        kind,
                        id: types.len() + 1,
                    });
                }
            };
            types.push(at);
            at += 12 + extra;
        }
        Ok(Self {
            data,
            strings,
            strings_len,
            types,
        })
    }

    fn name(&self, off: u32) -> &[u8] {
        let start = self.strings + off as usize;
        let end = self.strings + self.strings_len;
        let s = self.data.get(start..end).unwrap_or_default();
        let len = s.iter().position(|b| *b == 0).unwrap_or(s.len());
        &s[..len]
    }

    /// (start, name offset, info, size-or-type) of type `id` (1-based).
    fn ty(&self, id: u32) -> Option<(usize, u32, u32, u32)> {
        let at = *self.types.get((id as usize).checked_sub(1)?)?;
        Some((
            at,
            u32_at(&self.data, at).ok()?,
            u32_at(&self.data, at + 4).ok()?,
            u32_at(&self.data, at + 8).ok()?,
        ))
    }

    /// The byte offset of `member` in `struct strukt`, looking into anonymous struct and
    /// union members.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let id = (1..=self.types.len() as u32)
            .find(|id| {
                self.ty(*id).is_some_and(|(_, name, info, _)| {
                    (info >> 24) & 0x1f == KIND_STRUCT
                        && info & 0xffff != 0
                        && self.name(name) == strukt.as_bytes()
                })
            })
            .ok_or_else(|| BtfError::NoStruct(strukt.to_owned()))?;
        self.find_member(id, member, 0)
            .ok_or_else(|| BtfError::NoMember {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            })
    }

    fn find_member(&self, id: u32, member: &str, depth: u32) -> Option<u32> {
        let (at, _, info, _) = self.ty(id)?;
        let kind = (info >> 24) & 0x1f;
        if depth > 8 || !(kind == KIND_STRUCT || kind == KIND_UNION) {
            return None;
        }
        let kflag = info >> 31 == 1;
        for i in 0..(info & 0xffff) as usize {
            let m = at + 12 + i * 12;
            let name = u32_at(&self.data, m).ok()?;
            let ty = u32_at(&self.data, m + 4).ok()?;
            let raw = u32_at(&self.data, m + 8).ok()?;
            let (bits, bitfield) = if kflag {
                (raw & 0x00ff_ffff, raw >> 24 != 0)
            } else {
                (raw, false)
            };
            if name == 0 {
                if let Some(inner) = self.find_member(self.strip(ty), member, depth + 1) {
                    return Some(bits / 8 + inner);
                }
            } else if self.name(name) == member.as_bytes() && !bitfield && bits % 8 == 0 {
                return Some(bits / 8);
            }
        }
        None
    }

    /// `id` with typedefs and qualifiers taken off.
    fn strip(&self, mut id: u32) -> u32 {
        for _ in 0..16 {
            match self.ty(id) {
                Some((_, _, info, next)) if matches!((info >> 24) & 0x1f, 8..=11 | 18) => {
                    id = next;
                }
                _ => break,
            }
        }
        id
    }

    /// The value of the enumerator `name` (in any enum).
    pub fn enum_value(&self, name: &str) -> Result<i64, BtfError> {
        for id in 1..=self.types.len() as u32 {
            let Some((at, _, info, _)) = self.ty(id) else {
                continue;
            };
            let kind = (info >> 24) & 0x1f;
            let (step, wide) = match kind {
                KIND_ENUM => (8, false),
                KIND_ENUM64 => (12, true),
                _ => continue,
            };
            for i in 0..(info & 0xffff) as usize {
                let v = at + 12 + i * step;
                let Ok(n) = u32_at(&self.data, v) else {
                    break;
                };
                if self.name(n) != name.as_bytes() {
                    continue;
                }
                let lo = u32_at(&self.data, v + 4)?;
                return Ok(if wide {
                    let hi = u32_at(&self.data, v + 8)?;
                    ((u64::from(hi) << 32) | u64::from(lo)).cast_signed()
                } else {
                    i64::from(lo.cast_signed())
                });
            }
        }
        Err(BtfError::NoEnumValue(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with `struct outer { int a; union { int b; long c; }; }` (c at byte 8 of
    /// the union at 8: 16) and `enum e { X = 3 }`.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0outer\0a\0b\0c\0long\0e\0X\0";
        let s = |name: &str| -> u32 {
            let pat = format!("\0{name}\0");
            u32::try_from(
                strings
                    .windows(pat.len())
                    .position(|w| w == pat.as_bytes())
                    .unwrap()
                    + 1,
            )
            .unwrap()
        };
        let mut t: Vec<u32> = Vec::new();
        // 1: int
        t.extend([s("int"), KIND_INT << 24, 4, 32]);
        // 2: long
        t.extend([s("long"), KIND_INT << 24, 8, 64]);
        // 3: anonymous union { int b; long c; }
        t.extend([0, (KIND_UNION << 24) | 2, 8, s("b"), 1, 0, s("c"), 2, 0]);
        // 4: struct outer { int a; union anon (at bit 64); }
        t.extend([
            s("outer"),
            (KIND_STRUCT << 24) | 2,
            16,
            s("a"),
            1,
            0,
            0,
            3,
            64,
        ]);
        // 5: enum e { X = 3 }
        t.extend([s("e"), (KIND_ENUM << 24) | 1, 4, s("X"), 3]);
        let types: Vec<u8> = t.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut d = Vec::new();
        d.extend(MAGIC.to_ne_bytes());
        d.extend([1u8, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            d.extend(v.to_ne_bytes());
        }
        d.extend(types);
        d.extend(strings);
        d
    }

    #[test]
    fn members_are_found_through_anonymous_unions_and_enums_by_value() {
        let btf = Btf::parse(blob()).unwrap();
        assert_eq!(btf.member_offset("outer", "a"), Ok(0));
        assert_eq!(btf.member_offset("outer", "c"), Ok(8));
        assert_eq!(
            btf.member_offset("outer", "z"),
            Err(BtfError::NoMember {
                strukt: "outer".into(),
                member: "z".into()
            })
        );
        assert_eq!(
            btf.member_offset("inner", "a"),
            Err(BtfError::NoStruct("inner".into()))
        );
        assert_eq!(btf.enum_value("X"), Ok(3));
        assert_eq!(btf.enum_value("Y"), Err(BtfError::NoEnumValue("Y".into())));
    }

    #[test]
    fn garbage_and_truncation_are_refused() {
        assert_eq!(
            Btf::parse(b"nonsense".to_vec()).unwrap_err(),
            BtfError::Header
        );
        let mut b = blob();
        b.truncate(40);
        assert!(matches!(Btf::parse(b), Err(BtfError::Truncated(_))));
    }

    #[test]
    fn the_running_kernels_memory_cgroup_fields_are_found() {
        // The machine's kernel: CI runs on one with BTF (the iterator needs it).
        let btf = Btf::vmlinux()
            .expect("reading /sys/kernel/btf/vmlinux")
            .unwrap();
        let kn = btf.member_offset("cgroup", "kn").unwrap();
        let subsys = btf.member_offset("cgroup", "subsys").unwrap();
        assert_ne!(kn, subsys);
        assert!(btf.enum_value("memory_cgrp_id").unwrap() >= 0);
        btf.member_offset("mem_cgroup", "memory").unwrap();
        btf.member_offset("page_counter", "usage").unwrap();
        btf.member_offset("kernfs_node", "id").unwrap();
    }
}
