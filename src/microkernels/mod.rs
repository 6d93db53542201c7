//! Native GEMM leaf micro-kernels (AVX2+FMA, AVX-512F) that JIT-compiled loops call for conv tiles.
//!
//! Cranelift emits f32x4 only; the register-blocked inner tile of a convolution or GEMM is
//! where wider vectors pay, so that one tile is written here with `std::arch`, selected at
//! run time by CPU detection ([`has_avx2_fma`], [`has_avx512f`]), and called by symbol from
//! JIT code. A tile finishes its sums itself where the epilogue is a bias, a residual and
//! ReLU or hard-swish (`finish`, below); other epilogues run afterwards while it is hot.
//!
//! # The contract (the safety argument)
//!
//! Every kernel has the C signature of [`ConvTileFn`], `(x, w, out, shape, next, bias,
//! residual)`: three buffer pointers, the call's [`ConvTile`] (the loop IR's own record of
//! the call, `repr(C)`), read once at entry, the start of a run to prefetch, and the
//! finish's bias and residual (either may be null):
//!
//! ```text
//! shape = { lanes, pixels, rows, row_stride, taps, tap_stride, chans, chan_stride,
//!           pixel_stride, w_tap_stride, out_pixel_stride, out_vec_stride,
//!           out_block_stride, next_len, finish, accumulate }
//! ```
//!
//! `shape.lanes` must be the kernel's lane count (16, or 32 for [`conv_tile_avx512_x32`]).
//! All counts and strides are `i64` in elements (not bytes) and are `>= 0`. For every pixel
//! `p < pixels` and output lane `l < 16` (16 output channels = one packed weight block):
//!
//! ```text
//! o    = p*out_pixel_stride + (l/4)*out_vec_stride + (l%4)        // out index of (p, l)
//! s    = if accumulate { out[o] } else { 0.0 }
//! s   += Σ_{r<rows} Σ_{t<taps} Σ_{c<chans}
//!          x[r*row_stride + t*tap_stride + c*chan_stride + p*pixel_stride]
//!        * w[(r*taps + t)*w_tap_stride + c*16 + l]
//! if finish != 0:                                   // the store-rows formula, in registers
//!     s = s + bias[l]        (bias not null)
//!     s = s + residual[o]    (residual not null)
//!     s = act(s)             (act: ConvTile::finish_act, as the store routines apply it)
//! out[o] = s
//! ```
//!
//! A finish needs `out_vec_stride == 4`; `bias[0..lanes]` and `residual` at the out
//! indices are read only with one (and only for pixels that exist).
//!
//! Accumulation is in f32. The summation order is fixed by the arguments alone (no
//! data-dependent paths), so the same call gives bit-identical results every time; the
//! vector kernels add the products in `r, t, c` order into the initial value with fused
//! multiply-adds, the same order for every pixel whatever its register block.
//!
//! The caller proves every index above lies inside its buffer. The kernels read and write
//! *only* those indices: single-float broadcasts of `x` (never a wider load, even when
//! `chan_stride == 1`), 16-float loads of one weight block row `w[... + c*16 .. + 16]`, and
//! four-float loads/stores of `out` at each `p*out_pixel_stride + g*out_vec_stride`,
//! `g < 4` (wider ones when `out_vec_stride == 4`: the same indices). Software prefetches
//! (planar inputs: `chan_stride >= 16`, `pixel_stride` 1 or 2) also name only x indices of
//! the contract: channels `c < chans`. With `shape.next_len > 0` the kernel also prefetches
//! (never loads) the cache lines of `next[0..next_len]`, spread evenly over its reduction:
//! what the caller's next calls will read (the next weight block, which would otherwise
//! stream from memory in one burst when first used); the caller passes a run inside one
//! buffer, and with `next_len == 0` `next` is not used (it may be null).
//!
//! With `pixels == 0` nothing is touched; with `rows`, `taps` or `chans` zero, `out` is set
//! to its initial value (zero, or itself when accumulating) and `x`/`w` are not read. Loads
//! are unaligned (`loadu`), so no alignment is required.
//!
//! Layouts of `out` in use: `[p][16]` (`out_pixel_stride = 16`, `out_vec_stride = 4`) and the
//! partial-sum layout (`out_pixel_stride = 4`, `out_vec_stride` large).
//!
//! ## The 32-lane contract
//!
//! [`conv_tile_avx512_x32`] takes the same arguments (`shape.lanes == 32`) and keeps the same contract with 32
//! output lanes (two packed weight blocks side by side) in place of 16: for `p < pixels` and
//! `l < 32`,
//!
//! ```text
//! o    = p*out_pixel_stride + (l/16)*out_block_stride              // out groups 0..8
//!        + (l%16/4)*out_vec_stride + (l%4)
//! s    = if accumulate { out[o] } else { 0.0 }
//! s   += Σ_{r,t,c} x[r*row_stride + t*tap_stride + c*chan_stride + p*pixel_stride]
//!                * w[(r*taps + t)*w_tap_stride + c*32 + l]
//! out[o] = s
//! ```
//!
//! so a weight row is 32 floats, read as two 16-float loads `w[... + c*32 .. + 16]` and
//! `w[... + c*32 + 16 .. + 32]`, `out` is touched in four-float groups `g < 8` (or 16-float
//! vectors when `out_vec_stride == 4`), and weight prefetches name both halves of a row of a
//! channel `c < chans`. Everything else (summation order, determinism, x accesses, empty
//! cases, no alignment) is as above. Its `out` layouts: `[p][32]` (`out_pixel_stride = 32`,
//! `out_vec_stride = 4`, `out_block_stride = 16`), two blocks `[p][16]` of a channel-blocked
//! result (`out_pixel_stride = 16`, `out_vec_stride = 4`, `out_block_stride` the result's
//! block size) and the partial-sum layout (`out_block_stride = 4·out_vec_stride`). The
//! 16-lane contract is this one with `l < 16`: `out_block_stride` is not used. [`conv_tile_reference`] is the oracle
//! of every lane count.
//!
//! # Speed
//!
//! Register blocks: AVX2 6 pixels × 2 ymm, AVX-512 28 pixels × 1 zmm, AVX-512 with 32 lanes
//! 14 pixels × 2 zmm. The full blocks are monomorphized for the common pixel strides (1, 2,
//! 3, 6, 64–1024) so x addresses are immediates; other strides work at some cost in integer
//! adds. Measured on this project's AVX-512 development machine (one core, ≈2.8 GHz under
//! FMA load, data in L1/L2, best of 400 × 10 calls): a 3×3 channels-last row (128 channels,
//! 28 pixels) runs at ≈86 GFLOP/s with AVX2, ≈168 with AVX-512 and ≈175 with 32 lanes,
//! against pure-FMA loops of ≈90 and ≈179; a 1×1 planar (NCHW) row (256 channels, 56
//! pixels, partial-sum layout) at ≈78, ≈138 and ≈153 — the 32-lane kernel reads each input
//! element once per 32 channels.

