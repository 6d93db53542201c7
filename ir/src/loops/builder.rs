//! [`KernelBuilder`]: builds a kernel statement by statement, handing out fresh
//! variables and loop variables, so lowering code reads like the loop nest it makes.

use super::winograd::{WinogradInputRow, WinogradOutputRow};
use super::{
    trip_count, Access, Affine, BlockedDepthwiseRow, BufId, BufPtr, ConvTile, DepthwiseRow, Expr,
    Kernel, KernelArg, LoopLimit, LoopVar, RowActivation, Stmt, StoreActivation, VarId, Width,
};
use crate::types::DType;

/// Builds a [`Kernel`] statement by statement, handing out fresh variables.
///
/// ```
/// use smelt_ir::loops::*;
/// let mut b = KernelBuilder::new("copy");
/// let x = b.arg("x", 8, Access::Read);
/// let y = b.arg("y", 8, Access::Write);
/// b.for_loop(0, 8, 4, |b, i| {
///     let v = Expr::load(x, Affine::var(i), Width::F32x4);
///     b.store(y, Affine::var(i), v, Width::F32x4);
/// });
/// let k = b.finish();
/// assert!(k.check().is_ok());
/// ```
pub struct KernelBuilder {
    kernel: Kernel,
    stack: Vec<Vec<Stmt>>,
}

impl KernelBuilder {
    /// Starts an empty kernel.
    pub fn new(name: &str) -> KernelBuilder {
        KernelBuilder {
            kernel: Kernel {
                name: name.to_string(),
                args: Vec::new(),
                locals: Vec::new(),
                vars: Vec::new(),
                num_loop_vars: 0,
                body: Vec::new(),
                parallel: false,
            },
            stack: vec![Vec::new()],
        }
    }

    /// Adds an `f32` buffer argument of `len` elements.
    pub fn arg(&mut self, name: &str, len: usize, access: Access) -> BufId {
        self.typed_arg(name, DType::F32, len, access)
    }

    /// Adds a buffer argument of `len` elements of type `dtype`.
    pub fn typed_arg(&mut self, name: &str, dtype: DType, len: usize, access: Access) -> BufId {
        self.kernel.args.push(KernelArg {
            name: name.to_string(),
            dtype,
            len,
            access,
        });
        BufId(self.kernel.args.len() as u32 - 1)
    }

    /// Adds a local scratch buffer of `len` elements (one per call, on its stack).
    pub fn local(&mut self, len: usize) -> BufId {
        self.kernel.locals.push(len);
        BufId(BufId::LOCAL + self.kernel.locals.len() as u32 - 1)
    }

    /// Calls the conv-tile micro-kernel of `tile.lanes` lanes; with `next`, it prefetches
    /// `tile.next_len` elements from there (see [`Stmt::ConvTile`]).
    pub fn conv_tile(
        &mut self,
        x: BufPtr,
        w: BufPtr,
        out: BufPtr,
        next: Option<BufPtr>,
        tile: ConvTile,
    ) {
        self.conv_tile_finished(x, w, out, next, None, None, tile);
    }

