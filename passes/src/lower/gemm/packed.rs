//! The packed GEMM: a matrix product on the conv-tile micro-kernels, B packed into panels.
//!
//! A product `A[M, K] · B[K, N]` with row-major A is a 1×1 convolution on channels-last
//! input: A's rows are the pixels (pixel stride K), K is the input channels (channel
//! stride 1), N the output channels. So it needs no contract of its own: B is packed at
//! compile time into panels of the widest routine's lanes, `[N / lanes][K][lanes]` (the
//! packed conv's layout with one tap), then, when those lanes do not divide N, one tail
//! panel `[K][tail lanes]` for the narrowest routine that covers the rest (zero-padded),
//! and each call of a routine sums up to `max_pixels` rows × one panel. The sums go
//! straight into the result when nothing follows them (the routine stores each row's
//! lanes as whole vectors, which is the row-major result), else into a stack buffer that
//! a JIT epilogue finishes as the conv epilogues do: `alpha`, `beta · C`, the absorbed
//! post-ops, f32x4 along N, then stored once.
//!
//! A B that is an activation (attention's `Q·Kᵀ` and `P·V`) is packed the same way by a
//! kernel just before the product, one set of panels per matrix of B, and its batch dims
//! are loops, each call reading its own matrix's panels; the largest of them (the heads)
//! is the one split over threads, so that each thread computes whole matrices.
//!
//! Batched leading dims of A (a rank-3 activation `[1, S, K]` by a 2-D weight) flatten
//! into M when every post-op operand allows it ([`Epilogue::with_merged_rows`]); else
//! they are loops around the rows. The outermost loop is over panels: threads share the
//! weights, each reading its panels once, and a panel (K·lanes floats: 48–192 KiB at the
//! encoders' K) stays in L2 while every row streams past it; the first call of a
//! panel's sweep prefetches the whole next panel, which would otherwise arrive cold from
//! memory ([`NextPanel`]).

use smelt_ir::loops::{
    Access, Affine, BinOp, BufId, BufPtr, ConvTile, Expr, KernelBuilder, LoopLimit, LoopVar,
    TileRoutine, TileTarget, Width,
};
use smelt_ir::op::Op;
use smelt_ir::{AlignedBuf, ConstantSlab, DType, Diagnostic, Value};

use super::GemmGeo;
use crate::lower::copy::fill_nest;
use crate::lower::elementwise::{
    broadcast_strides, dims_name, index_of, load_lanes, row_major_strides, Epilogue,
};
use crate::lower::{valid_rows_suffix, BufferId, Cx};

/// A product by a constant B planned onto the micro-kernel routine `routine`.
#[derive(Clone)]
pub(super) struct PackedGemm {
    /// The routine of every whole panel (the target's widest).
    routine: TileRoutine,
    /// The routine of the last panel when the widest's lanes do not divide N: the
    /// narrowest that covers the remaining columns (a 197-column `Q·Kᵀ` runs six
    /// 32-lane panels and one of 16, not thirteen of 16).
    tail: Option<TileRoutine>,
    /// Batch dims still looped over (empty when they are flattened into `rows`).
    batch: Vec<usize>,
    /// A's elements between consecutive indices of each looped batch dim (0 where A
    /// broadcasts).
    a_batch: Vec<i64>,
    /// Packed B's elements between consecutive indices of each looped batch dim (0 where
    /// B broadcasts, always for a 2-D B).
    b_batch: Vec<i64>,
    /// B's elements (in its source buffer) between consecutive indices of each looped
    /// batch dim, for the packing kernel of a B packed at run time.
    b_src_batch: Vec<i64>,
    /// B's own matrices (the product of its batch dims; 1 for a 2-D B).
    b_matrices: usize,
    /// B is packed by a kernel at run time (an activation), not at compile time.
    runtime_b: bool,
    /// Rows of A (and of the result) per batch index.
    rows: usize,
    k: usize,
    n: usize,
    /// A's elements between consecutive rows (K, unless A is a view) and its first's
    /// index.
    a_m: i64,
    a_offset: i64,
    /// B's elements between consecutive rows and columns, and its first's index (a B
    /// packed at run time may be a view; a constant one is row-major or transposed).
    b_k: i64,
    b_n: i64,
    b_offset: i64,
    alpha: f32,
    beta: f32,
    /// A factor of the product folded into the packed B (the scalar scales of attention's
    /// Q and Kᵀ, which the epilogue would otherwise apply to every sum: B is linear in
    /// them and is copied anyway).
    scale: f32,
    /// Where the result goes when it is written through a view (attention's head merge,
    /// a transpose of the heads and rows): the elements between consecutive indices of
    /// each batch dim and between consecutive rows; `None`: row-major.
    out_view: Option<(Vec<i64>, i64)>,
}

/// The kernel arguments of one packed-GEMM kernel.
struct Args {
    a: BufId,
    w: BufId,
    /// Gemm's `C` and its broadcast strides against `[M, N]`.
    c: Option<(BufId, Vec<i64>)>,
    out: BufId,
    /// The run's valid rows, when the product stops there ([`PackedGemm::stops_at_valid_rows`]).
    valid_rows: Option<BufId>,
}

impl Args {
    /// The valid rows' argument and the rows of `routine`'s register block, the calls
    /// the block a run's valid rows end in is computed in ([`for_row_blocks`]).
    fn valid_rows_in(&self, routine: TileRoutine) -> Option<(BufId, usize)> {
        let block = routine.block_pixels.max(1) as usize;
        self.valid_rows.map(|b| (b, block))
    }
}

/// Attention's `P·V`, computed in its scores' kernel ([`PackedGemm::second_product`]).
struct SecondProduct {
    /// The instruction whose value it writes (`P·V`'s, or the head merge's).
    written: usize,
    plan: PackedGemm,
    epi: Epilogue,
    /// V, packed by a kernel before.
    v_packed: BufferId,
    out: BufferId,
}

/// Where the packed GEMM's B comes from.
pub(super) enum BSource<'a> {
    /// A constant weight's values and storage, packed at compile time.
    Constant(&'a [f32], &'a std::sync::Arc<AlignedBuf>),
    /// An activation, packed by a kernel before the product.
    Runtime(Value),
}

