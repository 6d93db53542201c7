//! The JIT entry: the one place where native code compiled from the loop IR is called,
//! together with the checks that make the call sound.
//!
//! The invariant: a compiled kernel touches only elements its bounds proof covers
//! ([`smelt_ir::loops::Kernel::check`], run at lowering and again before code
//! generation, which translates every access faithfully), that is, for each argument,
//! elements below the argument's declared length, and writes only its `Write`
//! arguments. So a call is sound when every pointer it is handed points at a live buffer
//! of at least that length, no written buffer aliases another argument, and nothing else
//! touches those buffers during the call. [`Executable::run_steps`] checks each of these
//! before the first call (the input and output slices' lengths, the workspace's size),
//! and the rest holds by construction (the memory plan, `assemble`'s checks of the
//! constants); its SAFETY comment gives the argument case by case. A parallel kernel's
//! split calls run on the pool's threads (`pool`, whose module doc states its part), and
//! so do whole copies of a batch (`run_whole_copies`: every step of one copy on one
//! thread, when every step touches the batch, so copies share nothing they write).

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::Instant;

use smelt_ir::diag::Location;
use smelt_ir::loops::Fault;
use smelt_ir::DType;

use super::pool::Split;
use super::{
    CopiesRun, Elements, ElementsMut, ExecStep, Executable, Source, Workspace, MIN_SPLIT_WORK,
};
use crate::Error;

impl Executable {
    pub(super) fn run_steps(
        &self,
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
        ws: &mut Workspace,
        times: Option<&mut Vec<u64>>,
    ) -> Result<(), Error> {
        self.run_steps_of(1, None, inputs, outputs, ws, times)
    }

