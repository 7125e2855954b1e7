//! eptwin kernels (placeholder).