impl PackedGemm {
    /// The plan for `geo` when it fits: a micro-kernel target, row-major A, B with both
    /// of its dims kept — a constant 2-D weight, packed at compile time, or with
    /// `runtime_b` any row-major B of at least 8 rows of A per matrix, packed by a kernel
    /// first (a copy of B, cheap against the product from 8 rows on) — and a padded last
    /// panel wasting at most half of it (fewer columns go to the Cranelift tiles).
    /// Returns it with the epilogue it applies (the rows merged when the batch dims
    /// flatten).
    pub(super) fn plan(
        cx: &Cx,
        geo: &GemmGeo,
        epi: &Epilogue,
        runtime_b: bool,
    ) -> Option<(PackedGemm, Epilogue)> {
        let target = cx.opts.micro?;
        let (routine, tail, padded) = Self::routines(target, geo, runtime_b)?;
        // With a 2-D B, A's batch dims are the result's, so the rows of a row-major A
        // run on across them (those of a view may too): flatten when the epilogue's
        // operands allow it.
        let b_batched = geo.b_batch.iter().any(|&s| s != 0);
        let lead = geo.batch.len() + 1;
        let merged = match (b_batched || geo.batch.is_empty(), geo.merged_row_stride()) {
            (false, Some(stride)) => epi
                .with_merged_rows(&geo.out_dims, lead)
                .map(|e| (e, stride)),
            _ => None,
        };
        // B's own matrices: one packed matrix per index of its batch dims that are not
        // broadcast, row-major over them
        let packed_matrix = (padded * geo.k) as i64;
        let mut b_matrices = 1usize;
        let mut b_batch = vec![0i64; geo.batch.len()];
        for d in (0..geo.batch.len()).rev() {
            if geo.b_batch[d] != 0 {
                b_batch[d] = b_matrices as i64 * packed_matrix;
                b_matrices *= geo.batch[d];
            }
        }
        let plan = |batch, rows, a_batch, b_batch, b_src_batch| PackedGemm {
            routine,
            tail,
            batch,
            a_batch,
            b_batch,
            b_src_batch,
            b_matrices,
            runtime_b,
            rows,
            k: geo.k,
            n: geo.n,
            a_m: geo.a_m,
            a_offset: geo.a_offset,
            b_k: geo.b_k,
            b_n: geo.b_n,
            b_offset: geo.b_offset,
            alpha: geo.alpha,
            beta: geo.beta,
            scale: 1.0,
            out_view: None,
        };
        let planned = match merged {
            Some((merged, stride)) => {
                let rows = geo.batch.iter().product::<usize>() * geo.m;
                let plan = PackedGemm {
                    a_m: stride,
                    ..plan(Vec::new(), rows, Vec::new(), Vec::new(), Vec::new())
                };
                (plan, merged)
            }
            None => {
                let plan = plan(
                    geo.batch.clone(),
                    geo.m,
                    geo.a_batch.clone(),
                    b_batch,
                    geo.b_batch.clone(),
                );
                (plan, epi.clone())
            }
        };
        // leading products by one constant value go into packed B (when no `beta · C`
        // joins the sums before the epilogue: that term is not scaled)
        let (plan, epi) = planned;
        Some(match epi.leading_scale().filter(|_| geo.beta == 0.0) {
            Some((scale, rest)) => (PackedGemm { scale, ..plan }, rest),
            None => (plan, epi),
        })
    }

    /// Whether [`PackedGemm::plan`] takes `geo` on `target` (`runtime_b`: B packed by a
    /// kernel), whatever the epilogue.
    pub(super) fn takes(target: TileTarget, geo: &GemmGeo, runtime_b: bool) -> bool {
        Self::routines(target, geo, runtime_b).is_some()
    }

    /// The routines of the whole panels and of the tail (if any), and the padded N,
    /// when the product fits: A's columns adjacent (any row stride); B a constant 2-D
    /// weight, or with `runtime_b` any B whose columns or rows are adjacent, of at least
    /// 8 rows of A per matrix (the copy is cheap against the product from 8 rows on);
    /// and a padding of at most half of N.
    fn routines(
        target: TileTarget,
        geo: &GemmGeo,
        runtime_b: bool,
    ) -> Option<(TileRoutine, Option<TileRoutine>, usize)> {
        let b_batched = geo.b_batch.iter().any(|&s| s != 0);
        let b_fits = if runtime_b {
            (geo.b_n == 1 || geo.b_k == 1) && geo.m >= 8
        } else {
            !b_batched && geo.b_offset == 0
        };
        let fits = geo.a_k == 1
            && geo.a_m >= 0
            && geo.has_m
            && geo.has_n
            && b_fits
            && geo.m > 0
            && geo.k > 0
            && geo.n > 0;
        if !fits {
            return None;
        }
        // whole panels of the widest routine (its tiles do one load of B per two FMAs
        // per pixel, the 16-lane tiles one per FMA), the rest on the narrowest that
        // covers it
        let routine = target.widest;
        let lanes = usize::try_from(routine.lanes).ok().filter(|&l| l > 0)?;
        let rest = geo.n % lanes;
        let tail = match rest {
            0 => None,
            _ => Some(
                target
                    .routines()
                    .filter(|r| r.lanes as usize >= rest)
                    .min_by_key(|r| r.lanes)?,
            ),
        };
        let padded = geo.n / lanes * lanes + tail.map_or(0, |t| t.lanes as usize);
        (padded <= 2 * geo.n).then_some((routine, tail, padded))
    }

    /// Lanes of the whole panels.
    fn lanes(&self) -> usize {
        self.routine.lanes as usize
    }

    /// Panels of the widest routine's lanes, all of them whole.
    fn full_panels(&self) -> usize {
        self.n / self.lanes()
    }

    /// Each panel's first column and lanes: the whole panels, then the tail (its
    /// columns past N padded).
    fn panel_list(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let lanes = self.lanes();
        let tail = self
            .tail
            .map(|t| (self.full_panels() * lanes, t.lanes as usize));
        (0..self.full_panels())
            .map(move |p| (p * lanes, lanes))
            .chain(tail)
    }

    /// Packed elements of one whole panel (the tail, if any, starts after the last).
    fn panel_len(&self) -> i64 {
        (self.k * self.lanes()) as i64
    }

    /// Packed elements of one matrix of B: its whole panels and its tail.
    fn matrix_len(&self) -> usize {
        self.panel_list().map(|(_, lanes)| self.k * lanes).sum()
    }

