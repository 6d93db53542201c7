//! Tensors known at import time (initializers, `Constant` nodes, folded shape helpers):
//! decoding from `TensorProto` and the folding operations the importer needs.

use std::borrow::Cow;

use bytes::Bytes;
use smelt_ir::op::{broadcast, SliceAttrs};
use smelt_ir::types::MAX_TENSOR_BYTES;
use smelt_ir::{AlignedBuf, DType, TensorType};

use super::proto::TensorProto;

/// ONNX `TensorProto.DataType` codes this module knows by name.
pub mod dtype {
    /// float32.
    pub const FLOAT: i32 = 1;
    /// uint8.
    pub const UINT8: i32 = 2;
    /// int8.
    pub const INT8: i32 = 3;
    /// uint16.
    pub const UINT16: i32 = 4;
    /// int16.
    pub const INT16: i32 = 5;
    /// int32.
    pub const INT32: i32 = 6;
    /// int64.
    pub const INT64: i32 = 7;
    /// bool.
    pub const BOOL: i32 = 9;
    /// float16 (IEEE-754 binary16).
    pub const FLOAT16: i32 = 10;
    /// bfloat16.
    pub const BFLOAT16: i32 = 16;

    /// The IR element type a run-time tensor of type `code` has: float32, int64, int32,
    /// bool, float16, bfloat16, int8, uint8, int16 and uint16; `None` for the types smelt
    /// only folds at import (or not at all).
    pub fn ir(code: i32) -> Option<smelt_ir::DType> {
        Some(match code {
            FLOAT => smelt_ir::DType::F32,
            FLOAT16 => smelt_ir::DType::F16,
            BFLOAT16 => smelt_ir::DType::BF16,
            INT64 => smelt_ir::DType::I64,
            INT32 => smelt_ir::DType::I32,
            BOOL => smelt_ir::DType::Bool,
            INT8 => smelt_ir::DType::I8,
            UINT8 => smelt_ir::DType::U8,
            INT16 => smelt_ir::DType::I16,
            UINT16 => smelt_ir::DType::U16,
            _ => return None,
        })
    }

    /// The ONNX type code of an IR element type.
    pub fn of_ir(d: smelt_ir::DType) -> i32 {
        match d {
            smelt_ir::DType::F32 => FLOAT,
            smelt_ir::DType::I64 => INT64,
            smelt_ir::DType::I32 => INT32,
            smelt_ir::DType::Bool => BOOL,
            smelt_ir::DType::F16 => FLOAT16,
            smelt_ir::DType::BF16 => BFLOAT16,
            smelt_ir::DType::I8 => INT8,
            smelt_ir::DType::U8 => UINT8,
            smelt_ir::DType::I16 => INT16,
            smelt_ir::DType::U16 => UINT16,
        }
    }

    /// Whether `code` is a 2-byte float type (float16, bfloat16).
    pub fn is_narrow_float(code: i32) -> bool {
        matches!(code, FLOAT16 | BFLOAT16)
    }

    /// Whether `code` is a narrow integer type (int8, uint8, int16, uint16).
    pub fn is_narrow_int(code: i32) -> bool {
        matches!(code, INT8 | UINT8 | INT16 | UINT16)
    }

    /// The range `(min, max)` of an integer or bool type code, `None` for other types.
    pub fn int_range(code: i32) -> Option<(i64, i64)> {
        Some(match code {
            INT64 => (i64::MIN, i64::MAX),
            INT32 => (i32::MIN.into(), i32::MAX.into()),
            INT16 => (i16::MIN.into(), i16::MAX.into()),
            INT8 => (i8::MIN.into(), i8::MAX.into()),
            UINT16 => (0, u16::MAX.into()),
            UINT8 => (0, u8::MAX.into()),
            BOOL => (0, 1),
            _ => return None,
        })
    }

    /// Whether `v` is a value of type `code` (always true for non-integer codes, whose
    /// elements are not stored as i64).
    pub fn holds(code: i32, v: i64) -> bool {
        int_range(code).is_none_or(|(lo, hi)| (lo..=hi).contains(&v))
    }

