//! ONNX import: protobuf decoding and mapping of ONNX operators to smelt ops.
//!
//! ```no_run
//! use smelt::onnx::{import, ImportOptions};
//! let bytes = std::fs::read("resnet18.onnx").unwrap();
//! let opts = ImportOptions::default().with_shape("input", [1, 3, 224, 224]);
//! let module = import(&bytes, &opts).unwrap();
//! assert_eq!(module.funcs.len(), 1);
//! ```
//!
//! The model becomes one function `main` whose parameters are the graph inputs that are
//! not initializers and whose results are the graph outputs, with ONNX's names. Every op
//! carries the ONNX node's name as its location. Shapes are static: dynamic dimensions
//! (a declared `-1`, a `dim_param` — named, `?` or empty — or an unset dimension) must be
//! pinned with [`ImportOptions::input_shapes`], and shape arithmetic (Shape, Gather,
//! Concat, Unsqueeze...) is folded to constants at import. [`import_file`] reads tensors
//! stored as external data from the model's folder (see `external.rs` for the limits).

#![cfg(feature = "onnx")]

mod aligned;
mod context;
mod external;
mod interface;
mod narrow;
mod ops;
pub mod proto;
mod symbolic;
pub mod tensor;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;
use smelt_ir::builder::FuncBuilder;
use smelt_ir::{AlignedBuf, DType, Diagnostic, Diagnostics, Location, Module, Tensor, TensorType};

use context::{node_display_name, plain_error, Entry, Importer, NodeCtx};
pub use ops::MAX_OPSET;
use proto::{tensor_shape_proto::dimension, type_proto, GraphProto, ModelProto, NodeProto};
pub use symbolic::import_file_symbolic;
pub(crate) use symbolic::try_import_symbolic;
use tensor::{dtype, ConstData, ConstTensor};

pub use crate::Interface;

/// Options of [`import`].
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Shapes for graph inputs, by input name: required for inputs with dynamic
    /// dimensions, and must agree with the model's static dimensions.
    pub input_shapes: BTreeMap<String, Vec<usize>>,
    /// Graph inputs to freeze as constants, by name (serialized `TensorProto` values are
    /// decoded with [`tensor::ConstTensor::from_proto`]). Inputs that give shapes or
    /// axes, which smelt needs at compile time, can be provided this way.
    pub constant_inputs: BTreeMap<String, proto::TensorProto>,
    /// The interface the caller uses, so that errors asking for an option (an unpinned
    /// dynamic dimension) spell it the caller's way. The CLI and the C API set it; Rust
    /// callers keep the default, [`Interface::Rust`].
    pub interface: Interface,
    /// One more folder external data may be read from, besides the model file's own
    /// folder (after resolving symlinks). `None` (the default): only the model's folder,
    /// since a model is untrusted input and must not read the rest of the machine.
    pub allowed_root: Option<PathBuf>,
    /// The memory budget for the file, its weights and the constants folded at import
    /// (see [`smelt_ir::budget`]); `None`: the machine's default.
    pub memory_budget: Option<u64>,
}

impl ImportOptions {
    /// These options with the shape of input `name` pinned to `dims`.
    pub fn with_shape(mut self, name: &str, dims: impl Into<Vec<usize>>) -> ImportOptions {
        self.input_shapes.insert(name.to_string(), dims.into());
        self
    }
}

/// Imports an ONNX model from its serialized bytes (copied once, into an aligned buffer
/// whose windows become the large weights).
///
/// A model given as bytes has no folder, so tensors stored as external data are refused
/// (use [`import_file`]).
pub fn import(bytes: &[u8], opts: &ImportOptions) -> Result<Module, crate::Error> {
    import_aligned(AlignedBuf::from_bytes(bytes), None, opts)
}

/// Imports an ONNX model from a shared buffer; weights stored in `raw_data` are sliced
/// from it during decoding and copied once, into the module's aligned weight buffers.
/// External data is refused, as for [`import`].
pub fn import_bytes(bytes: Bytes, opts: &ImportOptions) -> Result<Module, crate::Error> {
    let mut model = decode_model(bytes).map_err(onnx_error)?;
    let mut windows = HashMap::new();
    external::resolve(&mut model, None, &mut windows, opts.interface, None).map_err(onnx_error)?;
    import_model(&model, &windows, opts).map_err(onnx_error)
}

/// Reads and imports an ONNX model file. The file is read once, into an aligned buffer;
/// its large float initializers are aligned in place and become windows of it, so no
/// weight data is copied.
///
/// Tensors stored as ONNX external data (`data_location = EXTERNAL`) are read from their
/// side files, which must be regular files inside the model file's folder (after `..`
/// and symlinks): each read is exactly the tensor's size, within the file, straight into
/// the aligned buffer that becomes the weight.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Module, crate::Error> {
    decode_file(path, opts)?.import(opts)
}