    /// Packs `B` (element `(k, n)` at `k·b_k + n·b_n` of `data`) into the panels.
    fn pack(&self, data: &[f32], b_k: usize, b_n: usize, slab: &ConstantSlab) -> AlignedBuf {
        let (k, n, scale) = (self.k, self.n, self.scale);
        slab.f32_with(self.matrix_len(), |out| {
            let rows_fit = k
                .checked_sub(1)
                .and_then(|last| last.checked_mul(b_k)?.checked_add(n))
                .is_some_and(|end| data.len() >= end);
            let row_major = b_n == 1 && b_k >= n && rows_fit;
            let mut rest = out;
            for (first, lanes) in self.panel_list() {
                let (block, after) = rest.split_at_mut(k * lanes);
                rest = after;
                let width = lanes.min(n - first);
                for (kk, row) in block.chunks_exact_mut(lanes).enumerate() {
                    if row_major {
                        // row-major B (a MatMul's weights): each panel row is a run of its
                        // row, copied whole (BERT-base's 85 M weights: 0.3 s element by
                        // element)
                        let at = kk * b_k + first;
                        row[..width].copy_from_slice(&data[at..at + width]);
                    } else {
                        for (l, d) in row[..width].iter_mut().enumerate() {
                            let at = kk * b_k + (first + l) * b_n;
                            *d = data.get(at).copied().unwrap_or(0.0);
                        }
                    }
                    if scale != 1.0 {
                        row[..width].iter_mut().for_each(|d| *d *= scale);
                    }
                }
            }
        })
    }

