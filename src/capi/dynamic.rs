//! The C API of models with dynamic sizes (a batch, a sequence length, image sizes): one
//! handle compiled per bucket or per set of sizes on first use
//! ([`crate::DynamicExecutable`]), runs whose buffers carry their shapes.
//!
//! The flow a C host follows: describe the inputs it holds (`SmeltTensor`: element type
//! and shape), ask `smelt_dynamic_describe_outputs` for the outputs' element types and
//! shapes at those sizes, allocate each output (`smelt_shape_element_count` elements),
//! then `smelt_dynamic_run`. The library never allocates a caller's buffer; the
//! describe call compiles the buckets the batch needs, so the run that follows compiles
//! nothing. The same invariants as the parent module hold: handles are tokens, every
//! pointer is checked for null and alignment, every buffer's length against its shape.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CString};

use smelt_ir::DType;

use super::{
    borrow_checked, c_path, c_string, check_buffer, check_ptr, guard, invalid, prepare_out,
    read_options, write_count, Checked, Expected, Failure, Registry, SmeltElementType,
    SmeltOptions, SmeltStatus,
};
use crate::dynamic::{DynamicDim, SharedModule, Specialization};
use crate::{DynamicExecutable, DynamicOptions, RunPlan};

/// The most dimensions a `SmeltShape` holds.
pub const SMELT_MAX_RANK: usize = 8;

/// A dimension that varies per run (the batch), as `smelt_dynamic_input` reports it.
pub const SMELT_DYNAMIC_DIM: usize = !0;

/// A tensor's shape: `rank` dims, outermost first, in `dims[0..rank]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmeltShape {
    /// Number of dimensions, at most `SMELT_MAX_RANK`.
    pub rank: usize,
    /// The dims; entries past `rank` are ignored.
    pub dims: [usize; SMELT_MAX_RANK],
}

/// A row-major tensor of a dynamic run: its elements at `data` (read for inputs, written
/// for outputs), their type and the shape, whose product is the element count.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SmeltTensor {
    /// The elements, aligned to the element size (NULL only for a tensor with none).
    pub data: *mut c_void,
    /// A raw `SmeltElementType` value (checked, so any integer is safe to pass).
    pub element_type: i32,
    /// The shape.
    pub shape: SmeltShape,
}

/// An input of a dynamic executable as the model declares it. The name belongs to the
/// executable and stays valid until it is destroyed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SmeltDynamicInputInfo {
    /// The input's name (NUL-terminated).
    pub name: *const c_char,
    /// Its element type.
    pub element_type: SmeltElementType,
    /// Its shape: `SMELT_DYNAMIC_DIM` where the batch or the sequence length goes.
    pub shape: SmeltShape,
}

/// How a dynamic executable specializes (Rust's `DynamicOptions`): fill one with
/// `smelt_dynamic_options_default()` and change what differs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmeltDynamicOptions {
    /// The largest batch compiled as one executable (buckets) or run as one run of
    /// copies of batch 1, a power of two from 2 to 1024 (default 8).
    pub max_bucket: usize,
    /// Non-zero (default): every batch runs as copies of the batch-1 executable (each
    /// kernel touching the batch once per element) where the model computes each element
    /// on its own, one compile for every batch size; zero: a bucket per power of two.
    pub batch_copies: i32,
    /// The cache in bytes a run's memory should fit (runs are chunked to it); 0
    /// (default): the CPU's last-level cache.
    pub cache_bytes: u64,
    /// For a model with a sequence length: the longest length a run may have (default
    /// 512).
    pub max_sequence: usize,
    /// For a model with image sizes: how many image buckets, and apart how many sets of
    /// exact sizes, keep their executables (default 8 each, at most 256).
    pub max_shapes: usize,
    /// For a model with image sizes: non-zero (default) pads each size to an image
    /// bucket, one compile per bucket; zero compiles each set of sizes exactly.
    pub image_buckets: i32,
}