/// An ONNX model file read and decoded once (its external data resolved), to import any
/// number of times, each import pinning its own input shapes: the large weights of every
/// module imported from it are windows of the one file buffer, so they are shared, and
/// the file is neither read nor decoded again. A `DynamicExecutable` compiles its batch
/// buckets from one.
pub struct DecodedModel {
    decoded: aligned::AlignedModel,
}

impl DecodedModel {
    /// The graph inputs it declares, as [`declared_interface`] reads them from a file.
    pub(crate) fn declared_inputs(
        &self,
        opts: &ImportOptions,
    ) -> Result<Vec<DeclaredInput>, crate::Error> {
        let Some(graph) = self.decoded.model.graph.as_ref() else {
            return Ok(Vec::new());
        };
        let initializers: BTreeSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
        declared_inputs(&graph.input, &initializers, opts)
    }

    /// The display names of the top graph's Resize nodes given a `sizes` input (rather
    /// than `scales`): their result's size is that input's, not the scaled input's.
    pub(crate) fn resizes_to_sizes(&self) -> BTreeSet<String> {
        let graph = self.decoded.model.graph.as_ref();
        graph
            .map(|g| &g.node[..])
            .unwrap_or_default()
            .iter()
            .filter(|n| n.op_type() == "Resize" && n.input.get(3).is_some_and(|s| !s.is_empty()))
            .map(node_display_name)
            .collect()
    }

    /// Imports the model with `opts` (its pinned shapes, interface and budget; the file
    /// limits were applied when it was decoded).
    pub fn import(&self, opts: &ImportOptions) -> Result<Module, crate::Error> {
        import_model(&self.decoded.model, &self.decoded.windows, opts).map_err(onnx_error)
    }
}

/// Reads and decodes the ONNX model file at `path` as [`import_file`] does, without
/// importing it.
pub fn decode_file(path: &Path, opts: &ImportOptions) -> Result<DecodedModel, crate::Error> {
    let buf = read_model_file(path, opts)?;
    let folder = path.parent().unwrap_or(Path::new("."));
    decode_aligned(buf, Some(folder), opts).map(|decoded| DecodedModel { decoded })
}

/// One graph input as the model declares it (initializers and constant inputs left out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredInput {
    /// The input's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its declared dims, `None` when the model declares no shape.
    pub dims: Option<Vec<InputDim>>,
}

/// One declared dimension of a graph input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputDim {
    /// A static size.
    Fixed(usize),
    /// A dynamic size: its `dim_param`, or `""` for `-1`, an empty `dim_param` or an
    /// unset dimension.
    Dynamic(String),
}

/// A model's interface as its graph declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredInterface {
    /// The graph inputs, in order (initializers and constant inputs left out).
    pub inputs: Vec<DeclaredInput>,
    /// The graph outputs' names, in order.
    pub outputs: Vec<String>,
}

/// The graph inputs and outputs of the model file at `path` as it declares them, in
/// order, without importing it (`opts.constant_inputs` are left out, as the import makes
/// them constants).
pub fn declared_interface(
    path: &Path,
    opts: &ImportOptions,
) -> Result<DeclaredInterface, crate::Error> {
    let (file, len) = smelt_ir::files::open_regular(path, true).map_err(|m| crate::Error::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(m),
    })?;
    if len == 0 {
        return Err(onnx_error(plain_error(
            "onnx-decode",
            "the model file is empty",
        )));
    }
    let graph = interface::read(file, len)
        .map_err(|m| onnx_error(plain_error("onnx-decode", format!("malformed model: {m}"))))?;
    let initializers: BTreeSet<&str> = graph.initializer_names.iter().map(String::as_str).collect();
    let inputs = declared_inputs(&graph.inputs, &initializers, opts)?;
    let outputs = graph.outputs.iter().map(|o| o.name().to_string()).collect();
    Ok(DeclaredInterface { inputs, outputs })
}

/// The inputs `graph_inputs` declare, initializers and `opts.constant_inputs` left out.
fn declared_inputs(
    graph_inputs: &[proto::ValueInfoProto],
    initializers: &BTreeSet<&str>,
    opts: &ImportOptions,
) -> Result<Vec<DeclaredInput>, crate::Error> {
    let mut inputs = Vec::new();
    for input in graph_inputs {
        let name = input.name();
        if initializers.contains(name) || opts.constant_inputs.contains_key(name) {
            continue;
        }
        let Some(type_proto::Value::TensorType(t)) =
            input.r#type.as_ref().and_then(|t| t.value.as_ref())
        else {
            return Err(onnx_error(plain_error(
                "onnx-unsupported-dtype",
                format!("input '{name}' is not a tensor"),
            )));
        };
        let dtype = dtype::ir(t.elem_type()).ok_or_else(|| {
            onnx_error(plain_error(
                "onnx-unsupported-dtype",
                format!(
                    "input '{name}' has element type {}",
                    dtype::name(t.elem_type())
                ),
            ))
        })?;
        let dims = t
            .shape
            .as_ref()
            .map(|s| {
                s.dim
                    .iter()
                    .enumerate()
                    .map(|(k, d)| {
                        Ok(match declared_dim(name, k, d)? {
                            DeclaredDim::Fixed(v) => InputDim::Fixed(v),
                            DeclaredDim::Dynamic => InputDim::Dynamic(match &d.value {
                                Some(dimension::Value::DimParam(p)) => p.clone(),
                                _ => String::new(),
                            }),
                        })
                    })
                    .collect::<Result<Vec<_>, Diagnostic>>()
            })
            .transpose()
            .map_err(onnx_error)?;
        inputs.push(DeclaredInput {
            name: name.to_string(),
            dtype,
            dims,
        });
    }
    Ok(inputs)
}

