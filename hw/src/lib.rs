//! eptwin hardware backend (placeholder).
