//! Zero-copy weights: the model file is read once into an aligned buffer and large float
//! initializers become aligned windows of it, so the importer copies no weight data.
//!
//! Fresh memory is what loading costs on the reference machine: every first touch of a
//! page is a fault (measured ≈0.6 ms per MB, and faults do not overlap across threads),
//! far more than copying warm memory (≈0.2 ms per MB). Reading the file touches its 100 MB (ResNet-50) once; copying each
//! weight into its own aligned buffer would touch another 100 MB. Instead, after
//! decoding, the raw bytes of each large float initializer are moved *down* inside the
//! file buffer to the next 64-byte boundary (`copy_within` on warm pages) and the weight
//! is a window of that buffer. Moving down in file order never overwrites bytes not yet
//! moved, because each tensor's destination starts at or before its own start.

use std::collections::HashMap;

use bytes::Bytes;
use prost::Message;
use smelt_ir::AlignedBuf;

use super::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};
use super::tensor::dtype;

/// Float initializers smaller than this are copied into their own buffer: a window keeps
/// the whole file alive, which only pays for weights worth the sharing.
const MIN_WINDOW_BYTES: usize = 64 * 1024;

/// A decoded model and, by index in `graph.initializer`, the aligned windows holding the
/// data of its large float initializers (their `raw_data` views the same bytes).
pub struct AlignedModel {
    /// The decoded model.
    pub model: ModelProto,
    /// Initializer index → its data, a 64-byte-aligned window of the file buffer.
    pub windows: HashMap<usize, AlignedBuf>,
}

/// Decodes the model held in `file` (an owned buffer, e.g. the file read into
/// [`AlignedBuf::zeroed`]) and aligns its large float initializers in place.
pub fn decode(file: AlignedBuf) -> Result<AlignedModel, prost::DecodeError> {
    let base = file.share();
    let mut model = ModelProto::decode(Bytes::from_owner(base.clone()))?;
    if !cfg!(target_endian = "little") {
        // raw_data is little-endian; only a little-endian host can read it in place
        return Ok(AlignedModel {
            model,
            windows: HashMap::new(),
        });
    }
    let origin = base.as_bytes().as_ptr() as usize;
    // (initializer index, offset in the file, length) of the large float initializers
    let mut moves = Vec::new();
    if let Some(graph) = model.graph.as_mut() {
        for (i, t) in graph.initializer.iter_mut().enumerate() {
            let big_float = t.data_type() == dtype::FLOAT
                && t.raw_data.as_ref().is_some_and(|r| {
                    r.len() >= MIN_WINDOW_BYTES
                        && (r.as_ptr() as usize).wrapping_sub(origin) < base.len_bytes()
                });
            if big_float {
                if let Some(r) = t.raw_data.take() {
                    moves.push((i, r.as_ptr() as usize - origin, r.len()));
                }
            }
        }
    }
    // Every other slice of the file is copied out, so the buffer is ours alone to edit.
    detach_model(&mut model);
    moves.sort_by_key(|&(_, off, _)| off);
    let mut windows = HashMap::with_capacity(moves.len());
    let mut base = base;
    let placed: Vec<(usize, usize, usize)> = match base.as_bytes_mut() {
        Some(bytes) => {
            let (placed, copied) = place_all(bytes, &moves);
            windows.extend(copied);
            placed
        }
        // Some slice of the file is still referenced (a field this module does not
        // know holds one): copy every large initializer instead.
        None => {
            for &(i, off, len) in &moves {
                windows.insert(i, AlignedBuf::from_bytes(&base.as_bytes()[off..off + len]));
            }
            Vec::new()
        }
    };
    for (i, dst, len) in placed {
        if let Some(w) = base.slice(dst, len) {
            windows.insert(i, w);
        }
    }
    if let Some(graph) = model.graph.as_mut() {
        for (i, w) in &windows {
            if let Some(t) = graph.initializer.get_mut(*i) {
                t.raw_data = Some(Bytes::from_owner(w.clone()));
            }
        }
    }
    Ok(AlignedModel { model, windows })
}

