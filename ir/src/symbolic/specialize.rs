//! Binding symbols to sizes from the inputs' shapes, and specializing a function at
//! them: every type inferred again from the bound parameter types, so a specialized
//! function is exactly what its type rules give at those sizes.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::diag::{Diagnostic, Diagnostics};
use crate::graph::{Func, Inst, Module, Param};
use crate::op::{Dim, Op};
use crate::types::TensorType;

/// The value of each symbol, by name.
pub type Bindings = BTreeMap<Arc<str>, usize>;

/// Where a symbol got its value: an input and one of its dimensions.
struct Source<'a> {
    input: &'a str,
    axis: usize,
}

/// The symbols' values given by `shapes` (input name → dims) for `f`'s parameters.
///
/// Every parameter with a symbolic type needs a shape; a parameter of known type may be
/// given one, which must then match it. A dimension that is one symbol binds it; inputs
/// that share a symbol must agree on its value; a dimension that is an expression (`2*N`)
/// is checked once every symbol is bound. The error names the input, the dimension and
/// the symbol.
pub fn bind_symbols(f: &Func, shapes: &BTreeMap<String, Vec<usize>>) -> Result<Bindings, String> {
    if let Some(name) = shapes
        .keys()
        .find(|n| !f.params.iter().any(|p| &p.name == *n))
    {
        let names: Vec<String> = f.params.iter().map(|p| format!("%{}", p.name)).collect();
        return Err(format!(
            "@{} has no input named %{name} (its inputs: {})",
            f.name,
            names.join(", ")
        ));
    }
    let mut bindings = Bindings::new();
    let mut sources: BTreeMap<Arc<str>, Source> = BTreeMap::new();
    let mut deferred = Vec::new();
    for p in &f.params {
        let Some(shape) = shapes.get(&p.name) else {
            if p.ty.is_symbolic() {
                return Err(format!(
                    "input %{} of @{} has symbolic dims {}: give its shape",
                    p.name, f.name, p.ty
                ));
            }
            continue;
        };
        if shape.len() != p.ty.rank() {
            return Err(format!(
                "input %{} has rank {}, but @{} declares {}",
                p.name,
                shape.len(),
                f.name,
                p.ty
            ));
        }
        for (axis, (&stored, &size)) in p.ty.dims.iter().zip(shape).enumerate() {
            if Dim::known(size).is_symbolic() {
                return Err(format!(
                    "input %{} dimension {axis} is {size}: too large to be a size",
                    p.name
                ));
            }
            let d = Dim::from_stored(stored);
            if let Some(n) = d.known_size() {
                if n != size {
                    return Err(format!(
                        "input %{} dimension {axis} is {size}, but @{} declares {}",
                        p.name, f.name, p.ty
                    ));
                }
                continue;
            }
            let Some(e) = d.symbolic() else {
                return Err(format!(
                    "input %{} dimension {axis} has an unrepresentable size",
                    p.name
                ));
            };
            let Some(symbol) = e.as_symbol() else {
                deferred.push((p, axis, size, e));
                continue;
            };
            match bindings.get(symbol) {
                Some(&bound) if bound != size => {
                    let first = &sources[symbol];
                    return Err(format!(
                        "input %{} dimension {axis} is {size}, but input %{} dimension {} \
                         made {} = {bound}: the two share that symbol",
                        p.name,
                        first.input,
                        first.axis,
                        super::Name(symbol)
                    ));
                }
                Some(_) => {}
                None => {
                    bindings.insert(symbol.clone(), size);
                    sources.insert(
                        symbol.clone(),
                        Source {
                            input: &p.name,
                            axis,
                        },
                    );
                }
            }
        }
    }
    // a dimension that is an expression of one symbol no other input gives binds it when
    // the expression is linear in it (`32*"height/32"` takes multiples of 32); others wait
    // for the symbols the rest bind
    let mut waiting = deferred;
    while !waiting.is_empty() {
        let before = waiting.len();
        let mut still = Vec::new();
        for (p, axis, size, e) in waiting {
            let mut symbols = std::collections::BTreeSet::new();
            e.symbols_into(&mut symbols);
            let unbound: Vec<Arc<str>> = symbols
                .into_iter()
                .filter(|s| !bindings.contains_key(s))
                .collect();
            match unbound.as_slice() {
                [] => {
                    let value = e.eval(&|s| bindings.get(s).map(|&v| v as i64))?;
                    if value != size as i64 {
                        return Err(format!(
                            "input %{} dimension {axis} is {size}, but {e} = {value} at {}",
                            p.name,
                            bindings_text(&bindings)
                        ));
                    }
                }
                [symbol] => {
                    let at = |t: i64| {
                        e.eval(&|s| match bindings.get(s) {
                            Some(&v) => Some(v as i64),
                            None => (s == &**symbol).then_some(t),
                        })
                    };
                    let (b, a) = (at(0)?, at(1)? - at(0)?);
                    let t = (a > 0 && (size as i64 - b) % a == 0)
                        .then(|| (size as i64 - b) / a)
                        .filter(|&t| t >= 0);
                    match t {
                        Some(t) if at(t)? == size as i64 => {
                            bindings.insert(symbol.clone(), t as usize);
                            sources.insert(
                                symbol.clone(),
                                Source {
                                    input: &p.name,
                                    axis,
                                },
                            );
                        }
                        _ => {
                            return Err(format!(
                                "input %{} dimension {axis} is {size}, but @{} takes {e} there: \
                                 no size of {} gives {size}",
                                p.name,
                                f.name,
                                super::Name(symbol)
                            ))
                        }
                    }
                }
                _ => still.push((p, axis, size, e)),
            }
        }
        if still.len() == before {
            let (p, axis, _, e) = &still[0];
            return Err(format!(
                "input %{} dimension {axis} is {e}, which no input gives alone",
                p.name
            ));
        }
        waiting = still;
    }
    Ok(bindings)
}

