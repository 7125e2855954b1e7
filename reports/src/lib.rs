//! eptwin reports (placeholder).
