//! Running independent, memory-bound jobs (weight packing, transforms) on the machine's
//! cores, while the caller keeps working.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A job: computes one result from data borrowed for `'a`.
pub(crate) type Job<'a, R> = Box<dyn FnOnce() -> R + Send + 'a>;

/// Where [`overlapped`]'s body submits jobs. Dropping it (when the body returns, or
/// unwinds) closes the queue: the helpers then finish what is left and stop.
pub(crate) struct Overlap<'a, R> {
    shared: Arc<Shared<'a, R>>,
    submitted: usize,
}

struct Shared<'a, R> {
    state: Mutex<State<'a, R>>,
    ready: Condvar,
}

struct State<'a, R> {
    /// (size, submission index, job), run front first.
    queue: VecDeque<(usize, usize, Job<'a, R>)>,
    closed: bool,
}

impl<'a, R> Shared<'a, R> {
    fn lock(&self) -> MutexGuard<'_, State<'a, R>> {
        // a job panicking outside the lock cannot poison it; take the state regardless
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs queued jobs until the queue is closed and empty (waiting for more while it
    /// is open when `wait`), returning (submission index, result) pairs.
    fn work(&self, wait: bool) -> Vec<(usize, R)> {
        let mut done = Vec::new();
        loop {
            let mut state = self.lock();
            let job = loop {
                if let Some(job) = state.queue.pop_front() {
                    break Some(job);
                }
                if state.closed || !wait {
                    break None;
                }
                state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
            };
            drop(state);
            match job {
                Some((_, i, job)) => done.push((i, job())),
                None => return done,
            }
        }
    }
}

impl<'a, R> Overlap<'a, R> {
    /// Queues `job` (of about `size` bytes of output); a helper thread starts it as soon
    /// as it is free.
    pub(crate) fn submit(&mut self, size: usize, job: Job<'a, R>) {
        let mut state = self.shared.lock();
        state.queue.push_back((size, self.submitted, job));
        self.submitted += 1;
        drop(state);
        self.shared.ready.notify_one();
    }
}

impl<R> Drop for Overlap<'_, R> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.closed = true;
        // what is left is shared by every thread: largest first, so that no thread is
        // left with one big job at the end
        state
            .queue
            .make_contiguous()
            .sort_by_key(|&(size, i, _)| (std::cmp::Reverse(size), i));
        drop(state);
        self.shared.ready.notify_all();
    }
}

/// Runs `body` with an [`Overlap`] to submit jobs to: `available_parallelism() − 1`
/// helper threads run them while `body` goes on, then the calling thread helps with
/// what is left. Returns `body`'s result and every job's result, in submission order. A
/// panicking job panics the caller.
///
/// Lowering submits the weight packing this way: the packers write large fresh buffers
/// (memory writes and page faults, which scale with cores) and need nothing from the
/// kernels being built, so on two cores they run beside the rest of lowering instead
/// of after it. Results do not depend on the thread that computed them.
pub(crate) fn overlapped<'a, R: Send + 'a, T>(
    body: impl FnOnce(Overlap<'a, R>) -> T,
) -> (T, Vec<R>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            closed: false,
        }),
        ready: Condvar::new(),
    });
    let helpers = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let (out, mut done) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..helpers)
            .map(|_| {
                let shared = shared.clone();
                s.spawn(move || shared.work(true))
            })
            .collect();
        let out = body(Overlap {
            shared: shared.clone(),
            submitted: 0,
        });
        let mut done = shared.work(false);
        for handle in handles {
            done.extend(
                handle
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p)),
            );
        }
        (out, done)
    });
    done.sort_by_key(|(i, _)| *i);
    (out, done.into_iter().map(|(_, r)| r).collect())
}

#[cfg(test)]
mod tests {
    use super::overlapped;

    #[test]
    fn results_come_back_in_submission_order() {
        let data: Vec<u64> = (0..17).collect();
        let (sum, out) = overlapped(|mut pool| {
            for x in &data {
                pool.submit(((x * 7919) % 13) as usize, Box::new(move || x * x));
            }
            data.iter().sum::<u64>()
        });
        assert_eq!(sum, 136);
        assert_eq!(out, data.iter().map(|j| j * j).collect::<Vec<_>>());
        let ((), none) = overlapped(|_: super::Overlap<'_, u8>| ());
        assert!(none.is_empty());
    }

    #[test]
    fn a_panicking_body_still_stops_the_helpers() {
        let caught = std::panic::catch_unwind(|| {
            overlapped(|mut pool| {
                pool.submit(1, Box::new(|| 1u8));
                panic!("lowering failed");
            })
        });
        assert!(caught.is_err());
    }
}