/// Files at least this large move their tensors on two threads (see [`place_all`]).
const PARALLEL_PLACE_MIN_BYTES: usize = 4 << 20;

/// (initializer index, destination offset, length) of the tensors moved in place, and
/// copies of those that could not move.
type Placement = (Vec<(usize, usize, usize)>, Vec<(usize, AlignedBuf)>);

/// Moves each `(initializer, offset, length)` of `moves` (in file order) down to a
/// 64-byte boundary of `bytes`, or copies it out when it cannot move down. For a large
/// file, the moves are split at a tensor whose first aligned destination after the
/// previous tensor's bytes is still at or before its own start: the two halves then
/// write disjoint parts of the file and run on two threads (the moves are a warm
/// `memmove` of the whole file, ≈ 10 ms for ResNet-50's 98 MB).
fn place_all(bytes: &mut [u8], moves: &[(usize, usize, usize)]) -> Placement {
    let total = bytes.len();
    let split = (total >= PARALLEL_PLACE_MIN_BYTES
        && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
    .then(|| {
        (1..moves.len()).find(|&m| {
            let (_, prev_off, prev_len) = moves[m - 1];
            let (_, off, _) = moves[m];
            off >= total / 2 && (prev_off + prev_len).next_multiple_of(64) <= off
        })
    })
    .flatten();
    let Some(m) = split else {
        return place(bytes, 0, moves);
    };
    let boundary = moves[m - 1].1 + moves[m - 1].2;
    let (lo, hi) = bytes.split_at_mut(boundary);
    let ((mut placed, mut copied), (placed_hi, copied_hi)) = std::thread::scope(|s| {
        let upper = s.spawn(|| place(hi, boundary, &moves[m..]));
        let lower = place(lo, 0, &moves[..m]);
        let upper = upper
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (lower, upper)
    });
    placed.extend(placed_hi);
    copied.extend(copied_hi);
    (placed, copied)
}

/// [`place_all`] on one thread, for `bytes` holding the file's bytes from offset
/// `origin` (offsets in `moves` and in the result are file offsets). Moving down in
/// file order never overwrites bytes not yet moved, because each tensor's destination
/// starts at or before its own start.
fn place(bytes: &mut [u8], origin: usize, moves: &[(usize, usize, usize)]) -> Placement {
    let mut placed = Vec::with_capacity(moves.len());
    let mut copied = Vec::new();
    let mut free = origin; // first byte not holding a moved tensor
    for &(i, off, len) in moves {
        let dst = free.next_multiple_of(64);
        let from = off - origin;
        if dst > off {
            // cannot move down without overwriting it; copy this one out first
            copied.push((i, AlignedBuf::from_bytes(&bytes[from..from + len])));
            continue;
        }
        bytes.copy_within(from..from + len, dst - origin);
        placed.push((i, dst, len));
        free = dst + len;
    }
    (placed, copied)
}

/// Replaces every `raw_data` slice of the file buffer left in the model by a copy.
fn detach_model(model: &mut ModelProto) {
    if let Some(g) = model.graph.as_mut() {
        detach_graph(g);
    }
    for t in &mut model.training_info {
        for g in [t.initialization.as_mut(), t.algorithm.as_mut()]
            .into_iter()
            .flatten()
        {
            detach_graph(g);
        }
    }
    for f in &mut model.functions {
        detach_nodes(&mut f.node);
        for a in &mut f.attribute_proto {
            detach_attribute(a);
        }
    }
}

fn detach_graph(g: &mut GraphProto) {
    for t in &mut g.initializer {
        detach_tensor(t);
    }
    for s in &mut g.sparse_initializer {
        for t in [s.values.as_mut(), s.indices.as_mut()]
            .into_iter()
            .flatten()
        {
            detach_tensor(t);
        }
    }
    detach_nodes(&mut g.node);
}

fn detach_nodes(nodes: &mut [NodeProto]) {
    for n in nodes {
        for a in &mut n.attribute {
            detach_attribute(a);
        }
    }
}

fn detach_attribute(a: &mut AttributeProto) {
    for t in a.t.iter_mut().chain(&mut a.tensors) {
        detach_tensor(t);
    }
    for s in a.sparse_tensor.iter_mut().chain(&mut a.sparse_tensors) {
        for t in [s.values.as_mut(), s.indices.as_mut()]
            .into_iter()
            .flatten()
        {
            detach_tensor(t);
        }
    }
    for g in a.g.iter_mut().chain(&mut a.graphs) {
        detach_graph(g);
    }
}

fn detach_tensor(t: &mut TensorProto) {
    if let Some(r) = t.raw_data.as_mut() {
        *r = Bytes::copy_from_slice(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, values: &[f32]) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            dims: vec![values.len() as i64],
            data_type: Some(dtype::FLOAT),
            raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            ..TensorProto::default()
        }
    }

    /// Large float initializers become aligned windows of the file buffer holding their
    /// exact bytes; small ones are left to the importer's copy.
    #[test]
    fn large_initializers_are_aligned_windows_of_the_file() {
        let big: Vec<f32> = (0..MIN_WINDOW_BYTES / 4 + 3)
            .map(|i| i as f32 * 0.5)
            .collect();
        let big2: Vec<f32> = (0..MIN_WINDOW_BYTES / 4).map(|i| -(i as f32)).collect();
        let small = [1.0f32, 2.0, 3.0];
        let model = ModelProto {
            graph: Some(GraphProto {
                initializer: vec![tensor("a", &big), tensor("s", &small), tensor("b", &big2)],
                ..GraphProto::default()
            }),
            ..ModelProto::default()
        };
        let bytes = model.encode_to_vec();
        let file = AlignedBuf::from_bytes(&bytes);
        let range = file.as_bytes().as_ptr_range();
        let decoded = decode(file).unwrap();
        assert_eq!(decoded.windows.len(), 2);
        for (i, want) in [(0usize, &big), (2, &big2)] {
            let w = &decoded.windows[&i];
            assert_eq!(w.as_f32(), &want[..]);
            assert_eq!(w.as_bytes().as_ptr() as usize % 64, 0);
            assert!(
                range.contains(&w.as_bytes().as_ptr()),
                "a window, not a copy"
            );
            let raw = decoded.model.graph.as_ref().unwrap().initializer[i]
                .raw_data
                .clone()
                .unwrap();
            assert_eq!(&raw[..], w.as_bytes());
        }
        let s = &decoded.model.graph.as_ref().unwrap().initializer[1];
        let raw = s.raw_data.as_ref().unwrap();
        assert!(
            !range.contains(&raw.as_ptr()),
            "small tensors are detached copies"
        );
        assert_eq!(raw.len(), 12);
    }

    /// A file large enough to move its tensors on two threads gives the same windows
    /// (names of 80 bytes leave more than 64 bytes between tensors, so the split is
    /// always possible).
    #[test]
    fn large_files_place_their_tensors_in_two_halves() {
        let n = (PARALLEL_PLACE_MIN_BYTES / 4) / 3;
        let tensors: Vec<Vec<f32>> = (0..5)
            .map(|t| (0..n + t).map(|i| (i * 7 + t) as f32).collect())
            .collect();
        let model = ModelProto {
            graph: Some(GraphProto {
                initializer: tensors
                    .iter()
                    .enumerate()
                    .map(|(t, v)| tensor(&format!("w{t}_{}", "x".repeat(80)), v))
                    .collect(),
                ..GraphProto::default()
            }),
            ..ModelProto::default()
        };
        let bytes = model.encode_to_vec();
        assert!(bytes.len() >= PARALLEL_PLACE_MIN_BYTES);
        let file = AlignedBuf::from_bytes(&bytes);
        let range = file.as_bytes().as_ptr_range();
        let decoded = decode(file).unwrap();
        assert_eq!(decoded.windows.len(), 5);
        for (t, want) in tensors.iter().enumerate() {
            let w = &decoded.windows[&t];
            assert_eq!(w.as_f32(), &want[..], "tensor {t}");
            assert_eq!(w.as_bytes().as_ptr() as usize % 64, 0);
            assert!(
                range.contains(&w.as_bytes().as_ptr()),
                "tensor {t} is a window"
            );
        }
    }
}
