//! Translation of one loop-IR kernel into a Cranelift function: loops with pointer
//! induction variables, vector loads and stores, FMAs, selects, and calls of the
//! conv-tile routines and the prefetch helper (the conventions are the parent module's
//! doc).

use std::collections::{BTreeSet, HashMap};

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    immediates::Imm64, types, AbiParam, Block, ConstantData, Endianness, ExtFuncData, ExternalName,
    FuncRef, Function, GlobalValue, GlobalValueData, InstBuilder, InstructionData, MemFlagsData,
    Opcode, StackSlotData, StackSlotKind, Type, UserExternalName, UserFuncName, Value as ClifValue,
    ValueDef,
};
use cranelift_codegen::isa::TargetIsa;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use smelt_ir::loops::{
    trip_count, Access, Affine, BinOp, BufId, BufPtr, CmpOp, ConvTile, Expr, Fault, Kernel,
    LoopLimit, LoopVar, ReduceOp, Stmt, UnOp, Width,
};

use super::{calls_of, Call, RowRecord, TargetDesc};
use crate::microkernels::{RowRoutine, TileIsa, ROUTINES, ROW_ROUTINES};

mod math;

/// `extern "C" fn(x, w, out: *f32, shape: *const ConvTile, next, bias, residual: *const
/// f32)`: see `crate::microkernels`.
pub(super) fn conv_tile_signature(isa: &dyn TargetIsa) -> cranelift_codegen::ir::Signature {
    let mut sig = cranelift_codegen::ir::Signature::new(isa.default_call_conv());
    for _ in 0..7 {
        sig.params.push(AbiParam::new(isa.pointer_type()));
    }
    sig
}

/// The module's function id of the prefetch helper: declared right after the routines.
pub(super) const PREFETCH_ROWS_ID: usize = ROUTINES.len();

/// The module's function id of the first row routine: the row routines are declared
/// right after the prefetch helper, in [`crate::microkernels::ROW_ROUTINES`] order.
pub(super) const ROW_ROUTINES_ID: usize = PREFETCH_ROWS_ID + 1;

/// The C signature of a row routine (see `crate::microkernels`, the routine's file):
/// depthwise `(x, w, out, shape: *const DepthwiseRow)`, softmax `(x, out, len)`, SiLU
/// `(buf, bias, rows, lanes)`, store `(sums, bias, residual, out, rows, lanes)`, blocked
/// depthwise `(x, w, bias, out, shape: *const BlockedDepthwiseRow)`.
pub(super) fn row_routine_signature(
    kind: RowRoutine,
    isa: &dyn TargetIsa,
) -> cranelift_codegen::ir::Signature {
    let mut sig = cranelift_codegen::ir::Signature::new(isa.default_call_conv());
    let (pointers, counts) = match kind {
        RowRoutine::Depthwise => (4, 0),
        RowRoutine::Softmax => (2, 1),
        RowRoutine::Activation(_) => (2, 2),
        RowRoutine::Store(_) => (4, 2),
        RowRoutine::Planes(_) => (3, 4),
        RowRoutine::WinogradOutput => (2, 7),
        RowRoutine::WinogradInput => (2, 6),
        RowRoutine::BlockedDepthwise => (5, 0),
    };
    for _ in 0..pointers {
        sig.params.push(AbiParam::new(isa.pointer_type()));
    }
    for _ in 0..counts {
        sig.params.push(AbiParam::new(types::I64));
    }
    sig
}

/// `record`'s bytes in its `repr(C)` layout (all `i64` words).
fn row_record_bytes(record: &RowRecord) -> Vec<u8> {
    record
        .words()
        .into_iter()
        .flat_map(i64::to_ne_bytes)
        .collect()
}

/// `extern "C" fn(at: *f32, rows, row_stride, row_len: i64)`: see
/// `microkernels::prefetch_rows`.
pub(super) fn prefetch_rows_signature(isa: &dyn TargetIsa) -> cranelift_codegen::ir::Signature {
    let mut sig = cranelift_codegen::ir::Signature::new(isa.default_call_conv());
    sig.params.push(AbiParam::new(isa.pointer_type()));
    for _ in 0..3 {
        sig.params.push(AbiParam::new(types::I64));
    }
    sig
}

