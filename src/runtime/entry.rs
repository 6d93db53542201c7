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
//! split calls run on the pool's threads (`pool`, whose module doc states its part).

#![allow(unsafe_code)]

use std::time::Instant;

use smelt_ir::diag::Location;
use smelt_ir::loops::Fault;
use smelt_ir::DType;

use super::{Elements, ElementsMut, Executable, Source, Workspace};
use crate::Error;

impl Executable {
    pub(super) fn run_steps(
        &self,
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
        ws: &mut Workspace,
        mut times: Option<&mut Vec<u64>>,
    ) -> Result<(), Error> {
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
        for (s, info) in inputs.iter().zip(&self.inputs) {
            if s.dtype() != info.ty.dtype || s.len() != info.len() {
                return Err(Error::InvalidArgument(format!(
                    "input %{} of type {} needs {} {} elements, got {} {}",
                    info.name,
                    info.ty,
                    info.len(),
                    info.ty.dtype,
                    s.len(),
                    s.dtype()
                )));
            }
        }
        for (s, (info, _)) in outputs.iter().zip(&self.outputs) {
            if s.dtype() != info.ty.dtype || s.len() != info.len() {
                return Err(Error::InvalidArgument(format!(
                    "output {} of type {} needs {} {} elements, got {} {}",
                    info.name,
                    info.ty,
                    info.len(),
                    info.ty.dtype,
                    s.len(),
                    s.dtype()
                )));
            }
        }
        if ws.arena_len() < self.arena_len
            || ws.ptrs.len() < self.max_args
            || ws.outs.len() < self.outputs.len()
        {
            return Err(Error::InvalidArgument(
                "the workspace belongs to a smaller executable; make one with workspace()".into(),
            ));
        }
        for (slot, o) in ws.outs.iter_mut().zip(outputs.iter_mut()) {
            let (at, bytes) = o.bytes_mut();
            *slot = (at as usize, bytes);
        }
        let arena = ws.arena.as_mut_ptr() as *mut f32;
        let outs = &ws.outs;
        let address = |src: Source| -> usize {
            match src {
                Source::Input(i) => inputs[i].bytes().0 as usize,
                Source::Constant(c) => self.constants[c].as_bytes().as_ptr() as usize,
                Source::Arena(off) => arena.wrapping_add(off) as usize,
                Source::Output(i) => outs[i].0,
            }
        };
        for (n, step) in self.steps.iter().enumerate() {
            for (slot, &src) in ws.ptrs.iter_mut().zip(&step.args) {
                *slot = address(src);
            }
            let start = times.as_ref().map(|_| Instant::now());
            let args = ws.ptrs.as_ptr() as *const *mut u8;
            // Why the calls below are sound (this is the only place native code runs; the
            // invariant is the module doc's). The kernel's every load and store was proven
            // (`Kernel::check`, at lowering and again before codegen) to stay within the
            // declared length of each argument — a load at a run-time index after the
            // generated code has tested the index against the bound the proof covers —
            // and lowering checked that each step passes buffers of exactly those lengths
            // and element types. Here: inputs have exactly their declared element types
            // and lengths (checked above); constants hold at least theirs (checked in
            // `assemble`); arena buffers lie at `offset + len <= arena_len <=
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
                let info = &self.step_info[step.info];
                let what = Fault::from_status(status).map_or("an unknown fault", Fault::describe);
                return Err(Error::InvalidArgument(format!(
                    "run stopped at step {n} ({}, kernel {}{}): {what} in the input data",
                    info.op,
                    info.kernel,
                    match &info.loc {
                        Location::Unknown => String::new(),
                        loc => format!(", at {loc}"),
                    }
                )));
            }
            if let (Some(t), Some(start)) = (times.as_deref_mut(), start) {
                t.push(start.elapsed().as_nanos() as u64);
            }
        }
        let arena_bytes: &[u8] = bytemuck::cast_slice(&ws.arena);
        for (o, (info, src)) in self.outputs.iter().enumerate() {
            let (dst, n) = ws.outs[o];
            let dst = dst as *mut u8;
            let from: &[u8] = match *src {
                // SAFETY: input `i` is a live slice of that many bytes (its length was
                // checked above); it outlives this function.
                Source::Input(i) => unsafe {
                    let (at, bytes) = inputs[i].bytes();
                    std::slice::from_raw_parts(at, bytes)
                },
                Source::Constant(c) => self.constants[c].as_bytes(),
                Source::Arena(off) => &arena_bytes[(off * 4).min(arena_bytes.len())..],
                // computed in place
                Source::Output(_) => continue,
            };
            let Some(from) = from.get(..n) else {
                return Err(Error::Unsupported(format!(
                    "output {} has {} bytes to copy from, needs {n}",
                    info.name,
                    from.len()
                )));
            };
            if info.ty.dtype == DType::Bool && from.iter().any(|&b| b > 1) {
                return Err(Error::Unsupported(format!(
                    "output {} holds a byte that is not an i1",
                    info.name
                )));
            }
            // SAFETY: `dst` is the caller's output slice of exactly `n` bytes (checked
            // above), borrowed mutably for this call and distinct from `from` (inputs,
            // constants and the arena are other memory); for an `i1` output every byte
            // is 0 or 1 (checked just above), so the `[bool]` stays valid.
            unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), dst, n) };
        }
        Ok(())
    }
}
