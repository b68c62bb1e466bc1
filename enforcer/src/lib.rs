//! enforcer: kubelet's node jobs with kubelet's semantics, driven by the kernel.