#![allow(unsafe_code)]

pub use smelt_ir::loops::ConvTile;
use smelt_ir::loops::{RowActivation, StoreActivation, TileRoutine, TileTarget};

mod activation;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod depthwise;
mod depthwise_blocks;
pub(crate) mod exp;
mod peak;
mod softmax;
mod store;
mod winograd;
#[cfg(target_arch = "x86_64")]
pub use activation::{
    gelu_rows_avx2, gelu_rows_avx512, sigmoid_rows_avx2, sigmoid_rows_avx512, silu_rows_avx2,
    silu_rows_avx512,
};
pub use activation::{
    gelu_rows_reference, sigmoid_rows_reference, silu_rows_reference, ActivationRowsFn,
};
#[cfg(target_arch = "x86_64")]
pub use depthwise::{depthwise_row_avx2, depthwise_row_avx512};
pub use depthwise::{depthwise_row_reference, DepthwiseRowFn};
#[cfg(target_arch = "x86_64")]
pub use depthwise_blocks::{blocked_depthwise_row_avx2, blocked_depthwise_row_avx512};
pub use depthwise_blocks::{blocked_depthwise_row_reference, BlockedDepthwiseRowFn};
pub use peak::{fma_peak, FmaPeak};
#[cfg(target_arch = "x86_64")]
pub use softmax::{softmax_row_avx2, softmax_row_avx512};
pub use softmax::{softmax_row_reference, SoftmaxRowFn};
#[cfg(target_arch = "x86_64")]
pub use store::{store_planes_avx2, store_rows_avx2};
pub use store::{store_planes_reference, store_rows_reference, StorePlanesFn, StoreRowsFn};
#[cfg(target_arch = "x86_64")]
pub use winograd::{
    winograd_input_row_avx2, winograd_input_row_avx512, winograd_output_row_avx2,
    winograd_output_row_avx512,
};
pub use winograd::{
    winograd_input_row_reference, winograd_output_row_reference, WinogradInputRowFn,
    WinogradOutputRowFn,
};
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
pub use avx2::conv_tile_avx2;
#[cfg(target_arch = "x86_64")]
pub use avx512::{conv_tile_avx512, conv_tile_avx512_x32};

/// The counts of a valid rows-routine record (`rows ≥ 0` rows of `lanes`, a positive
/// multiple of 16), or `None`: the contracts of `activation.rs` and `store.rs` say such a
/// record touches nothing.
fn row_counts(rows: i64, lanes: i64) -> Option<(usize, usize)> {
    let rows = usize::try_from(rows).ok()?;
    let lanes = usize::try_from(lanes)
        .ok()
        .filter(|&l| l > 0 && l % 16 == 0)?;
    Some((rows, lanes))
}

/// The C-ABI type shared by every conv-tile kernel (see the module docs for the contract).
pub type ConvTileFn = unsafe extern "C" fn(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    shape: *const ConvTile,
    next: *const f32,
    bias: *const f32,
    residual: *const f32,
);

