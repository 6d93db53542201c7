//! Running independent, memory-bound jobs (weight folding, packing) on the machine's cores.

/// Runs every `(size, job)`, spread over up to `available_parallelism()` threads (the
/// calling thread included) so that each gets about the same total size, largest jobs
/// first, and returns the results in the jobs' original order. A panicking job panics the
/// caller.
///
/// The jobs here write large fresh buffers: their time is memory writes and page faults,
/// which scale with cores, and their results do not depend on the thread that ran them.
pub(crate) fn run_balanced<J, R>(jobs: Vec<(usize, J)>, run: impl Fn(J) -> R + Sync) -> Vec<R>
where
    J: Send,
    R: Send,
{
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut indexed: Vec<(usize, usize, J)> = jobs
        .into_iter()
        .enumerate()
        .map(|(i, (size, job))| (size, i, job))
        .collect();
    indexed.sort_by_key(|&(size, i, _)| (std::cmp::Reverse(size), i));
    let mut lanes: Vec<(usize, Vec<(usize, J)>)> = (0..threads.clamp(1, indexed.len().max(1)))
        .map(|_| (0, Vec::new()))
        .collect();
    for (size, i, job) in indexed {
        if let Some(lane) = lanes.iter_mut().min_by_key(|lane| lane.0) {
            lane.0 += size;
            lane.1.push((i, job));
        }
    }
    let run = &run;
    let mut done: Vec<(usize, R)> = std::thread::scope(|s| {
        let mut lanes = lanes.into_iter().map(|(_, lane)| lane);
        let mine = lanes.next().unwrap_or_default();
        let others: Vec<_> = lanes
            .map(|lane| {
                s.spawn(move || {
                    lane.into_iter()
                        .map(|(i, j)| (i, run(j)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut done: Vec<(usize, R)> = mine.into_iter().map(|(i, j)| (i, run(j))).collect();
        for handle in others {
            done.extend(
                handle
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p)),
            );
        }
        done
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::run_balanced;

    #[test]
    fn results_come_back_in_job_order() {
        let jobs: Vec<(usize, u64)> = (0..17).map(|i| ((i * 7919) % 13, i as u64)).collect();
        let out = run_balanced(jobs, |j| j * j);
        assert_eq!(out, (0..17u64).map(|j| j * j).collect::<Vec<_>>());
        assert!(run_balanced(Vec::<(usize, u8)>::new(), |j| j).is_empty());
    }
}
