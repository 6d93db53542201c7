//! The bounds checker: the proof, made before any code runs, that every memory access
//! of a [`Kernel`] stays inside its buffer. It is the safety argument of every call into
//! JIT code, so it is written to be sound first and exact second.
//!
//! What [`Kernel::check`] proves, for every iteration of every loop:
//! - every load and store of `width.lanes()` elements at its affine index lies inside its
//!   buffer (a kernel argument of the declared length, or a local scratch buffer);
//! - stores and micro-kernel outputs go to written buffers, never to read-only arguments;
//! - a conv-tile call's footprints ([`ConvTile::footprints`](super::ConvTile::footprints): the elements from each
//!   pointer the contract lets the routine touch) lie inside their buffers, and a call's
//!   prefetched `next` run starts at or after its buffer's start and is no longer than
//!   the buffer (code generation moves a start that would run past the end back);
//! - a [`Stmt::Prefetch`] run lies inside its buffer (a prefetch cannot fault, but the
//!   checker covers every address JIT code hands to native code);
//! - an [`Expr::LoadAt`] (a run-time index, tested against its bound by the generated
//!   code before the load) reads inside its buffer for every index below the bound;
//! - widths and element types agree (a load or store has its buffer's element type;
//!   conv tiles and prefetches work on `f32` buffers; integer and `i1` values are
//!   scalars, bitwise ops take only them, float functions only `f32`), and every variable
//!   is declared, assigned before it is read and in scope; loop steps are positive, a
//!   loop variable is not reused inside its loop, and a parallel kernel's body is one
//!   loop that cannot fault (a split call's status would be lost).
//!
//! How: loop bounds are constants, so each loop variable ranges over a known interval
//! and the iteration space is a box. An affine index is extreme at a corner of the box,
//! so its exact minimum and maximum are sums of per-term extremes; the access is inside
//! when the minimum is at least 0 and the maximum plus the access's span is at most the
//! length. Every step is checked arithmetic: a bound that would overflow `i64` is a
//! rejection, never a wrapped value. Loops with no trips are not entered (their bodies
//! never run). The property test in this module compares the checker with brute-force
//! execution of random kernels: it accepts exactly the kernels whose every access is
//! inside.

use super::{trip_count, Access, Affine, BinOp, BufId, BufPtr, Expr, Kernel, Stmt, UnOp, Width};
use crate::types::DType;

impl Kernel {
    /// Checks the kernel: widths agree, variables and loop variables are in scope, stores
    /// go to written buffers, and every load and store stays inside its buffer for every
    /// iteration. This is the proof the runtime relies on before calling native code.
    pub fn check(&self) -> Result<(), String> {
        if self.parallel && self.parallel_trips().is_none() {
            return Err(format!(
                "kernel {}: a parallel kernel's body must be one loop",
                self.name
            ));
        }
        if self.parallel && self.can_fault() {
            return Err(format!(
                "kernel {}: a parallel kernel cannot fault (it holds a run-time index or an integer division)",
                self.name
            ));
        }
        let mut cx = CheckCx {
            kernel: self,
            ranges: vec![None; self.num_loop_vars as usize],
            assigned: vec![false; self.vars.len()],
        };
        cx.block(&self.body)
            .map_err(|e| format!("kernel {}: {e}", self.name))
    }
}

struct CheckCx<'k> {
    kernel: &'k Kernel,
    /// Inclusive value range of each loop variable in scope.
    ranges: Vec<Option<(i64, i64)>>,
    assigned: Vec<bool>,
}

