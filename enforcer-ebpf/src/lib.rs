//! Library target of the eBPF crate: lets the daemon's build script depend on this crate so
//! cargo rebuilds the embedded object when the programs change. The programs are in `main.rs`.
#![no_std]
