//! A slab: a `Vec` of records with a free list, addressed by `u32` ids. Packets and messages
//! come and go by the million; reusing slots keeps the working set small and cache-friendly.

pub const NONE: u32 = u32::MAX;

/// Buffers from this size on are worth backing with 2 MiB pages.
const HUGE_BYTES: usize = 2 << 20;

/// Ask the kernel to back `v`'s buffer with transparent huge pages (no effect on any result).
///
/// The hot records (messages, queue pairs, packets) are tens of MB touched at random: with
/// 4 KiB pages nearly every such access also misses the TLB (a page walk on top of the cache
/// miss). Hosts whose THP mode is `madvise` (the default on many distributions) give huge
/// pages only to regions that ask. Pages already touched stay as they are; call it when the
/// buffer has just been (re)allocated.
pub fn huge_pages<T>(v: &Vec<T>) {
    let bytes = v.capacity() * std::mem::size_of::<T>();
    if bytes < HUGE_BYTES {
        return;
    }
    // MADV_HUGEPAGE is 14 in the generic Linux ABI (x86_64, aarch64); other ABIs skip the hint.
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        const PAGE: usize = 4096;
        const MADV_HUGEPAGE: i32 = 14;
        unsafe extern "C" {
            fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
        }
        let start = (v.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (v.as_ptr() as usize + bytes) & !(PAGE - 1);
        if end > start {
            // SAFETY: madvise with MADV_HUGEPAGE only changes how the kernel backs the range
            // (inside the vector's live allocation, page-aligned); it never changes contents.
            // Its result is ignored: a host without THP simply keeps 4 KiB pages.
            unsafe {
                madvise(start as *mut std::ffi::c_void, end - start, MADV_HUGEPAGE);
            }
        }
    }
}

/// An empty vector with room for `n` items, hinted for huge pages before anything touches it.
/// Reserving is cheap: the kernel backs (and zeroes) only the pages that get written, so a
/// generous reservation costs nothing where a growing vector copies everything at each
/// doubling and leaves every smaller buffer's pages zeroed for nothing.
pub fn with_capacity_huge<T>(n: usize) -> Vec<T> {
    let v = Vec::with_capacity(n);
    huge_pages(&v);
    v
}

/// `n` copies of `value`, hinted for huge pages before they are written (a table read at
/// random, such as a per-(rank, expert) array).
pub fn filled_huge<T: Clone>(n: usize, value: T) -> Vec<T> {
    let mut v = with_capacity_huge(n);
    v.resize(n, value);
    v
}

/// Grow `v` to `n` items (new ones `value`), moving it first into a buffer hinted for huge
/// pages when it has no room (so large tables grown in a few big steps are backed by them).
pub fn resize_huge<T: Clone>(v: &mut Vec<T>, n: usize, value: T) {
    if n > v.capacity() {
        let mut bigger = with_capacity_huge(n.max(2 * v.capacity()));
        bigger.append(v);
        *v = bigger;
    }
    v.resize(n, value);
}

/// Push onto a vector that may grow large, doubling its buffer explicitly so a new buffer is
/// hinted for huge pages before it is touched.
#[inline]
pub fn push_huge<T>(v: &mut Vec<T>, value: T) {
    if v.len() == v.capacity() {
        grow_huge(v);
    }
    v.push(value);
}

#[cold]
#[inline(never)]
fn grow_huge<T>(v: &mut Vec<T>) {
    // A fresh buffer hinted before the copy touches it (a reallocation would move the old
    // pages, small ones, into the new buffer).
    let mut bigger = Vec::with_capacity(2 * v.capacity().max(32));
    huge_pages(&bigger);
    bigger.append(v);
    *v = bigger;
}

#[derive(Debug, Clone)]
pub struct Slab<T> {
    items: Vec<T>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { items: Vec::new(), free: Vec::new(), live: 0 }
    }
}

impl<T> Slab<T> {
    /// A slab with room for `n` records before it has to grow (see [`with_capacity_huge`]).
    pub fn with_capacity(n: usize) -> Self {
        Slab { items: with_capacity_huge(n), free: Vec::new(), live: 0 }
    }

    #[inline]
    pub fn insert(&mut self, value: T) -> u32 {
        self.live += 1;
        match self.free.pop() {
            Some(id) => {
                self.items[id as usize] = value;
                id
            }
            None => {
                push_huge(&mut self.items, value);
                (self.items.len() - 1) as u32
            }
        }
    }

    #[inline]
    pub fn remove(&mut self, id: u32) {
        self.live -= 1;
        self.free.push(id);
    }

    /// Forget every record, keeping the buffer (ids are handed out from 0 again, as by a
    /// fresh slab).
    pub fn clear(&mut self) {
        self.items.clear();
        self.free.clear();
        self.live = 0;
    }

    /// Fetch record `id`'s cache line ahead of use (no bounds check, no effect on results).
    #[inline(always)]
    pub fn prefetch(&self, id: u32) {
        crate::core::prefetch_at(&self.items, id as usize);
    }

    /// Records currently in use.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Records the buffer holds before it has to grow.
    pub fn reserved(&self) -> usize {
        self.items.capacity()
    }

    /// Slots ever allocated (the high-water mark).
    pub fn capacity(&self) -> usize {
        self.items.len()
    }
}

impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    #[inline]
    fn index(&self, id: u32) -> &T {
        &self.items[id as usize]
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, id: u32) -> &mut T {
        &mut self.items[id as usize]
    }
}
