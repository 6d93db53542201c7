//! Intra-op threads: one pool per process, of one worker per core but one, started on
//! first use and never grown, splitting a parallel kernel's top-level loop into chunks of
//! trips that the caller and up to `threads - 1` of the pool's workers claim. So the
//! process never holds more than `cores - 1` smelt worker threads, whatever thread
//! counts executables ask for.
//!
//! The pool runs one kernel call at a time; a caller that finds it busy (another thread
//! is running an executable on it) runs its kernel alone. Splits never cut a reduction
//! (only a kernel's independent top-level loop is split), so results are bit-identical
//! for any thread count and any split.
//!
//! # Safety
//!
//! The pool calls native kernels on several threads at once. The invariant: a job's
//! chunks are claimed one by one from a two-ended counter tagged with the job's
//! generation (the caller from the front, the first worker to join from the back, any
//! other from the front; a claim moves its end past the chunk only while the ends have
//! not met), so each chunk index runs exactly once, and chunk `i` runs units
//! `[total·i/chunks, total·(i+1)/chunks)` of the job's `copies × units` (copy-major):
//! disjoint ranges, each cut at copy boundaries into one call per copy over its own
//! trips. A parallel kernel's trips write disjoint elements and read nothing another
//! trip writes (what lowering's `parallel` flag means), and copies of a batch write
//! disjoint memory (each element's own buffers), so concurrent chunks never race; and the
//! caller of [`ThreadPool::run_copies`] (the JIT entry, `runtime::entry`) vouches that
//! the kernel may be called with each copy's argument array for any such range, and
//! does not return until every chunk has completed, so the arrays and the buffers
//! outlive every call.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use crate::codegen::KernelFn;

/// Chunks to cut `total` units into for `threads` threads: one per unit up to four per
/// thread (claimed one by one, so a thread that finishes early takes more); beyond, the
/// most, up to four per thread, of equal size whose count the threads divide, so every
/// thread finishes with the same work. Chunks of unequal size left a tail: twelve GEMM
/// panels in eight chunks of one or two ran at 2 threads in 0.48 ms against 0.77 at one
/// (six of two: see benches/RESULTS.md). With no such count (a prime number of units),
/// four per thread.
fn chunk_count(total: i64, threads: i64) -> u64 {
    let most = 4 * threads.max(1);
    if total <= most {
        return total.max(1) as u64;
    }
    let equal = (1..=4)
        .rev()
        .map(|per_thread| per_thread * threads.max(1))
        .find(|&c| total % c == 0);
    equal.unwrap_or(most) as u64
}

/// The mask of one end of [`ThreadPool`]'s `claim`, and the most chunks a job has (16
/// bits: [`chunk_count`] makes at most four chunks per thread of a pool of one per core).
const CLAIM_END: u64 = 0xffff;

/// One kernel call to split, or one per copy of a batch: `kernel(args_r, lo, hi)` for
/// chunks of the `copies × units` units, copy-major, `args_r` copy `r`'s argument array.
#[derive(Clone, Copy)]
struct Job {
    kernel: KernelFn,
    /// Copy 0's argument pointer array, as an address (valid until the job completes).
    args: usize,
    /// Bytes from one copy's argument array to the next.
    args_stride: usize,
    /// Copies of the call (1 for a kernel called once).
    copies: i64,
    /// Units per copy: trips of the kernel's top-level loop, or 1 when `whole` is set.
    units: i64,
    /// When positive, each unit is one whole call `0..whole` (a kernel whose trips are
    /// not split).
    whole: i64,
    chunks: u64,
    /// Workers that may join the caller (the executable's thread count less one).
    helpers: usize,
}

impl Job {
    /// Runs chunk `i` of the job: its range of the copy-major units, one call per copy it
    /// covers.
    fn run_chunk(&self, i: u64) {
        let total = i128::from(self.copies) * i128::from(self.units);
        let lo = (total * i as i128 / self.chunks as i128) as i64;
        let hi = (total * (i as i128 + 1) / self.chunks as i128) as i64;
        let mut at = lo;
        while at < hi {
            let copy = at / self.units;
            let end = hi.min((copy + 1) * self.units);
            let (first, last) = match self.whole {
                0 => (at - copy * self.units, end - copy * self.units),
                whole => (0, whole),
            };
            let args = self.args + copy as usize * self.args_stride;
            // SAFETY: the caller of `ThreadPool::run_copies` vouched for `kernel` and
            // every copy's argument array (see `Executable::run_with`) and does not
            // return, nor touch the arrays, until every chunk has completed. Each unit
            // runs once: trips `first..last` of one copy lie inside `0..units`, and a
            // parallel kernel's trips write disjoint elements; copies write disjoint
            // memory (each its own image's buffers). A kernel the pool runs cannot fault
            // (`Kernel::check` refuses a parallel one that could, and the runtime runs a
            // faulting kernel's copies itself), so its status is always 0.
            unsafe { (self.kernel)(args as *const *mut u8, first, last) };
            at = end;
        }
    }
}

