//! Importing a model with its dynamic dimensions kept as symbols (issue #23): a graph
//! input's `dim_param` becomes a symbol of that name, and a `-1`, an empty `dim_param` or
//! an unset dimension a fresh one (`?1`, `?2`, ... in input order).
//!
//! The importer computes with known sizes: it folds shape programs, resolves `-1` in
//! reshape targets and picks ops by shape. So the model is imported at two sets of
//! sizes for its symbols, and the two modules must be the same but for their types and
//! their size attributes: the same instructions, the same constants. A size attribute
//! that differs is explained as a symbolic size (a size the module already has, a
//! product of the operand's dims, what a reshape's other entries leave, a resize by
//! scales as `floor(input · scale)`). Then nothing the importer decided depended on
//! those sizes, and the symbolic module is the first one with its parameters' types
//! symbolic and every type inferred again by the type rules. Where a rule refuses two
//! sizes that agree at both imports (an FPN's upsampling against its lateral), their
//! symbols are taken as multiples of 2, 4, ... 32, named for it (`32*"height/32"`). A
//! third import, with a batch of 1 and odd sizes (odd multiples), where rounding shows,
//! is checked to be that module specialized there. A model whose import depends on a
//! size otherwise (a constant folded from the sequence length) is the usual pin-it error
//! with a note naming the first node that differs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use smelt_ir::op::Dim;
use smelt_ir::symbolic::{specialize, Bindings, Name};
use smelt_ir::{Diagnostic, Diagnostics, Func, Inst, Module, Op, Param, TensorType};

use super::{decode_file, DecodedModel, ImportOptions, InputDim};

/// One dynamic dimension of a graph input and the symbol it is.
struct SymbolicDim {
    input: String,
    axis: usize,
    symbol: Arc<str>,
}

/// The sizes a symbol takes in the three imports: a batch (a symbol only ever on the
/// leading axis) small, anything else (image sides, sequence lengths) a multiple of 32
/// in the two that are unified, so strided stages divide it, with every symbol of one
/// import at a different size. The checking import takes a batch of 1 and odd sizes:
/// what depends on rounding (a strided stage's `(H + 1) / 2` against `H / 2`, a resize's
/// scale of its size over its input's) shows there.
fn sizes_of(symbol_index: usize, leading_only: bool) -> [usize; 3] {
    if leading_only {
        [3 + 4 * symbol_index, 5 + 4 * symbol_index, 1]
    } else {
        let step = 64 * symbol_index;
        [224 + step, 288 + step, 161 + step]
    }
}

fn symbolic_error(message: String) -> crate::Error {
    crate::Error::Onnx(Diagnostics(vec![Diagnostic::error(
        "onnx-symbolic",
        message,
        smelt_ir::Location::Unknown,
    )]))
}

/// Imports the model at `path` with its dynamic dimensions as symbols (the inputs
/// `opts.input_shapes` pins keep their sizes). A model without dynamic dimensions
/// imports as [`super::import_file`] does.
pub fn import_file_symbolic(path: &Path, opts: &ImportOptions) -> Result<Module, crate::Error> {
    import_symbolic(&decode_file(path, opts)?, opts)
}

/// [`import_file_symbolic`] of a model already decoded (a [`DynamicExecutable`]'s, which
/// imports it again at each bucket's sizes where the symbolic import fails).
///
/// [`DynamicExecutable`]: crate::dynamic::DynamicExecutable
fn import_symbolic(decoded: &DecodedModel, opts: &ImportOptions) -> Result<Module, crate::Error> {
    try_import_symbolic(decoded, opts).map_err(|why| {
        // the import with the sizes left dynamic names them and the option that pins
        // them; why they cannot stay symbolic is its note
        let reason = match &why {
            crate::Error::Onnx(Diagnostics(d)) if !d.is_empty() => d[0].message.clone(),
            other => other.to_string(),
        };
        match decoded.import(opts) {
            Err(crate::Error::Onnx(Diagnostics(mut diags))) if !diags.is_empty() => {
                diags[0]
                    .notes
                    .push(format!("they cannot stay symbolic: {reason}"));
                crate::Error::Onnx(Diagnostics(diags))
            }
            _ => why,
        }
    })
}

