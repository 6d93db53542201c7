//! The C embedding API: opaque executable handles, status codes, a thread-local error message.
//!
//! Every exported function catches panics (none crosses the boundary: a caught panic is
//! [`SmeltStatus::Internal`]), checks every pointer for null and alignment and every
//! length against the executable's declared sizes before touching memory, and reports
//! failures as a [`SmeltStatus`] — one code per [`crate::Error`] variant — plus a message
//! read with [`smelt_last_error`].
//!
//! Handles are never dereferenced: a handle is a token, a key into a registry of live
//! executables, so a null, destroyed or made-up handle is an error, not undefined
//! behaviour. Tokens are never reused within a process (a counter, scrambled by a
//! bijection keyed per process, so a made-up value is live only by a 1 in 2^64 chance):
//! a stale handle stays an error forever, even after later executables were created. The registry holds each executable behind an `Arc`; a run clones it, so
//! destroying a handle while another thread runs it frees the executable only after
//! that run returns. Executables are shared by any number of threads; each concurrent
//! run takes scratch memory from the handle's pool of workspaces.
//!
//! The header `include/smelt.h` is generated from this file by cbindgen (configuration
//! in `tests/capi.rs`, which fails when the committed header is stale).
//!
//! # Safety
//!
//! This is the C boundary, so it dereferences pointers the caller passes. The
//! invariant: a pointer is read or written only after it was checked for null and for
//! the alignment of its element type, and only for the element count the caller passed
//! with it, which was checked against the executable's declared size first; the header
//! documents what the caller vouches for (that such a pointer is valid for that many
//! elements for the duration of the call, and that written buffers alias nothing else).
//! No pointer is kept past the call that received it. Handles are keys, never
//! dereferenced, and no panic unwinds into C.
//!
//! One file on purpose (it is over the project's usual 1,000 lines): it is one concern,
//! the C boundary, and its `unsafe` blocks all rest on the invariant above. Kept together,
//! the safety argument is read in one place and cbindgen reads the whole API from one file.

#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use smelt_ir::{DType, Module};

use crate::runtime::{Elements, ElementsMut, Executable, TensorInfo, Workspace};
use crate::{CompileOptions, Error, Kernels};

mod dynamic;
pub use dynamic::*;

/// Result of every smelt C function: `SMELT_STATUS_OK` or the kind of failure, one code per
/// variant of the Rust `smelt::Error`. Details are in `smelt_last_error()`.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmeltStatus {
    /// Success.
    Ok = 0,
    /// Malformed or ill-typed IR text (diagnostics with line and column in the message).
    Ir = 1,
    /// A file could not be read.
    Io = 2,
    /// A bad argument: null or misaligned pointer, unknown handle, wrong count or length.
    InvalidArgument = 3,
    /// A malformed ONNX model, or one using what smelt does not support.
    Onnx = 4,
    /// An optimization pass failed.
    Pass = 5,
    /// The host, an op or an option is not supported.
    Unsupported = 6,
    /// A bug in smelt (a caught panic); the message says where.
    Internal = 7,
}

/// The element type of a tensor (`SmeltTensorInfo.element_type`, `SmeltBuffer.element_type`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmeltElementType {
    /// 32-bit IEEE float (`float`).
    F32 = 0,
    /// 64-bit signed integer (`int64_t`).
    I64 = 1,
    /// 32-bit signed integer (`int32_t`).
    I32 = 2,
    /// A boolean stored as one byte holding 0 or 1 (`bool` / `uint8_t`).
    Bool = 3,
    /// IEEE-754 half precision, as its bits (`uint16_t`, or `_Float16`).
    F16 = 4,
    /// bfloat16 (the upper half of a `float`), as its bits (`uint16_t`).
    BF16 = 5,
    /// A signed 8-bit integer (`int8_t`).
    I8 = 6,
    /// An unsigned 8-bit integer (`uint8_t`).
    U8 = 7,
    /// A signed 16-bit integer (`int16_t`).
    I16 = 8,
    /// An unsigned 16-bit integer (`uint16_t`).
    U16 = 9,
}

impl SmeltElementType {
    fn of(dtype: DType) -> SmeltElementType {
        match dtype {
            DType::F32 => SmeltElementType::F32,
            DType::I64 => SmeltElementType::I64,
            DType::I32 => SmeltElementType::I32,
            DType::Bool => SmeltElementType::Bool,
            DType::F16 => SmeltElementType::F16,
            DType::BF16 => SmeltElementType::BF16,
            DType::I8 => SmeltElementType::I8,
            DType::U8 => SmeltElementType::U8,
            DType::I16 => SmeltElementType::I16,
            DType::U16 => SmeltElementType::U16,
        }
    }

    /// The element type a C value names, if it names one.
    fn from_raw(raw: i32) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|&d| SmeltElementType::of(d) as i32 == raw)
    }
}

/// One tensor buffer of a typed run (`smelt_executable_run_typed`): `element_count`
/// elements of `element_type` at `data` (read for inputs, written for outputs).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SmeltBuffer {
    /// The elements (aligned to the element size).
    pub data: *mut c_void,
    /// Number of elements: the tensor's `element_count`.
    pub element_count: usize,
    /// What the caller holds: must be the tensor's `element_type` (a raw `SmeltElementType`
    /// value, so any integer a C caller passes is checked rather than undefined).
    pub element_type: i32,
}

/// The status code of a library error (one code per variant).
pub fn status_of(e: &Error) -> SmeltStatus {
    match e {
        Error::Ir(_) => SmeltStatus::Ir,
        Error::Io { .. } => SmeltStatus::Io,
        Error::InvalidArgument(_) => SmeltStatus::InvalidArgument,
        Error::Onnx(_) => SmeltStatus::Onnx,
        Error::Pass(_) => SmeltStatus::Pass,
        Error::Unsupported(_) => SmeltStatus::Unsupported,
    }
}