impl CheckCx<'_> {
    fn block(&mut self, stmts: &[Stmt]) -> Result<(), String> {
        for s in stmts {
            match s {
                Stmt::Loop {
                    var,
                    start,
                    end,
                    step,
                    limit,
                    body,
                } => {
                    if *step <= 0 {
                        return Err(format!("loop i{} has step {step}", var.0));
                    }
                    if let Some(limit) = limit {
                        self.limit(*var, limit)?;
                        if *start < 0 {
                            return Err(format!("limited loop i{} starts at {start}", var.0));
                        }
                    }
                    let slot = self
                        .ranges
                        .get_mut(var.0 as usize)
                        .ok_or_else(|| format!("loop variable i{} is not declared", var.0))?;
                    if slot.is_some() {
                        return Err(format!("loop variable i{} is reused in its scope", var.0));
                    }
                    let trips = trip_count(*start, *end, *step);
                    if trips == 0 {
                        continue;
                    }
                    // the last value is below `end`, so it fits in i64
                    let last = i128::from(*start) + i128::from(*step) * (i128::from(trips) - 1);
                    *slot = Some((
                        *start,
                        i64::try_from(last).map_err(|_| {
                            format!(
                                "loop i{} from {start} to {end} by {step} has too many trips",
                                var.0
                            )
                        })?,
                    ));
                    let r = self.block(body);
                    self.ranges[var.0 as usize] = None;
                    r?;
                }
                Stmt::Assign { dst, value } => {
                    let want = *self
                        .kernel
                        .vars
                        .get(dst.0 as usize)
                        .ok_or_else(|| format!("variable ${} is not declared", dst.0))?;
                    let got = self.expr(value)?;
                    if got != want {
                        return Err(format!(
                            "${} is {} but is assigned a {} value",
                            dst.0,
                            want.name(),
                            got.name()
                        ));
                    }
                    self.assigned[dst.0 as usize] = true;
                }
                Stmt::Store {
                    buf,
                    index,
                    value,
                    width,
                } => {
                    let got = self.expr(value)?;
                    if got != *width {
                        return Err(format!(
                            "store of {} to {buf} stores a {} value",
                            width.name(),
                            got.name()
                        ));
                    }
                    self.element_type(*buf, *width)?;
                    if self.access(*buf, index, width.lanes() as i64)? != Access::Write {
                        return Err(format!("store to read-only argument {buf}"));
                    }
                }
                Stmt::ConvTile {
                    x,
                    w,
                    out,
                    next,
                    bias,
                    residual,
                    tile,
                } => {
                    if tile.finish == 0 && (bias.is_some() || residual.is_some()) {
                        return Err(format!(
                            "conv tile call: a bias or residual needs a finish ({tile})"
                        ));
                    }
                    match (next, tile.next_len) {
                        (None, 0) => {}
                        (Some(at), len) if len > 0 => self.clamped_run(at, len)?,
                        _ => {
                            return Err(format!(
                                "conv tile call: a prefetched run needs both a start and a positive length ({tile})"
                            ))
                        }
                    }
                    let [xs, ws, os] = tile
                        .footprints()
                        .ok_or_else(|| format!("conv tile call with a negative count or stride, or an overflowing footprint: {tile}"))?;
                    self.call_run(x, 0, xs, false, "conv tile")?;
                    self.call_run(w, 0, ws, false, "conv tile")?;
                    self.call_run(out, 0, os, true, "conv tile")?;
                    if let Some(bias) = bias {
                        let lanes = if tile.pixels > 0 { tile.lanes } else { 0 };
                        self.call_run(bias, 0, lanes, false, "conv tile")?;
                    }
                    if let Some(residual) = residual {
                        self.call_run(residual, 0, os, false, "conv tile")?;
                    }
                }
                Stmt::DepthwiseRow { x, w, out, row } => {
                    let [xs, ws, os] = row.footprints().ok_or_else(|| {
                        format!("depthwise row call with a negative count, stride or offset, too many taps, or an overflowing footprint: {row}")
                    })?;
                    // x is read from its smallest tap offset on, not from the pointer
                    let first = if xs > 0 { row.first_read() } else { 0 };
                    self.call_run(x, first, xs - first, false, "depthwise row")?;
                    self.call_run(w, 0, ws, false, "depthwise row")?;
                    self.call_run(out, 0, os, true, "depthwise row")?;
                }
                Stmt::BlockedDepthwiseRow {
                    x,
                    w,
                    bias,
                    out,
                    row,
                } => {
                    let what = "blocked depthwise row";
                    let [xs, ws, bs, os] = row.footprints().ok_or_else(|| {
                        format!("{what} call with a negative count or stride, a zero stride or dilation, lanes other than 4, 8, 12 or 16, an unknown activation, or an overflowing footprint: {row}")
                    })?;
                    self.call_run(x, 0, xs, false, what)?;
                    self.call_run(w, 0, ws, false, what)?;
                    if let Some(bias) = bias {
                        self.call_run(bias, 0, bs, false, what)?;
                    }
                    self.call_run(out, 0, os, true, what)?;
                }
                Stmt::ActivationRows {
                    buf,
                    bias,
                    rows,
                    lanes,
                    ..
                } => {
                    let what = "activation rows";
                    let span = self.rows_call(*rows, *lanes, bias.as_ref(), what)?;
                    self.call_run(buf, 0, span, true, what)?;
                }
                Stmt::StoreRows {
                    sums,
                    bias,
                    residual,
                    out,
                    rows,
                    lanes,
                    ..
                } => {
                    let what = "store rows";
                    let span = self.rows_call(*rows, *lanes, bias.as_ref(), what)?;
                    self.call_run(sums, 0, span, false, what)?;
                    if let Some(residual) = residual {
                        self.call_run(residual, 0, span, false, what)?;
                    }
                    self.call_run(out, 0, span, true, what)?;
                }
                Stmt::StorePlanes {
                    sums,
                    bias,
                    out,
                    pixels,
                    channels,
                    lanes,
                    plane,
                    ..
                } => {
                    let what = "store planes";
                    let (p, c, l, pl) = (*pixels, *channels, *lanes, *plane);
                    if p < 0 || l <= 0 || l % 16 != 0 || !(0..=l).contains(&c) || pl < p {
                        return Err(format!(
                            "{what} call of {p} pixels of {c} of {l} lanes, planes {pl} apart"
                        ));
                    }
                    if sums.buf == out.buf {
                        return Err(format!("{what} call stores into its own sums {}", out.buf));
                    }
                    if p > 0 && c > 0 {
                        let overflow = || format!("{what} call of {p} pixels, {c} channels");
                        let read = (p - 1).checked_mul(l).and_then(|r| r.checked_add(c));
                        let written = (c - 1).checked_mul(pl).and_then(|w| w.checked_add(p));
                        self.call_run(sums, 0, read.ok_or_else(overflow)?, false, what)?;
                        if let Some(bias) = bias {
                            self.call_run(bias, 0, c, false, what)?;
                        }
                        self.call_run(out, 0, written.ok_or_else(overflow)?, true, what)?;
                    }
                }
                Stmt::WinogradInputRow { x, v, row } => {
                    let what = "winograd input row";
                    let [read, written] = row.footprints().ok_or_else(|| {
                        format!("{what} call of a shape the routine refuses: {row:?}")
                    })?;
                    if x.buf == v.buf {
                        return Err(format!("{what} call stores into its own input {}", v.buf));
                    }
                    self.call_run(x, 0, read, false, what)?;
                    self.call_run(v, 0, written, true, what)?;
                }
                Stmt::WinogradOutputRow { m, out, row } => {
                    let what = "winograd output row";
                    let [read, written] = row.footprints().ok_or_else(|| {
                        format!("{what} call of a shape the routine refuses: {row:?}")
                    })?;
                    if m.buf == out.buf {
                        return Err(format!("{what} call stores into its own input {}", out.buf));
                    }
                    self.call_run(m, 0, read, false, what)?;
                    self.call_run(out, 0, written, true, what)?;
                }
                Stmt::SoftmaxRow { x, out, len } => {
                    if *len < 0 {
                        return Err(format!("softmax row call of {len} elements"));
                    }
                    self.call_run(x, 0, *len, false, "softmax row")?;
                    self.call_run(out, 0, *len, true, "softmax row")?;
                }
                Stmt::Prefetch {
                    at,
                    rows,
                    row_stride,
                    row_len,
                } => {
                    let span = (*rows > 0 && *row_stride >= 0 && *row_len > 0)
                        .then(|| row_stride.checked_mul(rows - 1)?.checked_add(*row_len))
                        .flatten()
                        .ok_or_else(|| {
                            format!("prefetch of {rows} runs of {row_len} every {row_stride}")
                        })?;
                    self.element_type(at.buf, Width::Scalar)?;
                    self.access(at.buf, &at.index, span)?;
                }
            }
        }
        Ok(())
    }

    /// Checks a loop's run-time limit: its extent is one `i64` read from an argument
    /// (code generation loads it at every entry to the loop), its row reads only the
    /// loop's variable and enclosing ones, and never falls as the loop's variable grows
    /// (the iterations that run are a prefix or a suffix). The iterations themselves are
    /// proven as if every one ran.
    fn limit(&self, var: super::LoopVar, limit: &super::LoopLimit) -> Result<(), String> {
        let bad = |why: &str| format!("loop i{}'s limit {why}", var.0);
        if limit.extent.local_index().is_some() {
            return Err(bad("reads its extent from a local buffer"));
        }
        let (_, len, _) = self.buffer(limit.extent)?;
        if len < 1 {
            return Err(bad("reads its extent from an empty argument"));
        }
        self.element_type(limit.extent, Width::I64)?;
        for &(v, c) in &limit.row.terms {
            let in_scope = v == var || self.ranges.get(v.0 as usize).is_some_and(Option::is_some);
            if !in_scope {
                return Err(bad(&format!(
                    "reads i{}, not an enclosing loop's variable",
                    v.0
                )));
            }
            if v == var && c < 0 {
                return Err(bad("falls as its loop's variable grows"));
            }
        }
        Ok(())
    }

    /// Proves that a run of `span` elements starting at `at`, moved back where it would
    /// pass the buffer's end, lies inside the buffer for every iteration in scope: the
    /// start is never negative and the run is no longer than the buffer.
    fn clamped_run(&self, at: &BufPtr, span: i64) -> Result<(), String> {
        let (name, len, _) = self.buffer(at.buf)?;
        let (lo, _) = self.index_range(&at.index)?;
        if lo < 0 || i128::from(span) > len as i128 {
            return Err(format!(
                "prefetched run of {span} elements of {} ({name}) from {lo} is outside its {len} elements",
                at.buf
            ));
        }
        Ok(())
    }

    /// Checks that `width`'s element type is `buf`'s (local buffers hold `f32`).
    /// Proves the run of `span` f32 elements a native routine touches from `ptr +
    /// first` inside `ptr`'s buffer for every iteration in scope (nothing when `span`
    /// is 0), and the buffer writable when `write`; `what` names the call in messages.
    /// The checks a rows routine's call shares (`rows` rows of `lanes`, a positive
    /// multiple of 16, and the bias's `lanes` elements, read when there is a row):
    /// returns the elements of its rows.
    fn rows_call(
        &self,
        rows: i64,
        lanes: i64,
        bias: Option<&BufPtr>,
        what: &str,
    ) -> Result<i64, String> {
        if rows < 0 || lanes <= 0 || lanes % 16 != 0 {
            return Err(format!("{what} call of {rows} rows of {lanes} lanes"));
        }
        let span = rows
            .checked_mul(lanes)
            .ok_or_else(|| format!("{what} call of {rows} rows of {lanes}"))?;
        if let Some(bias) = bias {
            let read = if span > 0 { lanes } else { 0 };
            self.call_run(bias, 0, read, false, what)?;
        }
        Ok(span)
    }

    fn call_run(
        &self,
        ptr: &BufPtr,
        first: i64,
        span: i64,
        write: bool,
        what: &str,
    ) -> Result<(), String> {
        self.element_type(ptr.buf, Width::Scalar)?;
        if span <= 0 {
            return Ok(());
        }
        let access = self.access(ptr.buf, &ptr.index.plus(first), span)?;
        if write && access != Access::Write {
            return Err(format!("{what} call writes read-only argument {}", ptr.buf));
        }
        Ok(())
    }

    fn element_type(&self, buf: BufId, width: Width) -> Result<(), String> {
        let dtype = match buf.local_index() {
            Some(_) => DType::F32,
            None => {
                self.kernel
                    .args
                    .get(buf.0 as usize)
                    .ok_or_else(|| format!("argument {buf} does not exist"))?
                    .dtype
            }
        };
        if dtype != width.dtype() {
            return Err(format!(
                "{} access to {buf}, a buffer of {dtype}",
                width.name()
            ));
        }
        Ok(())
    }

    /// The name, length and access of `buf`.
    fn buffer(&self, buf: BufId) -> Result<(&str, usize, Access), String> {
        Ok(match buf.local_index() {
            Some(i) => {
                let len = self
                    .kernel
                    .locals
                    .get(i)
                    .ok_or_else(|| format!("local buffer {buf} does not exist"))?;
                ("local", *len, Access::Write)
            }
            None => {
                let arg = self
                    .kernel
                    .args
                    .get(buf.0 as usize)
                    .ok_or_else(|| format!("argument {buf} does not exist"))?;
                (arg.name.as_str(), arg.len, arg.access)
            }
        })
    }

    /// The exact least and greatest value of `index` over the iterations in scope, in
    /// i128: a term's product of two i64 values always fits, and a sum that would not is
    /// an error rather than a wrapped (or saturated, hence too small) bound.
    fn index_range(&self, index: &Affine) -> Result<(i128, i128), String> {
        let overflow = || format!("index {index} overflows");
        let (mut lo, mut hi) = (i128::from(index.offset), i128::from(index.offset));
        for &(v, c) in &index.terms {
            let (a, b) = self
                .ranges
                .get(v.0 as usize)
                .copied()
                .flatten()
                .ok_or_else(|| format!("loop variable i{} used outside its loop", v.0))?;
            let (x, y) = (i128::from(a) * i128::from(c), i128::from(b) * i128::from(c));
            lo = lo.checked_add(x.min(y)).ok_or_else(overflow)?;
            hi = hi.checked_add(x.max(y)).ok_or_else(overflow)?;
        }
        Ok((lo, hi))
    }

    /// Proves `span` elements from `index` inside `buf` for every iteration in scope, and
    /// returns how the buffer may be accessed.
    fn access(&self, buf: BufId, index: &Affine, span: i64) -> Result<Access, String> {
        let (name, len, access) = self.buffer(buf)?;
        let (lo, hi) = self.index_range(index)?;
        let last = hi
            .checked_add(i128::from(span) - 1)
            .ok_or_else(|| format!("index {index} overflows"))?;
        if lo < 0 || last >= len as i128 {
            return Err(format!(
                "access to {buf} ({name}) at [{lo}, {last}] is outside its {len} elements"
            ));
        }
        Ok(access)
    }

    fn expr(&self, e: &Expr) -> Result<Width, String> {
        let same = |a: Width, b: Width, what: &str| {
            if a == b {
                Ok(a)
            } else {
                Err(format!(
                    "{what} mixes {} and {} operands",
                    a.name(),
                    b.name()
                ))
            }
        };
        match e {
            Expr::Var(v) => {
                let w = self
                    .kernel
                    .vars
                    .get(v.0 as usize)
                    .ok_or_else(|| format!("variable ${} is not declared", v.0))?;
                if !self.assigned[v.0 as usize] {
                    return Err(format!("variable ${} is read before any assignment", v.0));
                }
                Ok(*w)
            }
            Expr::Const(_, w) if w.is_integer() => {
                Err(format!("a float constant of width {}", w.name()))
            }
            Expr::Const(_, w) => Ok(*w),
            Expr::Int(v, w) => match w {
                Width::I64 => Ok(*w),
                Width::I32 if i32::try_from(*v).is_ok() => Ok(*w),
                Width::Bool if *v == 0 || *v == 1 => Ok(*w),
                // a 2-byte float's bit pattern (a zero fill), kept non-negative for i16
                Width::F16 | Width::BF16 if (0..=0x7fff).contains(v) => Ok(*w),
                Width::I8 if i8::try_from(*v).is_ok() => Ok(*w),
                Width::U8 if u8::try_from(*v).is_ok() => Ok(*w),
                Width::I16 if i16::try_from(*v).is_ok() => Ok(*w),
                Width::U16 if u16::try_from(*v).is_ok() => Ok(*w),
                _ => Err(format!("integer constant {v} does not fit {}", w.name())),
            },
            Expr::Load { buf, index, width } => {
                self.element_type(*buf, *width)?;
                self.access(*buf, index, width.lanes() as i64)?;
                Ok(*width)
            }
            Expr::LoadAt {
                buf,
                base,
                index,
                stride,
                bound,
                width,
            } => {
                if self.expr(index)? != Width::I64 {
                    return Err("a run-time index must be an i64".into());
                }
                if width.lanes() != 1 {
                    return Err("a load at a run-time index reads one element".into());
                }
                if *bound <= 0 || *stride < 0 {
                    return Err(format!(
                        "a run-time index needs a positive bound and a non-negative stride, got bound {bound}, stride {stride}"
                    ));
                }
                self.element_type(*buf, *width)?;
                // The generated code tests 0 <= index < bound first, so the addresses are
                // base + k * stride for k in 0..bound: extreme at k = 0 and k = bound - 1.
                let last = (i128::from(*bound) - 1) * i128::from(*stride);
                let last = i64::try_from(last)
                    .ok()
                    .and_then(|l| base.offset.checked_add(l))
                    .ok_or_else(|| format!("run-time index range {bound}x{stride} overflows"))?;
                self.access(*buf, base, 1)?;
                self.access(
                    *buf,
                    &Affine {
                        offset: last,
                        terms: base.terms.clone(),
                    },
                    1,
                )?;
                Ok(*width)
            }
            Expr::Splat(x) => match self.expr(x)? {
                Width::Scalar => Ok(Width::F32x4),
                other => Err(format!("splat of a {} value", other.name())),
            },
            Expr::Cast(to, x) => {
                let from = self.expr(x)?;
                if from.lanes() != 1 || to.lanes() != 1 {
                    return Err("casts convert scalars".into());
                }
                Ok(*to)
            }
            Expr::Compare(_, a, b) => {
                let w = same(self.expr(a)?, self.expr(b)?, "compare")?;
                if w.is_storage() {
                    return Err(format!("compare of {} values (cast them first)", w.name()));
                }
                if w.lanes() != 1 {
                    return Err("compare of vectors (select compares lanes)".into());
                }
                Ok(Width::Bool)
            }
            Expr::Unary(op, x) => {
                let w = self.expr(x)?;
                let integer_ok = matches!(op, UnOp::Neg | UnOp::Abs);
                if w.is_integer() && (!integer_ok || w == Width::Bool || w.is_storage()) {
                    return Err(format!("{op:?} of {} values", w.name()));
                }
                Ok(w)
            }
            Expr::Binary(op, a, b) => {
                let w = same(self.expr(a)?, self.expr(b)?, &format!("{op:?}"))?;
                let bitwise = matches!(op, BinOp::And | BinOp::Or | BinOp::Xor);
                let shift = matches!(op, BinOp::Shl | BinOp::Shr);
                let arithmetic_on_bool = w == Width::Bool && !bitwise;
                if ((bitwise || shift) && !w.is_integer()) || arithmetic_on_bool || w.is_storage() {
                    return Err(format!("{op:?} of {} values", w.name()));
                }
                Ok(w)
            }
            Expr::Fma(a, b, c) => {
                let ab = same(self.expr(a)?, self.expr(b)?, "fma")?;
                let w = same(ab, self.expr(c)?, "fma")?;
                if w.is_integer() {
                    return Err(format!("fma of {} values", w.name()));
                }
                Ok(w)
            }
            Expr::Select {
                a,
                b,
                if_true,
                if_false,
                ..
            } => {
                let ab = same(self.expr(a)?, self.expr(b)?, "select comparison")?;
                let tf = same(self.expr(if_true)?, self.expr(if_false)?, "select")?;
                if ab.is_storage() {
                    return Err(format!("select comparing {} values", ab.name()));
                }
                // a vector select compares lanes of its own type; a scalar one may compare
                // any scalars (an `i1` condition choosing between two i64s)
                if ab.lanes() != tf.lanes() || (tf.lanes() > 1 && ab != tf) {
                    return Err(format!(
                        "select compares {} values to choose {} values",
                        ab.name(),
                        tf.name()
                    ));
                }
                Ok(tf)
            }
            Expr::Reduce(_, x) => match self.expr(x)? {
                Width::F32x4 => Ok(Width::Scalar),
                _ => Err("reduction of a scalar".into()),
            },
            Expr::Lane(x, lane) => match self.expr(x)? {
                Width::F32x4 if *lane < 4 => Ok(Width::Scalar),
                Width::F32x4 => Err(format!("lane {lane} of a 4-lane vector")),
                _ => Err("lane of a scalar".into()),
            },
            Expr::Shuffle(a, b, m) => {
                if same(self.expr(a)?, self.expr(b)?, "shuffle")? != Width::F32x4 {
                    return Err("shuffle of scalars".into());
                }
                if m.iter().any(|&l| l >= 8) {
                    return Err(format!("shuffle lanes {m:?} outside the 8 lanes of a ++ b"));
                }
                Ok(Width::F32x4)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The checker against brute force: random well-typed kernels whose only possible
    //! fault is a bounds or access violation, every iteration executed by an oracle that
    //! enumerates each element every statement touches. The checker must accept exactly
    //! the kernels whose every touched element is inside a buffer it may touch that way.

    use super::super::winograd::{WinogradInputRow, WinogradOutputRow};
    use super::super::{
        Access, Affine, BlockedDepthwiseRow, BufId, BufPtr, ConvTile, DepthwiseRow, Expr, Kernel,
        KernelArg, LoopVar, RowActivation, Stmt, StoreActivation, VarId, Width, DEPTHWISE_MAX_TAPS,
    };

    /// A small deterministic generator (xorshift64*), so every case is reproducible from
    /// its seed and the test needs no dependency.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        /// Uniform in `lo..=hi`.
        fn int(&mut self, lo: i64, hi: i64) -> i64 {
            lo + (self.next() % (hi - lo + 1) as u64) as i64
        }
        fn chance(&mut self, percent: u64) -> bool {
            self.next() % 100 < percent
        }
        /// A coefficient or offset: mostly small, sometimes near the ends of i64 so that
        /// overflowing bounds are exercised.
        fn wide(&mut self, small: i64) -> i64 {
            match self.next() % 60 {
                0 => i64::MAX - self.int(0, 3),
                1 => i64::MIN + self.int(0, 3),
                2 => (i64::MAX / 2) * if self.chance(50) { 1 } else { -1 },
                _ => self.int(-small, small),
            }
        }
    }

    /// Builds a random kernel: arguments and locals of small lengths, nested loops (some
    /// empty, some with far-out bounds), loads, stores, prefetches and conv-tile calls at
    /// random affine positions.
    fn random_kernel(g: &mut Gen) -> Kernel {
        let args = (0..g.int(1, 3))
            .map(|i| KernelArg {
                name: format!("a{i}"),
                dtype: crate::types::DType::F32,
                len: g.int(0, 64) as usize,
                access: if g.chance(50) {
                    Access::Read
                } else {
                    Access::Write
                },
            })
            .collect::<Vec<_>>();
        let locals = (0..g.int(0, 1)).map(|_| g.int(0, 48) as usize).collect();
        let mut k = Kernel {
            name: "random".into(),
            args,
            locals,
            vars: vec![Width::Scalar, Width::F32x4],
            num_loop_vars: 0,
            body: Vec::new(),
            parallel: false,
        };
        // assign both variables first, so reads of them are always well-formed
        k.body.push(Stmt::Assign {
            dst: VarId(0),
            value: Expr::constant(1.0, Width::Scalar),
        });
        k.body.push(Stmt::Assign {
            dst: VarId(1),
            value: Expr::constant(1.0, Width::F32x4),
        });
        let body = block(g, &mut k, &mut Vec::new(), 0);
        k.body.extend(body);
        k
    }

    fn buffer(g: &mut Gen, k: &Kernel) -> BufId {
        if !k.locals.is_empty() && g.chance(25) {
            BufId(BufId::LOCAL)
        } else {
            BufId(g.int(0, k.args.len() as i64 - 1) as u32)
        }
    }

    fn index(g: &mut Gen, scope: &[LoopVar]) -> Affine {
        let mut a = Affine::constant(g.wide(24));
        for &v in scope {
            if g.chance(50) {
                a = a.add(&Affine::var(v).scale(g.wide(4)));
            }
        }
        a
    }

    fn block(g: &mut Gen, k: &mut Kernel, scope: &mut Vec<LoopVar>, depth: usize) -> Vec<Stmt> {
        let mut out = Vec::new();
        for _ in 0..g.int(1, 2) {
            let s = match g.int(0, 5) {
                0 if depth < 3 => {
                    let var = LoopVar(k.num_loop_vars);
                    k.num_loop_vars += 1;
                    let start = if g.chance(10) {
                        g.wide(8)
                    } else {
                        g.int(-4, 8)
                    };
                    // trips stay few (the oracle runs them all); far-out starts get 0-3 trips
                    let step = g.int(1, 4);
                    let end = start.saturating_add(step * g.int(-1, 3) + g.int(0, step - 1));
                    scope.push(var);
                    let body = block(g, k, scope, depth + 1);
                    scope.pop();
                    Stmt::Loop {
                        var,
                        start,
                        end,
                        step,
                        limit: None,
                        body,
                    }
                }
                0 | 1 => {
                    let width = if g.chance(50) {
                        Width::Scalar
                    } else {
                        Width::F32x4
                    };
                    Stmt::Assign {
                        dst: VarId(if width == Width::Scalar { 0 } else { 1 }),
                        value: Expr::load(buffer(g, k), index(g, scope), width),
                    }
                }
                2 => {
                    let width = if g.chance(50) {
                        Width::Scalar
                    } else {
                        Width::F32x4
                    };
                    Stmt::Store {
                        buf: buffer(g, k),
                        index: index(g, scope),
                        value: Expr::Var(VarId(if width == Width::Scalar { 0 } else { 1 })),
                        width,
                    }
                }
                3 => Stmt::Prefetch {
                    at: BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    },
                    rows: g.int(1, 3),
                    row_stride: g.int(0, 12),
                    row_len: g.int(1, 12),
                },
                _ if g.chance(15) => {
                    let ptr = |g: &mut Gen| BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    };
                    let (sums, out) = (ptr(g), ptr(g));
                    let bias = g.chance(50).then(|| ptr(g));
                    let residual = g.chance(50).then(|| ptr(g));
                    Stmt::StoreRows {
                        act: [
                            StoreActivation::Identity,
                            StoreActivation::Relu,
                            StoreActivation::HardSwish,
                        ][g.int(0, 2) as usize],
                        sums,
                        bias,
                        residual,
                        out,
                        rows: g.int(-1, 3),
                        lanes: [16, 32, 12][g.int(0, 2) as usize],
                    }
                }
                _ if g.chance(8) => {
                    let ptr = |g: &mut Gen| BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    };
                    let (x, v) = (ptr(g), ptr(g));
                    Stmt::WinogradInputRow {
                        x,
                        v,
                        row: WinogradInputRow {
                            alpha: [4, 6, 5][g.int(0, 2) as usize],
                            tiles: g.int(-1, 2),
                            x_row: g.int(0, 30),
                            x_tile: g.int(0, 40),
                            v_plane: g.int(0, 2),
                            v_tile: g.int(0, 20),
                        },
                    }
                }
                _ if g.chance(10) => {
                    let ptr = |g: &mut Gen| BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    };
                    let (m, out) = (ptr(g), ptr(g));
                    Stmt::WinogradOutputRow {
                        m,
                        out,
                        row: WinogradOutputRow {
                            alpha: [4, 6, 5][g.int(0, 2) as usize],
                            tiles: g.int(-1, 2),
                            m_plane: g.int(0, 2),
                            m_tile: g.int(0, 20),
                            rows: g.int(-1, 3),
                            cols: g.int(-1, 5),
                            out_row: g.int(0, 40),
                        },
                    }
                }
                _ if g.chance(15) => {
                    let ptr = |g: &mut Gen| BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    };
                    let (sums, out) = (ptr(g), ptr(g));
                    let bias = g.chance(50).then(|| ptr(g));
                    Stmt::StorePlanes {
                        act: [
                            StoreActivation::Identity,
                            StoreActivation::Relu,
                            StoreActivation::HardSwish,
                        ][g.int(0, 2) as usize],
                        sums,
                        bias,
                        out,
                        pixels: g.int(-1, 3),
                        channels: g.int(-1, 17),
                        lanes: [16, 32, 12][g.int(0, 2) as usize],
                        plane: g.int(0, 5),
                    }
                }
                _ if g.chance(15) => Stmt::ActivationRows {
                    act: [
                        RowActivation::Silu,
                        RowActivation::Sigmoid,
                        RowActivation::Gelu,
                    ][g.int(0, 2) as usize],
                    buf: BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    },
                    bias: g.chance(50).then(|| BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    }),
                    rows: g.int(0, 2),
                    lanes: 16,
                },
                _ if g.chance(15) => {
                    let ptr = |g: &mut Gen| BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    };
                    let (x, w, out) = (ptr(g), ptr(g), ptr(g));
                    let bias = g.chance(50).then(|| ptr(g));
                    let row = BlockedDepthwiseRow {
                        pixels: g.int(-1, 2),
                        lanes: [4, 8, 12, 16, 6][g.int(0, 4) as usize],
                        cols: g.int(0, 2),
                        stride: g.int(0, 2),
                        dil: g.int(1, 2),
                        pad: g.int(0, 2),
                        taps: g.int(0, 2),
                        rows: g.int(0, 2),
                        x_row_stride: g.int(0, 40),
                        w_row_stride: g.int(0, 40),
                        // mostly valid activations, sometimes a word none has
                        act: g.int(0, 3),
                    };
                    Stmt::BlockedDepthwiseRow {
                        x,
                        w,
                        bias,
                        out,
                        row,
                    }
                }
                _ if g.chance(20) => Stmt::SoftmaxRow {
                    x: BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    },
                    out: BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    },
                    len: g.int(0, 6),
                },
                _ if g.chance(40) => {
                    let ptr = |g: &mut Gen| BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    };
                    let (x, w, out) = (ptr(g), ptr(g), ptr(g));
                    let mut tap_offsets = [0; DEPTHWISE_MAX_TAPS];
                    let taps = g.int(0, 3);
                    for o in tap_offsets.iter_mut().take(taps as usize) {
                        *o = g.int(0, 7);
                    }
                    let row = DepthwiseRow {
                        cols: g.int(0, 6),
                        rows: g.int(0, 3),
                        row_stride: g.int(0, 9),
                        taps,
                        tap_offsets,
                    };
                    Stmt::DepthwiseRow { x, w, out, row }
                }
                _ => {
                    let ptr = |g: &mut Gen| BufPtr {
                        buf: buffer(g, k),
                        index: index(g, scope),
                    };
                    let (x, w, out) = (ptr(g), ptr(g), ptr(g));
                    let next_len = if g.chance(30) { g.int(1, 40) } else { 0 };
                    let next = (next_len > 0).then(|| ptr(g));
                    let tile = ConvTile {
                        lanes: [4, 8, 32][g.int(0, 2) as usize],
                        pixels: g.int(0, 3),
                        rows: g.int(0, 2),
                        row_stride: g.int(0, 6),
                        taps: g.int(0, 2),
                        tap_stride: g.int(0, 4),
                        chans: g.int(0, 2),
                        chan_stride: g.int(0, 5),
                        pixel_stride: g.int(0, 3),
                        w_tap_stride: g.int(0, 20),
                        out_pixel_stride: g.int(0, 9),
                        out_vec_stride: g.int(0, 5),
                        out_block_stride: g.int(0, 20),
                        next_len,
                        // mostly valid finishes, sometimes a word no activation has
                        finish: if g.chance(40) { g.int(0, 4) } else { 0 },
                        accumulate: g.chance(50),
                    };
                    let bias = (tile.finish != 0 && g.chance(60)).then(|| ptr(g));
                    let residual = (tile.finish != 0 && g.chance(60)).then(|| ptr(g));
                    Stmt::ConvTile {
                        x,
                        w,
                        out,
                        next,
                        bias,
                        residual,
                        tile,
                    }
                }
            };
            out.push(s);
        }
        out
    }

    /// The oracle: runs every iteration and checks every element each statement touches.
    struct Oracle<'k> {
        kernel: &'k Kernel,
        values: Vec<i64>,
    }

    impl Oracle<'_> {
        fn eval(&self, a: &Affine) -> i128 {
            a.terms.iter().fold(i128::from(a.offset), |acc, &(v, c)| {
                acc + i128::from(self.values[v.0 as usize]) * i128::from(c)
            })
        }

        fn buffer(&self, buf: BufId) -> (i128, Access) {
            match buf.local_index() {
                Some(i) => (self.kernel.locals[i] as i128, Access::Write),
                None => {
                    let a = &self.kernel.args[buf.0 as usize];
                    (a.len as i128, a.access)
                }
            }
        }

        /// Elements `first..first+n` of `buf` (with the access needed) are inside it.
        fn touch(&self, buf: BufId, first: i128, n: i128, write: bool) -> bool {
            let (len, access) = self.buffer(buf);
            n <= 0 || (first >= 0 && first + n <= len && (!write || access == Access::Write))
        }

        fn block(&mut self, stmts: &[Stmt]) -> bool {
            stmts.iter().all(|s| self.stmt(s))
        }

        fn stmt(&mut self, s: &Stmt) -> bool {
            match s {
                // a limit only stops iterations early: the oracle runs them all, as the
                // checker proves them all
                Stmt::Loop {
                    var,
                    start,
                    end,
                    step,
                    body,
                    ..
                } => {
                    let mut i = i128::from(*start);
                    while i < i128::from(*end) {
                        self.values[var.0 as usize] = i as i64;
                        if !self.block(body) {
                            return false;
                        }
                        i += i128::from(*step);
                    }
                    true
                }
                Stmt::Assign { value, .. } => match value {
                    Expr::Load { buf, index, width } => {
                        self.touch(*buf, self.eval(index), width.lanes() as i128, false)
                    }
                    _ => true,
                },
                Stmt::Store {
                    buf, index, width, ..
                } => self.touch(*buf, self.eval(index), width.lanes() as i128, true),
                Stmt::WinogradInputRow { x, v, row } => {
                    // every element the contract lets the routine touch, one by one
                    let r = *row;
                    let (xs, vs) = (self.eval(&x.index), self.eval(&v.index));
                    let lanes = WinogradInputRow::LANES;
                    r.is_valid()
                        && x.buf != v.buf
                        && (0..r.tiles).all(|t| {
                            (0..r.alpha).all(|i| {
                                (0..r.alpha).all(|j| {
                                    let at = i * r.x_row + t * r.x_tile + j * lanes;
                                    self.touch(x.buf, xs + i128::from(at), i128::from(lanes), false)
                                })
                            }) && (0..r.alpha * r.alpha).all(|xi| {
                                let at = xi * r.v_plane + t * r.v_tile;
                                self.touch(v.buf, vs + i128::from(at), i128::from(lanes), true)
                            })
                        })
                }
                Stmt::WinogradOutputRow { m, out, row } => {
                    // every element the contract lets the routine touch, one by one
                    let r = *row;
                    let (ms, os) = (self.eval(&m.index), self.eval(&out.index));
                    let lanes = WinogradOutputRow::LANES;
                    let mu = r.outputs();
                    r.is_valid()
                        && m.buf != out.buf
                        && (0..r.tiles).all(|t| {
                            (0..r.alpha * r.alpha).all(|xi| {
                                let at = xi * r.m_plane + t * r.m_tile;
                                self.touch(m.buf, ms + i128::from(at), i128::from(lanes), false)
                            })
                        })
                        && (0..r.rows).all(|y| {
                            (0..r.cols.min(r.tiles * mu)).all(|x| {
                                let at = y * r.out_row + x * lanes;
                                self.touch(out.buf, os + i128::from(at), i128::from(lanes), true)
                            })
                        })
                }
                Stmt::Prefetch {
                    at,
                    rows,
                    row_stride,
                    row_len,
                } => (0..*rows).all(|r| {
                    let first = self.eval(&at.index) + i128::from(r * row_stride);
                    self.touch(at.buf, first, i128::from(*row_len), false)
                }),
                Stmt::StoreRows {
                    sums,
                    bias,
                    residual,
                    out,
                    rows,
                    lanes,
                    ..
                } => {
                    let n = i128::from(*rows) * i128::from(*lanes);
                    *rows >= 0
                        && *lanes > 0
                        && lanes % 16 == 0
                        && self.touch(sums.buf, self.eval(&sums.index), n, false)
                        && residual
                            .as_ref()
                            .is_none_or(|r| self.touch(r.buf, self.eval(&r.index), n, false))
                        && self.touch(out.buf, self.eval(&out.index), n, true)
                        && bias.as_ref().is_none_or(|b| {
                            n == 0
                                || self.touch(b.buf, self.eval(&b.index), i128::from(*lanes), false)
                        })
                }
                Stmt::StorePlanes {
                    sums,
                    bias,
                    out,
                    pixels,
                    channels,
                    lanes,
                    plane,
                    ..
                } => {
                    // every element the contract lets the routine touch, one by one
                    let (p, c, l, pl) = (*pixels, *channels, *lanes, *plane);
                    let (ss, os) = (self.eval(&sums.index), self.eval(&out.index));
                    p >= 0
                        && l > 0
                        && l % 16 == 0
                        && (0..=l).contains(&c)
                        && pl >= p
                        && sums.buf != out.buf
                        && (0..p).all(|pi| {
                            (0..c).all(|ci| {
                                self.touch(sums.buf, ss + i128::from(pi * l + ci), 1, false)
                                    && self.touch(out.buf, os + i128::from(ci * pl + pi), 1, true)
                            })
                        })
                        && bias.as_ref().is_none_or(|b| {
                            p == 0
                                || (0..c).all(|ci| {
                                    self.touch(
                                        b.buf,
                                        self.eval(&b.index) + i128::from(ci),
                                        1,
                                        false,
                                    )
                                })
                        })
                }
                Stmt::ActivationRows {
                    buf,
                    bias,
                    rows,
                    lanes,
                    ..
                } => {
                    let n = i128::from(*rows) * i128::from(*lanes);
                    *rows >= 0
                        && *lanes > 0
                        && lanes % 16 == 0
                        && self.touch(buf.buf, self.eval(&buf.index), n, true)
                        && bias.as_ref().is_none_or(|b| {
                            n == 0
                                || self.touch(b.buf, self.eval(&b.index), i128::from(*lanes), false)
                        })
                }
                Stmt::SoftmaxRow { x, out, len } => {
                    let (xs, os) = (self.eval(&x.index), self.eval(&out.index));
                    let n = i128::from(*len);
                    *len >= 0 && self.touch(x.buf, xs, n, false) && self.touch(out.buf, os, n, true)
                }
                Stmt::BlockedDepthwiseRow {
                    x,
                    w,
                    bias,
                    out,
                    row,
                } => {
                    // every element the contract lets the routine touch, one by one:
                    // lanes below `lanes` of every column of each kernel row read
                    if !row.is_valid() {
                        return false;
                    }
                    let (xs, ws, os) = (
                        self.eval(&x.index),
                        self.eval(&w.index),
                        self.eval(&out.index),
                    );
                    let block = BlockedDepthwiseRow::BLOCK;
                    let sums = row.pixels > 0 && row.cols > 0;
                    let inputs = |r: i64, c: i64| {
                        (0..row.cols).all(|col| {
                            let xi = r * row.x_row_stride + col * block + c;
                            self.touch(x.buf, xs + i128::from(xi), 1, false)
                        }) && (0..row.taps).all(|t| {
                            let wi = r * row.w_row_stride + t * block + c;
                            self.touch(w.buf, ws + i128::from(wi), 1, false)
                        })
                    };
                    (0..row.pixels * block)
                        .all(|o| self.touch(out.buf, os + i128::from(o), 1, true))
                        && (0..row.lanes).all(|c| {
                            bias.as_ref().is_none_or(|b| {
                                row.pixels == 0
                                    || self.touch(
                                        b.buf,
                                        self.eval(&b.index) + i128::from(c),
                                        1,
                                        false,
                                    )
                            }) && (!sums || row.taps == 0 || (0..row.rows).all(|r| inputs(r, c)))
                        })
                }
                Stmt::DepthwiseRow { x, w, out, row } => {
                    // every element the contract's formula names, one by one
                    let (xs, ws, os) = (
                        self.eval(&x.index),
                        self.eval(&w.index),
                        self.eval(&out.index),
                    );
                    let taps = row.taps.clamp(0, DEPTHWISE_MAX_TAPS as i64);
                    (0..row.cols).all(|q| {
                        self.touch(out.buf, os + i128::from(q), 1, true)
                            && (0..row.rows).all(|r| {
                                (0..taps).all(|t| {
                                    let xi = r * row.row_stride + row.tap_offsets[t as usize] + q;
                                    self.touch(x.buf, xs + i128::from(xi), 1, false)
                                        && self.touch(
                                            w.buf,
                                            ws + i128::from(r * taps + t),
                                            1,
                                            false,
                                        )
                                })
                            })
                    })
                }
                Stmt::ConvTile {
                    x,
                    w,
                    out,
                    next,
                    bias,
                    residual,
                    tile: t,
                } => {
                    // the contract's preconditions the formula itself does not show
                    let finish_ok =
                        t.finish == 0 || (t.finish_act().is_some() && t.out_vec_stride == 4);
                    if !finish_ok || (t.finish == 0 && (bias.is_some() || residual.is_some())) {
                        return false;
                    }
                    // every element the contract's formula names, one by one
                    let reads = t.rows > 0 && t.taps > 0 && t.chans > 0;
                    let (xs, ws, os) = (
                        self.eval(&x.index),
                        self.eval(&w.index),
                        self.eval(&out.index),
                    );
                    let bs = bias.as_ref().map(|b| (b.buf, self.eval(&b.index)));
                    let rs = residual.as_ref().map(|r| (r.buf, self.eval(&r.index)));
                    for p in 0..t.pixels {
                        for l in 0..t.lanes {
                            let o = p * t.out_pixel_stride
                                + (l / 16) * t.out_block_stride
                                + (l % 16 / 4) * t.out_vec_stride
                                + l % 4;
                            if !self.touch(out.buf, os + i128::from(o), 1, true) {
                                return false;
                            }
                            if bs
                                .is_some_and(|(b, at)| !self.touch(b, at + i128::from(l), 1, false))
                                || rs.is_some_and(|(r, at)| {
                                    !self.touch(r, at + i128::from(o), 1, false)
                                })
                            {
                                return false;
                            }
                        }
                        if !reads {
                            continue;
                        }
                        for r in 0..t.rows {
                            for tap in 0..t.taps {
                                for c in 0..t.chans {
                                    let xi = r * t.row_stride
                                        + tap * t.tap_stride
                                        + c * t.chan_stride
                                        + p * t.pixel_stride;
                                    if !self.touch(x.buf, xs + i128::from(xi), 1, false) {
                                        return false;
                                    }
                                    for l in 0..t.lanes {
                                        let wi =
                                            (r * t.taps + tap) * t.w_tap_stride + t.lanes * c + l;
                                        if !self.touch(w.buf, ws + i128::from(wi), 1, false) {
                                            return false;
                                        }
                                    }
                                }
                            }
                        }
                    }
                    match next {
                        // the run moved back where it would pass the end (Stmt::ConvTile)
                        Some(at) => {
                            let (len, _) = self.buffer(at.buf);
                            let n = i128::from(t.next_len);
                            let first = self.eval(&at.index).min(len - n);
                            self.touch(at.buf, first, n, false)
                        }
                        None => true,
                    }
                }
            }
        }
    }

    fn oracle_accepts(k: &Kernel) -> bool {
        let mut o = Oracle {
            kernel: k,
            values: vec![0; k.num_loop_vars as usize],
        };
        o.block(&k.body)
    }

    #[test]
    fn checker_accepts_exactly_the_kernels_whose_accesses_are_inside() {
        let (mut accepted, mut rejected) = (0, 0);
        for seed in 1..=4000u64 {
            let mut g = Gen(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let k = random_kernel(&mut g);
            let proved = k.check();
            let inside = oracle_accepts(&k);
            assert_eq!(
                proved.is_ok(),
                inside,
                "seed {seed}: checker says {proved:?}, brute force says inside = {inside}\n{k}"
            );
            if inside {
                accepted += 1;
            } else {
                rejected += 1;
            }
        }
        eprintln!("{accepted} kernels accepted, {rejected} rejected");
        // both outcomes must be well represented, or the test shows nothing
        assert!(
            accepted > 400 && rejected > 400,
            "{accepted} accepted, {rejected} rejected"
        );
    }
}
