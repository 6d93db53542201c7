//! The conv-tile micro-kernel contract: the one native routine shape the loop IR calls
//! ([`ConvTile`]: what a call computes and which elements it may touch), and what a
//! target's routines offer lowering ([`TileTarget`]).
//!
//! The loop IR names only the contract. Which instruction set implements it (AVX2,
//! AVX-512, a NEON port) is the business of code generation and the runtime, which link
//! one routine per lane count for the host they compile for.

use std::fmt;

use super::StoreActivation;

/// One routine of a target: it computes [`ConvTile`]s of `lanes` output channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileRoutine {
    /// Output channels per call (a multiple of 16: one channel block).
    pub lanes: i64,
    /// Most output pixels a call should cover: whole register blocks of the routine,
    /// chosen so that its sums (a stack buffer of `lanes · pixels` floats) stay in L1
    /// until the epilogue reads them back.
    pub max_pixels: i64,
    /// Pixels of one register block: a call of a multiple of them runs only the
    /// routine's full blocks (a shorter remainder takes a slower path).
    pub block_pixels: i64,
}

/// What a target's conv-tile routines offer lowering: the routines, widest first, and
/// their arithmetic width for cost models. A group whose output channels are a multiple
/// of no routine's lanes is computed by Cranelift code instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileTarget {
    /// The widest routine.
    pub widest: TileRoutine,
    /// A narrower one for groups with no multiple of the widest's lanes, if any.
    pub narrower: Option<TileRoutine>,
    /// Lanes of the routines' FMA instructions (8 for 256-bit vectors, 16 for 512-bit),
    /// for cost models and peak-speed reports.
    pub fma_lanes: i64,
}

impl TileTarget {
    /// The routines, widest first.
    pub fn routines(&self) -> impl Iterator<Item = TileRoutine> {
        std::iter::once(self.widest).chain(self.narrower)
    }

    /// The widest routine whose lanes divide `channels` (a group's output channels).
    pub fn routine_for(&self, channels: usize) -> Option<TileRoutine> {
        self.routines()
            .find(|r| r.lanes > 0 && channels.is_multiple_of(r.lanes as usize))
    }
}

/// The shape of one conv-tile call: for pixel `p < pixels` and output channel
/// `l < lanes`,
///
/// ```text
/// out[p·out_pixel_stride + (l/16)·out_block_stride + (l%16/4)·out_vec_stride + l%4]  (+)=
///     Σ_{r<rows, t<taps, c<chans} x[r·row_stride + t·tap_stride + c·chan_stride + p·pixel_stride]
///                                · w[(r·taps + t)·w_tap_stride + lanes·c + l]
/// ```
///
/// (`out_block_stride` places a 32-lane call's second block of 16 channels: `4 ·
/// out_vec_stride` when its sums follow the first block's, a channel block of the result
/// apart when the routine writes two blocks of a channel-blocked result at once.)
///
/// starting from the old `out` when `accumulate`, else from zero. With a `finish` (not
/// 0), each sum `v` is then finished as a store-rows routine would finish it
/// ([`Stmt::StoreRows`](super::Stmt::StoreRows)), in registers before its one store:
///
/// ```text
/// v = v + bias[l]        (when the call has a bias)
/// v = v + residual[o]    (when it has a residual: `o` the out index above, from its pointer)
/// out[o] = act(v)        (act: the finish's StoreActivation)
/// ```
///
/// so a conv whose epilogue a store routine applies writes each result once instead of
/// storing its sums and having the routine read them back. A finish needs
/// `out_vec_stride = 4` (the sums' blocks of 16 contiguous: one vector each).
///
/// All counts and strides
/// are non-negative ([`Kernel::check`](super::Kernel::check) verifies it and proves the footprints, which bound
/// every index above, inside their buffers).
///
/// It is also the record a routine reads its shape from (`*const ConvTile`, after the
/// three buffer pointers), hence `repr(C)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct ConvTile {
    /// Output channels (the lanes of the routine called: [`TileRoutine::lanes`]).
    pub lanes: i64,
    /// Output pixels.
    pub pixels: i64,
    /// Kernel rows.
    pub rows: i64,
    /// Input elements between kernel rows.
    pub row_stride: i64,
    /// Taps per kernel row.
    pub taps: i64,
    /// Input elements between taps.
    pub tap_stride: i64,
    /// Input channels.
    pub chans: i64,
    /// Input elements between channels.
    pub chan_stride: i64,
    /// Input elements between output pixels.
    pub pixel_stride: i64,
    /// Weight elements between taps (`lanes` per input channel of the whole filter).
    pub w_tap_stride: i64,
    /// Output elements between pixels.
    pub out_pixel_stride: i64,
    /// Output elements between groups of 4 channels within a block of 16.
    pub out_vec_stride: i64,
    /// Output elements between blocks of 16 channels (lanes 16.. of a 32-lane call).
    pub out_block_stride: i64,
    /// Elements of the call's `next` run (see [`Stmt::ConvTile`](super::Stmt::ConvTile)) that the routine
    /// prefetches, spread over its reduction; 0 for none.
    pub next_len: i64,
    /// How the sums are finished before they are stored: 0 not at all, else
    /// [`ConvTile::finish_code`] of the activation (see the formula above).
    pub finish: i64,
    /// Add to the old output instead of overwriting it.
    pub accumulate: bool,
}