impl SmeltDynamicOptions {
    /// The Rust options these say.
    fn options(&self) -> DynamicOptions {
        DynamicOptions {
            max_bucket: self.max_bucket,
            batch_copies: self.batch_copies != 0,
            cache_bytes: (self.cache_bytes > 0).then_some(self.cache_bytes),
            max_sequence: self.max_sequence,
            max_shapes: self.max_shapes,
            image_buckets: self.image_buckets != 0,
        }
    }
}

/// The default dynamic options (those `smelt_dynamic_from_file` uses with a
/// `max_bucket` of 0).
#[no_mangle]
pub extern "C" fn smelt_dynamic_options_default() -> SmeltDynamicOptions {
    let d = DynamicOptions::default();
    SmeltDynamicOptions {
        max_bucket: d.max_bucket,
        batch_copies: d.batch_copies.into(),
        cache_bytes: d.cache_bytes.unwrap_or(0),
        max_sequence: d.max_sequence,
        max_shapes: d.max_shapes,
        image_buckets: d.image_buckets.into(),
    }
}

/// A model with a dynamic batch, compiled at batch 1 on first use: a batch of any size
/// runs as copies of it (each kernel once per element) where the model computes each
/// element on its own, else per bucket (a power of two up to its `max_bucket`), split
/// into bucket-sized chunks. Safe to share across threads. Opaque: create it with `smelt_dynamic_from_file`, free it
/// with `smelt_dynamic_destroy`.
pub struct SmeltDynamicExecutable {
    exe: DynamicExecutable,
    input_names: Vec<CString>,
    output_names: Vec<CString>,
}

/// Live dynamic executables by token.
static LIVE_DYNAMIC: Registry<SmeltDynamicExecutable> = Registry::new();

fn lookup(
    handle: *const SmeltDynamicExecutable,
) -> Result<std::sync::Arc<SmeltDynamicExecutable>, Failure> {
    LIVE_DYNAMIC.get(handle, "dynamic executable")
}

impl SmeltShape {
    /// The dims of a checked shape.
    fn dims(&self, what: &str) -> Result<&[usize], Failure> {
        self.dims.get(..self.rank).ok_or_else(|| {
            invalid(format!(
                "{what}: rank {} is over SMELT_MAX_RANK ({SMELT_MAX_RANK})",
                self.rank
            ))
        })
    }

    fn of(dims: &[usize], what: &str) -> Result<SmeltShape, Failure> {
        let mut shape = SmeltShape {
            rank: dims.len(),
            dims: [0; SMELT_MAX_RANK],
        };
        shape
            .dims
            .get_mut(..dims.len())
            .ok_or_else(|| {
                invalid(format!(
                    "{what} has rank {}, over SMELT_MAX_RANK ({SMELT_MAX_RANK})",
                    dims.len()
                ))
            })?
            .copy_from_slice(dims);
        Ok(shape)
    }
}

/// Reads `count` elements of a caller's array (none when `count` is 0).
///
/// # Safety
/// A non-null, aligned `list` is readable for `count` elements.
unsafe fn read_array<'a, T>(list: *const T, count: usize, what: &str) -> Result<&'a [T], Failure> {
    if count == 0 {
        return Ok(&[]);
    }
    check_ptr(list, what)?;
    // SAFETY: non-null and aligned (checked), readable for `count` elements (contract).
    Ok(unsafe { std::slice::from_raw_parts(list, count) })
}