/// `tile`'s bytes in `ConvTile`'s `repr(C)` layout, where the routines read it (its
/// padding zero).
fn conv_tile_bytes(tile: &ConvTile) -> Vec<u8> {
    use std::mem::{offset_of, size_of};
    let mut bytes = vec![0u8; size_of::<ConvTile>()];
    let words = [
        (offset_of!(ConvTile, lanes), tile.lanes),
        (offset_of!(ConvTile, pixels), tile.pixels),
        (offset_of!(ConvTile, rows), tile.rows),
        (offset_of!(ConvTile, row_stride), tile.row_stride),
        (offset_of!(ConvTile, taps), tile.taps),
        (offset_of!(ConvTile, tap_stride), tile.tap_stride),
        (offset_of!(ConvTile, chans), tile.chans),
        (offset_of!(ConvTile, chan_stride), tile.chan_stride),
        (offset_of!(ConvTile, pixel_stride), tile.pixel_stride),
        (offset_of!(ConvTile, w_tap_stride), tile.w_tap_stride),
        (
            offset_of!(ConvTile, out_pixel_stride),
            tile.out_pixel_stride,
        ),
        (offset_of!(ConvTile, out_vec_stride), tile.out_vec_stride),
        (
            offset_of!(ConvTile, out_block_stride),
            tile.out_block_stride,
        ),
        (offset_of!(ConvTile, next_len), tile.next_len),
        (offset_of!(ConvTile, finish), tile.finish),
    ];
    for (at, v) in words {
        bytes[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
    // a Rust `bool`: one byte, 0 or 1
    bytes[offset_of!(ConvTile, accumulate)] = u8::from(tile.accumulate);
    bytes
}

/// The records of the call shapes of a set of kernels, each a read-only data object of
/// the module (namespace 1 of its external names, by the index given here): a record
/// is constant, so the code only loads its address, where writing it to the stack at
/// every kernel's entry took three instructions a word (30% of DBNet's Cranelift IR,
/// its conv kernels' four 16-word tile records; cheap ones for Cranelift, though: code
/// generation 0.1–0.2 ms shorter).
#[derive(Default)]
pub(super) struct RecordData {
    tiles: HashMap<ConvTile, u32>,
    rows: HashMap<RowRecord, u32>,
}

impl RecordData {
    /// Every record of the calls of `kernels`, in order of first appearance: `define`
    /// gets the bytes of each new one and returns its data object's index.
    pub(super) fn collect<'k, E>(
        kernels: impl IntoIterator<Item = &'k Kernel>,
        mut define: impl FnMut(Vec<u8>) -> Result<u32, E>,
    ) -> Result<RecordData, E> {
        let mut records = RecordData::default();
        for k in kernels {
            for call in calls_of(&k.body) {
                match call {
                    Call::Tile(tile) if !records.tiles.contains_key(&tile) => {
                        let index = define(conv_tile_bytes(&tile))?;
                        records.tiles.insert(tile, index);
                    }
                    Call::Row(_, Some(row)) if !records.rows.contains_key(&row) => {
                        let index = define(row_record_bytes(&row))?;
                        records.rows.insert(row, index);
                    }
                    // known already, or a row routine whose arguments are all registers
                    _ => {}
                }
            }
        }
        Ok(records)
    }

    /// One comment line per record, in index order, naming what it holds (dumps show
    /// the records' data objects only by their names).
    pub(super) fn comments(&self) -> String {
        let mut lines: Vec<(u32, String)> = self
            .tiles
            .iter()
            .map(|(t, &i)| (i, format!("conv tile {t}")))
            .chain(self.rows.iter().map(|(r, &i)| {
                let words: Vec<String> = r.words().iter().map(i64::to_string).collect();
                (i, format!("row record [{}]", words.join(", ")))
            }))
            .collect();
        lines.sort();
        lines
            .into_iter()
            .map(|(i, what)| format!("; userextname{i}: {what}\n"))
            .collect()
    }

    /// The records of `kernel` alone, numbered from 0 (for dumps: no module holds them).
    pub(super) fn numbered(kernel: &Kernel) -> RecordData {
        let mut next = 0;
        let numbered = Self::collect([kernel], |_| {
            next += 1;
            Ok::<_, std::convert::Infallible>(next - 1)
        });
        match numbered {
            Ok(records) => records,
            Err(never) => match never {},
        }
    }
}

/// `extern "C" fn(args: *const *mut u8, lo: i64, hi: i64) -> i32`: the status is 0, or
/// the [`Fault`] that ended the call.
pub(super) fn kernel_signature(isa: &dyn TargetIsa) -> cranelift_codegen::ir::Signature {
    let mut sig = cranelift_codegen::ir::Signature::new(isa.default_call_conv());
    sig.params.push(AbiParam::new(isa.pointer_type()));
    sig.params.push(AbiParam::new(types::I64));
    sig.params.push(AbiParam::new(types::I64));
    sig.returns.push(AbiParam::new(types::I32));
    sig
}

/// Translates one kernel into a Cranelift function; `records` holds the records of its
/// calls.
pub(super) fn build_function(
    kernel: &Kernel,
    target: &TargetDesc,
    isa: &dyn TargetIsa,
    records: &RecordData,
    fctx: &mut FunctionBuilderContext,
) -> Function {
    let mut func = Function::with_name_signature(UserFuncName::user(0, 0), kernel_signature(isa));
    let mut fb = FunctionBuilder::new(&mut func, fctx);
    let entry = fb.create_block();
    fb.append_block_params_for_function_params(entry);
    fb.switch_to_block(entry);
    fb.seal_block(entry);
    let ptr = isa.pointer_type();
    let params = fb.block_params(entry).to_vec();
    let (args_ptr, lo, hi) = (params[0], params[1], params[2]);
    // The pointer array is never written while the kernel runs.
    let arg_flags = MemFlagsData::new()
        .with_notrap()
        .with_aligned()
        .with_readonly()
        .with_can_move();
    let mut bases: Vec<ClifValue> = (0..kernel.args.len())
        .map(|i| fb.ins().load(ptr, arg_flags, args_ptr, (i * 8) as i32))
        .collect();
    for &len in &kernel.locals {
        // 64-byte aligned, like every other buffer
        let bytes = u32::try_from(len * 4).unwrap_or(u32::MAX);
        let slot =
            fb.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, bytes, 6));
        bases.push(fb.ins().stack_addr(ptr, slot, 0));
    }
    // the data object of every record a call reads, declared once
    let record = |fb: &mut FunctionBuilder, index: u32| {
        let name = fb.func.declare_imported_user_function(UserExternalName {
            namespace: 1,
            index,
        });
        // not colocated: the data may lie farther than 2 GiB from the code
        fb.create_global_value(GlobalValueData::Symbol {
            name: ExternalName::user(name),
            offset: Imm64::new(0),
            colocated: false,
            tls: false,
        })
    };
    let mut tile_records = HashMap::new();
    let mut row_records = HashMap::new();
    for call in calls_of(&kernel.body) {
        match call {
            Call::Tile(tile) if !tile_records.contains_key(&tile) => {
                if let Some(&index) = records.tiles.get(&tile) {
                    tile_records.insert(tile, record(&mut fb, index));
                }
            }
            Call::Row(_, Some(row)) if !row_records.contains_key(&row) => {
                if let Some(&index) = records.rows.get(&row) {
                    row_records.insert(row, record(&mut fb, index));
                }
            }
            // known already, or a row routine whose arguments are all registers
            _ => {}
        }
    }
    let vars: Vec<Variable> = kernel
        .vars
        .iter()
        .map(|w| fb.declare_var(clif_type(*w)))
        .collect();
    let loop_vars: Vec<Variable> = (0..kernel.num_loop_vars)
        .map(|_| fb.declare_var(types::I64))
        .collect();
    let mut loops = vec![LoopInfo::default(); kernel.num_loop_vars as usize];
    collect_loops(&kernel.body, 0, &mut loops);
    let mut g = Gen {
        fb,
        kernel,
        bases,
        tiles: target.tiles,
        routines: [None; ROUTINES.len()],
        routine_sig: conv_tile_signature(isa),
        prefetch_rows: None,
        prefetch_sig: prefetch_rows_signature(isa),
        row_routines: [None; ROW_ROUTINES.len()],
        row_sigs: RowRoutine::ALL.map(|kind| (kind, row_routine_signature(kind, isa))),
        tile_records,
        row_records,
        vars,
        known: vec![None; kernel.num_loop_vars as usize],
        loops,
        pointers: HashMap::new(),
        loop_vars,
        fma: target.fused_fma(),
        range: None,
        faults: Vec::new(),
    };
    match (kernel.parallel_trips(), kernel.body.as_slice()) {
        (Some(trips), [Stmt::Loop { .. }]) if trips > 1 => {
            // trips lo..hi, clamped to 0 <= lo, hi <= trips (an empty range runs nothing)
            let zero = g.fb.ins().iconst(types::I64, 0);
            let n = g.fb.ins().iconst(types::I64, trips);
            let lo = g.fb.ins().smax(lo, zero);
            let hi = g.fb.ins().smin(hi, n);
            g.range = Some((lo, hi));
        }
        _ => {}
    }
    g.block(&kernel.body);
    let ok = g.fb.ins().iconst(types::I32, 0);
    g.fb.ins().return_(&[ok]);
    // each fault's exit: every branch to it has been emitted
    for (fault, block) in std::mem::take(&mut g.faults) {
        g.fb.switch_to_block(block);
        g.fb.seal_block(block);
        let status = g.fb.ins().iconst(types::I32, fault as i64);
        g.fb.ins().return_(&[status]);
    }
    g.fb.finalize(isa.frontend_config());
    func
}

/// The coefficient of a limited loop's own variable in its limit's row.
fn own_coefficient(limit: &LoopLimit, var: LoopVar) -> i64 {
    limit
        .row
        .terms
        .iter()
        .find(|&&(v, _)| v == var)
        .map_or(0, |&(_, c)| c)
}

fn clif_type(w: Width) -> Type {
    match w {
        Width::Scalar => types::F32,
        Width::F32x4 => types::F32X4,
        Width::I64 => types::I64,
        Width::I32 => types::I32,
        // an `i1` is a byte 0 or 1, which is what Cranelift's comparisons produce
        Width::Bool => types::I8,
        // the 2-byte floats are moved as their bits and widened only by `cast`
        Width::F16 | Width::BF16 => types::I16,
        // the narrow integers are extended to i32 only by `cast`
        Width::I8 | Width::U8 => types::I8,
        Width::I16 | Width::U16 => types::I16,
    }
}

fn int_cc(cmp: CmpOp) -> IntCC {
    match cmp {
        CmpOp::Eq => IntCC::Equal,
        CmpOp::Ne => IntCC::NotEqual,
        CmpOp::Lt => IntCC::SignedLessThan,
        CmpOp::Le => IntCC::SignedLessThanOrEqual,
        CmpOp::Gt => IntCC::SignedGreaterThan,
        CmpOp::Ge => IntCC::SignedGreaterThanOrEqual,
    }
}

fn float_cc(cmp: CmpOp) -> FloatCC {
    match cmp {
        CmpOp::Eq => FloatCC::Equal,
        // true when either is NaN, as `!=` is
        CmpOp::Ne => FloatCC::NotEqual,
        CmpOp::Lt => FloatCC::LessThan,
        CmpOp::Le => FloatCC::LessThanOrEqual,
        CmpOp::Gt => FloatCC::GreaterThan,
        CmpOp::Ge => FloatCC::GreaterThanOrEqual,
    }
}

/// Static facts about one loop variable.
#[derive(Clone, Copy, Debug, Default)]
struct LoopInfo {
    /// Nesting depth (0: a top-level loop).
    depth: u32,
    /// Number of trips.
    trips: i64,
}

fn collect_loops(stmts: &[Stmt], depth: u32, out: &mut [LoopInfo]) {
    for s in stmts {
        if let Stmt::Loop {
            var,
            start,
            end,
            step,
            body,
            ..
        } = s
        {
            if let Some(info) = out.get_mut(var.0 as usize) {
                *info = LoopInfo {
                    depth,
                    trips: trip_count(*start, *end, *step),
                };
            }
            collect_loops(body, depth + 1, out);
        }
    }
}

/// A pointer induction variable: a buffer and the loop terms (variable, coefficient)
/// of an address, outermost loop first; constant parts are byte offsets of the access.
type PointerKey = (usize, Vec<(u32, i64)>);

