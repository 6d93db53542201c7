//! Host tensors: a type plus typed data in the type's storage order, and error metrics.

use crate::types::{DType, Layout, TensorType};

/// The elements of a tensor, one vector per element type.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i1` elements.
    Bool(Vec<bool>),
    /// `f16` elements as their bit patterns (see [`crate::half`]).
    F16(Vec<u16>),
    /// `bf16` elements as their bit patterns.
    BF16(Vec<u16>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `ui8` elements.
    U8(Vec<u8>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `ui16` elements.
    U16(Vec<u16>),
}

/// `$body` with `$v` bound to the element vector of `$data`, whatever its type; `$wrap`
/// rebuilds a `TensorData` of the same type from an expression of the same element type.
#[macro_export]
#[doc(hidden)]
macro_rules! with_elements {
    ($data:expr, |$v:ident, $wrap:ident| $body:expr) => {
        match $data {
            $crate::tensor::TensorData::F32($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::F32($e)
                    };
                }
                $body
            }
            $crate::tensor::TensorData::I64($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::I64($e)
                    };
                }
                $body
            }
            $crate::tensor::TensorData::I32($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::I32($e)
                    };
                }
                $body
            }
            $crate::tensor::TensorData::Bool($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::Bool($e)
                    };
                }
                $body
            }
            $crate::tensor::TensorData::F16($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::F16($e)
                    };
                }
                $body
            }
            $crate::tensor::TensorData::BF16($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::BF16($e)
                    };
                }
                $body
            }
            $crate::tensor::TensorData::I8($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::I8($e)
                    };
                }
                $body
            }
            $crate::tensor::TensorData::U8($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::U8($e)
                    };
                }
                $body
            }
            $crate::tensor::TensorData::I16($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::I16($e)
                    };
                }
                $body
            }
            $crate::tensor::TensorData::U16($v) => {
                #[allow(unused_macros)]
                macro_rules! $wrap {
                    ($e:expr) => {
                        $crate::tensor::TensorData::U16($e)
                    };
                }
                $body
            }
        }
    };
}

