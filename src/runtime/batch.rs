//! The batch as a run-time extent: an executable compiled for a batch of `B` runs any
//! batch of `n·B` by running each kernel that touches the batch once per *copy* (each
//! copy `B` elements of the batch), with its batched pointers moved one copy further each
//! time. Nothing is recompiled and no kernel changes: the bounds proof of a kernel holds
//! for copy `r` by translation, since copy `r` of each batched buffer is a buffer of the
//! length the kernel was proven against.
//!
//! Which steps touch the batch follows from the inputs: a buffer holds the batch when it
//! is a batched input or a step touching the batch writes it, and a step touches the
//! batch when any of its buffers holds it — a fixed point, so a step that fills part of a
//! batched result from constants touches it too. Where copy `r` of a batched buffer
//! lives: the caller's input and result slices hold the copies one after another; a
//! temporary's copy `r` is in copy `r` of the whole arena (the workspace holds `n`
//! arenas, laid out alike), so the memory plan's proof that live buffers never overlap
//! holds in each copy. A step touching no batched buffer runs once and writes only
//! buffers no copy reads differently (arena copy 0).
//!
//! That the copies are the batch, exactly, is the caller's to know: it holds when the
//! model computes each element of the batch on its own (`smelt_ir::batch::batch_axes`
//! proves it; [`crate::DynamicExecutable`] asks for copies only of a model it proved).

use smelt_ir::loops::{Access, Kernel};
use smelt_passes::lower::Program;

/// What deciding a batch's copies needs of a program, kept by its executable.
pub(super) struct BatchFlow {
    /// Per step: its kernel (an index into the program's kernels) and argument buffers.
    steps: Vec<(usize, Vec<u32>)>,
    /// Per buffer: the input it is, if one.
    input_of: Vec<Option<usize>>,
    /// Per result: its buffer.
    outputs: Vec<u32>,
    /// Why no batch can run in copies at all, when that is so.
    refusal: Option<String>,
}

/// Which inputs, results and steps hold the batch, once copies are allowed.
#[derive(Clone, Debug)]
pub(super) struct BatchCopies {
    /// The batch of one copy: the leading size the executable was compiled for.
    pub batch: usize,
    /// Per step: whether it touches the batch (runs once per copy), and then per
    /// argument whether its pointer moves from copy to copy.
    pub steps: Vec<Option<Vec<bool>>>,
    /// Per input: whether it holds the batch.
    pub inputs: Vec<bool>,
    /// Per result: whether it holds the batch.
    pub outputs: Vec<bool>,
}

impl BatchFlow {
    /// The flow of `program`; `kept` when every intermediate keeps its memory for the
    /// caller to read (one arena's worth: copies would have nowhere to show theirs).
    pub(super) fn of(program: &Program, kept: bool) -> BatchFlow {
        BatchFlow {
            steps: program
                .steps
                .iter()
                .map(|s| (s.kernel, s.args.iter().map(|b| b.0).collect()))
                .collect(),
            input_of: program
                .buffers
                .iter()
                .map(|b| match b.kind {
                    smelt_passes::lower::BufferKind::Input(k) => Some(k),
                    _ => None,
                })
                .collect(),
            outputs: program.outputs.iter().map(|p| p.buffer.0).collect(),
            refusal: kept.then(|| "its intermediates are kept for the caller".to_string()),
        }
    }

    /// Which steps, inputs and results hold the batch when input `i` does exactly when
    /// `batched_inputs[i]` (`kernels` are the program's); or why copies cannot run.
    pub(super) fn copies(
        &self,
        kernels: &[Kernel],
        batch: usize,
        batched_inputs: &[bool],
    ) -> Result<BatchCopies, String> {
        if let Some(why) = &self.refusal {
            return Err(why.clone());
        }
        let mut batched: Vec<bool> = self
            .input_of
            .iter()
            .map(|k| k.is_some_and(|k| batched_inputs.get(k).copied().unwrap_or(false)))
            .collect();
        let mut touches = vec![false; self.steps.len()];
        loop {
            let mut changed = false;
            for (step, (kernel, args)) in self.steps.iter().enumerate() {
                if touches[step] || !args.iter().any(|&b| batched[b as usize]) {
                    continue;
                }
                touches[step] = true;
                changed = true;
                let kernel = kernels
                    .get(*kernel)
                    .ok_or_else(|| format!("step {step} has no kernel"))?;
                for (&b, arg) in args.iter().zip(&kernel.args) {
                    if arg.access == Access::Write {
                        batched[b as usize] = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        let steps = self
            .steps
            .iter()
            .zip(&touches)
            .map(|((_, args), &t)| t.then(|| args.iter().map(|&b| batched[b as usize]).collect()))
            .collect();
        Ok(BatchCopies {
            batch,
            steps,
            inputs: batched_inputs.to_vec(),
            outputs: self.outputs.iter().map(|&b| batched[b as usize]).collect(),
        })
    }
}