/// [`import_symbolic`], its error why the sizes cannot stay symbolic (a difference
/// between the imports, a type rule's refusal), not what pinning them takes.
pub(crate) fn try_import_symbolic(
    decoded: &DecodedModel,
    opts: &ImportOptions,
) -> Result<Module, crate::Error> {
    let declared = decoded.declared_inputs(opts)?;
    let mut dims = Vec::new();
    let mut names: Vec<Arc<str>> = Vec::new();
    let mut fresh = 0;
    for input in &declared {
        if opts.input_shapes.contains_key(&input.name) {
            continue;
        }
        for (axis, d) in input.dims.iter().flatten().enumerate() {
            if let InputDim::Dynamic(param) = d {
                let symbol: Arc<str> = if param.is_empty() {
                    fresh += 1;
                    format!("?{fresh}").into()
                } else {
                    param.as_str().into()
                };
                if !names.contains(&symbol) {
                    names.push(symbol.clone());
                }
                dims.push(SymbolicDim {
                    input: input.name.clone(),
                    axis,
                    symbol,
                });
            }
        }
    }
    if dims.is_empty() {
        return decoded.import(opts);
    }
    let values: BTreeMap<Arc<str>, [usize; 3]> = names
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let leading_only = dims.iter().all(|d| &d.symbol != s || d.axis == 0);
            (s.clone(), sizes_of(i, leading_only))
        })
        .collect();
    // each import's pins: the caller's, and every dynamic input at that import's sizes
    type Values = BTreeMap<Arc<str>, [usize; 3]>;
    let pins = |values: &Values, which: usize| -> BTreeMap<String, Vec<usize>> {
        let mut out = opts.input_shapes.clone();
        for input in &declared {
            let Some(declared) = &input.dims else {
                continue;
            };
            if out.contains_key(&input.name) {
                continue;
            }
            let shape = declared
                .iter()
                .enumerate()
                .map(|(axis, d)| match d {
                    InputDim::Fixed(n) => *n,
                    InputDim::Dynamic(_) => {
                        let slot = dims
                            .iter()
                            .find(|s| s.input == input.name && s.axis == axis);
                        slot.map_or(1, |s| values[&s.symbol][which])
                    }
                })
                .collect();
            out.insert(input.name.clone(), shape);
        }
        out
    };
    let at = |values: &Values, which: usize| -> String {
        let parts: Vec<String> = values
            .iter()
            .map(|(s, v)| format!("{} = {}", Name(s), v[which]))
            .collect();
        parts.join(", ")
    };
    let import_at = |values: &Values, which: usize| {
        decoded.import(&ImportOptions {
            input_shapes: pins(values, which),
            ..opts.clone()
        })
    };
    {
        let first = import_at(&values, 0)?;
        let second = import_at(&values, 1)?;
        let resizes_to_sizes = decoded.resizes_to_sizes();
        let batch_like = |s: &Arc<str>| dims.iter().all(|d| &d.symbol != s || d.axis == 0);
        // each symbol's multiple: 1, or the power of two a type rule needed it to be
        let mut multiples: BTreeMap<Arc<str>, usize> = BTreeMap::new();
        let symbolic = loop {
            let stand_for = |s: &Arc<str>| SymbolIn::new(s, multiples.get(s).copied().unwrap_or(1));
            let dims_of: BTreeMap<Arc<str>, SymbolIn> =
                values.keys().map(|s| (s.clone(), stand_for(s))).collect();
            let bindings = |which: usize| -> Bindings {
                values
                    .iter()
                    .map(|(s, v)| (dims_of[s].name.clone(), v[which] / dims_of[s].multiple))
                    .collect()
            };
            match unify(
                &first,
                &second,
                &dims,
                &dims_of,
                &[(at(&values, 0), bindings(0)), (at(&values, 1), bindings(1))],
                &resizes_to_sizes,
            ) {
                Ok(m) => break m,
                Err(Unify::Sizes(symbols, e)) => {
                    // sizes that agree at both imports but not for every value of their
                    // symbols (an FPN's upsampled `2*((H + 31) / 32)` against its lateral's
                    // `(H + 15) / 16`): take the symbols as multiples of twice as much,
                    // up to 32, which the imports' sizes are
                    let mut refined = false;
                    for s in symbols.iter().filter(|s| !batch_like(s)) {
                        let m = multiples.entry(s.clone()).or_insert(1);
                        if *m < 32 {
                            *m *= 2;
                            refined = true;
                        }
                    }
                    if !refined {
                        return Err(e);
                    }
                }
                Err(Unify::Other(e)) => return Err(e),
            }
        };
        // a third import, at a batch of 1 and odd sizes (odd multiples), is that module
        // specialized there
        let mut values = values.clone();
        for (s, m) in &multiples {
            if let Some(v) = values.get_mut(s) {
                // an odd multiple
                v[2] = m * ((v[2] / m) | 1);
            }
        }
        let third = import_at(&values, 2)?;
        let specialized = specialize(&symbolic, &pins(&values, 2)).map_err(|d| {
            symbolic_error(format!(
                "the model imported with symbolic sizes does not specialize at {}: {d}",
                at(&values, 2)
            ))
        })?;
        compare_structure(&specialized, &third, &at(&values, 2))?;
        Ok(symbolic)
    }
}