/// An instruction set this module has conv-tile routines for. The loop IR names only the
/// contract (a call of `lanes` lanes); the ISA chosen for a compilation decides which
/// routine each call links to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileIsa {
    /// AVX2 + FMA: 16 lanes per call (two `f32x8` per pixel).
    Avx2,
    /// AVX-512F: 32 lanes per call (two `f32x16` per pixel), or 16 (one) for groups with
    /// no multiple of 32 output channels.
    Avx512,
}

/// One routine: an ISA's implementation of the conv-tile contract for one lane count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routine {
    /// The instruction set it needs.
    pub isa: TileIsa,
    /// What lowering needs to know of it: lanes per call and pixels per call.
    pub tile: TileRoutine,
    /// The symbol the JIT links calls to.
    pub symbol: &'static str,
}

/// Every routine, in a fixed order: a JIT module declares them in this order, so a
/// routine's function id is its index here (CLIF text names them the same way).
///
/// Pixels per call are whole register blocks — AVX2 6 pixels × 2 ymm, AVX-512 28 × 1 zmm
/// for 16 lanes and 14 × 2 zmm for 32 — about 56 in all, so a call's sums (a stack buffer
/// of `lanes · pixels` floats, 3.5–7 KiB) stay in L1 until the epilogue reads them back.
pub const ROUTINES: [Routine; 3] = [
    Routine {
        isa: TileIsa::Avx2,
        tile: TileRoutine {
            lanes: 16,
            max_pixels: 60,
            block_pixels: 6,
        },
        symbol: "smelt_conv_tile_avx2",
    },
    Routine {
        isa: TileIsa::Avx512,
        tile: TileRoutine {
            lanes: 16,
            max_pixels: 56,
            block_pixels: 28,
        },
        symbol: "smelt_conv_tile_avx512",
    },
    Routine {
        isa: TileIsa::Avx512,
        tile: TileRoutine {
            lanes: 32,
            max_pixels: 56,
            block_pixels: 14,
        },
        symbol: "smelt_conv_tile_avx512_x32",
    },
];

impl TileIsa {
    /// Both, widest first.
    pub const ALL: [TileIsa; 2] = [TileIsa::Avx512, TileIsa::Avx2];

    /// Whether this CPU runs the ISA's routines.
    pub fn host_has(self) -> bool {
        match self {
            TileIsa::Avx2 => has_avx2_fma(),
            TileIsa::Avx512 => has_avx512f(),
        }
    }

    /// Lanes of the routines' FMA instructions, for cost models and peak-speed reports.
    pub fn fma_lanes(self) -> i64 {
        match self {
            TileIsa::Avx2 => 8,
            TileIsa::Avx512 => 16,
        }
    }

    /// The name used on the command line and in messages.
    pub fn name(self) -> &'static str {
        match self {
            TileIsa::Avx2 => "avx2",
            TileIsa::Avx512 => "avx512",
        }
    }

    /// The ISA's routine for calls of `lanes` lanes, with its index in [`ROUTINES`].
    pub fn routine(self, lanes: i64) -> Option<(usize, Routine)> {
        ROUTINES
            .iter()
            .enumerate()
            .find(|(_, r)| r.isa == self && r.tile.lanes == lanes)
            .map(|(i, r)| (i, *r))
    }

    /// What lowering sees of the ISA: its routines, widest first, and their FMA width.
    pub fn target(self) -> TileTarget {
        let mut tiles: Vec<TileRoutine> = ROUTINES
            .iter()
            .filter(|r| r.isa == self)
            .map(|r| r.tile)
            .collect();
        tiles.sort_by_key(|t| std::cmp::Reverse(t.lanes));
        TileTarget {
            // every ISA in ROUTINES has at least one routine (a unit test checks it)
            widest: tiles.first().copied().unwrap_or(TileRoutine {
                lanes: 16,
                max_pixels: 56,
                block_pixels: 28,
            }),
            narrower: tiles.get(1).copied(),
            fma_lanes: self.fma_lanes(),
        }
    }
}

/// A native routine of a contract other than the conv tile's, called by one loop-IR
/// statement each (`Stmt::DepthwiseRow`, `Stmt::SoftmaxRow`, `Stmt::ActivationRows`,
/// `Stmt::StoreRows`, `Stmt::StorePlanes`, `Stmt::BlockedDepthwiseRow`,
/// `Stmt::WinogradOutputRow`); the contracts are in `depthwise.rs`, `softmax.rs`,
/// `activation.rs`, `store.rs`, `depthwise_blocks.rs` and `winograd.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowRoutine {
    /// One output row of one channel of a depthwise convolution.
    Depthwise,
    /// The softmax of one contiguous row.
    Softmax,
    /// A conv or GEMM tile's sums plus their bias, through the activation, in place.
    Activation(RowActivation),
    /// A conv tile's sums plus their bias and a residual, through the activation, into
    /// the result.
    Store(StoreActivation),
    /// One output row of one channel block of a depthwise convolution on channel blocks.
    BlockedDepthwise,
    /// A conv tile's sums plus their bias, through the activation, into the planes of a
    /// result laid out by channel planes.
    Planes(StoreActivation),
    /// One tile row of one channel block of a Winograd product, transformed back into
    /// channel blocks.
    WinogradOutput,
    /// One tile row of one channel block of a Winograd input in channel blocks,
    /// transformed.
    WinogradInput,
}

