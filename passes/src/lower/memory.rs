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
/// A buffer placed inside another ([`BufferKind::Within`]) lives at its offset in the
/// temporary it ultimately lies in, which is live over every use of either.
pub fn plan_memory(prog: &Program, keep_intermediates: bool) -> MemoryPlan {
    let n = prog.buffers.len();
    let end = prog.steps.len();
    // the temporary each buffer lies in, and where (in elements of the buffer's type)
    let root: Vec<(usize, usize)> = (0..n).map(|i| placed_in(prog, i)).collect();
    let mut first = vec![usize::MAX; n];
    let mut last = vec![0usize; n];
    for (s, step) in prog.steps.iter().enumerate() {
        for b in &step.args {
            let i = root[b.0 as usize].0;
            first[i] = first[i].min(s);
            last[i] = last[i].max(s);
        }
    }
    for o in &prog.outputs {
        last[root[o.buffer.0 as usize].0] = end;
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
    for (i, &(r, at)) in root.iter().enumerate() {
        if r != i {
            let bytes = at * prog.buffers[i].dtype.size_bytes();
            offsets[i] = offsets[r].map(|o| o + bytes / 4);
        }
    }
    MemoryPlan { offsets, arena_len }
}

/// The buffer `i` lies in at the end of its chain of [`BufferKind::Within`] parents
/// (itself when it is none), with `i`'s first element's position there. Lowering makes
/// every parent a temporary created before its children's concatenation ends, so the
/// chain is short and ends; a chain longer than the buffers (never made) stops.
fn placed_in(prog: &Program, mut i: usize) -> (usize, usize) {
    let mut at = 0;
    for _ in 0..prog.buffers.len() {
        match prog.buffers[i].kind {
            BufferKind::Within { parent, offset } => {
                at += offset;
                i = parent.0 as usize;
            }
            _ => break,
        }
    }
    (i, at)
}
