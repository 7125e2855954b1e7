//! The event queues, all popping in (time, push sequence) order: the calendar queue the
//! simulator uses, a monotone radix heap, and the `BinaryHeap` baseline ([`HeapQueue`]).
//!
//! Discrete-event simulation pops events in non-decreasing time, which monotone queues exploit;
//! they stay fast with a large pending set where a binary heap collapses into cache misses
//! (docs/design.md, fabric §10: 42 vs 580 ns per event at 10^6 pending). Equal times pop in push
//! order, so the order is independent of the queue implementation.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::core::time::Time;

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

/// Width of a calendar bucket: 2^12 ps ≈ 4 ns. Packet-level runs pop a few tens of events
/// per simulated nanosecond, so a bucket holds on the order of a hundred entries.
/// Buckets are sorted by radix passes (linear), so wider buckets cost little to sort, and the
/// pushes of a hop time (≈ 0.1–0.4 µs ahead) land in a quarter as many bucket tails as with
/// 1 ns buckets, which stay cached. Measured on EP256 LL in alternated runs: 4 ns buckets take
/// 0.93 of 1 ns buckets' time; 2 ns buckets the same as 4 ns (0.996), 8 ns 1.03 of 4 ns.
const CAL_SHIFT: u32 = 12;
/// Buckets in the calendar's ring: a 16.8 µs window, beyond which events wait in a heap.
/// Packet hops are well under a microsecond ahead, but the normal kernels' copies and
/// flags are often 4–16 µs ahead: a 4.2 µs window would send about a quarter of EP64 normal's
/// events through the heap.
const CAL_SLOTS: usize = 4096;
const CAL_WORDS: usize = CAL_SLOTS / 64;
const CAL_SLOT_CAPACITY: usize = 128;

/// A calendar queue: a ring of ~4 ns buckets over the next 16.8 µs, a binary heap beyond.
///
/// Most events are scheduled a few hundred nanoseconds ahead; each is appended to its bucket
/// once and sorted once, in a small bucket, when the bucket becomes current (a radix heap
/// moves an event through up to ~20 levels of picosecond bits). The order is exactly (time,
/// push sequence): a bucket's entries are in push order (far events of a bucket's range are
/// moved in, in heap order, when the range enters the window, before anything can be pushed
/// into it directly), a stable sort by time keeps that order among equal times, and a push
/// into the current bucket goes after every entry at or before its time.
///
/// The current bucket is held in reverse (the next event last, popped from the end): a push
/// into it, mostly a few nanoseconds after now (a small packet's serialization), then moves
/// only the entries due before it, few, instead of every later one (at EP2048 LL the current
/// bucket holds hundreds, and the moves were 4 % of the run).
pub struct CalendarQueue<T> {
    /// Start of the current bucket (a multiple of the bucket width); the window is
    /// `[cur_start, cur_start + CAL_SLOTS buckets)`.
    cur_start: Time,
    /// The current bucket in reverse (time, push) order: the next event is the last.
    cur: Vec<(Time, T)>,
    /// Per slot its bucket; an empty slot holds no buffer. A fixed-size array: a slot index
    /// (masked) needs no bounds check.
    ring: Box<[Vec<(Time, T)>; CAL_SLOTS]>,
    /// Buffers of consumed buckets, the most recently used last: a slot that receives its
    /// first event takes the one still in cache. A slot that kept its own buffer would refill it
    /// only a whole window (hundreds of thousands of events in EP256 LL) after it was consumed,
    /// long evicted, and the write of every push into the bucket would miss the cache.
    free: Vec<Vec<(Time, T)>>,
    /// Bit per ring slot: non-empty.
    occupied: [u64; CAL_WORDS],
    /// Events at or beyond the window's end.
    far: HeapQueue<T>,
    len: usize,
    /// The last popped time (pushes before it are clamped, as the radix heap does).
    last: Time,
    /// Sort buffer, kept for reuse.
    scratch: Vec<(Time, T)>,
}

impl<T: Copy> Default for CalendarQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy> CalendarQueue<T> {
    pub fn new() -> Self {
        CalendarQueue {
            cur_start: 0,
            cur: Vec::new(),
            ring: Box::new(std::array::from_fn(|_| Vec::new())),
            free: Vec::new(),
            occupied: [0; CAL_WORDS],
            far: HeapQueue::default(),
            len: 0,
            last: 0,
            scratch: Vec::new(),
        }
    }

    #[inline]
    fn slot(t: Time) -> usize {
        (t >> CAL_SHIFT) as usize & (CAL_SLOTS - 1)
    }