    /// [`Executable::run_steps`] of a batch of `copies` times the compiled one (more
    /// than 1 only where [`Executable::allow_batch_copies`] allowed it): each step
    /// touching the batch runs once per copy; with `valid_rows`, kernels that stop at a
    /// run's valid rows ([`Executable::padded_rows`]) stop there (else at the compiled
    /// length).
    pub(super) fn run_steps_of(
        &self,
        copies: usize,
        valid_rows: Option<usize>,
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
        ws: &mut Workspace,
        mut times: Option<&mut Vec<u64>>,
    ) -> Result<(), Error> {
        let plan = match (copies, &self.copies) {
            (1, _) => None,
            (0, _) => {
                return Err(Error::InvalidArgument(
                    "a run of 0 copies of the batch".into(),
                ))
            }
            (_, Some(plan)) => Some(plan),
            (_, None) => {
                return Err(Error::InvalidArgument(
                    "this executable runs only the batch it was compiled for".into(),
                ))
            }
        };
        // how many copies of its compiled length a buffer holds in this run
        let times_of = |batched: bool| if batched { copies } else { 1 };
        let input_copies = |i: usize| times_of(plan.is_some_and(|p| p.inputs[i]));
        let output_copies = |i: usize| times_of(plan.is_some_and(|p| p.outputs[i]));
        if inputs.len() != self.inputs.len() {
            return Err(Error::InvalidArgument(format!(
                "expected {} inputs, got {}",
                self.inputs.len(),
                inputs.len()
            )));
        }
        if outputs.len() != self.outputs.len() {
            return Err(Error::InvalidArgument(format!(
                "expected {} outputs, got {}",
                self.outputs.len(),
                outputs.len()
            )));
        }
        for (i, (s, info)) in inputs.iter().zip(&self.inputs).enumerate() {
            let want = info.len().saturating_mul(input_copies(i));
            if s.dtype() != info.ty.dtype || s.len() != want {
                return Err(Error::InvalidArgument(format!(
                    "input %{} of type {} needs {} {} elements, got {} {}",
                    info.name,
                    info.ty,
                    want,
                    info.ty.dtype,
                    s.len(),
                    s.dtype()
                )));
            }
        }
        for (i, (s, (info, _))) in outputs.iter().zip(&self.outputs).enumerate() {
            let want = info.len().saturating_mul(output_copies(i));
            if s.dtype() != info.ty.dtype || s.len() != want {
                return Err(Error::InvalidArgument(format!(
                    "output {} of type {} needs {} {} elements, got {} {}",
                    info.name,
                    info.ty,
                    want,
                    info.ty.dtype,
                    s.len(),
                    s.dtype()
                )));
            }
        }
        let run = self.copies_run(copies, times.is_some());
        if !ws.holds(self, run) {
            return Err(Error::InvalidArgument(format!(
                "the workspace is too small for this executable at {copies} copies of its batch"
            )));
        }
        for (slot, o) in ws.outs.iter_mut().zip(outputs.iter_mut()) {
            let (at, bytes) = o.bytes_mut();
            *slot = (at as usize, bytes);
        }
        let arena = ws
            .arena
            .as_bytes_mut()
            .ok_or_else(|| Error::Unsupported("the workspace's arena is shared".into()))?
            .as_mut_ptr() as *mut f32;
        ws.valid_rows = match (valid_rows, self.padded_rows) {
            (Some(rows), Some(padded)) if rows > padded => {
                return Err(Error::InvalidArgument(format!(
                    "{rows} valid rows, more than the {padded} this executable was compiled for"
                )))
            }
            (Some(rows), _) => i64::try_from(rows).unwrap_or(i64::MAX),
            (None, padded) => padded.map_or(0, |p| i64::try_from(p).unwrap_or(i64::MAX)),
        };
        let valid_rows = &ws.valid_rows as *const i64 as usize;
        let outs = &ws.outs;
        let address = |src: Source| -> usize {
            match src {
                Source::Input(i) => inputs[i].bytes().0 as usize,
                Source::Constant(c) => self.constants[c].as_bytes().as_ptr() as usize,
                Source::Arena(off) => arena.wrapping_add(off) as usize,
                Source::Output(i) => outs[i].0,
                Source::ValidRows => valid_rows,
            }
        };
        // bytes from a batched buffer's copy to the next: its compiled length in the
        // caller's slices, one whole arena in the workspace
        let copy_stride = |src: Source| -> usize {
            match src {
                Source::Input(i) => self.inputs[i].len() * self.inputs[i].ty.dtype.size_bytes(),
                Source::Output(i) => {
                    let info = &self.outputs[i].0;
                    info.len() * info.ty.dtype.size_bytes()
                }
                Source::Arena(_) => self.arena_len * 4,
                // never batched: nothing writes a constant or the valid rows
                Source::Constant(_) | Source::ValidRows => 0,
            }
        };
        // every step touching the batch: each copy's whole run on one thread, the copies
        // shared between the threads (no barrier between steps, one image's working set
        // per core) — unless the run is profiled step by step
        let whole = match (run, plan, self.threads) {
            (CopiesRun::Whole { arenas, .. }, Some(p), Some((pool, threads))) => {
                Some((p, arenas, pool, threads))
            }
            _ => None,
        };
        if let Some((p, arenas, pool, threads)) = whole {
            self.run_whole_copies(
                WholeCopies {
                    plan: p,
                    copies,
                    arenas,
                    address: &address,
                    copy_stride: &copy_stride,
                },
                &mut ws.ptrs,
                pool,
                threads,
            )?;
        } else {
            for (n, step) in self.steps.iter().enumerate() {
                let start = times.as_ref().map(|_| Instant::now());
                if let Some(moves) = plan.and_then(|p| p.steps[n].as_deref()) {
                    self.run_copies_of_step(
                        n,
                        copies,
                        moves,
                        &address,
                        &copy_stride,
                        &mut ws.ptrs,
                    )?;
                    if let (Some(t), Some(start)) = (times.as_deref_mut(), start) {
                        t.push(start.elapsed().as_nanos() as u64);
                    }
                    continue;
                }
                for (slot, &src) in ws.ptrs.iter_mut().zip(&step.args) {
                    *slot = address(src);
                }
                let args = ws.ptrs.as_ptr() as *const *mut u8;
                // Why the calls below are sound (this is the only place native code runs; the
                // invariant is the module doc's). The kernel's every load and store was proven
                // (`Kernel::check`, at lowering and again before codegen) to stay within the
                // declared length of each argument — a load at a run-time index after the
                // generated code has tested the index against the bound the proof covers —
                // and lowering checked that each step passes buffers of exactly those lengths
                // and element types. Here: inputs have exactly their declared element types
                // and lengths (checked above); constants hold at least theirs (checked in
                // `assemble`); the valid rows are the workspace's one `i64`, which nothing
                // writes during the run (a limited loop reads it; any value is safe, since
                // the proof covers every iteration it could allow); arena buffers lie at `offset + len <= arena_len <=
                // ws.arena_len()` (memory plan, checked above); a result written in place is
                // the caller's output slice of exactly its type and length (checked above).
                // The kernel writes only its `Write` arguments, which lowering restricts to
                // temporaries: arena buffers, which the memory plan never overlaps while live
                // in the same step, and output slices, which are distinct `&mut` borrows (one
                // per result, each result buffer at most one slice), so no written buffer
                // aliases another argument, and the read-only inputs and constants are never
                // written. An `i1` output is a `[bool]` and receives only the bytes 0 and 1,
                // the only `i1` values the loop IR computes. All slices outlive the call;
                // `ws.ptrs` holds one pointer per argument (max_args checked above) and is
                // not touched during the call.
                // A split call runs disjoint trip ranges of a parallel kernel's top-level
                // loop (whose iterations write disjoint elements, proven independent by
                // lowering) on pool threads and returns only when all are done; every range
                // lies inside the trips the bounds proof covers (the kernel clamps too).
                let status = match (step.split, self.threads) {
                    // a parallel kernel cannot fault, so there is no status to read
                    (Some(trips), Some((pool, threads))) => {
                        // SAFETY: as argued above; the pool runs disjoint ranges of the trips.
                        unsafe { pool.run(step.kernel, args, trips, threads) };
                        0
                    }
                    // SAFETY: as argued above, the whole range on this thread.
                    _ => unsafe { (step.kernel)(args, 0, step.trips) },
                };
                if status != 0 {
                    return Err(self.fault(n, status, None));
                }
                if let (Some(t), Some(start)) = (times.as_deref_mut(), start) {
                    t.push(start.elapsed().as_nanos() as u64);
                }
            }
        }
        let arena_bytes: &[u8] = ws.arena.as_bytes();
        for (o, (info, src)) in self.outputs.iter().enumerate() {
            let (dst, n) = ws.outs[o];
            let dst = dst as *mut u8;
            // a batched result computed in the arena has a part in each copy of it, the
            // caller's slice holding them one after another; any other comes whole
            let parts = match src {
                Source::Arena(_) => output_copies(o),
                _ => 1,
            };
            let each = n / parts;
            for r in 0..parts {
                let from: &[u8] = match *src {
                    // SAFETY: input `i` is a live slice of that many bytes (its length was
                    // checked above); it outlives this function.
                    Source::Input(i) => unsafe {
                        let (at, bytes) = inputs[i].bytes();
                        std::slice::from_raw_parts(at, bytes)
                    },
                    Source::Constant(c) => self.constants[c].as_bytes(),
                    Source::Arena(off) => {
                        let at = (off + r * self.arena_len) * 4;
                        &arena_bytes[at.min(arena_bytes.len())..]
                    }
                    // computed in place
                    Source::Output(_) => continue,
                    // no result is held there
                    Source::ValidRows => &[],
                };
                let Some(from) = from.get(..each) else {
                    return Err(Error::Unsupported(format!(
                        "output {} has {} bytes to copy from, needs {each}",
                        info.name,
                        from.len()
                    )));
                };
                check_i1(info, from)?;
                // SAFETY: `dst` is the caller's output slice of exactly `n` bytes (checked
                // above) and `r · each + each <= n`, borrowed mutably for this call and
                // distinct from `from` (inputs, constants and the arena are other memory);
                // for an `i1` output every byte is 0 or 1 (checked just above), so the
                // `[bool]` stays valid.
                unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), dst.add(r * each), each) };
            }
        }
        Ok(())
    }

    /// Runs step `n`, which touches the batch, once per copy of the batch: copy `r`'s
    /// pointers are the step's buffers moved `r` copies further where `moves` says so
    /// (`copy_stride` bytes per copy), held in `ptrs` one argument array per copy. A
    /// kernel that can fault runs its copies one by one on this thread (the first fault
    /// stops the run, naming the copy); any other on the pool when there is one and the
    /// copies together are worth it.
    fn run_copies_of_step(
        &self,
        n: usize,
        copies: usize,
        moves: &[bool],
        address: &dyn Fn(Source) -> usize,
        copy_stride: &dyn Fn(Source) -> usize,
        ptrs: &mut [usize],
    ) -> Result<(), Error> {
        let step = &self.steps[n];
        let width = self.max_args;
        for r in 0..copies {
            copy_args(step, moves, r, address, copy_stride, &mut ptrs[r * width..]);
        }
        let args = ptrs.as_ptr() as *const *mut u8;
        let stride = width * std::mem::size_of::<usize>();
        // Why the calls below are sound: `run_steps_of`'s argument for one call, for each
        // copy. Copy `r` of a batched buffer is a buffer of the length the kernel was
        // proven against: in the caller's input and result slices (holding `copies`
        // compiled lengths, checked there) at `r` lengths from the start, in the
        // workspace (holding `copies` arenas, checked there) at the buffer's offset in
        // arena `r`, where the memory plan's layout repeats, so written buffers of one
        // copy alias nothing another argument of that copy names. Copies write disjoint
        // memory: each writes only batched buffers (whatever a step touching the batch
        // writes holds the batch), each in its own copy; buffers without the batch are
        // read-only inputs, constants, or temporaries no step touching the batch writes.
        let pooled = match (step.can_fault, self.threads) {
            (false, Some((pool, threads))) => {
                let info = &self.step_info[step.info];
                let work = info.flops.saturating_add(info.bytes);
                let worth =
                    step.split.is_some() || work.saturating_mul(copies as u64) >= MIN_SPLIT_WORK;
                worth.then_some((pool, threads))
            }
            _ => None,
        };
        if let Some((pool, threads)) = pooled {
            let split = match step.split {
                Some(trips) => Split::Trips(trips),
                None => Split::Whole(step.trips),
            };
            // SAFETY: as argued above; the kernel cannot fault, the pool runs every
            // copy's trips once, disjoint ranges of one copy at once at most.
            unsafe { pool.run_copies(step.kernel, args, stride, copies as i64, split, threads) };
            return Ok(());
        }
        for r in 0..copies {
            // SAFETY: as argued above, copy `r`'s whole range on this thread.
            let status = unsafe { (step.kernel)(args.add(r * width), 0, step.trips) };
            if status != 0 {
                return Err(self.fault(n, status, Some(r)));
            }
        }
        Ok(())
    }

    /// Runs the copies of the batch when every step touches it (`run.plan`), each copy's
    /// steps in order on one thread and the copies spread over the pool's `threads`. In
    /// `ptrs` (see [`Executable::arg_slots`]) go first every step's argument addresses
    /// for copy 0 in arena 0 and how many bytes each moves per copy and per arena; then
    /// one job per copy takes a free arena (its own, `r`, when there are as many arenas
    /// as copies), writes that arena's argument arrays for its copy and runs them in
    /// order. A fault stops its copy; the first faulting copy's error is returned.
    fn run_whole_copies(
        &self,
        run: WholeCopies<'_>,
        ptrs: &mut [usize],
        pool: &super::pool::ThreadPool,
        threads: usize,
    ) -> Result<(), Error> {
        let table = self.steps.len() * self.max_args;
        let (bases, rest) = ptrs.split_at_mut(table);
        let (per_copy, rest) = rest.split_at_mut(table);
        let (per_arena, _) = rest.split_at_mut(table);
        for (n, step) in self.steps.iter().enumerate() {
            let moves = run.plan.steps[n].as_deref().unwrap_or(&[]);
            let at = n * self.max_args;
            for (k, (src, base, stride)) in
                moving_args(step, moves, run.address, run.copy_stride).enumerate()
            {
                bases[at + k] = base;
                // copy `r` in arena `a`: its own part of the caller's batched slices,
                // and arena `a` of the workspace
                (per_copy[at + k], per_arena[at + k]) = match src {
                    Source::Arena(_) => (0, stride),
                    _ => (stride, 0),
                };
            }
        }
        let free = (run.arenas < run.copies)
            .then(|| std::sync::Mutex::new((0..run.arenas).rev().collect::<Vec<usize>>()));
        let ptrs = ptrs.as_mut_ptr();
        let jobs: Vec<CopyJob> = (0..run.copies)
            .map(|r| CopyJob {
                exe: self,
                ptrs,
                free_arenas: free.as_ref(),
                copy: r,
                fault_step: AtomicUsize::new(0),
                fault_status: AtomicI32::new(0),
            })
            .collect();
        // Why this is sound: every argument array a job writes is `run_steps_of`'s for one
        // call of one copy (`run_copies_of_step`'s argument: copy `r` of a batched buffer
        // is a buffer of the proven length in the caller's slices, and a buffer of the
        // arena moved to arena `a`, which the workspace holds — `holds(run)` was checked —
        // where the memory plan's layout repeats). With every step touching the batch, a
        // buffer without the batch is a read-only input or a constant, so copy `r`'s
        // steps read and write only copy `r`'s parts of the caller's slices and the arena
        // it holds: running each copy's steps in order on one thread, copies at once on
        // different threads in different arenas, keeps every dependence. An arena is
        // held by one job at a time (taken from and given back to the free list under its
        // lock; with one arena per copy, copy `r` holds arena `r`), and only its holder
        // writes that arena's argument arrays; the first three tables are only read
        // during the pool call. At most `threads` jobs run at once (the caller and at
        // most `threads - 1` helpers), and there are `min(threads, copies)` arenas, so a
        // job always finds one free. A job's kernels run whole on its thread (`0..trips`:
        // a parallel kernel's whole range), and faults are recorded in the job's own
        // record, so the trampoline returns 0 as the pool requires. `ptrs`, `free` and
        // `jobs` outlive the pool call, which returns when all jobs are done.
        // SAFETY: as argued above; each job record is live and its arrays sound.
        unsafe {
            pool.run_copies(
                run_copy_job,
                jobs.as_ptr() as *const *mut u8,
                std::mem::size_of::<CopyJob>(),
                run.copies as i64,
                Split::Whole(1),
                threads,
            )
        };
        for (r, job) in jobs.iter().enumerate() {
            match job.fault_status.load(Ordering::Acquire) {
                0 => {}
                NO_FREE_ARENA => {
                    return Err(Error::Unsupported(format!(
                        "copy {r} of the batch found no free arena of the run's {}",
                        run.arenas
                    )))
                }
                status => {
                    let n = job.fault_step.load(Ordering::Acquire);
                    return Err(self.fault(n, status, Some(r)));
                }
            }
        }
        Ok(())
    }

    /// The error of step `n` ending with fault `status` (in copy `copy` of the batch).
    fn fault(&self, n: usize, status: i32, copy: Option<usize>) -> Error {
        let info = &self.step_info[self.steps[n].info];
        let what = Fault::from_status(status).map_or("an unknown fault", Fault::describe);
        Error::InvalidArgument(format!(
            "run stopped at step {n} ({}, kernel {}{}{}): {what} in the input data",
            info.op,
            info.kernel,
            match &info.loc {
                Location::Unknown => String::new(),
                loc => format!(", at {loc}"),
            },
            match copy {
                Some(r) => format!(", copy {r} of the batch"),
                None => String::new(),
            }
        ))
    }
}

