//! A channel's ring buffer between one producer and one consumer (per channel and peer), as
//! DeepEP's kernels and the hardware backend's run it: slots
//! on the receiving side, a tail the producer publishes after the data (release store) and a
//! head the consumer publishes back. The token ids travel with it so the receiving side can
//! check exactly what it got.

use std::collections::VecDeque;

use crate::core::Core;

#[derive(Debug, Clone)]
pub struct ChannelRing {
    /// Tail as the consumer sees it (bumped when the data is visible).
    pub tail: u32,
    /// Head as the producer sees it (bumped when the consumer's store is visible).
    pub head: u32,
    pub cap: u32,
    /// Producer's own count of tokens written, consumer's own count of tokens read.
    pub pushed: u64,
    pub popped: u64,
    /// Token ids in slot order (written by the producer, read by the consumer).
    pub data: VecDeque<u32>,
}

impl ChannelRing {
    pub fn new(core: &mut Core, cap: u32) -> ChannelRing {
        let c = core.counters(2);
        ChannelRing { tail: c, head: c + 1, cap, pushed: 0, popped: 0, data: VecDeque::new() }
    }

    /// Head value the producer must see before `more` more slots are free.
    pub fn head_needed(&self, more: u32) -> u64 {
        (self.pushed + more as u64).saturating_sub(self.cap as u64)
    }
}
