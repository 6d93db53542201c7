//! The data-movement family: `flatten`, `reshape`, `transpose`, `slice`, `pad`,
//! `expand`, `tile`, `concat`, `reorder` and `gather` — variants, rows, type rules and
//! the text schema of their attribute structs. They move elements of any type without
//! computing on them (no flops).

use super::dim::{broadcast_dims, Dim, Shape};
use super::rules::OperandTypes;
use super::{PadAttrs, PadMode, SliceAttrs};
use crate::text::{AttrDict, AttrError, AttrSchema, Printed};
use crate::types::{DType, Layout};

macro_rules! movement_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// Collapses `[d0..d(axis-1)]` and `[d(axis)..]` into a 2-D tensor.
        Flatten {
            /// First axis of the second dimension.
            axis: usize,
        },
        /// Same elements, new static shape.
        Reshape {
            /// Target dimensions.
            shape: Vec<usize>,
        },
        /// Permutes dimensions: result dim `i` is input dim `perm[i]`.
        Transpose {
            /// The permutation.
            perm: Vec<usize>,
        },
        /// A strided window of the input: along each axis, `steps` apart from `starts` up to
        /// (not including) `ends`, steps possibly negative (see [`SliceAttrs`]).
        Slice(SliceAttrs),
        /// `pad(x, value?)`: `x` with positions added (or cropped, for negative pads) at
        /// both ends of each axis, filled by the mode (see [`PadAttrs`]). In `constant` mode
        /// the optional second operand, one element of `x`'s element type, is the fill
        /// (zero or `false` without it); an operand rather than an attribute so integers
        /// stay exact and a run-time value works. Other modes take no second operand.
        Pad(PadAttrs),
        /// Numpy broadcast of the input to `shape` (the result shape; the input broadcasts
        /// to it without growing it).
        Expand {
            /// The result dimensions.
            shape: Vec<usize>,
        },
        /// Repeats the input `repeats[k]` times along each axis `k`.
        Tile {
            /// Copies along each axis (0 gives an empty axis).
            repeats: Vec<usize>,
        },
        /// Concatenation along `axis`.
        Concat {
            /// The axis.
            axis: usize,
        },
        /// Copies a tensor into another layout; the only op that changes layout.
        Reorder {
            /// Layout of the result.
            layout: Layout,
        },
        /// `gather(data, indices)` along `axis`: the result's dims are `data`'s before the
        /// axis, then `indices`' dims, then `data`'s after it. Indices (`i64` or `i32`) may be
        /// negative (counting from the end); one outside `-d..d` is a run-time error.
        Gather {
            /// The axis of `data` the indices select along.
            axis: usize,
        },
    ]
    [$($rows)*
        Flatten "flatten" Some(Exact(1)), Plain: (Op::Flatten { axis }) <=> (Attrs::Axis(axis))
            attrs { axis = DEFAULT_FLATTEN_AXIS },
            dtype: any_one_type,
            shape: |o| flatten_shape(*axis, o),
            flops: no_flops;
        Reshape "reshape" Some(Exact(1)), Plain: (Op::Reshape { shape }) <=> (Attrs::Dims(shape))
            attrs { shape },
            dtype: any_one_type,
            shape: |o| reshape_shape(shape, o),
            flops: no_flops;
        Transpose "transpose" Some(Exact(1)), Plain: (Op::Transpose { perm }) <=> (Attrs::Dims(perm))
            attrs { perm },
            dtype: any_one_type,
            shape: |o| transpose_shape(perm, o),
            flops: no_flops;
        Slice "slice" Some(Exact(1)), Plain: (Op::Slice(s)) <=> (Attrs::Slice(s))
            attrs { ..s },
            dtype: any_one_type,
            shape: |o| slice_shape(s, o),
            flops: no_flops;
        Pad "pad" Some(Range(1, 2)), Plain: (Op::Pad(p)) <=> (Attrs::Pad(p))
            attrs { ..p },
            dtype: any_one_type,
            shape: |o| pad_shape(p, o),
            flops: no_flops;
        Expand "expand" Some(Exact(1)), Plain: (Op::Expand { shape }) <=> (Attrs::Dims(shape))
            attrs { shape },
            dtype: any_one_type,
            shape: |o| expand_shape(shape, o),
            flops: no_flops;
        Tile "tile" Some(Exact(1)), Plain: (Op::Tile { repeats }) <=> (Attrs::Dims(repeats))
            attrs { repeats },
            dtype: any_one_type,
            shape: |o| tile_shape(repeats, o),
            flops: no_flops;
        Concat "concat" Some(AtLeast(1)), Plain: (Op::Concat { axis }) <=> (Attrs::Axis(axis))
            attrs { axis },
            dtype: any_one_type,
            shape: |o| concat_shape(*axis, o),
            flops: no_flops;
        Reorder "reorder" Some(Exact(1)), Plain: (Op::Reorder { layout }) <=> (Attrs::Layout(layout))
            attrs { layout },
            dtype: any_one_type,
            shape: |o| reorder_shape(*layout, o),
            flops: no_flops;
        Gather "gather" Some(Exact(2)), Plain: (Op::Gather { axis }) <=> (Attrs::Axis(axis))
            attrs { axis = 0 },
            dtype: gather_dtype,
            shape: |o| gather_shape(*axis, o),
            flops: no_flops;
    ]
    $($more),* } };
}
pub(super) use movement_ops;