/// Reads a model file into one aligned buffer: a regular file only, its size within the
/// memory budget.
fn read_model_file(path: &Path, opts: &ImportOptions) -> Result<AlignedBuf, crate::Error> {
    let io = |source| crate::Error::Io {
        path: path.display().to_string(),
        source,
    };
    // a regular file only: a FIFO or a device such as /dev/zero is refused, not read
    let (mut file, len) =
        smelt_ir::files::open_regular(path, true).map_err(|m| io(std::io::Error::other(m)))?;
    let budget = opts
        .memory_budget
        .unwrap_or_else(smelt_ir::budget::default_memory_budget);
    smelt_ir::budget::check("the model file", len, 0, budget)
        .map_err(|m| io(std::io::Error::other(m)))?;
    let len = usize::try_from(len)
        .map_err(|_| crate::Error::InvalidArgument(format!("{}: too large", path.display())))?;
    // every byte is read (or the read fails, and the buffer with it): no need to clear
    let mut buf = AlignedBuf::for_overwrite(len);
    if let Some(dst) = buf.as_bytes_mut() {
        read_into(&mut file, dst).map_err(io)?;
    }
    // a file that grew since its length was read is read no further; a shorter one fails
    Ok(buf)
}

/// Files at least this large are read by two threads, each into its half of the buffer.
const PARALLEL_READ_MIN_BYTES: usize = 4 << 20;

/// Fills `dst` from the start of `file`. Reading into fresh memory is mostly the kernel
/// clearing the buffer's new pages (huge pages, see `AlignedBuf`), and into reused
/// memory the copy out of the page cache (YOLO's 7.3 MB: 1.6 ms); both run on two cores
/// at once when two threads read the two halves (ResNet-50's 98 MB: see
/// benches/RESULTS.md "Compile time, session 3"; YOLO's decode 3.0 → 2.1 ms).
fn read_into(file: &mut std::fs::File, dst: &mut [u8]) -> std::io::Result<()> {
    #[cfg(unix)]
    if dst.len() >= PARALLEL_READ_MIN_BYTES
        && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
    {
        use std::os::unix::fs::FileExt;
        // split on a 2 MiB (huge page) boundary so the halves share no page
        let mid = (dst.len() / 2).next_multiple_of(2 << 20).min(dst.len());
        let (lo, hi) = dst.split_at_mut(mid);
        let file = &*file;
        return std::thread::scope(|s| {
            let upper = s.spawn(move || file.read_exact_at(hi, mid as u64));
            let lower = file.read_exact_at(lo, 0);
            let upper = upper
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            lower.and(upper)
        });
    }
    file.read_exact(dst)
}

/// Imports a model held in an owned aligned buffer (see [`aligned`]); external data is
/// read from `folder` (none: refused).
fn import_aligned(
    file: AlignedBuf,
    folder: Option<&Path>,
    opts: &ImportOptions,
) -> Result<Module, crate::Error> {
    let decoded = decode_aligned(file, folder, opts)?;
    import_model(&decoded.model, &decoded.windows, opts).map_err(onnx_error)
}

/// Decodes the model in `file`, its large weights aligned in place, its external data
/// (from `folder`, when the model has one) resolved.
fn decode_aligned(
    file: AlignedBuf,
    folder: Option<&Path>,
    opts: &ImportOptions,
) -> Result<aligned::AlignedModel, crate::Error> {
    if file.len_bytes() == 0 {
        return Err(onnx_error(plain_error(
            "onnx-decode",
            "the model file is empty",
        )));
    }
    let mut decoded = aligned::decode(file).map_err(|e| onnx_error(malformed(e)))?;
    external::resolve(
        &mut decoded.model,
        folder,
        &mut decoded.windows,
        opts.interface,
        opts.allowed_root.as_deref(),
    )
    .map_err(onnx_error)?;
    Ok(decoded)
}