/// Compiles nothing yet: reads the ONNX model at `path` (NUL-terminated) and prepares
/// runs of any batch. Every input's dynamic leading dimension is the shared batch; any
/// other dynamic dimension must be pinned whole through `opts->input_shapes` (that input
/// is then not batched). Batch 1 is compiled first; where the model computes each
/// element of the batch on its own (proved from the model), every batch runs as copies
/// of that one executable, so nothing else is ever compiled. Otherwise `max_bucket` is
/// the largest batch compiled as one executable, a power of two from 2 to 1024, or 0 for
/// the default (8): at most `log2(max_bucket) + 1` specializations are ever compiled. A
/// batch runs in chunks no larger than the largest bucket whose run-time memory fits the
/// CPU's last-level cache (estimated from bucket 1). Stores the handle in `*out` (NULL on
/// failure).
///
/// # Safety
/// `path` is a NUL-terminated string; `opts` is NULL or a valid `SmeltOptions`; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_from_file(
    path: *const c_char,
    opts: *const SmeltOptions,
    max_bucket: usize,
    out: *mut *mut SmeltDynamicExecutable,
) -> SmeltStatus {
    let dynamic = match max_bucket {
        0 => DynamicOptions::default(),
        b => DynamicOptions {
            max_bucket: b,
            ..DynamicOptions::default()
        },
    };
    // SAFETY: forwarded contracts of this function.
    guard(|| unsafe { open_dynamic(path, opts, dynamic, out) })
}

/// `smelt_dynamic_from_file` with every dynamic option (`dynamic`: NULL for the
/// defaults of `smelt_dynamic_options_default()`). Options out of range (a `max_bucket`
/// that is no power of two from 2 to 1024, more than 256 shapes) are
/// `SMELT_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `path` is a NUL-terminated string; `opts` is NULL or a valid `SmeltOptions`;
/// `dynamic` is NULL or a valid `SmeltDynamicOptions`; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_from_file_with(
    path: *const c_char,
    opts: *const SmeltOptions,
    dynamic: *const SmeltDynamicOptions,
    out: *mut *mut SmeltDynamicExecutable,
) -> SmeltStatus {
    guard(|| {
        // SAFETY: forwarded contracts of this function.
        unsafe {
            prepare_out(out)?;
            let dynamic = match dynamic.is_null() {
                true => DynamicOptions::default(),
                false => {
                    check_ptr(dynamic, "dynamic options")?;
                    dynamic.read().options()
                }
            };
            open_dynamic(path, opts, dynamic, out)
        }
    })
}

/// Opens the model at `path` as a dynamic executable with `dynamic`, its handle in
/// `*out`.
///
/// # Safety
/// As `smelt_dynamic_from_file_with`'s `path`, `opts` and `out`.
unsafe fn open_dynamic(
    path: *const c_char,
    opts: *const SmeltOptions,
    dynamic: DynamicOptions,
    out: *mut *mut SmeltDynamicExecutable,
) -> Result<(), Failure> {
    // SAFETY: forwarded contracts of this function.
    unsafe {
        prepare_out(out)?;
        let path = c_path(path)?;
        let opts = read_options(opts)?;
        let mut driver = opts.driver()?;
        driver.load.input_shapes = opts.input_shapes.clone();
        let exe = DynamicExecutable::new(path, &driver, dynamic)?;
        let value = SmeltDynamicExecutable {
            input_names: exe.inputs().iter().map(|i| c_string(&i.name)).collect(),
            output_names: exe.output_names().iter().map(|n| c_string(n)).collect(),
            exe,
        };
        out.write(LIVE_DYNAMIC.insert(value));
        Ok(())
    }
}

/// Frees a dynamic executable and every bucket compiled for it. NULL is a no-op; runs in
/// progress finish first; the handle is invalid afterwards, forever.
#[no_mangle]
pub extern "C" fn smelt_dynamic_destroy(exe: *mut SmeltDynamicExecutable) -> SmeltStatus {
    guard(|| LIVE_DYNAMIC.remove(exe, "dynamic executable"))
}

/// Stores the number of inputs in `*count`.
///
/// # Safety
/// `count` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_input_count(
    exe: *const SmeltDynamicExecutable,
    count: *mut usize,
) -> SmeltStatus {
    // SAFETY: forwarded contract of this function.
    guard(|| unsafe { write_count(lookup(exe)?.input_names.len(), count) })
}

