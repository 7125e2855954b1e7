//! The event queue: a monotone radix heap ordered by (time, sequence).
//!
//! Discrete-event simulation pops events in non-decreasing time, which is exactly what a radix
//! heap needs; it stays fast with a large pending set where a binary heap collapses into cache
//! misses (fabric.md §10: 42 vs 580 ns per event at 10^6 pending). Equal times pop in push
//! order, so the order is (time, push sequence), independent of the queue implementation ([`HeapQueue`]
//! gives the identical sequence).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Time;

/// What the simulation loop needs from a queue (the radix heap, or the baseline heap).
pub trait EventQueue<T> {
    /// Schedule `item` at `time`; `time` must not precede the last popped time.
    fn push(&mut self, time: Time, item: T);
    /// The earliest event (ties in push order), or `None` when empty.
    fn pop(&mut self) -> Option<(Time, T)>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Buckets 1..=64 (bucket b holds times whose highest bit differing from `last` is b - 1);
/// bucket 0, the events at exactly `last`, is kept apart as a FIFO.
const BUCKETS: usize = 64;

/// Monotone radix heap over times, FIFO among equal times.
///
/// Ties need no sequence number in the key: every bucket is always in push order (pushes
/// append, and a bucket is only ever redistributed into buckets that are empty, keeping the
/// order), so the events at the minimum time come out of the redistribution in push order and
/// bucket 0 pops from its front. The result is the (time, push sequence) order of [`HeapQueue`]
/// with 24-byte entries (16-byte event + time) and one move per level instead of also
/// sorting ties by sequence bits.
pub struct RadixQueue<T> {
    last: Time,
    len: usize,
    /// Bucket 0: the events at `last`, in push order, popped from `head`.
    now: Vec<T>,
    head: usize,
    buckets: Vec<Vec<(Time, T)>>,
    /// Bit b - 1 set when bucket b (1..=64) is non-empty: the next bucket is one instruction.
    nonempty: u64,
}

impl<T: Copy> Default for RadixQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy> RadixQueue<T> {
    pub fn new() -> Self {
        RadixQueue {
            last: 0,
            len: 0,
            now: Vec::new(),
            head: 0,
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            nonempty: 0,
        }
    }

    /// Refill bucket 0 from the lowest non-empty bucket (bucket 0 is empty).
    #[cold]
    #[inline(never)]
    fn refill(&mut self) {
        let i = self.nonempty.trailing_zeros() as usize;
        self.nonempty &= self.nonempty - 1;
        let mut moved = std::mem::take(&mut self.buckets[i]);
        let min = moved.iter().map(|e| e.0).min().expect("non-empty bucket");
        self.last = min;
        self.now.clear();
        self.head = 0;
        for &(t, item) in &moved {
            // Every entry lands in a lower bucket (they share the bits above `i`); the buckets
            // below `i` are empty, so each stays in push order.
            let x = t ^ min;
            if x == 0 {
                self.now.push(item);
            } else {
                let b = 63 - x.leading_zeros() as usize;
                self.buckets[b].push((t, item));
                self.nonempty |= 1 << b;
            }
        }
        // Keep the allocation for reuse.
        moved.clear();
        self.buckets[i] = moved;
    }
}

impl<T: Copy> EventQueue<T> for RadixQueue<T> {
    #[inline]
    fn push(&mut self, time: Time, item: T) {
        debug_assert!(time >= self.last, "event in the past: {time} ps");
        // Release builds clamp instead of corrupting the heap; the simulator checks monotone
        // time itself and reports the violation with its coordinates.
        let x = time.max(self.last) ^ self.last;
        if x == 0 {
            self.now.push(item);
        } else {
            let b = 63 - x.leading_zeros() as usize;
            self.buckets[b].push((time, item));
            self.nonempty |= 1 << b;
        }
        self.len += 1;
    }

    #[inline]
    fn pop(&mut self) -> Option<(Time, T)> {
        if self.head == self.now.len() {
            if self.nonempty == 0 {
                return None;
            }
            self.refill();
        }
        let item = self.now[self.head];
        self.head += 1;
        self.len -= 1;
        Some((self.last, item))
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// The simulator's queue: the radix heap, or the binary-heap baseline benchmarks compare it
/// with (identical event order either way).
pub enum Queue<T> {
    Radix(RadixQueue<T>),
    Heap(HeapQueue<T>),
}

impl<T: Copy> EventQueue<T> for Queue<T> {
    #[inline]
    fn push(&mut self, time: Time, item: T) {
        match self {
            Queue::Radix(q) => q.push(time, item),
            Queue::Heap(q) => q.push(time, item),
        }
    }

    #[inline]
    fn pop(&mut self) -> Option<(Time, T)> {
        match self {
            Queue::Radix(q) => q.pop(),
            Queue::Heap(q) => q.pop(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Queue::Radix(q) => q.len(),
            Queue::Heap(q) => q.len(),
        }
    }
}

/// The baseline: `std::collections::BinaryHeap` with the same (time, seq) order.
pub struct HeapQueue<T> {
    seq: u64,
    heap: BinaryHeap<Reverse<Keyed<T>>>,
}

struct Keyed<T>(u128, T);

impl<T> PartialEq for Keyed<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<T> Eq for Keyed<T> {}
impl<T> PartialOrd for Keyed<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Keyed<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

impl<T> Default for HeapQueue<T> {
    fn default() -> Self {
        HeapQueue { seq: 0, heap: BinaryHeap::new() }
    }
}

impl<T> EventQueue<T> for HeapQueue<T> {
    fn push(&mut self, time: Time, item: T) {
        let key = ((time as u128) << 64) | self.seq as u128;
        self.seq += 1;
        self.heap.push(Reverse(Keyed(key, item)));
    }

    fn pop(&mut self) -> Option<(Time, T)> {
        self.heap.pop().map(|Reverse(Keyed(key, item))| ((key >> 64) as Time, item))
    }

    fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eptwin_engine::rng::Rng;

    #[test]
    fn radix_and_binary_heap_pop_the_same_sequence() {
        let mut radix = RadixQueue::new();
        let mut heap = HeapQueue::default();
        let mut rng = Rng::new(7, 0);
        let mut now = 0;
        for i in 0..1000u32 {
            let t = now + rng.below(50) as Time;
            radix.push(t, i);
            heap.push(t, i);
        }
        let mut popped = 0u32;
        while let Some((t, x)) = radix.pop() {
            let (t2, y) = heap.pop().unwrap();
            assert_eq!((t, x), (t2, y));
            assert!(t >= now);
            now = t;
            popped += 1;
            // Hold model: push a new event after each pop for a while.
            if popped < 5000 {
                let t = now + rng.below(100) as Time;
                radix.push(t, popped + 1000);
                heap.push(t, popped + 1000);
            }
        }
        assert!(heap.is_empty() && radix.is_empty());
    }

    #[test]
    fn equal_times_pop_in_push_order() {
        let mut q = RadixQueue::new();
        q.push(10, 'a');
        q.push(5, 'x');
        q.push(10, 'b');
        assert_eq!(q.pop(), Some((5, 'x')));
        q.push(10, 'c');
        assert_eq!(q.pop(), Some((10, 'a')));
        assert_eq!(q.pop(), Some((10, 'b')));
        assert_eq!(q.pop(), Some((10, 'c')));
        assert_eq!(q.pop(), None);
    }
}
