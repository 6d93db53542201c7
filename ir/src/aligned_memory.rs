//! Zeroed, 64-byte-aligned memory for weight buffers: the only `unsafe` code of
//! smelt-ir, kept apart from the data model ([`crate::weights`]) that builds on it.
//!
//! The invariant that makes it sound: a [`Lines`] exclusively owns `count` initialized
//! (zeroed — or, for [`Lines::for_overwrite`], holding bytes an earlier owner wrote —
//! then possibly written) cache lines at `ptr`, obtained from the global
//! allocator with `Layout::array::<Line>(count)`, or, on Linux, from one private
//! anonymous `mmap` of at least `count * 64` bytes (`Owner::Mapped`), or as one piece of a
//! [`Mapping`] shared with other pieces (`Owner::Piece`, carved by [`Chunks`]: pieces of
//! one mapping are disjoint ranges, handed out once each under a lock, and the mapping
//! lives until its last piece is dropped); `drop` returns them the same way. Shared
//! access only reads, and mutation needs `&mut`, so `Send` and `Sync` hold as for a
//! `Vec<Line>`.
//!
//! Why not a `Vec`: the system allocator zero-fills over-aligned memory with a memset
//! (only `calloc`'s ≤ 16-byte alignment gets fresh zero pages), which faults in every
//! page before the first real write; on this VM a 4 KiB fault costs ≈ 2.5 µs (≈ 0.6 ms
//! per MB, and compiling ResNet-50 writes its 100 MB of weights out a few times). So
//! large buffers come from an anonymous mapping (zero pages, page-aligned), advised to
//! use 2 MiB pages: one fault per 2 MiB at the first write; a dropped mapping is kept for
//! reuse (released lazily with `MADV_FREE`, zeroed when reused: [`Retired`]). Small ones
//! come from the allocator.

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
    owner: Owner,
}

/// Where a [`Lines`]' memory came from, and so how it goes back.
enum Owner {
    /// The global allocator (or nothing, for no lines).
    Heap,
    /// A mapping of its own (unmapped when the lines are dropped; it may hold more
    /// lines than they use).
    Mapped { _mapping: Mapping },
    /// A piece of a mapping other pieces share, kept alive while the piece lives.
    Piece { _mapping: std::sync::Arc<Mapping> },
}

/// A private anonymous mapping of `count` lines, advised to use 2 MiB pages; unmapped
/// (or retired) on drop.
pub(crate) struct Mapping {
    ptr: std::ptr::NonNull<Line>,
    count: usize,
    /// Every line holds zeros (a fresh mapping, or a retired one cleared); otherwise they
    /// hold what an earlier owner left ([`Contents::Overwritten`]).
    zeros: bool,
}

// SAFETY: the mapping is plain memory; the pieces that write it own disjoint ranges.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: a `Mapping` itself never reads or writes its memory.
unsafe impl Sync for Mapping {}

/// Bytes of retired mappings the process keeps for reuse ([`Retired`]): 1 GiB, at most
/// an eighth of the default memory budget (a sixteenth of the machine's memory). A
/// transformer's file buffer and packed weights are a few hundred MB each (BERT-base
/// 440 MB): under 256 MB they were unmapped, and on this Firecracker VM, whose kernel
/// reports freed 8 MiB blocks to the host (free page reporting), the next compile's
/// fresh pages were backed anew by the host: BERT-base compiled in 200 or 500–900 ms
/// by turns, 165–175 ms with them kept (benches/RESULTS.md, session 31).
fn retain_max_bytes() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let budget = usize::try_from(crate::budget::default_memory_budget() / 8);
        budget.unwrap_or(usize::MAX).min(1 << 30)
    })
}

/// Retired mappings kept at most.
const RETAIN_MAX_COUNT: usize = 16;