/// A run of whole copies of the batch ([`Executable::run_whole_copies`]).
struct WholeCopies<'a> {
    /// Which buffers of each step hold the batch.
    plan: &'a super::batch::BatchCopies,
    copies: usize,
    /// Arenas the workspace holds for the run ([`CopiesRun::Whole`]).
    arenas: usize,
    /// A buffer's address for copy 0 in arena 0.
    address: &'a dyn Fn(Source) -> usize,
    /// Bytes from a batched buffer's copy to the next.
    copy_stride: &'a dyn Fn(Source) -> usize,
}

/// Each argument of `step`: where it is, its address (`address`), and the bytes it
/// moves from one copy of the batch to the next — `copy_stride` where `moves` says it
/// holds the batch, else 0.
fn moving_args<'s>(
    step: &'s ExecStep,
    moves: &'s [bool],
    address: &'s dyn Fn(Source) -> usize,
    copy_stride: &'s dyn Fn(Source) -> usize,
) -> impl Iterator<Item = (Source, usize, usize)> + 's {
    step.args.iter().enumerate().map(move |(k, &src)| {
        let moved = moves.get(k).copied().unwrap_or(false);
        (src, address(src), if moved { copy_stride(src) } else { 0 })
    })
}

/// Writes step `step`'s argument array for copy `r` of the batch into `slots` (see
/// [`moving_args`]).
fn copy_args(
    step: &ExecStep,
    moves: &[bool],
    r: usize,
    address: &dyn Fn(Source) -> usize,
    copy_stride: &dyn Fn(Source) -> usize,
    slots: &mut [usize],
) {
    for (slot, (_, base, stride)) in
        slots
            .iter_mut()
            .zip(moving_args(step, moves, address, copy_stride))
    {
        *slot = base.wrapping_add(r * stride);
    }
}

