//! Element types, shapes, memory layouts and tensor types.

use crate::op::Dim;
use std::fmt;

/// Largest tensor, in bytes, that smelt accepts anywhere (declared types, weights,
/// interpreter buffers). Checked before any allocation so absurd shapes are an error,
/// never an out-of-memory abort.
pub const MAX_TENSOR_BYTES: u64 = 4 << 30;

/// Element type of a tensor.
///
/// Floating-point ops compute on `f32`; integer and boolean tensors carry ids, indices,
/// masks and shapes, and every op on them is exact (integers never pass through `f32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum DType {
    /// IEEE-754 single precision; every computing op works on it.
    #[default]
    F32,
    /// 64-bit signed integer (two's complement, wrapping arithmetic).
    I64,
    /// 32-bit signed integer (two's complement, wrapping arithmetic).
    I32,
    /// A boolean, stored as one byte holding 0 or 1; spelled `i1` as in MLIR.
    Bool,
    /// IEEE-754 half precision (binary16), a storage type: only `cast` and data movement
    /// take it, every computation widens it to `f32` first (see [`crate::half`]).
    F16,
    /// bfloat16 (f32's upper 16 bits), a storage type like [`DType::F16`].
    BF16,
    /// 8-bit signed integer, a storage type: only `cast` and data movement take it;
    /// computations widen it to `i32` (exactly) and wrap their results back.
    I8,
    /// 8-bit unsigned integer, spelled `ui8` as MLIR spells unsigned types; storage
    /// only, like [`DType::I8`] (widened to `i32` by zero extension).
    U8,
    /// 16-bit signed integer, a storage type like [`DType::I8`].
    I16,
    /// 16-bit unsigned integer (`ui16`), a storage type like [`DType::U8`].
    U16,
}

impl DType {
    /// Every element type, in declaration order.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::I64,
        DType::I32,
        DType::Bool,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
    ];

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
        }
    }

    /// The spelling used in the text form (`f32`, `i64`, `i32`, `i1`, `f16`, `bf16`,
    /// `i8`, `ui8`, `i16`, `ui16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::Bool => "i1",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "ui8",
            DType::I16 => "i16",
            DType::U16 => "ui16",
        }
    }

    /// Parses the text spelling.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Whether the type is an integer type (`i64`, `i32`; not `i1`).
    pub fn is_integer(self) -> bool {
        matches!(self, DType::I64 | DType::I32)
    }

    /// Whether arithmetic (`add`, `mul`, `neg`, ...) is defined on the type: `f32` and
    /// the integer types (the 2-byte floats are storage only).
    pub fn is_numeric(self) -> bool {
        matches!(self, DType::F32 | DType::I64 | DType::I32)
    }

    /// Whether the type is a 2-byte float storage type (`f16`, `bf16`).
    pub fn is_narrow_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// Whether the type is a narrow integer storage type (`i8`, `ui8`, `i16`, `ui16`).
    pub fn is_narrow_int(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I16 | DType::U16)
    }

    /// Whether the type is storage only (a 2-byte float or a narrow integer): `cast` and
    /// data movement take it, nothing computes on it.
    pub fn is_storage(self) -> bool {
        self.is_narrow_float() || self.is_narrow_int()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a tensor's logical elements are laid out in memory.
///
/// Layouts never change the logical shape: a `tensor<1x3x8x8xf32, nchw4c>` still has
/// 3 channels; its storage is `[1, 1, 8, 8, 4]` with the fourth channel zero-padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Layout {
    /// Dense row-major order of the logical shape.
    #[default]
    RowMajor,
    /// Axis `axis` is split into `ceil(d / block)` outer blocks (in place) and an
    /// innermost dimension of `block` elements; the tail block is zero-padded.
    /// `nchw8c` is `Blocked { axis: 1, block: 8 }`, `oihw8o` is `Blocked { axis: 0, block: 8 }`.
    Blocked {
        /// Logical axis that is blocked.
        axis: u8,
        /// Elements per block (lanes in the innermost dimension).
        block: u8,
    },
}

impl Layout {
    /// The text spelling for a tensor of rank `rank`, or `None` for the row-major default.
    ///
    /// Rank-4 tensors use the conventional letters (`nchw8c`, `oihw8o`); other ranks
    /// and axes use the generic `blocked<axis,block>`.
    pub fn name(self, rank: usize) -> Option<String> {
        match self {
            Layout::RowMajor => None,
            Layout::Blocked { axis: 1, block } if rank == 4 => Some(format!("nchw{block}c")),
            Layout::Blocked { axis: 0, block } if rank == 4 => Some(format!("oihw{block}o")),
            Layout::Blocked { axis, block } => Some(format!("blocked<{axis},{block}>")),
        }
    }