/// Mappings dropped but kept for the next compile of this process, oldest first, as
/// (address, lines): a host that compiles models one after another (an embedding JIT)
/// would otherwise fault in fresh pages for every model's file buffer and packed weights,
/// and on a VM each first touch costs ≈ 0.6 ms per MB — more than the rest of a small
/// CNN's compile. They are released to the kernel lazily (`MADV_FREE`: it takes the
/// pages back under memory pressure, and until then they cost nothing to reuse) and
/// zeroed when reused. At most [`retain_max_bytes`] in [`RETAIN_MAX_COUNT`] mappings;
/// a larger one is unmapped at once.
struct Retired {
    mappings: Vec<(usize, usize)>,
}

static RETIRED: std::sync::Mutex<Retired> = std::sync::Mutex::new(Retired {
    mappings: Vec::new(),
});

impl Retired {
    fn lock() -> std::sync::MutexGuard<'static, Retired> {
        // the list is consistent whatever a panicking holder did: entries are whole
        RETIRED.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The smallest retired mapping of `count` to `count + count / 4` lines, taken out.
    fn take(&mut self, count: usize) -> Option<(usize, usize)> {
        let (i, _) = self
            .mappings
            .iter()
            .enumerate()
            .filter(|(_, &(_, c))| c >= count && c - count <= count / 4)
            .min_by_key(|(_, &(_, c))| c)?;
        Some(self.mappings.remove(i))
    }

    /// Keeps a mapping for reuse, evicting the oldest to stay within the bounds;
    /// returns what to unmap (the evicted ones, or the mapping itself when it alone is
    /// over the bound).
    fn keep(&mut self, at: usize, count: usize) -> Vec<(usize, usize)> {
        let bytes = |m: &[(usize, usize)]| m.iter().map(|&(_, c)| c * 64).sum::<usize>();
        let max_bytes = retain_max_bytes();
        if count.saturating_mul(64) > max_bytes {
            return vec![(at, count)];
        }
        self.mappings.push((at, count));
        let mut evicted = Vec::new();
        while self.mappings.len() > RETAIN_MAX_COUNT || bytes(&self.mappings) > max_bytes {
            evicted.push(self.mappings.remove(0));
        }
        evicted
    }
}

impl Mapping {
    /// A mapping of `count` lines (at least one) — a retired one of about that size, or
    /// a fresh one —, or `None` where the kernel refuses or the host is not Linux. A
    /// retired one is zeroed unless `contents` says its owner overwrites it all.
    fn with_contents(count: usize, contents: Contents) -> Option<Mapping> {
        let bytes = count.checked_mul(64).filter(|&b| b > 0)?;
        let reused = Retired::lock().take(count);
        if let Some((at, lines)) = reused {
            let ptr = std::ptr::NonNull::new(at as *mut Line)?;
            let zeros = contents == Contents::Zeroed;
            if zeros {
                // SAFETY: a retired mapping of `lines` lines is owned by nobody else
                // (taken out of the list under its lock).
                unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, lines) };
            }
            // Either way every line is initialized: a retired line holds the bytes its
            // last owner left, or zeros where `MADV_FREE` let the kernel take its page.
            return Some(Mapping {
                ptr,
                count: lines,
                zeros,
            });
        }
        #[cfg(target_os = "linux")]
        // SAFETY: a fresh private anonymous mapping, owned by the result and unmapped in
        // `drop`; madvise only hints how to back its pages.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return None;
            }
            libc::madvise(p, bytes, libc::MADV_HUGEPAGE);
            return std::ptr::NonNull::new(p.cast::<Line>()).map(|ptr| Mapping {
                ptr,
                count,
                zeros: true,
            });
        }
        #[allow(unreachable_code)]
        {
            let _ = bytes;
            None
        }
    }
}

/// What a new mapping must hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Contents {
    /// Zeros.
    Zeroed,
    /// Any bytes (zeros, or what an earlier buffer of this process left): its owner
    /// overwrites them all before reading any.
    Overwritten,
}