/// How a model's symbol stands in the module: itself, or a multiple of a symbol named
/// for it (`"height/32"`, when the type rules need `height` a multiple of 32).
struct SymbolIn {
    name: Arc<str>,
    multiple: usize,
}

impl SymbolIn {
    fn new(symbol: &Arc<str>, multiple: usize) -> SymbolIn {
        let name = match multiple {
            1 => symbol.clone(),
            m => format!("{symbol}/{m}").into(),
        };
        SymbolIn { name, multiple }
    }

    /// The input dimension it declares: `symbol` or `multiple*name`.
    fn dim(&self) -> Dim {
        Dim::symbol(&self.name) * self.multiple
    }
}

/// Why two imports did not unify: a type rule refused sizes over these (model) symbols,
/// or anything else.
enum Unify {
    Sizes(BTreeSet<Arc<str>>, crate::Error),
    Other(crate::Error),
}

impl From<crate::Error> for Unify {
    fn from(e: crate::Error) -> Unify {
        Unify::Other(e)
    }
}

/// The symbolic module of two imports that differ only in their sizes, each model
/// symbol standing as `dims_of` says.
fn unify(
    a: &Module,
    b: &Module,
    dims: &[SymbolicDim],
    dims_of: &BTreeMap<Arc<str>, SymbolIn>,
    [(at_a, bind_a), (at_b, bind_b)]: &[(String, Bindings); 2],
    resizes_to_sizes: &BTreeSet<String>,
) -> Result<Module, Unify> {
    let (fa, fb) = match (a.entry(), b.entry()) {
        (Some(fa), Some(fb)) => (fa, fb),
        _ => {
            return Err(Unify::Other(symbolic_error(
                "the imported model has no entry function".into(),
            )))
        }
    };
    let differs = |what: String| {
        Unify::Other(symbolic_error(format!(
            "{what} at {at_a} and at {at_b}: the import depends on those sizes, so the model \
             imports with its input shapes pinned only"
        )))
    };
    if fa.insts.len() != fb.insts.len() || fa.params.len() != fb.params.len() {
        return Err(differs(format!(
            "the model imports as {} instructions and as {}",
            fa.insts.len(),
            fb.insts.len()
        )));
    }
    let params: Vec<Param> = fa
        .params
        .iter()
        .map(|p| {
            let mut stored = p.ty.dims.clone();
            for d in dims.iter().filter(|d| d.input == p.name) {
                stored[d.axis] = dims_of[&d.symbol].dim().stored();
            }
            Param {
                name: p.name.clone(),
                ty: TensorType {
                    dims: stored,
                    ..p.ty.clone()
                },
            }
        })
        .collect();
    let mut types: Vec<TensorType> = params.iter().map(|p| p.ty.clone()).collect();
    // the distinct symbolic sizes so far, in definition order: what a size attribute
    // that differs between the imports is first matched against
    let mut known: Vec<Dim> = Vec::new();
    for t in &types {
        note_symbolic_sizes(&mut known, t);
    }
    let mut insts = Vec::with_capacity(fa.insts.len());
    for (ia, ib) in fa.insts.iter().zip(&fb.insts) {
        let node = &ia.loc;
        let op = if ia.op == ib.op {
            Some(ia.op.clone())
        } else {
            let operand = ia.operands.first().map(|v| &types[v.index()]);
            let to_sizes = match &ia.loc {
                smelt_ir::Location::Name(n) => resizes_to_sizes.contains(&**n),
                _ => false,
            };
            explain_sizes(&ia.op, &ib.op, &known, operand, to_sizes, [bind_a, bind_b])
        };
        let Some(op) = op.filter(|_| ia.operands == ib.operands) else {
            return Err(differs(format!(
                "node {node} imports as '{}' {{{}}} and as '{}' {{{}}}",
                ia.op.name(),
                smelt_ir::text::attributes_text(&ia.op),
                ib.op.name(),
                smelt_ir::text::attributes_text(&ib.op)
            )));
        };
        if let smelt_ir::Op::Const(w) = ia.op {
            let same = match (a.weights.get(w), b.weights.get(w)) {
                (Some(x), Some(y)) => x.ty == y.ty && x.data.as_bytes() == y.data.as_bytes(),
                _ => false,
            };
            if !same {
                return Err(differs(format!(
                    "node {node} folds to a constant of other values or shape"
                )));
            }
        }
        let operand_types: Vec<&TensorType> =
            ia.operands.iter().map(|v| &types[v.index()]).collect();
        let ty = op
            .infer_type(&operand_types, &|id| a.weights.type_of(id))
            .map_err(|why| {
                // the model symbols the operands' sizes read
                let read: BTreeSet<Arc<str>> =
                    operand_types.iter().flat_map(|t| t.symbols()).collect();
                let symbols = dims_of
                    .iter()
                    .filter(|(_, s)| read.contains(&s.name))
                    .map(|(symbol, _)| symbol.clone())
                    .collect();
                Unify::Sizes(
                    symbols,
                    symbolic_error(format!(
                        "node {node}: '{}' does not take the symbolic sizes: {why}",
                        ia.op.name()
                    )),
                )
            })?;
        note_symbolic_sizes(&mut known, &ty);
        types.push(ty.clone());
        insts.push(Inst {
            op,
            operands: ia.operands.clone(),
            ty,
            loc: ia.loc.clone(),
        });
    }
    let func = Func {
        name: fa.name.clone(),
        params,
        insts,
        results: fa.results.clone(),
        loc: fa.loc.clone(),
    };
    let mut out = a.clone();
    out.funcs = vec![func];
    smelt_ir::verify::verify_module(&out).map_err(|d| Unify::Other(crate::Error::Onnx(d)))?;
    Ok(out)
}

