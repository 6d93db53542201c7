//! The `.tir` text form: lexer, parser and canonical printer.
//!
//! # Syntax reference
//!
//! A `.tir` file is a module: weight declarations, then functions. `//` starts a comment
//! that runs to the end of the line. Whitespace and line breaks are not significant.
//!
//! ```text
//! // weights: name, type, data
//! const @w0 : tensor<64x64x3x3xf32> = random<seed = 1, min = -0.1, max = 0.1>
//! const @g : tensor<4xf32> = dense<[1.0, 2.0, 3.0, 4.0]>
//! const @m : tensor<2x2xf32> = dense<[[1.0, 2.0], [3.0, 4.0]]>   // nested: row-major
//! const @one : tensor<64xf32> = dense<1.0>                       // splat
//! const @big : tensor<64x64x3x3xf32> = external<"tail.safetensors", "conv1.weight">
//!
//! func @tail(%x: tensor<1x64x56x56xf32>, %skip: tensor<1x64x56x56xf32>) -> tensor<1x64x56x56xf32> {
//!   %0 = const @w0 : tensor<64x64x3x3xf32>
//!   %1 = conv2d %x, %0 {pads = [1, 1, 1, 1]} : tensor<1x64x56x56xf32>
//!   %2 = batch_norm %1, %g, %b, %m, %v {epsilon = 1.0e-3} : tensor<1x64x56x56xf32>
//!   %3 = add %2, %skip : tensor<1x64x56x56xf32>
//!   %4 = relu %3 : tensor<1x64x56x56xf32>
//!   return %4 : tensor<1x64x56x56xf32>
//! }
//!
//! func @two(%a: tensor<2xf32>) -> (y: tensor<2xf32>, z: tensor<2xf32>) {
//!   %0 = relu %a : tensor<2xf32>
//!   %1 = clip %a {min = 0.0, max = 6.0} : tensor<2xf32>
//!   return %0, %1 : tensor<2xf32>, tensor<2xf32>
//! }
//! ```
//!
//! ## Types
//!
//! `tensor<D0xD1x...xDTYPE>` with positive dimensions written without spaces and the
//! element type `f32`, `i64`, `i32`, `i1` (a bool, one byte 0 or 1), `f16` or `bf16` (2-byte
//! storage types: only `cast` and data movement take them), or `i8`, `ui8`, `i16`, `ui16`
//! (narrow integer storage types, likewise); `tensor<f32>` is a scalar. Integer, narrow
//! integer and `i1` weights are written as integer lists (`dense<[1, 0, 1]>`),
//! `f16` and `bf16` ones as float lists, each value rounded to the type. A
//! layout may follow: `tensor<1x64x56x56xf32, nchw8c>`. Layouts are `row_major` (the
//! default, never printed), `nchwNc` (axis 1 in blocks of N), `oihwNo` (axis 0 in blocks
//! of N) and the general `blocked<axis,block>`; rank-4 tensors print the letter forms.
//! Types larger than 4 GiB are rejected before anything is allocated.
//!
//! ### Symbolic dimensions
//!
//! A dimension may be a symbol or an expression over symbols (issue #23):
//! `tensor<Nx3xHxWxf32>`, `tensor<Bx?x384xf32>`, `tensor<Nx64x((H + 1) / 2)xf32>`.
//!
//! ```text
//! dim   := INT | NAME | STRING | '?' | '?' INT | '(' expr ')'
//! expr  := term (('+' | '-') term)*
//! term  := unary ('*' unary | '/' INT)*
//! unary := '-' unary | INT | NAME | STRING | '?' INT | '(' expr ')'
//! ```
//!
//! A bare name between the `x`s is letters, digits and `_`, without an `x` (the
//! separator); other names are quoted (`"max_len"`). A bare `?` is a fresh symbol, named
//! `?1`, `?2`, ... in the order the file writes them, and prints by that name. `/` is the
//! floor division of a size by a positive integer, as conv and pool windows count. Every
//! expression prints in one canonical form (terms sorted, constants last, whatever a
//! divisor divides taken out of the division, stride after stride one division), so
//! `(H - 1) / 2 + 1` prints `(H + 1) / 2` and two types are equal exactly when they are
//! for every value of their symbols. A symbolic size is a sum of at most 64 terms with at
//! most 16 nested divisions. Weights have known sizes; every symbolic size in a body is
//! computed from the parameters' by the type rules, and a rule that needs a known size (a
//! slice along a symbolic axis, a ceil-mode pool, a crop or reflection) says so.
//! `smelt_ir::symbolic::specialize` binds the symbols from the inputs' shapes.
//!
//! The attributes that are a result's sizes may hold symbolic sizes too, written as in a
//! type (a bare name, `?1`, `"name"`, or a parenthesized expression): a reshape's and an
//! expand's `shape = [N, (8*H*W)]`, a resize's `sizes = [N, 8, (2*H), (2*W)]`. A resize
//! to sizes read from a shape scales by its size over its input's: its `scales` entry is
//! 0 where a size is symbolic, computed when the module is specialized.
//!
//! ## Names
//!
//! `%name` is a value, `@name` a weight or function. Bare names use letters, digits and
//! `_ . $ -`; any other name is quoted: `%"/layer1/Relu_output_0"`. Parameter names are
//! the function's API and are printed verbatim; every other value is renumbered
//! `%0, %1, …` in order (skipping numbers a parameter already uses), so input names are
//! arbitrary. Results are named in the signature, `-> (y: T, z: T)` (quote names that are
//! not identifiers); the bare `-> T` or `-> (T, T)` form gives the names `result0`,
//! `result1`, …, and the printer uses it exactly when all names are those defaults.
//! `return` lists the values and their types.
//!
//! ## Instructions
//!
//! `%r = OP OPERANDS {ATTRS} : RESULT_TYPE [loc(...)]`. The declared result type must be
//! exactly what the op's type rule gives. `%r = const @w : T` reads a weight.
//!
//! Attribute values are integers, floats (`1.0`, `1e-5`, `-inf`, `nan`), `true`/`false`,
//! integer lists `[1, 2]` and layouts. Integers must be non-negative and at most
//! 2147483647. Only attributes that differ from their default are printed, in this order:
//!
//! | op | operands | attributes (default) |
//! |---|---|---|
//! | `conv2d` | x, w, bias? | `strides` ([1, 1]), `pads` ([0, 0, 0, 0] = top, left, bottom, right), `dilations` ([1, 1]), `groups` (1), `layout` (row_major: the result's layout, e.g. `nchw16c` as the layout pass chooses) |
//! | `batch_norm` | x, scale, bias, mean, var | `epsilon` (1e-5) |
//! | `relu` `sigmoid` `tanh` `erf` `gelu` `hard_swish` `silu` `sqrt` `exp` `log` `reciprocal`, `floor` `ceil` `round` (halves to even), `sign`, `sin` `cos` `tan` `asin` `acos` `atan` `sinh` `cosh` `asinh` `acosh` `atanh` | x (f32) | — |
//! | `neg` `abs` | x (f32 or an integer type) | — |
//! | `clip` | x | `min`, `max` (both required) |
//! | `leaky_relu` | x | `alpha` (0.01) |
//! | `hard_sigmoid` | x | `alpha` (0.2), `beta` (0.5) |
//! | `add` `sub` `mul` `div` `min` `max` | a, b (numpy broadcasting, one numeric type; integers wrap, integer `div` truncates) | — |
//! | `equal` `less` `less_equal` `greater` `greater_equal` | a, b (broadcasting, one type) → i1 | — |
//! | `and` `or` `xor` | a, b (i1, broadcasting) | — |
//! | `not` | x (i1) | — |
//! | `where` | cond (i1), a, b (broadcasting) | — |
//! | `cast` | x (any type) | `to` (required: `f32`, `i64`, `i32`, `i1`, `f16`, `bf16`, `i8`, `ui8`, `i16`, `ui16`) |
//! | `gather` | data (any type), indices (i64 or i32; negative counts from the end, out of range is a run-time error) | `axis` (0) |
//! | `reduce_sum` `reduce_mean` `reduce_max` `reduce_min` | x (f32) | `axes` (required, sorted), `keep_dims` (false) |
//! | `resize` | x (any type for nearest, f32 for linear) | `sizes`, `scales` (required), `mode` (`nearest`, `linear`, `cubic`), `nearest` (round_prefer_floor), `coordinate` (half_pixel), `layout` (row_major: the result's layout) |
//! | `grid_sample` | x (f32, `[N, C, D1 .. Dr]`), grid (f32, `[N, H1 .. Hk, r]`, the last axis's coordinate first) | `mode` (`linear`, `nearest`, `cubic`), `padding` (`zeros`, `border`, `reflection`), `align_corners` (false) |
//! | `layer_norm` | x, scale, bias? | `axis` (required), `epsilon` (1e-5) |
//! | `max_pool2d` | x | `kernel` (required), `strides` ([1, 1]), `pads` ([0, 0, 0, 0]), `dilations` ([1, 1]), `ceil_mode` (false), `layout` (row_major: the result's layout) |
//! | `avg_pool2d` | x | as `max_pool2d`, then `count_include_pad` (false) |
//! | `global_avg_pool` | x | — |
//! | `flatten` | x | `axis` (1) |
//! | `reshape` | x | `shape` (required) |
//! | `transpose` | x (any type, as every data-movement op) | `perm` (required) |
//! | `slice` | x | `starts`, `ends` (required), `steps` (all 1) |
//! | `expand` | x | `shape` (required) |
//! | `tile` | x | `repeats` (required) |
//! | `pad` | x, fill? (one element of x's type; 0 without) | `pads` (required: every axis's begin, then every end; negative crops), `mode` (`constant`; `reflect`, `edge`, `wrap`) |
//! | `matmul` | a, b | — |
//! | `gemm` | a, b, c? | `alpha` (1.0), `beta` (1.0), `trans_a` (false), `trans_b` (false) |
//! | `concat` | x, ... | `axis` (required) |
//! | `softmax` | x | `axis` (required) |
//! | `reorder` | x | `layout` (required) |
//! | `bn_fold_weight` | w, scale, var | `epsilon` (1e-5) |
//! | `bn_fold_bias` | scale, bias, mean, var, conv_bias? | `epsilon` (1e-5) |
//!
//! Unknown attributes and missing required ones are errors that name the attribute.
//!
//! ## Fused ops
//!
//! ```text
//! %5 = fused conv2d %x, %w, %b {pads = [1, 1, 1, 1]} post [add(_, %skip), relu, clip {min = 0.0, max = 6.0}, sub(%y, _)] : tensor<1x64x56x56xf32>
//! ```
//!
//! `fused ANCHOR OPERANDS {ANCHOR_ATTRS} post [POST_OPS] : T`. The anchor is `conv2d`,
//! `gemm`, `matmul`, `layer_norm`, `max_pool2d`, `avg_pool2d` or `global_avg_pool`. Post-ops
//! apply in order to the accumulator: a unary op is written `relu` or
//! `clip {min = 0.0, max = 6.0}`; a binary op names its second operand and marks the
//! accumulator with `_`: `add(_, %v)` is `acc + v`, `sub(%v, _)` is `v - acc`. The
//! post-ops' operands are the fused op's operands after the anchor's own, in order.
//!
//! ## Locations
//!
//! Every instruction parsed from text carries `"file":line:col` of its result name. An
//! optional trailing `loc(...)` overrides it, and the printer writes one after every
//! instruction (and function signature) when [`PrintOptions::print_loc`] is set:
//! `loc("f.tir":3:8)`, `loc("onnx_node_name")`, `loc(fused["a", "b":2:3])`,
//! `loc(unknown)`.
//!
//! ## Weights
//!
//! Weights are f32. `dense<[...]>` lists the logical elements in row-major order (nested
//! brackets are allowed and flattened; the count must match the type); `dense<v>` fills
//! every element with `v`. `random<seed = S, min = A, max = B>` is the deterministic
//! generator [`crate::weights::random_f32`]. `external<"file", "key">` reads an f32
//! tensor of the same shape from a safetensors file relative to the `.tir` file's
//! directory. Weights with a blocked layout are written by their logical values too;
//! padding lanes are zero. Weights print in id order before the functions: inline data as
//! `dense`, random and external weights as written, weights computed by passes as
//! `dense` (or, through [`write_module`], more than 16 elements go to a sidecar
//! `<stem>.safetensors`). With [`PrintOptions::elide_weights`], weights of more than 16
//! elements print as `elided<"content-hash">`, which the parser refuses to load.
//!
//! ## Errors
//!
//! Every problem is a [`Diagnostic`] with a stable code — `parse-error`, `bad-encoding`,
//! `bad-type`, `too-large`, `too-deep`, `unknown-op`, `wrong-arity`, `bad-attribute`,
//! `undefined-value`, `redefined-value`, `duplicate-name`, `unknown-weight`,
//! `bad-weight`, `elided-weight`, `bad-fused-op`, `type-mismatch`, `io-error`,
//! `too-many-errors` (the parse stops after 20) — and the
//! file:line:col of the offending token; [`Diagnostic::render`] shows the line with a
//! caret. A parsed module has always passed [`crate::verify::verify_module`].