/// Every row routine, kind by kind and each kind's ISAs in [`RowRoutine::index`]'s
/// order: a JIT module declares them in this order after [`ROUTINES`] and the prefetch
/// helper, so a routine's function id follows from its index here.
pub const ROW_ROUTINES: [(RowRoutine, TileIsa, &str); 28] = [
    (
        RowRoutine::Depthwise,
        TileIsa::Avx2,
        "smelt_depthwise_row_avx2",
    ),
    (
        RowRoutine::Depthwise,
        TileIsa::Avx512,
        "smelt_depthwise_row_avx512",
    ),
    (RowRoutine::Softmax, TileIsa::Avx2, "smelt_softmax_row_avx2"),
    (
        RowRoutine::Softmax,
        TileIsa::Avx512,
        "smelt_softmax_row_avx512",
    ),
    (SILU, TileIsa::Avx2, "smelt_silu_rows_avx2"),
    (SILU, TileIsa::Avx512, "smelt_silu_rows_avx512"),
    (SIGMOID, TileIsa::Avx2, "smelt_sigmoid_rows_avx2"),
    (SIGMOID, TileIsa::Avx512, "smelt_sigmoid_rows_avx512"),
    (GELU, TileIsa::Avx2, "smelt_gelu_rows_avx2"),
    (GELU, TileIsa::Avx512, "smelt_gelu_rows_avx512"),
    (STORE, TileIsa::Avx2, "smelt_store_rows_avx2"),
    (STORE, TileIsa::Avx512, "smelt_store_rows_avx512"),
    (STORE_RELU, TileIsa::Avx2, "smelt_store_relu_rows_avx2"),
    (STORE_RELU, TileIsa::Avx512, "smelt_store_relu_rows_avx512"),
    (
        RowRoutine::BlockedDepthwise,
        TileIsa::Avx2,
        "smelt_blocked_depthwise_row_avx2",
    ),
    (
        RowRoutine::BlockedDepthwise,
        TileIsa::Avx512,
        "smelt_blocked_depthwise_row_avx512",
    ),
    (
        STORE_HARDSWISH,
        TileIsa::Avx2,
        "smelt_store_hardswish_rows_avx2",
    ),
    (
        STORE_HARDSWISH,
        TileIsa::Avx512,
        "smelt_store_hardswish_rows_avx512",
    ),
    (PLANES, TileIsa::Avx2, "smelt_store_planes_avx2"),
    (PLANES, TileIsa::Avx512, "smelt_store_planes_avx512"),
    (PLANES_RELU, TileIsa::Avx2, "smelt_store_relu_planes_avx2"),
    (
        PLANES_RELU,
        TileIsa::Avx512,
        "smelt_store_relu_planes_avx512",
    ),
    (
        PLANES_HARDSWISH,
        TileIsa::Avx2,
        "smelt_store_hardswish_planes_avx2",
    ),
    (
        PLANES_HARDSWISH,
        TileIsa::Avx512,
        "smelt_store_hardswish_planes_avx512",
    ),
    (
        RowRoutine::WinogradOutput,
        TileIsa::Avx2,
        "smelt_winograd_output_row_avx2",
    ),
    (
        RowRoutine::WinogradOutput,
        TileIsa::Avx512,
        "smelt_winograd_output_row_avx512",
    ),
    (
        RowRoutine::WinogradInput,
        TileIsa::Avx2,
        "smelt_winograd_input_row_avx2",
    ),
    (
        RowRoutine::WinogradInput,
        TileIsa::Avx512,
        "smelt_winograd_input_row_avx512",
    ),
];

const SILU: RowRoutine = RowRoutine::Activation(RowActivation::Silu);
const SIGMOID: RowRoutine = RowRoutine::Activation(RowActivation::Sigmoid);
const GELU: RowRoutine = RowRoutine::Activation(RowActivation::Gelu);
const STORE: RowRoutine = RowRoutine::Store(StoreActivation::Identity);
const STORE_RELU: RowRoutine = RowRoutine::Store(StoreActivation::Relu);
const STORE_HARDSWISH: RowRoutine = RowRoutine::Store(StoreActivation::HardSwish);
const PLANES: RowRoutine = RowRoutine::Planes(StoreActivation::Identity);
const PLANES_RELU: RowRoutine = RowRoutine::Planes(StoreActivation::Relu);
const PLANES_HARDSWISH: RowRoutine = RowRoutine::Planes(StoreActivation::HardSwish);

impl RowRoutine {
    /// Every kind, in [`ROW_ROUTINES`]' order.
    pub const ALL: [RowRoutine; 14] = [
        RowRoutine::Depthwise,
        RowRoutine::Softmax,
        SILU,
        SIGMOID,
        GELU,
        STORE,
        STORE_RELU,
        RowRoutine::BlockedDepthwise,
        STORE_HARDSWISH,
        PLANES,
        PLANES_RELU,
        PLANES_HARDSWISH,
        RowRoutine::WinogradOutput,
        RowRoutine::WinogradInput,
    ];

