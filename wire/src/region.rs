//! Memory the wire moves bytes between: a process's send staging region (producers write
//! tokens, the wire reads them) and its receive region (the wire writes tokens and counters,
//! consumers read them). A region is either allocated here ([`Region::alloc`], what tests use)
//! or borrowed from elsewhere ([`Region::from_raw`]: the GPU backend passes `cuMemHostAlloc`
//! pointers, which the verbs wire registers with `ibv_reg_mr` at that very address).
//!
//! Other agents (a NIC, a GPU, the TCP receiver thread) write the memory concurrently with the
//! CPU, so it is only ever accessed through raw copies and atomics, never through Rust
//! references: no `&[u8]` into a region exists.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::any::Any;
use std::panic::RefUnwindSafe;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::WireError;

/// What keeps memory allocated elsewhere alive (a pinned allocation) for as long as the
/// region or ring over it.
pub type Keeper = Arc<dyn Any + Send + Sync + RefUnwindSafe>;

/// Alignment of regions allocated here: a page, so a registration covers whole pages.
pub const REGION_ALIGN_BYTES: usize = 4096;

/// A byte range shared with a NIC, a GPU or another thread.
pub struct Region {
    ptr: NonNull<u8>,
    len_bytes: usize,
    /// `Some` when this region allocated the memory and frees it on drop.
    owned: Option<Layout>,
    /// What keeps external memory alive for as long as the region (a pinned allocation).
    _keeper: Option<Keeper>,
}

// SAFETY: no references into the memory exist; copies and atomics may run on any thread.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Region({:#x}, {} bytes, {})",
            self.addr() as usize,
            self.len_bytes,
            if self.owned.is_some() { "owned" } else { "external" }
        )
    }
}

impl Region {
    /// `len_bytes` zeroed bytes (at least one), page-aligned.
    pub fn alloc(len_bytes: usize) -> Result<Region, WireError> {
        let layout =
            Layout::from_size_align(len_bytes.max(1), REGION_ALIGN_BYTES).map_err(|e| {
                WireError::Memory { what: "region", reason: format!("{len_bytes} bytes: {e}") }
            })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(WireError::Memory {
            what: "region",
            reason: format!("cannot allocate {len_bytes} bytes"),
        })?;
        Ok(Region { ptr, len_bytes, owned: Some(layout), _keeper: None })
    }

    /// A region over memory allocated elsewhere (pinned host memory from `cuMemHostAlloc`,
    /// a mapping shared with a GPU). The region never frees it.
    ///
    /// # Safety
    /// * `ptr..ptr + len_bytes` is allocated, readable and writable for as long as this
    ///   `Region` (and every `Arc` of it, including those held by a registration or a wire)
    ///   lives;
    /// * nothing accesses that memory through Rust references while the region exists (other
    ///   agents — a GPU, a NIC — may write it concurrently, as the protocol allows).
    ///
    /// `ptr` must be 8-byte aligned (counters are 8-byte atomics at 8-aligned offsets); a
    /// misaligned or null pointer is refused with an error, not undefined behaviour.
    pub unsafe fn from_raw(ptr: *mut u8, len_bytes: usize) -> Result<Region, WireError> {
        let ptr = NonNull::new(ptr)
            .ok_or(WireError::Memory { what: "external region", reason: "null pointer".into() })?;
        if !(ptr.as_ptr() as usize).is_multiple_of(8) {
            return Err(WireError::Memory {
                what: "external region",
                reason: format!("address {:#x} is not 8-byte aligned", ptr.as_ptr() as usize),
            });
        }
        Ok(Region { ptr, len_bytes, owned: None, _keeper: None })
    }

    /// [`Region::from_raw`] over memory that `keeper` owns (the GPU backend's pinned
    /// allocation): the region holds `keeper`, so the memory outlives every `Arc` of the
    /// region, including those a wire's threads hold.
    ///
    /// # Safety
    /// As [`Region::from_raw`], except the lifetime: `ptr..ptr + len_bytes` must stay valid
    /// for as long as `keeper` lives.
    pub unsafe fn from_raw_kept(
        ptr: *mut u8,
        len_bytes: usize,
        keeper: Keeper,
    ) -> Result<Region, WireError> {
        // SAFETY: forwarded to the caller.
        let mut region = unsafe { Region::from_raw(ptr, len_bytes) }?;
        region._keeper = Some(keeper);
        Ok(region)
    }