struct Gen<'f, 'k> {
    fb: FunctionBuilder<'f>,
    kernel: &'k Kernel,
    /// Base pointers: the arguments, then the local buffers.
    bases: Vec<ClifValue>,
    /// The instruction set whose routines the calls link to ([`check_calls`] proved it
    /// has one for every call).
    tiles: Option<TileIsa>,
    /// The function reference of each routine the kernel calls, by its index in
    /// [`ROUTINES`], imported at its first call.
    routines: [Option<FuncRef>; ROUTINES.len()],
    /// The routines' signature.
    routine_sig: cranelift_codegen::ir::Signature,
    /// The prefetch helper, imported at its first call, and its signature.
    prefetch_rows: Option<FuncRef>,
    prefetch_sig: cranelift_codegen::ir::Signature,
    /// The function reference of each row routine the kernel calls, by its index in
    /// [`ROW_ROUTINES`], imported at its first call, and each kind's signature.
    row_routines: [Option<FuncRef>; ROW_ROUTINES.len()],
    row_sigs: [(RowRoutine, cranelift_codegen::ir::Signature); RowRoutine::ALL.len()],
    /// The data object holding each call shape's record.
    tile_records: HashMap<ConvTile, GlobalValue>,
    /// The same for row routines that take a record.
    row_records: HashMap<RowRecord, GlobalValue>,
    vars: Vec<Variable>,
    loop_vars: Vec<Variable>,
    /// Values of loop variables of single-trip loops, folded into addresses.
    known: Vec<Option<i64>>,
    loops: Vec<LoopInfo>,
    /// The pointer variable of each key defined by the loops being emitted.
    pointers: HashMap<PointerKey, Variable>,
    fma: bool,
    /// Trip range `lo..hi` (clamped) of the parallel kernel's top-level loop.
    range: Option<(ClifValue, ClifValue)>,
    /// The exit block of each fault a check may branch to, made at the first check.
    faults: Vec<(Fault, Block)>,
}