/// How to build an executable. Get the defaults from `smelt_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SmeltOptions {
    /// Non-zero: apply the fusion rewrites (default). Zero: every op runs as its own kernel.
    pub fuse: i32,
    /// Threads each run may use, the calling thread included (0: one per core). Results
    /// are bit-identical for every count. More than the machine's cores count as one per
    /// core: the process has one pool of a worker per core but one, shared by every
    /// executable, and when two executables run at once, a kernel that finds the pool
    /// busy runs on its calling thread alone. Above 1024 (`MAX_THREADS`) creating the
    /// executable fails with `SMELT_STATUS_INVALID_ARGUMENT`.
    pub threads: u32,
    /// Shapes pinning an ONNX model's dynamic input dimensions (`-1`, a `dim_param` or an
    /// unset dimension) or binding a `.tir` model's symbolic sizes (`tensor<Nx3xHxWxf32>`),
    /// as a NUL-terminated string `"NAME=1x3x224x224;OTHER=1x16"`, or NULL for none. Each
    /// input at most once; a pin must agree with the model's static dimensions and name
    /// one of its inputs; inputs sharing a symbol must agree on it.
    pub input_shapes: *const c_char,
    /// The code of conv tiles: 0 the widest micro-kernel the CPU runs (default), 1
    /// Cranelift code only (portable), 2 the AVX2 micro-kernel, 3 the AVX-512 one (2 and
    /// 3 fail with `SMELT_STATUS_UNSUPPORTED` on a CPU without them).
    pub kernels: i32,
    /// One more folder, as a NUL-terminated path, the files a model names (`.tir`
    /// `external<...>` sidecars, ONNX external data) may be read from, besides the model
    /// file's own folder (after resolving symlinks); NULL (default): only that folder.
    pub allowed_root: *const c_char,
    /// The memory budget in bytes for weights, folded constants and the run-time arena;
    /// 0 (default): half the machine's memory, and half of the address-space limit if
    /// one is set. A model over it fails with a message naming what and how much.
    pub memory_budget: u64,
}

/// The default options: fusion on, default threads, no pinned shapes.
#[no_mangle]
pub extern "C" fn smelt_options_default() -> SmeltOptions {
    SmeltOptions {
        fuse: 1,
        threads: 0,
        input_shapes: std::ptr::null(),
        kernels: 0,
        allowed_root: std::ptr::null(),
        memory_budget: 0,
    }
}

/// An executable: compiled code for one model function, safe to run from many threads at
/// once. Opaque: create it with `smelt_executable_from_*`, free it with
/// `smelt_executable_destroy`.
pub struct SmeltExecutable {
    exe: Executable,
    inputs: Vec<InfoStrings>,
    outputs: Vec<InfoStrings>,
    /// Idle workspaces; a run pops one (or makes one) and pushes it back.
    pool: Mutex<Vec<Workspace>>,
}

/// C-side copies of a tensor's name, dims and layout, owned by the handle.
struct InfoStrings {
    name: CString,
    dims: Vec<usize>,
    len: usize,
    layout: CString,
    dtype: DType,
}

impl InfoStrings {
    fn new(info: &TensorInfo) -> InfoStrings {
        let layout = info
            .ty
            .layout
            .name(info.ty.dims.len())
            .unwrap_or_else(|| "row_major".to_string());
        InfoStrings {
            name: c_string(&info.name),
            dims: info.ty.dims.clone(),
            len: info.len(),
            layout: c_string(&layout),
            dtype: info.ty.dtype,
        }
    }
}

/// Name, shape and buffer length of an input or output. The pointers belong to the
/// executable and stay valid until it is destroyed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SmeltTensorInfo {
    /// The parameter or result name (NUL-terminated).
    pub name: *const c_char,
    /// Number of dimensions.
    pub rank: usize,
    /// `rank` dimensions, outermost first (NULL when `rank` is 0).
    pub dims: *const usize,
    /// Number of elements (of `element_type`) a buffer for this tensor holds: the
    /// product of the dims for `row_major` tensors; blocked layouts pad the blocked axis.
    pub element_count: usize,
    /// Storage order: `"row_major"`, or a blocked layout such as `"nchw8c"`.
    pub layout: *const c_char,
    /// The element type of every element.
    pub element_type: SmeltElementType,
}

/// Live handles of one kind by token. Handles are looked up here, never dereferenced.
struct Registry<T>(RwLock<BTreeMap<usize, Arc<T>>>);

impl<T> Registry<T> {
    const fn new() -> Registry<T> {
        Registry(RwLock::new(BTreeMap::new()))
    }

    /// Registers `value` under a new token and returns the handle C code gets.
    fn insert<H>(&self, value: T) -> *mut H {
        let token = new_token();
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token, Arc::new(value));
        // a token, not an address: C code only passes it back
        std::ptr::without_provenance_mut::<H>(token)
    }

    /// The value of a live handle; `what` names the handle's kind in the error.
    fn get<H>(&self, handle: *const H, what: &str) -> Result<Arc<T>, Failure> {
        if handle.is_null() {
            return Err(invalid(format!("the {what} handle is NULL")));
        }
        let live = self.0.read().unwrap_or_else(|p| p.into_inner());
        live.get(&handle.addr()).cloned().ok_or_else(|| {
            invalid(format!(
                "{handle:p} is not a live smelt {what} (destroyed, or never created)"
            ))
        })
    }

    /// Unregisters a handle (NULL is a no-op); the value is freed when its last run
    /// returns.
    fn remove<H>(&self, handle: *mut H, what: &str) -> Result<(), Failure> {
        if handle.is_null() {
            return Ok(());
        }
        let removed = self
            .0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle.addr());
        match removed {
            Some(value) => {
                drop(value);
                Ok(())
            }
            None => Err(invalid(format!(
                "{handle:p} is not a live smelt {what} (destroyed twice, or never created)"
            ))),
        }
    }
}

/// Live executables by token.
static LIVE: Registry<SmeltExecutable> = Registry::new();

/// Executables created so far in this process: the source of handle tokens.
static CREATED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A token no handle of this process has had: the creation count, mapped through a
/// bijection of `usize` (multiplication by an odd constant, then xor with a per-process
/// random key), so tokens never repeat and do not look like small integers or addresses.
fn new_token() -> usize {
    static KEY: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let key = *KEY.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish() as usize
    });
    loop {
        let n = CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // 0x9e37... is odd, so the product is a bijection modulo 2^bits
        let token = n.wrapping_mul(0x9e37_79b9_7f4a_7c15_u64 as usize) ^ key;
        if token != 0 {
            return token;
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure on its way to C: status and message.
struct Failure(SmeltStatus, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure(status_of(&e), e.to_string())
    }
}

fn invalid(msg: impl Into<String>) -> Failure {
    Failure(SmeltStatus::InvalidArgument, msg.into())
}

/// A C string from `s`; interior NUL bytes (impossible in names from valid models, possible
/// in messages quoting user input) become U+FFFD.
fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\u{fffd}")).unwrap_or_default()
}