mod attr_dict;
mod attrs;
mod lexer;
mod parser;
mod printer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use crate::diag::{quote, Diagnostic, Diagnostics, Location};
use crate::graph::{Func, Module};
use crate::tensor::Tensor;
use crate::types::Layout;
use crate::weights::{WeightOrigin, SMALL_CONSTANT_LIMIT};

pub use attr_dict::MAX_ATTR_INT;
pub(crate) use attr_dict::{AttrDict, AttrError};
pub(crate) use attrs::{AttrSchema, AttrType, Printed};
pub use attrs::{
    DEFAULT_EPSILON, DEFAULT_FLATTEN_AXIS, DEFAULT_HARD_SIGMOID_ALPHA, DEFAULT_HARD_SIGMOID_BETA,
    DEFAULT_LEAKY_ALPHA,
};
pub use parser::{MAX_ERRORS, MAX_NESTING};

/// Builds op `name` from attributes written as the body of a text-form attribute
/// dictionary (`epsilon = 1.0e-3, axis = 1`, no braces): the one attribute schema of the
/// text form — keys, types, defaults and required keys — shared with the rule language.
/// `Err` gives the message and the byte offset in `attributes` it is about.
pub fn op_from_attributes(name: &str, attributes: &str) -> Result<crate::op::Op, (String, usize)> {
    parser::op_from_attributes(name, attributes)
}

