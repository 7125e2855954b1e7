//! A FIFO ring of `Copy` items with a power-of-two capacity: the port lanes' queues and
//! credit-return lists. Against `VecDeque` it saves the wrap-around arithmetic (a mask instead
//! of a compare and subtract) and a capacity word; every packet hop pushes and pops a few.

/// FIFO ring; capacity 0 or a power of two, `head` always below it.
#[derive(Debug, Clone)]
pub struct Ring<T> {
    /// A boxed slice, not a `Vec`: its length is the capacity, so the ring is 16 bytes of
    /// pointer and length plus `head` and `len` (a port lane's record stays 40 bytes).
    buf: Box<[T]>,
    head: u32,
    len: u32,
}

impl<T> Default for Ring<T> {
    fn default() -> Self {
        Ring { buf: Box::default(), head: 0, len: 0 }
    }
}

impl<T: Copy> Ring<T> {
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline(always)]
    fn mask(&self) -> u32 {
        (self.buf.len() as u32).wrapping_sub(1)
    }

    #[inline(always)]
    pub fn front(&self) -> Option<&T> {
        if self.len == 0 { None } else { self.buf.get(self.head as usize) }
    }

    /// The item after the front one.
    #[inline(always)]
    pub fn second(&self) -> Option<&T> {
        if self.len < 2 {
            None
        } else {
            self.buf.get((self.head.wrapping_add(1) & self.mask()) as usize)
        }
    }

    /// Fetch the front slot's cache line ahead of use (no effect on any result).
    #[inline(always)]
    pub fn prefetch_front(&self) {
        crate::core::prefetch_at(&self.buf, self.head as usize);
    }

    #[inline(always)]
    pub fn push_back(&mut self, x: T) {
        if self.len as usize == self.buf.len() {
            self.grow(x);
        }
        let i = self.head.wrapping_add(self.len) & self.mask();
        self.buf[i as usize] = x;
        self.len += 1;
    }

    /// Drop the front item (the ring must not be empty).
    #[inline(always)]
    pub fn pop_front(&mut self) {
        debug_assert!(self.len > 0, "pop from an empty ring");
        self.head = self.head.wrapping_add(1) & self.mask();
        self.len -= 1;
    }

    /// Double the capacity (at least 4), keeping the order; `fill` initialises new slots.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, fill: T) {
        let cap = (self.buf.len() * 2).max(4);
        let mut buf = Vec::with_capacity(cap);
        let (h, n) = (self.head as usize, self.len as usize);
        let old = self.buf.len();
        for k in 0..n {
            buf.push(self.buf[(h + k) & (old - 1)]);
        }
        buf.resize(cap, fill);
        self.buf = buf.into_boxed_slice();
        self.head = 0;
    }

    /// Keep the items `keep` accepts, in their order (one pass over the ring).
    #[inline]
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let mask = self.mask() as usize;
        let head = self.head as usize;
        let mut kept = 0;
        for k in 0..self.len as usize {
            let x = self.buf[(head + k) & mask];
            if keep(&x) {
                self.buf[(head + kept) & mask] = x;
                kept += 1;
            }
        }
        self.len = kept as u32;
    }

    /// The items front to back.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        let mask = self.mask() as usize;
        (0..self.len as usize).map(move |k| &self.buf[(self.head as usize + k) & mask])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// The ring behaves as a `VecDeque` under any mix of pushes, pops and `retain`s, across
    /// growth and wrap-around.
    #[test]
    fn ring_matches_vecdeque() {
        let mut rng = eptwin_engine::api::Rng::new(3, 0);
        let mut ring = Ring::default();
        let mut want = VecDeque::new();
        for i in 0..20_000u32 {
            match rng.below(100) {
                0..55 => {
                    ring.push_back(i);
                    want.push_back(i);
                }
                55..97 if !want.is_empty() => {
                    want.pop_front();
                    ring.pop_front();
                }
                97.. => {
                    let m = 2 + rng.below(3);
                    ring.retain(|x| x % m != 0);
                    want.retain(|x| x % m != 0);
                    assert!(ring.iter().eq(want.iter()));
                }
                _ => {}
            }
            assert_eq!(ring.len(), want.len());
            assert_eq!(ring.front(), want.front());
            assert_eq!(ring.second(), want.get(1));
        }
        assert!(ring.iter().eq(want.iter()));
    }
}
