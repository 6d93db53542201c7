//! Host tensors: a type plus f32 data in the type's storage order, and error metrics.

use crate::types::{Layout, TensorType};

/// A tensor value on the host: f32 elements in the storage order of `ty.layout`
/// (including zero padding of blocked layouts).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Type, including layout.
    pub ty: TensorType,
    /// `ty.storage_len()` elements.
    pub data: Vec<f32>,
}

impl Tensor {
    /// A row-major f32 tensor; fails if `data` does not have exactly the shape's element count.
    pub fn new(dims: impl Into<Vec<usize>>, data: Vec<f32>) -> Result<Tensor, String> {
        let ty = TensorType::f32(dims);
        ty.check_size()?;
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
            data: vec![0.0; ty.storage_len()],
        }
    }

    /// Logical dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.ty.dims
    }

    /// The element at a logical index, whatever the layout.
    pub fn at(&self, idx: &[usize]) -> f32 {
        self.data[self.ty.layout.offset(&self.ty.dims, idx)]
    }

    /// This tensor's elements copied into `layout` (padding lanes zero).
    pub fn to_layout(&self, layout: Layout) -> Tensor {
        if layout == self.ty.layout {
            return self.clone();
        }
        let ty = self.ty.with_layout(layout);
        let mut out = Tensor::zeros(&ty);
        let dims = &self.ty.dims;
        let mut idx = vec![0usize; dims.len()];
        for _ in 0..self.ty.num_elements() {
            let v = self.at(&idx);
            out.data[layout.offset(dims, &idx)] = v;
            for k in (0..dims.len()).rev() {
                idx[k] += 1;
                if idx[k] < dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        out
    }

    /// The logical elements in row-major order, whatever the layout.
    pub fn to_row_major(&self) -> Vec<f32> {
        self.to_layout(Layout::RowMajor).data
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
        assert_eq!(
            got.len(),
            reference.len(),
            "compared tensors differ in length"
        );
        let (mut max_abs, mut max_ref, mut sq) = (0.0f64, 0.0f64, 0.0f64);
        for (&g, &r) in got.iter().zip(reference) {
            let (g, r) = (g as f64, r as f64);
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

    /// Compares the logical elements of two tensors of the same logical shape.
    pub fn between_tensors(got: &Tensor, reference: &Tensor) -> Result<ErrorStats, String> {
        if got.ty.dims != reference.ty.dims {
            return Err(format!("shapes differ: {} vs {}", got.ty, reference.ty));
        }
        Ok(Self::between(
            &got.to_row_major(),
            &reference.to_row_major(),
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
        assert_eq!(b.data[3], 0.0); // the padded fourth channel of (h=0,w=0)
        assert_eq!(b.to_row_major(), t.data);
    }

    #[test]
    fn relative_error_uses_max_of_reference() {
        let s = ErrorStats::between(&[1.0, 0.0, 10.5], &[1.0, 0.001, 10.0]);
        assert!((s.max_abs - 0.5).abs() < 1e-12);
        assert!((s.relative - 0.05).abs() < 1e-12);
    }
}
