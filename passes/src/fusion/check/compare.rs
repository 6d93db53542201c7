//! Both sides of an instance run in the interpreter and compared: the relative error,
//! the element that differs most, and the counterexample that names it.

use super::*;

/// The outcome of comparing one instance's sides.
pub(super) enum Comparison {
    /// The rule did not fire on the instance, and why.
    NotApplicable(Miss),
    /// Both sides ran; the worst difference over the right-hand sides, whether one was
    /// evaluated directly because it is cyclic, and the worst element in words.
    Compared {
        diff: Diff,
        cyclic: bool,
        example: String,
        /// The same instance evaluated exactly at a random rational point.
        exact: ExactCheck,
        /// The instance's conv features.
        features: ConvFeatures,
    },
    /// The right-hand side could not be built or evaluated.
    Failed(String),
}

/// The difference of two results.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Diff {
    pub(super) max_abs: f64,
    /// max |got − want| / max |want| (FACTS.md), infinite when one side only is not finite.
    pub(super) relative: f64,
    /// The flat index of the worst element.
    pub(super) worst: usize,
}

/// Compares `got` with `want` element by element (both row-major, same shape): the same
/// infinity or NaN on both sides agree, a non-finite value on one side only is an
/// infinite error; a reference of zeros counts absolute differences.
pub(super) fn diff(got: &[f32], want: &[f32]) -> Diff {
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f64, |m, w| m.max((*w as f64).abs()));
    let scale = if scale > 0.0 { scale } else { 1.0 };
    let mut out = Diff::default();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (*g as f64, *w as f64);
        let d = if g == w || (g.is_nan() && w.is_nan()) {
            0.0
        } else if g.is_finite() && w.is_finite() {
            (g - w).abs()
        } else {
            f64::INFINITY
        };
        if d > out.max_abs {
            out.max_abs = d;
            out.worst = i;
        }
    }
    out.relative = out.max_abs / scale;
    out
}

pub(super) fn compare(rule: &Rule, instance: &Instance, seed: u64, draw: &Draw) -> Comparison {
    // egg's clock stopped: it would calibrate on first use (see `without_calibration`)
    crate::fusion::without_calibration(|| compare_in_egg(rule, instance, seed, draw))
}