/// `N = 2, S = 128`: bindings for messages.
pub(crate) fn bindings_text(b: &Bindings) -> String {
    let parts: Vec<String> = b
        .iter()
        .map(|(s, v)| format!("{} = {v}", super::Name(s)))
        .collect();
    parts.join(", ")
}

/// The stored size `d` (known or symbolic) at `bindings`, or a message saying why it has
/// none (negative there, or unrepresentable).
pub fn size_at(d: usize, bindings: &Bindings) -> Result<usize, String> {
    let d = Dim::from_stored(d);
    if let Some(n) = d.known_size() {
        return Ok(n);
    }
    let e = d
        .symbolic()
        .ok_or_else(|| "an unrepresentable size".to_string())?;
    let v = e.eval(&|s| bindings.get(s).map(|&v| v as i64))?;
    usize::try_from(v).map_err(|_| {
        format!(
            "the size {e} is {v} at {}: negative",
            bindings_text(bindings)
        )
    })
}

/// `t` with every dim at `bindings`.
fn type_at(t: &TensorType, bindings: &Bindings) -> Result<TensorType, String> {
    let dims = t
        .dims
        .iter()
        .map(|&d| size_at(d, bindings))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TensorType { dims, ..t.clone() })
}

/// `t` with every symbol at `size`: a representative of a symbolic type, for estimates
/// that need numbers (the fusion cost model) and hold whatever the sizes are. A size
/// negative there counts as 0.
pub fn representative(t: &TensorType, size: usize) -> TensorType {
    let dims = t
        .dims
        .iter()
        .map(|&d| {
            let d = Dim::from_stored(d);
            d.known_size().unwrap_or_else(|| {
                d.symbolic()
                    .and_then(|e| e.eval(&|_| Some(size as i64)).ok())
                    .map_or(0, |v| v.max(0) as usize)
            })
        })
        .collect();
    TensorType { dims, ..t.clone() }
}

/// `op` with the sizes its attributes hold (a reshape's or expand's target shape, a
/// resize's sizes, and the scales a resize derives from them) at `bindings`; `input` is
/// its first operand's type, specialized.
fn op_at(op: &Op, bindings: &Bindings, input: Option<&TensorType>) -> Result<Op, String> {
    let Some(sizes) = op.result_sizes() else {
        return Ok(op.clone());
    };
    let sizes = sizes
        .iter()
        .map(|&d| size_at(d, bindings))
        .collect::<Result<Vec<_>, _>>()?;
    let mut op = op.with_result_sizes(sizes).unwrap_or_else(|| op.clone());
    if let (Op::Resize(r), Some(x)) = (&mut op, input) {
        r.derive_scales(&x.dims);
    }
    Ok(op)
}

/// `f` of `m` at `bindings`: parameter types with the symbols' values, every
/// instruction's type inferred again. An error (a size negative at these values, a type
/// rule that fails — two dims that agree symbolically cannot disagree, but a window
/// may not fit a small image) names the instruction.
pub fn specialize_func(m: &Module, f: &Func, bindings: &Bindings) -> Result<Func, Diagnostics> {
    let at = bindings_text(bindings);
    let fail = |what: String, loc: &crate::diag::Location| {
        Diagnostics(vec![Diagnostic::error(
            "specialize",
            format!("at {at}: {what}"),
            loc.clone(),
        )])
    };
    let mut params = Vec::with_capacity(f.params.len());
    for p in &f.params {
        let ty = type_at(&p.ty, bindings)
            .map_err(|why| fail(format!("input %{}: {why}", p.name), &f.loc))?;
        params.push(Param {
            name: p.name.clone(),
            ty,
        });
    }
    let mut types: Vec<TensorType> = params.iter().map(|p| p.ty.clone()).collect();
    let mut insts = Vec::with_capacity(f.insts.len());
    for inst in &f.insts {
        let operand_types: Vec<&TensorType> =
            inst.operands.iter().map(|v| &types[v.index()]).collect();
        let op = op_at(&inst.op, bindings, operand_types.first().copied())
            .map_err(|why| fail(why, &inst.loc))?;
        let ty = op
            .infer_type(&operand_types, &|id| m.weights.type_of(id))
            .map_err(|why| fail(format!("'{}': {why}", inst.op.name()), &inst.loc))?;
        types.push(ty.clone());
        insts.push(Inst {
            op,
            operands: inst.operands.clone(),
            ty,
            loc: inst.loc.clone(),
        });
    }
    Ok(Func {
        name: f.name.clone(),
        params,
        insts,
        results: f.results.clone(),
        loc: f.loc.clone(),
    })
}

/// `m` with its entry function specialized at the shapes of its inputs (input name →
/// dims): the symbols bound by [`bind_symbols`], the function by [`specialize_func`].
/// The other functions are kept as they are.
pub fn specialize(
    m: &Module,
    shapes: &BTreeMap<String, Vec<usize>>,
) -> Result<Module, Diagnostics> {
    let Some(entry) = m.entry() else {
        return Err(Diagnostics(vec![Diagnostic::error(
            "specialize",
            m.no_entry_reason(),
            crate::diag::Location::Unknown,
        )]));
    };
    let bindings = bind_symbols(entry, shapes).map_err(|why| {
        Diagnostics(vec![Diagnostic::error(
            "specialize",
            why,
            entry.loc.clone(),
        )])
    })?;
    let specialized = specialize_func(m, entry, &bindings)?;
    let mut out = m.clone();
    for f in &mut out.funcs {
        if f.name == specialized.name {
            *f = specialized;
            break;
        }
    }
    Ok(out)
}