/// `lines` rounded up to whole 2 MiB pages.
fn huge_pages_of(lines: usize) -> usize {
    const PAGE_LINES: usize = (2 << 20) / 64;
    lines.div_ceil(PAGE_LINES).saturating_mul(PAGE_LINES)
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping was made in `new` with exactly this length, and no piece
        // of it is left (each holds an `Arc` of it): nobody reads or writes it any more,
        // so its pages may be freed lazily, kept for a later `new`, or unmapped.
        unsafe {
            let (at, count) = (self.ptr.as_ptr() as usize, self.count);
            let kept = libc::madvise(at as *mut libc::c_void, count * 64, libc::MADV_FREE) == 0;
            let unmap = match kept {
                true => Retired::lock().keep(at, count),
                false => vec![(at, count)],
            };
            for (at, count) in unmap {
                libc::munmap(at as *mut libc::c_void, count * 64);
            }
        }
    }
}

/// Carves many buffers out of a few large mappings advised to use 2 MiB pages: a
/// buffer's first writes then fault once per 2 MiB rather than once per 4 KiB page,
/// which on a VM costs several microseconds each (see the module doc). Each piece keeps
/// its mapping alive, so the pieces should live about as long as each other (the
/// packed weights of one executable do). A buffer of a quarter of a chunk or more gets
/// a mapping of its own, so at most a quarter of a chunk is left unused at its end.
/// Mappings are whole 2 MiB pages long (Linux places such anonymous mappings on a
/// 2 MiB boundary, so every page of them can be a huge one).
pub(crate) struct Chunks {
    /// Lines per mapping; 0 carves nothing (every buffer gets memory of its own).
    chunk_lines: usize,
    /// The mapping being carved and the lines of it handed out.
    current: std::sync::Mutex<Option<(std::sync::Arc<Mapping>, usize)>>,
}

impl Chunks {
    /// Chunks of `chunk_bytes` (rounded up to whole 2 MiB pages; 0 carves nothing).
    pub(crate) fn new(chunk_bytes: usize) -> Chunks {
        Chunks {
            chunk_lines: huge_pages_of(chunk_bytes.div_ceil(64)),
            current: std::sync::Mutex::new(None),
        }
    }

    /// `count` zeroed lines: a piece of the current mapping, of a new one when it is
    /// full, or memory of their own when they are large or no mapping can be made.
    pub(crate) fn zeroed(&self, count: usize) -> Lines {
        self.carve(count, Contents::Zeroed)
    }

    /// `count` lines of unspecified bytes, for a caller that overwrites all of them
    /// before reading any (as [`Lines::for_overwrite`]): a piece of a reused mapping is
    /// not cleared first.
    pub(crate) fn for_overwrite(&self, count: usize) -> Lines {
        self.carve(count, Contents::Overwritten)
    }