impl Gen<'_, '_> {
    fn block(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            match s {
                Stmt::Loop {
                    var,
                    start,
                    end,
                    step,
                    limit,
                    body,
                } => self.emit_loop(*var, (*start, *end, *step), limit.as_ref(), body),
                Stmt::Assign { dst, value } => {
                    let v = self.expr(value);
                    self.fb.def_var(self.vars[dst.0 as usize], v);
                }
                Stmt::Store {
                    buf,
                    index,
                    value,
                    width: _,
                } => {
                    let v = self.expr(value);
                    let (addr, off) = self.address(self.slot(*buf), index);
                    self.fb
                        .ins()
                        .store(MemFlagsData::new().with_notrap(), v, addr, off);
                }
                Stmt::ConvTile {
                    x,
                    w,
                    out,
                    next,
                    bias,
                    residual,
                    tile,
                } => self.conv_tile([x, w, out], next.as_ref(), [bias, residual], tile),
                Stmt::DepthwiseRow { x, w, out, row } => {
                    let mut args = [x, w, out].map(|p| self.call_pointer(p)).to_vec();
                    // every call's record was declared at entry (`calls_of` walks this body)
                    let Some(&record) = self.row_records.get(&RowRecord::Depthwise(*row)) else {
                        unreachable!("depthwise row {row} has no record");
                    };
                    let ptr = self.fb.func.dfg.value_type(args[0]);
                    args.push(self.fb.ins().symbol_value(ptr, record));
                    self.call_row(RowRoutine::Depthwise, &args);
                }
                Stmt::BlockedDepthwiseRow {
                    x,
                    w,
                    bias,
                    out,
                    row,
                } => {
                    let [x, w, out] = [x, w, out].map(|p| self.call_pointer(p));
                    let ptr = self.fb.func.dfg.value_type(x);
                    let bias = match bias {
                        Some(b) => self.call_pointer(b),
                        None => self.fb.ins().iconst(ptr, 0),
                    };
                    // every call's record was declared at entry (`calls_of` walks this body)
                    let Some(&record) = self.row_records.get(&RowRecord::Blocked(*row)) else {
                        unreachable!("blocked depthwise row {row} has no record");
                    };
                    let shape = self.fb.ins().symbol_value(ptr, record);
                    self.call_row(RowRoutine::BlockedDepthwise, &[x, w, bias, out, shape]);
                }
                Stmt::SoftmaxRow { x, out, len } => {
                    self.call_row_with_counts(RowRoutine::Softmax, [x, out], &[*len])
                }
                Stmt::ActivationRows {
                    act,
                    buf,
                    bias,
                    rows,
                    lanes,
                } => {
                    let buf = self.call_pointer(buf);
                    let bias = match bias {
                        Some(b) => self.call_pointer(b),
                        None => {
                            let ptr = self.fb.func.dfg.value_type(buf);
                            self.fb.ins().iconst(ptr, 0)
                        }
                    };
                    let counts = [*rows, *lanes].map(|v| self.fb.ins().iconst(types::I64, v));
                    self.call_row(
                        RowRoutine::Activation(*act),
                        &[buf, bias, counts[0], counts[1]],
                    );
                }
                Stmt::StoreRows {
                    act,
                    sums,
                    bias,
                    residual,
                    out,
                    rows,
                    lanes,
                } => {
                    let sums = self.call_pointer(sums);
                    let null = {
                        let ptr = self.fb.func.dfg.value_type(sums);
                        self.fb.ins().iconst(ptr, 0)
                    };
                    let bias = bias.as_ref().map_or(null, |b| self.call_pointer(b));
                    let residual = residual.as_ref().map_or(null, |r| self.call_pointer(r));
                    let out = self.call_pointer(out);
                    let counts = [*rows, *lanes].map(|v| self.fb.ins().iconst(types::I64, v));
                    self.call_row(
                        RowRoutine::Store(*act),
                        &[sums, bias, residual, out, counts[0], counts[1]],
                    );
                }
                Stmt::StorePlanes {
                    act,
                    sums,
                    bias,
                    out,
                    pixels,
                    channels,
                    lanes,
                    plane,
                } => {
                    let sums = self.call_pointer(sums);
                    let bias = match bias {
                        Some(b) => self.call_pointer(b),
                        None => {
                            let ptr = self.fb.func.dfg.value_type(sums);
                            self.fb.ins().iconst(ptr, 0)
                        }
                    };
                    let out = self.call_pointer(out);
                    let counts = [*pixels, *channels, *lanes, *plane]
                        .map(|v| self.fb.ins().iconst(types::I64, v));
                    self.call_row(
                        RowRoutine::Planes(*act),
                        &[sums, bias, out, counts[0], counts[1], counts[2], counts[3]],
                    );
                }
                Stmt::WinogradInputRow { x, v, row } => {
                    self.call_row_with_counts(RowRoutine::WinogradInput, [x, v], &row.words())
                }
                Stmt::WinogradOutputRow { m, out, row } => {
                    self.call_row_with_counts(RowRoutine::WinogradOutput, [m, out], &row.words())
                }
                Stmt::Prefetch {
                    at,
                    rows,
                    row_stride,
                    row_len,
                } => self.prefetch(at, [*rows, *row_stride, *row_len]),
            }
        }
    }

    /// Elements of a buffer (argument or local).
    fn buffer_len(&self, buf: BufId) -> usize {
        match buf.local_index() {
            Some(i) => self.kernel.locals[i],
            None => self.kernel.args[buf.0 as usize].len,
        }
    }

    /// Bytes per element of the buffer at `slot` in `bases` (locals hold `f32`).
    fn elem_size(&self, slot: usize) -> i64 {
        self.kernel
            .args
            .get(slot)
            .map_or(4, |a| a.dtype.size_bytes() as i64)
    }

    /// The block that ends the kernel with `fault`, made at its first use.
    fn fault_block(&mut self, fault: Fault) -> Block {
        if let Some(&(_, b)) = self.faults.iter().find(|(f, _)| *f == fault) {
            return b;
        }
        let b = self.fb.create_block();
        self.faults.push((fault, b));
        b
    }

    /// Continues in a new block when `ok` holds, else ends the kernel with `fault`.
    fn check_or_fault(&mut self, ok: ClifValue, fault: Fault) {
        let fail = self.fault_block(fault);
        let cont = self.fb.create_block();
        self.fb.ins().brif(ok, cont, &[], fail, &[]);
        self.fb.switch_to_block(cont);
        self.fb.seal_block(cont);
    }

    /// The index in `bases` of a buffer.
    fn slot(&self, buf: BufId) -> usize {
        match buf.local_index() {
            Some(i) => self.kernel.args.len() + i,
            None => buf.0 as usize,
        }
    }

    /// Calls a conv-tile routine (arguments in `conv_tile_signature` order).
    fn conv_tile(
        &mut self,
        ptrs: [&BufPtr; 3],
        next: Option<&BufPtr>,
        finish: [&Option<BufPtr>; 2],
        t: &ConvTile,
    ) {
        let Some((i, _)) = self.tiles.and_then(|isa| isa.routine(t.lanes)) else {
            unreachable!("check_calls proved a routine for every call");
        };
        let callee = match self.routines[i] {
            Some(f) => f,
            None => {
                // named by its function id in the module (see ROUTINES)
                let f = self.import(i, self.routine_sig.clone());
                self.routines[i] = Some(f);
                f
            }
        };
        let mut args = ptrs.map(|p| self.call_pointer(p)).to_vec();
        // every call's record was declared at entry (`calls_of` walks the same body)
        let Some(&record) = self.tile_records.get(t) else {
            unreachable!("conv tile {t} has no record");
        };
        let ptr = self.fb.func.dfg.value_type(args[0]);
        args.push(self.fb.ins().symbol_value(ptr, record));
        let next = match next {
            // the run moved back where it would pass the buffer's end (`Stmt::ConvTile`)
            Some(at) => {
                let slot = self.slot(at.buf);
                let (addr, off) = self.address(slot, &at.index);
                let start = self.fb.ins().iadd_imm_s(addr, i64::from(off));
                let last_start = Affine::constant(self.buffer_len(at.buf) as i64 - t.next_len);
                let (addr, off) = self.address(slot, &last_start);
                let limit = self.fb.ins().iadd_imm_s(addr, i64::from(off));
                self.fb.ins().umin(start, limit)
            }
            None => self.fb.ins().iconst(ptr, 0),
        };
        args.push(next);
        for p in finish {
            let v = match p {
                Some(p) => self.call_pointer(p),
                None => self.fb.ins().iconst(ptr, 0),
            };
            args.push(v);
        }
        self.fb.ins().call(callee, &args);
    }

    /// The address `p` names, as a pointer value (a native routine's argument).
    fn call_pointer(&mut self, p: &BufPtr) -> ClifValue {
        let (addr, off) = self.address(self.slot(p.buf), &p.index);
        self.fb.ins().iadd_imm_s(addr, i64::from(off))
    }

    /// Calls the tile ISA's `kind` row routine with `args` (in its signature's order),
    /// importing it at its first call.
    /// A call of a row routine taking the buffer pointers `pointers`, then `counts` as
    /// `i64` constants.
    fn call_row_with_counts<const P: usize>(
        &mut self,
        kind: RowRoutine,
        pointers: [&BufPtr; P],
        counts: &[i64],
    ) {
        let mut args: Vec<ClifValue> = pointers.iter().map(|p| self.call_pointer(p)).collect();
        args.extend(counts.iter().map(|&c| self.fb.ins().iconst(types::I64, c)));
        self.call_row(kind, &args);
    }

    fn call_row(&mut self, kind: RowRoutine, args: &[ClifValue]) {
        let Some(isa) = self.tiles else {
            unreachable!(
                "check_calls proved a tile ISA for every {} call",
                kind.name()
            );
        };
        let i = kind.index(isa);
        let callee = match self.row_routines[i] {
            Some(f) => f,
            None => {
                let Some((_, sig)) = self.row_sigs.iter().find(|(k, _)| *k == kind) else {
                    unreachable!("every row routine kind has a signature");
                };
                let f = self.import(ROW_ROUTINES_ID + i, sig.clone());
                self.row_routines[i] = Some(f);
                f
            }
        };
        self.fb.ins().call(callee, args);
    }

    /// Imports the module's function `id` (a native helper) with `signature`.
    fn import(&mut self, id: usize, signature: cranelift_codegen::ir::Signature) -> FuncRef {
        let signature = self.fb.import_signature(signature);
        let name = self
            .fb
            .func
            .declare_imported_user_function(UserExternalName {
                namespace: 0,
                index: id as u32,
            });
        self.fb.import_function(ExtFuncData {
            name: ExternalName::user(name),
            signature,
            colocated: false,
            patchable: false,
        })
    }

    /// Calls the prefetch helper for `rows` runs of `row_len` elements, `row_stride` apart.
    fn prefetch(&mut self, at: &BufPtr, [rows, row_stride, row_len]: [i64; 3]) {
        let callee = match self.prefetch_rows {
            Some(f) => f,
            None => {
                let f = self.import(PREFETCH_ROWS_ID, self.prefetch_sig.clone());
                self.prefetch_rows = Some(f);
                f
            }
        };
        let addr = self.call_pointer(at);
        let counts = [rows, row_stride, row_len].map(|v| self.fb.ins().iconst(types::I64, v));
        self.fb
            .ins()
            .call(callee, &[addr, counts[0], counts[1], counts[2]]);
    }

    /// The loop terms of an address that vary (single-trip loops excluded), outermost first.
    fn varying_terms(&self, index: &Affine) -> Vec<(u32, i64)> {
        let mut t: Vec<(u32, i64)> = index
            .terms
            .iter()
            .filter(|(v, _)| self.loops.get(v.0 as usize).is_some_and(|l| l.trips > 1))
            .map(|&(v, c)| (v.0, c))
            .collect();
        t.sort_by_key(|&(v, _)| (self.loops[v as usize].depth, v));
        t
    }

    /// Every pointer key the loop of `var` carries: the prefixes, up to `var`, of the
    /// varying terms of each address in `body` that depends on `var`. Sorted.
    fn loop_pointers(&self, var: LoopVar, body: &[Stmt]) -> BTreeSet<PointerKey> {
        fn exprs<'a>(stmts: &'a [Stmt], out: &mut Vec<(BufId, &'a Affine)>) {
            fn expr<'a>(e: &'a Expr, out: &mut Vec<(BufId, &'a Affine)>) {
                match e {
                    Expr::Var(_) | Expr::Const(..) | Expr::Int(..) => {}
                    Expr::Load { buf, index, .. } => out.push((*buf, index)),
                    Expr::LoadAt {
                        buf, base, index, ..
                    } => {
                        out.push((*buf, base));
                        expr(index, out);
                    }
                    Expr::Splat(x)
                    | Expr::Unary(_, x)
                    | Expr::Reduce(_, x)
                    | Expr::Lane(x, _)
                    | Expr::Cast(_, x) => expr(x, out),
                    Expr::Binary(_, a, b) | Expr::Compare(_, a, b) => {
                        expr(a, out);
                        expr(b, out);
                    }
                    Expr::Fma(a, b, c) => {
                        expr(a, out);
                        expr(b, out);
                        expr(c, out);
                    }
                    Expr::Shuffle(a, b, _) => {
                        expr(a, out);
                        expr(b, out);
                    }
                    Expr::Select {
                        a,
                        b,
                        if_true,
                        if_false,
                        ..
                    } => {
                        for x in [a, b, if_true, if_false] {
                            expr(x, out);
                        }
                    }
                }
            }
            for s in stmts {
                match s {
                    Stmt::Loop { body, .. } => exprs(body, out),
                    Stmt::Assign { value, .. } => expr(value, out),
                    Stmt::Store {
                        buf, index, value, ..
                    } => {
                        out.push((*buf, index));
                        expr(value, out);
                    }
                    Stmt::ConvTile {
                        x,
                        w,
                        out: o,
                        next,
                        bias,
                        residual,
                        ..
                    } => {
                        for p in [Some(x), Some(w), Some(o), next.as_ref()]
                            .into_iter()
                            .flatten()
                            .chain(bias)
                            .chain(residual)
                        {
                            out.push((p.buf, &p.index));
                        }
                    }
                    Stmt::DepthwiseRow { x, w, out: o, .. } => {
                        for p in [x, w, o] {
                            out.push((p.buf, &p.index));
                        }
                    }
                    Stmt::BlockedDepthwiseRow {
                        x, w, bias, out: o, ..
                    } => {
                        for p in [x, w, o].into_iter().chain(bias) {
                            out.push((p.buf, &p.index));
                        }
                    }
                    Stmt::SoftmaxRow { x, out: o, .. } => {
                        for p in [x, o] {
                            out.push((p.buf, &p.index));
                        }
                    }
                    Stmt::ActivationRows { buf, bias, .. } => {
                        for p in std::iter::once(buf).chain(bias) {
                            out.push((p.buf, &p.index));
                        }
                    }
                    Stmt::StoreRows {
                        sums,
                        bias,
                        residual,
                        out: o,
                        ..
                    } => {
                        for p in [sums, o].into_iter().chain(bias).chain(residual) {
                            out.push((p.buf, &p.index));
                        }
                    }
                    Stmt::StorePlanes {
                        sums, bias, out: o, ..
                    } => {
                        for p in [sums, o].into_iter().chain(bias) {
                            out.push((p.buf, &p.index));
                        }
                    }
                    Stmt::WinogradOutputRow { m, out: o, .. } => {
                        for p in [m, o] {
                            out.push((p.buf, &p.index));
                        }
                    }
                    Stmt::WinogradInputRow { x, v, .. } => {
                        for p in [x, v] {
                            out.push((p.buf, &p.index));
                        }
                    }
                    Stmt::Prefetch { at, .. } => out.push((at.buf, &at.index)),
                }
            }
        }
        let mut addrs = Vec::new();
        exprs(body, &mut addrs);
        let depth = self.loops[var.0 as usize].depth;
        let mut keys = BTreeSet::new();
        for (buf, index) in addrs {
            let terms = self.varying_terms(index);
            if terms.iter().any(|&(v, _)| v == var.0) {
                let prefix: Vec<(u32, i64)> = terms
                    .into_iter()
                    .filter(|&(v, _)| self.loops[v as usize].depth <= depth)
                    .collect();
                keys.insert((self.slot(buf), prefix));
            }
        }
        keys
    }

    /// The current value of the pointer for `key` (the buffer base when it has no terms).
    fn pointer(&mut self, key: &PointerKey) -> ClifValue {
        if key.1.is_empty() {
            return self.bases[key.0];
        }
        match self.pointers.get(key) {
            Some(&v) => self.fb.use_var(v),
            // unreachable for checked kernels: every term's loop defines its prefix
            None => {
                let mut addr = self.bases[key.0];
                let size = self.elem_size(key.0);
                for &(v, c) in &key.1 {
                    let i = self.fb.use_var(self.loop_vars[v as usize]);
                    let scaled = self.mul_imm(i, c * size);
                    addr = self.add(addr, scaled);
                }
                addr
            }
        }
    }

    /// A test-at-top counted loop carrying its pointer induction variables; a loop of one
    /// trip is emitted straight-line. The parallel kernel's top-level loop runs trips
    /// `lo..hi` given by the caller.
    fn emit_loop(
        &mut self,
        var: LoopVar,
        (start, end, step): (i64, i64, i64),
        limit: Option<&LoopLimit>,
        body: &[Stmt],
    ) {
        let iv = self.loop_vars[var.0 as usize];
        match trip_count(start, end, step) {
            0 => {}
            1 => {
                // a limited single iteration runs when its row is below the extent (at
                // or past it)
                let skip = limit.map(|l| {
                    let rest = self.row_value(&l.row, var);
                    let row = self.add_imm(rest, own_coefficient(l, var) * start);
                    let extent = self.extent(l);
                    let cc = match l.from {
                        false => IntCC::SignedLessThan,
                        true => IntCC::SignedGreaterThanOrEqual,
                    };
                    let runs = self.fb.ins().icmp(cc, row, extent);
                    let (then, skip) = (self.fb.create_block(), self.fb.create_block());
                    self.fb.ins().brif(runs, then, &[], skip, &[]);
                    self.fb.switch_to_block(then);
                    self.fb.seal_block(then);
                    skip
                });
                self.known[var.0 as usize] = Some(start);
                self.block(body);
                self.known[var.0 as usize] = None;
                if let Some(skip) = skip {
                    self.fb.ins().jump(skip, &[]);
                    self.fb.switch_to_block(skip);
                    self.fb.seal_block(skip);
                }
            }
            _ => {
                let (first, bound) = match self.range.take() {
                    Some((lo, hi)) => {
                        let first = self.mul_imm(lo, step);
                        let first = self.add_imm(first, start);
                        let bound = self.mul_imm(hi, step);
                        let bound = self.add_imm(bound, start);
                        (first, Some(bound))
                    }
                    None => (self.fb.ins().iconst(types::I64, start), None),
                };
                let (first, bound) = match limit {
                    Some(l) if !l.from => {
                        // never past the constant bound the checker proved
                        let below = self.limit_row(l, var, start, end);
                        let bound = match bound {
                            Some(b) => b,
                            None => self.fb.ins().iconst(types::I64, end),
                        };
                        (first, Some(self.fb.ins().smin(bound, below)))
                    }
                    Some(l) => {
                        let past = self.limit_first(l, var, (start, end, step));
                        (self.fb.ins().smax(first, past), bound)
                    }
                    None => (first, bound),
                };
                // pointers: parent + coefficient·first, bumped by coefficient·step
                let keys = self.loop_pointers(var, body);
                let mut carried = Vec::with_capacity(keys.len());
                for key in keys {
                    let Some(&(_, c)) = key.1.iter().find(|&&(v, _)| v == var.0) else {
                        continue;
                    };
                    let parent: PointerKey = (
                        key.0,
                        key.1.iter().copied().filter(|&(v, _)| v != var.0).collect(),
                    );
                    let base = self.pointer(&parent);
                    let size = self.elem_size(key.0);
                    let off = self.mul_imm(first, c * size);
                    let init = self.add(base, off);
                    let pv = self.fb.declare_var(types::I64);
                    self.fb.def_var(pv, init);
                    self.pointers.insert(key, pv);
                    carried.push((pv, c * step * size));
                }
                self.fb.def_var(iv, first);
                let header = self.fb.create_block();
                let body_block = self.fb.create_block();
                let exit = self.fb.create_block();
                self.fb.ins().jump(header, &[]);
                self.fb.switch_to_block(header);
                let i = self.fb.use_var(iv);
                let more = match bound {
                    Some(b) => self.fb.ins().icmp(IntCC::SignedLessThan, i, b),
                    None => self.fb.ins().icmp_imm_s(IntCC::SignedLessThan, i, end),
                };
                self.fb.ins().brif(more, body_block, &[], exit, &[]);
                self.fb.switch_to_block(body_block);
                self.fb.seal_block(body_block);
                self.block(body);
                for &(pv, bump) in &carried {
                    let p = self.fb.use_var(pv);
                    let next = self.fb.ins().iadd_imm_s(p, bump);
                    self.fb.def_var(pv, next);
                }
                let i = self.fb.use_var(iv);
                let next = self.fb.ins().iadd_imm_s(i, step);
                self.fb.def_var(iv, next);
                self.fb.ins().jump(header, &[]);
                self.fb.seal_block(header);
                self.fb.switch_to_block(exit);
                self.fb.seal_block(exit);
            }
        }
    }

    /// The extent a loop limit reads (its argument's first `i64`).
    fn extent(&mut self, limit: &LoopLimit) -> ClifValue {
        let base = self.bases[self.slot(limit.extent)];
        self.fb
            .ins()
            .load(types::I64, MemFlagsData::new().with_notrap(), base, 0)
    }

    /// The first value of a limited loop's variable whose row is at or past the extent
    /// (`ceil((extent − rest) / scale)`, `rest` the row's other terms and `scale` the
    /// variable's coefficient; at least `start`: the checker proved the scale not
    /// negative and the start not either); with scale 0, `start` when the row is at or
    /// past the extent, else `end`.
    fn limit_row(&mut self, limit: &LoopLimit, var: LoopVar, start: i64, end: i64) -> ClifValue {
        let extent = self.extent(limit);
        let rest = self.row_value(&limit.row, var);
        let scale = own_coefficient(limit, var);
        let i64c = |fb: &mut FunctionBuilder, v: i64| fb.ins().iconst(types::I64, v);
        if scale == 0 {
            let below = self.fb.ins().icmp(IntCC::SignedLessThan, rest, extent);
            let (end, start) = (i64c(&mut self.fb, end), i64c(&mut self.fb, start));
            return self.fb.ins().select(below, end, start);
        }
        // rows from iteration 0's row to the extent, as a count of iterations, rounded up
        let rows = self.fb.ins().isub(extent, rest);
        let zero = i64c(&mut self.fb, 0);
        let rows = self.fb.ins().smax(rows, zero);
        let rows = self.fb.ins().iadd_imm_s(rows, scale - 1);
        let past = self.fb.ins().udiv_imm_u(rows, scale);
        let start = i64c(&mut self.fb, start);
        self.fb.ins().smax(past, start)
    }

    /// A limit's row without the loop's own term (`var`'s): the constant and the
    /// enclosing loops' terms, at their current values.
    fn row_value(&mut self, row: &Affine, var: LoopVar) -> ClifValue {
        let mut offset = row.offset;
        let mut sum = None;
        for &(v, c) in &row.terms {
            if v == var {
                continue;
            }
            if let Some(k) = self.known[v.0 as usize] {
                offset += c * k;
                continue;
            }
            let x = self.fb.use_var(self.loop_vars[v.0 as usize]);
            let term = self.mul_imm(x, c);
            sum = Some(match sum {
                Some(s) => self.fb.ins().iadd(s, term),
                None => term,
            });
        }
        match sum {
            Some(s) => self.add_imm(s, offset),
            None => self.fb.ins().iconst(types::I64, offset),
        }
    }

    /// The first iteration of a loop limited to the rows at or past the extent: the
    /// first row's variable rounded up to the loop's steps from `start`.
    fn limit_first(
        &mut self,
        limit: &LoopLimit,
        var: LoopVar,
        (start, end, step): (i64, i64, i64),
    ) -> ClifValue {
        let past = self.limit_row(limit, var, start, end);
        if step == 1 {
            return past;
        }
        let from_start = self.fb.ins().iadd_imm_s(past, step - 1 - start);
        let steps = self.fb.ins().udiv_imm_u(from_start, step);
        let back = self.fb.ins().imul_imm_s(steps, step);
        self.fb.ins().iadd_imm_s(back, start)
    }

    /// The pointer of the address's varying terms, and the constant part (including
    /// single-trip loop variables) as a byte offset.
    fn address(&mut self, buf: usize, index: &Affine) -> (ClifValue, i32) {
        let mut offset = index.offset;
        for &(v, c) in &index.terms {
            if let Some(k) = self.known[v.0 as usize] {
                offset += c * k;
            }
        }
        let key = (buf, self.varying_terms(index));
        let addr = self.pointer(&key);
        let bytes = offset * self.elem_size(buf);
        match i32::try_from(bytes) {
            Ok(off) => (addr, off),
            Err(_) => {
                let k = self.fb.ins().iconst(types::I64, bytes);
                (self.fb.ins().iadd(addr, k), 0)
            }
        }
    }

    /// `x`'s value when an `iconst` defines it.
    fn known_int(&self, x: ClifValue) -> Option<i64> {
        let ValueDef::Result(inst, 0) = self.fb.func.dfg.value_def(x) else {
            return None;
        };
        match self.fb.func.dfg.insts[inst] {
            InstructionData::UnaryImm {
                opcode: Opcode::Iconst,
                imm,
            } => Some(imm.bits()),
            _ => None,
        }
    }

    /// `x · c` for an `i64` `x`, folded where `x` is a constant or `c` is 0 or 1: the
    /// address arithmetic of a loop's start and its pointers' first values is mostly
    /// such terms (`0 · stride`, `i · 1`), which a kernel that only calls routines —
    /// compiled without the optimizer — would otherwise keep. YOLO's CLIF: 12,845 →
    /// 11,161 lines, its code generation 1–8% shorter, its run bit-identical.
    fn mul_imm(&mut self, x: ClifValue, c: i64) -> ClifValue {
        match (self.known_int(x), c) {
            (_, 1) => x,
            (Some(k), _) if k.wrapping_mul(c) == k => x,
            (Some(k), _) => self.fb.ins().iconst(types::I64, k.wrapping_mul(c)),
            (None, 0) => self.fb.ins().iconst(types::I64, 0),
            (None, _) => self.fb.ins().imul_imm_s(x, c),
        }
    }

    /// `x + c` for an `i64` `x`, folded as [`Gen::mul_imm`].
    fn add_imm(&mut self, x: ClifValue, c: i64) -> ClifValue {
        match (self.known_int(x), c) {
            (_, 0) => x,
            (Some(k), _) => self.fb.ins().iconst(types::I64, k.wrapping_add(c)),
            (None, _) => self.fb.ins().iadd_imm_s(x, c),
        }
    }

    /// `a + b` for `i64` values, `a` itself where `b` is the constant 0.
    fn add(&mut self, a: ClifValue, b: ClifValue) -> ClifValue {
        match self.known_int(b) {
            Some(0) => a,
            _ => self.fb.ins().iadd(a, b),
        }
    }

    fn constant(&mut self, v: f32, ty: Type) -> ClifValue {
        let s = self.fb.ins().f32const(v);
        if ty == types::F32X4 {
            self.fb.ins().splat(types::F32X4, s)
        } else {
            s
        }
    }

    fn expr(&mut self, e: &Expr) -> ClifValue {
        match e {
            Expr::Var(v) => self.fb.use_var(self.vars[v.0 as usize]),
            Expr::Const(c, w) => self.constant(c.0, clif_type(*w)),
            Expr::Int(v, w) => {
                // Cranelift wants a narrow type's immediate as its bits (zero-extended)
                let ty = clif_type(*w);
                let bits = match ty.bits() {
                    b @ (8 | 16) => *v & ((1i64 << b) - 1),
                    _ => *v,
                };
                self.fb.ins().iconst(ty, bits)
            }
            Expr::LoadAt {
                buf,
                base,
                index,
                stride,
                bound,
                width,
            } => {
                let i = self.expr(index);
                // unsigned: a negative index is a huge one, so one test covers both ends
                let ok = self.fb.ins().icmp_imm_u(IntCC::UnsignedLessThan, i, *bound);
                self.check_or_fault(ok, Fault::IndexOutOfRange);
                let b = self.slot(*buf);
                let (addr, off) = self.address(b, base);
                let step = stride * self.elem_size(b);
                let scaled = self.fb.ins().imul_imm_s(i, step);
                let addr = self.fb.ins().iadd(addr, scaled);
                let flags = MemFlagsData::new().with_notrap();
                self.fb.ins().load(clif_type(*width), flags, addr, off)
            }
            Expr::Cast(to, x) => {
                let from = self.kernel_width(x);
                let v = self.expr(x);
                self.cast(v, from, *to)
            }
            Expr::Compare(cmp, a, b) => {
                let integer = self.kernel_width(a).is_integer();
                let a = self.expr(a);
                let b = self.expr(b);
                if integer {
                    self.fb.ins().icmp(int_cc(*cmp), a, b)
                } else {
                    self.fb.ins().fcmp(float_cc(*cmp), a, b)
                }
            }
            Expr::Load { buf, index, width } => {
                let b = self.slot(*buf);
                let access = match buf.local_index() {
                    Some(_) => Access::Write,
                    None => self.kernel.args[b].access,
                };
                let flags = match access {
                    Access::Read => MemFlagsData::new()
                        .with_notrap()
                        .with_readonly()
                        .with_can_move(),
                    Access::Write => MemFlagsData::new().with_notrap(),
                };
                let (addr, off) = self.address(b, index);
                self.fb.ins().load(clif_type(*width), flags, addr, off)
            }
            Expr::Splat(x) => {
                let s = self.expr(x);
                self.fb.ins().splat(types::F32X4, s)
            }
            Expr::Unary(op, x) => {
                let integer = self.kernel_width(x).is_integer();
                let x = self.expr(x);
                match (op, integer) {
                    (UnOp::Neg, true) => self.fb.ins().ineg(x),
                    (UnOp::Abs, true) => self.fb.ins().iabs(x),
                    (UnOp::Neg, false) => self.fb.ins().fneg(x),
                    (UnOp::Abs, false) => self.fb.ins().fabs(x),
                    (UnOp::Sqrt, _) => self.fb.ins().sqrt(x),
                    (UnOp::Exp, _) => self.exp(x),
                    (UnOp::Log, _) => self.log(x),
                    (UnOp::Floor, _) => self.fb.ins().floor(x),
                    (UnOp::Ceil, _) => self.fb.ins().ceil(x),
                    (UnOp::Nearest, _) => self.fb.ins().nearest(x),
                    (UnOp::Sin, _) => self.sin_or_cos(x, 0.0),
                    (UnOp::Cos, _) => self.sin_or_cos(x, 1.0),
                    (UnOp::Atan, _) => self.atan(x),
                }
            }
            Expr::Binary(op, a, b) => {
                let integer = self.kernel_width(a).is_integer();
                let a = self.expr(a);
                let b = self.expr(b);
                if integer {
                    self.integer_binary(*op, a, b)
                } else {
                    self.binary(*op, a, b)
                }
            }
            Expr::Fma(a, b, c) => {
                let a = self.expr(a);
                let b = self.expr(b);
                let c = self.expr(c);
                self.fma(a, b, c)
            }
            Expr::Select {
                cmp,
                a,
                b,
                if_true,
                if_false,
            } => {
                let integer = self.kernel_width(a).is_integer();
                let a = self.expr(a);
                let b = self.expr(b);
                let t = self.expr(if_true);
                let f = self.expr(if_false);
                if integer {
                    // integer comparisons choose between scalars (the checker's rule)
                    let mask = self.fb.ins().icmp(int_cc(*cmp), a, b);
                    self.fb.ins().select(mask, t, f)
                } else {
                    self.select(float_cc(*cmp), a, b, t, f)
                }
            }
            Expr::Lane(x, lane) => {
                let x = self.expr(x);
                self.fb.ins().extractlane(x, *lane)
            }
            Expr::Shuffle(a, b, m) => {
                let a = self.expr(a);
                let b = self.expr(b);
                self.shuffle(a, b, *m)
            }
            Expr::Reduce(op, x) => {
                let x = self.expr(x);
                let lanes: Vec<ClifValue> =
                    (0..4u8).map(|l| self.fb.ins().extractlane(x, l)).collect();
                let op = match op {
                    ReduceOp::Add => BinOp::Add,
                    ReduceOp::Max => BinOp::Max,
                };
                let lo = self.binary(op, lanes[0], lanes[1]);
                let hi = self.binary(op, lanes[2], lanes[3]);
                self.binary(op, lo, hi)
            }
        }
    }

    /// Lanes `m` of `a ++ b`. Cranelift shuffles bytes, so the lanes become byte masks;
    /// the x86 backend matches the transpose patterns to `punpck{l,h}{dq,qdq}` and
    /// `shufps`.
    fn shuffle(&mut self, a: ClifValue, b: ClifValue, m: [u8; 4]) -> ClifValue {
        let flags = MemFlagsData::new().with_endianness(Endianness::Little);
        let bytes: Vec<u8> = m
            .iter()
            .flat_map(|&lane| (0..4).map(move |k| lane * 4 + k))
            .collect();
        let mask = self.fb.func.dfg.immediates.push(ConstantData::from(bytes));
        let a = self.fb.ins().bitcast(types::I8X16, flags, a);
        let b = self.fb.ins().bitcast(types::I8X16, flags, b);
        let r = self.fb.ins().shuffle(a, b, mask);
        self.fb.ins().bitcast(types::F32X4, flags, r)
    }

    fn fma(&mut self, a: ClifValue, b: ClifValue, c: ClifValue) -> ClifValue {
        if self.fma {
            self.fb.ins().fma(a, b, c)
        } else {
            let p = self.fb.ins().fmul(a, b);
            self.fb.ins().fadd(p, c)
        }
    }

    /// `(a cc b) ? t : f`; vectors use the compare mask with `bitselect`, which the x86
    /// backend turns into `maxps`/`minps`/`blendvps`.
    fn select(
        &mut self,
        cc: FloatCC,
        a: ClifValue,
        b: ClifValue,
        t: ClifValue,
        f: ClifValue,
    ) -> ClifValue {
        let mask = self.fb.ins().fcmp(cc, a, b);
        if self.fb.func.dfg.value_type(t).is_vector() {
            let flags = MemFlagsData::new().with_endianness(Endianness::Little);
            let mask = self.fb.ins().bitcast(types::F32X4, flags, mask);
            self.fb.ins().bitselect(mask, t, f)
        } else {
            self.fb.ins().select(mask, t, f)
        }
    }

    fn binary(&mut self, op: BinOp, a: ClifValue, b: ClifValue) -> ClifValue {
        match op {
            BinOp::Add => self.fb.ins().fadd(a, b),
            BinOp::Sub => self.fb.ins().fsub(a, b),
            BinOp::Mul => self.fb.ins().fmul(a, b),
            BinOp::Div => self.fb.ins().fdiv(a, b),
            // C's fmod as `a - trunc(a / b) * b` (Cranelift has no float remainder)
            BinOp::Rem => {
                let quotient = self.fb.ins().fdiv(a, b);
                let whole = self.fb.ins().trunc(quotient);
                let product = self.fb.ins().fmul(whole, b);
                self.fb.ins().fsub(a, product)
            }
            // NaN propagates from either operand, as in the interpreter (numpy's maximum):
            // `a < b ? b : a` keeps a NaN `a` (the compare is false); a NaN `b` needs one
            // more select, skipped when `b` is a number constant (relu, clip bounds).
            BinOp::Max => {
                let r = self.select(FloatCC::LessThan, a, b, b, a);
                self.propagate_nan_of(b, r)
            }
            BinOp::Min => {
                let r = self.select(FloatCC::LessThan, b, a, b, a);
                self.propagate_nan_of(b, r)
            }
            // bitwise ops and shifts take integers only (the checker's rule)
            BinOp::And | BinOp::Or | BinOp::Xor | BinOp::Shl | BinOp::Shr => a,
        }
    }

    /// The width of `e` in this kernel.
    fn kernel_width(&self, e: &Expr) -> Width {
        e.width(&self.kernel.vars)
    }

    /// Integer (or, for the bitwise ops, `i1`) `a op b`, wrapping. Division truncates
    /// toward zero; by zero it ends the kernel with a fault, and `MIN / -1` wraps to
    /// `MIN` instead of trapping as the hardware would.
    fn integer_binary(&mut self, op: BinOp, a: ClifValue, b: ClifValue) -> ClifValue {
        match op {
            BinOp::Add => self.fb.ins().iadd(a, b),
            BinOp::Sub => self.fb.ins().isub(a, b),
            BinOp::Mul => self.fb.ins().imul(a, b),
            BinOp::Max => self.fb.ins().smax(a, b),
            BinOp::Min => self.fb.ins().smin(a, b),
            BinOp::And => self.fb.ins().band(a, b),
            BinOp::Or => self.fb.ins().bor(a, b),
            BinOp::Xor => self.fb.ins().bxor(a, b),
            // Cranelift takes the amount modulo the width, as the loop IR defines it
            BinOp::Shl => self.fb.ins().ishl(a, b),
            BinOp::Shr => self.fb.ins().sshr(a, b),
            BinOp::Div => {
                let nonzero = self.fb.ins().icmp_imm_s(IntCC::NotEqual, b, 0);
                self.check_or_fault(nonzero, Fault::DivisionByZero);
                let ty = self.fb.func.dfg.value_type(b);
                let minus_one = self.fb.ins().icmp_imm_s(IntCC::Equal, b, -1);
                let one = self.fb.ins().iconst(ty, 1);
                let divisor = self.fb.ins().select(minus_one, one, b);
                let quotient = self.fb.ins().sdiv(a, divisor);
                let negated = self.fb.ins().ineg(a);
                self.fb.ins().select(minus_one, negated, quotient)
            }
            // the remainder by -1 is 0, computed as by 1 so `MIN rem -1` cannot trap
            BinOp::Rem => {
                let nonzero = self.fb.ins().icmp_imm_s(IntCC::NotEqual, b, 0);
                self.check_or_fault(nonzero, Fault::DivisionByZero);
                let ty = self.fb.func.dfg.value_type(b);
                let minus_one = self.fb.ins().icmp_imm_s(IntCC::Equal, b, -1);
                let one = self.fb.ins().iconst(ty, 1);
                let divisor = self.fb.ins().select(minus_one, one, b);
                self.fb.ins().srem(a, divisor)
            }
        }
    }

    /// `v` of width `from` converted to `to` by the rules of [`Expr::Cast`].
    fn cast(&mut self, v: ClifValue, from: Width, to: Width) -> ClifValue {
        let ty = clif_type(to);
        match (from, to) {
            _ if from == to => v,
            // the 2-byte floats convert through f32, which holds each of them exactly
            (Width::F16 | Width::BF16, _) => {
                let wide = self.widen_narrow_float(v, from);
                self.cast(wide, Width::Scalar, to)
            }
            (_, Width::F16 | Width::BF16) => {
                let wide = self.cast(v, from, Width::Scalar);
                self.narrow_float(wide, to)
            }
            // narrow integers widen exactly to i32 (by their signedness) and go on from it
            (Width::I8 | Width::I16, _) => {
                let wide = self.fb.ins().sextend(types::I32, v);
                self.cast(wide, Width::I32, to)
            }
            (Width::U8 | Width::U16, _) => {
                let wide = self.fb.ins().uextend(types::I32, v);
                self.cast(wide, Width::I32, to)
            }
            // float to a narrow integer saturates at its bounds, as to i32 (NaN is 0)
            (Width::Scalar, Width::I8 | Width::U8 | Width::I16 | Width::U16) => {
                let wide = self.fb.ins().fcvt_to_sint_sat(types::I32, v);
                let (lo, hi) = match to {
                    Width::I8 => (i8::MIN.into(), i8::MAX.into()),
                    Width::U8 => (0, u8::MAX.into()),
                    Width::I16 => (i16::MIN.into(), i16::MAX.into()),
                    _ => (0, i64::from(u16::MAX)),
                };
                let lo = self.fb.ins().iconst(types::I32, lo);
                let hi = self.fb.ins().iconst(types::I32, hi);
                let clamped = self.fb.ins().smax(wide, lo);
                let clamped = self.fb.ins().smin(clamped, hi);
                self.fb.ins().ireduce(ty, clamped)
            }
            // integer to a narrow integer keeps the low bits (wraps); i1 is 0 or 1
            (Width::I64 | Width::I32, Width::I8 | Width::U8 | Width::I16 | Width::U16) => {
                self.fb.ins().ireduce(ty, v)
            }
            (Width::Bool, Width::I8 | Width::U8) => v,
            (Width::Bool, Width::I16 | Width::U16) => self.fb.ins().uextend(ty, v),
            (Width::Scalar, Width::I64 | Width::I32) => self.fb.ins().fcvt_to_sint_sat(ty, v),
            (Width::Scalar, Width::Bool) => {
                let zero = self.fb.ins().f32const(0.0);
                self.fb.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
            (Width::Bool, Width::Scalar) => {
                let wide = self.fb.ins().uextend(types::I32, v);
                self.fb.ins().fcvt_from_sint(types::F32, wide)
            }
            (Width::I64 | Width::I32, Width::Scalar) => self.fb.ins().fcvt_from_sint(ty, v),
            (Width::I64, Width::I32) => self.fb.ins().ireduce(ty, v),
            (Width::I32, Width::I64) => self.fb.ins().sextend(ty, v),
            (Width::Bool, Width::I64 | Width::I32) => self.fb.ins().uextend(ty, v),
            (Width::I64 | Width::I32, Width::Bool) => {
                self.fb.ins().icmp_imm_s(IntCC::NotEqual, v, 0)
            }
            // vectors are never cast (the checker's rule)
            _ => v,
        }
    }

    /// The `f32` value of the `f16` or `bf16` bits `v` (an `i16`), exactly: the steps of
    /// `smelt_ir::half::f16_to_f32` and `bf16_to_f32` in integer instructions.
    fn widen_narrow_float(&mut self, v: ClifValue, from: Width) -> ClifValue {
        let h = self.fb.ins().uextend(types::I32, v);
        if from == Width::BF16 {
            let bits = self.fb.ins().ishl_imm_u(h, 16);
            return self.fb.ins().bitcast(types::F32, MemFlagsData::new(), bits);
        }
        let magnitude = self.fb.ins().band_imm_u(h, 0x7fff);
        let sign = self.fb.ins().band_imm_u(h, 0x8000);
        let sign = self.fb.ins().ishl_imm_u(sign, 16);
        let shifted = self.fb.ins().ishl_imm_u(magnitude, 13);
        // finite: the shifted fields times 2^112 rebias the exponent, subnormals too
        let as_f32 = self
            .fb
            .ins()
            .bitcast(types::F32, MemFlagsData::new(), shifted);
        let scale = self.fb.ins().f32const(f32::from_bits(0x7780_0000));
        let finite = self.fb.ins().fmul(as_f32, scale);
        let finite = self
            .fb
            .ins()
            .bitcast(types::I32, MemFlagsData::new(), finite);
        // infinity and NaN keep their payload under f32's all-ones exponent
        let special = self.fb.ins().bor_imm_u(shifted, 0x7f80_0000);
        let is_special =
            self.fb
                .ins()
                .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, magnitude, 0x7c00);
        let bits = self.fb.ins().select(is_special, special, finite);
        let bits = self.fb.ins().bor(bits, sign);
        self.fb.ins().bitcast(types::F32, MemFlagsData::new(), bits)
    }

    /// The `f16` or `bf16` bits (an `i16`) nearest to the `f32` `v`, ties to even: the
    /// steps of `smelt_ir::half::f32_to_f16` and `f32_to_bf16` in integer instructions,
    /// every case computed and the right one selected (no branches in the loop body).
    fn narrow_float(&mut self, v: ClifValue, to: Width) -> ClifValue {
        let bits = self.fb.ins().bitcast(types::I32, MemFlagsData::new(), v);
        let a = self.fb.ins().band_imm_u(bits, 0x7fff_ffff);
        let is_nan = self
            .fb
            .ins()
            .icmp_imm_u(IntCC::UnsignedGreaterThan, a, 0x7f80_0000);
        let high = self.fb.ins().ushr_imm_u(bits, 16);
        if to == Width::BF16 {
            let quiet = self.fb.ins().bor_imm_u(high, 0x40);
            let odd = self.fb.ins().band_imm_u(high, 1);
            let rounded = self.fb.ins().iadd_imm_s(bits, 0x7fff);
            let rounded = self.fb.ins().iadd(rounded, odd);
            let rounded = self.fb.ins().ushr_imm_u(rounded, 16);
            let r = self.fb.ins().select(is_nan, quiet, rounded);
            return self.fb.ins().ireduce(types::I16, r);
        }
        let sign = self.fb.ins().band_imm_u(high, 0x8000);
        // NaN: the top payload bits, quiet
        let payload = self.fb.ins().ushr_imm_u(a, 13);
        let payload = self.fb.ins().band_imm_u(payload, 0x3ff);
        let nan = self.fb.ins().bor_imm_u(payload, 0x7e00);
        // normal: rebias (127 - 15 = 112) and round the 13 dropped bits to even
        let odd = self.fb.ins().ushr_imm_u(a, 13);
        let odd = self.fb.ins().band_imm_u(odd, 1);
        let normal = self.fb.ins().iadd_imm_s(a, 0xfff - (112 << 23));
        let normal = self.fb.ins().iadd(normal, odd);
        let normal = self.fb.ins().ushr_imm_u(normal, 13);
        // below 2^-14: the addition of 0.5 rounds at f16's subnormal ulp
        let magnitude_f = self.fb.ins().bitcast(types::F32, MemFlagsData::new(), a);
        let half = self.fb.ins().f32const(0.5);
        let sub = self.fb.ins().fadd(magnitude_f, half);
        let sub = self.fb.ins().bitcast(types::I32, MemFlagsData::new(), sub);
        let sub = self.fb.ins().iadd_imm_s(sub, -0x3f00_0000);
        let is_sub = self
            .fb
            .ins()
            .icmp_imm_u(IntCC::UnsignedLessThan, a, 0x3880_0000);
        let finite = self.fb.ins().select(is_sub, sub, normal);
        // 65520 and above round to infinity
        let inf = self.fb.ins().iconst(types::I32, 0x7c00);
        let is_inf = self
            .fb
            .ins()
            .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, a, 0x477f_f000);
        let finite = self.fb.ins().select(is_inf, inf, finite);
        let magnitude = self.fb.ins().select(is_nan, nan, finite);
        let r = self.fb.ins().bor(magnitude, sign);
        self.fb.ins().ireduce(types::I16, r)
    }

    /// `b` if it is NaN, else `r`; nothing to emit when `b` is a constant number.
    fn propagate_nan_of(&mut self, b: ClifValue, r: ClifValue) -> ClifValue {
        if self.is_number_constant(b) {
            r
        } else {
            self.select(FloatCC::Unordered, b, b, b, r)
        }
    }

    /// Whether `v` is an `f32const` that is not NaN, or a splat of one.
    fn is_number_constant(&self, v: ClifValue) -> bool {
        let dfg = &self.fb.func.dfg;
        let Some(inst) = dfg.value_def(v).inst() else {
            return false;
        };
        match dfg.insts[inst] {
            InstructionData::UnaryIeee32 {
                opcode: Opcode::F32const,
                imm,
            } => !f32::from_bits(imm.bits()).is_nan(),
            InstructionData::Unary {
                opcode: Opcode::Splat,
                arg,
            } => self.is_number_constant(arg),
            _ => false,
        }
    }
}
