//! The attribute structs of convolutions, pools, gemm, slices and pads.

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

/// Attributes of a 2-D transposed convolution (NCHW input, weights `[C, O/groups, KH, KW]`
/// as ONNX lays them out). Output size per axis `i` is
/// `strides[i] * (in - 1) + output_padding[i] + dilations[i] * (k - 1) + 1 - pads[i] -
/// pads[i + 2]`; ONNX's `output_shape` and `auto_pad` are resolved into `pads` and
/// `output_padding` at import.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConvTranspose2dAttrs {
    /// Stride along H and W: input pixel `i` lands on output position `i * stride`.
    pub strides: [usize; 2],
    /// Cropping of the full result `[top, left, bottom, right]` (ONNX order).
    pub pads: [usize; 4],
    /// Dilation along H and W.
    pub dilations: [usize; 2],
    /// Number of groups: input channel `c` feeds the outputs of group `c / (C / groups)`.
    pub groups: usize,
    /// Extra rows and columns added at the bottom and right of the result.
    pub output_padding: [usize; 2],
}

impl Default for ConvTranspose2dAttrs {
    fn default() -> Self {
        ConvTranspose2dAttrs {
            strides: [1, 1],
            pads: [0; 4],
            dilations: [1, 1],
            groups: 1,
            output_padding: [0, 0],
        }
    }
}

impl ConvTranspose2dAttrs {
    /// Rows (`i` = 0) or columns (1) of the uncropped result for `input` positions and a
    /// kernel of `k` taps: where the last tap of the last input pixel lands, plus one, plus
    /// the output padding. `None` on a zero kernel or overflow.
    pub fn full_size(&self, i: usize, input: usize, k: usize) -> Option<usize> {
        let span = self.dilations[i]
            .checked_mul(k.checked_sub(1)?)?
            .checked_add(1)?;
        self.strides[i]
            .checked_mul(input.checked_sub(1)?)?
            .checked_add(span)?
            .checked_add(self.output_padding[i])
    }

    /// Result size along axis `i` (0 = H, 1 = W): the full size minus the pads; `None`
    /// when the pads crop everything (or more).
    pub fn output_size(&self, i: usize, input: usize, k: usize) -> Option<usize> {
        let full = self.full_size(i, input, k)?;
        full.checked_sub(self.pads[i].checked_add(self.pads[i + 2])?)
            .filter(|&n| n > 0)
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

/// The axes a reduction folds and whether they stay as dims of size 1.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ReduceAttrs {
    /// The reduced axes, sorted and distinct (empty: none, the reduction is the identity).
    pub axes: Vec<usize>,
    /// Keep each reduced axis as a dim of size 1 (ONNX's `keepdims = 1`).
    pub keep_dims: bool,
}

/// Attributes of `slice`, one entry per axis of the input (all axes are listed; an
/// untouched axis is `start 0, end dim, step 1`). The values are normalized as ONNX
/// Slice clamps them: for a positive step `0 <= start <= end <= dim` reads `start,
/// start + step, ...` below `end`; for a negative step `-1 <= end <= start < dim` reads
/// `start, start + step, ...` above `end` (so `end = -1` runs down to index 0). An empty
/// range gives a result dim of 0. [`SliceAttrs::result_dims`] is the whole type rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceAttrs {
    /// First index read along each axis.
    pub starts: Vec<i64>,
    /// Exclusive bound along each axis (below it for positive steps, above for negative).
    pub ends: Vec<i64>,
    /// Step along each axis; never 0.
    pub steps: Vec<i64>,
}

impl SliceAttrs {
    /// The result dims for an input of `dims`, or what is wrong with the attributes.
    pub fn result_dims(&self, dims: &[usize]) -> Result<Vec<usize>, String> {
        let rank = dims.len();
        if self.starts.len() != rank || self.ends.len() != rank || self.steps.len() != rank {
            return Err(format!(
                "slice takes one start, end and step per axis of its rank-{rank} input, got {}, {} and {}",
                self.starts.len(),
                self.ends.len(),
                self.steps.len()
            ));
        }
        let mut out = Vec::with_capacity(rank);
        for (k, &dim) in dims.iter().enumerate() {
            let (start, end, step) = (self.starts[k], self.ends[k], self.steps[k]);
            let dim = dim as i64;
            let count = if step > 0 {
                if !(0..=dim).contains(&start) || !(0..=dim).contains(&end) {
                    return Err(format!(
                        "slice axis {k}: start {start} and end {end} must lie in 0..={dim} for step {step}"
                    ));
                }
                let span = (end - start).max(0);
                span / step + i64::from(span % step != 0)
            } else if step < 0 {
                let span = (start - end).max(0);
                let count = span / -step + i64::from(span % -step != 0);
                if count > 0 && (!(0..dim).contains(&start) || !(-1..dim).contains(&end)) {
                    return Err(format!(
                        "slice axis {k}: start {start} must lie in 0..{dim} and end {end} in -1..{dim} for step {step}"
                    ));
                }
                count
            } else {
                return Err(format!("slice axis {k}: step 0 is not allowed"));
            };
            out.push(count as usize);
        }
        Ok(out)
    }
}

