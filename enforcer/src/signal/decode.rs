//! Ring-buffer bytes -> [`RawRecord`]: checks size, ABI version and kind. Never panics: every
//! malformed record is an error the caller counts and logs.
//!
//! The record is decoded field by field with [`bytes::Buf`], in the order and at the offsets of
//! `enforcer_common::SignalRecord` (`#[repr(C)]`, no implicit padding: the offsets are asserted
//! below at compile time). The programs are built for `bpfel-unknown-none`, so every field is
//! little-endian.

use std::mem::offset_of;

use bytes::Buf;
use enforcer_common::{ABI_VERSION, PATH_LEN, RECORD_SIZE, RecordKind, SignalRecord};

// The wire layout the decoder (and the test encoder) walk: each field right after the previous
// one (ABI 2: `flags` at 48, then the 220-byte path), 272 bytes in all, exactly the `#[repr(C)]` struct the programs write.
const _: () = {
    assert!(offset_of!(SignalRecord, abi) == 0);
    assert!(offset_of!(SignalRecord, kind) == 2);
    assert!(offset_of!(SignalRecord, hierarchy) == 4);
    assert!(offset_of!(SignalRecord, ts_ns) == 8);
    assert!(offset_of!(SignalRecord, pid) == 16);
    assert!(offset_of!(SignalRecord, tid) == 20);
    assert!(offset_of!(SignalRecord, cgroup_id) == 24);
    assert!(offset_of!(SignalRecord, count) == 32);
    assert!(offset_of!(SignalRecord, arg0) == 36);
    assert!(offset_of!(SignalRecord, arg1) == 40);
    assert!(offset_of!(SignalRecord, flags) == 48);
    assert!(offset_of!(SignalRecord, path) == 52);
    assert!(RECORD_SIZE == 52 + PATH_LEN);
    assert!(RECORD_SIZE == 272);
};

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("ring-buffer record of {len} bytes, expected {RECORD_SIZE}")]
    WrongSize { len: usize },
    #[error("ring-buffer record with ABI version {abi}, this daemon speaks {ABI_VERSION}")]
    OtherAbi { abi: u16 },
    #[error("ring-buffer record of unknown kind {kind}")]
    UnknownKind { kind: u16 },
}

/// A decoded record: the wire struct with its kind checked.
#[derive(Clone, Copy, Debug)]
pub struct RawRecord {
    pub kind: RecordKind,
    pub rec: SignalRecord,
}

impl RawRecord {
    /// Whether the kernel filled the slot(s) of `bits` ([`enforcer_common::absent`]): false
    /// when this kernel's tracepoint lacks the field.
    #[must_use]
    pub fn has(&self, bits: u32) -> bool {
        self.rec.flags & bits == 0
    }

    /// Whether the path filled the record: a cgroup path of [`PATH_LEN`] - 1 bytes or more
    /// (systemd's long slice names below a cgroup root), cut short (the kernel's string copy
    /// ends it with a NUL in the last byte; one of exactly that length is looked up again,
    /// which is harmless).
    #[must_use]
    pub fn path_truncated(&self) -> bool {
        self.rec
            .path
            .iter()
            .position(|b| *b == 0)
            .is_none_or(|end| end + 1 >= PATH_LEN)
    }

    /// The `path` bytes up to the first NUL, lossily as UTF-8.
    #[must_use]
    pub fn path(&self) -> String {
        let end = self
            .rec
            .path
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(PATH_LEN);
        String::from_utf8_lossy(&self.rec.path[..end]).into_owned()
    }
}

/// Reads the fields of one record from `buf`, which holds exactly [`RECORD_SIZE`] bytes.
fn read_record(mut buf: &[u8]) -> SignalRecord {
    debug_assert_eq!(buf.len(), RECORD_SIZE);
    let mut rec = SignalRecord {
        abi: buf.get_u16_le(),
        kind: buf.get_u16_le(),
        hierarchy: buf.get_u32_le(),
        ts_ns: buf.get_u64_le(),
        pid: buf.get_u32_le(),
        tid: buf.get_u32_le(),
        cgroup_id: buf.get_u64_le(),
        count: buf.get_u32_le(),
        arg0: buf.get_u32_le(),
        arg1: buf.get_u64_le(),
        flags: buf.get_u32_le(),
        path: [0; PATH_LEN],
    };
    buf.copy_to_slice(&mut rec.path);
    rec
}

/// Decodes one ring-buffer item.
pub fn decode(bytes: &[u8]) -> Result<RawRecord, DecodeError> {
    // The length check is what keeps `read_record`'s reads in bounds.
    if bytes.len() != RECORD_SIZE {
        return Err(DecodeError::WrongSize { len: bytes.len() });
    }
    let rec = read_record(bytes);
    if rec.abi != ABI_VERSION {
        return Err(DecodeError::OtherAbi { abi: rec.abi });
    }
    let kind = RecordKind::from_u16(rec.kind).ok_or(DecodeError::UnknownKind { kind: rec.kind })?;
    Ok(RawRecord { kind, rec })
}