    /// The routine's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            RowRoutine::Depthwise => "depthwise-row",
            RowRoutine::Softmax => "softmax-row",
            RowRoutine::Activation(RowActivation::Silu) => "silu-rows",
            RowRoutine::Activation(RowActivation::Sigmoid) => "sigmoid-rows",
            RowRoutine::Activation(RowActivation::Gelu) => "gelu-rows",
            RowRoutine::Store(StoreActivation::Identity) => "store-rows",
            RowRoutine::Store(StoreActivation::Relu) => "store-relu-rows",
            RowRoutine::Store(StoreActivation::HardSwish) => "store-hardswish-rows",
            RowRoutine::BlockedDepthwise => "blocked-depthwise-row",
            RowRoutine::Planes(StoreActivation::Identity) => "store-planes",
            RowRoutine::Planes(StoreActivation::Relu) => "store-relu-planes",
            RowRoutine::Planes(StoreActivation::HardSwish) => "store-hardswish-planes",
            RowRoutine::WinogradOutput => "winograd-output-row",
            RowRoutine::WinogradInput => "winograd-input-row",
        }
    }

    /// The index in [`ROW_ROUTINES`] of this routine for `isa`.
    pub fn index(self, isa: TileIsa) -> usize {
        let kind = match self {
            RowRoutine::Depthwise => 0,
            RowRoutine::Softmax => 1,
            RowRoutine::Activation(RowActivation::Silu) => 2,
            RowRoutine::Activation(RowActivation::Sigmoid) => 3,
            RowRoutine::Activation(RowActivation::Gelu) => 4,
            RowRoutine::Store(StoreActivation::Identity) => 5,
            RowRoutine::Store(StoreActivation::Relu) => 6,
            RowRoutine::BlockedDepthwise => 7,
            RowRoutine::Store(StoreActivation::HardSwish) => 8,
            RowRoutine::Planes(StoreActivation::Identity) => 9,
            RowRoutine::Planes(StoreActivation::Relu) => 10,
            RowRoutine::Planes(StoreActivation::HardSwish) => 11,
            RowRoutine::WinogradOutput => 12,
            RowRoutine::WinogradInput => 13,
        };
        let isa = match isa {
            TileIsa::Avx2 => 0,
            TileIsa::Avx512 => 1,
        };
        2 * kind + isa
    }

    /// The address of this routine for `isa`, for the JIT to link its symbol to. Call
    /// it (through its `*Fn` type) only if [`TileIsa::host_has`] says so; off x86-64 the
    /// routines do not exist and this is null.
    pub fn entry(self, isa: TileIsa) -> *const u8 {
        #[cfg(target_arch = "x86_64")]
        {
            let (depthwise, softmax, [silu, sigmoid, gelu]): (
                DepthwiseRowFn,
                SoftmaxRowFn,
                [ActivationRowsFn; 3],
            ) = match isa {
                TileIsa::Avx2 => (
                    depthwise_row_avx2,
                    softmax_row_avx2,
                    [silu_rows_avx2, sigmoid_rows_avx2, gelu_rows_avx2],
                ),
                TileIsa::Avx512 => (
                    depthwise_row_avx512,
                    softmax_row_avx512,
                    [silu_rows_avx512, sigmoid_rows_avx512, gelu_rows_avx512],
                ),
            };
            // the AVX2 store routines serve AVX-512 hosts too (see `store.rs`)
            let blocked_depthwise: BlockedDepthwiseRowFn = match isa {
                TileIsa::Avx2 => blocked_depthwise_row_avx2,
                TileIsa::Avx512 => blocked_depthwise_row_avx512,
            };
            let (winograd_output, winograd_input): (WinogradOutputRowFn, WinogradInputRowFn) =
                match isa {
                    TileIsa::Avx2 => (winograd_output_row_avx2, winograd_input_row_avx2),
                    TileIsa::Avx512 => (winograd_output_row_avx512, winograd_input_row_avx512),
                };
            match self {
                RowRoutine::Depthwise => depthwise as *const u8,
                RowRoutine::Softmax => softmax as *const u8,
                RowRoutine::Activation(RowActivation::Silu) => silu as *const u8,
                RowRoutine::Activation(RowActivation::Sigmoid) => sigmoid as *const u8,
                RowRoutine::Activation(RowActivation::Gelu) => gelu as *const u8,
                RowRoutine::Store(act) => store_rows_avx2(act) as *const u8,
                RowRoutine::Planes(act) => store_planes_avx2(act) as *const u8,
                RowRoutine::BlockedDepthwise => blocked_depthwise as *const u8,
                RowRoutine::WinogradOutput => winograd_output as *const u8,
                RowRoutine::WinogradInput => winograd_input as *const u8,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = isa;
            std::ptr::null()
        }
    }
}