    /// [`KernelBuilder::conv_tile`] for a tile that finishes its sums (`tile.finish`)
    /// with this bias and residual.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_tile_finished(
        &mut self,
        x: BufPtr,
        w: BufPtr,
        out: BufPtr,
        next: Option<BufPtr>,
        bias: Option<BufPtr>,
        residual: Option<BufPtr>,
        tile: ConvTile,
    ) {
        self.push(Stmt::ConvTile {
            x,
            w,
            out,
            next,
            bias,
            residual,
            tile,
        });
    }

    /// Calls the depthwise-row routine (see [`Stmt::DepthwiseRow`]).
    pub fn depthwise_row(&mut self, x: BufPtr, w: BufPtr, out: BufPtr, row: DepthwiseRow) {
        self.push(Stmt::DepthwiseRow { x, w, out, row });
    }

    /// Calls the blocked-depthwise-row routine (see [`Stmt::BlockedDepthwiseRow`]).
    pub fn blocked_depthwise_row(
        &mut self,
        x: BufPtr,
        w: BufPtr,
        bias: Option<BufPtr>,
        out: BufPtr,
        row: BlockedDepthwiseRow,
    ) {
        self.push(Stmt::BlockedDepthwiseRow {
            x,
            w,
            bias,
            out,
            row,
        });
    }

    /// Calls the softmax-row routine (see [`Stmt::SoftmaxRow`]).
    pub fn softmax_row(&mut self, x: BufPtr, out: BufPtr, len: i64) {
        self.push(Stmt::SoftmaxRow { x, out, len });
    }

    /// Calls the activation-rows routine of `act` (see [`Stmt::ActivationRows`]).
    pub fn activation_rows(
        &mut self,
        act: RowActivation,
        buf: BufPtr,
        bias: Option<BufPtr>,
        rows: i64,
        lanes: i64,
    ) {
        self.push(Stmt::ActivationRows {
            act,
            buf,
            bias,
            rows,
            lanes,
        });
    }

    /// Calls the store-rows routine of `act` (see [`Stmt::StoreRows`]).
    #[allow(clippy::too_many_arguments)]
    pub fn store_rows(
        &mut self,
        act: StoreActivation,
        sums: BufPtr,
        bias: Option<BufPtr>,
        residual: Option<BufPtr>,
        out: BufPtr,
        rows: i64,
        lanes: i64,
    ) {
        self.push(Stmt::StoreRows {
            act,
            sums,
            bias,
            residual,
            out,
            rows,
            lanes,
        });
    }

    /// Calls the Winograd input row routine (see [`Stmt::WinogradInputRow`]).
    pub fn winograd_input_row(&mut self, x: BufPtr, v: BufPtr, row: WinogradInputRow) {
        self.push(Stmt::WinogradInputRow { x, v, row });
    }

    /// Calls the Winograd output row routine (see [`Stmt::WinogradOutputRow`]).
    pub fn winograd_output_row(&mut self, m: BufPtr, out: BufPtr, row: WinogradOutputRow) {
        self.push(Stmt::WinogradOutputRow { m, out, row });
    }

    /// Calls the store-planes routine of `act` (see [`Stmt::StorePlanes`]).
    #[allow(clippy::too_many_arguments)]
    pub fn store_planes(
        &mut self,
        act: StoreActivation,
        sums: BufPtr,
        bias: Option<BufPtr>,
        out: BufPtr,
        pixels: i64,
        channels: i64,
        lanes: i64,
        plane: i64,
    ) {
        self.push(Stmt::StorePlanes {
            act,
            sums,
            bias,
            out,
            pixels,
            channels,
            lanes,
            plane,
        });
    }

    /// A fresh register variable.
    pub fn var(&mut self, width: Width) -> VarId {
        self.kernel.vars.push(width);
        VarId(self.kernel.vars.len() as u32 - 1)
    }

    /// Assigns `value` to `dst`.
    pub fn assign(&mut self, dst: VarId, value: Expr) {
        self.push(Stmt::Assign { dst, value });
    }

    /// Emits a [`Stmt::Prefetch`] of `rows` runs of `row_len` elements, `row_stride` apart.
    pub fn prefetch(&mut self, at: BufPtr, rows: i64, row_stride: i64, row_len: i64) {
        self.push(Stmt::Prefetch {
            at,
            rows,
            row_stride,
            row_len,
        });
    }

    /// Assigns `value` to a fresh variable of `width` and returns a read of it.
    pub fn let_(&mut self, value: Expr, width: Width) -> Expr {
        let v = self.var(width);
        self.assign(v, value);
        Expr::Var(v)
    }

    /// Stores `value`.
    pub fn store(&mut self, buf: BufId, index: Affine, value: Expr, width: Width) {
        self.push(Stmt::Store {
            buf,
            index,
            value,
            width,
        });
    }

    /// Emits `for i in start..end step step { body(i) }`; nothing when the loop is empty.
    /// A loop of one iteration still gets its variable (folded by code generation).
    pub fn for_loop(
        &mut self,
        start: i64,
        end: i64,
        step: i64,
        body: impl FnOnce(&mut KernelBuilder, LoopVar),
    ) {
        self.for_loop_limited(start, end, step, None, body)
    }

    /// The variable the next loop will get (for a [`LoopLimit`] whose row reads it).
    pub fn next_loop_var(&self) -> LoopVar {
        LoopVar(self.kernel.num_loop_vars)
    }

    /// [`KernelBuilder::for_loop`] cut short at run time by `limit` when there is one
    /// (its row may read the loop's variable: [`KernelBuilder::next_loop_var`]).
    pub fn for_loop_limited(
        &mut self,
        start: i64,
        end: i64,
        step: i64,
        limit: Option<LoopLimit>,
        body: impl FnOnce(&mut KernelBuilder, LoopVar),
    ) {
        if trip_count(start, end, step) == 0 {
            return;
        }
        let var = LoopVar(self.kernel.num_loop_vars);
        self.kernel.num_loop_vars += 1;
        self.stack.push(Vec::new());
        body(self, var);
        let body = self.stack.pop().unwrap_or_default();
        self.push(Stmt::Loop {
            var,
            start,
            end,
            step,
            limit,
            body,
        });
    }

    /// Runs `body(block, count)` over `total` items in blocks of `per`: the whole blocks
    /// in one loop (`block` its variable), then a partial last block (`block` a constant)
    /// with the `count` items it has — so every loop keeps constant bounds (a group's
    /// last channel block padded to a routine's lanes, say).
    pub fn for_blocks(
        &mut self,
        total: usize,
        per: usize,
        body: impl Fn(&mut KernelBuilder, &Affine, usize),
    ) {
        let full = total / per.max(1);
        self.for_loop(0, full as i64, 1, |b, blk| body(b, &Affine::var(blk), per));
        if full * per < total {
            body(self, &Affine::constant(full as i64), total - full * per);
        }
    }

    fn push(&mut self, s: Stmt) {
        if let Some(top) = self.stack.last_mut() {
            top.push(s);
        }
    }

    /// Marks the kernel parallel: its body must be one loop whose iterations are
    /// independent (see [`Kernel::parallel`]); [`Kernel::check`] verifies the shape.
    pub fn set_parallel(&mut self) {
        self.kernel.parallel = true;
    }

    /// The finished kernel. A kernel marked parallel whose body came out as anything but
    /// one loop (e.g. an empty loop was dropped) runs serially.
    pub fn finish(mut self) -> Kernel {
        self.kernel.body = self.stack.pop().unwrap_or_default();
        if !matches!(self.kernel.body.as_slice(), [Stmt::Loop { .. }]) {
            self.kernel.parallel = false;
        }
        self.kernel
    }
}
