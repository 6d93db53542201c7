//! Zeroed, 64-byte-aligned memory for weight buffers: the only `unsafe` code of
//! smelt-ir, kept apart from the data model ([`crate::weights`]) that builds on it.
//!
//! The invariant that makes it sound: a [`Lines`] exclusively owns `count` initialized
//! (zeroed, then possibly written) cache lines at `ptr`, obtained either from the global
//! allocator with `Layout::array::<Line>(count)` or, on Linux, from one private
//! anonymous `mmap` of `count * 64` bytes (`mapped`); `drop` returns them the same way.
//! Shared access only reads, and mutation needs `&mut`, so `Send` and `Sync` hold as
//! for a `Vec<Line>`.
//!
//! Why not a `Vec`: the system allocator zero-fills over-aligned memory with a memset
//! (only `calloc`'s ≤ 16-byte alignment gets fresh zero pages), which faults in every
//! page before the first real write; on this VM a 4 KiB fault costs ≈ 2.5 µs (≈ 0.6 ms
//! per MB, and compiling ResNet-50 writes its 100 MB of weights out a few times). So
//! large buffers come from an anonymous mapping (zero pages, page-aligned), advised to
//! use 2 MiB pages: one fault per 2 MiB at the first write. Small ones come from the
//! allocator.

#![allow(unsafe_code)]

/// One cache line of plain bytes: the unit of allocation, so every buffer starts
/// 64-byte aligned (one cache line, and enough for any vector load).
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// Buffers at least this large are mapped straight from the kernel, with huge pages.
pub(crate) const MAPPED_MIN_BYTES: usize = 4 << 20;

/// Zeroed cache lines, owned exclusively (see the module doc for the invariant).
pub(crate) struct Lines {
    ptr: std::ptr::NonNull<Line>,
    count: usize,
    mapped: bool,
}

// SAFETY: `Lines` owns its memory exclusively, like a `Vec<Line>`; `Line` is plain bytes.
unsafe impl Send for Lines {}
// SAFETY: shared access only reads (`as_slice`); mutation needs `&mut`.
unsafe impl Sync for Lines {}

impl Lines {
    /// `count` zeroed lines whose pages nobody has touched yet. Aborts like `Vec` when
    /// the allocator fails or the size overflows (callers bound sizes: tensors are at
    /// most 4 GiB).
    pub(crate) fn zeroed(count: usize) -> Lines {
        let Some(bytes) = count.checked_mul(64) else {
            // the same response as any other allocation of an impossible size
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<Line>())
        };
        #[cfg(target_os = "linux")]
        if bytes >= MAPPED_MIN_BYTES {
            // SAFETY: a fresh private anonymous mapping, owned by the result and unmapped
            // in `drop`; madvise only hints how to back its pages.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if p != libc::MAP_FAILED {
                    libc::madvise(p, bytes, libc::MADV_HUGEPAGE);
                    if let Some(ptr) = std::ptr::NonNull::new(p.cast::<Line>()) {
                        return Lines {
                            ptr,
                            count,
                            mapped: true,
                        };
                    }
                }
            }
        }
        if count == 0 {
            return Lines {
                ptr: std::ptr::NonNull::dangling(),
                count,
                mapped: false,
            };
        }
        let Ok(layout) = std::alloc::Layout::array::<Line>(count) else {
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<Line>())
        };
        // SAFETY: the layout has a non-zero size; the memory is freed with the same
        // layout in `drop`.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p.cast::<Line>())
            .unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Lines {
            ptr,
            count,
            mapped: false,
        }
    }

    /// The lines.
    pub(crate) fn as_slice(&self) -> &[Line] {
        // SAFETY: `ptr` points to `count` initialized (zeroed or written) lines we own
        // (dangling but aligned, and never dereferenced, when `count` is 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.count) }
    }

    /// The lines, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [Line] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.count) }
    }

    /// Number of lines.
    pub(crate) fn len(&self) -> usize {
        self.count
    }
}

impl Clone for Lines {
    fn clone(&self) -> Lines {
        let mut copy = Lines::zeroed(self.count);
        copy.as_mut_slice().copy_from_slice(self.as_slice());
        copy
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        if self.mapped {
            #[cfg(target_os = "linux")]
            // SAFETY: the mapping was made in `zeroed` with exactly this length and is
            // not referenced after drop.
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.count * 64);
            }
        } else if self.count > 0 {
            if let Ok(layout) = std::alloc::Layout::array::<Line>(self.count) {
                // SAFETY: allocated in `zeroed` with this layout.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small and mapped buffers alike: zeroed, aligned, writable, cloned independently.
    #[test]
    fn lines_are_zeroed_aligned_and_owned() {
        for count in [0, 1, 3, MAPPED_MIN_BYTES / 64 + 1] {
            let mut a = Lines::zeroed(count);
            assert_eq!(a.len(), count);
            assert_eq!(a.as_slice().as_ptr() as usize % 64, 0);
            assert!(a.as_slice().iter().all(|l| l.0 == [0; 64]));
            if let Some(first) = a.as_mut_slice().first_mut() {
                first.0[0] = 7;
            }
            let b = a.clone();
            if let Some(first) = a.as_mut_slice().first_mut() {
                first.0[0] = 9;
                assert_eq!(b.as_slice()[0].0[0], 7, "a clone is a copy");
            }
        }
    }
}
