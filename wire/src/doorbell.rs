//! Host-visible doorbell queues between producers and a CPU proxy (the UCCL-EP / pplx pattern
//! when GPU-initiated RDMA is unavailable): a producer writes a fixed-size record into a ring
//! slot and publishes it by bumping the slot's sequence word; the proxy polls the sequence
//! words, hands the record to its wire (verbs work requests or TCP frames) and frees the slot. On the GPU machine the producers are kernels
//! writing through mapped pinned memory (the layout below is `repr(C)`: plain u32/u64 fields
//! and one u64 sequence word per 64-byte slot); in tests they are threads.
//!
//! Bounded, multi-producer, single-consumer (Vyukov's sequence-numbered ring): a slot with
//! sequence `t` is free for ticket `t`, sequence `t + 1` holds ticket `t`'s record.

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::region::Keeper;

/// What the proxy does with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum DoorbellKind {
    /// Write `len_bytes` from the send region at `src_offset` to the peer's receive region at
    /// `dst_offset` (an RDMA WRITE on verbs, a write frame on TCP).
    Write = 1,
    /// The same with `imm` delivered to the peer's receive queue.
    WriteWithImm = 2,
    /// Add `add` to the 8-byte counter at `dst_offset` in the peer's receive region, after
    /// every earlier record of the same QP has landed (verbs: fetch-and-add, which RC executes
    /// in order; TCP: `fetch_add(Release)` by the receiver after the earlier frames' copies).
    Flag = 3,
}

impl DoorbellKind {
    /// Decode the `kind` word; producers on a GPU write raw integers, so a bad one is data,
    /// not undefined behaviour.
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(DoorbellKind::Write),
            2 => Some(DoorbellKind::WriteWithImm),
            3 => Some(DoorbellKind::Flag),
            _ => None,
        }
    }
}

/// One doorbell record: what to post, on which of the proxy's QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Doorbell {
    /// A [`DoorbellKind`] as its `u32` value.
    pub kind: u32,
    /// Index into the proxy's QP table (the wire's; see `internode::QpTable` for the
    /// protocol's order).
    pub qp: u32,
    pub src_offset: u64,
    pub dst_offset: u64,
    pub len_bytes: u32,
    pub imm: u32,
    pub add: u64,
    /// The producer's id for this record; becomes the work-request id, so a failed completion
    /// names the token it carried.
    pub tag: u64,
}

impl Doorbell {
    pub fn write(qp: u32, src_offset: u64, dst_offset: u64, len_bytes: u32, tag: u64) -> Self {
        Doorbell {
            kind: DoorbellKind::Write as u32,
            qp,
            src_offset,
            dst_offset,
            len_bytes,
            imm: 0,
            add: 0,
            tag,
        }
    }

    pub fn write_with_imm(
        qp: u32,
        src_offset: u64,
        dst_offset: u64,
        len_bytes: u32,
        imm: u32,
        tag: u64,
    ) -> Self {
        Doorbell {
            kind: DoorbellKind::WriteWithImm as u32,
            imm,
            ..Doorbell::write(qp, src_offset, dst_offset, len_bytes, tag)
        }
    }

    pub fn flag(qp: u32, dst_offset: u64, add: u64, tag: u64) -> Self {
        Doorbell {
            kind: DoorbellKind::Flag as u32,
            qp,
            src_offset: 0,
            dst_offset,
            len_bytes: 8,
            imm: 0,
            add,
            tag,
        }
    }
}

/// One ring slot: the sequence word, then the record (`#[repr(C)]`, 64 bytes; a kernel
/// addresses it as eight u64 words: `seq`, then the record's six).
#[repr(C, align(64))]
struct Slot {
    seq: AtomicU64,
    record: UnsafeCell<Doorbell>,
}

/// Where a ring's slots live.
enum Slots {
    /// Allocated here (producers are threads of this process).
    Owned(Box<[Slot]>),
    /// Memory shared with another agent (pinned host memory a GPU writes through its
    /// mapping), kept alive by `keeper`.
    External { ptr: NonNull<Slot>, len: usize, _keeper: Keeper },
}