struct Slot {
    generation: u64,
    job: Option<Job>,
    sleepers: usize,
}

/// The process-lifetime pool of `workers` helper threads (the calling thread works too).
pub(crate) struct ThreadPool {
    workers: usize,
    busy: Mutex<()>,
    /// `(generation mod 2^32) << 32 | workers joined`: a worker joins a job only while
    /// fewer than its `helpers` have.
    joined: AtomicU64,
    slot: Mutex<Slot>,
    wake: Condvar,
    /// The published generation, for workers spinning without the lock.
    generation: AtomicU64,
    /// `(generation mod 2^32) << 32 | front << 16 | back`: the chunks not yet claimed are
    /// `front..back`; claims check the generation.
    claim: AtomicU64,
    /// Chunks of the current job completed.
    done: AtomicUsize,
}

/// How [`ThreadPool::run_copies`] splits each copy's call.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Split {
    /// Into sub-ranges of the top-level loop's trips (a parallel kernel).
    Trips(i64),
    /// Not at all: each copy is one call of trips `0..n` (a kernel that is not
    /// parallel passes 1 and runs whole).
    Whole(i64),
}

/// How long the caller spins on its job's last chunks before yielding between polls:
/// chunks of one job end within microseconds of each other.
const SPIN: Duration = Duration::from_micros(100);

/// How long an idle worker spins on the next job before it sleeps (as ONNX Runtime's
/// workers spin after a run by default). A sleeping worker is woken onto a core the
/// kernel picks, often the caller's own, where the two then share one core for many
/// runs: a 0.1 ms GEMM at 2 threads ran back to back took its serial time (0.19 ms) for
/// tens of runs at a time whenever a hiccup of the host had outlasted the 0.1 ms the
/// workers used to spin (medians of separate processes 0.11–0.20 ms; spinning 3 ms,
/// 0.113–0.116; yielding between polls instead of spinning was worse: 0.12–0.21). Runs
/// more than this apart wake the worker as before.
const POLL: Duration = Duration::from_millis(3);

