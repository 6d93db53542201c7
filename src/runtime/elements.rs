//! Borrowed tensor elements of any element type: what [`Executable::run_with`] reads its
//! inputs from and writes its outputs into, and their byte views for JIT code.
//!
//! [`Executable::run_with`]: super::Executable::run_with

use smelt_ir::{DType, TensorData};

/// A borrowed run of elements of one type (an input of [`Executable::run_with`]).
///
/// [`Executable::run_with`]: super::Executable::run_with
#[derive(Clone, Copy, Debug)]
pub enum Elements<'a> {
    /// `f32` elements.
    F32(&'a [f32]),
    /// `i64` elements.
    I64(&'a [i64]),
    /// `i32` elements.
    I32(&'a [i32]),
    /// `i1` elements.
    Bool(&'a [bool]),
    /// `f16` elements as their bit patterns.
    F16(&'a [u16]),
    /// `bf16` elements as their bit patterns.
    BF16(&'a [u16]),
    /// `i8` elements.
    I8(&'a [i8]),
    /// `ui8` elements.
    U8(&'a [u8]),
    /// `i16` elements.
    I16(&'a [i16]),
    /// `ui16` elements.
    U16(&'a [u16]),
}

/// A mutably borrowed run of elements of one type (an output of
/// [`Executable::run_with`]).
///
/// [`Executable::run_with`]: super::Executable::run_with
#[derive(Debug)]
pub enum ElementsMut<'a> {
    /// `f32` elements.
    F32(&'a mut [f32]),
    /// `i64` elements.
    I64(&'a mut [i64]),
    /// `i32` elements.
    I32(&'a mut [i32]),
    /// `i1` elements.
    Bool(&'a mut [bool]),
    /// `f16` elements as their bit patterns.
    F16(&'a mut [u16]),
    /// `bf16` elements as their bit patterns.
    BF16(&'a mut [u16]),
    /// `i8` elements.
    I8(&'a mut [i8]),
    /// `ui8` elements.
    U8(&'a mut [u8]),
    /// `i16` elements.
    I16(&'a mut [i16]),
    /// `ui16` elements.
    U16(&'a mut [u16]),
}

impl<'a> Elements<'a> {
    /// The elements of `data`.
    pub fn of(data: &'a TensorData) -> Elements<'a> {
        match data {
            TensorData::F32(v) => Elements::F32(v),
            TensorData::I64(v) => Elements::I64(v),
            TensorData::I32(v) => Elements::I32(v),
            TensorData::Bool(v) => Elements::Bool(v),
            TensorData::F16(v) => Elements::F16(v),
            TensorData::BF16(v) => Elements::BF16(v),
            TensorData::I8(v) => Elements::I8(v),
            TensorData::U8(v) => Elements::U8(v),
            TensorData::I16(v) => Elements::I16(v),
            TensorData::U16(v) => Elements::U16(v),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Elements::F32(_) => DType::F32,
            Elements::I64(_) => DType::I64,
            Elements::I32(_) => DType::I32,
            Elements::Bool(_) => DType::Bool,
            Elements::F16(_) => DType::F16,
            Elements::BF16(_) => DType::BF16,
            Elements::I8(_) => DType::I8,
            Elements::U8(_) => DType::U8,
            Elements::I16(_) => DType::I16,
            Elements::U16(_) => DType::U16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Elements::F32(v) => v.len(),
            Elements::I64(v) => v.len(),
            Elements::I32(v) => v.len(),
            Elements::Bool(v) => v.len(),
            Elements::F16(v) | Elements::BF16(v) | Elements::U16(v) => v.len(),
            Elements::I8(v) => v.len(),
            Elements::U8(v) => v.len(),
            Elements::I16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `range` of these, or `None` past the end (a chunk of a batch).
    pub fn range(self, range: std::ops::Range<usize>) -> Option<Elements<'a>> {
        match self {
            Elements::F32(v) => v.get(range).map(Elements::F32),
            Elements::I64(v) => v.get(range).map(Elements::I64),
            Elements::I32(v) => v.get(range).map(Elements::I32),
            Elements::Bool(v) => v.get(range).map(Elements::Bool),
            Elements::F16(v) => v.get(range).map(Elements::F16),
            Elements::BF16(v) => v.get(range).map(Elements::BF16),
            Elements::I8(v) => v.get(range).map(Elements::I8),
            Elements::U8(v) => v.get(range).map(Elements::U8),
            Elements::I16(v) => v.get(range).map(Elements::I16),
            Elements::U16(v) => v.get(range).map(Elements::U16),
        }
    }

    /// Where JIT code reads the elements, and how many bytes it may read (an `i1` is
    /// one byte, 0 or 1, which is exactly a Rust `bool`).
    pub(super) fn bytes(&self) -> (*const u8, usize) {
        match *self {
            Elements::F32(v) => (v.as_ptr().cast(), v.len() * 4),
            Elements::I64(v) => (v.as_ptr().cast(), v.len() * 8),
            Elements::I32(v) => (v.as_ptr().cast(), v.len() * 4),
            Elements::Bool(v) => (v.as_ptr().cast(), v.len()),
            Elements::F16(v) | Elements::BF16(v) | Elements::U16(v) => {
                (v.as_ptr().cast(), v.len() * 2)
            }
            Elements::I8(v) => (v.as_ptr().cast(), v.len()),
            Elements::U8(v) => (v.as_ptr().cast(), v.len()),
            Elements::I16(v) => (v.as_ptr().cast(), v.len() * 2),
        }
    }
}

impl<'a> ElementsMut<'a> {
    /// The elements of `data`, mutably.
    pub fn of(data: &'a mut TensorData) -> ElementsMut<'a> {
        match data {
            TensorData::F32(v) => ElementsMut::F32(v),
            TensorData::I64(v) => ElementsMut::I64(v),
            TensorData::I32(v) => ElementsMut::I32(v),
            TensorData::Bool(v) => ElementsMut::Bool(v),
            TensorData::F16(v) => ElementsMut::F16(v),
            TensorData::BF16(v) => ElementsMut::BF16(v),
            TensorData::I8(v) => ElementsMut::I8(v),
            TensorData::U8(v) => ElementsMut::U8(v),
            TensorData::I16(v) => ElementsMut::I16(v),
            TensorData::U16(v) => ElementsMut::U16(v),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            ElementsMut::F32(_) => DType::F32,
            ElementsMut::I64(_) => DType::I64,
            ElementsMut::I32(_) => DType::I32,
            ElementsMut::Bool(_) => DType::Bool,
            ElementsMut::F16(_) => DType::F16,
            ElementsMut::BF16(_) => DType::BF16,
            ElementsMut::I8(_) => DType::I8,
            ElementsMut::U8(_) => DType::U8,
            ElementsMut::I16(_) => DType::I16,
            ElementsMut::U16(_) => DType::U16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ElementsMut::F32(v) => v.len(),
            ElementsMut::I64(v) => v.len(),
            ElementsMut::I32(v) => v.len(),
            ElementsMut::Bool(v) => v.len(),
            ElementsMut::F16(v) | ElementsMut::BF16(v) | ElementsMut::U16(v) => v.len(),
            ElementsMut::I8(v) => v.len(),
            ElementsMut::U8(v) => v.len(),
            ElementsMut::I16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `range` of these, reborrowed mutably, or `None` past the end (one chunk
    /// of a batch while the whole stays the caller's).
    pub fn range_mut(&mut self, range: std::ops::Range<usize>) -> Option<ElementsMut<'_>> {
        match self {
            ElementsMut::F32(v) => v.get_mut(range).map(ElementsMut::F32),
            ElementsMut::I64(v) => v.get_mut(range).map(ElementsMut::I64),
            ElementsMut::I32(v) => v.get_mut(range).map(ElementsMut::I32),
            ElementsMut::Bool(v) => v.get_mut(range).map(ElementsMut::Bool),
            ElementsMut::F16(v) => v.get_mut(range).map(ElementsMut::F16),
            ElementsMut::BF16(v) => v.get_mut(range).map(ElementsMut::BF16),
            ElementsMut::I8(v) => v.get_mut(range).map(ElementsMut::I8),
            ElementsMut::U8(v) => v.get_mut(range).map(ElementsMut::U8),
            ElementsMut::I16(v) => v.get_mut(range).map(ElementsMut::I16),
            ElementsMut::U16(v) => v.get_mut(range).map(ElementsMut::U16),
        }
    }

    /// Where JIT code writes the elements, and how many bytes it may write. For `i1`
    /// the caller must store only the bytes 0 and 1 (every `i1` value the loop IR
    /// computes is one: comparisons, casts, loads of `i1`, the bitwise ops on them).
    pub(super) fn bytes_mut(&mut self) -> (*mut u8, usize) {
        match self {
            ElementsMut::F32(v) => (v.as_mut_ptr().cast(), v.len() * 4),
            ElementsMut::I64(v) => (v.as_mut_ptr().cast(), v.len() * 8),
            ElementsMut::I32(v) => (v.as_mut_ptr().cast(), v.len() * 4),
            ElementsMut::Bool(v) => (v.as_mut_ptr().cast(), v.len()),
            ElementsMut::F16(v) | ElementsMut::BF16(v) | ElementsMut::U16(v) => {
                (v.as_mut_ptr().cast(), v.len() * 2)
            }
            ElementsMut::I8(v) => (v.as_mut_ptr().cast(), v.len()),
            ElementsMut::U8(v) => (v.as_mut_ptr().cast(), v.len()),
            ElementsMut::I16(v) => (v.as_mut_ptr().cast(), v.len() * 2),
        }
    }
}

impl<'a> From<&'a [f32]> for Elements<'a> {
    fn from(v: &'a [f32]) -> Elements<'a> {
        Elements::F32(v)
    }
}
impl<'a> From<&'a Vec<f32>> for Elements<'a> {
    fn from(v: &'a Vec<f32>) -> Elements<'a> {
        Elements::F32(v)
    }
}
impl<'a> From<&'a [i64]> for Elements<'a> {
    fn from(v: &'a [i64]) -> Elements<'a> {
        Elements::I64(v)
    }
}
impl<'a> From<&'a mut [f32]> for ElementsMut<'a> {
    fn from(v: &'a mut [f32]) -> ElementsMut<'a> {
        ElementsMut::F32(v)
    }
}
impl<'a> From<&'a mut Vec<f32>> for ElementsMut<'a> {
    fn from(v: &'a mut Vec<f32>) -> ElementsMut<'a> {
        ElementsMut::F32(v)
    }
}
impl<'a> From<&'a mut [i64]> for ElementsMut<'a> {
    fn from(v: &'a mut [i64]) -> ElementsMut<'a> {
        ElementsMut::I64(v)
    }
}

/// Copies the box both shapes share, from `src` (row-major, `src_dims`) into `dst`
/// (row-major, `dst_dims`, same rank and element type): pads a shorter tensor into a
/// longer one (whose other elements stay as they are) or takes a longer one's prefix.
pub(crate) fn copy_common_box(
    src: Elements<'_>,
    src_dims: &[usize],
    dst: &mut ElementsMut<'_>,
    dst_dims: &[usize],
) -> Result<(), String> {
    fn copy<T: Copy>(src: &[T], sd: &[usize], dst: &mut [T], dd: &[usize]) -> Result<(), String> {
        let fits = |v: usize, dims: &[usize]| dims.iter().product::<usize>() == v;
        if sd.len() != dd.len() || !fits(src.len(), sd) || !fits(dst.len(), dd) {
            return Err(format!(
                "cannot copy {} elements of shape {sd:?} into {} of shape {dd:?}",
                src.len(),
                dst.len()
            ));
        }
        let Some((&last_s, outer_s)) = sd.split_last() else {
            dst.copy_from_slice(src);
            return Ok(());
        };
        let last_d = dd[dd.len() - 1];
        let run = last_s.min(last_d);
        let common: Vec<usize> = outer_s.iter().zip(dd).map(|(&a, &b)| a.min(b)).collect();
        if common.contains(&0) || run == 0 {
            return Ok(());
        }
        let mut index = vec![0usize; common.len()];
        loop {
            let offset = |dims: &[usize], last: usize| {
                index.iter().zip(dims).fold(0, |at, (&i, &d)| at * d + i) * last
            };
            let (s, d) = (offset(outer_s, last_s), offset(&dd[..dd.len() - 1], last_d));
            dst[d..d + run].copy_from_slice(&src[s..s + run]);
            let mut k = common.len();
            loop {
                if k == 0 {
                    return Ok(());
                }
                k -= 1;
                index[k] += 1;
                if index[k] < common[k] {
                    break;
                }
                index[k] = 0;
            }
        }
    }
    match (src, dst) {
        (Elements::F32(s), ElementsMut::F32(d)) => copy(s, src_dims, d, dst_dims),
        (Elements::I64(s), ElementsMut::I64(d)) => copy(s, src_dims, d, dst_dims),
        (Elements::I32(s), ElementsMut::I32(d)) => copy(s, src_dims, d, dst_dims),
        (Elements::Bool(s), ElementsMut::Bool(d)) => copy(s, src_dims, d, dst_dims),
        (Elements::F16(s), ElementsMut::F16(d))
        | (Elements::BF16(s), ElementsMut::BF16(d))
        | (Elements::U16(s), ElementsMut::U16(d)) => copy(s, src_dims, d, dst_dims),
        (Elements::I8(s), ElementsMut::I8(d)) => copy(s, src_dims, d, dst_dims),
        (Elements::U8(s), ElementsMut::U8(d)) => copy(s, src_dims, d, dst_dims),
        (Elements::I16(s), ElementsMut::I16(d)) => copy(s, src_dims, d, dst_dims),
        (s, d) => Err(format!(
            "cannot copy {} elements into {} elements",
            s.dtype(),
            d.dtype()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_box_pads_and_takes_prefixes() {
        // [2, 3] into [2, 5]: rows padded on the right
        let src = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut dst = [0.0f32; 10];
        copy_common_box(
            Elements::F32(&src),
            &[2, 3],
            &mut ElementsMut::F32(&mut dst),
            &[2, 5],
        )
        .unwrap();
        assert_eq!(dst, [1.0, 2.0, 3.0, 0.0, 0.0, 4.0, 5.0, 6.0, 0.0, 0.0]);
        // and back: the prefix of each row
        let mut back = [0.0f32; 6];
        copy_common_box(
            Elements::F32(&dst),
            &[2, 5],
            &mut ElementsMut::F32(&mut back),
            &[2, 3],
        )
        .unwrap();
        assert_eq!(back, src);
        // an outer axis: [3, 2] keeps its first 2 rows in [2, 2]
        let mut top = [0i64; 4];
        copy_common_box(
            Elements::I64(&[1, 2, 3, 4, 5, 6]),
            &[3, 2],
            &mut ElementsMut::I64(&mut top),
            &[2, 2],
        )
        .unwrap();
        assert_eq!(top, [1, 2, 3, 4]);
        let mismatch = copy_common_box(
            Elements::I64(&[1]),
            &[1],
            &mut ElementsMut::F32(&mut [0.0]),
            &[1],
        );
        assert!(mismatch.is_err());
    }
}