    /// The ONNX spelling of a data type code, for messages.
    pub fn name(code: i32) -> &'static str {
        match code {
            0 => "undefined",
            1 => "float32",
            2 => "uint8",
            3 => "int8",
            4 => "uint16",
            5 => "int16",
            6 => "int32",
            7 => "int64",
            8 => "string",
            9 => "bool",
            10 => "float16",
            11 => "float64",
            12 => "uint32",
            13 => "uint64",
            14 => "complex64",
            15 => "complex128",
            16 => "bfloat16",
            17 => "float8e4m3fn",
            18 => "float8e4m3fnuz",
            19 => "float8e5m2",
            20 => "float8e5m2fnuz",
            21 => "uint4",
            22 => "int4",
            23 => "float4e2m1",
            24 => "float8e8m0",
            25 => "uint2",
            26 => "int2",
            27 => "float6e2m3",
            28 => "float6e3m2",
            _ => "an unknown type",
        }
    }
}

/// The elements of a [`ConstTensor`].
#[derive(Clone, Debug)]
pub enum ConstData {
    /// float32 elements still in the model's little-endian `raw_data` (not copied).
    F32Raw(Bytes),
    /// float32 elements in an aligned window of the model file (not copied; they become
    /// the module weight as they are).
    F32Aligned(AlignedBuf),
    /// float32 elements — or float16 / bfloat16 ones (by the tensor's `onnx_type`),
    /// widened exactly: smelt computes on them in f32.
    F32(Vec<f32>),
    /// Integer or boolean elements widened to i64 (shapes, axes, indices, flags).
    I64(Vec<i64>),
    /// Elements of a type smelt does not compute with (float64, float8, string...);
    /// an error is reported only if a node uses them.
    Unsupported,
}

/// A tensor whose value is known at import time.
#[derive(Clone, Debug)]
pub struct ConstTensor {
    /// Dimensions.
    pub dims: Vec<usize>,
    /// Elements in row-major order.
    pub data: ConstData,
    /// The ONNX data type code it was declared with.
    pub onnx_type: i32,
}

impl ConstTensor {
    /// A float32 tensor.
    pub fn f32(dims: Vec<usize>, values: Vec<f32>) -> ConstTensor {
        ConstTensor {
            dims,
            data: ConstData::F32(values),
            onnx_type: dtype::FLOAT,
        }
    }

    /// An int64 tensor.
    pub fn i64(dims: Vec<usize>, values: Vec<i64>) -> ConstTensor {
        ConstTensor {
            dims,
            data: ConstData::I64(values),
            onnx_type: dtype::INT64,
        }
    }