impl ConvTile {
    /// The `finish` word of a call finishing its sums with `act`: one past its
    /// [`StoreActivation::index`] (0 is no finish).
    pub const fn finish_code(act: StoreActivation) -> i64 {
        1 + act.index()
    }

    /// The activation the call finishes its sums with, `None` without a finish (or for
    /// a `finish` word no activation has: [`ConvTile::footprints`] refuses those).
    pub fn finish_act(&self) -> Option<StoreActivation> {
        StoreActivation::from_index(self.finish - 1)
    }

    /// Whether the `finish` word is one the contract allows: none, or an activation's
    /// with `out_vec_stride = 4`.
    pub fn finish_is_valid(&self) -> bool {
        self.finish == 0 || (self.finish_act().is_some() && self.out_vec_stride == 4)
    }

    fn is_empty(&self) -> bool {
        self.pixels == 0 || self.rows == 0 || self.taps == 0 || self.chans == 0
    }

    /// Elements of `x`, `w` and `out` from each pointer that the call may touch
    /// (`None` when a count or stride is negative, the lanes are not a positive multiple
    /// of 4, a product overflows, or the `finish` word is neither 0 nor an activation's
    /// or comes with `out_vec_stride ≠ 4`). A finish's residual is read over `out`'s
    /// footprint, its bias over the lanes.
    pub fn footprints(&self) -> Option<[i64; 3]> {
        let t = self;
        if t.lanes <= 0 || t.lanes % 4 != 0 {
            return None;
        }
        if !t.finish_is_valid() {
            return None;
        }
        let fields = [
            t.pixels,
            t.rows,
            t.row_stride,
            t.taps,
            t.tap_stride,
            t.chans,
            t.chan_stride,
            t.pixel_stride,
            t.w_tap_stride,
            t.out_pixel_stride,
            t.out_vec_stride,
            t.out_block_stride,
        ];
        if fields.iter().any(|&f| f < 0) {
            return None;
        }
        // the largest index over the lanes: the last block's offset plus the last quad's
        // within a block (an upper bound when a last block is partial)
        let out = (t.pixels.max(1) - 1)
            .checked_mul(t.out_pixel_stride)?
            .checked_add(((t.lanes - 1) / 16).checked_mul(t.out_block_stride)?)?
            .checked_add((t.lanes.min(16) / 4 - 1).checked_mul(t.out_vec_stride)?)?
            .checked_add(4)?;
        if t.is_empty() {
            // nothing read; `out` is still written (zeroed) unless there are no pixels
            return Some([0, 0, if t.pixels == 0 { 0 } else { out }]);
        }
        let x = [
            (t.rows, t.row_stride),
            (t.taps, t.tap_stride),
            (t.chans, t.chan_stride),
            (t.pixels, t.pixel_stride),
        ]
        .iter()
        .try_fold(1i64, |acc, &(n, s)| {
            acc.checked_add((n - 1).checked_mul(s)?)
        })?;
        let w = (t.rows.checked_mul(t.taps)? - 1)
            .checked_mul(t.w_tap_stride)?
            .checked_add((t.chans - 1).checked_mul(t.lanes)?)?
            .checked_add(t.lanes)?;
        Some([x, w, out])
    }

    /// Floating-point operations of one call (an FMA counts two).
    pub fn flops(&self) -> u64 {
        let n = [
            self.pixels,
            self.rows,
            self.taps,
            self.chans,
            2 * self.lanes,
        ];
        n.iter().map(|&v| v.max(0) as u64).product()
    }
}