/// One copy's whole run, the record [`run_copy_job`] reads, and the fault that stopped
/// it (status 0: none).
struct CopyJob<'a> {
    exe: &'a Executable,
    /// The run's argument tables and arrays (see [`Executable::run_whole_copies`]).
    ptrs: *mut usize,
    /// The arenas no job holds, when there are fewer arenas than copies (else copy `r`
    /// runs in arena `r`).
    free_arenas: Option<&'a std::sync::Mutex<Vec<usize>>>,
    copy: usize,
    fault_step: AtomicUsize,
    fault_status: AtomicI32,
}

/// The status a [`CopyJob`] records when it finds no free arena (no fault's status: those
/// are positive).
const NO_FREE_ARENA: i32 = -1;

/// Runs the copy of the [`CopyJob`] at `job`: takes an arena, writes its argument arrays
/// for the copy, runs the steps in order, each whole, stopping at a fault, which it
/// records; gives the arena back. Always returns 0.
///
/// # Safety
/// `job` points at a live `CopyJob` whose tables are sound for each step's kernel and
/// whose arena arrays only the arena's holder writes (see
/// [`Executable::run_whole_copies`]).
unsafe extern "C" fn run_copy_job(job: *const *mut u8, _lo: i64, _hi: i64) -> i32 {
    // SAFETY: the caller's: a live job record.
    let job = unsafe { &*(job as *const CopyJob<'_>) };
    fn lock(free: &std::sync::Mutex<Vec<usize>>) -> std::sync::MutexGuard<'_, Vec<usize>> {
        // the list is consistent whatever a panicking holder did: push and pop are whole
        free.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
    let arena = match job.free_arenas {
        None => Some(job.copy),
        Some(free) => lock(free).pop(),
    };
    let Some(arena) = arena else {
        job.fault_status.store(NO_FREE_ARENA, Ordering::Release);
        return 0;
    };
    let table = job.exe.steps.len() * job.exe.max_args;
    // SAFETY: the caller's: the three tables are read-only during the run, and the
    // arrays of the arena this job holds are written by it alone.
    let (bases, per_copy, per_arena, arrays) = unsafe {
        (
            std::slice::from_raw_parts(job.ptrs, table),
            std::slice::from_raw_parts(job.ptrs.add(table), table),
            std::slice::from_raw_parts(job.ptrs.add(2 * table), table),
            std::slice::from_raw_parts_mut(job.ptrs.add((3 + arena) * table), table),
        )
    };
    for (i, slot) in arrays.iter_mut().enumerate() {
        *slot = bases[i]
            .wrapping_add(job.copy.wrapping_mul(per_copy[i]))
            .wrapping_add(arena.wrapping_mul(per_arena[i]));
    }
    let width = job.exe.max_args;
    for (n, step) in job.exe.steps.iter().enumerate() {
        // SAFETY: the caller's: this copy's argument array for step `n` in its arena.
        let status = unsafe {
            (step.kernel)(
                arrays.as_ptr().add(n * width) as *const *mut u8,
                0,
                step.trips,
            )
        };
        if status != 0 {
            job.fault_step.store(n, Ordering::Release);
            job.fault_status.store(status, Ordering::Release);
            break;
        }
    }
    if let Some(free) = job.free_arenas {
        lock(free).push(arena);
    }
    0
}

/// Refuses a result of element type `i1` holding a byte other than 0 and 1 (the caller's
/// `[bool]` would not be valid).
fn check_i1(info: &super::TensorInfo, bytes: &[u8]) -> Result<(), Error> {
    if info.ty.dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
        return Err(Error::Unsupported(format!(
            "output {} holds a byte that is not an i1",
            info.name
        )));
    }
    Ok(())
}