/// Adds `t`'s symbolic sizes not in `known` yet to it.
fn note_symbolic_sizes(known: &mut Vec<Dim>, t: &TensorType) {
    for d in Dim::all(&t.dims) {
        if d.is_symbolic() && !known.contains(&d) {
            known.push(d);
        }
    }
}

/// The value of `d` at `bindings`, if it has one.
fn value_at(d: Dim, bindings: &Bindings) -> Option<usize> {
    let v = d
        .expr()?
        .eval(&|s| bindings.get(s).map(|&v| v as i64))
        .ok()?;
    usize::try_from(v).ok()
}

/// `a` (an op imported at the first sizes) with the result sizes in which it differs
/// from `b` (the same op at the second sizes, [`Op::result_sizes`]) as symbolic sizes,
/// when each is explained. A resize by `scales` has ONNX's `floor(input · scale)`; a
/// reshape's, an expand's or (`to_sizes`) a resize's by a `sizes` input is one of
/// `known` (the symbolic sizes so far, in definition order: a resize to another
/// tensor's size, a reshape keeping the batch), the product of a run of the operand's
/// dims (a reshape merging them), or, for one entry of a reshape, what the others leave
/// of the element count. `None` when the ops differ otherwise or a size is not
/// explained.
fn explain_sizes(
    a: &Op,
    b: &Op,
    known: &[Dim],
    operand: Option<&TensorType>,
    to_sizes: bool,
    [bind_a, bind_b]: [&Bindings; 2],
) -> Option<Op> {
    let (sizes_a, sizes_b) = (a.result_sizes()?, b.result_sizes()?);
    if sizes_a.len() != sizes_b.len()
        || a.with_result_sizes(Vec::new()) != b.with_result_sizes(Vec::new())
    {
        return None;
    }
    let explains = |k: usize, d: Dim| {
        value_at(d, bind_a) == Some(sizes_a[k]) && value_at(d, bind_b) == Some(sizes_b[k])
    };
    let sizes: Vec<Dim> = match (a, to_sizes) {
        (Op::Resize(r), false) => scaled_sizes(&r.scales, operand?)?,
        _ => {
            let runs = operand
                .map(|x| run_products(&Dim::all(&x.dims)))
                .unwrap_or_default();
            let mut out: Vec<Option<Dim>> = (0..sizes_a.len())
                .map(|k| match sizes_a[k] == sizes_b[k] {
                    true => Some(Dim::known(sizes_a[k])),
                    false => known.iter().chain(&runs).copied().find(|&d| explains(k, d)),
                })
                .collect();
            let unexplained: Vec<usize> = (0..out.len()).filter(|&k| out[k].is_none()).collect();
            if let ([k], Op::Reshape { .. }, Some(x)) = (unexplained.as_slice(), a, operand) {
                // the entry a reshape's -1 resolved: the element count over the others
                let others = out
                    .iter()
                    .flatten()
                    .try_fold(1usize, |p, d| p.checked_mul(d.known_size()?))?;
                let total = Dim::product(&Dim::all(&x.dims))?;
                if others > 0 && total.divisible_by(others) {
                    out[*k] = Some(total.floor_div(others));
                }
            }
            out.into_iter().collect::<Option<_>>()?
        }
    };
    if !(0..sizes.len()).all(|k| explains(k, sizes[k])) {
        return None;
    }
    let mut op = a.with_result_sizes(Dim::stored_all(&sizes))?;
    if let (Op::Resize(r), true, Some(x)) = (&mut op, to_sizes, operand) {
        // a resize to sizes scales by the size over the input's (the `stretch` policy):
        // 0 says so where either is symbolic, and the imported scale must be that ratio
        for (k, s) in r.scales.iter_mut().enumerate() {
            let input = Dim::from_stored(x.dims[k]);
            if !sizes[k].is_symbolic() && !input.is_symbolic() {
                continue;
            }
            let ratio = (sizes_a[k] as f64 / value_at(input, bind_a)? as f64) as f32;
            if ratio != s.0 {
                return None;
            }
            *s = smelt_ir::F32(0.0);
        }
    }
    Some(op)
}

