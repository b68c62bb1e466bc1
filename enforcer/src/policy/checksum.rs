//! Kubelet's checkpoint checksum (`pkg/kubelet/checkpointmanager/checksum`, through
//! `hashutil.DeepHashObject`): FNV-32a of the checkpoint object printed by go-spew's `%#v`
//! (sorted map keys, methods disabled), with the checksum field 0. Each checkpoint prints its
//! own object in that form (the CPU manager's in [`crate::policy::cpu::Checkpoint::spew`], the
//! memory manager's in [`crate::policy::memory::Checkpoint::spew`]); this hashes the text.

/// FNV-32a of the spew text, as the checkpoint's `checksum` field holds it.
#[must_use]
pub fn of_spew(text: &str) -> u64 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    u64::from(hash)
}