    /// Lowers the product: packs B — a constant at compile time (deferred to the packing
    /// cores), an activation by a kernel — then one kernel for the whole panels and,
    /// when the lanes do not divide N, one for the padded last.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lower<'a>(
        &self,
        cx: &mut Cx<'a>,
        b: BSource<'a>,
        geo: &GemmGeo,
        a_val: Value,
        c_val: Option<Value>,
        epi: Epilogue,
        out: BufferId,
    ) -> Result<(), Diagnostic> {
        let len = self.b_matrices * self.matrix_len();
        let w = match b {
            BSource::Constant(data, weight) => {
                let (b_k, b_n) = (geo.b_k as usize, geo.b_n as usize);
                // every parameter `pack` reads: the same panels for any number of rows
                let recipe = format!(
                    "gemm panels k{} n{} lanes{:?} scale{:?} b_k{b_k} b_n{b_n}",
                    self.k,
                    self.n,
                    self.panel_list().collect::<Vec<_>>(),
                    self.scale,
                );
                let pack = self.clone();
                let job = Box::new(move |slab: &ConstantSlab| pack.pack(data, b_k, b_n, slab));
                cx.constant_later_from(weight, recipe, ("b_packed", len), job)
            }
            BSource::Runtime(v) => self.pack_runtime(cx, v)?,
        };
        let a = cx.buf(a_val);
        let bufs = (a, w, c_val, out);
        if let Some(dim) = self.parallel_batch_dim() {
            return self.batch_kernel(cx, bufs, epi, dim);
        }
        let valid_rows = self.stops_at_valid_rows(cx, out);
        let full = self.full_panels();
        if full > 0 {
            let panels = 0..full;
            self.kernel(
                cx,
                bufs,
                epi.clone(),
                panels,
                self.routine,
                self.lanes(),
                valid_rows,
            )?;
        }
        if let Some(tail) = self.tail {
            let rest = self.n - full * self.lanes();
            self.kernel(cx, bufs, epi, full..full + 1, tail, rest, valid_rows)?;
        }
        Ok(())
    }

    /// The buffer of a run's valid rows when this product (into its instruction's own
    /// row-major result `out`, rows merged, so one kernel per panel set) computes a padded
    /// sequence's positions as its rows, which may stop there ([`Cx::valid_rows_for`]):
    /// the result is `[1, …, 1, rows, N]`, so row `r` is position `r`.
    fn stops_at_valid_rows(&self, cx: &mut Cx, out: BufferId) -> Option<BufferId> {
        let dims = &cx.func.insts[cx.cur_inst].ty.dims;
        let axis = dims.len().checked_sub(2)?;
        let rows_axis = dims[..axis].iter().all(|&d| d == 1) && dims[axis] == self.rows;
        let plain = self.batch.is_empty() && self.out_view.is_none();
        (rows_axis && plain)
            .then(|| cx.valid_rows_for(out, axis))
            .flatten()
    }

    /// Where row `row` of batch index `bidx` (`flat` as one number) starts in the
    /// result, and the elements between rows there.
    fn out_row(&self, flat: &Affine, bidx: &[Affine], row: &Affine) -> (Affine, i64) {
        match &self.out_view {
            Some((batch, m)) => (index_of(batch, bidx).add(&row.scale(*m)), *m),
            None => {
                let (rows, n) = (self.rows as i64, self.n as i64);
                (flat.scale(rows * n).add(&row.scale(n)), n)
            }
        }
    }

    /// B's panels packed from activation `v` by a kernel, in a new temporary.
    fn pack_runtime(&self, cx: &mut Cx, v: Value) -> Result<BufferId, Diagnostic> {
        let len = self.b_matrices * self.matrix_len();
        let b_buf = cx.buf(v);
        let w = cx.temp("b_packed", len);
        let k = self.pack_kernel(cx.len_of(b_buf), len);
        cx.step(k, vec![b_buf, w])?;
        Ok(w)
    }

    /// Whether `second` can run in this product's by-batch kernel (split over `dim`) on
    /// each block of its finished rows: the same batch and rows, split the same way, and
    /// this product's result, row-major, its A.
    fn feeds(&self, second: &PackedGemm, dim: usize) -> bool {
        let (rows, n) = (self.rows as i64, self.n as i64);
        let strides = row_major_strides(&self.batch);
        let a_is_ours = second.a_m == n
            && second.a_offset == 0
            && second.a_batch.len() == self.batch.len()
            && (0..self.batch.len())
                .all(|d| self.batch[d] == 1 || second.a_batch[d] == strides[d] * rows * n);
        second.batch == self.batch
            && second.rows == self.rows
            && second.k == self.n
            && second.parallel_batch_dim() == Some(dim)
            && second.alpha == 1.0
            && a_is_ours
    }

    /// The rows `row0..row0 + pixels` of batch index `bidx` against every panel: the
    /// whole panels, then the tail.
    #[allow(clippy::too_many_arguments)]
    fn rows_by_panels(
        &self,
        kb: &mut KernelBuilder,
        args: &Args,
        epi: &Epilogue,
        bidx: &[Affine],
        row0: &Affine,
        pixels: usize,
    ) {
        let full = self.full_panels() as i64;
        let whole = |p: Affine| PanelAt {
            panel: p,
            routine: self.routine,
            valid: self.lanes(),
            prefetch: NextPanel::No,
        };
        match full {
            0 => {}
            1 => self.call(
                kb,
                args,
                epi,
                &whole(Affine::constant(0)),
                bidx,
                row0,
                pixels,
            ),
            _ => kb.for_loop(0, full, 1, |kb, p| {
                self.call(kb, args, epi, &whole(Affine::var(p)), bidx, row0, pixels)
            }),
        }
        if let Some(routine) = self.tail {
            let at = PanelAt {
                panel: Affine::constant(full),
                routine,
                valid: self.n - self.full_panels() * self.lanes(),
                prefetch: NextPanel::No,
            };
            self.call(kb, args, epi, &at, bidx, row0, pixels);
        }
    }

    /// Rows of A one call of every panel's routine takes.
    fn rows_per_call(&self) -> usize {
        let tail = self.tail.map_or(usize::MAX, |t| t.max_pixels as usize);
        (self.routine.max_pixels as usize).min(tail).max(1)
    }

    /// The batch dim a product of activations splits over threads, when it has one of
    /// two or more: the largest (the heads of attention's `Q·Kᵀ` and `P·V`). Each thread
    /// then computes whole matrices, every panel of them, from its own matrices of A and
    /// packed B, and writes whole rows of the result, which the next kernel (a softmax
    /// over the rows) reads; split over panels, both threads wrote every row and
    /// exchanged its cache lines on every run (ViT's 197 × 197 × 64 `Q·Kᵀ` ran 1.2×
    /// faster on two threads than on one, against ONNX Runtime's 1.9×).
    fn parallel_batch_dim(&self) -> Option<usize> {
        if !self.runtime_b {
            return None;
        }
        let (dim, &extent) = self
            .batch
            .iter()
            .enumerate()
            .rev()
            .max_by_key(|&(_, &d)| d)?;
        (extent >= 2).then_some(dim)
    }

    /// One kernel for the whole product, parallel over batch dim `dim`: for each of its
    /// matrices, blocks of rows against every panel; then, on each finished block while
    /// it is in cache, the softmax along its rows that is the product's one reader, and
    /// attention's `P·V` that is the softmax's one reader (`cx.attention_after`), when
    /// its plan agrees ([`PackedGemm::feeds`]): its B packed first, its result written
    /// here for its instruction (`cx.written_early`).
    fn batch_kernel(
        &self,
        cx: &mut Cx,
        (a, w, c_val, out): (BufferId, BufferId, Option<Value>, BufferId),
        mut epi: Epilogue,
        dim: usize,
    ) -> Result<(), Diagnostic> {
        // a softmax along the rows that reads nothing else runs here, in place
        let softmax_inst = cx.softmax_after.get(&cx.cur_inst).copied();
        let softmax = softmax_inst.is_some();
        let second = match softmax {
            true => self.second_product(cx, dim)?,
            false => None,
        };
        let tail = self
            .tail
            .map_or(String::new(), |t| format!("_t{}", t.lanes));
        let then = match (&second, softmax) {
            (Some(_), _) => "_softmax_pv",
            (None, true) => "_softmax",
            (None, false) => "",
        };
        // each matrix's rows stop at a run's valid rows when they are a padded
        // sequence's positions its value (and the softmax's it holds) may leave free
        let valid_rows = match (&second, self.out_view.is_none()) {
            (None, true) => {
                let axis = self.batch.len();
                let softmax_free =
                    softmax_inst.is_none_or(|s| cx.rows_free(cx.func.inst_value(s), axis));
                softmax_free.then(|| cx.valid_rows_for(out, axis)).flatten()
            }
            _ => None,
        };
        let stops = valid_rows_suffix(valid_rows.is_some());
        let what = format!("{tail}_by_batch{then}{stops}");
        let name = self.kernel_name(self.lanes(), &what, c_val, &epi);
        let bufs = (a, w, c_val, out);
        let (mut kb, args, mut steps) = self.kernel_args(cx, &name, bufs, &mut epi, valid_rows);
        // the second product reads this one's result as its A
        let second = second.map(|mut second| {
            let wa = kb.arg("v_packed", cx.len_of(second.v_packed), Access::Read);
            steps.push(second.v_packed);
            steps.extend(second.epi.declare(&mut kb));
            let oa = kb.arg("pv", cx.len_of(second.out), Access::Write);
            steps.push(second.out);
            let args2 = Args {
                a: args.out,
                w: wa,
                c: None,
                out: oa,
                valid_rows: None,
            };
            (second, args2)
        });
        let others: Vec<usize> = (0..self.batch.len()).filter(|&d| d != dim).collect();
        let extents: Vec<usize> = others.iter().map(|&d| self.batch[d]).collect();
        // a block of rows against every panel: the block stays in L1 while B's panels
        // (K × N, 53 KB for ViT's Q·Kᵀ) stream from L2
        let per_call = second
            .as_ref()
            .map_or(usize::MAX, |(second, _)| second.plan.rows_per_call())
            .min(self.rows_per_call());
        kb.set_parallel();
        kb.for_loop(0, self.batch[dim] as i64, 1, |kb, i| {
            for_batches(kb, &extents, &mut Vec::new(), &mut |kb, inner| {
                let mut bidx = vec![Affine::constant(0); self.batch.len()];
                bidx[dim] = Affine::var(i);
                for (&d, at) in others.iter().zip(inner) {
                    bidx[d] = at.clone();
                }
                let block = |kb: &mut KernelBuilder, row0: &Affine, pixels: usize| {
                    self.rows_by_panels(kb, &args, &epi, &bidx, row0, pixels);
                    // the block's rows are whole now, and in cache: their softmax
                    if softmax {
                        let flat = index_of(&row_major_strides(&self.batch), &bidx);
                        let (rows, n) = (self.rows as i64, self.n as i64);
                        kb.for_loop(0, pixels as i64, 1, |kb, r| {
                            let row = Affine::var(r).add(row0);
                            let at = flat.scale(rows * n).add(&row.scale(n));
                            let ptr = BufPtr {
                                buf: args.out,
                                index: at,
                            };
                            kb.softmax_row(ptr.clone(), ptr, n);
                        });
                    }
                    // and the block's rows of P·V, from the probabilities just written
                    if let Some((second, args2)) = &second {
                        let plan = &second.plan;
                        plan.rows_by_panels(kb, args2, &second.epi, &bidx, row0, pixels);
                    }
                };
                for_row_blocks(
                    kb,
                    (self.rows, false),
                    per_call,
                    args.valid_rows_in(self.routine),
                    &mut |kb, row0, pixels| block(kb, row0, pixels),
                );
                let all = 0..self.n;
                self.clear_rows_past_valid(kb, &args, &bidx, all, &Affine::constant(0));
            });
        });
        // the softmax's value is this product's buffer, which it finished in place
        if let Some(s) = softmax_inst {
            cx.written_early.insert(s, out);
        }
        if let Some((second, _)) = second {
            cx.written_early.insert(second.written, second.out);
        }
        cx.step(kb.finish(), steps)
    }

    /// Attention's `P·V` for this product's by-heads kernel (split over `dim`) to compute
    /// on each block of finished, softmaxed rows (`cx.attention_after`), when its plan
    /// agrees ([`PackedGemm::feeds`]): V packed now, and the buffer it writes — the head
    /// merge's, read through [`PackedGemm::out_view`], when that transpose is its one
    /// reader (`cx.merged_after`) and its plan loops every batch dim.
    fn second_product(&self, cx: &mut Cx, dim: usize) -> Result<Option<SecondProduct>, Diagnostic> {
        let Some((q, mut plan, epi, v)) = cx
            .attention_after
            .get(&cx.cur_inst)
            .copied()
            .and_then(|q| super::second_product_plan(cx, q).map(|(p, e, v)| (q, p, e, v)))
            .filter(|(_, p, _, _)| self.feeds(p, dim))
        else {
            return Ok(None);
        };
        let v_packed = plan.pack_runtime(cx, v)?;
        let merge = cx
            .merged_after
            .get(&q)
            .copied()
            .filter(|&t| cx.func.insts[t].ty.rank() == plan.batch.len() + 2);
        let written = merge.unwrap_or(q);
        let ty = &cx.func.insts[written].ty;
        let name = format!("v{}", cx.func.inst_value(written).0);
        let out = cx.typed_temp(&name, ty.dtype, ty.storage_len());
        if let Some(t) = merge {
            let Op::Transpose { perm } = &cx.func.insts[t].op else {
                unreachable!("merged_after holds transposes")
            };
            // source dim d of the merge lies at the merged layout's stride of perm⁻¹(d)
            let strides = row_major_strides(&ty.dims);
            let mut of_source = vec![0i64; perm.len()];
            for (j, &d) in perm.iter().enumerate() {
                of_source[d] = strides[j];
            }
            let rows_at = perm.len() - 2;
            plan.out_view = Some((of_source[..rows_at].to_vec(), of_source[rows_at]));
            // the product's own value has no bytes: only the merge read it
            let nothing = cx.typed_temp(&format!("{name}_merged"), ty.dtype, 0);
            cx.written_early.insert(q, nothing);
        }
        Ok(Some(SecondProduct {
            written,
            plan,
            epi,
            v_packed,
            out,
        }))
    }

    /// The kernel that packs a row-major B of `b_matrices` matrices `[K, N]` (`b_len`
    /// elements) into `len` elements of panels: f32x4 copies of whole panels' rows, the
    /// padded last panel's valid columns one by one and its padding zeroed (those lanes
    /// are never stored, but reused arena memory could hold anything, and the sums
    /// should never depend on it). Parallel over B's matrices.
    fn pack_kernel(&self, b_len: usize, len: usize) -> smelt_ir::loops::Kernel {
        let (k, n, lanes) = (self.k as i64, self.n as i64, self.lanes() as i64);
        let (b_k, b_n) = (self.b_k, self.b_n);
        let full = n / lanes;
        let valid = n - full * lanes;
        let tail_lanes = self.tail.map_or(0, |t| t.lanes);
        let mut kb = KernelBuilder::new(&format!(
            "gemm_pack_b_{}x{}x{}_l{}{}{}",
            self.b_matrices,
            self.k,
            self.n,
            lanes,
            self.tail
                .map_or(String::new(), |t| format!("_t{}", t.lanes)),
            if b_n == 1 { "" } else { "_gather" }
        ));
        let b = kb.arg("b", b_len, Access::Read);
        let w = kb.arg("b_packed", len, Access::Write);
        let w4 = Width::F32x4;
        // B's own matrices: the batch dims it is not broadcast over
        let (mut extents, mut src_strides, mut dst_strides) = (Vec::new(), Vec::new(), Vec::new());
        for ((&d, &src), &dst) in self.batch.iter().zip(&self.b_src_batch).zip(&self.b_batch) {
            if src != 0 {
                extents.push(d);
                src_strides.push(src);
                dst_strides.push(dst);
            }
        }
        if extents.first().is_some_and(|&d| d > 1) {
            kb.set_parallel();
        }
        // `width` columns from column `col` of row `kk`: a vector at a time where B's
        // columns are adjacent, else one at a time; zeros past `valid`
        let scaled = |x: Expr, width: Width| match self.scale {
            1.0 => x,
            s => Expr::binary(BinOp::Mul, x, Expr::constant(s, width)),
        };
        let row = |kb: &mut KernelBuilder, from: &Affine, to: &Affine, width: i64, valid: i64| {
            let mut l = 0;
            while l < width {
                let (x, stored, step) = if b_n == 1 && l + 4 <= valid {
                    (scaled(Expr::load(b, from.plus(l), w4), w4), w4, 4)
                } else if l < valid {
                    let at = from.add(&Affine::constant(l).scale(b_n));
                    let x = scaled(Expr::load(b, at, Width::Scalar), Width::Scalar);
                    (x, Width::Scalar, 1)
                } else {
                    (Expr::constant(0.0, Width::Scalar), Width::Scalar, 1)
                };
                kb.store(w, to.plus(l), x, stored);
                l += step;
            }
        };
        for_batches(&mut kb, &extents, &mut Vec::new(), &mut |kb, idx| {
            let src = index_of(&src_strides, idx).plus(self.b_offset);
            let dst = index_of(&dst_strides, idx);
            kb.for_loop(0, full, 1, |kb, p| {
                let p = Affine::var(p);
                kb.for_loop(0, k, 1, |kb, kk| {
                    let kk = Affine::var(kk);
                    let from = src.add(&kk.scale(b_k)).add(&p.scale(lanes * b_n));
                    let to = dst.add(&p.scale(k * lanes)).add(&kk.scale(lanes));
                    row(kb, &from, &to, lanes, lanes);
                });
            });
            if valid > 0 {
                kb.for_loop(0, k, 1, |kb, kk| {
                    let kk = Affine::var(kk);
                    let from = src.add(&kk.scale(b_k)).plus(full * lanes * b_n);
                    let to = dst.plus(full * k * lanes).add(&kk.scale(tail_lanes));
                    row(kb, &from, &to, tail_lanes, valid);
                });
            }
        });
        kb.finish()
    }

    /// One kernel over `panels`, each with `valid` result columns (the lanes, or fewer in
    /// the padded last panel): parallel over the panels when there are several, else
    /// one serial call sequence; stopping at a run's valid rows when `valid_rows` holds
    /// them.
    #[allow(clippy::too_many_arguments)]
    fn kernel(
        &self,
        cx: &mut Cx,
        (a, w, c_val, out): (BufferId, BufferId, Option<Value>, BufferId),
        mut epi: Epilogue,
        panels: std::ops::Range<usize>,
        routine: TileRoutine,
        valid: usize,
        valid_rows: Option<BufferId>,
    ) -> Result<(), Diagnostic> {
        let lanes = routine.lanes as usize;
        let partial = if valid < lanes { "_partial" } else { "" };
        let stops = valid_rows_suffix(valid_rows.is_some());
        let what = format!("_p{}{partial}{stops}", panels.start);
        let name = self.kernel_name(lanes, &what, c_val, &epi);
        let bufs = (a, w, c_val, out);
        let (mut kb, args, steps) = self.kernel_args(cx, &name, bufs, &mut epi, valid_rows);
        let count = panels.len();
        let first = panels.start as i64;
        if count > 1 {
            kb.set_parallel();
            kb.for_loop(0, count as i64, 1, |kb, p| {
                let at = Affine::var(p).plus(first);
                // a weight arrives cold from memory; a B packed just before is in cache
                self.panel(kb, &args, &epi, &at, routine, valid, !self.runtime_b)
            });
        } else {
            let at = Affine::constant(first);
            self.panel(&mut kb, &args, &epi, &at, routine, valid, false);
        }
        cx.step(kb.finish(), steps)
    }

    /// A product kernel's name: its shape, batch dims and lanes, `what` it computes of
    /// the product, and whether it reads C and applies an epilogue.
    fn kernel_name(&self, lanes: usize, what: &str, c: Option<Value>, epi: &Epilogue) -> String {
        format!(
            "gemm_packed_{}x{}x{}_b{}_l{lanes}{what}{}{}",
            self.rows,
            self.n,
            self.k,
            dims_name(&self.batch),
            if c.is_some() { "_c" } else { "" },
            if epi.is_empty() { "" } else { "_fused" },
        )
    }

    /// A kernel named `name` with the product's arguments: A, packed B, C (if any), the
    /// epilogue's operands and the result; returns it with the arguments' ids and the
    /// buffers of its step.
    fn kernel_args(
        &self,
        cx: &mut Cx,
        name: &str,
        (a, w, c_val, out): (BufferId, BufferId, Option<Value>, BufferId),
        epi: &mut Epilogue,
        valid_rows: Option<BufferId>,
    ) -> (KernelBuilder, Args, Vec<BufferId>) {
        let mut kb = KernelBuilder::new(name);
        let mut steps = vec![a, w];
        let aa = kb.arg("a", cx.len_of(a), Access::Read);
        let wa = kb.arg("b_packed", cx.len_of(w), Access::Read);
        let c = c_val.map(|v| {
            let cb = cx.buf(v);
            steps.push(cb);
            let dims = &cx.func.type_of(v).dims;
            let strides = broadcast_strides(dims, &[self.rows, self.n]);
            (kb.arg("c", cx.len_of(cb), Access::Read), strides)
        });
        steps.extend(epi.declare(&mut kb));
        let oa = kb.arg("out", cx.len_of(out), Access::Write);
        steps.push(out);
        let valid_rows = valid_rows.map(|b| {
            steps.push(b);
            kb.typed_arg("valid_rows", smelt_ir::DType::I64, 1, Access::Read)
        });
        let args = Args {
            a: aa,
            w: wa,
            c,
            out: oa,
            valid_rows,
        };
        (kb, args, steps)
    }

    /// Every row of one panel: the batch loops (if any), then calls of up to
    /// `max_pixels` rows; with `prefetch_next`, they prefetch the next panel
    /// ([`NextPanel`]).
    #[allow(clippy::too_many_arguments)]
    fn panel(
        &self,
        kb: &mut KernelBuilder,
        args: &Args,
        epi: &Epilogue,
        panel: &Affine,
        routine: TileRoutine,
        valid: usize,
        prefetch_next: bool,
    ) {
        let sweep_rows = (self.rows * self.batch.iter().product::<usize>()) as i64;
        let prefetch = if !prefetch_next {
            NextPanel::No
        } else if self.batch.is_empty() {
            NextPanel::Whole
        } else {
            NextPanel::Share((self.panel_len() + sweep_rows - 1) / sweep_rows.max(1))
        };
        let at = PanelAt {
            panel: panel.clone(),
            routine,
            valid,
            prefetch,
        };
        for_batches(kb, &self.batch, &mut Vec::new(), &mut |kb, bidx| {
            self.rows_of(kb, args, epi, &at, bidx)
        });
    }

    /// Every row of one panel of batch index `bidx`: calls of up to the routine's
    /// `max_pixels` rows.
    fn rows_of(
        &self,
        kb: &mut KernelBuilder,
        args: &Args,
        epi: &Epilogue,
        at: &PanelAt,
        bidx: &[Affine],
    ) {
        let per_call = (at.routine.max_pixels as usize).max(1);
        // only the call at row 0 prefetches the whole next panel: the others are quiet
        let quiet = (at.prefetch == NextPanel::Whole).then(|| PanelAt {
            prefetch: NextPanel::No,
            ..at.clone()
        });
        for_row_blocks(
            kb,
            (self.rows, quiet.is_some()),
            per_call,
            args.valid_rows_in(at.routine),
            &mut |kb, row0, pixels| {
                let at = match &quiet {
                    Some(quiet) if *row0 != Affine::constant(0) => quiet,
                    _ => at,
                };
                self.call(kb, args, epi, at, bidx, row0, pixels)
            },
        );
        let col0 = at.panel.scale(self.lanes() as i64);
        self.clear_rows_past_valid(kb, args, bidx, 0..at.valid, &col0);
    }

    /// With `args.valid_rows`, clears the result's columns `col0 + cols` of batch index
    /// `bidx` in the rows from the valid length on: a block past it was not computed, and
    /// stale bytes there could be a NaN a later masked product turns into `0 · NaN`.
    fn clear_rows_past_valid(
        &self,
        kb: &mut KernelBuilder,
        args: &Args,
        bidx: &[Affine],
        cols: std::ops::Range<usize>,
        col0: &Affine,
    ) {
        let Some(extent) = args.valid_rows else {
            return;
        };
        let flat = index_of(&row_major_strides(&self.batch), bidx);
        let past = LoopLimit::at_or_past(extent, Affine::var(kb.next_loop_var()));
        kb.for_loop_limited(0, self.rows as i64, 1, Some(past), |kb, r| {
            let row = self.out_row(&flat, bidx, &Affine::var(r)).0.add(col0);
            let zero = Expr::constant(0.0, Width::Scalar);
            let at = row.plus(cols.start as i64);
            fill_nest(kb, DType::F32, &[cols.len()], &zero, (args.out, &[1], &at));
        });
    }

    /// One routine call: rows `row0..row0 + pixels` (of batch index `bidx`) × the panel,
    /// then, unless the routine wrote the result itself, the epilogue over its sums.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        kb: &mut KernelBuilder,
        args: &Args,
        epi: &Epilogue,
        at: &PanelAt,
        bidx: &[Affine],
        row0: &Affine,
        pixels: usize,
    ) {
        let k = self.k as i64;
        let lanes = at.routine.lanes;
        let rows = self.rows as i64;
        // the batch index as one number (row-major over the batch dims)
        let flat = index_of(&row_major_strides(&self.batch), bidx);
        let col0 = at.panel.scale(self.lanes() as i64);
        let (out_row0, out_m) = self.out_row(&flat, bidx, row0);
        let plain = self.alpha == 1.0 && (args.c.is_none() || self.beta == 0.0);
        let direct = at.valid == lanes as usize && epi.is_empty() && plain;
        // A leading bias add and SiLU, sigmoid or GELU run natively on the routine's
        // full-width vectors over a full panel (a transformer's up-projection: GELU in the
        // Cranelift epilogue was ≈ 30% of the GEMM); the rest of the epilogue as usual.
        let native = (!direct && plain && at.valid == lanes as usize && lanes % 16 == 0)
            .then(|| epi.after_leading_bias_activation())
            .flatten();
        let epi = match &native {
            Some((_, _, rest)) => rest,
            None => epi,
        };
        let a_at = index_of(&self.a_batch, bidx)
            .add(&row0.scale(self.a_m))
            .plus(self.a_offset);
        let w_at = index_of(&self.b_batch, bidx).add(&at.panel.scale(self.panel_len()));
        let (sums, sums_at, out_pixel_stride) = if direct {
            (args.out, out_row0.add(&col0), out_m)
        } else {
            (
                kb.local(pixels * lanes as usize),
                Affine::constant(0),
                lanes,
            )
        };
        if !direct {
            // a residual's rows stream in while the routine computes
            let mut idx = bidx.to_vec();
            idx.extend([row0.clone(), col0.clone()]);
            epi.prefetch(kb, &idx, self.batch.len(), pixels, at.valid);
        }
        let panel_len = self.panel_len();
        // the next panel from its start, or this call's share of it
        let next_panel = at.panel.plus(1).scale(panel_len);
        let (next_len, next_at) = match at.prefetch {
            NextPanel::Whole => (panel_len, Some(next_panel)),
            NextPanel::Share(unit) => {
                let share = flat.scale(rows).add(row0).scale(unit);
                let len = (unit * pixels as i64).min(panel_len);
                (len, Some(next_panel.add(&share)))
            }
            NextPanel::No => (0, None),
        };
        let next = next_at.map(|index| BufPtr { buf: args.w, index });
        let tile = ConvTile {
            lanes,
            pixels: pixels as i64,
            rows: 1,
            row_stride: 0,
            taps: 1,
            tap_stride: 0,
            chans: k,
            chan_stride: 1,
            pixel_stride: self.a_m,
            w_tap_stride: panel_len,
            out_pixel_stride,
            out_vec_stride: 4,
            out_block_stride: 16,
            next_len,
            finish: 0,
            accumulate: false,
        };
        kb.conv_tile(
            BufPtr {
                buf: args.a,
                index: a_at,
            },
            BufPtr {
                buf: args.w,
                index: w_at,
            },
            BufPtr {
                buf: sums,
                index: sums_at,
            },
            next,
            tile,
        );
        if direct {
            return;
        }
        if let Some((act, bias, _)) = &native {
            let mut idx = bidx.to_vec();
            idx.extend([row0.clone(), col0.clone()]);
            let sums = BufPtr {
                buf: sums,
                index: Affine::constant(0),
            };
            // the rest of the epilogue keeps every operand, the bias's index with it
            let bias = epi.operand_at(*bias, &idx);
            kb.activation_rows(*act, sums, Some(bias), pixels as i64, lanes);
        }
        let vecs = at.valid / 4;
        kb.for_loop(0, pixels as i64, 1, |kb, p| {
            let p = Affine::var(p);
            let row = row0.add(&p);
            let end = Finish {
                bidx,
                flat: &flat,
                row: &row,
            };
            kb.for_loop(0, vecs as i64, 1, |kb, v| {
                let v = Affine::var(v).scale(4);
                let s = Expr::load(sums, p.scale(lanes).add(&v), Width::F32x4);
                self.finish(kb, args, epi, &end, s, &col0.add(&v), Width::F32x4);
            });
            // the padded panel's last columns, one at a time
            for l in 4 * vecs..at.valid {
                let l = l as i64;
                let s = Expr::load(sums, p.scale(lanes).plus(l), Width::Scalar);
                self.finish(kb, args, epi, &end, s, &col0.plus(l), Width::Scalar);
            }
        });
    }

    /// `alpha · sum + beta · C`, the post-ops, and the store, for the `w.lanes()`
    /// result elements from column `col` of `end`'s row.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        kb: &mut KernelBuilder,
        args: &Args,
        epi: &Epilogue,
        end: &Finish,
        sum: Expr,
        col: &Affine,
        w: Width,
    ) {
        let mut v = sum;
        if self.alpha != 1.0 {
            v = Expr::binary(BinOp::Mul, v, Expr::constant(self.alpha, w));
        }
        if let Some((c, strides)) = &args.c {
            if self.beta != 0.0 {
                let at = index_of(strides, &[end.row.clone(), col.clone()]);
                let cv = load_lanes(*c, at, strides[1], w);
                v = Expr::fma(cv, Expr::constant(self.beta, w), v);
            }
        }
        let mut idx = end.bidx.to_vec();
        idx.extend([end.row.clone(), col.clone()]);
        let v = epi.apply(kb, v, &idx, w);
        let stored = self.out_row(end.flat, end.bidx, end.row).0.add(col);
        kb.store(args.out, stored, v, w);
    }
}