impl Slots {
    fn get(&self) -> &[Slot] {
        match self {
            Slots::Owned(b) => b,
            // SAFETY: `external_doorbell_queue`'s contract: `len` initialised slots at `ptr`,
            // alive as long as the keeper; every field is accessed through atomics or the
            // sequence protocol, never through a `&mut`.
            Slots::External { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

struct Ring {
    slots: Slots,
    mask: u64,
    /// Next ticket a producer claims.
    tail: AtomicU64,
    /// Next ticket the consumer reads (only the consumer writes it).
    head: AtomicU64,
    closed: AtomicBool,
}

// SAFETY: a slot's record is written only by the producer holding its ticket (before the
// Release store of `seq = t + 1`) and read only by the single consumer after an Acquire load
// observed `t + 1`, and rewritten only after the consumer's Release store of `t + capacity`.
unsafe impl Sync for Ring {}
unsafe impl Send for Ring {}

/// The queue was closed: its proxy stopped (finished or failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueClosed;

/// The producer side; clone it for more producers.
#[derive(Clone)]
pub struct DoorbellProducer {
    ring: Arc<Ring>,
}

/// The consumer side (the proxy); exactly one per queue.
pub struct DoorbellConsumer {
    ring: Arc<Ring>,
}

/// A queue of `capacity` slots (rounded up to a power of two, at least 2).
pub fn doorbell_queue(capacity: usize) -> (DoorbellProducer, DoorbellConsumer) {
    let capacity = capacity.max(2).next_power_of_two();
    let slots = (0..capacity)
        .map(|i| Slot {
            seq: AtomicU64::new(i as u64),
            record: UnsafeCell::new(Doorbell::flag(0, 0, 0, 0)),
        })
        .collect();
    let ring = Arc::new(Ring {
        slots: Slots::Owned(slots),
        mask: capacity as u64 - 1,
        tail: AtomicU64::new(0),
        head: AtomicU64::new(0),
        closed: AtomicBool::new(false),
    });
    (DoorbellProducer { ring: ring.clone() }, DoorbellConsumer { ring })
}

/// Bytes of one slot in memory (`DOORBELL_SLOT_BYTES` in kernels/cuda/wire.cuh).
pub const SLOT_BYTES: usize = 64;

/// The consumer side of a ring whose producers live elsewhere: GPU kernels writing through a
/// mapping of `ptr` (pinned host memory). The `capacity` slots at `ptr` are initialised here
/// (slot `i` free for ticket `i`); producers claim tickets from their own counter (a word in
/// device memory, starting at 0), wait until the slot's sequence equals their ticket, write
/// the record and store `ticket + 1` with release semantics, exactly as
/// [`DoorbellProducer::push`] does.
///
/// # Safety
/// `ptr` is 64-byte aligned, `capacity · SLOT_BYTES` bytes are allocated there and stay valid
/// while `keeper` lives, and nothing else uses them but producers following that protocol.
pub unsafe fn external_doorbell_queue(
    ptr: *mut u8,
    capacity: usize,
    keeper: Keeper,
) -> Result<DoorbellConsumer, String> {
    if !capacity.is_power_of_two() || capacity < 2 {
        return Err(format!("a doorbell ring of {capacity} slots (a power of two ≥ 2 is needed)"));
    }
    let ptr = NonNull::new(ptr.cast::<Slot>()).ok_or("a doorbell ring at a null address")?;
    if !(ptr.as_ptr() as usize).is_multiple_of(SLOT_BYTES) {
        return Err(format!(
            "a doorbell ring at {:#x} (not 64-byte aligned)",
            ptr.as_ptr() as usize
        ));
    }
    for i in 0..capacity {
        // SAFETY: in bounds (caller); no producer runs yet, and the atomic is written in place.
        unsafe {
            let slot = ptr.as_ptr().add(i);
            std::ptr::addr_of_mut!((*slot).record)
                .write(UnsafeCell::new(Doorbell::flag(0, 0, 0, 0)));
            std::ptr::addr_of_mut!((*slot).seq).write(AtomicU64::new(i as u64));
        }
    }
    let ring = Arc::new(Ring {
        slots: Slots::External { ptr, len: capacity, _keeper: keeper },
        mask: capacity as u64 - 1,
        tail: AtomicU64::new(0),
        head: AtomicU64::new(0),
        closed: AtomicBool::new(false),
    });
    Ok(DoorbellConsumer { ring })
}

/// Spin briefly, then yield: producers, proxy and receivers may share fewer cores than threads
/// (the Soft-RoCE test VM has two emulated CPUs).
pub(crate) fn backoff(round: &mut u32) {
    if *round < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    *round = round.saturating_add(1);
}

impl DoorbellProducer {
    /// Publish one record; waits while the ring is full. Fails once the proxy has closed the
    /// queue, so a producer never waits on a proxy that is gone.
    pub fn push(&self, record: Doorbell) -> Result<(), QueueClosed> {
        let ring = &*self.ring;
        if ring.closed.load(Ordering::Acquire) {
            return Err(QueueClosed);
        }
        let ticket = ring.tail.fetch_add(1, Ordering::Relaxed);
        let slot = &ring.slots.get()[(ticket & ring.mask) as usize];
        let mut round = 0;
        while slot.seq.load(Ordering::Acquire) != ticket {
            if ring.closed.load(Ordering::Acquire) {
                return Err(QueueClosed);
            }
            backoff(&mut round);
        }
        // SAFETY: `seq == ticket` means the consumer released this slot for this ticket and no
        // other producer holds the same ticket.
        unsafe { *slot.record.get() = record };
        slot.seq.store(ticket + 1, Ordering::Release);
        Ok(())
    }

    pub fn capacity(&self) -> usize {
        self.ring.slots.get().len()
    }

    pub fn is_closed(&self) -> bool {
        self.ring.closed.load(Ordering::Acquire)
    }
}

impl DoorbellConsumer {
    /// The next record in ticket order, if it has been published.
    pub fn try_pop(&mut self) -> Option<Doorbell> {
        let ring = &*self.ring;
        let head = ring.head.load(Ordering::Relaxed);
        let slots = ring.slots.get();
        let slot = &slots[(head & ring.mask) as usize];
        if slot.seq.load(Ordering::Acquire) != head + 1 {
            return None;
        }
        // SAFETY: `seq == head + 1` was stored with Release after the record was written, and
        // no producer touches the slot until we store `head + capacity` below.
        let record = unsafe { *slot.record.get() };
        slot.seq.store(head + slots.len() as u64, Ordering::Release);
        ring.head.store(head + 1, Ordering::Relaxed);
        Some(record)
    }

    /// Records claimed by producers that are not consumed yet (published or being written).
    /// An external ring's producers claim tickets in their own memory, so there it counts only
    /// whether the next record is published (enough for the proxy's "nothing left" test,
    /// which runs once the producing kernels have finished).
    pub fn pending(&self) -> u64 {
        let ring = &*self.ring;
        let head = ring.head.load(Ordering::Relaxed);
        match &ring.slots {
            Slots::Owned(_) => ring.tail.load(Ordering::Acquire) - head,
            Slots::External { .. } => {
                let slot = &ring.slots.get()[(head & ring.mask) as usize];
                (slot.seq.load(Ordering::Acquire) == head + 1) as u64
            }
        }
    }

    /// Refuse further pushes (producers waiting for a slot give up with `QueueClosed`).
    pub fn close(&self) {
        self.ring.closed.store(true, Ordering::Release);
    }
}

impl Drop for DoorbellConsumer {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn record_layout_is_fixed() {
        // A CUDA kernel writes this struct through mapped memory: keep it 48 bytes, 8-aligned.
        assert_eq!(std::mem::size_of::<Doorbell>(), 48);
        assert_eq!(std::mem::align_of::<Doorbell>(), 8);
        assert_eq!(std::mem::size_of::<Slot>(), 64);
    }

    /// wire.cuh `doorbell_push` writes a slot as eight u64 words: the sequence, then
    /// `kind | qp << 32`, `src_offset`, `dst_offset`, `len_bytes | imm << 32`, `add`, `tag`.
    #[test]
    fn slot_words_are_what_kernels_write() {
        use std::mem::offset_of;
        assert_eq!(offset_of!(Slot, seq), 0);
        assert_eq!(offset_of!(Slot, record), 8);
        assert_eq!(offset_of!(Doorbell, kind), 0);
        assert_eq!(offset_of!(Doorbell, qp), 4);
        assert_eq!(offset_of!(Doorbell, src_offset), 8);
        assert_eq!(offset_of!(Doorbell, dst_offset), 16);
        assert_eq!(offset_of!(Doorbell, len_bytes), 24);
        assert_eq!(offset_of!(Doorbell, imm), 28);
        assert_eq!(offset_of!(Doorbell, add), 32);
        assert_eq!(offset_of!(Doorbell, tag), 40);
        assert_eq!(SLOT_BYTES, std::mem::size_of::<Slot>());
    }

    /// A ring in memory another agent writes: slots initialised free, records consumed in
    /// ticket order as the producer (a kernel; here this thread, writing words) publishes them.
    #[test]
    fn external_rings_are_consumed_in_ticket_order() {
        let mem = Arc::new(crate::region::Region::alloc(8 * SLOT_BYTES).unwrap());
        let base = mem.addr();
        let keeper: Keeper = mem.clone();
        // SAFETY: 8 page-aligned slots kept alive by the keeper.
        let mut c = unsafe { external_doorbell_queue(base, 8, keeper) }.unwrap();
        let word = |slot: u64, i: usize| {
            // SAFETY: inside the ring; the sequence word is only used atomically.
            unsafe { AtomicU64::from_ptr((base as *mut u64).add(slot as usize * 8 + i)) }
        };
        for t in 0..8 {
            assert_eq!(word(t, 0).load(Ordering::Acquire), t, "slot {t} free for ticket {t}");
        }
        assert_eq!((c.try_pop(), c.pending()), (None, 0));
        for t in 0..20u64 {
            let slot = t % 8;
            assert_eq!(word(slot, 0).load(Ordering::Acquire), t, "freed for ticket {t}");
            word(slot, 1).store(3 | 7 << 32, Ordering::Relaxed);
            word(slot, 3).store(64 * t, Ordering::Relaxed);
            word(slot, 5).store(1, Ordering::Relaxed);
            word(slot, 6).store(t, Ordering::Relaxed);
            word(slot, 0).store(t + 1, Ordering::Release);
            assert_eq!(c.pending(), 1);
            assert_eq!(c.try_pop(), Some(Doorbell::flag(7, 64 * t, 1, t)));
        }
        // SAFETY: refused before any access.
        let e = unsafe { external_doorbell_queue(base, 6, Arc::new(0u8)) }.err().unwrap();
        assert!(e.contains("power of two"), "{e}");
        // SAFETY: as above.
        let e = unsafe { external_doorbell_queue(base.wrapping_add(8), 2, Arc::new(0u8)) };
        assert!(e.err().unwrap().contains("64-byte"));
    }

    #[test]
    fn fifo_and_wraps() {
        let (p, mut c) = doorbell_queue(4);
        for round in 0..10u64 {
            for i in 0..4 {
                p.push(Doorbell::write(0, i, i, 1, round * 4 + i)).unwrap();
            }
            for i in 0..4 {
                assert_eq!(c.try_pop().unwrap().tag, round * 4 + i);
            }
            assert_eq!(c.try_pop(), None);
        }
    }

    #[test]
    fn closed_queue_refuses_and_releases_waiting_producers() {
        let (p, c) = doorbell_queue(2);
        p.push(Doorbell::flag(0, 0, 1, 0)).unwrap();
        p.push(Doorbell::flag(0, 0, 1, 1)).unwrap();
        let waiting = {
            let p = p.clone();
            std::thread::spawn(move || p.push(Doorbell::flag(0, 0, 1, 2)))
        };
        drop(c);
        assert_eq!(waiting.join().unwrap(), Err(QueueClosed));
        assert_eq!(p.push(Doorbell::flag(0, 0, 1, 3)), Err(QueueClosed));
    }

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(24))]
        /// Every record of every producer arrives exactly once, each producer's in its order.
        #[test]
        fn concurrent_producers_lose_nothing(capacity in 2usize..16, producers in 1usize..4,
                                             per_producer in 0u64..300) {
            let (p, mut c) = doorbell_queue(capacity);
            let handles: Vec<_> = (0..producers as u64)
                .map(|id| {
                    let p = p.clone();
                    std::thread::spawn(move || {
                        for i in 0..per_producer {
                            p.push(Doorbell::write(id as u32, i, 0, 0, (id << 32) | i)).unwrap();
                        }
                    })
                })
                .collect();
            let mut next = vec![0u64; producers];
            let total = producers as u64 * per_producer;
            let mut got = 0;
            let mut round = 0;
            while got < total {
                match c.try_pop() {
                    Some(r) => {
                        let id = (r.tag >> 32) as usize;
                        prop_assert_eq!(r.tag & 0xffff_ffff, next[id]);
                        prop_assert_eq!(r.src_offset, next[id]);
                        next[id] += 1;
                        got += 1;
                    }
                    None => backoff(&mut round),
                }
            }
            for h in handles {
                h.join().unwrap();
            }
            prop_assert_eq!(c.try_pop(), None);
            prop_assert_eq!(c.pending(), 0);
        }
    }
}