impl Routine {
    /// The address of the routine's entry point, for the JIT to link its symbol to. Call
    /// it (through [`ConvTileFn`]) only if [`TileIsa::host_has`] says so; off x86-64 the
    /// routines do not exist and this is null.
    pub fn entry(&self) -> *const u8 {
        #[cfg(target_arch = "x86_64")]
        {
            let f: ConvTileFn = match (self.isa, self.tile.lanes) {
                (TileIsa::Avx2, _) => conv_tile_avx2,
                (TileIsa::Avx512, 32) => conv_tile_avx512_x32,
                (TileIsa::Avx512, _) => conv_tile_avx512,
            };
            f as *const u8
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            std::ptr::null()
        }
    }
}

/// The symbol of [`prefetch_rows`] in JIT code.
pub const PREFETCH_ROWS_SYMBOL: &str = "smelt_prefetch_rows";

/// `extern "C" fn(at, rows, row_stride, row_len)`: see [`prefetch_rows`].
pub type PrefetchRowsFn = unsafe extern "C" fn(*const f32, i64, i64, i64);

/// Prefetches into L2 (`prefetcht1`: with `prefetcht0` the helper itself took 10% of the
/// 64→256 tail, less this way) every cache line of `rows` runs of `row_len` f32 elements,
/// `row_stride` elements apart from `at` — what JIT code calls for a `Stmt::Prefetch`,
/// since Cranelift has no prefetch instruction.
///
/// # Safety
/// None needed for memory: a prefetch never faults and changes no value, so any address
/// is harmless. (JIT code only passes runs that `Kernel::check` proved inside a buffer.)
pub unsafe extern "C" fn prefetch_rows(at: *const f32, rows: i64, row_stride: i64, row_len: i64) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        const LINE: usize = 16;
        for r in 0..rows.max(0) as usize {
            let run = at.wrapping_add(r * row_stride.max(0) as usize);
            let len = row_len.max(0) as usize;
            // the line of every 16th element, and of the last (a run need not be aligned)
            let lines = (0..len).step_by(LINE).chain(len.checked_sub(1));
            for e in lines {
                // SAFETY: prefetching is a hint (SSE, on every x86-64): it cannot fault
                // whatever the address.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(run.wrapping_add(e) as *const i8) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, rows, row_stride, row_len);
}

/// Output channels per call: one packed weight block.
pub const LANES: usize = 16;

/// Output channels per call of the 32-lane kernel ([`conv_tile_avx512_x32`]).
pub const LANES_X32: usize = 32;

/// The contract's arguments as `isize`, shared by the vector kernels' register blocks, and
/// the cursor of the `next` run's prefetches, which runs on from block to block.
#[cfg(target_arch = "x86_64")]
struct Geom {
    w: *const f32,
    rows: isize,
    row_stride: isize,
    taps: isize,
    tap_stride: isize,
    chans: isize,
    chan_stride: isize,
    pixel_stride: isize,
    w_tap_stride: isize,
    out_pixel_stride: isize,
    out_vec_stride: isize,
    out_block_stride: isize,
    accumulate: bool,
    /// The finish's activation, if the sums are finished (see the contract).
    finish: Option<StoreActivation>,
    /// The finish's bias (lane 0), or null.
    bias: *const f32,
    /// The call's `out`, from which a block's offset is also its residual's.
    out: *mut f32,
    /// The finish's residual at the call's `out`, or null.
    residual: *const f32,
    /// The next line of the `next` run to prefetch.
    next: std::cell::Cell<*const f32>,
    /// The end of the `next` run.
    next_end: *const f32,
    /// Pixel-steps (a block's pixels × its input channels) per prefetched line of the
    /// `next` run: its lines spread over the call's work, so a narrow remainder block
    /// (fast steps) issues them no denser than a full one; `isize::MAX` when there is no
    /// run.
    next_every: isize,
}

#[cfg(target_arch = "x86_64")]
impl Geom {
    /// The kernel's view of `shape` (counts and strides as pointer offsets) with the
    /// weights at `w`, prefetching the `next` run, its finish reading `bias` and
    /// `residual` (at `out`'s offsets).
    #[inline(always)]
    fn new(
        w: *const f32,
        shape: &ConvTile,
        next: *const f32,
        out: *mut f32,
        bias: *const f32,
        residual: *const f32,
    ) -> Geom {
        let lines = (shape.next_len.max(0) as usize).div_ceil(16) as isize;
        let steps = [shape.pixels, shape.rows, shape.taps, shape.chans]
            .iter()
            .fold(1isize, |n, &v| n.saturating_mul(v.max(0) as isize));
        let next_every = if lines > 0 {
            (steps / lines).max(1)
        } else {
            isize::MAX
        };
        Geom {
            w,
            rows: shape.rows as isize,
            row_stride: shape.row_stride as isize,
            taps: shape.taps as isize,
            tap_stride: shape.tap_stride as isize,
            chans: shape.chans as isize,
            chan_stride: shape.chan_stride as isize,
            pixel_stride: shape.pixel_stride as isize,
            w_tap_stride: shape.w_tap_stride as isize,
            out_pixel_stride: shape.out_pixel_stride as isize,
            out_vec_stride: shape.out_vec_stride as isize,
            out_block_stride: shape.out_block_stride as isize,
            accumulate: shape.accumulate,
            finish: shape.finish_act(),
            bias,
            out,
            residual,
            next: std::cell::Cell::new(next),
            next_end: next.wrapping_offset(16 * lines),
            next_every,
        }
    }

    /// Whether the reduction is empty (see [`empty_reduction`]).
    fn is_empty(&self) -> bool {
        self.rows <= 0 || self.taps <= 0 || self.chans <= 0
    }

    /// The residual of a block whose output starts at `out` (null without a residual).
    ///
    /// # Safety
    ///
    /// `out` must point into the call's `out` buffer.
    #[inline(always)]
    unsafe fn residual_at(&self, out: *const f32) -> *const f32 {
        if self.residual.is_null() {
            return self.residual;
        }
        // SAFETY: both point into the call's `out` buffer (the caller's contract); the
        // residual is read at the same offsets from its own pointer.
        self.residual
            .wrapping_offset(unsafe { out.offset_from(self.out) })
    }
}

/// One element finished as the store routines finish it (see the contract): the bias,
/// the residual, the activation.
fn finish_one(act: StoreActivation, v: f32, bias: Option<f32>, residual: Option<f32>) -> f32 {
    let v = bias.map_or(v, |b| v + b);
    let v = residual.map_or(v, |r| v + r);
    store::activate_one(act, v)
}

/// Walks a non-empty reduction in the contract's order — rows, taps, input channels —
/// calling `channel(x, w)` with the x of the block's first pixel and the weight row (`row`
/// floats) of each input channel. Ahead of each channel it prefetches:
///
/// - the weight row `W_AHEAD` channels later, running on into the next tap or row when
///   the weights are packed (cold weights stream from memory, and the hardware
///   prefetchers stop at each 4 KiB page);
/// - with `PF` (planar inputs), the x lines of channel `c + X_AHEAD` for the block's `NP`
///   pixels at stride `PS`;
/// - at pixel stride 16 (channel blocks, one line per pixel), at each row's start, the x
///   lines of the next row's pixels (the next block);
/// - every `g.next_every` pixel-steps, the next line of the call's `next` run, into L2.
///
/// Only channels and rows that exist, so only contract addresses are touched. One loop
/// per (row, tap): a second loop for the last channels without prefetches makes LLVM
/// keep the accumulators in memory. Inlined into each kernel's register block, whose
/// `channel` holds the accumulators.
///
/// # Safety
///
/// A non-empty reduction; the contract's indices for these `NP` pixels in bounds.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn for_each_channel<
    const NP: usize,
    const PS: usize,
    const PF: bool,
    const X_AHEAD: isize,
    const W_AHEAD: isize,
>(
    g: &Geom,
    x: *const f32,
    row: isize,
    mut channel: impl FnMut(*const f32, *const f32),
) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
    let prefetch_w_row = |wp: *const f32| {
        for line in 0..row / 16 {
            _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_offset(16 * line) as *const i8);
        }
    };
    // Packed weights (no gap between taps) are one run of weight rows in the walk's
    // order, so the row `W_AHEAD` channels ahead is `W_AHEAD` rows further whether or
    // not it is in the next (row, tap), and only the run's end bounds it (with channel
    // blocks as rows, a row is only 16 channels: stopping at each row's end would
    // prefetch no weight at all); with gaps, each (row, tap) prefetches within itself.
    // One pointer compare per channel, as for the (row, tap) bound alone: a step counter
    // cost the 1×1 tails 3%.
    let packed = g.w_tap_stride == g.chans * row;
    let w_end = g.w.wrapping_offset(g.rows * g.taps * g.chans * row);
    // a countdown in a register; the cursor goes back to `g` at the end
    let mut next = g.next.get();
    let mut countdown = g.next_every;
    // SAFETY: for the whole body, x + r*row_stride + t*tap_stride + c*chan_stride and
    // w + (r*taps+t)*w_tap_stride + c*row are contract indices for r < rows, t < taps,
    // c < chans; packed, every row before `w_end` is the row of one such (r, t, c).
    unsafe {
        for r in 0..g.rows {
            for t in 0..g.taps {
                let xrt = x.offset(r * g.row_stride + t * g.tap_stride);
                let wrt = g.w.offset((r * g.taps + t) * g.w_tap_stride);
                let w_limit = if packed {
                    w_end
                } else {
                    wrt.wrapping_offset(g.chans * row)
                };
                // channel blocks (NCHW16c: pixel stride 16, one line per pixel, the
                // rows are the blocks): the next block's pixel lines, all at once, while
                // this block's 16 channels are summed
                if PS == 16 && r + 1 < g.rows {
                    let next = x.offset((r + 1) * g.row_stride + t * g.tap_stride);
                    for p in 0..NP {
                        _mm_prefetch::<_MM_HINT_T0>(next.add(p * PS) as *const i8);
                    }
                }
                for c in 0..g.chans {
                    if PF && c + X_AHEAD < g.chans {
                        prefetch_pixels::<NP, PS>(xrt.offset((c + X_AHEAD) * g.chan_stride));
                    }
                    let w_ahead = wrt.wrapping_offset((c + W_AHEAD) * row);
                    if w_ahead < w_limit {
                        prefetch_w_row(w_ahead);
                    }
                    countdown -= NP as isize;
                    if countdown <= 0 {
                        countdown += g.next_every;
                        if next < g.next_end {
                            _mm_prefetch::<_MM_HINT_T1>(next as *const i8);
                            next = next.wrapping_add(16);
                        }
                    }
                    channel(xrt.offset(c * g.chan_stride), wrt.offset(c * row));
                }
            }
        }
    }
    g.next.set(next);
}