/// The attributes of `op` that differ from their defaults as the body of a text-form
/// attribute dictionary (`min = 0.0, max = 6.0`; empty when all are defaults), which
/// [`op_from_attributes`] reads back.
pub fn attributes_text(op: &crate::op::Op) -> String {
    let body: Vec<String> = attrs::op_attrs(op, 4)
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    body.join(", ")
}

/// How to print a module.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrintOptions {
    /// Append ` loc(...)` to every instruction and function signature.
    pub print_loc: bool,
    /// Print every weight of more than 16 elements as `elided<"hash">` (not loadable).
    pub elide_weights: bool,
}

/// Limits and permissions for reading a `.tir` file and the sidecars it names.
#[derive(Clone, Debug, Default)]
pub struct ParseOptions {
    /// One more folder `external<...>` sidecars may be read from, besides the `.tir`
    /// file's own folder (after resolving symlinks); `None`: only that folder.
    pub allowed_root: Option<PathBuf>,
    /// The memory budget the module's weights must fit in (see [`crate::budget`]);
    /// `None`: the machine's default.
    pub memory_budget: Option<u64>,
}

/// The largest `.tir` file read: 1 GiB of text (weights too large for that belong in a
/// sidecar).
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

/// Parses text held in memory. `external<...>` weights are an error here (there is no
/// directory to read them from): use [`parse_with`] or [`parse_file`] for those.
/// `file` names the source in locations and diagnostics.
pub fn parse(src: &str, file: &str) -> Result<Module, Diagnostics> {
    parse_with(src, file, None)
}