/// How `pad` fills the positions outside its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum PadMode {
    /// A constant: the op's second operand, or zero (`false`) without one.
    #[default]
    Constant,
    /// The input mirrored about its first and last element, which are not repeated
    /// (`[1, 2, 3]` padded by 2 on each side is `[3, 2, 1, 2, 3, 2, 1]`).
    Reflect,
    /// The first or last element repeated.
    Edge,
    /// The input repeated periodically (`[1, 2, 3]` padded by 2 is `[2, 3, 1, 2, 3, 1, 2]`).
    Wrap,
}

impl PadMode {
    /// Every mode, for messages and the text form.
    pub const ALL: [PadMode; 4] = [
        PadMode::Constant,
        PadMode::Reflect,
        PadMode::Edge,
        PadMode::Wrap,
    ];

    /// The name in the text form and in ONNX.
    pub fn name(self) -> &'static str {
        match self {
            PadMode::Constant => "constant",
            PadMode::Reflect => "reflect",
            PadMode::Edge => "edge",
            PadMode::Wrap => "wrap",
        }
    }

    /// The mode called `name`.
    pub fn from_name(name: &str) -> Option<PadMode> {
        PadMode::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Attributes of `pad`: `pads` holds the begin pad of every axis, then the end pad of
/// every axis (ONNX's order), one pair per axis of the input. A negative pad crops:
/// the input is first cropped by the negative pads, then the positive ones are filled
/// from the cropped tensor by `mode` (so `reflect` and `edge` never read a cropped
/// element). [`PadAttrs::result_dims`] is the whole shape rule and
/// [`PadAttrs::source_index`] the semantics along one axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PadAttrs {
    /// Begin pads of every axis, then end pads; negative values crop.
    pub pads: Vec<i64>,
    /// How padded positions are filled.
    pub mode: PadMode,
}

/// One axis of a `pad`, resolved: how much is cropped, how much is added, and what is
/// left of the input in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PadAxis {
    /// Input elements cropped at the begin.
    pub crop_begin: usize,
    /// Elements added before the kept input.
    pub pad_begin: usize,
    /// Input elements kept (0 when the crops take them all).
    pub kept: usize,
    /// Elements added after the kept input.
    pub pad_end: usize,
}

impl PadAxis {
    /// The result dim along this axis.
    pub fn result_dim(&self) -> usize {
        self.pad_begin + self.kept + self.pad_end
    }
}

impl PadAttrs {
    /// Each axis of an input of `dims` resolved, or what is wrong with the attributes.
    pub fn axes(&self, dims: &[usize]) -> Result<Vec<PadAxis>, String> {
        let rank = dims.len();
        if self.pads.len() != 2 * rank {
            return Err(format!(
                "pad takes a begin and an end pad per axis of its rank-{rank} input ({} values), got {}",
                2 * rank,
                self.pads.len()
            ));
        }
        dims.iter()
            .enumerate()
            .map(|(k, &dim)| self.axis(k, dim, self.pads[k], self.pads[k + rank]))
            .collect()
    }

    /// Axis `k` of `dim` elements with pads `begin` and `end` resolved.
    fn axis(&self, k: usize, dim: usize, begin: i64, end: i64) -> Result<PadAxis, String> {
        {
            // i128: pads come from models and may be anything an i64 holds
            let crop = |p: i64| (-(p as i128)).max(0);
            let kept = dim as i128 - crop(begin) - crop(end);
            if kept < 0 {
                return Err(format!(
                    "pad axis {k}: pads {begin} and {end} crop more than its {dim} elements"
                ));
            }
            let fits = |v: i128| usize::try_from(v).ok().filter(|&v| v <= 1 << 40);
            let (Some(pad_begin), Some(pad_end)) =
                (fits(begin.max(0).into()), fits(end.max(0).into()))
            else {
                return Err(format!(
                    "pad axis {k}: pads {begin} and {end} are too large"
                ));
            };
            let axis = PadAxis {
                crop_begin: crop(begin) as usize,
                pad_begin,
                kept: kept as usize,
                pad_end,
            };
            let pads = pad_begin.max(pad_end);
            if self.mode == PadMode::Reflect && pads > 0 && pads >= axis.kept {
                return Err(format!(
                    "pad axis {k}: reflect pads {begin} and {end} must be smaller than the {} element(s) it reflects",
                    axis.kept
                ));
            }
            // edge and wrap repeat the kept elements: an empty axis has none to repeat
            if matches!(self.mode, PadMode::Edge | PadMode::Wrap) && pads > 0 && axis.kept == 0 {
                return Err(format!(
                    "pad axis {k}: {} pads {begin} and {end} repeat elements of an axis that keeps none",
                    self.mode.name()
                ));
            }
            Ok(axis)
        }
    }