/// Prefetches the cache lines of pixels `0..NP` at stride `PS` (1 or 2) from `x`: one pixel
/// per 16 floats and the last, so every line of the span is touched.
///
/// # Safety
///
/// `x[p*PS]` for `p < NP` must be contract indices (prefetches cannot fault, but the
/// contract allows no other addresses).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_pixels<const NP: usize, const PS: usize>(x: *const f32) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let step = 16 / PS.max(1);
    let mut p = 0;
    while p < NP {
        _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(p * PS) as *const i8);
        p += step;
    }
    _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add((NP - 1) * PS) as *const i8);
}

/// The degenerate case of an empty reduction (`rows`, `taps` or `chans` zero) for a kernel
/// of `lanes` lanes: the result is the initial value, so only a non-accumulating call writes
/// anything (zeros). Kept apart so that the vector kernels compute only pointers inside the
/// contract's index sets.
///
/// # Safety
///
/// The out indices of the contract for `pixels` pixels and `lanes` lanes must be inside
/// `out`'s buffer.
#[cfg(target_arch = "x86_64")]
unsafe fn empty_reduction(out: *mut f32, pixels: isize, g: &Geom, lanes: isize) {
    if g.accumulate && g.finish.is_none() {
        return;
    }
    for p in 0..pixels {
        for l in 0..lanes {
            let o = p * g.out_pixel_stride
                + (l / 16) * g.out_block_stride
                + (l % 16 / 4) * g.out_vec_stride
                + l % 4;
            // SAFETY: an out index of the contract, and (with a finish) its bias lane and
            // residual element.
            unsafe {
                let s = if g.accumulate { *out.offset(o) } else { 0.0 };
                *out.offset(o) = match g.finish {
                    Some(act) => finish_one(
                        act,
                        s,
                        (!g.bias.is_null()).then(|| *g.bias.offset(l)),
                        (!g.residual.is_null()).then(|| *g.residual_at(out).offset(o)),
                    ),
                    None => s,
                };
            }
        }
    }
}