    /// Shape of the storage for a tensor of logical shape `dims` in this layout.
    pub fn storage_dims(self, dims: &[usize]) -> Vec<usize> {
        match self {
            Layout::RowMajor => dims.to_vec(),
            Layout::Blocked { axis, block } => {
                let mut s = dims.to_vec();
                let (axis, block) = (axis as usize, block as usize);
                if axis < s.len() && block > 0 {
                    s[axis] = s[axis].div_ceil(block);
                    s.push(block);
                }
                s
            }
        }
    }

    /// Offset in elements of the logical index `idx` inside storage of logical shape `dims`.
    pub fn offset(self, dims: &[usize], idx: &[usize]) -> usize {
        match self {
            Layout::RowMajor => idx.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i),
            Layout::Blocked { axis, block } => {
                let (axis, block) = (axis as usize, block as usize);
                let mut off = 0;
                for (k, (&i, &d)) in idx.iter().zip(dims).enumerate() {
                    off = if k == axis {
                        off * d.div_ceil(block) + i / block
                    } else {
                        off * d + i
                    };
                }
                off * block + idx[axis] % block
            }
        }
    }
}

/// Type of an SSA value: element type, static logical shape and memory layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Logical dimensions, outermost first. Rank 0 is a scalar.
    pub dims: Vec<usize>,
    /// Storage layout of the dimensions.
    pub layout: Layout,
}

impl TensorType {
    /// A row-major f32 tensor of the given dimensions.
    pub fn f32(dims: impl Into<Vec<usize>>) -> TensorType {
        TensorType {
            dtype: DType::F32,
            dims: dims.into(),
            layout: Layout::RowMajor,
        }
    }

    /// A row-major tensor of element type `dtype`.
    pub fn new(dtype: DType, dims: impl Into<Vec<usize>>) -> TensorType {
        TensorType {
            dtype,
            dims: dims.into(),
            layout: Layout::RowMajor,
        }
    }

    /// This type with another element type.
    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType {
            dtype,
            ..self.clone()
        }
    }

    /// This type with another layout.
    pub fn with_layout(&self, layout: Layout) -> TensorType {
        TensorType {
            layout,
            ..self.clone()
        }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Whether a dim is symbolic ([`crate::symbolic`]): only the type rules, the text
    /// form, the verifier and specialization read such a type.
    pub fn is_symbolic(&self) -> bool {
        self.dims.iter().any(|&d| Dim::from_stored(d).is_symbolic())
    }

    /// The symbols its dims read, by name.
    pub fn symbols(&self) -> std::collections::BTreeSet<std::sync::Arc<str>> {
        crate::symbolic::symbols_of(&self.dims)
    }

    /// Number of logical elements, or `None` if the product overflows `usize`.
    pub fn checked_num_elements(&self) -> Option<usize> {
        self.dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Number of logical elements. Only call on verified types (see [`TensorType::check_size`]).
    pub fn num_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Dimensions of the storage, including layout blocking and padding.
    pub fn storage_dims(&self) -> Vec<usize> {
        self.layout.storage_dims(&self.dims)
    }

    /// Number of stored elements (logical elements plus layout padding).
    pub fn storage_len(&self) -> usize {
        self.storage_dims().iter().product()
    }

    /// [`TensorType::check_size`] for dims given as numbers from outside (a pinned shape,
    /// an API call): one in the range of symbolic handles is too large, never a symbol.
    pub fn check_known_size(&self) -> Result<(), String> {
        if self.is_symbolic() {
            return Err(format!(
                "a tensor of dims {:?} is too large: more than {MAX_TENSOR_BYTES} bytes",
                self.dims
            ));
        }
        self.check_size()
    }

    /// Checks that the storage of this type fits in [`MAX_TENSOR_BYTES`] without overflow.
    /// An empty dim counts as 1: an empty tensor's other dims are bounded as if it held
    /// one slice, so its strides (and every index computed from them) stay within the
    /// limit, whichever axis is the empty one.
    ///
    /// A symbolic dim counts as 1 too (its size is checked once it is bound), and an
    /// unrepresentable one fails, and so does a number too large to be a size (the
    /// storage's symbolic handles start at 2^63).
    pub fn check_size(&self) -> Result<(), String> {
        if self.is_symbolic() {
            let not_interned = |&d: &usize| {
                let d = Dim::from_stored(d);
                d.is_symbolic() && !d.is_unrepresentable() && d.symbolic().is_none()
            };
            if self.dims.iter().any(not_interned) {
                return Err(format!(
                    "tensor type {self} is too large: more than {MAX_TENSOR_BYTES} bytes"
                ));
            }
            if self
                .dims
                .iter()
                .any(|&d| Dim::from_stored(d).is_unrepresentable())
            {
                return Err(format!(
                    "tensor type {self} has a symbolic size too complex to represent \
                     (more than {} terms or {} nested divisions)",
                    crate::symbolic::MAX_TERMS,
                    crate::symbolic::MAX_DEPTH
                ));
            }
            let known = self
                .dims
                .iter()
                .map(|&d| Dim::from_stored(d).known_size().unwrap_or(1));
            return TensorType {
                dims: known.collect(),
                ..self.clone()
            }
            .check_size();
        }
        let storage = self.layout.storage_dims(&self.dims);
        let bytes = storage
            .iter()
            .try_fold(self.dtype.size_bytes() as u64, |acc, &d| {
                acc.checked_mul(d.max(1) as u64)
            });
        match bytes {
            Some(b) if b <= MAX_TENSOR_BYTES => Ok(()),
            _ => Err(format!(
                "tensor type {self} is too large: more than {MAX_TENSOR_BYTES} bytes"
            )),
        }
    }
}

impl fmt::Display for TensorType {
    /// Prints the text form, e.g. `tensor<1x64x56x56xf32, nchw8c>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for &d in &self.dims {
            let d = Dim::from_stored(d);
            if d.is_simple() {
                write!(f, "{d}x")?;
            } else {
                write!(f, "({d})x")?;
            }
        }
        f.write_str(self.dtype.name())?;
        if let Some(l) = self.layout.name(self.rank()) {
            write!(f, ", {l}")?;
        }
        f.write_str(">")
    }
}

