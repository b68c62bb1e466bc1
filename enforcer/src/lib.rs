//! enforcer: kubelet's node jobs with kubelet's semantics, driven by the kernel.
//!
//! Data flows one way: kernel (eBPF) -> [`signal`] -> node state -> policy -> effects.
//! See README.md for the whole picture.

pub mod build;
pub mod cgroup;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod companion;
pub mod config;
pub mod container_manager;
pub mod cri;
pub mod daemon;
pub mod duration;
pub mod eviction_manager;
pub mod health;
pub mod kernel;
pub mod kills;
pub mod locks;
pub mod metrics;
pub mod node;
pub mod node_report;
pub mod paths;
pub mod pods;
pub mod policy;
pub mod quantity;
pub mod recorder;
pub mod server;
pub mod signal;
pub mod sources;
pub mod state_log;
pub mod stats;
pub mod status_manager;
