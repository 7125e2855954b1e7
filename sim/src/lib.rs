//! eptwin simulator (placeholder until the event core lands).