/// Decodes a serialized `TensorProto` (the `input_N.pb` files of ONNX test data) into a
/// host tensor of its element type (float32, float16, bfloat16, int64, int32, int16,
/// uint16, int8, uint8 or bool)
/// and the tensor's name.
pub fn read_tensor(bytes: &[u8]) -> Result<(String, Tensor), crate::Error> {
    let t = proto::TensorProto::decode(Bytes::copy_from_slice(bytes)).map_err(|e| {
        onnx_error(plain_error(
            "onnx-decode",
            format!("malformed TensorProto: {e}"),
        ))
    })?;
    let name = t.name().to_string();
    let bad = |m: String| {
        onnx_error(plain_error(
            "onnx-bad-tensor",
            format!("tensor '{name}' {m}"),
        ))
    };
    let c = ConstTensor::from_proto(&t).map_err(bad)?;
    let data = c.to_data().ok_or_else(|| {
        bad(format!(
            "has element type {}, not float32, float16, bfloat16, int64, int32, int16, \
             uint16, int8, uint8 or bool",
            c.type_name()
        ))
    })?;
    let tensor = Tensor::typed(c.dims.clone(), data).map_err(bad)?;
    Ok((name, tensor))
}

/// The ONNX op types smelt imports, sorted.
pub fn supported_op_types() -> impl Iterator<Item = &'static str> {
    ops::rules().iter().map(|r| r.op_type)
}

fn onnx_error(d: Diagnostic) -> crate::Error {
    crate::Error::Onnx(Diagnostics(vec![d]))
}

fn decode_model(bytes: Bytes) -> Result<ModelProto, Diagnostic> {
    if bytes.is_empty() {
        return Err(plain_error("onnx-decode", "the model file is empty"));
    }
    ModelProto::decode(bytes).map_err(malformed)
}

fn malformed(e: prost::DecodeError) -> Diagnostic {
    plain_error(
        "onnx-decode",
        format!("not a valid ONNX model (malformed or truncated protobuf): {e}"),
    )
}

/// The `ai.onnx` opset the model imports.
fn model_opset(model: &ModelProto) -> Result<i64, Diagnostic> {
    let mut opset = None;
    for o in &model.opset_import {
        if o.domain().is_empty() || o.domain() == "ai.onnx" {
            opset = Some(o.version());
        }
    }
    let opset = opset.ok_or_else(|| {
        plain_error(
            "onnx-bad-model",
            "the model does not import the default ONNX opset (opset_import has no ai.onnx entry)",
        )
    })?;
    if !(1..=MAX_OPSET).contains(&opset) {
        return Err(plain_error(
            "onnx-unsupported-opset",
            format!(
                "the model uses ai.onnx opset {opset}; smelt knows opsets 1 to {MAX_OPSET} \
                 (convert it with onnx.version_converter)"
            ),
        ));
    }
    Ok(opset)
}

/// Imports a decoded model; `windows` holds, by initializer index, data already in
/// aligned buffers (used as the weights instead of decoding `raw_data`).
fn import_model(
    model: &ModelProto,
    windows: &HashMap<usize, AlignedBuf>,
    opts: &ImportOptions,
) -> Result<Module, Diagnostic> {
    let opset = model_opset(model)?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| plain_error("onnx-bad-model", "the model has no graph"))?;
    if !graph.sparse_initializer.is_empty() {
        return Err(plain_error(
            "onnx-unsupported-dtype",
            "sparse initializers are not supported",
        ));
    }
    let mut module = Module::default();
    module.weights.set_memory_budget(opts.memory_budget);
    let builder = FuncBuilder::new(&mut module, "main");
    let mut imp = Importer::new(builder, opset);
    define_inputs(&mut imp, graph, windows, opts)?;
    for index in topological_order(graph, &imp)? {
        import_node(&mut imp, &graph.node[index], opset)?;
    }
    let mut results = Vec::with_capacity(graph.output.len());
    let mut output_names = BTreeSet::new();
    for out in &graph.output {
        let name = out.name();
        if name.is_empty() || !output_names.insert(name) {
            return Err(plain_error(
                "onnx-bad-model",
                format!("graph output names must be unique and non-empty, got '{name}'"),
            ));
        }
        let v = match imp.entries.get(name).cloned() {
            Some(Entry::Const(c)) => {
                imp.builder.set_loc(Location::Name(name.into()));
                imp.materialize(&c, name)?
            }
            Some(_) => imp.value_of(name).map_err(|d| Diagnostic {
                message: format!("graph output '{name}': {}", d.message),
                ..d
            })?,
            None => {
                return Err(plain_error(
                    "onnx-missing-input",
                    format!(
                        "graph output '{name}' is not produced by any node, input or initializer"
                    ),
                ))
            }
        };
        results.push((name.to_string(), v));
    }
    let results: Vec<(&str, smelt_ir::Value)> =
        results.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    imp.builder.finish(&results);
    Ok(module)
}

