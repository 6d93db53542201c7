//! The memory plan: offsets of every temporary buffer inside one arena, reusing space
//! between buffers whose lifetimes (first to last step using them) do not overlap.

use super::{BufferKind, Program};

/// Where every temporary buffer lives in the per-run arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Offset of each buffer in the arena, in 4-byte words (an `f32` element each);
    /// `None` for buffers that are not temporaries (inputs, weights, constants).
    pub offsets: Vec<Option<usize>>,
    /// Arena length in 4-byte words.
    pub arena_len: usize,
}

/// Offsets are multiples of this many words (64 bytes: one cache line).
const ALIGN: usize = 16;

/// Plans the arena for `prog`. With `keep_intermediates`, no two temporaries share space
/// (for verification and profiling); otherwise a temporary reuses space freed by
/// temporaries whose last use is before its first use. Program outputs stay live to the end.
pub fn plan_memory(prog: &Program, keep_intermediates: bool) -> MemoryPlan {
    let n = prog.buffers.len();
    let end = prog.steps.len();
    let mut first = vec![usize::MAX; n];
    let mut last = vec![0usize; n];
    for (s, step) in prog.steps.iter().enumerate() {
        for b in &step.args {
            let i = b.0 as usize;
            first[i] = first[i].min(s);
            last[i] = last[i].max(s);
        }
    }
    for o in &prog.outputs {
        last[o.buffer.0 as usize] = end;
    }
    let mut order: Vec<usize> = (0..n)
        .filter(|&i| matches!(prog.buffers[i].kind, BufferKind::Temp))
        .collect();
    for &i in &order {
        if first[i] == usize::MAX {
            first[i] = 0;
            last[i] = end;
        }
    }
    order.sort_by_key(|&i| (first[i], i));
    let mut offsets = vec![None; n];
    // live: (offset, padded len, last use), kept sorted by offset
    let mut live: Vec<(usize, usize, usize)> = Vec::new();
    let mut arena_len = 0;
    for i in order {
        let words = prog.buffers[i].bytes().div_ceil(4);
        let len = words.div_ceil(ALIGN).max(1) * ALIGN;
        if !keep_intermediates {
            live.retain(|&(_, _, l)| l >= first[i]);
        }
        let mut at = 0;
        for &(off, l, _) in &live {
            if off >= at + len {
                break;
            }
            at = at.max(off + l);
        }
        let pos = live.partition_point(|&(off, _, _)| off < at);
        live.insert(pos, (at, len, last[i]));
        offsets[i] = Some(at);
        arena_len = arena_len.max(at + len);
    }
    MemoryPlan { offsets, arena_len }
}