/// `[product of dims before axis, product from axis on]`.
pub(super) fn flatten_shape(axis: usize, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    if axis > x.rank() {
        return Err(format!("flatten axis {axis} out of range for {x}"));
    }
    let dims = o.dims(0);
    let too_large = || format!("flatten of {x} is too large");
    let outer = Dim::product(&dims[..axis]).ok_or_else(too_large)?;
    let inner = Dim::product(&dims[axis..]).ok_or_else(too_large)?;
    Ok(vec![outer, inner].into())
}

/// `shape`, holding as many elements as the input.
pub(super) fn reshape_shape(shape: &[usize], o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    let want = Dim::all(shape);
    if Dim::product(&want) != Dim::product(&o.dims(0)) {
        return Err(format!(
            "reshape of {x} ({} elements) to {shape:?} changes the element count",
            x.num_elements()
        ));
    }
    Ok(want.into())
}

/// The input's dims permuted.
pub(super) fn transpose_shape(perm: &[usize], o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    if perm.len() != x.rank() {
        return Err(format!(
            "transpose perm {perm:?} does not match rank of {x}"
        ));
    }
    let mut seen = vec![false; x.rank()];
    for &p in perm {
        if p >= x.rank() || std::mem::replace(&mut seen[p], true) {
            return Err(format!("transpose perm {perm:?} is not a permutation"));
        }
    }
    let dims = o.dims(0);
    Ok(perm.iter().map(|&p| dims[p]).collect::<Vec<_>>().into())
}

/// The window's dims (empty along an axis whose range selects nothing, as in ONNX).
/// Slicing compares starts and ends with the dims, so it needs their sizes known.
pub(super) fn slice_shape(s: &SliceAttrs, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let dims = s.result_dims(&Dim::concrete_all(&o.dims(0), "slice")?)?;
    Ok(Dim::all(&dims).into())
}

/// The padded dims; a fill operand only in constant mode, one element. A symbolic axis
/// takes no pads, or non-negative ones in constant mode (crops, reflections and
/// repeats depend on its size).
pub(super) fn pad_shape(p: &PadAttrs, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let input = o.dims(0);
    let rank = input.len();
    let known: Vec<usize> = input.iter().map(|d| d.known_size().unwrap_or(0)).collect();
    let mut dims = Dim::all(&p.result_dims(&known)?);
    for (k, d) in input.iter().enumerate() {
        if d.is_symbolic() {
            let (begin, end) = (p.pads[k], p.pads[k + rank]);
            let padded = begin != 0 || end != 0;
            if begin < 0 || end < 0 || (padded && p.mode != PadMode::Constant) {
                return Err(format!(
                    "pad of axis {k} of symbolic size {d} by {begin} and {end} in {} mode needs a known size",
                    p.mode.name()
                ));
            }
            dims[k] = *d + begin as usize + end as usize;
        }
    }
    if let Some(v) = o.get(1) {
        if p.mode != PadMode::Constant {
            return Err(format!(
                "pad in {} mode takes no fill value operand (only constant mode fills)",
                p.mode.name()
            ));
        }
        if v.num_elements() != 1 {
            return Err(format!("pad fill value {v} must hold exactly one element"));
        }
    }
    Ok(dims.into())
}