impl fmt::Display for ConvTile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lanes={}, pixels={}, rows={}x{}, taps={}x{}, chans={}x{}, pixel_stride={}, w_tap_stride={}, out_strides=({}, {}){}{}{}",
            self.lanes,
            self.pixels,
            self.rows,
            self.row_stride,
            self.taps,
            self.tap_stride,
            self.chans,
            self.chan_stride,
            self.pixel_stride,
            self.w_tap_stride,
            self.out_pixel_stride,
            self.out_vec_stride,
            // printed only where it is not the sums' natural run on
            if self.lanes > 16 && self.out_block_stride != 4 * self.out_vec_stride {
                format!(", out_block_stride={}", self.out_block_stride)
            } else {
                String::new()
            },
            if self.next_len > 0 {
                format!(", next_len={}", self.next_len)
            } else {
                String::new()
            },
            if self.accumulate { ", accumulate" } else { "" }
        )?;
        match self.finish_act() {
            Some(act) => {
                let name = match act {
                    StoreActivation::Identity => "identity",
                    StoreActivation::Relu => "relu",
                    StoreActivation::HardSwish => "hardswish",
                };
                write!(f, ", finish={name}")
            }
            None if self.finish != 0 => write!(f, ", finish={}", self.finish),
            None => Ok(()),
        }
    }
}

/// Taps per kernel row a [`DepthwiseRow`] call takes at most (kernels up to 8 wide:
/// 3×3, 5×5 and 7×7 depthwise convolutions).
pub const DEPTHWISE_MAX_TAPS: usize = 8;

/// The shape of one depthwise-row call: one output row of one channel, for `q < cols`,
///
/// ```text
/// out[q] = Σ_{r<rows, t<taps} x[r·row_stride + tap_offsets[t] + q] · w[r·taps + t]
/// ```
///
/// summed in `r, t` order from zero. A strided convolution reads an input whose columns
/// are split by phase (column mod stride), so each tap is still a run of consecutive
/// elements, at its own offset. All counts, strides and the first `taps` offsets are
/// non-negative, `taps ≤ DEPTHWISE_MAX_TAPS` ([`Kernel::check`](super::Kernel::check)
/// verifies it and proves the footprints inside their buffers); offsets past `taps` are
/// ignored (zero by convention, so equal shapes hash equal).
///
/// It is also the record a routine reads its shape from, hence `repr(C)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct DepthwiseRow {
    /// Output elements of the row.
    pub cols: i64,
    /// Kernel rows.
    pub rows: i64,
    /// Input elements between kernel rows.
    pub row_stride: i64,
    /// Taps per kernel row.
    pub taps: i64,
    /// Where each tap's run starts within its kernel row of the input.
    pub tap_offsets: [i64; DEPTHWISE_MAX_TAPS],
}

impl DepthwiseRow {
    /// The record's words in memory order (`repr(C)`: the four counts, then the tap
    /// offsets), as code generation writes them; a compile-time check at the end of this
    /// file holds the order.
    pub fn words(&self) -> [i64; 4 + DEPTHWISE_MAX_TAPS] {
        let mut words = [0; 4 + DEPTHWISE_MAX_TAPS];
        words[..4].copy_from_slice(&[self.cols, self.rows, self.row_stride, self.taps]);
        words[4..].copy_from_slice(&self.tap_offsets);
        words
    }

    /// Elements of `x`, `w` and `out` from each pointer that the call may touch (`None`
    /// when a count, stride or used offset is negative, there are too many taps, or a
    /// product overflows).
    pub fn footprints(&self) -> Option<[i64; 3]> {
        let taps = usize::try_from(self.taps)
            .ok()
            .filter(|&t| t <= DEPTHWISE_MAX_TAPS)?;
        let offsets = &self.tap_offsets[..taps];
        if [self.cols, self.rows, self.row_stride]
            .iter()
            .any(|&f| f < 0)
            || offsets.iter().any(|&o| o < 0)
        {
            return None;
        }
        if self.cols == 0 {
            return Some([0, 0, 0]);
        }
        if self.rows == 0 || taps == 0 {
            // nothing read; `out` is zeroed
            return Some([0, 0, self.cols]);
        }
        let widest = offsets.iter().copied().max().unwrap_or(0);
        let x = (self.rows - 1)
            .checked_mul(self.row_stride)?
            .checked_add(widest)?
            .checked_add(self.cols)?;
        Some([x, self.rows.checked_mul(self.taps)?, self.cols])
    }