/// The panel a kernel body computes: its index, its valid columns, and how its calls
/// prefetch the next panel.
#[derive(Clone)]
struct PanelAt {
    panel: Affine,
    /// The routine computing it (the tail's may be narrower than the whole panels').
    routine: TileRoutine,
    valid: usize,
    prefetch: NextPanel,
}

/// How the calls of a panel's sweep prefetch the next panel (a weight arrives cold
/// from memory when the model's weights do not fit the cache).
#[derive(Clone, Copy, PartialEq, Eq)]
enum NextPanel {
    /// Not at all (a B packed just before is in cache).
    No,
    /// All of it from the sweep's first call, which starts at row 0 (its calls are
    /// rows only: the batch dims flattened). Alone, with B in cache: 384 × 1536 at
    /// M = 128 0.89 → 0.84 ms against every call prefetching its share; cycling
    /// through 16 weights as a model does, 0.86 either way (none: 0.98).
    Whole,
    /// Each call its share: this many elements per row of the sweep (batch dims
    /// looped, whose first call is not apart).
    Share(i64),
}

/// The result row an epilogue finishes: batch index (as loop indices and as one
/// number) and row.
struct Finish<'r> {
    bidx: &'r [Affine],
    flat: &'r Affine,
    row: &'r Affine,
}