    /// Decodes a `TensorProto` (raw or typed fields). Errors say what is wrong with the
    /// tensor; the caller adds where it was found.
    pub fn from_proto(t: &TensorProto) -> Result<ConstTensor, String> {
        if t.data_location == Some(1) || !t.external_data.is_empty() {
            let file = t
                .external_data
                .iter()
                .find(|e| e.key() == "location")
                .map(|e| format!(" (in file '{}')", e.value()))
                .unwrap_or_default();
            return Err(format!(
                "its data is stored outside the model{file}, where smelt does not read it: \
                 external data is read for initializers and node attributes of a model \
                 imported from its file"
            ));
        }
        if t.segment.is_some() {
            return Err("segmented tensors are not supported".into());
        }
        let mut dims = Vec::with_capacity(t.dims.len());
        for &d in &t.dims {
            dims.push(usize::try_from(d).map_err(|_| format!("dimension {d} is negative"))?);
        }
        let count = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|&n| (n as u64).saturating_mul(4) <= MAX_TENSOR_BYTES)
            .ok_or_else(|| format!("shape {dims:?} is too large"))?;
        let onnx_type = t.data_type();
        let raw = t.raw_data.as_ref();
        let data = match onnx_type {
            dtype::FLOAT => match raw {
                Some(r) => {
                    expect_len(r.len(), count * 4, "raw_data bytes")?;
                    ConstData::F32Raw(r.clone())
                }
                None => {
                    expect_len(t.float_data.len(), count, "float_data elements")?;
                    ConstData::F32(t.float_data.clone())
                }
            },
            dtype::FLOAT16 | dtype::BFLOAT16 => {
                // the bit patterns: two bytes each in raw_data, else one per int32_data
                let bits: Vec<u16> = match raw {
                    Some(r) => {
                        expect_len(r.len(), count * 2, "raw_data bytes")?;
                        r.chunks_exact(2)
                            .map(|c| u16::from_le_bytes([c[0], c[1]]))
                            .collect()
                    }
                    None => {
                        expect_len(t.int32_data.len(), count, "int32_data elements")?;
                        t.int32_data
                            .iter()
                            .map(|&v| {
                                u16::try_from(v).map_err(|_| {
                                    format!(
                                        "int32_data holds {v}, not the 16 bits of a {}",
                                        dtype::name(onnx_type)
                                    )
                                })
                            })
                            .collect::<Result<_, _>>()?
                    }
                };
                let widen = if onnx_type == dtype::FLOAT16 {
                    smelt_ir::half::f16_to_f32
                } else {
                    smelt_ir::half::bf16_to_f32
                };
                ConstData::F32(bits.into_iter().map(widen).collect())
            }
            dtype::INT64 => match raw {
                Some(r) => ConstData::I64(decode_ints(r, count, 8, true)?),
                None => {
                    expect_len(t.int64_data.len(), count, "int64_data elements")?;
                    ConstData::I64(t.int64_data.clone())
                }
            },
            dtype::INT32
            | dtype::INT16
            | dtype::INT8
            | dtype::UINT16
            | dtype::UINT8
            | dtype::BOOL => {
                let (size, signed) = match onnx_type {
                    dtype::INT32 => (4, true),
                    dtype::INT16 => (2, true),
                    dtype::UINT16 => (2, false),
                    dtype::INT8 => (1, true),
                    _ => (1, false),
                };
                match raw {
                    Some(r) => ConstData::I64(decode_ints(r, count, size, signed)?),
                    None => {
                        expect_len(t.int32_data.len(), count, "int32_data elements")?;
                        ConstData::I64(t.int32_data.iter().map(|&v| v as i64).collect())
                    }
                }
            }
            _ => ConstData::Unsupported,
        };
        Ok(ConstTensor {
            dims,
            data,
            onnx_type,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the elements are float32 (known without decoding them: large weights are
    /// only decoded once, into their aligned module buffer).
    pub fn is_f32(&self) -> bool {
        matches!(
            self.data,
            ConstData::F32(_) | ConstData::F32Raw(_) | ConstData::F32Aligned(_)
        )
    }

    /// The elements as f32, if the tensor is float32 (decoded into a new vector when they
    /// are still raw bytes).
    pub fn f32s(&self) -> Option<Cow<'_, [f32]>> {
        match &self.data {
            ConstData::F32(v) => Some(Cow::Borrowed(v)),
            ConstData::F32Aligned(b) => Some(Cow::Borrowed(b.as_f32())),
            ConstData::F32Raw(r) => Some(Cow::Owned(
                r.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            )),
            ConstData::I64(_) | ConstData::Unsupported => None,
        }
    }

    /// A bool tensor (elements stored as 0 and 1).
    pub fn bool(dims: Vec<usize>, values: Vec<bool>) -> ConstTensor {
        ConstTensor {
            dims,
            data: ConstData::I64(values.into_iter().map(i64::from).collect()),
            onnx_type: dtype::BOOL,
        }
    }

    /// Whether the tensor is a bool tensor.
    pub fn is_bool(&self) -> bool {
        self.onnx_type == dtype::BOOL && self.i64s().is_some()
    }

    /// The elements as i64, if the tensor is an integer or boolean tensor.
    pub fn i64s(&self) -> Option<&[i64]> {
        match &self.data {
            ConstData::I64(v) => Some(v),
            ConstData::F32(_)
            | ConstData::F32Raw(_)
            | ConstData::F32Aligned(_)
            | ConstData::Unsupported => None,
        }
    }

    /// The ONNX name of the element type.
    pub fn type_name(&self) -> &'static str {
        dtype::name(self.onnx_type)
    }

    /// The elements as host data of their IR type (float16 and bfloat16 as their bits);
    /// `None` for element types smelt cannot hold.
    pub fn to_data(&self) -> Option<smelt_ir::TensorData> {
        if let Some(v) = self.f32s() {
            let dt = dtype::ir(self.onnx_type).unwrap_or(DType::F32);
            return smelt_ir::TensorData::from_f32s(dt, &v);
        }
        let v = self.i64s()?;
        let dt = match self.onnx_type {
            0 => DType::I64,
            code => dtype::ir(code)?,
        };
        smelt_ir::TensorData::from_i64s(dt, v.to_vec()).ok()
    }

    /// The same float elements as type `code` (float32, float16 or bfloat16), rounded
    /// to it (to nearest even) when it is narrower; `None` unless the tensor holds floats.
    pub fn as_float_type(&self, code: i32) -> Option<ConstTensor> {
        let v = self.f32s()?;
        let data = match code {
            dtype::FLOAT16 => v
                .iter()
                .map(|&x| smelt_ir::half::f16_to_f32(smelt_ir::half::f32_to_f16(x)))
                .collect(),
            dtype::BFLOAT16 => v
                .iter()
                .map(|&x| smelt_ir::half::bf16_to_f32(smelt_ir::half::f32_to_bf16(x)))
                .collect(),
            dtype::FLOAT => v.into_owned(),
            _ => return None,
        };
        Some(ConstTensor {
            dims: self.dims.clone(),
            data: ConstData::F32(data),
            onnx_type: code,
        })
    }

    /// The IR type and an aligned copy of the data (or the aligned window of the model
    /// file holding it), for a module weight. `None` for element types smelt cannot store.
    pub fn to_weight(&self) -> Option<(TensorType, AlignedBuf)> {
        if dtype::is_narrow_float(self.onnx_type) {
            // a float16 / bfloat16 constant kept as such (a graph output, a Cast's
            // input): stored as its bits
            let data = self.to_data()?;
            let ty = TensorType::new(data.dtype(), self.dims.clone());
            return Some((ty, AlignedBuf::from_data(&data)));
        }
        let (dt, buf) = match &self.data {
            ConstData::F32Raw(r) => (DType::F32, aligned_f32_from_le(r)),
            ConstData::F32Aligned(b) => (DType::F32, b.clone()),
            ConstData::F32(v) => (
                DType::F32,
                AlignedBuf::from_f32_with(v.len(), |dst| dst.copy_from_slice(v)),
            ),
            ConstData::I64(v) => {
                // integers keep their ONNX type: int64, int32 or bool (an unset code on
                // integer data is int64)
                let dt = match self.onnx_type {
                    0 => DType::I64,
                    code => dtype::ir(code).filter(|&d| d != DType::F32)?,
                };
                let data = smelt_ir::TensorData::from_i64s(dt, v.clone()).ok()?;
                (dt, AlignedBuf::from_data(&data))
            }
            ConstData::Unsupported => return None,
        };
        let ty = TensorType {
            dtype: dt,
            ..TensorType::f32(self.dims.clone())
        };
        Some((ty, buf))
    }

    /// The same elements under new dimensions (the caller checks the element count).
    pub fn reshaped(&self, dims: Vec<usize>) -> ConstTensor {
        ConstTensor {
            dims,
            data: self.data.clone(),
            onnx_type: self.onnx_type,
        }
    }

    /// The slabs at positions `indices` along `axis`, the index tensor's dims replacing
    /// that axis (Gather's semantics; indices already normalized and in range).
    fn take(&self, axis: usize, indices: &[usize], index_dims: &[usize]) -> ConstTensor {
        let outer: usize = self.dims[..axis].iter().product();
        let inner: usize = self.dims[axis + 1..].iter().product();
        let n = self.dims[axis];
        let mut dims = self.dims[..axis].to_vec();
        dims.extend_from_slice(index_dims);
        dims.extend_from_slice(&self.dims[axis + 1..]);
        let gather = |len: usize| -> Vec<usize> {
            let mut order = Vec::with_capacity(outer * indices.len() * inner);
            for o in 0..outer {
                for &i in indices {
                    let base = (o * n + i) * inner;
                    order.extend(base..base + inner);
                }
            }
            debug_assert!(order.iter().all(|&k| k < len));
            order
        };
        let data = match &self.data {
            ConstData::I64(v) => {
                ConstData::I64(gather(v.len()).into_iter().map(|k| v[k]).collect())
            }
            ConstData::F32(_) | ConstData::F32Raw(_) | ConstData::F32Aligned(_) => {
                let v = self.f32s().unwrap_or_default();
                ConstData::F32(gather(v.len()).into_iter().map(|k| v[k]).collect())
            }
            ConstData::Unsupported => ConstData::Unsupported,
        };
        ConstTensor {
            dims,
            data,
            onnx_type: self.onnx_type,
        }
    }

    /// ONNX Gather: elements of `self` along `axis` at `indices` (negative indices count
    /// from the end).
    pub fn gather(&self, axis: usize, indices: &ConstTensor) -> Result<ConstTensor, String> {
        let n = self.dims[axis] as i64;
        let raw = indices
            .i64s()
            .ok_or_else(|| format!("indices must be integers, got {}", indices.type_name()))?;
        let mut idx = Vec::with_capacity(raw.len());
        for &i in raw {
            let j = if i < 0 { i + n } else { i };
            if !(0..n).contains(&j) {
                return Err(format!(
                    "index {i} is out of range for axis {axis} of size {n}"
                ));
            }
            idx.push(j as usize);
        }
        Ok(self.take(axis, &idx, &indices.dims))
    }

    /// The elements at the flat positions `order` (each below `self.len()`), as a tensor
    /// of `dims`: the common core of the data-movement folds.
    fn select(&self, dims: Vec<usize>, order: &[usize]) -> ConstTensor {
        let data = match &self.data {
            ConstData::I64(v) => ConstData::I64(order.iter().map(|&k| v[k]).collect()),
            ConstData::F32(_) | ConstData::F32Raw(_) | ConstData::F32Aligned(_) => {
                let v = self.f32s().unwrap_or_default();
                ConstData::F32(order.iter().map(|&k| v[k]).collect())
            }
            ConstData::Unsupported => ConstData::Unsupported,
        };
        ConstTensor {
            dims,
            data,
            onnx_type: self.onnx_type,
        }
    }

    /// The flat positions a row-major walk over `out` reads when a step along axis `k`
    /// moves `strides[k]` elements (0 repeats).
    fn strided_order(out: &[usize], strides: &[usize]) -> Vec<usize> {
        let total: usize = out.iter().product();
        let mut order = Vec::with_capacity(total);
        let mut idx = vec![0usize; out.len()];
        for _ in 0..total {
            order.push(idx.iter().zip(strides).map(|(i, s)| i * s).sum());
            for k in (0..out.len()).rev() {
                idx[k] += 1;
                if idx[k] < out[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        order
    }

    /// Row-major element strides of the tensor.
    fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1usize; self.dims.len()];
        for k in (0..self.dims.len().saturating_sub(1)).rev() {
            strides[k] = strides[k + 1] * self.dims[k + 1];
        }
        strides
    }

    /// ONNX Expand: numpy broadcast of `self` with `shape` (the result may be larger
    /// than `shape` where `self` is).
    pub fn expand(&self, shape: &[usize]) -> Result<ConstTensor, String> {
        let out = broadcast(&self.dims, shape)?;
        check_len(&out)?;
        let own = self.strides();
        let lead = out.len() - self.dims.len();
        let strides: Vec<usize> = (0..out.len())
            .map(|k| {
                if k < lead || self.dims[k - lead] == 1 {
                    0
                } else {
                    own[k - lead]
                }
            })
            .collect();
        let order = Self::strided_order(&out, &strides);
        Ok(self.select(out, &order))
    }

    /// ONNX Transpose: result axis `i` is axis `perm[i]` of `self`.
    pub fn transpose(&self, perm: &[usize]) -> Result<ConstTensor, String> {
        let rank = self.dims.len();
        let mut seen = vec![false; rank];
        if perm.len() != rank
            || perm
                .iter()
                .any(|&a| a >= rank || std::mem::replace(&mut seen[a], true))
        {
            return Err(format!(
                "perm {perm:?} is not a permutation of the {rank} axes of shape {:?}",
                self.dims
            ));
        }
        let own = self.strides();
        let out: Vec<usize> = perm.iter().map(|&a| self.dims[a]).collect();
        let strides: Vec<usize> = perm.iter().map(|&a| own[a]).collect();
        let order = Self::strided_order(&out, &strides);
        Ok(self.select(out, &order))
    }

    /// ONNX Tile: `repeats[k]` copies along each axis `k`.
    pub fn tile(&self, repeats: &[usize]) -> Result<ConstTensor, String> {
        if repeats.len() != self.dims.len() {
            return Err(format!(
                "repeats {repeats:?} must have one entry per axis of shape {:?}",
                self.dims
            ));
        }
        let own = self.strides();
        let (mut split, mut strides, mut out) = (Vec::new(), Vec::new(), Vec::new());
        for (k, &r) in repeats.iter().enumerate() {
            split.extend([r, self.dims[k]]);
            strides.extend([0, own[k]]);
            out.push(
                self.dims[k]
                    .checked_mul(r)
                    .ok_or_else(|| format!("tiling {:?} by {repeats:?} is too large", self.dims))?,
            );
        }
        check_len(&out)?;
        let order = Self::strided_order(&split, &strides);
        Ok(self.select(out, &order))
    }

    /// ONNX Slice with normalized attributes (those of the IR's `slice`).
    pub fn slice(&self, s: &SliceAttrs) -> Result<ConstTensor, String> {
        let out = s.result_dims(&self.dims)?;
        let total: usize = out.iter().product();
        let mut strides = vec![1usize; self.dims.len()];
        for k in (0..self.dims.len().saturating_sub(1)).rev() {
            strides[k] = strides[k + 1] * self.dims[k + 1];
        }
        let mut order = Vec::with_capacity(total);
        let mut idx = vec![0usize; out.len()];
        for _ in 0..total {
            let at: i64 = (0..out.len())
                .map(|k| (s.starts[k] + idx[k] as i64 * s.steps[k]) * strides[k] as i64)
                .sum();
            order.push(at as usize);
            for k in (0..out.len()).rev() {
                idx[k] += 1;
                if idx[k] < out[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        Ok(self.select(out, &order))
    }

    /// Concatenation along `axis` of tensors of equal element kind.
    pub fn concat(parts: &[&ConstTensor], axis: usize) -> Result<ConstTensor, String> {
        let first = parts.first().ok_or("concat of nothing")?;
        let mut dims = first.dims.clone();
        if axis >= dims.len() {
            return Err(format!(
                "axis {axis} is out of range for rank {}",
                dims.len()
            ));
        }
        for p in &parts[1..] {
            let same = p.dims.len() == dims.len()
                && p.dims
                    .iter()
                    .zip(&first.dims)
                    .enumerate()
                    .all(|(k, (a, b))| k == axis || a == b);
            if !same {
                return Err(format!(
                    "shapes {:?} and {:?} differ outside axis {axis}",
                    first.dims, p.dims
                ));
            }
            dims[axis] += p.dims[axis];
        }
        let outer: usize = first.dims[..axis].iter().product();
        let slab = |p: &ConstTensor| -> usize { p.dims[axis..].iter().product() };
        if parts.iter().all(|p| p.i64s().is_some()) {
            let mut out = Vec::new();
            for o in 0..outer {
                for p in parts {
                    let s = slab(p);
                    out.extend_from_slice(&p.i64s().unwrap_or_default()[o * s..(o + 1) * s]);
                }
            }
            Ok(ConstTensor::i64(dims, out))
        } else if parts.iter().all(|p| p.is_f32()) {
            let values: Vec<Cow<'_, [f32]>> = parts.iter().filter_map(|p| p.f32s()).collect();
            let mut out = Vec::new();
            for o in 0..outer {
                for (p, v) in parts.iter().zip(&values) {
                    let s = slab(p);
                    out.extend_from_slice(&v[o * s..(o + 1) * s]);
                }
            }
            Ok(ConstTensor::f32(dims, out))
        } else {
            Err("inputs mix element types".into())
        }
    }

    /// Elementwise `f(a, b)` with numpy broadcasting, in i64 or f32 (both must match).
    pub fn binary(
        a: &ConstTensor,
        b: &ConstTensor,
        int_op: impl Fn(i64, i64) -> Result<i64, String>,
        float_op: impl Fn(f32, f32) -> f32,
    ) -> Result<ConstTensor, String> {
        let dims = broadcast(&a.dims, &b.dims)?;
        let ia = broadcast_indices(&a.dims, &dims);
        let ib = broadcast_indices(&b.dims, &dims);
        match (a.i64s(), b.i64s(), a.f32s(), b.f32s()) {
            (Some(x), Some(y), _, _) => {
                let v = ia
                    .iter()
                    .zip(&ib)
                    .map(|(&i, &j)| int_op(x[i], y[j]))
                    .collect::<Result<Vec<_>, _>>()?;
                if let Some(bad) = v.iter().find(|&&r| !dtype::holds(a.onnx_type, r)) {
                    return Err(format!(
                        "the result {bad} overflows {} (smelt refuses rather than wraps)",
                        a.type_name()
                    ));
                }
                Ok(ConstTensor {
                    onnx_type: a.onnx_type,
                    ..ConstTensor::i64(dims, v)
                })
            }
            (_, _, Some(x), Some(y)) => {
                let v = ia
                    .iter()
                    .zip(&ib)
                    .map(|(&i, &j)| float_op(x[i], y[j]))
                    .collect();
                Ok(ConstTensor::f32(dims, v))
            }
            _ => Err(format!(
                "operands have element types {} and {}",
                a.type_name(),
                b.type_name()
            )),
        }
    }
}

/// For each element of `out` (row-major), the flat index of the element of a tensor of
/// shape `dims` that broadcasts to it.
pub(crate) fn broadcast_indices(dims: &[usize], out: &[usize]) -> Vec<usize> {
    let total: usize = out.iter().product();
    let offset = out.len() - dims.len();
    // stride of each output axis in the source, 0 where the source broadcasts
    let mut strides = vec![0usize; out.len()];
    let mut s = 1;
    for k in (0..dims.len()).rev() {
        strides[k + offset] = if dims[k] == 1 { 0 } else { s };
        s *= dims[k];
    }
    let mut idx = vec![0usize; out.len()];
    let mut result = Vec::with_capacity(total);
    for _ in 0..total {
        result.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        for k in (0..out.len()).rev() {
            idx[k] += 1;
            if idx[k] < out[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    result
}

/// Little-endian float32 bytes decoded into a new aligned buffer in one pass. The
/// buffer's pages come zeroed from the allocator untouched (`from_f32_with`), so each
/// weight byte is written once; `AlignedBuf::from_bytes` would first zero-fill the
/// buffer, then copy (two passes over 100 MB for ResNet-50).
fn aligned_f32_from_le(raw: &[u8]) -> AlignedBuf {
    AlignedBuf::from_f32_with(raw.len() / 4, |dst| {
        for (d, c) in dst.iter_mut().zip(raw.chunks_exact(4)) {
            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    })
}

fn expect_len(got: usize, want: usize, what: &str) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("has {got} {what}, its shape needs {want}"))
    }
}

fn decode_ints(raw: &[u8], count: usize, size: usize, signed: bool) -> Result<Vec<i64>, String> {
    expect_len(raw.len(), count * size, "raw_data bytes")?;
    Ok(raw
        .chunks_exact(size)
        .map(|c| {
            let mut le = [0u8; 8];
            le[..size].copy_from_slice(c);
            let v = u64::from_le_bytes(le);
            if signed && size < 8 {
                // sign-extend from `size` bytes
                let shift = 64 - 8 * size as u32;
                ((v << shift) as i64) >> shift
            } else {
                v as i64
            }
        })
        .collect())
}

/// Rejects folded results too large to hold (their element count, at 8 bytes each).
fn check_len(dims: &[usize]) -> Result<(), String> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| (n as u64).saturating_mul(8) <= MAX_TENSOR_BYTES)
        .map(|_| ())
        .ok_or_else(|| format!("a folded result of shape {dims:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float16_and_bfloat16_tensors_decode_from_raw_and_int32_data() {
        let mut t = TensorProto {
            dims: vec![3],
            data_type: Some(dtype::FLOAT16),
            raw_data: Some(Bytes::from_static(&[0x00, 0x3c, 0x00, 0xc1, 0x00, 0x7c])),
            ..TensorProto::default()
        };
        let c = ConstTensor::from_proto(&t).unwrap();
        assert_eq!(c.onnx_type, dtype::FLOAT16);
        assert_eq!(c.f32s().unwrap()[..], [1.0, -2.5, f32::INFINITY]);
        let (ty, _) = c.to_weight().unwrap();
        assert_eq!(ty.dtype, DType::F16);
        // bfloat16 bits in int32_data; a value past 16 bits is a malformed tensor
        t.raw_data = None;
        t.data_type = Some(dtype::BFLOAT16);
        t.int32_data = vec![0x3f80, 0x4040, 0xbf00];
        let c = ConstTensor::from_proto(&t).unwrap();
        assert_eq!(c.f32s().unwrap()[..], [1.0, 3.0, -0.5]);
        t.int32_data[1] = 0x1_0000;
        let e = ConstTensor::from_proto(&t).unwrap_err();
        assert!(e.contains("65536") && e.contains("bfloat16"), "{e}");
        // too few bytes
        t.int32_data.clear();
        t.raw_data = Some(Bytes::from_static(&[0x00, 0x3c, 0x00]));
        assert!(ConstTensor::from_proto(&t).is_err());
    }

    #[test]
    fn broadcast_indices_repeat_along_size_one_axes() {
        assert_eq!(broadcast_indices(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_indices(&[3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn gather_and_concat_fold_shapes() {
        let shape = ConstTensor::i64(vec![4], vec![1, 3, 224, 224]);
        let first = shape.gather(0, &ConstTensor::i64(vec![], vec![0])).unwrap();
        assert_eq!(first.dims, Vec::<usize>::new());
        assert_eq!(first.i64s(), Some(&[1][..]));
        let last = shape
            .gather(0, &ConstTensor::i64(vec![1], vec![-1]))
            .unwrap();
        let joined =
            ConstTensor::concat(&[&last, &ConstTensor::i64(vec![1], vec![-1])], 0).unwrap();
        assert_eq!(joined.i64s(), Some(&[224, -1][..]));
        assert!(shape
            .gather(0, &ConstTensor::i64(vec![1], vec![4]))
            .is_err());
    }

    #[test]
    fn raw_and_typed_floats_become_the_same_aligned_weight() {
        let values = [1.5f32, -2.0, 0.25, 3.0e-8, f32::MAX, -0.0];
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let from_raw = ConstTensor {
            dims: vec![2, 3],
            data: ConstData::F32Raw(Bytes::from(raw)),
            onnx_type: dtype::FLOAT,
        };
        let typed = ConstTensor::f32(vec![2, 3], values.to_vec());
        for c in [&from_raw, &typed] {
            assert!(c.is_f32());
            let (ty, buf) = c.to_weight().unwrap();
            assert_eq!(ty, TensorType::f32([2, 3]));
            let bits: Vec<u32> = buf.as_f32().iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
            assert_eq!(bits, want);
            assert_eq!(buf.as_f32().as_ptr() as usize % 64, 0);
        }
        let ints = ConstTensor::i64(vec![1], vec![7]);
        assert!(!ints.is_f32());
        assert_eq!(ints.to_weight().unwrap().1.as_i64(), &[7]);
    }

    #[test]
    fn narrow_ints_sign_extend() {
        assert_eq!(
            decode_ints(&[0xff, 0x7f], 2, 1, true).unwrap(),
            vec![-1, 127]
        );
        assert_eq!(decode_ints(&[0xff], 1, 1, false).unwrap(), vec![255]);
        assert!(decode_ints(&[0; 3], 1, 4, true).is_err());
    }
}
