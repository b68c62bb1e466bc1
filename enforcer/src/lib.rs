//! enforcer: kubelet's node jobs with kubelet's semantics, driven by the kernel.
//!
//! Data flows one way: kernel (eBPF) -> [`signal`] -> node state -> policy -> effects.
//! See README.md for the whole picture.

pub mod cgroup;
pub mod daemon;
pub mod kernel;
pub mod quantity;
pub mod server;
pub mod signal;