/// Stores the number of outputs in `*count`.
///
/// # Safety
/// `count` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_output_count(
    exe: *const SmeltDynamicExecutable,
    count: *mut usize,
) -> SmeltStatus {
    // SAFETY: forwarded contract of this function.
    guard(|| unsafe { write_count(lookup(exe)?.output_names.len(), count) })
}

/// Describes input `index` in `*info`: its name, element type and shape, the batch
/// and the sequence length written `SMELT_DYNAMIC_DIM`.
///
/// # Safety
/// `info` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_input(
    exe: *const SmeltDynamicExecutable,
    index: usize,
    info: *mut SmeltDynamicInputInfo,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        check_ptr(info.cast_const(), "`info`")?;
        let input = h.exe.inputs().get(index).ok_or_else(|| {
            invalid(format!(
                "input index {index} is out of range: the executable has {} inputs",
                h.input_names.len()
            ))
        })?;
        let dims: Vec<usize> = input
            .dims
            .iter()
            .map(|d| match *d {
                DynamicDim::Fixed(n) => n,
                DynamicDim::Batch | DynamicDim::Sequence | DynamicDim::Symbol(_) => {
                    SMELT_DYNAMIC_DIM
                }
            })
            .collect();
        let value = SmeltDynamicInputInfo {
            name: h.input_names[index].as_ptr(),
            element_type: SmeltElementType::of(input.dtype),
            shape: SmeltShape::of(&dims, &format!("input {}", input.name))?,
        };
        // SAFETY: checked non-null and aligned; writable per the contract.
        unsafe { info.write(value) };
        Ok(())
    })
}

/// Stores the name of output `index` in `*name` (owned by the executable, valid until
/// it is destroyed).
///
/// # Safety
/// `name` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_output_name(
    exe: *const SmeltDynamicExecutable,
    index: usize,
    name: *mut *const c_char,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        check_ptr(name.cast_const(), "`name`")?;
        let n = h.output_names.get(index).ok_or_else(|| {
            invalid(format!(
                "output index {index} is out of range: the executable has {} outputs",
                h.output_names.len()
            ))
        })?;
        // SAFETY: checked non-null and aligned; writable per the contract.
        unsafe { name.write(n.as_ptr()) };
        Ok(())
    })
}

/// The input shapes of `inputs` (their data and element types are not read here).
fn input_shapes<'a>(
    inputs: &'a [SmeltTensor],
    h: &SmeltDynamicExecutable,
) -> Result<Vec<&'a [usize]>, Failure> {
    if inputs.len() != h.input_names.len() {
        return Err(invalid(format!(
            "expected {} inputs, got num_inputs = {}",
            h.input_names.len(),
            inputs.len()
        )));
    }
    inputs
        .iter()
        .zip(&h.input_names)
        .enumerate()
        .map(|(i, (t, name))| {
            t.shape
                .dims(&format!("input {i} ({})", name.to_string_lossy()))
        })
        .collect()
}

/// The plan of a run on `inputs` (its output types among it).
fn plan(
    h: &SmeltDynamicExecutable,
    inputs: &[SmeltTensor],
    num_outputs: usize,
) -> Result<RunPlan, Failure> {
    if num_outputs != h.output_names.len() {
        return Err(invalid(format!(
            "expected {} outputs, got num_outputs = {num_outputs}",
            h.output_names.len()
        )));
    }
    Ok(h.exe.plan(&input_shapes(inputs, h)?)?)
}