    /// The result dims for an input of `dims`, or what is wrong with the attributes.
    pub fn result_dims(&self, dims: &[usize]) -> Result<Vec<usize>, String> {
        Ok(self.axes(dims)?.iter().map(PadAxis::result_dim).collect())
    }

    /// The input index that result index `i` along an axis reads, or `None` where the
    /// constant goes (`constant` mode outside the kept input).
    pub fn source_index(mode: PadMode, axis: &PadAxis, i: usize) -> Option<usize> {
        let kept = axis.kept as i64;
        // position relative to the kept input: negative before it, >= kept after it
        let j = i as i64 - axis.pad_begin as i64;
        let j = if (0..kept).contains(&j) {
            j
        } else {
            match mode {
                PadMode::Constant => return None,
                PadMode::Edge => j.clamp(0, kept - 1),
                PadMode::Reflect if j < 0 => -j,
                PadMode::Reflect => 2 * (kept - 1) - j,
                PadMode::Wrap => j.rem_euclid(kept),
            }
        };
        Some(axis.crop_begin + j as usize)
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

    #[test]
    fn slice_counts_positive_negative_and_empty_ranges() {
        let s = |starts: &[i64], ends: &[i64], steps: &[i64]| SliceAttrs {
            starts: starts.to_vec(),
            ends: ends.to_vec(),
            steps: steps.to_vec(),
        };
        let dims = [10, 5];
        assert_eq!(
            s(&[1, 0], &[8, 5], &[3, 1]).result_dims(&dims),
            Ok(vec![3, 5])
        );
        assert_eq!(
            s(&[9, 4], &[-1, 1], &[-1, -2]).result_dims(&dims),
            Ok(vec![10, 2])
        );
        assert_eq!(
            s(&[5, 3], &[5, 3], &[1, -1]).result_dims(&dims),
            Ok(vec![0, 0])
        );
        let e = s(&[0, 0], &[10, 5], &[1, 0])
            .result_dims(&dims)
            .unwrap_err();
        assert!(e.contains("step 0"), "{e}");
        assert!(s(&[0, 0], &[11, 5], &[1, 1]).result_dims(&dims).is_err());
        assert!(s(&[10, 0], &[0, 5], &[-1, 1]).result_dims(&dims).is_err());
        assert!(s(&[0], &[1], &[1]).result_dims(&dims).is_err());
    }

    #[test]
    fn pad_crops_then_fills_by_mode() {
        let p = |pads: &[i64], mode| PadAttrs {
            pads: pads.to_vec(),
            mode,
        };
        let read = |a: &PadAttrs, dim: usize| -> Vec<Option<usize>> {
            let ax = a.axes(&[dim]).unwrap()[0];
            (0..ax.result_dim())
                .map(|i| PadAttrs::source_index(a.mode, &ax, i))
                .collect()
        };
        assert_eq!(
            read(&p(&[2, 2], PadMode::Reflect), 3),
            [2, 1, 0, 1, 2, 1, 0].map(Some)
        );
        assert_eq!(
            read(&p(&[2, 2], PadMode::Wrap), 3),
            [1, 2, 0, 1, 2, 0, 1].map(Some)
        );
        assert_eq!(
            read(&p(&[1, 2], PadMode::Edge), 2),
            [0, 0, 1, 1, 1].map(Some)
        );
        assert_eq!(
            read(&p(&[1, -1], PadMode::Constant), 3),
            [None, Some(0), Some(1)]
        );
        // a crop at the begin, an edge pad at the end reads the last kept element
        assert_eq!(read(&p(&[-2, 1], PadMode::Edge), 4), [2, 3, 3].map(Some));
        let e = p(&[3, 0], PadMode::Reflect).result_dims(&[3]).unwrap_err();
        assert!(e.contains("reflect") && e.contains("smaller"), "{e}");
        let e = p(&[0, 1], PadMode::Constant)
            .result_dims(&[3, 3])
            .unwrap_err();
        assert!(e.contains("4 values"), "{e}");
        let e = p(&[-2, -2], PadMode::Constant)
            .result_dims(&[3])
            .unwrap_err();
        assert!(e.contains("crop more than its 3"), "{e}");
        // cropping everything leaves an empty axis, which constant mode may fill again
        // and the repeating modes, having no element to repeat, may not pad
        assert_eq!(
            p(&[-2, -1], PadMode::Constant).result_dims(&[3]),
            Ok(vec![0])
        );
        assert_eq!(
            p(&[-3, 2], PadMode::Constant).result_dims(&[3]),
            Ok(vec![2])
        );
        for mode in [PadMode::Edge, PadMode::Wrap, PadMode::Reflect] {
            assert_eq!(p(&[0, 0], mode).result_dims(&[0]), Ok(vec![0]));
            assert!(p(&[-3, 1], mode).result_dims(&[3]).is_err(), "{mode:?}");
        }
        assert!(p(&[i64::MAX, 0], PadMode::Edge).result_dims(&[3]).is_err());
        assert!(p(&[i64::MIN, 0], PadMode::Edge).result_dims(&[3]).is_err());
    }
}