/// Runs `body` for the blocks of `per_block` rows (the last one shorter) that cover
/// `rows`: a loop over the whole blocks, then the rest, with each block's first row and
/// row count; with `first_apart`, the first whole block before the loop, its first row
/// the constant 0 (the call that starts a sweep, which may then differ). With
/// `valid_rows` (and `per_call`, the routine's register block), a block below a run's
/// valid rows is one call as before, the block they end in calls of `per_call` rows up
/// to them (a run stops within a register block of its valid length; a smaller call
/// would take the routine's slow remainder path), and the blocks past them nothing.
fn for_row_blocks(
    kb: &mut KernelBuilder,
    (rows, first_apart): (usize, bool),
    per_block: usize,
    valid_rows: Option<(BufId, usize)>,
    body: &mut dyn FnMut(&mut KernelBuilder, &Affine, usize),
) {
    let (whole, rest) = (rows / per_block, rows % per_block);
    // the first whole block out of the loop, its row the constant 0
    let looped = if first_apart && whole > 0 {
        let zero = Affine::constant(0);
        match valid_rows {
            None => body(kb, &zero, per_block),
            Some((extent, per_call)) => {
                valid_block(kb, (&zero, per_block), (extent, per_call), body)
            }
        }
        1..whole as i64
    } else {
        0..whole as i64
    };
    let Some((extent, per_call)) = valid_rows else {
        if !looped.is_empty() {
            kb.for_loop(looped.start, looped.end, 1, |kb, c| {
                body(kb, &Affine::var(c).scale(per_block as i64), per_block)
            });
        }
        if rest > 0 {
            body(kb, &Affine::constant((whole * per_block) as i64), rest);
        }
        return;
    };
    let below = |row| Some(LoopLimit::below(extent, row));
    // the blocks that start below the valid rows
    if !looped.is_empty() {
        let block_row = Affine::var(kb.next_loop_var()).scale(per_block as i64);
        kb.for_loop_limited(looped.start, looped.end, 1, below(block_row), |kb, c| {
            let first = Affine::var(c).scale(per_block as i64);
            valid_block(kb, (&first, per_block), (extent, per_call), body)
        });
    }
    if rest > 0 {
        let first = Affine::constant((whole * per_block) as i64);
        valid_block(kb, (&first, rest), (extent, per_call), body);
    }
}