impl ThreadPool {
    /// The process's pool (one worker per core but one, started on first use); `None`
    /// on a one-core machine or when no worker could be started.
    pub(crate) fn shared() -> Option<&'static ThreadPool> {
        static POOL: OnceLock<Option<&'static ThreadPool>> = OnceLock::new();
        *POOL.get_or_init(|| {
            let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
            if workers == 0 {
                return None;
            }
            let pool: &'static ThreadPool = Box::leak(Box::new(ThreadPool {
                workers,
                busy: Mutex::new(()),
                joined: AtomicU64::new(0),
                slot: Mutex::new(Slot {
                    generation: 0,
                    job: None,
                    sleepers: 0,
                }),
                wake: Condvar::new(),
                generation: AtomicU64::new(0),
                claim: AtomicU64::new(0),
                done: AtomicUsize::new(0),
            }));
            let mut started = 0;
            for i in 0..workers {
                let spawned = std::thread::Builder::new()
                    .name(format!("smelt-worker-{i}"))
                    .spawn(move || {
                        crate::quiet::mark_thread_as_smelts();
                        pool.worker()
                    });
                if spawned.is_err() {
                    // Fewer helpers only slows runs down: the caller claims what is left.
                    break;
                }
                started += 1;
            }
            (started > 0).then_some(pool)
        })
    }

    /// Most participants a run can have: the workers and the caller.
    pub(crate) fn participants(&self) -> usize {
        self.workers + 1
    }

    /// Runs `kernel(args, lo, hi)` over `0..trips` split into chunks, on this thread
    /// and the pool's workers; returns when every chunk has completed. A busy pool
    /// (another caller's job) means this caller runs the whole range alone.
    ///
    /// # Safety
    /// `kernel` must be safe to call with `args` for any sub-range of `0..trips` from
    /// any thread, concurrently on disjoint sub-ranges, while this call lasts.
    pub(crate) unsafe fn run(
        &self,
        kernel: KernelFn,
        args: *const *mut u8,
        trips: i64,
        threads: usize,
    ) {
        // SAFETY: one copy, as the caller vouched.
        unsafe { self.run_copies(kernel, args, 0, 1, Split::Trips(trips), threads) }
    }

    /// Runs `copies` calls of `kernel`, copy `r` with the argument array `args + r ·
    /// args_stride` bytes, each split as `split` says, on this thread and the pool's
    /// workers; returns when every call has completed.
    ///
    /// # Safety
    /// For every copy, `kernel` must be safe to call with its argument array for any
    /// sub-range of its trips (or whole, for [`Split::Whole`]) from any thread,
    /// concurrently with the other copies and on disjoint sub-ranges, while this call
    /// lasts; and it must not fault.
    pub(crate) unsafe fn run_copies(
        &self,
        kernel: KernelFn,
        args: *const *mut u8,
        args_stride: usize,
        copies: i64,
        split: Split,
        threads: usize,
    ) {
        let helpers = threads.saturating_sub(1).min(self.workers);
        let (units, whole) = match split {
            Split::Trips(trips) => (trips.max(1), 0),
            Split::Whole(trips) => (1, trips.max(1)),
        };
        let total = copies.max(1).saturating_mul(units);
        let chunks = chunk_count(total, helpers as i64 + 1).min(CLAIM_END);
        let job = Job {
            kernel,
            args: args as usize,
            args_stride,
            copies: copies.max(1),
            units,
            whole,
            chunks,
            helpers,
        };
        let _busy = match self.busy.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                let whole = Job { chunks: 1, ..job };
                whole.run_chunk(0);
                return;
            }
        };
        let generation = self.generation.load(Ordering::Relaxed) + 1;
        self.done.store(0, Ordering::Relaxed);
        self.claim.store(
            (generation & 0xffff_ffff) << 32 | chunks & CLAIM_END,
            Ordering::Release,
        );
        self.joined
            .store((generation & 0xffff_ffff) << 32, Ordering::Release);
        {
            let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.generation = generation;
            slot.job = Some(job);
            self.generation.store(generation, Ordering::Release);
            if slot.sleepers > 0 {
                self.wake.notify_all();
            }
        }
        self.work(&job, generation, false);
        let start = Instant::now();
        while self.done.load(Ordering::Acquire) < chunks as usize {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Claims and runs chunks of the job of `generation` until none is left: from the
    /// back of the unclaimed chunks with `from_back`, else from the front. Two threads
    /// then take the same halves of a job run after run (the caller the first chunks,
    /// the worker the last), and what a chunk reads stays in its own core's cache (a
    /// 384 × 1536 GEMM's weight panels, 1.2 MB a half: benches/RESULTS.md).
    fn work(&self, job: &Job, generation: u64, from_back: bool) {
        let tag = (generation & 0xffff_ffff) << 32;
        loop {
            let c = self.claim.load(Ordering::Acquire);
            let (front, back) = ((c >> 16) & CLAIM_END, c & CLAIM_END);
            if c & !0xffff_ffff != tag || front >= back {
                return;
            }
            let (next, chunk) = match from_back {
                true => (c - 1, back - 1),
                false => (c + (1 << 16), front),
            };
            if self
                .claim
                .compare_exchange_weak(c, next, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                job.run_chunk(chunk);
                self.done.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// This worker's seat in the job of `generation` (0 for the first to join), if fewer
    /// than its `helpers` have joined (counted per generation, so a late worker of an old
    /// job never takes a seat of the new one).
    fn join(&self, job: &Job, generation: u64) -> Option<u64> {
        let tag = (generation & 0xffff_ffff) << 32;
        loop {
            let j = self.joined.load(Ordering::Acquire);
            if j & !0xffff_ffff != tag || (j & 0xffff_ffff) as usize >= job.helpers {
                return None;
            }
            if self
                .joined
                .compare_exchange_weak(j, j + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(j & 0xffff_ffff);
            }
        }
    }

    fn worker(&self) {
        let mut seen = 0u64;
        loop {
            let start = Instant::now();
            while self.generation.load(Ordering::Acquire) == seen && start.elapsed() < POLL {
                std::hint::spin_loop();
            }
            let (job, generation) = {
                let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
                while slot.generation == seen {
                    slot.sleepers += 1;
                    slot = self.wake.wait(slot).unwrap_or_else(|p| p.into_inner());
                    slot.sleepers -= 1;
                }
                (slot.job, slot.generation)
            };
            seen = generation;
            let seat = job.and_then(|j| Some((j, self.join(&j, generation)?)));
            if let Some((job, seat)) = seat {
                self.work(&job, generation, seat == 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_count;

    /// The chunks every split is cut into: one per unit while they are few, then equal
    /// chunks the threads share evenly where the units allow it.
    #[test]
    fn chunks_are_equal_and_shared_evenly_where_the_units_allow() {
        assert_eq!(chunk_count(0, 2), 1);
        assert_eq!(chunk_count(5, 2), 5);
        assert_eq!(chunk_count(8, 2), 8);
        // BERT's projections on two threads: 12, 36 and 48 panels
        assert_eq!(chunk_count(12, 2), 6);
        assert_eq!(chunk_count(36, 2), 6);
        assert_eq!(chunk_count(48, 2), 8);
        // a prime count: four per thread, of unequal size
        assert_eq!(chunk_count(13, 2), 8);
        for threads in 1..=8 {
            for total in 1..500 {
                let c = chunk_count(total, threads) as i64;
                assert!((1..=total.max(1)).contains(&c), "{total} on {threads}: {c}");
                assert!(c <= 4 * threads || c == total, "{total} on {threads}: {c}");
                if total > 4 * threads && total % c == 0 {
                    assert_eq!(c % threads, 0, "{total} on {threads}: {c}");
                }
            }
        }
    }
}