/// Fills the `element_type` and `shape` of each of the `num_outputs` entries of
/// `outputs` (their `data` is set to NULL) for a run on the `num_inputs` tensors of
/// `inputs`, whose shapes are checked here (their data is not read). Compiles the buckets
/// that batch needs, so the following `smelt_dynamic_run` compiles nothing. A shape that
/// breaks the model's declared dims is `SMELT_STATUS_INVALID_ARGUMENT`, naming the input
/// and the dimension.
///
/// # Safety
/// `inputs` holds `num_inputs` readable elements; `outputs` holds `num_outputs` writable
/// ones.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_describe_outputs(
    exe: *const SmeltDynamicExecutable,
    inputs: *const SmeltTensor,
    num_inputs: usize,
    outputs: *mut SmeltTensor,
    num_outputs: usize,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        // SAFETY: the arrays hold the counts given (contract).
        let ins = unsafe { read_array(inputs, num_inputs, "`inputs`")? };
        let plan = plan(&h, ins, num_outputs)?;
        let types = plan.output_types();
        if num_outputs > 0 {
            check_ptr(outputs.cast_const(), "`outputs`")?;
        }
        for (i, (ty, name)) in types.iter().zip(&h.output_names).enumerate() {
            let what = format!("output {i} ({})", name.to_string_lossy());
            let value = SmeltTensor {
                data: std::ptr::null_mut(),
                element_type: SmeltElementType::of(ty.dtype) as i32,
                shape: SmeltShape::of(&ty.dims, &what)?,
            };
            // SAFETY: non-null and aligned (checked), writable for `num_outputs`
            // elements (contract), and `i < num_outputs` (the counts were checked).
            unsafe { outputs.add(i).write(value) };
        }
        Ok(())
    })
}

/// Runs on tensors of any batch: `inputs` holds `num_inputs` tensors, each with its
/// shape (the batched ones sharing one leading size), and `outputs` `num_outputs`
/// tensors whose element types and shapes are those `smelt_dynamic_describe_outputs`
/// gives for these inputs (checked; a mismatch is `SMELT_STATUS_INVALID_ARGUMENT`).
/// Output buffers must not overlap any other buffer. The first run of a batch compiles
/// the buckets it needs (call `smelt_dynamic_describe_outputs` or
/// `smelt_dynamic_warm_up` first to keep that out of a timed run). Safe to call from
/// many threads at once on the same executable.
///
/// # Safety
/// `inputs` holds `num_inputs` elements and `outputs` `num_outputs`; each tensor's
/// `data` is readable (inputs) or writable (outputs) for the element count of its shape
/// and not modified by another thread during the call.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_run(
    exe: *const SmeltDynamicExecutable,
    inputs: *const SmeltTensor,
    num_inputs: usize,
    outputs: *const SmeltTensor,
    num_outputs: usize,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        // SAFETY: the arrays hold the counts given (contract).
        let (ins, outs) = unsafe {
            (
                read_array(inputs, num_inputs, "`inputs`")?,
                read_array(outputs, num_outputs, "`outputs`")?,
            )
        };
        let plan = plan(&h, ins, num_outputs)?;
        let types = plan.output_types();
        let shapes = input_shapes(ins, &h)?;
        let checked = |list: &[SmeltTensor],
                       want: &mut dyn Iterator<Item = (DType, usize)>,
                       names: &[CString],
                       kind: &str|
         -> Result<Vec<Checked>, Failure> {
            list.iter()
                .zip(want)
                .zip(names)
                .enumerate()
                .map(|(i, ((t, (dtype, len)), name))| {
                    let name = name.to_string_lossy();
                    let given = SmeltElementType::from_raw(t.element_type).ok_or_else(|| {
                        invalid(format!(
                            "{kind} {i} ({name}): element_type {} is not a SmeltElementType",
                            t.element_type
                        ))
                    })?;
                    let count = t
                        .shape
                        .dims(kind)?
                        .iter()
                        .try_fold(1usize, |a, &d| a.checked_mul(d))
                        .ok_or_else(|| invalid(format!("{kind} {i} ({name}): shape overflows")))?;
                    let want = Expected {
                        name: &name,
                        dtype,
                        len,
                    };
                    check_buffer(t.data.cast_const(), count, given, i, &want, kind)
                })
                .collect()
        };
        let in_want = shapes
            .iter()
            .zip(h.exe.inputs())
            .map(|(s, info)| (info.dtype, s.iter().product()));
        let ins_checked = checked(ins, &mut in_want.into_iter(), &h.input_names, "input")?;
        for (i, (t, ty)) in outs.iter().zip(types).enumerate() {
            if t.shape.dims("output")? != &ty.dims[..] {
                return Err(invalid(format!(
                    "output {i} ({}) must have shape {:?} for these inputs, got {:?}",
                    h.output_names[i].to_string_lossy(),
                    ty.dims,
                    t.shape.dims("output")?
                )));
            }
        }
        let out_want = types.iter().map(|t| (t.dtype, t.storage_len()));
        let outs_checked = checked(outs, &mut out_want.into_iter(), &h.output_names, "output")?;
        let name = |list: &[CString], i: usize| list[i].to_string_lossy().into_owned();
        // SAFETY: each buffer is readable or writable for the element count of its
        // shape (this function's contract), checked against the run's tensors.
        let (elements, mut results) = unsafe {
            borrow_checked(
                &ins_checked,
                &outs_checked,
                |i| name(&h.input_names, i),
                |i| name(&h.output_names, i),
            )?
        };
        h.exe.run_planned(&plan, &shapes, &elements, &mut results)?;
        Ok(())
    })
}