fn set_last_error(msg: &str) {
    // `try_with`: during thread teardown the slot may be gone; never panic here (this
    // runs outside `catch_unwind`).
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut slot) = e.try_borrow_mut() {
            *slot = c_string(msg);
        }
    });
}

/// Runs `body`, converting its failure or panic into a status and the thread's message.
fn guard(body: impl FnOnce() -> Result<(), Failure>) -> SmeltStatus {
    let outcome = crate::quiet::quietly(|| catch_unwind(AssertUnwindSafe(body)));
    let (status, msg) = match outcome {
        Ok(Ok(())) => (SmeltStatus::Ok, String::new()),
        Ok(Err(Failure(status, msg))) => (status, msg),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            (
                SmeltStatus::Internal,
                format!("internal error in smelt (please report): {what}"),
            )
        }
    };
    set_last_error(&msg);
    status
}

fn lookup(handle: *const SmeltExecutable) -> Result<Arc<SmeltExecutable>, Failure> {
    LIVE.get(handle, "executable")
}

/// Reads the options (NULL means the defaults).
///
/// # Safety
/// `opts` is NULL or points to a readable `SmeltOptions`; its `input_shapes` and
/// `allowed_root` are each NULL or a NUL-terminated string.
unsafe fn read_options(opts: *const SmeltOptions) -> Result<Options, Failure> {
    let o = if opts.is_null() {
        smelt_options_default()
    } else {
        if !opts.is_aligned() {
            return Err(invalid("the options pointer is misaligned"));
        }
        // SAFETY: non-null and aligned; readable per this function's contract. Every
        // field accepts every bit pattern (integers and a raw pointer).
        unsafe { *opts }
    };
    let mut input_shapes = BTreeMap::new();
    if !o.input_shapes.is_null() {
        // SAFETY: a non-null `input_shapes` is NUL-terminated per the contract.
        let text = unsafe { CStr::from_ptr(o.input_shapes) };
        let text = text
            .to_str()
            .map_err(|_| invalid("input_shapes is not UTF-8"))?;
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, dims) = parse_shape(entry).ok_or_else(|| {
                invalid(format!(
                    "input_shapes entry '{entry}' must look like NAME=1x3x224x224 (positive dims)"
                ))
            })?;
            if input_shapes.contains_key(&name) {
                return Err(invalid(format!("input_shapes gives input '{name}' twice")));
            }
            input_shapes.insert(name, dims);
        }
    }
    let kernels = match o.kernels {
        0 => Kernels::Auto,
        1 => Kernels::Cranelift,
        2 => Kernels::Avx2,
        3 => Kernels::Avx512,
        k => {
            return Err(invalid(format!(
                "kernels = {k}: 0 (auto), 1 (cranelift), 2 (avx2) or 3 (avx512)"
            )))
        }
    };
    let allowed_root = if o.allowed_root.is_null() {
        None
    } else {
        // SAFETY: a non-null `allowed_root` is NUL-terminated per the contract.
        let text = unsafe { CStr::from_ptr(o.allowed_root) };
        let text = text
            .to_str()
            .map_err(|_| invalid("allowed_root is not UTF-8"))?;
        Some(PathBuf::from(text))
    };
    Ok(Options {
        fuse: o.fuse != 0,
        threads: o.threads,
        input_shapes,
        kernels,
        allowed_root,
        memory_budget: (o.memory_budget != 0).then_some(o.memory_budget),
    })
}

/// Parses `NAME=1x3x224x224`.
fn parse_shape(entry: &str) -> Option<(String, Vec<usize>)> {
    let (name, dims) = entry.split_once('=')?;
    let dims = dims
        .split('x')
        .map(|d| d.trim().parse::<usize>().ok().filter(|&d| d > 0))
        .collect::<Option<Vec<_>>>()?;
    Some((name.trim().to_string(), dims))
}

/// The options as Rust values.
struct Options {
    fuse: bool,
    threads: u32,
    input_shapes: BTreeMap<String, Vec<usize>>,
    kernels: Kernels,
    allowed_root: Option<PathBuf>,
    memory_budget: Option<u64>,
}

impl Options {
    fn parse_options(&self) -> smelt_ir::text::ParseOptions {
        smelt_ir::text::ParseOptions {
            allowed_root: self.allowed_root.clone(),
            memory_budget: self.memory_budget,
        }
    }

    /// The driver's options: fusion, threads and kernels, and the file limits (no pinned
    /// shapes: a caller that imports pins them itself).
    fn driver(&self) -> Result<crate::Options, Failure> {
        let mut driver = crate::Options::default();
        driver.optimize.fusion.enabled = self.fuse;
        driver.compile = CompileOptions {
            threads: usize::try_from(self.threads)
                .map_err(|_| invalid(format!("threads = {} is too many", self.threads)))?,
            kernels: self.kernels,
            ..CompileOptions::default()
        };
        driver.load.interface = crate::Interface::C;
        driver.load.allowed_root = self.allowed_root.clone();
        driver.load.memory_budget = self.memory_budget;
        Ok(driver)
    }
}

/// Optimizes and compiles `module`, registers the executable and stores its handle.
///
/// # Safety
/// `out` is non-null, aligned and writable (checked by the callers).
unsafe fn finish(
    module: Module,
    opts: &Options,
    out: *mut *mut SmeltExecutable,
) -> Result<(), Failure> {
    // the shapes were pinned as the model was read, so the driver gets none
    let (exe, _report) = crate::compile(&module, &opts.driver()?)?;
    let ptr = LIVE.insert(SmeltExecutable {
        inputs: exe.inputs().iter().map(InfoStrings::new).collect(),
        outputs: exe.outputs().map(InfoStrings::new).collect(),
        exe,
        pool: Mutex::new(Vec::new()),
    });
    // SAFETY: `out` is valid for a write per this function's contract.
    unsafe { out.write(ptr) };
    Ok(())
}