/// The wire bytes of `rec` (what the programs write), for tests.
#[cfg(test)]
#[must_use]
pub fn encode(rec: &SignalRecord) -> Vec<u8> {
    use bytes::BufMut as _;
    let mut out = Vec::with_capacity(RECORD_SIZE);
    out.put_u16_le(rec.abi);
    out.put_u16_le(rec.kind);
    out.put_u32_le(rec.hierarchy);
    out.put_u64_le(rec.ts_ns);
    out.put_u32_le(rec.pid);
    out.put_u32_le(rec.tid);
    out.put_u64_le(rec.cgroup_id);
    out.put_u32_le(rec.count);
    out.put_u32_le(rec.arg0);
    out.put_u64_le(rec.arg1);
    out.put_u32_le(rec.flags);
    out.put_slice(&rec.path);
    debug_assert_eq!(out.len(), RECORD_SIZE);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(abi: u16, kind: u16) -> Vec<u8> {
        let mut rec = SignalRecord {
            abi,
            kind,
            hierarchy: 4,
            ts_ns: 10,
            pid: 42,
            tid: 43,
            cgroup_id: 7,
            count: 3,
            arg0: 0,
            arg1: 0,
            flags: 0,
            path: [0; PATH_LEN],
        };
        rec.path[..5].copy_from_slice(b"/a/b\0");
        encode(&rec)
    }

    #[test]
    fn a_path_that_filled_the_record_is_known_cut_short() {
        let with = |len: usize| {
            let mut bytes = record(ABI_VERSION, RecordKind::CgroupMkdir as u16);
            let start = bytes.len() - PATH_LEN;
            bytes[start..].fill(0);
            bytes[start..start + len].fill(b'a');
            decode(&bytes).expect("decodes")
        };
        assert!(!with(4).path_truncated());
        assert!(!with(PATH_LEN - 2).path_truncated());
        // The kernel's copy: 219 bytes and the NUL; or no NUL at all.
        assert!(with(PATH_LEN - 1).path_truncated());
        assert!(with(PATH_LEN).path_truncated());
        assert_eq!(with(PATH_LEN).path().len(), PATH_LEN);
    }

    #[test]
    fn every_field_round_trips_at_its_offset() {
        let mut rec = SignalRecord {
            abi: ABI_VERSION,
            kind: RecordKind::OomVictim as u16,
            hierarchy: 0x0403_0201,
            ts_ns: 0x0c0b_0a09_0807_0605,
            pid: 0x1110_0f0e,
            tid: 0x1514_1312,
            cgroup_id: 0x1d1c_1b1a_1918_1716,
            count: 0x2120_1f1e,
            arg0: 0x2524_2322,
            arg1: 0x2d2c_2b2a_2928_2726,
            flags: 0x3130_2f2e,
            path: [0; PATH_LEN],
        };
        rec.path[0] = b'c';
        rec.path[PATH_LEN - 1] = b'z';
        let bytes = encode(&rec);
        assert_eq!(bytes.len(), 272);
        // Little-endian fields at the repr(C) offsets.
        assert_eq!(bytes[4..8], [0x01, 0x02, 0x03, 0x04]);
        assert_eq!(bytes[16], 0x0e);
        assert_eq!(bytes[40], 0x26);
        assert_eq!(bytes[48..52], [0x2e, 0x2f, 0x30, 0x31]);
        assert_eq!((bytes[52], bytes[271]), (b'c', b'z'));
        let back = decode(&bytes).expect("decodes").rec;
        assert_eq!(
            (
                back.hierarchy,
                back.ts_ns,
                back.pid,
                back.tid,
                back.cgroup_id
            ),
            (rec.hierarchy, rec.ts_ns, rec.pid, rec.tid, rec.cgroup_id)
        );
        assert_eq!(
            (back.count, back.arg0, back.arg1, back.flags, back.path),
            (rec.count, rec.arg0, rec.arg1, rec.flags, rec.path)
        );
    }

    #[test]
    fn decodes_a_good_record() {
        let r = decode(&record(ABI_VERSION, RecordKind::CgroupMkdir as u16)).expect("decodes");
        assert_eq!(r.kind, RecordKind::CgroupMkdir);
        assert_eq!(r.path(), "/a/b");
        assert_eq!((r.rec.pid, r.rec.count, r.rec.cgroup_id), (42, 3, 7));
    }

    #[test]
    fn rejects_malformed_records() {
        let good = record(ABI_VERSION, 1);
        let cases: Vec<(Vec<u8>, DecodeError)> = vec![
            (vec![], DecodeError::WrongSize { len: 0 }),
            (good[..100].to_vec(), DecodeError::WrongSize { len: 100 }),
            (
                [good.clone(), vec![0]].concat(),
                DecodeError::WrongSize {
                    len: RECORD_SIZE + 1,
                },
            ),
            (
                record(ABI_VERSION + 1, 1),
                DecodeError::OtherAbi {
                    abi: ABI_VERSION + 1,
                },
            ),
            (record(ABI_VERSION, 0), DecodeError::UnknownKind { kind: 0 }),
            (
                record(ABI_VERSION, 999),
                DecodeError::UnknownKind { kind: 999 },
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(decode(&bytes).err(), Some(want));
        }
    }

    #[test]
    fn path_without_nul_is_bounded() {
        let mut bytes = record(ABI_VERSION, 1);
        let off = RECORD_SIZE - PATH_LEN;
        for b in &mut bytes[off..] {
            *b = b'x';
        }
        let r = decode(&bytes).expect("decodes");
        assert_eq!(r.path().len(), PATH_LEN);
    }

    proptest::proptest! {
        /// Any bytes: a record or an error, never a panic; the error matches the defect.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            match decode(&bytes) {
                Ok(r) => {
                    proptest::prop_assert_eq!(bytes.len(), RECORD_SIZE);
                    proptest::prop_assert!(r.path().len() <= PATH_LEN);
                }
                Err(DecodeError::WrongSize { len }) => proptest::prop_assert_ne!(len, RECORD_SIZE),
                Err(_) => proptest::prop_assert_eq!(bytes.len(), RECORD_SIZE),
            }
        }
    }
}
