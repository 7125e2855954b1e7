//! The counters other work waits on (ring-buffer tails, credit heads, flags, arrival counts)
//! and their waiters.
//!
//! Values live apart from the waiters, which few counters have at a time, so bumping a counter
//! touches 8 bytes and a bit. A counter takes 12 bytes and a bit. A counter with one waiter
//! (low-latency dispatch's million count counters at EP1024) holds it in a 16-byte record; a
//! second waiter moves them into a list kept for reuse, which a bump scans in one place
//! (normal kernels' heads and tails have several).

use crate::core::ProgId;
use crate::core::slab::{NONE, Slab, resize_huge};

/// [`Counters::waiters`] entry naming a list (else a single waiter's record).
const LIST: u32 = 1 << 31;

/// A waiter: the actor woken when the counter reaches `threshold`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    pub threshold: u64,
    pub actor: u32,
    pub prog: ProgId,
}

#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub values: Vec<u64>,
    /// Per counter whose `waited` bit is set: its single waiter's record in `singles`, or
    /// `LIST |` its list in `lists`.
    waiters: Vec<u32>,
    singles: Slab<Waiter>,
    /// Waiter lists in registration order (as a bump's swap-removal leaves them); a freed
    /// list keeps its buffer and its id goes to `free_lists`.
    lists: Vec<Vec<Waiter>>,
    free_lists: Vec<u32>,
    /// Bit per counter: it has a waiter.
    waited: Vec<u64>,
}

impl Counters {
    /// Allocate `n` counters (zero); returns the first id.
    pub fn alloc(&mut self, n: usize) -> u32 {
        let first = self.values.len() as u32;
        let len = self.values.len() + n;
        // Read at random (a message's arrival bumps one): backed by huge pages when large.
        resize_huge(&mut self.values, len, 0);
        resize_huge(&mut self.waiters, len, NONE);
        resize_huge(&mut self.waited, len.div_ceil(64), 0);
        first
    }

    /// Fetch what a bump of counter `c` reads (its value, and where its waiters are) ahead of
    /// use; no bounds check, no effect on any result.
    #[inline(always)]
    pub fn prefetch(&self, c: usize) {
        crate::core::prefetch_at(&self.values, c);
        crate::core::prefetch_at(&self.waiters, c);
    }

    /// Whether counter `c` has waiters.
    #[inline(always)]
    pub fn is_waited(&self, c: usize) -> bool {
        self.waited[c / 64] & (1 << (c % 64)) != 0
    }

    /// Register `w` on counter `c` (after the ones already there).
    pub fn push(&mut self, c: usize, w: Waiter) {
        if !self.is_waited(c) {
            self.waiters[c] = self.singles.insert(w);
            self.waited[c / 64] |= 1 << (c % 64);
            return;
        }
        let at = self.waiters[c];
        if at & LIST != 0 {
            self.lists[(at & !LIST) as usize].push(w);
            return;
        }
        let first = self.singles[at];
        self.singles.remove(at);
        let id = match self.free_lists.pop() {
            Some(id) => id,
            None => {
                self.lists.push(Vec::new());
                self.lists.len() as u32 - 1
            }
        };
        let list = &mut self.lists[id as usize];
        list.push(first);
        list.push(w);
        self.waiters[c] = LIST | id;
    }

    /// Remove the waiters of counter `c` (now at `v`) it satisfies, passing each to `wake` in
    /// the order a list scanned with swap-removal gives: a satisfied waiter is replaced by the
    /// last one, which is looked at next.
    #[inline]
    pub fn satisfy(&mut self, c: usize, v: u64, mut wake: impl FnMut(Waiter)) {
        let at = self.waiters[c];
        if at & LIST == 0 {
            let w = self.singles[at];
            if v >= w.threshold {
                self.singles.remove(at);
                self.waited[c / 64] &= !(1 << (c % 64));
                wake(w);
            }
            return;
        }
        let list = &mut self.lists[(at & !LIST) as usize];
        let mut i = 0;
        while i < list.len() {
            let w = list[i];
            if v >= w.threshold {
                list.swap_remove(i);
                wake(w);
            } else {
                i += 1;
            }
        }
        if list.is_empty() {
            self.free_lists.push(at & !LIST);
            self.waited[c / 64] &= !(1 << (c % 64));
        }
    }

    /// Counter `c`'s waiters in order (for the deadlock report).
    pub fn waiters_of(&self, c: usize) -> Vec<Waiter> {
        if !self.is_waited(c) {
            return Vec::new();
        }
        let at = self.waiters[c];
        if at & LIST == 0 {
            vec![self.singles[at]]
        } else {
            self.lists[(at & !LIST) as usize].clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters wake what a list per counter scanned with swap-removal wakes, in the same
    /// order, whatever the mix of waits and bumps.
    #[test]
    fn wakes_match_a_list_per_counter() {
        let mut rng = eptwin_engine::api::Rng::new(11, 0);
        let mut ctrs = Counters::default();
        ctrs.alloc(8);
        let mut want: Vec<Vec<Waiter>> = vec![Vec::new(); 8];
        for step in 0..20_000u32 {
            let c = rng.below(8) as usize;
            if rng.below(2) == 0 {
                let w = Waiter {
                    threshold: ctrs.values[c] + 1 + rng.below(4) as u64,
                    actor: step,
                    prog: 0,
                };
                ctrs.push(c, w);
                want[c].push(w);
            } else {
                ctrs.values[c] += 1 + rng.below(3) as u64;
                let v = ctrs.values[c];
                let mut got = Vec::new();
                if ctrs.is_waited(c) {
                    ctrs.satisfy(c, v, |w| got.push(w));
                }
                let (list, mut woke) = (&mut want[c], Vec::new());
                let mut i = 0;
                while i < list.len() {
                    if v >= list[i].threshold {
                        woke.push(list.swap_remove(i));
                    } else {
                        i += 1;
                    }
                }
                assert_eq!(got, woke);
            }
            for (k, list) in want.iter().enumerate() {
                assert_eq!(&ctrs.waiters_of(k), list);
            }
        }
    }
}