/// Defines initializers and frozen inputs as constants and the other graph inputs as
/// function parameters.
fn define_inputs(
    imp: &mut Importer,
    graph: &GraphProto,
    windows: &HashMap<usize, AlignedBuf>,
    opts: &ImportOptions,
) -> Result<(), Diagnostic> {
    for (i, t) in graph.initializer.iter().enumerate() {
        let mut c = ConstTensor::from_proto(t).map_err(|m| {
            plain_error(
                if m.contains("external") {
                    "onnx-external-data"
                } else {
                    "onnx-bad-tensor"
                },
                format!("initializer '{}': {m}", t.name()),
            )
        })?;
        if let (Some(w), ConstData::F32Raw(_)) = (windows.get(&i), &c.data) {
            c.data = ConstData::F32Aligned(w.clone());
        }
        imp.entries.insert(t.name().to_string(), Entry::constant(c));
    }
    let input_names: BTreeSet<&str> = graph.input.iter().map(|i| i.name()).collect();
    for name in opts.input_shapes.keys().chain(opts.constant_inputs.keys()) {
        if !input_names.contains(name.as_str()) {
            return Err(plain_error(
                "onnx-bad-option",
                format!(
                    "the model has no input named '{name}' (inputs: {})",
                    input_names.iter().copied().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    let mut seen = BTreeSet::new();
    for input in &graph.input {
        let name = input.name();
        if name.is_empty() {
            return Err(plain_error(
                "onnx-bad-model",
                "a graph input has an empty name",
            ));
        }
        if !seen.insert(name) {
            return Err(plain_error(
                "onnx-bad-model",
                format!("graph input '{name}' is declared twice"),
            ));
        }
        if let Some(t) = opts.constant_inputs.get(name) {
            if opts.input_shapes.contains_key(name) {
                return Err(plain_error(
                    "onnx-bad-option",
                    format!(
                        "input '{name}' is given both a shape and a constant value; its \
                         shape is the constant's"
                    ),
                ));
            }
            let c = ConstTensor::from_proto(t).map_err(|m| {
                plain_error("onnx-bad-option", format!("constant input '{name}': {m}"))
            })?;
            imp.entries.insert(name.to_string(), Entry::constant(c));
            continue;
        }
        if let Some(Entry::Const(c)) = imp.entries.get(name) {
            // an initializer also listed as an input (IR version < 4): its default value,
            // which smelt keeps as a constant (a constant input given above replaces it)
            if let Some(dims) = opts.input_shapes.get(name) {
                return Err(plain_error(
                    "onnx-bad-option",
                    format!(
                        "shape {dims:?} given for input '{name}', which has an initializer of \
                         shape {:?}: smelt treats it as that constant, so its shape cannot be \
                         pinned",
                        c.dims
                    ),
                ));
            }
            continue;
        }
        let ty = input_type(input, opts.input_shapes.get(name), opts.interface)?;
        let v = imp.builder.param(name, ty);
        imp.entries.insert(name.to_string(), Entry::Value(v));
    }
    Ok(())
}

/// What one declared dimension of a graph input says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeclaredDim {
    /// A static size.
    Fixed(usize),
    /// A dynamic size: `-1`, a `dim_param` (named, `?` or empty) or no value at all.
    Dynamic,
}

/// Reads one declared dimension: `-1`, a `dim_param` and an unset dimension are all
/// dynamic; any other negative size is a malformed model.
fn declared_dim(
    name: &str,
    k: usize,
    d: &proto::tensor_shape_proto::Dimension,
) -> Result<DeclaredDim, Diagnostic> {
    match d.value {
        Some(dimension::Value::DimValue(v)) if v >= 0 => {
            usize::try_from(v).map(DeclaredDim::Fixed).map_err(|_| {
                plain_error(
                    "onnx-bad-model",
                    format!("input '{name}' dimension {k} ({v}) is too large"),
                )
            })
        }
        Some(dimension::Value::DimValue(-1)) | Some(dimension::Value::DimParam(_)) | None => {
            Ok(DeclaredDim::Dynamic)
        }
        Some(dimension::Value::DimValue(v)) => Err(plain_error(
            "onnx-bad-model",
            format!(
                "input '{name}' dimension {k} is declared as {v}; a size is non-negative, or -1 \
                 (or a dim_param) for a dynamic one"
            ),
        )),
    }
}

/// How the caller pins the dims of input `name`, spelled for its interface, with the
/// declared shape as the example (each dynamic dimension `k` written `Dk`).
fn pin_hint(interface: Interface, name: &str, decl: Option<&[DeclaredDim]>) -> String {
    let parts: Vec<String> = match decl {
        Some(decl) => decl
            .iter()
            .enumerate()
            .map(|(k, d)| match d {
                DeclaredDim::Fixed(v) => v.to_string(),
                DeclaredDim::Dynamic => format!("D{k}"),
            })
            .collect(),
        None => vec!["DIMS".to_string()],
    };
    let dynamic = decl.is_some_and(|d| d.contains(&DeclaredDim::Dynamic));
    let note = if dynamic {
        " (each Dk the size of dimension k)"
    } else {
        ""
    };
    match interface {
        Interface::Cli => format!("pin it with --shape {name}={}{note}", parts.join("x")),
        Interface::C => format!(
            "pin it with SmeltOptions.input_shapes = \"{name}={}\"{note}",
            parts.join("x")
        ),
        Interface::Rust => format!(
            "pin it with ImportOptions::input_shapes (or LoadOptions::input_shapes), e.g. \
             ImportOptions::default().with_shape(\"{name}\", [{}]){note}",
            parts.join(", ")
        ),
    }
}

/// The static type of a graph input: float32, every dimension known or pinned.
fn input_type(
    input: &proto::ValueInfoProto,
    pinned: Option<&Vec<usize>>,
    interface: Interface,
) -> Result<TensorType, Diagnostic> {
    let name = input.name();
    let tensor = match input.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => t,
        _ => {
            return Err(plain_error(
                "onnx-unsupported-dtype",
                format!(
                "input '{name}' is not a tensor (sequences, maps and optionals are not supported)"
            ),
            ))
        }
    };
    let Some(element) = dtype::ir(tensor.elem_type()) else {
        return Err(plain_error(
            "onnx-unsupported-dtype",
            format!(
                "input '{name}' has element type {}; smelt's inputs are float32, float16, \
                 bfloat16, int64, int32, int16, uint16, int8, uint8 or bool",
                dtype::name(tensor.elem_type())
            ),
        ));
    };
    let declared_proto = tensor.shape.as_ref().map(|s| &s.dim[..]);
    let declared = declared_proto
        .map(|dims| {
            dims.iter()
                .enumerate()
                .map(|(k, d)| declared_dim(name, k, d))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    if let Some(dims) = pinned {
        if let (Some(decl), Some(proto_dims)) = (&declared, declared_proto) {
            let shown = describe_shape(proto_dims);
            if decl.len() != dims.len() {
                return Err(plain_error(
                    "onnx-bad-option",
                    format!(
                        "shape {dims:?} given for input '{name}' has rank {}, but its declared \
                         shape {shown} has rank {}",
                        dims.len(),
                        decl.len()
                    ),
                ));
            }
            for (k, (d, &p)) in decl.iter().zip(dims).enumerate() {
                if let DeclaredDim::Fixed(v) = *d {
                    if v != p {
                        return Err(plain_error(
                            "onnx-bad-option",
                            format!(
                                "shape {dims:?} given for input '{name}' does not match its \
                                 declared shape {shown}: dimension {k} is {v} in the model, {p} \
                                 in the pin (only dynamic dimensions can be pinned)"
                            ),
                        ));
                    }
                }
            }
        }
        return checked_type(name, element, dims.clone());
    }
    let (Some(decl), Some(proto_dims)) = (declared, declared_proto) else {
        return Err(plain_error(
            "onnx-dynamic-shape",
            format!(
                "input '{name}' has no declared shape; {}",
                pin_hint(interface, name, None)
            ),
        ));
    };
    let mut dims = Vec::with_capacity(decl.len());
    for (k, d) in decl.iter().enumerate() {
        match *d {
            DeclaredDim::Fixed(v) => dims.push(v),
            DeclaredDim::Dynamic => {
                let what = match &proto_dims[k].value {
                    Some(dimension::Value::DimParam(p)) if p.is_empty() => {
                        "an empty dim_param".to_string()
                    }
                    Some(dimension::Value::DimParam(p)) => format!("'{p}'"),
                    Some(dimension::Value::DimValue(v)) => v.to_string(),
                    None => "unset".into(),
                };
                return Err(plain_error(
                    "onnx-dynamic-shape",
                    format!(
                        "input '{name}' dimension {k} is dynamic ({what}, declared shape {}); {}",
                        describe_shape(proto_dims),
                        pin_hint(interface, name, Some(&decl))
                    ),
                ));
            }
        }
    }
    checked_type(name, element, dims)
}

fn checked_type(name: &str, dtype: DType, dims: Vec<usize>) -> Result<TensorType, Diagnostic> {
    let ty = TensorType::new(dtype, dims);
    ty.check_known_size()
        .map_err(|m| plain_error("onnx-bad-model", format!("input '{name}': {m}")))?;
    Ok(ty)
}

/// The declared shape as the model spells it: sizes, `-1`, dim_param names, and `?` for
/// an unset dimension or an empty dim_param.
fn describe_shape(dims: &[proto::tensor_shape_proto::Dimension]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match &d.value {
            Some(dimension::Value::DimValue(v)) => v.to_string(),
            Some(dimension::Value::DimParam(p)) if !p.is_empty() => p.clone(),
            Some(dimension::Value::DimParam(_)) | None => "?".into(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Node indices in an order where every input is defined before use (stable: the file's
/// order whenever it already is one). Reports undefined inputs and cycles.
fn topological_order(graph: &GraphProto, imp: &Importer) -> Result<Vec<usize>, Diagnostic> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, node) in graph.node.iter().enumerate() {
        for out in node.output.iter().filter(|o| !o.is_empty()) {
            if imp.entries.contains_key(out.as_str()) {
                return Err(node_error(
                    node,
                    None,
                    plain_error(
                        "onnx-bad-model",
                        format!("output '{out}' redefines a graph input or initializer"),
                    ),
                ));
            }
            if let Some(&j) = producer.get(out.as_str()) {
                return Err(node_error(
                    node,
                    None,
                    plain_error(
                        "onnx-bad-model",
                        format!(
                            "output '{out}' is also produced by node '{}'",
                            node_display_name(&graph.node[j])
                        ),
                    ),
                ));
            }
            producer.insert(out, i);
        }
    }
    let mut waiting_on = vec![0usize; graph.node.len()];
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); graph.node.len()];
    for (i, node) in graph.node.iter().enumerate() {
        for input in node.input.iter().filter(|s| !s.is_empty()) {
            if let Some(&p) = producer.get(input.as_str()) {
                waiting_on[i] += 1;
                consumers[p].push(i);
            } else if !imp.entries.contains_key(input.as_str()) {
                return Err(node_error(
                    node,
                    None,
                    plain_error(
                        "onnx-missing-input",
                        format!(
                            "input '{input}' is not a graph input, an initializer or any node's \
                             output (a missing initializer?)"
                        ),
                    ),
                ));
            }
        }
    }
    let mut ready: BTreeSet<usize> = (0..graph.node.len())
        .filter(|&i| waiting_on[i] == 0)
        .collect();
    let mut order = Vec::with_capacity(graph.node.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &c in &consumers[i] {
            waiting_on[c] -= 1;
            if waiting_on[c] == 0 {
                ready.insert(c);
            }
        }
    }
    if order.len() < graph.node.len() {
        let stuck: Vec<String> = (0..graph.node.len())
            .filter(|&i| waiting_on[i] > 0)
            .take(8)
            .map(|i| {
                format!(
                    "'{}' ({})",
                    node_display_name(&graph.node[i]),
                    graph.node[i].op_type()
                )
            })
            .collect();
        let first = (0..graph.node.len())
            .find(|&i| waiting_on[i] > 0)
            .unwrap_or(0);
        return Err(node_error(
            &graph.node[first],
            None,
            plain_error(
                "onnx-cycle",
                format!(
                    "the graph has a cycle: these nodes wait on each other: {}",
                    stuck.join(", ")
                ),
            ),
        ));
    }
    Ok(order)
}

/// Control-flow bodies nested deeper than this are refused: each level is a recursion of
/// the importer, and no exporter nests shape tests this deep (the protobuf decoder stops
/// at about 32).
const MAX_SUBGRAPH_DEPTH: usize = 16;

/// Imports a control-flow body in place (the branch an `If` takes): its initializers and
/// nodes join the enclosing graph's names, which it may read; the entries of its outputs,
/// in order.
fn import_subgraph(imp: &mut Importer, graph: &GraphProto) -> Result<Vec<Entry>, Diagnostic> {
    if imp.subgraph_depth >= MAX_SUBGRAPH_DEPTH {
        return Err(plain_error(
            "onnx-too-deep",
            format!("control-flow bodies are nested more than {MAX_SUBGRAPH_DEPTH} deep"),
        ));
    }
    if !graph.sparse_initializer.is_empty() {
        return Err(plain_error(
            "onnx-unsupported-dtype",
            "sparse initializers are not supported",
        ));
    }
    for t in &graph.initializer {
        if imp.entries.contains_key(t.name()) {
            return Err(plain_error(
                "onnx-bad-model",
                format!(
                    "initializer '{}' shadows a name of the enclosing graph",
                    t.name()
                ),
            ));
        }
        let c = ConstTensor::from_proto(t).map_err(|m| {
            plain_error(
                "onnx-bad-tensor",
                format!("initializer '{}': {m}", t.name()),
            )
        })?;
        imp.entries.insert(t.name().to_string(), Entry::constant(c));
    }
    imp.subgraph_depth += 1;
    let imported = topological_order(graph, imp).and_then(|order| {
        order
            .into_iter()
            .try_for_each(|i| import_node(imp, &graph.node[i], imp.opset))
    });
    imp.subgraph_depth -= 1;
    imported?;
    graph
        .output
        .iter()
        .map(|o| {
            imp.entries.get(o.name()).cloned().ok_or_else(|| {
                plain_error(
                    "onnx-missing-input",
                    format!("output '{}' is not produced by any of its nodes", o.name()),
                )
            })
        })
        .collect()
}

/// Imports a loop body once: its inputs bound to `bindings`, its own names (inputs,
/// initializers, node outputs) scoped to this import — whatever they meant before is put
/// back after, so the next iteration imports the same graph afresh — and its outputs
/// returned. A Loop or Scan unrolled at import calls it once per iteration.
pub(crate) fn import_body(
    imp: &mut Importer,
    graph: &GraphProto,
    bindings: Vec<Entry>,
) -> Result<Vec<Entry>, Diagnostic> {
    if graph.input.len() != bindings.len() {
        return Err(plain_error(
            "onnx-bad-model",
            format!(
                "the body takes {} inputs where the node gives it {}",
                graph.input.len(),
                bindings.len()
            ),
        ));
    }
    let defined: Vec<String> = graph
        .input
        .iter()
        .map(|i| i.name().to_string())
        .chain(graph.initializer.iter().map(|t| t.name().to_string()))
        .chain(graph.node.iter().flat_map(|n| n.output.iter().cloned()))
        .filter(|n| !n.is_empty())
        .collect();
    // once each, so putting back restores every name
    let mut seen = std::collections::HashSet::new();
    let defined: Vec<String> = defined
        .into_iter()
        .filter(|n| seen.insert(n.clone()))
        .collect();
    let saved = imp.scope_out(&defined);
    for (input, entry) in graph.input.iter().zip(bindings) {
        imp.entries.insert(input.name().to_string(), entry);
    }
    let outputs = import_subgraph(imp, graph);
    imp.scope_in(&defined, saved);
    outputs
}

/// Adds the node's location and `OpType node 'name' (opset N)` to a diagnostic.
fn node_error(node: &NodeProto, opset: Option<i64>, d: Diagnostic) -> Diagnostic {
    let name = node_display_name(node);
    let opset = opset.map(|o| format!(", opset {o}")).unwrap_or_default();
    Diagnostic {
        message: format!("{} node '{name}'{opset}: {}", node.op_type(), d.message),
        location: Location::Name(name.into()),
        ..d
    }
}

fn import_node(imp: &mut Importer, node: &NodeProto, opset: i64) -> Result<(), Diagnostic> {
    let fail = |d: Diagnostic| node_error(node, Some(opset), d);
    if !(node.domain().is_empty() || node.domain() == "ai.onnx") {
        return Err(fail(plain_error(
            "onnx-unsupported-op",
            format!(
                "operator domain '{}' is not supported (only ai.onnx)",
                node.domain()
            ),
        )));
    }
    let rule = ops::rule(node.op_type()).ok_or_else(|| {
        fail(plain_error(
            "onnx-unsupported-op",
            format!(
                "operator '{}' is not supported (supported: {})",
                node.op_type(),
                supported_op_types().collect::<Vec<_>>().join(", ")
            ),
        ))
    })?;
    let version = rule
        .versions
        .iter()
        .copied()
        .filter(|&v| v <= opset)
        .max()
        .ok_or_else(|| {
            fail(plain_error(
                "onnx-unsupported-opset",
                format!(
                    "operator '{}' does not exist before opset {}",
                    node.op_type(),
                    rule.versions[0]
                ),
            ))
        })?;
    if version < rule.min_version {
        return Err(fail(plain_error(
            "onnx-unsupported-opset",
            format!(
                "version {version} of '{}' is not supported (smelt implements versions from {}, \
                 i.e. opset {} and later; convert the model with onnx.version_converter)",
                node.op_type(),
                rule.min_version,
                rule.min_version
            ),
        )));
    }
    // an attribute given twice: which one a handler read would be an accident of order
    let mut seen = std::collections::HashSet::new();
    if let Some(a) = node.attribute.iter().find(|a| !seen.insert(a.name())) {
        return Err(fail(plain_error(
            "onnx-bad-model",
            format!("attribute '{}' is given twice", a.name()),
        )));
    }
    imp.builder
        .set_loc(Location::Name(node_display_name(node).into()));
    let widened = narrow::widen_inputs(imp, node).map_err(fail)?;
    // errors about a widened input name the model's tensor, and say what was widened
    let int_note = widened
        .as_ref()
        .and_then(|w| w.widened_int)
        .map(narrow::widened_note);
    let fail = |d: Diagnostic| {
        let mut notes = d.notes.clone();
        notes.extend(int_note.clone());
        fail(Diagnostic {
            message: narrow::plain_names(&d.message),
            notes,
            ..d
        })
    };
    let outputs = {
        let read = widened.as_ref().map_or(node, |w| &w.node);
        let mut cx = NodeCtx {
            imp,
            node: read,
            version,
        };
        (rule.import)(&mut cx).map_err(fail)?
    };
    let outputs = match widened.and_then(|w| w.result_type) {
        Some(code) => narrow::narrow_results(imp, outputs, code).map_err(fail)?,
        None => outputs,
    };
    for (k, name) in node.output.iter().enumerate() {
        if name.is_empty() {
            continue;
        }
        let entry = outputs.get(k).cloned().ok_or_else(|| {
            fail(plain_error(
                "onnx-bad-model",
                format!("output {k} ('{name}') does not exist for this operator"),
            ))
        })?;
        // a name bound anew has no widening yet
        imp.widened.remove(name);
        imp.entries.insert(name.clone(), entry);
    }
    Ok(())
}