    /// The address of byte 0 (what a verbs registration covers).
    pub fn addr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> u64 {
        self.len_bytes as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// Whether this region allocated its memory (false for [`Region::from_raw`]).
    pub fn is_owned(&self) -> bool {
        self.owned.is_some()
    }

    /// Whether `offset..offset + len_bytes` lies inside the region.
    pub fn contains(&self, offset: u64, len_bytes: u64) -> bool {
        offset.checked_add(len_bytes).is_some_and(|end| end <= self.len_bytes as u64)
    }

    fn at(&self, offset: u64, len_bytes: usize) -> *mut u8 {
        assert!(
            self.contains(offset, len_bytes as u64),
            "range {offset}+{len_bytes} outside the {}-byte region",
            self.len_bytes
        );
        // SAFETY: in bounds (checked above).
        unsafe { self.ptr.as_ptr().add(offset as usize) }
    }

    /// Copy `data` in at `offset`. Panics when out of bounds (callers check ranges that come
    /// from outside with [`Region::contains`] first).
    pub fn write(&self, offset: u64, data: &[u8]) {
        let dst = self.at(offset, data.len());
        // SAFETY: in bounds; `data` cannot overlap the region (no reference into it exists).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    }

    /// Copy `out.len()` bytes out from `offset`; panics when out of bounds.
    pub fn read(&self, offset: u64, out: &mut [u8]) {
        let src = self.at(offset, out.len());
        // SAFETY: as in `write`.
        unsafe { ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
    }

    pub fn to_vec(&self, offset: u64, len_bytes: usize) -> Vec<u8> {
        let mut v = vec![0; len_bytes];
        self.read(offset, &mut v);
        v
    }

    /// Copy `len_bytes` from `src` at `src_offset` to this region at `dst_offset` (the local
    /// path: a rank writing into another rank's receive area in the same process).
    pub fn copy_from(&self, dst_offset: u64, src: &Region, src_offset: u64, len_bytes: usize) {
        let from = src.at(src_offset, len_bytes);
        let to = self.at(dst_offset, len_bytes);
        // SAFETY: both in bounds; `ptr::copy` tolerates overlap when both are one region.
        unsafe { ptr::copy(from, to, len_bytes) };
    }

    /// Set `len_bytes` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: u64, len_bytes: usize, byte: u8) {
        let dst = self.at(offset, len_bytes);
        // SAFETY: in bounds.
        unsafe { ptr::write_bytes(dst, byte, len_bytes) };
    }

    fn atomic(&self, offset: u64) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8), "8-byte counter at unaligned offset {offset}");
        let p = self.at(offset, 8);
        // SAFETY: in bounds and 8-aligned (the base is 8-aligned: `alloc` page-aligns,
        // `from_raw` refuses anything else); valid as long as `self`; the CPU only ever
        // accesses counter words atomically (NIC atomics are coherent with CPU atomics).
        unsafe { AtomicU64::from_ptr(p.cast()) }
    }

    /// Read a counter with Acquire ordering: whatever was written before the increment that
    /// produced this value (by the TCP receiver, or on the same RC QP) is visible after it.
    pub fn load_u64(&self, offset: u64) -> u64 {
        self.atomic(offset).load(Ordering::Acquire)
    }

    pub fn store_u64(&self, offset: u64, value: u64) {
        self.atomic(offset).store(value, Ordering::Release)
    }

    /// Add to a counter with Release ordering (a flag applied after the data it follows);
    /// returns the previous value.
    pub fn fetch_add_u64(&self, offset: u64, add: u64) -> u64 {
        self.atomic(offset).fetch_add(add, Ordering::Release)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(layout) = self.owned {
            // SAFETY: allocated in `alloc` with this layout; freed once.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_regions_are_zeroed_page_aligned_and_bounds_checked() {
        let r = Region::alloc(100).unwrap();
        assert!(r.is_owned());
        assert_eq!(r.addr() as usize % REGION_ALIGN_BYTES, 0);
        assert!(r.to_vec(0, 100).iter().all(|&b| b == 0));
        r.write(90, &[1; 10]);
        assert_eq!(r.to_vec(88, 4), vec![0, 0, 1, 1]);
        assert!(r.contains(90, 10) && !r.contains(91, 10) && !r.contains(u64::MAX, 2));
        assert_eq!(r.fetch_add_u64(8, 5), 0);
        assert_eq!(r.fetch_add_u64(8, 5), 5);
        assert_eq!(r.load_u64(8), 10);
        let caught = std::panic::catch_unwind(|| r.write(95, &[0; 10]));
        assert!(caught.is_err(), "an out-of-bounds write must not happen silently");
    }

    #[test]
    fn external_memory_is_used_in_place_and_not_freed() {
        let mut backing = vec![0u64; 16];
        let ptr = backing.as_mut_ptr().cast::<u8>();
        // SAFETY: `backing` outlives the region and is not touched while the region exists.
        let r = unsafe { Region::from_raw(ptr, 128) }.unwrap();
        assert!(!r.is_owned());
        assert_eq!(r.addr(), ptr);
        r.store_u64(16, 0xfeed);
        r.write(0, &[7; 8]);
        drop(r);
        assert_eq!(backing[2], 0xfeed);
        assert_eq!(backing[0], u64::from_ne_bytes([7; 8]));
        // SAFETY: refused before any access.
        let e = unsafe { Region::from_raw(ptr.wrapping_add(1), 8) }.unwrap_err();
        assert!(e.to_string().contains("not 8-byte aligned"), "{e}");
        // SAFETY: as above.
        let e = unsafe { Region::from_raw(std::ptr::null_mut(), 8) }.unwrap_err();
        assert!(e.to_string().contains("null"), "{e}");
    }

    #[test]
    fn kept_memory_outlives_its_other_owners() {
        let backing = Arc::new(Region::alloc(64).unwrap());
        let ptr = backing.addr();
        let keeper: Keeper = backing.clone();
        // SAFETY: the keeper owns the 64 bytes at `ptr` for as long as the region lives.
        let r = unsafe { Region::from_raw_kept(ptr, 64, keeper) }.unwrap();
        drop(backing);
        r.store_u64(8, 42);
        assert_eq!(r.load_u64(8), 42, "the memory is still there");
        assert!(!r.is_owned());
    }

    #[test]
    fn copy_between_regions() {
        let a = Region::alloc(64).unwrap();
        let b = Region::alloc(64).unwrap();
        a.write(0, &(0..32).collect::<Vec<u8>>());
        b.copy_from(16, &a, 4, 8);
        assert_eq!(b.to_vec(16, 8), (4..12).collect::<Vec<u8>>());
        b.fill(0, 4, 0xAB);
        assert_eq!(b.to_vec(0, 5), vec![0xAB, 0xAB, 0xAB, 0xAB, 0]);
    }
}