    #[inline]
    fn window_end(&self) -> Time {
        self.cur_start + ((CAL_SLOTS as Time) << CAL_SHIFT)
    }

    /// Distance (in slots, 1..CAL_SLOTS) from `from` to the next occupied slot.
    fn next_occupied(&self, from: usize) -> Option<usize> {
        let mut i = (from + 1) & (CAL_SLOTS - 1);
        let mut scanned = 0;
        while scanned < CAL_SLOTS {
            let (w, b) = (i / 64, i % 64);
            let bits = self.occupied[w] >> b;
            if bits != 0 {
                let j = i + bits.trailing_zeros() as usize;
                return Some((j + CAL_SLOTS - from) & (CAL_SLOTS - 1));
            }
            scanned += 64 - b;
            i = (i + 64 - b) & (CAL_SLOTS - 1);
        }
        None
    }

    /// Append to slot `s`'s bucket.
    #[inline(always)]
    fn slot_push(&mut self, s: usize, t: Time, item: T) {
        let slot = &mut self.ring[s];
        if slot.is_empty() {
            self.occupied[s / 64] |= 1 << (s % 64);
            if slot.capacity() == 0 {
                *slot = self.free.pop().unwrap_or_else(|| Vec::with_capacity(CAL_SLOT_CAPACITY));
            }
        }
        slot.push((t, item));
    }

    /// Make the next non-empty bucket current (the current one is used up).
    #[cold]
    #[inline(never)]
    fn advance(&mut self) {
        let from = Self::slot(self.cur_start);
        let new_start = match self.next_occupied(from) {
            Some(d) => self.cur_start + ((d as Time) << CAL_SHIFT),
            // Nothing in the window: jump to the first far event's bucket.
            None => self.far.peek_time().expect("events left") & !((1 << CAL_SHIFT) - 1),
        };
        self.cur_start = new_start;
        // The window's new range enters: its far events move in before any direct push.
        let end = self.window_end();
        while self.far.peek_time().is_some_and(|t| t < end) {
            let (t, item) = self.far.pop().expect("peeked");
            self.slot_push(Self::slot(t), t, item);
        }
        let s = Self::slot(new_start);
        let mut used = std::mem::replace(&mut self.cur, std::mem::take(&mut self.ring[s]));
        used.clear();
        self.free.push(used);
        self.occupied[s / 64] &= !(1 << (s % 64));
        debug_assert!(self.cur.iter().all(|e| e.0 - new_start < 1 << CAL_SHIFT));
        sort_bucket_rev(&mut self.cur, new_start, &mut self.scratch);
        // The next bucket was filled a hop time ago (thousands of events): fetch its entries
        // while this one is consumed. No effect on any result.
        if let Some(d) = self.next_occupied(s) {
            let next = &self.ring[(s + d) & (CAL_SLOTS - 1)];
            let bytes = (next.len() * std::mem::size_of::<(Time, T)>()).min(PREFETCH_BYTES);
            let base = next.as_ptr().cast::<u8>();
            for off in (0..bytes).step_by(64) {
                prefetch_bytes(base.wrapping_add(off));
            }
        }
    }
}

/// How much of the next bucket [`CalendarQueue::advance`] fetches ahead (an EP256 LL bucket
/// holds several tens of 24-byte entries on average, 1–2 KiB, and the large ones miss most).
/// Measured on EP256 LL in alternated runs: 2 KiB takes 0.97 of 1 KiB's time, 4 KiB 0.95 of
/// 2 KiB's, 8 KiB 1.02 of 4 KiB's.
const PREFETCH_BYTES: usize = 4096;