/// Compiles every bucket a run of `batch` elements needs, so that such runs compile
/// nothing; for a model with a sequence length, the buckets of the shortest lengths
/// (`smelt_dynamic_warm_up_sequence` names a length).
#[no_mangle]
pub extern "C" fn smelt_dynamic_warm_up(
    exe: *const SmeltDynamicExecutable,
    batch: usize,
) -> SmeltStatus {
    guard(|| Ok(lookup(exe)?.exe.warm_up(batch, 1)?))
}

/// Compiles every bucket a run of `batch` elements of sequence length `length` needs,
/// so that such runs compile nothing (`length` is ignored by a model without a
/// sequence length).
#[no_mangle]
pub extern "C" fn smelt_dynamic_warm_up_sequence(
    exe: *const SmeltDynamicExecutable,
    batch: usize,
    length: usize,
) -> SmeltStatus {
    guard(|| Ok(lookup(exe)?.exe.warm_up(batch, length)?))
}

/// Stores the number of specializations (buckets) compiled so far in `*count`.
///
/// # Safety
/// `count` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_specialization_count(
    exe: *const SmeltDynamicExecutable,
    count: *mut usize,
) -> SmeltStatus {
    // SAFETY: forwarded contract of this function.
    guard(|| unsafe { write_count(lookup(exe)?.exe.specializations().len(), count) })
}

/// Describes specialization `index` (in ascending batch order): the batch it was
/// compiled for in `*batch` and the milliseconds its compile took in `*compile_ms`.
///
/// # Safety
/// `batch` and `compile_ms` are writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_specialization(
    exe: *const SmeltDynamicExecutable,
    index: usize,
    batch: *mut usize,
    compile_ms: *mut f64,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        check_ptr(batch.cast_const(), "`batch`")?;
        check_ptr(compile_ms.cast_const(), "`compile_ms`")?;
        let s = specialization(&h.exe, index)?;
        // SAFETY: both checked non-null and aligned; writable per the contract.
        unsafe {
            batch.write(s.batch);
            compile_ms.write(s.compile_ms);
        }
        Ok(())
    })
}