fn compare_in_egg(rule: &Rule, instance: &Instance, seed: u64, draw: &Draw) -> Comparison {
    let Some((module, root)) = instance.module(seed, draw, None) else {
        return Comparison::NotApplicable(Miss::IllTyped);
    };
    let func = &module.funcs[0];
    let inputs: Vec<Tensor> = func
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| Tensor {
            ty: p.ty.clone(),
            data: draw
                .fill(seed.wrapping_add(101 + i as u64), p.ty.storage_len())
                .into(),
        })
        .collect();
    let Ok(want) = interp::run(&module, func, &inputs) else {
        return Comparison::NotApplicable(Miss::IllTyped);
    };
    let Ok(Built {
        mut egraph,
        value_class,
        original,
    }) = build(func, &module.weights)
    else {
        return Comparison::NotApplicable(Miss::IllTyped);
    };
    let uses = func.uses();
    let context = Arc::new(GuardContext::new(
        value_class
            .iter()
            .enumerate()
            .map(|(v, id)| (*id, uses.get(v).map_or(0, |u| u.len())))
            .collect(),
        &module.weights,
        Vec::new(),
    ));
    context.annotate(&mut egraph);
    let Ok(rewrites) = compile_rules(
        std::slice::from_ref(rule),
        &mut egraph.analysis.attrs,
        &context,
    ) else {
        return Comparison::Failed("the rule does not compile".into());
    };
    let runner = Runner::<TensorNode, FusionAnalysis>::new(FusionAnalysis::default())
        .with_egraph(egraph)
        .with_iter_limit(1)
        .with_node_limit(10_000)
        .with_scheduler(SimpleScheduler)
        .run(&rewrites);
    let mut egraph = runner.egraph;
    egraph.rebuild();
    FusionAnalysis::recanonicalize(&mut egraph);
    let root_class = egraph.find(value_class[root.index()]);
    let at_root = || {
        egraph
            .analysis
            .events
            .iter()
            .filter(|e| egraph.find(e.class) == root_class)
    };
    let fired: BTreeSet<TensorNode> = at_root()
        .filter_map(|e| match &e.outcome {
            Outcome::Fired(n) => Some(n.clone().map_children(|c| egraph.find(c))),
            Outcome::Refused { .. } | Outcome::Approximate { .. } => None,
        })
        .collect();
    if fired.is_empty() {
        let refusal = at_root().find_map(|e| match &e.outcome {
            Outcome::Refused { guard, reason } => Some(Miss::Refused {
                guard: guard.clone(),
                reason: reason.clone(),
            }),
            Outcome::Fired(_) | Outcome::Approximate { .. } => None,
        });
        return Comparison::NotApplicable(refusal.unwrap_or(Miss::NoMatch));
    }
    let table = CostTable::new(&egraph, &CostModel::default());
    let inputs_nodes = input_nodes(&egraph, func, &value_class, &original);
    let want = want[0].f32s_row_major();
    let mut worst: Option<(Diff, bool, Vec<f32>)> = None;
    let mut exact = ExactCheck::Agreed {
        sqrt_uninterpreted: false,
    };
    for node in fired {
        let full: BTreeMap<Id, TensorNode> = BTreeMap::from([(root_class, node)]);
        let chosen = choose_with_forced(
            &egraph,
            &table,
            &full,
            &inputs_nodes,
            &[root_class],
            &BTreeSet::new(),
        );
        let (rhs_module, cyclic) = match (chosen, &rule.action) {
            (Some(chosen), _) => match emit(func, &egraph, &chosen, &[root_class]) {
                Ok((f, _, _)) => (
                    Module {
                        weights: module.weights.clone(),
                        funcs: vec![f],
                    },
                    false,
                ),
                Err(e) => {
                    return Comparison::Failed(format!("the right-hand side is invalid: {e}"))
                }
            },
            // The right-hand side needs the matched value to compute it: it is true or
            // false all the same, so evaluate it as written.
            (None, RuleAction::Rewrite(rhs)) => match instance.module(seed, draw, Some(rhs)) {
                Some((m, _)) => (m, true),
                None => {
                    return Comparison::Failed(
                        "the right-hand side makes the graph cyclic and does not type-check".into(),
                    )
                }
            },
            (None, RuleAction::Absorb { .. }) => {
                return Comparison::Failed("the absorbed form makes the graph cyclic".into())
            }
        };
        let got = match interp::run(&rhs_module, &rhs_module.funcs[0], &inputs) {
            Ok(g) => g,
            Err(d) => {
                return Comparison::Failed(format!("the right-hand side does not run: {}", msg(&d)))
            }
        };
        if got[0].ty.dims != want_dims(&module) {
            return Comparison::Failed(format!(
                "the right-hand side is {}, the left-hand side {}",
                got[0].ty,
                module.funcs[0].type_of(root)
            ));
        }
        let got = got[0].f32s_row_major();
        // the worst exact finding over the nodes: a difference, else a reason, else agreed
        let here = if cyclic {
            ExactCheck::Outside("the right-hand side is evaluated as written".into())
        } else {
            let positive: Vec<String> = rule
                .positive_vars()
                .iter()
                .map(|v| v.trim_start_matches('?').to_string())
                .collect();
            exact_check(&module, &rhs_module, seed, &positive)
        };
        match (&exact, here) {
            (ExactCheck::Differed { .. }, _) => {}
            (_, d @ ExactCheck::Differed { .. }) => exact = d,
            (ExactCheck::Outside(_), _) => {}
            (_, here @ ExactCheck::Outside(_)) => exact = here,
            (
                ExactCheck::Agreed {
                    sqrt_uninterpreted: before,
                },
                ExactCheck::Agreed {
                    sqrt_uninterpreted: now,
                },
            ) => {
                exact = ExactCheck::Agreed {
                    sqrt_uninterpreted: *before || now,
                }
            }
        }
        let d = diff(&got, &want);
        if worst
            .as_ref()
            .is_none_or(|(w, _, _)| d.relative.is_nan() || d.relative > w.relative)
        {
            worst = Some((d, cyclic, got));
        }
    }
    let Some((d, cyclic, got)) = worst else {
        return Comparison::NotApplicable(Miss::NoMatch);
    };
    // Both sides NaN or infinite on every element "agree" without comparing a number:
    // such an instance shows nothing, so it is discarded and another drawn.
    if d.max_abs == 0.0 && !want.is_empty() && want.iter().all(|w| !w.is_finite()) {
        return Comparison::NotApplicable(Miss::NonFinite);
    }
    let example = counterexample(instance, &module, &inputs, d.worst, &got, &want);
    let mut features = ConvFeatures {
        padded: false,
        strided: false,
        grouped: false,
    };
    for inst in &module.funcs[0].insts {
        if let Op::Conv2d(c) = &inst.op {
            features.padded |= c.pads.iter().any(|p| *p > 0);
            features.strided |= c.strides.iter().any(|s| *s > 1);
            features.grouped |= c.groups > 1;
        }
    }
    Comparison::Compared {
        diff: d,
        cyclic,
        example,
        exact,
        features,
    }
}

/// The dims of the left-hand side's result.
pub(super) fn want_dims(module: &Module) -> Vec<usize> {
    let f = &module.funcs[0];
    f.type_of(f.results[0].value).dims.clone()
}

/// The worst element in words: its index, both sides' values there, and the values of
/// the variables that have the result's shape (elementwise rules: the element's inputs)
/// and of the one-element constants.
pub(super) fn counterexample(
    instance: &Instance,
    module: &Module,
    inputs: &[Tensor],
    at: usize,
    got: &[f32],
    want: &[f32],
) -> String {
    let dims = want_dims(module);
    let mut index = Vec::with_capacity(dims.len());
    let mut rest = at;
    for d in dims.iter().rev() {
        index.push(rest % d.max(&1));
        rest /= d.max(&1);
    }
    index.reverse();
    let mut vars: Vec<String> = Vec::new();
    let mut param = 0;
    for (v, s) in &instance.vars {
        let value = if s.constant.is_none() {
            param += 1;
            inputs
                .get(param - 1)
                .map(|t| t.f32s_row_major())
                .filter(|_| s.ty.dims == dims)
                .and_then(|d| d.get(at).copied())
        } else if s.ty.num_elements() == 1 {
            // a one-element constant is part of every element's counterexample
            // (relu(x + c) = relu(x) + c fails for some c, not for every one)
            module
                .weights
                .lookup(v.trim_start_matches('?'))
                .and_then(|id| module.weights.get(id))
                .and_then(|w| w.f32s().first().copied())
        } else {
            None
        };
        if let Some(x) = value {
            if !v.starts_with("?__") {
                vars.push(format!("{v} = {x}"));
            }
        }
    }
    let mut text = format!(
        "at {index:?} left-hand side = {}, right-hand side = {}",
        want.get(at).copied().unwrap_or(f32::NAN),
        got.get(at).copied().unwrap_or(f32::NAN)
    );
    if !vars.is_empty() {
        text.push_str(&format!(" ({})", vars.join(", ")));
    }
    text
}

pub(super) fn msg(d: &Diagnostic) -> String {
    d.message.clone()
}