impl TensorData {
    /// `len` zeros (`false` for `i1`) of element type `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(vec![0.0; len]),
            DType::I64 => TensorData::I64(vec![0; len]),
            DType::I32 => TensorData::I32(vec![0; len]),
            DType::Bool => TensorData::Bool(vec![false; len]),
            DType::F16 => TensorData::F16(vec![0; len]),
            DType::BF16 => TensorData::BF16(vec![0; len]),
            DType::I8 => TensorData::I8(vec![0; len]),
            DType::U8 => TensorData::U8(vec![0; len]),
            DType::I16 => TensorData::I16(vec![0; len]),
            DType::U16 => TensorData::U16(vec![0; len]),
        }
    }

    /// Sets every element to zero (`false` for `i1`), keeping the memory.
    pub fn fill_zero(&mut self) {
        match self {
            TensorData::F32(v) => v.fill(0.0),
            TensorData::I64(v) => v.fill(0),
            TensorData::I32(v) => v.fill(0),
            TensorData::Bool(v) => v.fill(false),
            TensorData::F16(v) | TensorData::BF16(v) | TensorData::U16(v) => v.fill(0),
            TensorData::I8(v) => v.fill(0),
            TensorData::U8(v) => v.fill(0),
            TensorData::I16(v) => v.fill(0),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
            TensorData::Bool(_) => DType::Bool,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::I8(_) => DType::I8,
            TensorData::U8(_) => DType::U8,
            TensorData::I16(_) => DType::I16,
            TensorData::U16(_) => DType::U16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_elements!(self, |v, _w| v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements at `indices`, in that order (every index must be in bounds).
    pub fn pick(&self, indices: &[usize]) -> TensorData {
        with_elements!(self, |v, wrap| wrap!(indices
            .iter()
            .map(|&i| v[i])
            .collect()))
    }

    /// The `f32` elements, if the type is `f32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements widened to `f32` (exactly), for `f32`, `f16` and `bf16` data.
    pub fn to_f32s(&self) -> Option<Vec<f32>> {
        match self {
            TensorData::F32(v) => Some(v.clone()),
            TensorData::F16(v) => Some(v.iter().map(|&x| crate::half::f16_to_f32(x)).collect()),
            TensorData::BF16(v) => Some(v.iter().map(|&x| crate::half::bf16_to_f32(x)).collect()),
            _ => None,
        }
    }

    /// `f32` values rounded (to nearest even) into floats of type `dtype`: `f32` as they
    /// are, `f16` or `bf16`; `None` for the other types.
    pub fn from_f32s(dtype: DType, values: &[f32]) -> Option<TensorData> {
        Some(match dtype {
            DType::F32 => TensorData::F32(values.to_vec()),
            DType::F16 => {
                TensorData::F16(values.iter().map(|&x| crate::half::f32_to_f16(x)).collect())
            }
            DType::BF16 => TensorData::BF16(
                values
                    .iter()
                    .map(|&x| crate::half::f32_to_bf16(x))
                    .collect(),
            ),
            _ => return None,
        })
    }

    /// The `i64` elements, if the type is `i64`.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match self {
            TensorData::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Integers of element type `dtype` (an integer type or `i1`) from `i64` values,
    /// checked to be in the type's range (`i1`: 0 or 1).
    pub fn from_i64s(dtype: DType, values: Vec<i64>) -> Result<TensorData, String> {
        let out_of_range = |v: i64| format!("{v} is out of range for {dtype}");
        fn narrow<T: TryFrom<i64>>(
            values: Vec<i64>,
            err: impl Fn(i64) -> String,
        ) -> Result<Vec<T>, String> {
            values
                .into_iter()
                .map(|v| T::try_from(v).map_err(|_| err(v)))
                .collect()
        }
        Ok(match dtype {
            DType::I64 => TensorData::I64(values),
            DType::I32 => TensorData::I32(
                values
                    .into_iter()
                    .map(|v| i32::try_from(v).map_err(|_| out_of_range(v)))
                    .collect::<Result<_, _>>()?,
            ),
            DType::Bool => TensorData::Bool(
                values
                    .into_iter()
                    .map(|v| match v {
                        0 => Ok(false),
                        1 => Ok(true),
                        _ => Err(out_of_range(v)),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            DType::I8 => TensorData::I8(narrow(values, out_of_range)?),
            DType::U8 => TensorData::U8(narrow(values, out_of_range)?),
            DType::I16 => TensorData::I16(narrow(values, out_of_range)?),
            DType::U16 => TensorData::U16(narrow(values, out_of_range)?),
            DType::F32 | DType::F16 | DType::BF16 => {
                return Err(format!("{dtype} elements are not integers"))
            }
        })
    }

    /// The elements as `i64`s, for integer and `i1` data (`None` for floats).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        match self {
            TensorData::F32(_) | TensorData::F16(_) | TensorData::BF16(_) => None,
            TensorData::I64(v) => Some(v.clone()),
            TensorData::I32(v) => Some(v.iter().map(|&x| x.into()).collect()),
            TensorData::Bool(v) => Some(v.iter().map(|&x| x.into()).collect()),
            TensorData::I8(v) => Some(v.iter().map(|&x| x.into()).collect()),
            TensorData::U8(v) => Some(v.iter().map(|&x| x.into()).collect()),
            TensorData::I16(v) => Some(v.iter().map(|&x| x.into()).collect()),
            TensorData::U16(v) => Some(v.iter().map(|&x| x.into()).collect()),
        }
    }

    /// Each element as an `f64` (`i1` as 0 or 1): exact for the floats, `i32`, `i1` and
    /// the narrow integers, and for `i64` up to 2^53. For error metrics and reports, never
    /// for computing.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            TensorData::I8(v) => v.iter().map(|&x| x.into()).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x.into()).collect(),
            TensorData::I16(v) => v.iter().map(|&x| x.into()).collect(),
            TensorData::U16(v) => v.iter().map(|&x| x.into()).collect(),
            TensorData::F16(v) => v
                .iter()
                .map(|&x| crate::half::f16_to_f32(x) as f64)
                .collect(),
            TensorData::BF16(v) => v
                .iter()
                .map(|&x| crate::half::bf16_to_f32(x) as f64)
                .collect(),
            TensorData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
        }
    }

    /// The elements' little-endian bytes (`i1` as one byte 0 or 1), as native code and
    /// `.npy` files store them.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| u8::from(x)).collect(),
            TensorData::F16(v) | TensorData::BF16(v) | TensorData::U16(v) => {
                v.iter().flat_map(|x| x.to_le_bytes()).collect()
            }
            TensorData::I8(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::U8(v) => v.clone(),
            TensorData::I16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Elements of type `dtype` from their little-endian bytes; `None` when the length is
    /// not a whole number of elements or an `i1` byte is neither 0 nor 1.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Option<TensorData> {
        if !bytes.len().is_multiple_of(dtype.size_bytes()) {
            return None;
        }
        Some(match dtype {
            DType::F32 => TensorData::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            DType::I64 => TensorData::I64(
                bytes
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("chunks of 8")))
                    .collect(),
            ),
            DType::I32 => TensorData::I32(
                bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            DType::Bool => TensorData::Bool(
                bytes
                    .iter()
                    .map(|&b| match b {
                        0 => Some(false),
                        1 => Some(true),
                        _ => None,
                    })
                    .collect::<Option<Vec<bool>>>()?,
            ),
            DType::F16 | DType::BF16 => {
                let bits = bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                if dtype == DType::F16 {
                    TensorData::F16(bits)
                } else {
                    TensorData::BF16(bits)
                }
            }
            DType::I8 => TensorData::I8(bytes.iter().map(|&b| b as i8).collect()),
            DType::U8 => TensorData::U8(bytes.to_vec()),
            DType::I16 => TensorData::I16(
                bytes
                    .chunks_exact(2)
                    .map(|c| i16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            DType::U16 => TensorData::U16(
                bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
        })
    }
}

/// `f32` data equals a float list with the same elements (for tests and examples).
impl PartialEq<Vec<f32>> for TensorData {
    fn eq(&self, other: &Vec<f32>) -> bool {
        self.as_f32() == Some(other.as_slice())
    }
}
impl PartialEq<[f32]> for TensorData {
    fn eq(&self, other: &[f32]) -> bool {
        self.as_f32() == Some(other)
    }
}
impl PartialEq<&[f32]> for TensorData {
    fn eq(&self, other: &&[f32]) -> bool {
        self.as_f32() == Some(*other)
    }
}
impl PartialEq<TensorData> for Vec<f32> {
    fn eq(&self, other: &TensorData) -> bool {
        other == self
    }
}
impl<const N: usize> PartialEq<[f32; N]> for TensorData {
    fn eq(&self, other: &[f32; N]) -> bool {
        self.as_f32() == Some(other.as_slice())
    }
}

impl From<Vec<f32>> for TensorData {
    fn from(v: Vec<f32>) -> TensorData {
        TensorData::F32(v)
    }
}
impl From<Vec<i64>> for TensorData {
    fn from(v: Vec<i64>) -> TensorData {
        TensorData::I64(v)
    }
}
impl From<Vec<i32>> for TensorData {
    fn from(v: Vec<i32>) -> TensorData {
        TensorData::I32(v)
    }
}
impl From<Vec<bool>> for TensorData {
    fn from(v: Vec<bool>) -> TensorData {
        TensorData::Bool(v)
    }
}
impl From<Vec<i8>> for TensorData {
    fn from(v: Vec<i8>) -> TensorData {
        TensorData::I8(v)
    }
}
impl From<Vec<u8>> for TensorData {
    fn from(v: Vec<u8>) -> TensorData {
        TensorData::U8(v)
    }
}
impl From<Vec<i16>> for TensorData {
    fn from(v: Vec<i16>) -> TensorData {
        TensorData::I16(v)
    }
}

/// A tensor value on the host: typed elements in the storage order of `ty.layout`
/// (including zero padding of blocked layouts).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Type, including layout.
    pub ty: TensorType,
    /// `ty.storage_len()` elements of type `ty.dtype`.
    pub data: TensorData,
}

impl Tensor {
    /// A row-major f32 tensor; fails if `data` does not have exactly the shape's element count.
    pub fn new(dims: impl Into<Vec<usize>>, data: Vec<f32>) -> Result<Tensor, String> {
        Tensor::typed(dims, TensorData::F32(data))
    }

    /// A row-major tensor of the data's element type (`Vec<f32>`, `Vec<i64>`,
    /// `Vec<i32>` or `Vec<bool>`); fails if the data does not have exactly the shape's
    /// element count.
    pub fn typed(
        dims: impl Into<Vec<usize>>,
        data: impl Into<TensorData>,
    ) -> Result<Tensor, String> {
        let data = data.into();
        let ty = TensorType::new(data.dtype(), dims);
        ty.check_known_size()?;
        if data.len() != ty.num_elements() {
            return Err(format!(
                "{ty} needs {} elements, got {}",
                ty.num_elements(),
                data.len()
            ));
        }
        Ok(Tensor { ty, data })
    }

    /// A tensor of the given type filled with zeros (including layout padding).
    /// The type must have passed [`TensorType::check_size`].
    pub fn zeros(ty: &TensorType) -> Tensor {
        Tensor {
            ty: ty.clone(),
            data: TensorData::zeros(ty.dtype, ty.storage_len()),
        }
    }

    /// A row-major tensor of `ty`'s dims and element type with seeded pseudo-random
    /// elements, for `--random-inputs` and checks: floats uniform in [-1, 1] (`f16` and
    /// `bf16` rounded from the same `f32` draws); integers
    /// 0 or 1 and `i1` false or true, each with probability 1/2 (valid ids, indices and
    /// mask values for any model, where wider integers could point outside a table).
    pub fn random(ty: &TensorType, seed: u64) -> Tensor {
        Tensor::random_in(ty, seed, 1.0)
    }

    /// [`Tensor::random`] with `f32` elements uniform in [-range, range].
    pub fn random_in(ty: &TensorType, seed: u64, range: f32) -> Tensor {
        let ty = ty.with_layout(Layout::RowMajor);
        let n = ty.num_elements();
        let uniform = crate::weights::random_f32(seed, n, -range, range);
        let bits = || uniform.iter().map(|&v| v >= 0.0);
        let data = match ty.dtype {
            DType::F32 => TensorData::F32(uniform.clone()),
            DType::I64 => TensorData::I64(bits().map(i64::from).collect()),
            DType::I32 => TensorData::I32(bits().map(i32::from).collect()),
            DType::Bool => TensorData::Bool(bits().collect()),
            DType::I8 => TensorData::I8(bits().map(i8::from).collect()),
            DType::U8 => TensorData::U8(bits().map(u8::from).collect()),
            DType::I16 => TensorData::I16(bits().map(i16::from).collect()),
            DType::U16 => TensorData::U16(bits().map(u16::from).collect()),
            DType::F16 | DType::BF16 => {
                TensorData::from_f32s(ty.dtype, &uniform).expect("a float type converts from f32")
            }
        };
        Tensor { ty, data }
    }

    /// Logical dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.ty.dims
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The stored `f32` elements (storage order, with padding).
    ///
    /// # Panics
    /// If the tensor is not `f32`: callers check [`Tensor::dtype`] (or work on a
    /// verified function whose types say so); [`TensorData::as_f32`] does not panic.
    pub fn f32s(&self) -> &[f32] {
        match &self.data {
            TensorData::F32(v) => v,
            other => panic!("an f32 tensor was expected, got {}", other.dtype()),
        }
    }

    /// The stored `f32` elements, mutably (panics as [`Tensor::f32s`] does).
    pub fn f32s_mut(&mut self) -> &mut [f32] {
        match &mut self.data {
            TensorData::F32(v) => v,
            other => panic!("an f32 tensor was expected, got {}", other.dtype()),
        }
    }

    /// The logical element at `idx` as an `f64`, whatever the layout (see
    /// [`TensorData::to_f64`] for how exact that is).
    pub fn at(&self, idx: &[usize]) -> f64 {
        let k = self.ty.layout.offset(&self.ty.dims, idx);
        match &self.data {
            TensorData::F32(v) => v[k] as f64,
            TensorData::I64(v) => v[k] as f64,
            TensorData::I32(v) => v[k] as f64,
            TensorData::Bool(v) => f64::from(u8::from(v[k])),
            TensorData::F16(v) => crate::half::f16_to_f32(v[k]) as f64,
            TensorData::BF16(v) => crate::half::bf16_to_f32(v[k]) as f64,
            TensorData::I8(v) => v[k].into(),
            TensorData::U8(v) => v[k].into(),
            TensorData::I16(v) => v[k].into(),
            TensorData::U16(v) => v[k].into(),
        }
    }

    /// This tensor's elements copied into `layout` (padding lanes zero).
    pub fn to_layout(&self, layout: Layout) -> Tensor {
        if layout == self.ty.layout {
            return self.clone();
        }
        let ty = self.ty.with_layout(layout);
        // Where each stored element of the result comes from; padding reads a zero
        // appended past the source's end.
        let padding = self.data.len();
        let mut source = vec![padding; ty.storage_len()];
        let dims = &self.ty.dims;
        let mut idx = vec![0usize; dims.len()];
        for _ in 0..self.ty.num_elements() {
            source[layout.offset(dims, &idx)] = self.ty.layout.offset(dims, &idx);
            for k in (0..dims.len()).rev() {
                idx[k] += 1;
                if idx[k] < dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        let data = with_elements!(&self.data, |v, wrap| {
            let mut padded = v.clone();
            padded.push(Default::default());
            wrap!(source.iter().map(|&i| padded[i]).collect())
        });
        Tensor { ty, data }
    }

    /// The logical elements in row-major order, whatever the layout.
    pub fn to_row_major(&self) -> TensorData {
        self.to_layout(Layout::RowMajor).data
    }

    /// The logical `f32` elements in row-major order (panics as [`Tensor::f32s`] does).
    pub fn f32s_row_major(&self) -> Vec<f32> {
        match self.to_row_major() {
            TensorData::F32(v) => v,
            other => panic!("an f32 tensor was expected, got {}", other.dtype()),
        }
    }
}

/// How far a computed tensor is from a reference, as FACTS.md defines it. Serializes as
/// an object of its four fields (non-finite errors become null in JSON).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ErrorStats {
    /// max |got − ref| over all elements.
    pub max_abs: f64,
    /// max |got − ref| / max |ref| (0 when both are all zero).
    pub relative: f64,
    /// sqrt(mean((got − ref)²)).
    pub rmse: f64,
    /// Elements compared.
    pub count: usize,
}

impl ErrorStats {
    /// Compares two equally long slices in f64. NaN in one but not the other counts as
    /// infinite error; NaN in both at the same place counts as equal.
    pub fn between(got: &[f32], reference: &[f32]) -> ErrorStats {
        let widen = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        Self::between_f64(&widen(got), &widen(reference))
    }

    /// [`ErrorStats::between`] on values already in f64.
    pub fn between_f64(got: &[f64], reference: &[f64]) -> ErrorStats {
        assert_eq!(
            got.len(),
            reference.len(),
            "compared tensors differ in length"
        );
        let (mut max_abs, mut max_ref, mut sq) = (0.0f64, 0.0f64, 0.0f64);
        for (&g, &r) in got.iter().zip(reference) {
            let d = if g.is_nan() && r.is_nan() || g == r {
                0.0
            } else if g.is_nan() || r.is_nan() {
                f64::INFINITY
            } else {
                (g - r).abs()
            };
            max_abs = max_abs.max(d);
            if r.is_finite() {
                max_ref = max_ref.max(r.abs());
            }
            sq += d * d;
        }
        let relative = if max_abs == 0.0 {
            0.0
        } else if max_ref == 0.0 {
            f64::INFINITY
        } else {
            max_abs / max_ref
        };
        let count = got.len();
        ErrorStats {
            max_abs,
            relative,
            rmse: if count == 0 {
                0.0
            } else {
                (sq / count as f64).sqrt()
            },
            count,
        }
    }

    /// Compares the logical elements of two tensors of the same logical shape and
    /// element type (integers and booleans compared as f64, so equal means exact).
    pub fn between_tensors(got: &Tensor, reference: &Tensor) -> Result<ErrorStats, String> {
        if got.ty.dims != reference.ty.dims || got.ty.dtype != reference.ty.dtype {
            return Err(format!("types differ: {} vs {}", got.ty, reference.ty));
        }
        Ok(Self::between_f64(
            &got.to_row_major().to_f64(),
            &reference.to_row_major().to_f64(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trip_keeps_values_and_zero_pads() {
        let t = Tensor::new([1, 3, 2, 2], (0..12).map(|v| v as f32).collect()).unwrap();
        let b = t.to_layout(Layout::Blocked { axis: 1, block: 4 });
        assert_eq!(b.data.len(), 16);
        assert_eq!(b.f32s()[3], 0.0); // the padded fourth channel of (h=0,w=0)
        assert_eq!(b.to_row_major(), t.data);
        let ints = Tensor::typed([1, 3, 1, 1], vec![1i64 << 40, -7, 3]).unwrap();
        let blocked = ints.to_layout(Layout::Blocked { axis: 1, block: 2 });
        assert_eq!(blocked.data, TensorData::I64(vec![1 << 40, -7, 3, 0]));
        assert_eq!(blocked.to_row_major(), ints.data);
    }

    #[test]
    fn relative_error_uses_max_of_reference() {
        let s = ErrorStats::between(&[1.0, 0.0, 10.5], &[1.0, 0.001, 10.0]);
        assert!((s.max_abs - 0.5).abs() < 1e-12);
        assert!((s.relative - 0.05).abs() < 1e-12);
    }
}