    /// The first `x` element the call reads (the smallest tap offset; 0 with no taps):
    /// with [`DepthwiseRow::footprints`], the touched `x` elements span
    /// `first_read..footprint`, both ends read.
    pub fn first_read(&self) -> i64 {
        let taps = (self.taps.max(0) as usize).min(DEPTHWISE_MAX_TAPS);
        self.tap_offsets[..taps].iter().copied().min().unwrap_or(0)
    }

    /// Floating-point operations of one call (an FMA counts two).
    pub fn flops(&self) -> u64 {
        [self.cols, self.rows, self.taps, 2]
            .iter()
            .map(|&v| v.max(0) as u64)
            .product()
    }
}

impl fmt::Display for DepthwiseRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let taps = (self.taps.max(0) as usize).min(DEPTHWISE_MAX_TAPS);
        let offsets: Vec<String> = self.tap_offsets[..taps]
            .iter()
            .map(|o| o.to_string())
            .collect();
        write!(
            f,
            "cols={}, rows={}x{}, taps=[{}]",
            self.cols,
            self.rows,
            self.row_stride,
            offsets.join(", ")
        )
    }
}

/// The shape of one blocked-depthwise-row call: one output row of one channel block of
/// a depthwise convolution on channel blocks of 16 (`nchw16c`: a pixel's 16 channels are
/// consecutive), its column padding handled inside. Output pixel `p`'s tap `t` reads
/// input column `col(p, t) = p·stride + t·dil − pad`; taps whose column falls outside
/// `0..cols` are skipped. For `p < pixels` and lane `c < 16`:
///
/// ```text
/// s             = (bias ? bias[c] : 0)
///               + Σ_{r<rows, t<taps, 0 ≤ col(p,t) < cols}
///                     x[r·x_row_stride + col(p,t)·16 + c] · w[r·w_row_stride + t·16 + c]
/// out[p·16 + c] = act(s)                                       for c < lanes
/// out[p·16 + c] = 0                                            for lanes ≤ c < 16
/// ```
///
/// summed from the bias in `r, t` order with fused multiply-adds — the order of the
/// Cranelift kernel it replaces, so both give the same bits — and `act` the record's
/// activation ([`BlockedDepthwiseRow::activation`]) as the store routines apply it, so
/// a depthwise conv ending in ReLU or hard-swish needs no store pass over its row. Only lanes below `lanes`
/// of `x`, `w` and `bias` are read (a partial last block's padding is never touched).
/// Counts and strides are non-negative, `stride` and `dil` positive, `lanes` one of 4,
/// 8, 12 or 16; [`Kernel::check`](super::Kernel::check) verifies it and proves the
/// footprints inside their buffers.
///
/// It is also the record a routine reads its shape from, hence `repr(C)`: eleven `i64`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct BlockedDepthwiseRow {
    /// Output pixels of the row.
    pub pixels: i64,
    /// Real channels of the block (4, 8, 12 or 16); the lanes past them are written 0.
    pub lanes: i64,
    /// Input columns of the row.
    pub cols: i64,
    /// Input columns between two output pixels' windows.
    pub stride: i64,
    /// Input columns between two taps of a kernel row.
    pub dil: i64,
    /// Padding columns left of the input.
    pub pad: i64,
    /// Taps per kernel row.
    pub taps: i64,
    /// Kernel rows.
    pub rows: i64,
    /// Input elements between kernel rows.
    pub x_row_stride: i64,
    /// Weight elements between kernel rows.
    pub w_row_stride: i64,
    /// The activation of the sums: a [`StoreActivation::index`].
    pub act: i64,
}

impl BlockedDepthwiseRow {
    /// Elements per pixel of `x` and `out` (one channel block).
    pub const BLOCK: i64 = 16;

    /// The activation the `act` word names (`None` for a word none has: not a valid
    /// record).
    pub fn activation(&self) -> Option<StoreActivation> {
        StoreActivation::from_index(self.act)
    }

    /// The record's words in memory order (`repr(C)`), as code generation writes them;
    /// a compile-time check at the end of this file holds the order.
    pub fn words(&self) -> [i64; 11] {
        [
            self.pixels,
            self.lanes,
            self.cols,
            self.stride,
            self.dil,
            self.pad,
            self.taps,
            self.rows,
            self.x_row_stride,
            self.w_row_stride,
            self.act,
        ]
    }