    /// A piece of `count` lines holding `contents`. A chunk is mapped without clearing a
    /// reused mapping; a piece of it that must hold zeros is cleared as it is carved, so
    /// only the lines handed out are written.
    fn carve(&self, count: usize, contents: Contents) -> Lines {
        if count == 0 || self.chunk_lines == 0 {
            return Lines::with_contents(count, contents);
        }
        if count.saturating_mul(4) >= self.chunk_lines {
            return match Mapping::with_contents(huge_pages_of(count), contents) {
                Some(mapping) => Lines::of_mapping(mapping, count),
                None => Lines::with_contents(count, contents),
            };
        }
        // the state is consistent whatever a panicking holder did: it is replaced whole
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let fits = |c: &Option<(std::sync::Arc<Mapping>, usize)>| {
            c.as_ref().is_some_and(|(m, used)| m.count - used >= count)
        };
        if !fits(&current) {
            *current = Mapping::with_contents(self.chunk_lines, Contents::Overwritten)
                .map(|m| (std::sync::Arc::new(m), 0));
        }
        let Some((mapping, used)) = current.as_mut() else {
            return Lines::with_contents(count, contents);
        };
        // SAFETY: lines `used..used + count` lie inside the mapping (checked by `fits`
        // or by a fresh mapping of `chunk_lines >= 4 · count`) and were never handed out:
        // `used` only grows, under the lock.
        let ptr = unsafe { std::ptr::NonNull::new_unchecked(mapping.ptr.as_ptr().add(*used)) };
        *used += count;
        if contents == Contents::Zeroed && !mapping.zeros {
            // SAFETY: the piece's lines are inside the mapping and handed out to nobody
            // else (see above); they hold initialized bytes, now zeros.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, count) };
        }
        Lines {
            ptr,
            count,
            owner: Owner::Piece {
                _mapping: mapping.clone(),
            },
        }
    }
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
        Lines::with_contents(count, Contents::Zeroed)
    }

    /// `count` lines of unspecified bytes (zeros, or bytes an earlier buffer of this
    /// process held), for a caller that overwrites all of them before reading any: a
    /// reused mapping is not cleared first (for a model file read into it, ≈ 0.1 ms per
    /// MB).
    pub(crate) fn for_overwrite(count: usize) -> Lines {
        Lines::with_contents(count, Contents::Overwritten)
    }

    fn with_contents(count: usize, contents: Contents) -> Lines {
        let Some(bytes) = count.checked_mul(64) else {
            // the same response as any other allocation of an impossible size
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<Line>())
        };
        if bytes >= MAPPED_MIN_BYTES {
            if let Some(mapping) = Mapping::with_contents(count, contents) {
                return Lines::of_mapping(mapping, count);
            }
        }
        if count == 0 {
            return Lines {
                ptr: std::ptr::NonNull::dangling(),
                count,
                owner: Owner::Heap,
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
            owner: Owner::Heap,
        }
    }

    /// The first `count` lines of `mapping` (at most its length), which they own.
    fn of_mapping(mapping: Mapping, count: usize) -> Lines {
        Lines {
            ptr: mapping.ptr,
            count: count.min(mapping.count),
            owner: Owner::Mapped { _mapping: mapping },
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
        match self.owner {
            // a mapping goes with its lines (its own `drop`), a shared one with its
            // last piece
            Owner::Mapped { .. } | Owner::Piece { .. } => {}
            Owner::Heap if self.count > 0 => {
                if let Ok(layout) = std::alloc::Layout::array::<Line>(self.count) {
                    // SAFETY: allocated in `zeroed` with this layout.
                    unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) }
                }
            }
            Owner::Heap => {}
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

    /// A mapping dropped and asked for again comes back zeroed, whatever was written to
    /// it (the retired list may hand the same pages back), also after buffers for
    /// overwriting (which are not cleared) held it; those are aligned, of the length
    /// asked, and writable.
    #[test]
    fn reused_mappings_are_zeroed() {
        let count = MAPPED_MIN_BYTES / 64 + 3;
        for round in 0..3u8 {
            let mut a = Lines::zeroed(count);
            assert!(a.as_slice().iter().all(|l| l.0 == [0; 64]), "round {round}");
            for line in a.as_mut_slice() {
                line.0 = [round + 1; 64];
            }
            drop(a);
            let mut b = Lines::for_overwrite(count);
            assert_eq!(b.len(), count);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            for line in b.as_mut_slice() {
                line.0 = [round + 7; 64];
            }
            assert!(b.as_slice().iter().all(|l| l.0 == [round + 7; 64]));
        }
        assert!(Lines::zeroed(count)
            .as_slice()
            .iter()
            .all(|l| l.0 == [0; 64]));
    }

    /// The retired list: a close fit is taken (the smallest), a loose one is not; the
    /// oldest are evicted past the count or byte bounds; one over the byte bound alone is
    /// not kept at all.
    #[test]
    fn retired_mappings_fit_and_stay_bounded() {
        let mut r = Retired {
            mappings: Vec::new(),
        };
        assert!(r.keep(0x1000, 1000).is_empty());
        assert!(r.keep(0x2000, 1100).is_empty());
        assert_eq!(r.take(1200), None, "1100 lines are too few");
        assert_eq!(r.take(900), Some((0x1000, 1000)), "the smallest that fits");
        assert_eq!(
            r.take(700),
            None,
            "1100 lines waste more than a quarter of 700"
        );
        let huge = retain_max_bytes() / 64 + 1;
        assert_eq!(r.keep(0x3000, huge), vec![(0x3000, huge)]);
        let evicted: Vec<_> = (0..RETAIN_MAX_COUNT)
            .flat_map(|i| r.keep(0x10_000 * (i + 1), 10))
            .collect();
        assert_eq!(
            evicted,
            vec![(0x2000, 1100)],
            "the oldest goes past the count bound"
        );
        let big = retain_max_bytes() / 64 / 2 + 1;
        let evicted = [r.keep(0x4000, big), r.keep(0x5000, big)].concat();
        assert!(evicted.contains(&(0x4000, big)), "{evicted:?}");
        let bytes: usize = r.mappings.iter().map(|&(_, c)| c * 64).sum();
        assert!(bytes <= retain_max_bytes() && r.mappings.len() <= RETAIN_MAX_COUNT);
    }

    /// Zeroed pieces are zeros, also where pieces for overwriting (which are not cleared)
    /// were written and dropped before, so that their mapping may come back reused.
    #[test]
    fn zeroed_pieces_after_overwritten_ones_are_zeros() {
        for round in 0..3u8 {
            let chunks = Chunks::new(4 << 20);
            let mut written: Vec<Lines> = (0..8).map(|_| chunks.for_overwrite(3000)).collect();
            for piece in &mut written {
                for line in piece.as_mut_slice() {
                    line.0 = [round + 1; 64];
                }
            }
            drop(written);
            drop(chunks);
            let chunks = Chunks::new(4 << 20);
            let mut pieces = vec![chunks.for_overwrite(5), chunks.zeroed(3000)];
            pieces.push(chunks.zeroed(chunks.chunk_lines / 4));
            for (i, p) in pieces.iter().enumerate().skip(1) {
                assert!(
                    p.as_slice().iter().all(|l| l.0 == [0; 64]),
                    "round {round}, piece {i}"
                );
            }
        }
    }

    /// Pieces of chunks: zeroed, aligned, disjoint (each keeps what it was written),
    /// carved from one mapping while they fit, a large one in a mapping of its own, and
    /// alive after the others and the carver are gone.
    #[test]
    fn chunk_pieces_are_zeroed_disjoint_and_outlive_their_carver() {
        let chunks = Chunks::new(4 << 20);
        assert_eq!(chunks.chunk_lines, (4 << 20) / 64);
        // small pieces until two chunks are in use, then one of a quarter chunk
        let mut pieces: Vec<Lines> = (0..70).map(|i| chunks.zeroed(1000 + i)).collect();
        pieces.push(chunks.zeroed(chunks.chunk_lines / 4));
        let mappings = |p: &[Lines]| -> usize {
            let mut seen: Vec<*const Mapping> = p
                .iter()
                .filter_map(|l| match &l.owner {
                    Owner::Piece { _mapping } => Some(std::sync::Arc::as_ptr(_mapping)),
                    Owner::Mapped { _mapping } => Some(_mapping as *const Mapping),
                    Owner::Heap => None,
                })
                .collect();
            seen.sort();
            seen.dedup();
            seen.len()
        };
        assert_eq!(mappings(&pieces), 3, "two chunks and the large piece's own");
        for (i, p) in pieces.iter_mut().enumerate() {
            assert_eq!(p.as_slice().as_ptr() as usize % 64, 0);
            assert!(
                p.as_slice().iter().all(|l| l.0 == [0; 64]),
                "piece {i} zeroed"
            );
            for line in p.as_mut_slice() {
                line.0 = [i as u8; 64];
            }
        }
        drop(chunks);
        let last = pieces.split_off(35);
        drop(pieces);
        for (i, p) in last.iter().enumerate() {
            let want = (35 + i) as u8;
            assert!(
                p.as_slice().iter().all(|l| l.0 == [want; 64]),
                "piece {}",
                35 + i
            );
        }
        // a carver of nothing gives every buffer memory of its own
        let none = Chunks::new(0);
        assert!(matches!(none.zeroed(10).owner, Owner::Heap));
    }
}