/// Parses text held in memory, reading `external<...>` sidecars relative to `base_dir`.
/// The returned module has passed the verifier.
pub fn parse_with(src: &str, file: &str, base_dir: Option<&Path>) -> Result<Module, Diagnostics> {
    parser::parse_module(src, file, base_dir, &ParseOptions::default())
}

/// Parses raw bytes, which must be UTF-8: invalid bytes are a `bad-encoding` diagnostic
/// at their line and column.
pub fn parse_bytes(
    bytes: &[u8],
    file: &str,
    base_dir: Option<&Path>,
) -> Result<Module, Diagnostics> {
    parse_bytes_with(bytes, file, base_dir, &ParseOptions::default())
}

/// [`parse_bytes`] with the limits and permissions of `opts`.
pub fn parse_bytes_with(
    bytes: &[u8],
    file: &str,
    base_dir: Option<&Path>,
    opts: &ParseOptions,
) -> Result<Module, Diagnostics> {
    match std::str::from_utf8(bytes) {
        Ok(src) => parser::parse_module(src, file, base_dir, opts),
        Err(e) => {
            let valid = &bytes[..e.valid_up_to()];
            let prefix = std::str::from_utf8(valid).unwrap_or("");
            let map = lexer::SourceMap::new(prefix, file);
            let bad = bytes.get(e.valid_up_to()).copied().unwrap_or(0);
            Err(Diagnostic::error(
                "bad-encoding",
                format!("the file is not valid UTF-8: byte 0x{bad:02x} cannot start or continue a character"),
                map.loc(prefix.len()),
            )
            .with_note(".tir files are UTF-8 text")
            .into())
        }
    }
}