/// Says where the buckets' modules come from, in `*state`: 0 when nothing has been
/// compiled yet; 1 when the model was imported with its dynamic sizes as symbols and
/// optimized once, every bucket then specializing that module (`*ms`: the milliseconds
/// that took); 2 when the model could not stay symbolic (a constant its import folds from
/// a size, such as a BERT's position ids) and each bucket imports and optimizes it at its
/// own sizes (`*ms`: the milliseconds trying took). `*ms` is 0 in state 0.
///
/// # Safety
/// `state` and `ms` are writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_shared_module(
    exe: *const SmeltDynamicExecutable,
    state: *mut i32,
    ms: *mut f64,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        check_ptr(state.cast_const(), "`state`")?;
        check_ptr(ms.cast_const(), "`ms`")?;
        let (code, took) = match h.exe.shared_module() {
            SharedModule::Pending => (0, 0.0),
            SharedModule::Symbolic { ms } => (1, ms),
            SharedModule::PerBucket { ms, .. } => (2, ms),
        };
        // SAFETY: both checked non-null and aligned; writable per the contract.
        unsafe {
            state.write(code);
            ms.write(took);
        }
        Ok(())
    })
}

/// Says how specialization `index` (as `smelt_dynamic_specialization` numbers them) runs
/// a sequence shorter than its length bucket, in `*state`: 1 when its products stop at
/// each run's length (the rows past it cleared, not computed); 2 when it computes every
/// padded row (the analysis of its optimized model refused; `smelt_last_error` is not
/// set, the reason is in the Rust API's `Specialization::valid_rows`); 0 for a
/// specialization that is not a length bucket serving shorter lengths.
///
/// # Safety
/// `state` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_specialization_valid_rows(
    exe: *const SmeltDynamicExecutable,
    index: usize,
    state: *mut i32,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        check_ptr(state.cast_const(), "`state`")?;
        let code = match specialization(&h.exe, index)?.valid_rows {
            None => 0,
            Some(Ok(())) => 1,
            Some(Err(_)) => 2,
        };
        // SAFETY: checked non-null and aligned; writable per the contract.
        unsafe { state.write(code) };
        Ok(())
    })
}

/// Specialization `index` of `exe`, as [`DynamicExecutable::specializations`] lists them.
fn specialization(exe: &DynamicExecutable, index: usize) -> Result<Specialization, Failure> {
    let mut all = exe.specializations();
    if index >= all.len() {
        return Err(invalid(format!(
            "specialization index {index} is out of range: {} are compiled",
            all.len()
        )));
    }
    Ok(all.swap_remove(index))
}

/// Writes the sizes besides the batch that specialization `index` (as
/// `smelt_dynamic_specialization` numbers them) was compiled for into `*sizes`: for a model
/// with image sizes (two or more symbols off the leading axis, or a sequence length the
/// padding proof refused), the symbols' values in the order the model's inputs first
/// name them, one dim each; for a sequence length bucket, its length (rank 1); rank 0
/// for a model whose only dynamic size is its batch.
///
/// # Safety
/// `sizes` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_dynamic_specialization_sizes(
    exe: *const SmeltDynamicExecutable,
    index: usize,
    sizes: *mut SmeltShape,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        check_ptr(sizes.cast_const(), "`sizes`")?;
        let s = specialization(&h.exe, index)?;
        let values: Vec<usize> = match s.length {
            Some(length) => vec![length],
            None => s.symbols,
        };
        let shape = SmeltShape::of(&values, "the model's symbols")?;
        // SAFETY: checked non-null and aligned; writable per the contract.
        unsafe { sizes.write(shape) };
        Ok(())
    })
}

/// The element count of `shape` (the product of its `rank` dims; 1 for rank 0), or 0
/// when `shape` is NULL, its rank is over `SMELT_MAX_RANK` or the product overflows.
///
/// # Safety
/// `shape` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn smelt_shape_element_count(shape: *const SmeltShape) -> usize {
    if shape.is_null() || !shape.is_aligned() {
        return 0;
    }
    // SAFETY: non-null and aligned; readable per the contract; every bit pattern of
    // its integers is a valid value.
    let s = unsafe { *shape };
    s.dims
        .get(..s.rank)
        .and_then(|d| d.iter().try_fold(1usize, |a, &x| a.checked_mul(x)))
        .unwrap_or(0)
}