/// A resize's sizes by its scales, `floor(input · scale)`, each scale a ratio of small
/// integers.
fn scaled_sizes(scales: &[smelt_ir::F32], x: &TensorType) -> Option<Vec<Dim>> {
    scales
        .iter()
        .zip(&x.dims)
        .map(|(s, &d)| {
            let q = (1..=64u32).find(|&q| {
                let p = s.0 as f64 * q as f64;
                (p - p.round()).abs() < 1e-6
            })?;
            let p = (s.0 as f64 * q as f64).round() as usize;
            Some((Dim::from_stored(d) * p).floor_div(q as usize))
        })
        .collect()
}

/// The products of every run of two or more consecutive `dims`.
fn run_products(dims: &[Dim]) -> Vec<Dim> {
    (0..dims.len())
        .flat_map(|start| (start + 2..=dims.len()).map(move |end| (start, end)))
        .filter_map(|(start, end)| Dim::product(&dims[start..end]))
        .collect()
}

/// `Ok` when `specialized` has `imported`'s instructions and types.
fn compare_structure(
    specialized: &Module,
    imported: &Module,
    at: &str,
) -> Result<(), crate::Error> {
    let (fs, fi) = match (specialized.entry(), imported.entry()) {
        (Some(fs), Some(fi)) => (fs, fi),
        _ => {
            return Err(symbolic_error(
                "the imported model has no entry function".into(),
            ))
        }
    };
    let same_len = fs.insts.len() == fi.insts.len();
    let first_difference = fs
        .insts
        .iter()
        .zip(&fi.insts)
        .find(|(s, i)| s.op != i.op || s.operands != i.operands || s.ty != i.ty);
    match (same_len, first_difference) {
        (true, None) => Ok(()),
        (_, Some((s, i))) => Err(symbolic_error(format!(
            "at {at}, node {} imports as '{}' of type {} but the symbolic module gives \
             '{}' of type {}: the import depends on the sizes",
            i.loc,
            i.op.name(),
            i.ty,
            s.op.name(),
            s.ty
        ))),
        (false, None) => Err(symbolic_error(format!(
            "at {at} the model imports as {} instructions, the symbolic module has {}",
            fi.insts.len(),
            fs.insts.len()
        ))),
    }
}