/// Hint the CPU to fetch the cache line at `p` (never dereferenced: no effect on any result).
#[inline(always)]
fn prefetch_bytes(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no architectural effect.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Bits of a bucket's time offset each radix pass sorts on (two passes cover the bucket).
const RADIX_BITS: u32 = CAL_SHIFT.div_ceil(2);

/// Sort a bucket (times in `[start, start + bucket width)`) into reverse (time, push) order:
/// the earliest time last, equal times in reverse push order (the order the current bucket is
/// held in). Large buckets take a two-pass LSD radix sort on the time's offset in the bucket
/// (stable, and without data-dependent branches: an insertion sort of large buckets
/// mispredicts millions of times in EP256 LL, cachegrind's branch model), its two histograms
/// counted in one read of the bucket and its second pass writing from the back, so no reversal
/// follows; small ones an insertion sort, reversed.
fn sort_bucket_rev<T: Copy>(v: &mut [(Time, T)], start: Time, scratch: &mut Vec<(Time, T)>) {
    let n = v.len();
    if n <= 16 {
        insertion_sort(v);
        v.reverse();
        return;
    }
    // The scratch buffer only ever grows (its length is at least every bucket's so far).
    if scratch.len() < n {
        scratch.resize(n, v[0]);
    }
    const BINS: usize = 1 << RADIX_BITS;
    let low = |t: Time| (t - start) as usize & (BINS - 1);
    let high = |t: Time| ((t - start) >> RADIX_BITS) as usize & (BINS - 1);
    let mut at_low = [0u32; BINS];
    let mut at_high = [0u32; BINS];
    for e in v.iter() {
        at_low[low(e.0)] += 1;
        at_high[high(e.0)] += 1;
    }
    let (mut sum_low, mut sum_high) = (0, 0);
    for (l, h) in at_low.iter_mut().zip(at_high.iter_mut()) {
        (*l, sum_low) = (sum_low, sum_low + *l);
        (*h, sum_high) = (sum_high, sum_high + *h);
    }
    let scratch = &mut scratch[..n];
    for e in v.iter() {
        let k = low(e.0);
        scratch[at_low[k] as usize] = *e;
        at_low[k] += 1;
    }
    // Position i of the ascending order is n - 1 - i of the reverse one.
    let last = n - 1;
    for e in scratch.iter() {
        let k = high(e.0);
        v[last - at_high[k] as usize] = *e;
        at_high[k] += 1;
    }
}

/// Stable insertion sort by time (on a slice: its length stays in a register).
fn insertion_sort<T: Copy>(v: &mut [(Time, T)]) {
    for i in 1..v.len() {
        let x = v[i];
        if v[i - 1].0 <= x.0 {
            continue;
        }
        let mut j = i;
        while j > 0 && v[j - 1].0 > x.0 {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
}

impl<T: Copy> CalendarQueue<T> {
    /// The next event, when it is already in the current bucket (cheap to look at: the loop
    /// fetches its records while handling the one before).
    #[inline(always)]
    pub fn peek_current(&self) -> Option<&T> {
        self.cur.last().map(|e| &e.1)
    }

    /// The event after the next one, when it is in the current bucket too.
    #[inline(always)]
    pub fn peek_current2(&self) -> Option<&T> {
        self.peek_current_at(1)
    }

    /// The event `k` places after the next one, when it is in the current bucket too.
    #[inline(always)]
    pub fn peek_current_at(&self, k: usize) -> Option<&T> {
        let n = self.cur.len();
        if k < n { Some(&self.cur[n - 1 - k].1) } else { None }
    }
}

impl<T: Copy> EventQueue<T> for CalendarQueue<T> {
    #[inline(always)]
    fn push(&mut self, time: Time, item: T) {
        debug_assert!(time >= self.last, "event in the past: {time} ps");
        // Release builds clamp; the simulator checks monotone time itself and reports it.
        let t = time.max(self.last);
        self.len += 1;
        if t < self.cur_start + (1 << CAL_SHIFT) {
            // The current bucket: popped after every event at or before `t` (held in
            // reverse: placed before them).
            let pos = self.cur.partition_point(|e| e.0 > t);
            self.cur.insert(pos, (t, item));
        } else if t < self.window_end() {
            self.slot_push(Self::slot(t), t, item);
        } else {
            self.far.push(t, item);
        }
    }

    #[inline(always)]
    fn pop(&mut self) -> Option<(Time, T)> {
        if self.cur.is_empty() {
            if self.len == 0 {
                return None;
            }
            self.advance();
        }
        let e = self.cur.pop().expect("advance makes a bucket current");
        self.len -= 1;
        self.last = e.0;
        Some(e)
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// The simulator's queue: the calendar queue, the radix heap, or the binary-heap baseline
/// benchmarks compare them with (identical event order in every case). The calendar is held
/// inline (its hot fields one load away from the core); there is one queue per simulation.
#[allow(clippy::large_enum_variant)]
pub enum Queue<T> {
    Calendar(CalendarQueue<T>),
    Radix(RadixQueue<T>),
    Heap(HeapQueue<T>),
}

impl<T: Copy> Queue<T> {
    #[cold]
    #[inline(never)]
    fn push_other(&mut self, time: Time, item: T) {
        match self {
            Queue::Calendar(q) => q.push(time, item),
            Queue::Radix(q) => q.push(time, item),
            Queue::Heap(q) => q.push(time, item),
        }
    }

    #[cold]
    #[inline(never)]
    fn pop_other(&mut self) -> Option<(Time, T)> {
        match self {
            Queue::Calendar(q) => q.pop(),
            Queue::Radix(q) => q.pop(),
            Queue::Heap(q) => q.pop(),
        }
    }
}

impl<T: Copy> Queue<T> {
    /// The next event when the calendar has it at hand (see [`CalendarQueue::peek_current`]).
    #[inline(always)]
    pub fn peek_current(&self) -> Option<&T> {
        if let Queue::Calendar(q) = self { q.peek_current() } else { None }
    }

    /// The event after the next one (see [`CalendarQueue::peek_current2`]).
    #[inline(always)]
    pub fn peek_current2(&self) -> Option<&T> {
        if let Queue::Calendar(q) = self { q.peek_current2() } else { None }
    }

    /// See [`CalendarQueue::peek_current_at`].
    #[inline(always)]
    pub fn peek_current_at(&self, k: usize) -> Option<&T> {
        if let Queue::Calendar(q) = self { q.peek_current_at(k) } else { None }
    }
}

impl<T: Copy> EventQueue<T> for Queue<T> {
    /// The calendar inline; the benchmarks' alternatives out of line.
    #[inline(always)]
    fn push(&mut self, time: Time, item: T) {
        if let Queue::Calendar(q) = self { q.push(time, item) } else { self.push_other(time, item) }
    }

    #[inline(always)]
    fn pop(&mut self) -> Option<(Time, T)> {
        if let Queue::Calendar(q) = self { q.pop() } else { self.pop_other() }
    }

    fn len(&self) -> usize {
        match self {
            Queue::Calendar(q) => q.len(),
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

impl<T> HeapQueue<T> {
    /// The earliest event's time.
    pub fn peek_time(&self) -> Option<Time> {
        self.heap.peek().map(|Reverse(Keyed(key, _))| (key >> 64) as Time)
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
    use eptwin_engine::api::Rng;
    use proptest::prelude::*;

    /// A delay drawn from one of several scales: ties, inside a bucket, across the calendar's
    /// window, beyond it (the far heap), and far enough to leave the window empty.
    fn delay() -> impl Strategy<Value = Time> {
        prop_oneof![
            Just(0u64),
            // A few distinct times many events share (ties inside one future bucket).
            (0u64..4).prop_map(|k| 300_000 + 100 * k),
            0u64..2_000,
            0u64..200_000,
            0u64..20_000_000,
            16_000_000u64..200_000_000,
            Just(1u64 << 40),
        ]
    }

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(1000))]

        /// Every queue pops the same (time, push order) sequence as the binary heap, whatever
        /// the mix of delays and however pushes and pops interleave.
        #[test]
        fn calendar_radix_and_heap_agree(
            steps in proptest::collection::vec(
                (proptest::collection::vec(delay(), 0..40), 0usize..30), 1..100)
        ) {
            let mut cal = CalendarQueue::new();
            let mut radix = RadixQueue::new();
            let mut heap = HeapQueue::default();
            let mut now = 0;
            let mut id = 0u32;
            for (pushes, pops) in steps {
                for d in pushes {
                    cal.push(now + d, id);
                    radix.push(now + d, id);
                    heap.push(now + d, id);
                    id += 1;
                }
                for _ in 0..pops {
                    let want = heap.pop();
                    prop_assert_eq!(cal.pop(), want);
                    prop_assert_eq!(radix.pop(), want);
                    if let Some((t, _)) = want {
                        now = t;
                    }
                }
                prop_assert_eq!(cal.len(), heap.len());
            }
            while let Some(want) = heap.pop() {
                prop_assert_eq!(cal.pop(), Some(want));
                prop_assert_eq!(radix.pop(), Some(want));
            }
            prop_assert!(cal.is_empty() && cal.pop().is_none());
        }
    }

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

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// A bucket's sort (insertion sort when small, two radix passes when large) is the
        /// standard stable sort by time, reversed: equal times in reverse push order.
        #[test]
        fn bucket_sort_is_stable_by_time(
            start_bucket in 0u64..1_000_000,
            offsets in proptest::collection::vec(
                prop_oneof![0u64..(1 << CAL_SHIFT), Just(0u64), Just((1 << CAL_SHIFT) - 1), 500u64..504],
                0..300,
            ),
        ) {
            let start = start_bucket << CAL_SHIFT;
            let mut v: Vec<(Time, usize)> =
                offsets.iter().enumerate().map(|(i, &o)| (start + o, i)).collect();
            let mut want = v.clone();
            want.sort_by_key(|e| e.0);
            want.reverse();
            let mut scratch = Vec::new();
            sort_bucket_rev(&mut v, start, &mut scratch);
            prop_assert_eq!(v, want);
        }
    }
}
