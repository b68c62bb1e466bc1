//! Ring-buffer bytes -> [`RawRecord`]: checks size, ABI version and kind. Never panics: every
//! malformed record is an error the caller counts and logs.

use enforcer_common::{ABI_VERSION, PATH_LEN, RECORD_SIZE, RecordKind, SignalRecord};

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

/// Decodes one ring-buffer item.
pub fn decode(bytes: &[u8]) -> Result<RawRecord, DecodeError> {
    if bytes.len() != RECORD_SIZE {
        return Err(DecodeError::WrongSize { len: bytes.len() });
    }
    // SAFETY: the length equals the size of SignalRecord, which is plain old data with no
    // invalid bit patterns; read_unaligned copes with any alignment of the buffer.
    let rec: SignalRecord = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    if rec.abi != ABI_VERSION {
        return Err(DecodeError::OtherAbi { abi: rec.abi });
    }
    let kind = RecordKind::from_u16(rec.kind).ok_or(DecodeError::UnknownKind { kind: rec.kind })?;
    Ok(RawRecord { kind, rec })
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
            path: [0; PATH_LEN],
        };
        rec.path[..5].copy_from_slice(b"/a/b\0");
        // SAFETY: SignalRecord is repr(C) plain data of RECORD_SIZE bytes.
        unsafe { std::slice::from_raw_parts((&raw const rec).cast::<u8>(), RECORD_SIZE) }.to_vec()
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