    /// Whether the record is one the contract allows.
    pub fn is_valid(&self) -> bool {
        self.words().iter().all(|&v| v >= 0)
            && self.stride > 0
            && self.dil > 0
            && matches!(self.lanes, 4 | 8 | 12 | 16)
            && self.activation().is_some()
    }

    /// Elements of `x`, `w`, `bias` and `out` from each pointer that the call may touch
    /// (`None` for a record the contract does not allow, or a product that overflows).
    /// `x` is bounded by whole input rows: every column of each kernel row may be read.
    pub fn footprints(&self) -> Option<[i64; 4]> {
        if !self.is_valid() {
            return None;
        }
        let out = self.pixels.checked_mul(Self::BLOCK)?;
        if self.pixels == 0 {
            return Some([0, 0, 0, 0]);
        }
        if self.rows == 0 || self.taps == 0 || self.cols == 0 {
            // nothing summed: the bias (or zeros) stored
            return Some([0, 0, self.lanes, out]);
        }
        let last_row = |stride: i64, run: i64| -> Option<i64> {
            (self.rows - 1)
                .checked_mul(stride)?
                .checked_add(run.checked_sub(1)?.checked_mul(Self::BLOCK)?)?
                .checked_add(self.lanes)
        };
        Some([
            last_row(self.x_row_stride, self.cols)?,
            last_row(self.w_row_stride, self.taps)?,
            self.lanes,
            out,
        ])
    }

    /// Floating-point operations of one call, over every tap (an FMA counts two; the
    /// taps a border pixel skips are counted too).
    pub fn flops(&self) -> u64 {
        [self.pixels, self.rows, self.taps, self.lanes, 2]
            .iter()
            .map(|&v| v.max(0) as u64)
            .product()
    }
}

impl fmt::Display for BlockedDepthwiseRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // the words' names, in `words` order
        const NAMES: [&str; 10] = [
            "pixels",
            "lanes",
            "cols",
            "stride",
            "dil",
            "pad",
            "taps",
            "rows",
            "x_row_stride",
            "w_row_stride",
        ];
        for (i, (name, value)) in NAMES.iter().zip(self.words()).enumerate() {
            write!(f, "{}{name}={value}", if i > 0 { ", " } else { "" })?;
        }
        // the activation only where there is one (the dumps of plain rows unchanged)
        match self.activation() {
            Some(StoreActivation::Identity) => Ok(()),
            Some(StoreActivation::Relu) => write!(f, ", act=relu"),
            Some(StoreActivation::HardSwish) => write!(f, ", act=hardswish"),
            None => write!(f, ", act={}", self.act),
        }
    }
}

/// The records routines read through a pointer are `repr(C)` structs of `i64` words, and
/// code generation writes them word by word from `words()`: the field order there must
/// be the memory order, which this checks at compile time.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<DepthwiseRow>() == 8 * (4 + DEPTHWISE_MAX_TAPS));
    assert!(offset_of!(DepthwiseRow, cols) == 0);
    assert!(offset_of!(DepthwiseRow, rows) == 8);
    assert!(offset_of!(DepthwiseRow, row_stride) == 16);
    assert!(offset_of!(DepthwiseRow, taps) == 24);
    assert!(offset_of!(DepthwiseRow, tap_offsets) == 32);
    assert!(size_of::<BlockedDepthwiseRow>() == 8 * 11);
    assert!(offset_of!(BlockedDepthwiseRow, pixels) == 0);
    assert!(offset_of!(BlockedDepthwiseRow, lanes) == 8);
    assert!(offset_of!(BlockedDepthwiseRow, cols) == 16);
    assert!(offset_of!(BlockedDepthwiseRow, stride) == 24);
    assert!(offset_of!(BlockedDepthwiseRow, dil) == 32);
    assert!(offset_of!(BlockedDepthwiseRow, pad) == 40);
    assert!(offset_of!(BlockedDepthwiseRow, taps) == 48);
    assert!(offset_of!(BlockedDepthwiseRow, rows) == 56);
    assert!(offset_of!(BlockedDepthwiseRow, x_row_stride) == 64);
    assert!(offset_of!(BlockedDepthwiseRow, w_row_stride) == 72);
    assert!(offset_of!(BlockedDepthwiseRow, act) == 80);
};