/// Checks the `out` pointer of a constructor and clears it, so a failed call leaves NULL.
///
/// # Safety
/// A non-null, aligned `out` points to writable memory for one pointer.
unsafe fn prepare_out<H>(out: *mut *mut H) -> Result<(), Failure> {
    if out.is_null() {
        return Err(invalid("the output handle pointer `out` is NULL"));
    }
    if !out.is_aligned() {
        return Err(invalid("the output handle pointer `out` is misaligned"));
    }
    // SAFETY: non-null and aligned; writable per the contract.
    unsafe { out.write(std::ptr::null_mut()) };
    Ok(())
}

/// A path argument: a non-null, non-empty, UTF-8, NUL-terminated string.
///
/// # Safety
/// A non-null `path` is NUL-terminated and lives for `'a`.
unsafe fn c_path<'a>(path: *const c_char) -> Result<&'a Path, Failure> {
    if path.is_null() {
        return Err(invalid("the path is NULL"));
    }
    // SAFETY: non-null and NUL-terminated per the contract.
    let path = unsafe { CStr::from_ptr(path) }
        .to_str()
        .map_err(|_| invalid("the path is not UTF-8"))?;
    if path.is_empty() {
        return Err(invalid("the path is empty"));
    }
    Ok(Path::new(path))
}

/// Checks `(ptr, len)` for a byte buffer and borrows it.
///
/// # Safety
/// A non-null `ptr` is readable for `len` bytes for the returned lifetime.
unsafe fn bytes<'a>(ptr: *const u8, len: usize, what: &str) -> Result<&'a [u8], Failure> {
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    if len == 0 {
        return Err(invalid(format!("{what} is empty (length 0)")));
    }
    if len > isize::MAX as usize {
        return Err(invalid(format!("{what}: length {len} is too large")));
    }
    // SAFETY: non-null, `len` in range, readable per the contract; u8 needs no alignment.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Compiles a model given as `.tir` text (`len` bytes of UTF-8, no NUL needed) and stores
/// the new executable in `*out` (NULL on failure). `opts` may be NULL (defaults).
///
/// # Safety
/// `text` is readable for `len` bytes; `opts` is NULL or a valid `SmeltOptions`; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_executable_from_text(
    text: *const c_char,
    len: usize,
    opts: *const SmeltOptions,
    out: *mut *mut SmeltExecutable,
) -> SmeltStatus {
    guard(|| {
        // SAFETY: forwarded contracts of this function.
        unsafe {
            prepare_out(out)?;
            let src = bytes(text as *const u8, len, "the model text")?;
            let opts = read_options(opts)?;
            let render = |d: smelt_ir::Diagnostics| {
                let rendered = d.render(std::str::from_utf8(src).ok());
                Failure(SmeltStatus::Ir, rendered.trim_end().to_string())
            };
            let module =
                smelt_ir::text::parse_bytes_with(src, "<text>", None, &opts.parse_options())
                    .map_err(render)?;
            // symbolic sizes are bound by the pinned shapes
            let module = match opts.input_shapes.is_empty() {
                true => module,
                false => {
                    smelt_ir::symbolic::specialize(&module, &opts.input_shapes).map_err(render)?
                }
            };
            finish(module, &opts, out)
        }
    })
}

/// Compiles a model given as ONNX bytes (`len` bytes of a serialized ModelProto) and
/// stores the new executable in `*out` (NULL on failure). `opts` may be NULL (defaults).
/// Bytes have no folder, so a model with external data fails here: use
/// `smelt_executable_from_file`.
///
/// # Safety
/// `data` is readable for `len` bytes; `opts` is NULL or a valid `SmeltOptions`; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_executable_from_onnx(
    data: *const u8,
    len: usize,
    opts: *const SmeltOptions,
    out: *mut *mut SmeltExecutable,
) -> SmeltStatus {
    guard(|| {
        // SAFETY: forwarded contracts of this function.
        unsafe {
            prepare_out(out)?;
            let model = bytes(data, len, "the ONNX model")?;
            let opts = read_options(opts)?;
            let module = import_onnx(model, &opts)?;
            finish(module, &opts, out)
        }
    })
}

#[cfg(feature = "onnx")]
fn import_onnx(model: &[u8], opts: &Options) -> Result<Module, Failure> {
    Ok(crate::onnx::import(model, &import_options(opts))?)
}

/// Compiles an ONNX file: its external data is read from the file's folder.
#[cfg(feature = "onnx")]
fn import_onnx_file(path: &Path, opts: &Options) -> Result<Module, Failure> {
    Ok(crate::onnx::import_file(path, &import_options(opts))?)
}

#[cfg(feature = "onnx")]
fn import_options(opts: &Options) -> crate::onnx::ImportOptions {
    crate::onnx::ImportOptions {
        input_shapes: opts.input_shapes.clone(),
        interface: crate::Interface::C,
        allowed_root: opts.allowed_root.clone(),
        memory_budget: opts.memory_budget,
        ..crate::onnx::ImportOptions::default()
    }
}

#[cfg(not(feature = "onnx"))]
fn import_onnx_file(_path: &Path, _opts: &Options) -> Result<Module, Failure> {
    Err(Failure(
        SmeltStatus::Unsupported,
        "smelt was built without the `onnx` feature".into(),
    ))
}

#[cfg(not(feature = "onnx"))]
fn import_onnx(_model: &[u8], _opts: &Options) -> Result<Module, Failure> {
    Err(Failure(
        SmeltStatus::Unsupported,
        "smelt was built without the `onnx` feature".into(),
    ))
}

