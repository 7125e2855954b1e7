//! A slab: a `Vec` of records with a free list, addressed by `u32` ids. Packets and messages
//! come and go by the million; reusing slots keeps the working set small and cache-friendly.

pub const NONE: u32 = u32::MAX;

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
    #[inline]
    pub fn insert(&mut self, value: T) -> u32 {
        self.live += 1;
        match self.free.pop() {
            Some(id) => {
                self.items[id as usize] = value;
                id
            }
            None => {
                self.items.push(value);
                (self.items.len() - 1) as u32
            }
        }
    }

    #[inline]
    pub fn remove(&mut self, id: u32) {
        self.live -= 1;
        self.free.push(id);
    }

    /// Records currently in use.
    pub fn live(&self) -> usize {
        self.live
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