/// Reads and parses a `.tir` file; `external<...>` sidecars are read from its directory.
pub fn parse_file(path: &Path) -> Result<Module, Diagnostics> {
    parse_file_with(path, &ParseOptions::default())
}

/// Reads and parses a `.tir` file — a regular file of at most [`MAX_TEXT_BYTES`] —
/// with `external<...>` sidecars confined to its folder (or `opts.allowed_root`) and
/// weights within `opts.memory_budget`.
pub fn parse_file_with(path: &Path, opts: &ParseOptions) -> Result<Module, Diagnostics> {
    let bytes = crate::files::read_regular(path, MAX_TEXT_BYTES).map_err(|e| {
        Diagnostic::error(
            "io-error",
            format!("cannot read {}: {e}", path.display()),
            Location::Unknown,
        )
    })?;
    parse_bytes_with(&bytes, &path.display().to_string(), path.parent(), opts)
}

/// Prints a module canonically: byte-identical for equal modules, and parsing the text
/// gives the module back (locations aside, unless `print_loc` is set).
pub fn print(module: &Module, opts: &PrintOptions) -> String {
    printer::print_module(module, opts, &BTreeMap::new())
}

/// Prints one function of `module` (without the module's weight declarations).
pub fn print_func(module: &Module, func: &Func, opts: &PrintOptions) -> String {
    printer::print_func(module, func, opts)
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> Diagnostic {
    Diagnostic::error(
        "io-error",
        format!("cannot write {}: {e}", path.display()),
        Location::Unknown,
    )
}

/// Writes `module` to `tir_path`. Weights computed by passes with more than 16 elements
/// go to a safetensors sidecar `<stem>.safetensors` beside it (keyed by weight name, in
/// logical row-major order) and print as `external<...>`; weights already external to
/// that same sidecar are written into it again so nothing is lost when overwriting.
pub fn write_module(
    module: &Module,
    tir_path: &Path,
    opts: &PrintOptions,
) -> Result<(), Diagnostic> {
    let stem = tir_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "weights".into());
    let sidecar_name = format!("{stem}.safetensors");
    // key -> logical values, and the overrides for the printer
    let mut entries: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    let mut overrides = printer::ExternalOverrides::new();
    let big = |n: usize| n > SMALL_CONSTANT_LIMIT;
    let logical = |w: &crate::weights::Weight| -> Vec<u8> {
        let values = match w.ty.layout {
            Layout::RowMajor => w.f32s().to_vec(),
            Layout::Blocked { .. } => Tensor {
                ty: w.ty.clone(),
                data: w.f32s().to_vec().into(),
            }
            .f32s_row_major(),
        };
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    };
    let elided = |n: usize| opts.elide_weights && big(n);
    for (_, w) in module.weights.iter() {
        if let WeightOrigin::External { file, key } = &w.origin {
            if *file == sidecar_name && !elided(w.ty.num_elements()) {
                entries.insert(key.clone(), (w.ty.dims.clone(), logical(w)));
            }
        }
    }
    for (id, w) in module.weights.iter() {
        // Sidecars hold f32 tensors; i64 weights stay inline as integer lists.
        if w.origin == WeightOrigin::Computed
            && w.ty.dtype == crate::types::DType::F32
            && big(w.ty.num_elements())
            && !elided(w.ty.num_elements())
        {
            let mut key = w.name.clone();
            let mut k = 1;
            while entries.contains_key(&key) {
                key = format!("{}_{k}", w.name);
                k += 1;
            }
            entries.insert(key.clone(), (w.ty.dims.clone(), logical(w)));
            overrides.insert(id, (sidecar_name.clone(), key));
        }
    }
    if !overrides.is_empty() {
        let mut views = Vec::new();
        for (key, (dims, bytes)) in &entries {
            let view = TensorView::new(Dtype::F32, dims.clone(), bytes)
                .map_err(|e| io_error(tir_path, format!("sidecar tensor {}: {e}", quote(key))))?;
            views.push((key.clone(), view));
        }
        let data = safetensors::serialize(views, None).map_err(|e| io_error(tir_path, e))?;
        let sidecar_path = tir_path.with_file_name(&sidecar_name);
        std::fs::write(&sidecar_path, data).map_err(|e| io_error(&sidecar_path, e))?;
    }
    let text = printer::print_module(module, opts, &overrides);
    std::fs::write(tir_path, text).map_err(|e| io_error(tir_path, e))
}

#[cfg(test)]
mod tests;