/// The rows `first..first + count` of a product that stops at the valid rows in
/// `extent`: one call when they are all below it, else the calls of `per_call` rows
/// that start below it.
fn valid_block(
    kb: &mut KernelBuilder,
    (first, count): (&Affine, usize),
    (extent, per_call): (BufId, usize),
    body: &mut dyn FnMut(&mut KernelBuilder, &Affine, usize),
) {
    let last = first.plus(count as i64 - 1);
    let all_below = Some(LoopLimit::below(extent, last.clone()));
    kb.for_loop_limited(0, 1, 1, all_below, |kb, _| body(kb, first, count));
    let ends_here = Some(LoopLimit::at_or_past(extent, last));
    kb.for_loop_limited(0, 1, 1, ends_here, |kb, _| {
        let sub = per_call.clamp(1, count);
        let (calls, rest) = (count / sub, count % sub);
        let at = |i: LoopVar| first.add(&Affine::var(i).scale(sub as i64));
        let calls_below = Some(LoopLimit::below(extent, at(kb.next_loop_var())));
        kb.for_loop_limited(0, calls as i64, 1, calls_below, |kb, i| {
            body(kb, &at(i), sub)
        });
        if rest > 0 {
            let row0 = first.plus((calls * sub) as i64);
            let below = Some(LoopLimit::below(extent, row0.clone()));
            kb.for_loop_limited(0, 1, 1, below, |kb, _| body(kb, &row0, rest));
        }
    });
}

/// Runs `body` inside one loop per batch dim, with the loop indices.
fn for_batches(
    kb: &mut KernelBuilder,
    batch: &[usize],
    idx: &mut Vec<Affine>,
    body: &mut dyn FnMut(&mut KernelBuilder, &[Affine]),
) {
    let Some((&dim, inner)) = batch.split_first() else {
        body(kb, idx);
        return;
    };
    kb.for_loop(0, dim as i64, 1, |kb, i| {
        idx.push(Affine::var(i));
        for_batches(kb, inner, idx, body);
        idx.pop();
    });
}