/// Compiles the model file at `path` (NUL-terminated): `.onnx` (with its external data,
/// read from files inside the model's folder), otherwise `.tir` text with its weight
/// sidecars. Stores the new executable in `*out` (NULL on failure).
///
/// # Safety
/// `path` is a NUL-terminated string; `opts` is NULL or a valid `SmeltOptions`; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_executable_from_file(
    path: *const c_char,
    opts: *const SmeltOptions,
    out: *mut *mut SmeltExecutable,
) -> SmeltStatus {
    guard(|| {
        // SAFETY: forwarded contracts of this function.
        unsafe {
            prepare_out(out)?;
            let path = c_path(path)?;
            let opts = read_options(opts)?;
            let is_onnx = path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
            let module = if is_onnx {
                import_onnx_file(path, &opts)?
            } else {
                // a regular file of bounded size, like every file smelt reads
                let data = smelt_ir::files::read_regular(path, smelt_ir::text::MAX_TEXT_BYTES)
                    .map_err(|m| Error::Io {
                        path: path.display().to_string(),
                        source: std::io::Error::other(m),
                    })?;
                let name = path.display().to_string();
                let parse = opts.parse_options();
                let render = |d: smelt_ir::Diagnostics| {
                    let rendered = d.render(std::str::from_utf8(&data).ok());
                    Failure(SmeltStatus::Ir, rendered.trim_end().to_string())
                };
                let module = smelt_ir::text::parse_bytes_with(&data, &name, path.parent(), &parse)
                    .map_err(render)?;
                // symbolic sizes are bound by the pinned shapes
                match opts.input_shapes.is_empty() {
                    true => module,
                    false => smelt_ir::symbolic::specialize(&module, &opts.input_shapes)
                        .map_err(render)?,
                }
            };
            finish(module, &opts, out)
        }
    })
}

/// Frees an executable. NULL is a no-op. Runs in progress on other threads finish first
/// (the memory is released when the last one returns); the handle is invalid afterwards,
/// and using it again is an `SMELT_STATUS_INVALID_ARGUMENT` error, forever: handles are
/// tokens that no later executable of the process gets again.
///
/// # Safety
/// None beyond passing a handle value; it is never dereferenced.
#[no_mangle]
pub extern "C" fn smelt_executable_destroy(exe: *mut SmeltExecutable) -> SmeltStatus {
    guard(|| LIVE.remove(exe, "executable"))
}

/// Checks a pointer argument (an out-pointer, or an array's first element): non-null and
/// aligned for `T`.
fn check_ptr<T>(p: *const T, what: &str) -> Result<(), Failure> {
    if p.is_null() {
        Err(invalid(format!("{what} is NULL")))
    } else if !p.is_aligned() {
        Err(invalid(format!("{what} is misaligned")))
    } else {
        Ok(())
    }
}

/// Writes `n` to `*count`.
///
/// # Safety
/// A non-null, aligned `count` is writable.
unsafe fn write_count(n: usize, count: *mut usize) -> Result<(), Failure> {
    check_ptr(count.cast_const(), "`count`")?;
    // SAFETY: checked non-null and aligned; writable per the callers' contracts.
    unsafe { count.write(n) };
    Ok(())
}

/// Stores the number of inputs of `exe` in `*count`.
///
/// # Safety
/// `count` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_executable_input_count(
    exe: *const SmeltExecutable,
    count: *mut usize,
) -> SmeltStatus {
    // SAFETY: forwarded contract of this function.
    guard(|| unsafe { write_count(lookup(exe)?.inputs.len(), count) })
}

/// Stores the number of outputs of `exe` in `*count`.
///
/// # Safety
/// `count` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_executable_output_count(
    exe: *const SmeltExecutable,
    count: *mut usize,
) -> SmeltStatus {
    // SAFETY: forwarded contract of this function.
    guard(|| unsafe { write_count(lookup(exe)?.outputs.len(), count) })
}

/// Writes the description of `list[index]` to `info`.
///
/// # Safety
/// A non-null, aligned `info` is writable.
unsafe fn describe(
    list: &[InfoStrings],
    index: usize,
    kind: &str,
    info: *mut SmeltTensorInfo,
) -> Result<(), Failure> {
    check_ptr(info.cast_const(), "`info`")?;
    let t = list.get(index).ok_or_else(|| {
        invalid(format!(
            "{kind} index {index} is out of range: the executable has {} {kind}s",
            list.len()
        ))
    })?;
    let value = SmeltTensorInfo {
        name: t.name.as_ptr(),
        rank: t.dims.len(),
        dims: if t.dims.is_empty() {
            std::ptr::null()
        } else {
            t.dims.as_ptr()
        },
        element_count: t.len,
        layout: t.layout.as_ptr(),
        element_type: SmeltElementType::of(t.dtype),
    };
    // SAFETY: checked non-null and aligned; writable per the callers' contracts.
    unsafe { info.write(value) };
    Ok(())
}

/// Describes input `index` of `exe` in `*info`.
///
/// # Safety
/// `info` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_executable_input(
    exe: *const SmeltExecutable,
    index: usize,
    info: *mut SmeltTensorInfo,
) -> SmeltStatus {
    // SAFETY: forwarded contract of this function.
    guard(|| unsafe { describe(&lookup(exe)?.inputs, index, "input", info) })
}

/// Describes output `index` of `exe` in `*info`.
///
/// # Safety
/// `info` is writable.
#[no_mangle]
pub unsafe extern "C" fn smelt_executable_output(
    exe: *const SmeltExecutable,
    index: usize,
    info: *mut SmeltTensorInfo,
) -> SmeltStatus {
    // SAFETY: forwarded contract of this function.
    guard(|| unsafe { describe(&lookup(exe)?.outputs, index, "output", info) })
}

/// One caller buffer of a run, checked against its tensor: where it is, its byte
/// length, its element type.
#[derive(Clone, Copy)]
struct Checked {
    at: usize,
    bytes: usize,
    dtype: DType,
}

/// What a buffer of a run must hold: the tensor's name, element type and element count.
struct Expected<'a> {
    name: &'a str,
    dtype: DType,
    len: usize,
}

impl InfoStrings {
    fn expected(&self) -> Expected<'_> {
        Expected {
            name: self.name.to_str().unwrap_or("?"),
            dtype: self.dtype,
            len: self.len,
        }
    }
}