/// `shape`, which the input broadcasts to.
pub(super) fn expand_shape(shape: &[usize], o: &OperandTypes<'_>) -> Result<Shape, String> {
    let want = Dim::all(shape);
    let fits = broadcast_dims(&o.dims(0), &want).is_ok_and(|b| b == want);
    if !fits {
        return Err(format!(
            "expand of {} to {shape:?}: the input does not broadcast to that shape",
            o.ty(0)
        ));
    }
    Ok(want.into())
}

/// Each dim times its repeat count.
pub(super) fn tile_shape(repeats: &[usize], o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    if repeats.len() != x.rank() {
        return Err(format!(
            "tile repeats {repeats:?} must have one entry per axis of {x}"
        ));
    }
    let dims = o
        .dims(0)
        .iter()
        .zip(repeats)
        .map(|(&d, &r)| d.checked_mul(Dim::known(r)))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| format!("tile of {x} by {repeats:?} is too large"))?;
    Ok(dims.into())
}

/// The first operand's dims with the axis summed over every operand.
pub(super) fn concat_shape(axis: usize, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let first = o.ty(0);
    if axis >= first.rank() {
        return Err(format!("concat axis {axis} out of range for {first}"));
    }
    let mut dims = o.dims(0);
    for i in 1..o.len() {
        let t = o.ty(i);
        let other = o.dims(i);
        let same_rest = other.len() == dims.len()
            && other
                .iter()
                .zip(&dims)
                .enumerate()
                .all(|(k, (a, b))| k == axis || a == b);
        if !same_rest {
            return Err(format!(
                "concat operand {i} {t} does not match {first} outside axis {axis}"
            ));
        }
        dims[axis] = dims[axis] + other[axis];
    }
    // Operands all in channel blocks along `axis`, each in whole blocks, concatenate as
    // their blocks do: the result keeps the layout (every block of the result is one
    // operand's). Otherwise the result is row-major, whatever the operands' layouts.
    let layout = first.layout;
    let keeps_blocks = match layout {
        Layout::Blocked { axis: a, block } => {
            a as usize == axis
                && (0..o.len()).all(|i| {
                    o.ty(i).layout == layout && o.dims(i)[axis].divisible_by(block as usize)
                })
        }
        Layout::RowMajor => false,
    };
    if keeps_blocks {
        return Ok(Shape::row_major(dims).with_layout(layout));
    }
    Ok(dims.into())
}

/// The input's dims in `layout`.
pub(super) fn reorder_shape(layout: Layout, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    if let Layout::Blocked { axis, block } = layout {
        if axis as usize >= x.rank() || block == 0 {
            return Err(format!("layout {layout:?} does not fit {x}"));
        }
    }
    Ok(Shape::row_major(o.dims(0)).with_layout(layout))
}

/// `data`'s type, indices of an integer type.
pub(super) fn gather_dtype(o: &OperandTypes<'_>) -> Result<DType, String> {
    o.need(1, DType::is_integer, "i64 or i32")?;
    Ok(o.ty(0).dtype)
}

/// `data`'s dims before the axis, the indices' dims, `data`'s after it.
pub(super) fn gather_shape(axis: usize, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let data = o.ty(0);
    if axis >= data.rank() {
        return Err(format!("gather axis {axis} out of range for {data}"));
    }
    let d = o.dims(0);
    if d[axis].is(0) {
        return Err(format!("gather from {data}: axis {axis} is empty"));
    }
    let mut dims = d[..axis].to_vec();
    dims.extend(o.dims(1));
    dims.extend_from_slice(&d[axis + 1..]);
    Ok(dims.into())
}

impl AttrSchema for SliceAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        let starts = d.need("starts", AttrDict::i64s)?;
        let ends = d.need("ends", AttrDict::i64s)?;
        let steps = d.i64s("steps")?.unwrap_or_else(|| vec![1; starts.len()]);
        Ok(SliceAttrs {
            starts,
            ends,
            steps,
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        out.always("starts", &self.starts, rank);
        out.always("ends", &self.ends, rank);
        out.unless("steps", &self.steps, &vec![1; self.starts.len()], rank);
    }
}

impl AttrSchema for PadAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        Ok(PadAttrs {
            pads: d.need("pads", AttrDict::i64s)?,
            mode: d.pad_mode("mode")?.unwrap_or(PadMode::Constant),
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        out.always("pads", &self.pads, rank);
        out.unless("mode", &self.mode, &PadMode::Constant, rank);
    }
}