/// A tensor type serializes as its text form, e.g. `"tensor<1x64x56x56xf32, nchw8c>"`.
impl serde::Serialize for TensorType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// An `f32` attribute value with total equality, ordering and hashing (by bit pattern),
/// so ops holding floats can be map keys and e-graph nodes.
#[derive(Clone, Copy, Debug, Default)]
pub struct F32(pub f32);

impl PartialEq for F32 {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for F32 {}
impl std::hash::Hash for F32 {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}
impl PartialOrd for F32 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for F32 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
impl fmt::Display for F32 {
    /// Shortest text that parses back to the same bits (`1.0`, `0.001`, `1e-5`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_finite() && v == v.trunc() && v.abs() < 1e16 {
            write!(f, "{v:.1}")
        } else {
            write!(f, "{v:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_offsets_cover_storage_once() {
        let dims = [1, 5, 2, 3];
        let layout = Layout::Blocked { axis: 1, block: 4 };
        assert_eq!(layout.storage_dims(&dims), vec![1, 2, 2, 3, 4]);
        let mut seen = [false; 48];
        for c in 0..5 {
            for h in 0..2 {
                for w in 0..3 {
                    let o = layout.offset(&dims, &[0, c, h, w]);
                    assert!(!seen[o]);
                    seen[o] = true;
                }
            }
        }
        // channel 5 of block 1 lands at lane 1
        assert_eq!(layout.offset(&dims, &[0, 4, 0, 0]), 2 * 3 * 4);
    }

    #[test]
    fn type_prints_with_layout() {
        let t = TensorType::f32([1, 64, 56, 56]).with_layout(Layout::Blocked { axis: 1, block: 8 });
        assert_eq!(t.to_string(), "tensor<1x64x56x56xf32, nchw8c>");
        assert_eq!(TensorType::f32([]).to_string(), "tensor<f32>");
    }

    #[test]
    fn absurd_shape_is_rejected_without_overflow() {
        let t = TensorType::f32([999_999_999, 999_999_999, 999_999_999]);
        assert!(t.check_size().is_err());
    }

    #[test]
    fn an_empty_tensor_bounds_its_other_dims_wherever_the_empty_one_is() {
        let big = 1usize << 32;
        for dims in [[0, big, big], [big, 0, big], [big, big, 0]] {
            assert!(TensorType::f32(dims).check_size().is_err(), "{dims:?}");
        }
        for dims in [[0, 1000, 1000], [1000, 0, 1000], [1000, 1000, 0]] {
            assert_eq!(TensorType::f32(dims).check_size(), Ok(()), "{dims:?}");
        }
    }
}