/// Checks buffer `i` of a run (`p`, `len` elements of `dtype`) against what its tensor
/// needs.
fn check_buffer(
    p: *const c_void,
    len: usize,
    dtype: DType,
    i: usize,
    want: &Expected<'_>,
    kind: &str,
) -> Result<Checked, Failure> {
    let name = want.name;
    if dtype != want.dtype {
        return Err(invalid(format!(
            "{kind} {i} ({name}) holds {} elements, the caller passed {dtype}",
            want.dtype
        )));
    }
    if len != want.len {
        return Err(invalid(format!(
            "{kind} {i} ({name}) needs {} {dtype} elements, got length {len}",
            want.len
        )));
    }
    let size = dtype.size_bytes();
    if p.is_null() {
        if len != 0 {
            return Err(invalid(format!("{kind} {i} ({name}) is NULL")));
        }
        // an empty tensor's buffer may be NULL: nothing is read or written through it,
        // and the slice made of it needs a non-null aligned address, which `size` is
        return Ok(Checked {
            at: size,
            bytes: 0,
            dtype,
        });
    }
    if !(p as usize).is_multiple_of(size) {
        return Err(invalid(format!(
            "{kind} {i} ({name}) is not aligned to {size} bytes"
        )));
    }
    if len > isize::MAX as usize / size {
        return Err(invalid(format!(
            "{kind} {i} ({name}): length {len} is too large"
        )));
    }
    Ok(Checked {
        at: p as usize,
        bytes: len * size,
        dtype,
    })
}

/// Runs the executable of `h` on checked buffers (see [`borrow_checked`]).
///
/// # Safety
/// Each input buffer is readable, and each output buffer writable, for its checked
/// length, and no other thread modifies them during the call.
unsafe fn run_checked(
    h: &SmeltExecutable,
    ins: &[Checked],
    outs: &[Checked],
) -> Result<(), Failure> {
    let name = |list: &[InfoStrings], i: usize| list[i].name.to_string_lossy().into_owned();
    // SAFETY: forwarded contract of this function.
    let (inputs, mut outputs) =
        unsafe { borrow_checked(ins, outs, |i| name(&h.inputs, i), |i| name(&h.outputs, i))? };
    let mut ws = h
        .pool
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop()
        .unwrap_or_else(|| h.exe.workspace());
    let result = h.exe.run_with(&inputs, &mut outputs, &mut ws);
    h.pool.lock().unwrap_or_else(|p| p.into_inner()).push(ws);
    result.map_err(Failure::from)
}

/// Borrows checked buffers as element slices: refuses a written buffer that overlaps
/// another and a bool input byte that is neither 0 nor 1 (`input_name` and
/// `output_name` name a buffer by its index in the messages).
///
/// # Safety
/// Each input buffer is readable, and each output buffer writable, for its checked
/// length, for as long as the returned slices live, and no other thread modifies them
/// meanwhile.
unsafe fn borrow_checked<'a>(
    ins: &[Checked],
    outs: &[Checked],
    input_name: impl Fn(usize) -> String,
    output_name: impl Fn(usize) -> String,
) -> Result<(Vec<Elements<'a>>, Vec<ElementsMut<'a>>), Failure> {
    // Rust forbids a written buffer aliasing any other borrowed buffer.
    let range = |c: &Checked| (c.at, c.at + c.bytes);
    for (i, a) in outs.iter().enumerate() {
        let (a0, a1) = range(a);
        let overlaps = |c: &Checked| {
            let (b0, b1) = range(c);
            a0 < b1 && b0 < a1 && a0 < a1 && b0 < b1
        };
        let other_out = outs.iter().enumerate().any(|(j, c)| j != i && overlaps(c));
        if other_out || ins.iter().any(overlaps) {
            return Err(invalid(format!(
                "output {i} ({}) overlaps another buffer",
                output_name(i)
            )));
        }
    }
    for (i, c) in ins.iter().enumerate() {
        if c.dtype == DType::Bool {
            // SAFETY: readable for its checked length (contract); bytes have no invalid
            // values, and this view ends before the `[bool]` one below is made.
            let bytes = unsafe { std::slice::from_raw_parts(c.at as *const u8, c.bytes) };
            if let Some(k) = bytes.iter().position(|&b| b > 1) {
                return Err(invalid(format!(
                    "input {i} ({}) is bool, but its element {k} is the byte {}",
                    input_name(i),
                    bytes[k]
                )));
            }
        }
    }
    let n = |c: &Checked| c.bytes / c.dtype.size_bytes();
    let inputs: Vec<Elements> = ins
        .iter()
        .map(|c| {
            // SAFETY: for each arm, non-null, aligned to the element size, readable for the
            // checked length per the contract, not written during the call (no output
            // overlaps it), and for bool holding only the bytes 0 and 1 (checked above).
            unsafe {
                match c.dtype {
                    DType::F32 => {
                        Elements::F32(std::slice::from_raw_parts(c.at as *const f32, n(c)))
                    }
                    DType::I64 => {
                        Elements::I64(std::slice::from_raw_parts(c.at as *const i64, n(c)))
                    }
                    DType::I32 => {
                        Elements::I32(std::slice::from_raw_parts(c.at as *const i32, n(c)))
                    }
                    DType::Bool => {
                        Elements::Bool(std::slice::from_raw_parts(c.at as *const bool, n(c)))
                    }
                    DType::F16 => {
                        Elements::F16(std::slice::from_raw_parts(c.at as *const u16, n(c)))
                    }
                    DType::BF16 => {
                        Elements::BF16(std::slice::from_raw_parts(c.at as *const u16, n(c)))
                    }
                    DType::I8 => Elements::I8(std::slice::from_raw_parts(c.at as *const i8, n(c))),
                    DType::U8 => Elements::U8(std::slice::from_raw_parts(c.at as *const u8, n(c))),
                    DType::I16 => {
                        Elements::I16(std::slice::from_raw_parts(c.at as *const i16, n(c)))
                    }
                    DType::U16 => {
                        Elements::U16(std::slice::from_raw_parts(c.at as *const u16, n(c)))
                    }
                }
            }
        })
        .collect();
    let outputs: Vec<ElementsMut> = outs
        .iter()
        .map(|c| {
            // SAFETY: for each arm, non-null, aligned, writable for the checked length per
            // the contract, overlapping no other buffer of this call (checked above). A
            // bool output's bytes may be anything before the run, so they are zeroed
            // (through the raw pointer) before the `[bool]` view is made.
            unsafe {
                match c.dtype {
                    DType::F32 => {
                        ElementsMut::F32(std::slice::from_raw_parts_mut(c.at as *mut f32, n(c)))
                    }
                    DType::I64 => {
                        ElementsMut::I64(std::slice::from_raw_parts_mut(c.at as *mut i64, n(c)))
                    }
                    DType::I32 => {
                        ElementsMut::I32(std::slice::from_raw_parts_mut(c.at as *mut i32, n(c)))
                    }
                    DType::Bool => {
                        std::ptr::write_bytes(c.at as *mut u8, 0, c.bytes);
                        ElementsMut::Bool(std::slice::from_raw_parts_mut(c.at as *mut bool, n(c)))
                    }
                    DType::F16 => {
                        ElementsMut::F16(std::slice::from_raw_parts_mut(c.at as *mut u16, n(c)))
                    }
                    DType::BF16 => {
                        ElementsMut::BF16(std::slice::from_raw_parts_mut(c.at as *mut u16, n(c)))
                    }
                    DType::I8 => {
                        ElementsMut::I8(std::slice::from_raw_parts_mut(c.at as *mut i8, n(c)))
                    }
                    DType::U8 => {
                        ElementsMut::U8(std::slice::from_raw_parts_mut(c.at as *mut u8, n(c)))
                    }
                    DType::I16 => {
                        ElementsMut::I16(std::slice::from_raw_parts_mut(c.at as *mut i16, n(c)))
                    }
                    DType::U16 => {
                        ElementsMut::U16(std::slice::from_raw_parts_mut(c.at as *mut u16, n(c)))
                    }
                }
            }
        })
        .collect();
    Ok((inputs, outputs))
}

