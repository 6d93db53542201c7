//! The attribute structs of convolutions, pools and gemm.

use crate::types::{Layout, F32};

/// Attributes of a 2-D convolution (NCHW input, OIHW weights).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Conv2dAttrs {
    /// Stride along H and W.
    pub strides: [usize; 2],
    /// Zero padding `[top, left, bottom, right]` (ONNX order: begins then ends).
    pub pads: [usize; 4],
    /// Dilation along H and W.
    pub dilations: [usize; 2],
    /// Number of groups; `groups == C_in` with one input channel per group is depthwise.
    pub groups: usize,
    /// Layout of the result: row-major, or channels in blocks (`nchw16c`) where the
    /// layout pass chose it for a kernel that writes blocks (text attribute `layout`).
    pub layout: Layout,
}

impl Default for Conv2dAttrs {
    fn default() -> Self {
        Conv2dAttrs {
            strides: [1, 1],
            pads: [0; 4],
            dilations: [1, 1],
            groups: 1,
            layout: Layout::RowMajor,
        }
    }
}

/// Attributes of a 2-D max or average pool over NCHW.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pool2dAttrs {
    /// Window size along H and W.
    pub kernel: [usize; 2],
    /// Stride along H and W.
    pub strides: [usize; 2],
    /// Padding `[top, left, bottom, right]`.
    pub pads: [usize; 4],
    /// Dilation along H and W.
    pub dilations: [usize; 2],
    /// Round the output size up instead of down (windows may start in the end padding).
    pub ceil_mode: bool,
    /// Layout of the result; row-major unless the layout pass chose channel blocks for a
    /// max pool that reads and writes them (text attribute `layout`).
    pub layout: Layout,
}

impl Pool2dAttrs {
    /// Output spatial size along axis `i` (0 = H, 1 = W) for input size `input`.
    pub fn output_size(&self, i: usize, input: usize) -> Option<usize> {
        let span = self.dilations[i] * (self.kernel[i].checked_sub(1)?) + 1;
        let padded = input + self.pads[i] + self.pads[i + 2];
        let room = padded.checked_sub(span)?;
        let s = self.strides[i];
        let mut out = if self.ceil_mode {
            room.div_ceil(s) + 1
        } else {
            room / s + 1
        };
        // ONNX/PyTorch rule: the last window must start inside the input or the begin pad.
        if self.ceil_mode && (out - 1) * s >= input + self.pads[i] {
            out -= 1;
        }
        Some(out)
    }
}

/// Attributes of `gemm`: `alpha * op(A) * op(B) + beta * C`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GemmAttrs {
    /// Scale of the product.
    pub alpha: F32,
    /// Scale of the optional third operand.
    pub beta: F32,
    /// Use `A^T`.
    pub trans_a: bool,
    /// Use `B^T`.
    pub trans_b: bool,
}

impl Default for GemmAttrs {
    fn default() -> Self {
        GemmAttrs {
            alpha: F32(1.0),
            beta: F32(1.0),
            trans_a: false,
            trans_b: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_ceil_mode_drops_window_starting_in_end_pad() {
        let p = Pool2dAttrs {
            kernel: [2, 2],
            strides: [2, 2],
            pads: [0, 0, 1, 1],
            dilations: [1, 1],
            ceil_mode: true,
            layout: Layout::RowMajor,
        };
        // input 4, padded 5: floor gives 2, ceil gives 3 but window 3 starts at 4 = in the pad
        assert_eq!(p.output_size(0, 4), Some(2));
        assert_eq!(p.output_size(0, 5), Some(3));
    }
}