/// Whether this CPU runs [`conv_tile_avx2`] (AVX2 and FMA). Always false off x86-64.
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs [`conv_tile_avx512`] (AVX-512F). Always false off x86-64.
pub fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The scalar oracle: the contract above as plain f32 loops (multiply, then add), in the
/// order `r, t, c`, for any `shape.lanes`. Portable; slow; for tests.
///
/// # Safety
///
/// `shape` is readable; every index of the contract (module docs) must lie inside the
/// buffers `x`, `w` and `out` point to, and `out` must not overlap `x` or `w`.
pub unsafe extern "C" fn conv_tile_reference(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    shape: *const ConvTile,
    _next: *const f32,
    bias: *const f32,
    residual: *const f32,
) {
    // SAFETY: readable per the contract.
    let t = unsafe { *shape };
    let finish = t.finish_act();
    let lanes = t.lanes;
    for p in 0..t.pixels {
        for l in 0..lanes {
            let o = (p * t.out_pixel_stride
                + (l / 16) * t.out_block_stride
                + (l % 16 / 4) * t.out_vec_stride
                + l % 4) as isize;
            let mut s = if t.accumulate {
                // SAFETY: o is an out index of the contract; the caller proved it in bounds.
                unsafe { *out.offset(o) }
            } else {
                0.0
            };
            for r in 0..t.rows {
                for tap in 0..t.taps {
                    for c in 0..t.chans {
                        let xi = r * t.row_stride
                            + tap * t.tap_stride
                            + c * t.chan_stride
                            + p * t.pixel_stride;
                        let wi = (r * t.taps + tap) * t.w_tap_stride + c * lanes + l;
                        // SAFETY: xi and wi are indices of the contract.
                        s += unsafe { *x.offset(xi as isize) * *w.offset(wi as isize) };
                    }
                }
            }
            if let Some(act) = finish {
                // SAFETY: with a finish, bias lane l and the residual at o are indices of
                // the contract.
                s = unsafe {
                    finish_one(
                        act,
                        s,
                        (!bias.is_null()).then(|| *bias.offset(l as isize)),
                        (!residual.is_null()).then(|| *residual.offset(o)),
                    )
                };
            }
            // SAFETY: as above.
            unsafe { *out.offset(o) = s };
        }
    }
}