/// Checks the buffer counts of a run against the executable of `h`.
fn check_counts(h: &SmeltExecutable, num_inputs: usize, num_outputs: usize) -> Result<(), Failure> {
    if num_inputs != h.inputs.len() {
        return Err(invalid(format!(
            "expected {} inputs, got num_inputs = {num_inputs}",
            h.inputs.len()
        )));
    }
    if num_outputs != h.outputs.len() {
        return Err(invalid(format!(
            "expected {} outputs, got num_outputs = {num_outputs}",
            h.outputs.len()
        )));
    }
    Ok(())
}

/// Runs `exe` on float tensors: `inputs[i]` points to `input_lens[i]` floats of input i,
/// `outputs[i]` to `output_lens[i]` writable floats for output i; each length must equal
/// that tensor's `element_count` and the counts must match. Every input and output must
/// be `SMELT_ELEMENT_TYPE_F32` (use `smelt_executable_run_typed` otherwise). Output
/// buffers must not overlap any other buffer; the buffer of a tensor with no elements
/// may be NULL. Safe to call from many threads at once on the same executable.
///
/// # Safety
/// `inputs`, `input_lens` hold `num_inputs` elements; `outputs`, `output_lens` hold
/// `num_outputs`; each buffer is readable (inputs) or writable (outputs) for its stated
/// length and not modified by another thread during the call.
#[no_mangle]
pub unsafe extern "C" fn smelt_executable_run(
    exe: *const SmeltExecutable,
    inputs: *const *const f32,
    input_lens: *const usize,
    num_inputs: usize,
    outputs: *const *mut f32,
    output_lens: *const usize,
    num_outputs: usize,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        check_counts(&h, num_inputs, num_outputs)?;
        if num_inputs > 0 {
            check_ptr(inputs, "`inputs`")?;
            check_ptr(input_lens, "`input_lens`")?;
        }
        if num_outputs > 0 {
            check_ptr(outputs, "`outputs`")?;
            check_ptr(output_lens, "`output_lens`")?;
        }
        let floats_only = |info: &InfoStrings, i: usize, kind: &str| {
            if info.dtype == DType::F32 {
                Ok(())
            } else {
                Err(invalid(format!(
                    "{kind} {i} ({}) is {}: run it with smelt_executable_run_typed",
                    info.name.to_string_lossy(),
                    info.dtype
                )))
            }
        };
        let mut ins = Vec::with_capacity(num_inputs);
        for (i, info) in h.inputs.iter().enumerate() {
            floats_only(info, i, "input")?;
            // SAFETY: the arrays hold `num_inputs` elements (contract), checked above.
            let (p, len) = unsafe { (*inputs.add(i), *input_lens.add(i)) };
            ins.push(check_buffer(
                p.cast(),
                len,
                DType::F32,
                i,
                &info.expected(),
                "input",
            )?);
        }
        let mut outs = Vec::with_capacity(num_outputs);
        for (i, info) in h.outputs.iter().enumerate() {
            floats_only(info, i, "output")?;
            // SAFETY: the arrays hold `num_outputs` elements (contract), checked above.
            let (p, len) = unsafe { (*outputs.add(i), *output_lens.add(i)) };
            outs.push(check_buffer(
                p.cast_const().cast(),
                len,
                DType::F32,
                i,
                &info.expected(),
                "output",
            )?);
        }
        // SAFETY: each buffer is readable or writable for its length (this function's
        // contract, lengths checked against the tensors).
        unsafe { run_checked(&h, &ins, &outs) }
    })
}

