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

use super::{flatten, Executable, Source, Workspace};
use crate::Error;

impl Executable {
    pub(super) fn run_steps(
        &self,
        inputs: &[&[f32]],
        outputs: &mut [&mut [f32]],
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
            if s.len() != info.len() {
                return Err(Error::InvalidArgument(format!(
                    "input %{} of type {} needs {} elements, got {}",
                    info.name,
                    info.ty,
                    info.len(),
                    s.len()
                )));
            }
        }
        for (s, (info, _)) in outputs.iter().zip(&self.outputs) {
            if s.len() != info.len() {
                return Err(Error::InvalidArgument(format!(
                    "output {} of type {} needs {} elements, got {}",
                    info.name,
                    info.ty,
                    info.len(),
                    s.len()
                )));
            }
        }
        if ws.arena_len() < self.arena_len || ws.ptrs.len() < self.max_args {
            return Err(Error::InvalidArgument(
                "the workspace belongs to a smaller executable; make one with workspace()".into(),
            ));
        }
        let arena = ws.arena.as_mut_ptr() as *mut f32;
        let mut address = |src: Source| -> usize {
            match src {
                Source::Input(i) => inputs[i].as_ptr() as usize,
                Source::Constant(c) => self.constants[c].as_f32().as_ptr() as usize,
                Source::Arena(off) => arena.wrapping_add(off) as usize,
                Source::Output(i) => outputs[i].as_mut_ptr() as usize,
            }
        };
        for step in &self.steps {
            for (slot, &src) in ws.ptrs.iter_mut().zip(&step.args) {
                *slot = address(src);
            }
            let start = times.as_ref().map(|_| Instant::now());
            let args = ws.ptrs.as_ptr() as *const *mut f32;
            // Why the calls below are sound (this is the only place native code runs; the
            // invariant is the module doc's). The kernel's every load and store was proven (`Kernel::check`, at lowering and again before codegen) to
            // stay within the declared length of each argument, and lowering checked that
            // each step passes buffers of exactly those lengths. Here: inputs have exactly
            // their declared lengths (checked above); constants hold at least theirs
            // (checked in `assemble`); arena buffers lie at `offset + len <= arena_len
            // <= ws.arena_len()` (memory plan, checked above); a result written in place
            // is the caller's output slice of exactly its type's length (checked above),
            // at least the buffer's (checked in `assemble`). The kernel writes only its
            // `Write` arguments, which lowering restricts to temporaries: arena buffers,
            // which the memory plan never overlaps while live in the same step, and output
            // slices, which are distinct `&mut` borrows (one per result, each result
            // buffer at most one slice), so no written buffer aliases another argument,
            // and the read-only inputs and constants are never written. All slices outlive
            // the call; `ws.ptrs` holds one pointer per argument (max_args checked above)
            // and is not touched during the call.
            // A split call runs disjoint trip ranges of a parallel kernel's top-level
            // loop (whose iterations write disjoint elements, proven independent by
            // lowering) on pool threads and returns only when all are done; every range
            // lies inside the trips the bounds proof covers (the kernel clamps too).
            match (step.split, self.threads) {
                // SAFETY: as argued above; the pool runs disjoint ranges of the trips.
                (Some(trips), Some((pool, threads))) => unsafe {
                    pool.run(step.kernel, args, trips, threads)
                },
                // SAFETY: as argued above, the whole range on this thread.
                _ => unsafe { (step.kernel)(args, 0, step.trips) },
            }
            if let (Some(t), Some(start)) = (times.as_deref_mut(), start) {
                t.push(start.elapsed().as_nanos() as u64);
            }
        }
        for (dst, (info, src)) in outputs.iter_mut().zip(&self.outputs) {
            let n = info.len();
            match *src {
                Source::Input(i) => dst.copy_from_slice(&inputs[i][..n]),
                Source::Constant(c) => dst.copy_from_slice(&self.constants[c].as_f32()[..n]),
                Source::Arena(off) => {
                    let flat: &[f32] = flatten(&ws.arena);
                    dst.copy_from_slice(&flat[off..off + n]);
                }
                // computed in place
                Source::Output(_) => {}
            }
        }
        Ok(())
    }
}