/// Runs `exe` on tensors of any element type: `inputs[i]` describes input i and
/// `outputs[i]` output i, each with the tensor's `element_count` and `element_type` (a
/// mismatch is `SMELT_STATUS_INVALID_ARGUMENT`, as is a bool input byte other than 0 or
/// 1, or an index out of range in the data, e.g. a gather's). Output buffers must not
/// overlap any other buffer; the buffer of a tensor with no elements may be NULL. Safe to
/// call from many threads at once on the same executable.
///
/// # Safety
/// `inputs` holds `num_inputs` elements and `outputs` `num_outputs`; each buffer is
/// readable (inputs) or writable (outputs) for its stated length and not modified by
/// another thread during the call.
#[no_mangle]
pub unsafe extern "C" fn smelt_executable_run_typed(
    exe: *const SmeltExecutable,
    inputs: *const SmeltBuffer,
    num_inputs: usize,
    outputs: *const SmeltBuffer,
    num_outputs: usize,
) -> SmeltStatus {
    guard(|| {
        let h = lookup(exe)?;
        check_counts(&h, num_inputs, num_outputs)?;
        if num_inputs > 0 {
            check_ptr(inputs, "`inputs`")?;
        }
        if num_outputs > 0 {
            check_ptr(outputs, "`outputs`")?;
        }
        let each = |list: *const SmeltBuffer, infos: &[InfoStrings], kind: &str| {
            let mut out = Vec::with_capacity(infos.len());
            for (i, info) in infos.iter().enumerate() {
                // SAFETY: the array holds one element per tensor (contract, counts checked).
                let b = unsafe { *list.add(i) };
                let dtype = SmeltElementType::from_raw(b.element_type).ok_or_else(|| {
                    invalid(format!(
                        "{kind} {i} ({}): element_type {} is not a SmeltElementType",
                        info.name.to_string_lossy(),
                        b.element_type
                    ))
                })?;
                out.push(check_buffer(
                    b.data.cast_const(),
                    b.element_count,
                    dtype,
                    i,
                    &info.expected(),
                    kind,
                )?);
            }
            Ok::<_, Failure>(out)
        };
        let ins = each(inputs, &h.inputs, "input")?;
        let outs = each(outputs, &h.outputs, "output")?;
        // SAFETY: each buffer is readable or writable for its length (this function's
        // contract, lengths and types checked against the tensors).
        unsafe { run_checked(&h, &ins, &outs) }
    })
}

/// For the test of the quiet library only (not part of the API, not in the header): a
/// call through the C entry points' guard whose body panics, as an internal bug would.
#[doc(hidden)]
pub fn force_internal_error_for_tests() -> SmeltStatus {
    guard(|| panic!("a forced internal error"))
}

/// [`force_internal_error_for_tests`] for the C test harness (tests/capi/capi_test.c),
/// which declares it itself: exported so a C host can check that a panic inside smelt
/// prints nothing, but not in the header, because it is no part of the API.
///
/// cbindgen:ignore
#[doc(hidden)]
#[no_mangle]
pub extern "C" fn smelt_testing_force_internal_error() -> SmeltStatus {
    force_internal_error_for_tests()
}

/// The message of the last failed smelt call on this thread ("" when the last call
/// succeeded). Never NULL; valid until the next smelt call on this thread.
#[no_mangle]
pub extern "C" fn smelt_last_error() -> *const c_char {
    // The pointer stays valid after the borrow ends: the CString's heap buffer lives until
    // the next failing (or succeeding) call on this thread replaces it.
    LAST_ERROR
        .try_with(|e| e.try_borrow().map_or(c"".as_ptr(), |s| s.as_ptr()))
        .unwrap_or(c"".as_ptr())
}

/// A constant name for a status code, e.g. `"SMELT_STATUS_ONNX"`; `"SMELT_STATUS_UNKNOWN"`
/// for values that are no status. Never NULL.
#[no_mangle]
pub extern "C" fn smelt_status_name(status: i32) -> *const c_char {
    let name = match status {
        0 => c"SMELT_STATUS_OK",
        1 => c"SMELT_STATUS_IR",
        2 => c"SMELT_STATUS_IO",
        3 => c"SMELT_STATUS_INVALID_ARGUMENT",
        4 => c"SMELT_STATUS_ONNX",
        5 => c"SMELT_STATUS_PASS",
        6 => c"SMELT_STATUS_UNSUPPORTED",
        7 => c"SMELT_STATUS_INTERNAL",
        _ => c"SMELT_STATUS_UNKNOWN",
    };
    name.as_ptr()
}

/// smelt's version, e.g. `"0.1.0"`. Never NULL.
#[no_mangle]
pub extern "C" fn smelt_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    VERSION.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: smelt_last_error never returns NULL and its string lives until the next call.
        unsafe { CStr::from_ptr(smelt_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn every_error_variant_has_its_own_status() {
        let diag = smelt_ir::Diagnostic::error("x", "y", smelt_ir::Location::Unknown);
        let errors = [
            Error::Ir(diag.clone().into()),
            Error::Io {
                path: "p".into(),
                source: std::io::Error::other("gone"),
            },
            Error::InvalidArgument("a".into()),
            Error::Onnx(diag.into()),
            Error::Pass(smelt_passes::PassError::UnknownRule("nope".into())),
            Error::Unsupported("u".into()),
        ];
        let mut codes: Vec<i32> = errors.iter().map(|e| status_of(e) as i32).collect();
        assert!(codes.iter().all(|&c| c != SmeltStatus::Ok as i32));
        codes.sort();
        codes.dedup();
        assert_eq!(
            codes.len(),
            errors.len(),
            "two variants share a status code"
        );
        for e in &errors {
            // SAFETY: smelt_status_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(smelt_status_name(status_of(e) as i32)) };
            assert_ne!(name.to_str().unwrap(), "SMELT_STATUS_UNKNOWN");
        }
    }

    #[test]
    fn a_panic_becomes_an_internal_status() {
        let status = guard(|| panic!("boom {}", 42));
        assert_eq!(status, SmeltStatus::Internal);
        assert!(last_error().contains("boom 42"), "{}", last_error());
        assert_eq!(guard(|| Ok(())), SmeltStatus::Ok);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn shapes_parse_and_bad_ones_are_rejected() {
        assert_eq!(
            parse_shape("input=1x3x224x224"),
            Some(("input".to_string(), vec![1, 3, 224, 224]))
        );
        assert_eq!(parse_shape("input=1x0"), None);
        assert_eq!(parse_shape("input"), None);
        let bad = c"input=1xq";
        let opts = SmeltOptions {
            input_shapes: bad.as_ptr(),
            ..smelt_options_default()
        };
        // SAFETY: `opts` is a valid options struct with a NUL-terminated string.
        let err = unsafe { read_options(&opts) }.err().map(|f| f.0);
        assert_eq!(err, Some(SmeltStatus::InvalidArgument));
        let opts = SmeltOptions {
            kernels: 4,
            ..smelt_options_default()
        };
        // SAFETY: `opts` is a valid options struct.
        let err = unsafe { read_options(&opts) }.err().map(|f| f.0);
        assert_eq!(err, Some(SmeltStatus::InvalidArgument));
    }
}
