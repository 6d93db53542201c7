//! Instances of a rule: seeded random shapes, attributes and constants for each variable,
//! planned from where it sits in the pattern, and the functions built from them.

use super::*;

/// A SplitMix64 generator.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(super) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(super) fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize].clone()
    }
}

/// How a constant's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Values {
    /// Uniform in [-1, 1].
    Any,
    /// Uniform in [0.5, 2] (variances, divisors).
    Positive,
    /// Every element equals this value.
    Splat(f64),
    /// A `positive` variable: the instance's stratum, magnitudes taken, a zero moved to
    /// the least normal f32, so every element is > 0 and the strata still vary the scale.
    Magnitudes,
}

/// A variable of the instance: its type and whether it is a compile-time constant.
#[derive(Clone, Debug)]
pub(super) struct VarSpec {
    pub(super) ty: TensorType,
    pub(super) constant: Option<Values>,
}

/// One sampled instance of a left-hand side.
pub(super) struct Instance {
    /// The left-hand side with an absorb target replaced by an anchor op.
    pub(super) lhs: PatternExpr,
    /// Variable types, in first-seen order.
    pub(super) vars: Vec<(String, VarSpec)>,
    /// Attributes of attribute variables.
    pub(super) attrs: BTreeMap<String, Attrs>,
}

/// The sizes shared by one instance.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    pub(super) n: usize,
    pub(super) c: usize,
    pub(super) o: usize,
    pub(super) hw: usize,
    pub(super) m: usize,
    pub(super) k: usize,
}

impl Instance {
    pub(super) fn sample(rule: &Rule, lhs: &PatternExpr, seed: u64) -> Option<Instance> {
        let mut rng = Rng(seed);
        let dims = Dims {
            n: rng.pick(&[1, 2]),
            c: rng.pick(&[2, 3, 4]),
            o: rng.pick(&[2, 3, 4]),
            hw: rng.pick(&[4, 5, 6]),
            m: rng.pick(&[2, 3]),
            k: rng.pick(&[3, 4]),
        };
        let mut lhs = lhs.clone();
        if let RuleAction::Absorb { into } = &rule.action {
            let anchor = match rng.next() % 3 {
                0 => "(matmul ?__anchor_a ?__anchor_b)",
                1 => "(max_pool2d[?__anchor_p] ?__anchor_x)",
                _ => "(conv2d[?__anchor_c] ?__anchor_x ?__anchor_w)",
            };
            let anchor = super::super::rules::parse_pattern(anchor, "checker", 1, 1).ok()?;
            lhs = substitute(&lhs, into, &anchor);
        }
        let mut fresh = 0;
        let lhs = name_any_attrs(&lhs, &mut fresh);
        let mut constants: HashMap<String, Values> = HashMap::new();
        let mut per_channel: BTreeSet<String> = BTreeSet::new();
        let mut ranks: HashMap<String, usize> = HashMap::new();
        let mut one_value: BTreeSet<String> = BTreeSet::new();
        for g in &rule.guards {
            let first = g.args.iter().find_map(|a| match a {
                GuardArg::Var(v) => Some(v.clone()),
                GuardArg::Number(_) | GuardArg::Op(_) => None,
            });
            match g.kind {
                GuardKind::Const => {
                    for a in &g.args {
                        if let GuardArg::Var(v) = a {
                            constants.entry(v.clone()).or_insert(Values::Any);
                        }
                    }
                }
                GuardKind::Scalar => {
                    let value = g.args.iter().find_map(|a| match a {
                        GuardArg::Number(n) => Some(*n),
                        GuardArg::Var(_) | GuardArg::Op(_) => None,
                    });
                    if let (Some(v), Some(x)) = (first, value) {
                        constants.insert(v, Values::Splat(x));
                    }
                }
                GuardKind::PerChannel => {
                    if let Some(v) = first {
                        constants.entry(v.clone()).or_insert(Values::Any);
                        per_channel.insert(v);
                    }
                }
                GuardKind::Rank => {
                    let rank = g.args.iter().find_map(|a| match a {
                        GuardArg::Number(n) if *n >= 0.0 && n.fract() == 0.0 => Some(*n as usize),
                        _ => None,
                    });
                    if let (Some(v), Some(r)) = (first, rank) {
                        ranks.insert(v, r);
                    }
                }
                // only a constant's values are known on a graph, so a positive variable
                // is a constant of the instance
                GuardKind::Positive => {
                    if let Some(v) = first {
                        constants.insert(v, Values::Magnitudes);
                    }
                }
                // a constant of one element: the planner draws it as `[1]`
                GuardKind::SingleValue => {
                    if let Some(v) = first {
                        constants.entry(v.clone()).or_insert(Values::Any);
                        one_value.insert(v);
                    }
                }
                GuardKind::SingleConsumer | GuardKind::Unpadded | GuardKind::NotAfter => {}
            }
        }
        let mut planner = Planner {
            rng,
            dims,
            constants,
            per_channel,
            ranks,
            attribute_values: match &rule.action {
                RuleAction::Rewrite(rhs) => template_holes(rhs),
                RuleAction::Absorb { .. } => BTreeSet::new(),
            },
            one_value,
            vars: Vec::new(),
            attrs: BTreeMap::new(),
        };
        planner.plan(&lhs, None)?;
        Some(Instance {
            lhs,
            vars: planner.vars,
            attrs: planner.attrs,
        })
    }

    /// The instance in words: each variable's type (and `const`), each attribute.
    pub(super) fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .vars
            .iter()
            .filter(|(v, _)| !v.starts_with("?__"))
            .map(|(v, s)| {
                let c = if s.constant.is_some() { "const " } else { "" };
                format!("{v}: {c}{}", s.ty)
            })
            .collect();
        let mut attrs: Vec<(&String, &Attrs)> = self.attrs.iter().collect();
        attrs.sort_by(|a, b| a.0.cmp(b.0));
        for (v, a) in attrs {
            if let Attrs::Conv2d(c) = a {
                parts.push(format!(
                    "conv strides {:?} pads {:?} groups {}",
                    c.strides, c.pads, c.groups
                ));
            } else if !v.starts_with("?__") {
                parts.push(format!("{v} = {a:?}"));
            }
        }
        parts.join(", ")
    }

    /// Builds the instance as a module: parameters for the variables that are not
    /// constant, weights for those that are, then the ops of `expr` (the left-hand side
    /// when `None`). The weights depend only on `seed` and `draw`, so the module of the
    /// left-hand side and that of the right-hand side see the same constants.
    pub(super) fn module(
        &self,
        seed: u64,
        draw: &Draw,
        expr: Option<&PatternExpr>,
    ) -> Option<(Module, Value)> {
        let mut module = Module::default();
        let mut func = Func {
            name: "lhs".into(),
            params: Vec::new(),
            insts: Vec::new(),
            results: Vec::new(),
            loc: Location::Unknown,
        };
        for (v, s) in &self.vars {
            if s.constant.is_none() {
                func.params.push(Param {
                    name: v.trim_start_matches('?').to_string(),
                    ty: s.ty.clone(),
                });
            }
        }
        let mut values: HashMap<String, Value> = HashMap::new();
        let mut next_param = 0u32;
        for (i, (v, s)) in self.vars.iter().enumerate() {
            let value = match s.constant {
                None => {
                    next_param += 1;
                    Value(next_param - 1)
                }
                Some(kind) => {
                    let len = s.ty.num_elements();
                    let data = match kind {
                        Values::Any => draw.fill(seed ^ ((i as u64 + 1) * 7919), len),
                        Values::Positive => {
                            random_f32(seed ^ ((i as u64 + 1) * 7919), len, 0.5, 2.0)
                        }
                        Values::Splat(x) => vec![x as f32; len],
                        Values::Magnitudes => draw
                            .fill(seed ^ ((i as u64 + 1) * 7919), len)
                            .into_iter()
                            .map(|x| x.abs().max(f32::MIN_POSITIVE))
                            .collect(),
                    };
                    let name = module.weights.fresh_name(v.trim_start_matches('?'));
                    let id = module
                        .weights
                        .add(
                            name,
                            s.ty.clone(),
                            AlignedBuf::from_f32(&data),
                            WeightOrigin::Computed,
                        )
                        .ok()?;
                    push(&mut func, &module, Op::Const(id), Vec::new())?
                }
            };
            values.insert(v.clone(), value);
        }
        let root = self.emit_pattern(expr.unwrap_or(&self.lhs), &mut func, &module, &values)?;
        func.results.push(FuncResult {
            name: "out".into(),
            value: root,
        });
        module.funcs.push(func);
        Some((module, root))
    }

    pub(super) fn emit_pattern(
        &self,
        p: &PatternExpr,
        func: &mut Func,
        module: &Module,
        values: &HashMap<String, Value>,
    ) -> Option<Value> {
        match p {
            PatternExpr::Var(v) => values.get(v).copied(),
            PatternExpr::Op {
                kind,
                attrs,
                children,
            } => {
                let attrs = self.attrs_of(*kind, attrs)?;
                let op = join_op(*kind, &attrs)?;
                let mut operands = Vec::with_capacity(children.len());
                for c in children {
                    operands.push(self.emit_pattern(c, func, module, values)?);
                }
                push(func, module, op, operands)
            }
        }
    }

    pub(super) fn attrs_of(&self, kind: OpKind, spec: &AttrSpec) -> Option<Attrs> {
        match spec {
            AttrSpec::Literal(a) => Some(a.clone()),
            AttrSpec::Var(v) => self.attrs.get(v).cloned(),
            AttrSpec::Any => kind.default_attrs(),
            // values read from the matched constants: only the applier builds these
            AttrSpec::Template { .. } => None,
        }
    }
}

/// The variables whose values the attribute templates of `p` read (`epsilon=?eps`).
pub(super) fn template_holes(p: &PatternExpr) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let PatternExpr::Op {
        attrs, children, ..
    } = p
    {
        if let AttrSpec::Template { holes, .. } = attrs {
            out.extend(holes.iter().cloned());
        }
        for c in children {
            out.extend(template_holes(c));
        }
    }
    out
}

/// `t` at rank `r` for a `rank` guard: its trailing dims (still broadcast-compatible with
/// what `t` was sampled against), or `t` with leading 1s.
pub(super) fn with_rank(t: &TensorType, r: usize) -> TensorType {
    let d = &t.dims;
    let dims = if r <= d.len() {
        d[d.len() - r..].to_vec()
    } else {
        let mut v = vec![1; r - d.len()];
        v.extend_from_slice(d);
        v
    };
    TensorType::f32(dims)
}

/// Appends an instruction, type-checking it.
pub(super) fn push(
    func: &mut Func,
    module: &Module,
    op: Op,
    operands: Vec<Value>,
) -> Option<Value> {
    let types: Vec<&TensorType> = operands.iter().map(|v| func.type_of(*v)).collect();
    let weights = &module.weights;
    let ty = op.infer_type(&types, &|w| weights.type_of(w)).ok()?;
    func.insts.push(Inst {
        op,
        operands,
        ty,
        loc: Location::Unknown,
    });
    Some(func.inst_value(func.insts.len() - 1))
}

/// `p` with every unnamed attribute spec (`conv2d` without `[...]`) bound to a fresh
/// variable, so the planner samples attributes for it.
pub(super) fn name_any_attrs(p: &PatternExpr, fresh: &mut usize) -> PatternExpr {
    match p {
        PatternExpr::Var(_) => p.clone(),
        PatternExpr::Op {
            kind,
            attrs,
            children,
        } => {
            let attrs = match attrs {
                AttrSpec::Any => {
                    *fresh += 1;
                    AttrSpec::Var(format!("?__attrs{fresh}"))
                }
                other => other.clone(),
            };
            PatternExpr::Op {
                kind: *kind,
                attrs,
                children: children.iter().map(|c| name_any_attrs(c, fresh)).collect(),
            }
        }
    }
}

/// `p` with every `?var` replaced by `with`.
pub(super) fn substitute(p: &PatternExpr, var: &str, with: &PatternExpr) -> PatternExpr {
    match p {
        PatternExpr::Var(v) if v == var => with.clone(),
        PatternExpr::Var(_) => p.clone(),
        PatternExpr::Op {
            kind,
            attrs,
            children,
        } => PatternExpr::Op {
            kind: *kind,
            attrs: attrs.clone(),
            children: children.iter().map(|c| substitute(c, var, with)).collect(),
        },
    }
}

/// Assigns variable types and attributes while walking a left-hand side bottom-up.
pub(super) struct Planner {
    pub(super) rng: Rng,
    pub(super) dims: Dims,
    pub(super) constants: HashMap<String, Values>,
    pub(super) per_channel: BTreeSet<String>,
    /// Ranks the `rank` guards ask for, by variable.
    pub(super) ranks: HashMap<String, usize>,
    /// Constants the right-hand side reads as attribute values (`epsilon=?eps`): the
    /// applier takes only a constant of one value, so they get one element (any other
    /// shape would only be refused).
    pub(super) attribute_values: BTreeSet<String>,
    /// Constants a `single-value` guard makes one element.
    pub(super) one_value: BTreeSet<String>,
    pub(super) vars: Vec<(String, VarSpec)>,
    pub(super) attrs: BTreeMap<String, Attrs>,
}

impl Planner {
    pub(super) fn var_type(&self, v: &str) -> Option<TensorType> {
        self.vars
            .iter()
            .find(|(n, _)| n == v)
            .map(|(_, s)| s.ty.clone())
    }

    /// The type of `p`; `role` is (parent kind, operand position, sibling types).
    pub(super) fn plan(
        &mut self,
        p: &PatternExpr,
        role: Option<(OpKind, usize, &[Option<TensorType>])>,
    ) -> Option<TensorType> {
        match p {
            PatternExpr::Var(v) => {
                if let Some(t) = self.var_type(v) {
                    return Some(t);
                }
                let mut ty = self.shape_for(v, role);
                if let Some(&r) = self.ranks.get(v) {
                    ty = with_rank(&ty, r);
                }
                let mut constant = self.constants.get(v).copied();
                let positive = matches!(
                    role,
                    Some((OpKind::BatchNorm, 4, _))
                        | Some((OpKind::Div, 1, _))
                        | Some((OpKind::BnFoldWeight, 2, _))
                        | Some((OpKind::BnFoldBias, 3, _))
                        | Some((OpKind::BnScale, 1, _))
                        | Some((OpKind::BnShift, 3, _))
                );
                if positive {
                    constant = match constant {
                        Some(Values::Any) => Some(Values::Positive),
                        other => other,
                    };
                }
                self.vars.push((
                    v.clone(),
                    VarSpec {
                        ty: ty.clone(),
                        constant,
                    },
                ));
                Some(ty)
            }
            PatternExpr::Op {
                kind,
                attrs,
                children,
            } => {
                let attrs_spec = attrs;
                let attrs = match attrs {
                    AttrSpec::Literal(a) => a.clone(),
                    AttrSpec::Var(v) => match self.attrs.get(v) {
                        Some(a) => a.clone(),
                        None => {
                            let a = self.sample_attrs(*kind)?;
                            self.attrs.insert(v.clone(), a.clone());
                            a
                        }
                    },
                    AttrSpec::Any => kind.default_attrs()?,
                    // right-hand sides only (the loader refuses them on the left)
                    AttrSpec::Template { .. } => return None,
                };
                // Ops and already-typed variables first, so fresh variables see siblings.
                let mut types: Vec<Option<TensorType>> = vec![None; children.len()];
                for (i, c) in children.iter().enumerate() {
                    let known = match c {
                        PatternExpr::Op { .. } => true,
                        PatternExpr::Var(v) => self.var_type(v).is_some(),
                    };
                    if known {
                        types[i] = Some(self.plan(c, None)?);
                    }
                }
                for (i, c) in children.iter().enumerate() {
                    if types[i].is_none() {
                        let siblings = types.clone();
                        types[i] = Some(self.plan(c, Some((*kind, i, &siblings)))?);
                    }
                }
                let types: Vec<TensorType> = types.into_iter().collect::<Option<_>>()?;
                let refs: Vec<&TensorType> = types.iter().collect();
                if let (AttrSpec::Var(v), [operand]) = (attrs_spec, &types[..]) {
                    self.resolve_dims(*kind, v, operand);
                }
                // planning the operands may resolve the attributes (a depthwise conv's
                // groups become its input's channel count): type the op with them
                let resolved = match p {
                    PatternExpr::Op {
                        attrs: AttrSpec::Var(v),
                        ..
                    } => self.attrs.get(v).cloned().unwrap_or(attrs),
                    PatternExpr::Op { .. } | PatternExpr::Var(_) => attrs,
                };
                let op = join_op(*kind, &resolved)?;
                op.infer_type(&refs, &|_| None).ok()
            }
        }
    }

    /// Attributes for a kind's attribute variable, chosen by the structure of the kind's
    /// payload (its sample's, from the op table), so a new kind of an existing structure
    /// needs nothing here. Values are drawn among ones the planned shapes fit; `None`
    /// (the rule stays untested) for structures tied to shapes the planner does not draw.
    pub(super) fn sample_attrs(&mut self, kind: OpKind) -> Option<Attrs> {
        let r = &mut self.rng;
        let (_, structure) = kind.sample()?.split()?;
        Some(match structure {
            Attrs::None => Attrs::None,
            Attrs::Conv2d(_) => {
                let pad = r.pick(&[0, 1]);
                Attrs::Conv2d(Conv2dAttrs {
                    strides: [r.pick(&[1, 1, 2]); 2],
                    pads: [pad; 4],
                    dilations: [1, 1],
                    groups: r.pick(&[1, 1, 1, 0]),
                    ..Conv2dAttrs::default()
                })
            }
            Attrs::ConvTranspose2d(_) => {
                Attrs::ConvTranspose2d(smelt_ir::op::ConvTranspose2dAttrs {
                    strides: [r.pick(&[1, 2]); 2],
                    pads: [r.pick(&[0, 1]); 4],
                    ..Default::default()
                })
            }
            Attrs::Epsilon(_) => Attrs::Epsilon(F32(r.pick(&[1e-5, 1e-3, 0.1]))),
            Attrs::Clip { .. } => Attrs::Clip {
                min: F32(r.pick(&[-1.0, 0.0])),
                max: F32(r.pick(&[1.0, 6.0])),
            },
            Attrs::Alpha(_) => Attrs::Alpha(F32(r.pick(&[0.01, 0.2]))),
            Attrs::HardSigmoid { .. } => Attrs::HardSigmoid {
                alpha: F32(0.2),
                beta: F32(0.5),
            },
            Attrs::Pool(_) => Attrs::Pool(Pool2dAttrs {
                kernel: [2, 2],
                strides: [r.pick(&[1, 2]); 2],
                pads: [0; 4],
                dilations: [1, 1],
                ceil_mode: false,
                layout: smelt_ir::Layout::RowMajor,
            }),
            Attrs::AvgPool { .. } => Attrs::AvgPool {
                pool: Pool2dAttrs {
                    kernel: [2, 2],
                    strides: [2, 2],
                    pads: [0; 4],
                    dilations: [1, 1],
                    ceil_mode: false,
                    layout: smelt_ir::Layout::RowMajor,
                },
                count_include_pad: false,
            },
            Attrs::Gemm(_) => Attrs::Gemm(GemmAttrs {
                alpha: F32(r.pick(&[1.0, 0.5])),
                beta: F32(r.pick(&[1.0, 2.0])),
                trans_a: r.pick(&[false, true]),
                trans_b: r.pick(&[false, true]),
            }),
            // gather's axis indexes data beside an integer index operand the planner
            // does not draw
            Attrs::Axis(_) if kind == OpKind::Gather => return None,
            Attrs::Axis(_) => Attrs::Axis(1),
            Attrs::Gelu(_) => Attrs::Gelu(r.pick(&smelt_ir::op::GeluApproximation::ALL)),
            Attrs::LayerNorm { .. } => Attrs::LayerNorm {
                axis: 1,
                epsilon: F32(1e-5),
            },
            // target shapes, windows, axes, element types and layouts that fit only the
            // shapes they were written for
            // a transpose's permutation and a reshape's shape depend on the operand:
            // drawn once it is planned (`resolve_dims`)
            Attrs::Dims(_) if matches!(kind, OpKind::Transpose | OpKind::Reshape) => {
                Attrs::Dims(Vec::new())
            }
            Attrs::Flag(_)
            | Attrs::DType(_)
            | Attrs::Reduce(_)
            | Attrs::Resize(_)
            | Attrs::GridSample(_)
            | Attrs::Dims(_)
            | Attrs::Slice(_)
            | Attrs::Pad(_)
            | Attrs::Layout(_)
            | Attrs::Fused(_) => return None,
        })
    }

    /// Draws the pending permutation of a transpose or shape of a reshape bound to `v`
    /// for its planned `operand`: a random permutation of its axes, or its dims with two
    /// neighbours merged (or a dim split in two when it has a divisor), so every element
    /// keeps its row-major position.
    fn resolve_dims(&mut self, kind: OpKind, v: &str, operand: &TensorType) {
        if !matches!(self.attrs.get(v), Some(Attrs::Dims(d)) if d.is_empty()) {
            return;
        }
        let dims = &operand.dims;
        let drawn = match kind {
            OpKind::Transpose => {
                let mut perm: Vec<usize> = (0..dims.len()).collect();
                for i in (1..perm.len()).rev() {
                    let j = (self.rng.next() % (i as u64 + 1)) as usize;
                    perm.swap(i, j);
                }
                perm
            }
            OpKind::Reshape if dims.len() >= 2 && self.rng.next().is_multiple_of(2) => {
                let at = (self.rng.next() % (dims.len() as u64 - 1)) as usize;
                let mut shape = dims.clone();
                let merged = shape.remove(at + 1);
                shape[at] *= merged;
                shape
            }
            OpKind::Reshape => {
                let mut shape = dims.clone();
                match shape.iter().position(|&d| d >= 4 && d % 2 == 0) {
                    Some(at) => {
                        shape[at] /= 2;
                        shape.insert(at, 2);
                    }
                    None => shape.push(1),
                }
                shape
            }
            _ => return,
        };
        self.attrs.insert(v.to_string(), Attrs::Dims(drawn));
    }

    /// A type for a fresh variable at `role`.
    pub(super) fn shape_for(
        &mut self,
        v: &str,
        role: Option<(OpKind, usize, &[Option<TensorType>])>,
    ) -> TensorType {
        let d = self.dims;
        let image = TensorType::f32([d.n, d.c, d.hw, d.hw]);
        let matrix = TensorType::f32([d.m, d.k]);
        let sib = |s: &[Option<TensorType>], i: usize| s.get(i).cloned().flatten();
        let Some((kind, pos, siblings)) = role else {
            return if self.rng.next().is_multiple_of(3) {
                matrix
            } else {
                image
            };
        };
        match (kind, pos) {
            (OpKind::Conv2d, 0) | (OpKind::BatchNorm, 0) | (OpKind::MaxPool2d, 0) => image,
            (OpKind::AvgPool2d, 0) | (OpKind::GlobalAvgPool, 0) => image,
            (OpKind::Conv2d, 1) => {
                let c = sib(siblings, 0).and_then(|t| t.dims.get(1).copied());
                let c = c.unwrap_or(d.c);
                // Groups: the sampled conv attributes say 0 for "depthwise".
                let groups = self.pending_groups(c);
                let o = if groups == 1 {
                    d.o
                } else {
                    groups * self.rng.pick(&[1, 2])
                };
                let k = self.rng.pick(&[1, 3]);
                TensorType::f32([o, c / groups, k, k])
            }
            (OpKind::Conv2d, 2) => {
                let o = sib(siblings, 1).map_or(d.o, |t| t.dims.first().copied().unwrap_or(d.o));
                TensorType::f32([o])
            }
            (OpKind::BatchNorm, _) => {
                let c = sib(siblings, 0).and_then(|t| t.dims.get(1).copied());
                TensorType::f32([c.unwrap_or(d.c)])
            }
            (OpKind::MatMul, 0) | (OpKind::Gemm, 0) => matrix,
            (OpKind::MatMul, 1) | (OpKind::Gemm, 1) => {
                let k = sib(siblings, 0).map_or(d.k, |t| t.dims.last().copied().unwrap_or(d.k));
                TensorType::f32([k, d.o])
            }
            (OpKind::Gemm, 2) => TensorType::f32([d.o]),
            (k, _) if k.binary().is_some() => {
                let other = sib(siblings, 1 - pos.min(1));
                match other {
                    Some(s) => self.broadcast_partner(v, &s),
                    None => image,
                }
            }
            _ => image,
        }
    }

    /// The groups of the conv being planned: the most recently sampled conv attributes,
    /// with 0 ("depthwise") resolved to the input's channel count.
    pub(super) fn pending_groups(&mut self, c: usize) -> usize {
        let conv = self
            .attrs
            .iter_mut()
            .filter_map(|(_, a)| match a {
                Attrs::Conv2d(a) => Some(a),
                _ => None,
            })
            .find(|a| a.groups == 0);
        match conv {
            Some(a) => {
                a.groups = c;
                c
            }
            None => self
                .attrs
                .values()
                .find_map(|a| match a {
                    Attrs::Conv2d(a) if c.is_multiple_of(a.groups) => Some(a.groups),
                    _ => None,
                })
                .unwrap_or(1),
        }
    }

    /// A shape for the other operand of a binary op whose first operand is `s`.
    pub(super) fn broadcast_partner(&mut self, v: &str, s: &TensorType) -> TensorType {
        let mut options: Vec<Vec<usize>> = Vec::new();
        let scalar = matches!(self.constants.get(v), Some(Values::Splat(_)))
            || self.attribute_values.contains(v)
            || self.one_value.contains(v);
        if scalar {
            return TensorType::f32([1]);
        }
        if s.rank() >= 2 {
            let c = s.dims[1];
            let mut per_channel = vec![1; s.rank()];
            per_channel[1] = c;
            options.push(per_channel.clone());
            options.push(per_channel[1..].to_vec());
        }
        if !self.per_channel.contains(v) {
            options.push(s.dims.clone());
            options.push(vec![1]);
            if let Some(last) = s.dims.last() {
                options.push(vec![*last]);
            }
        }
        if options.is_empty() {
            options.push(s.dims.clone());
        }
        TensorType::f32(self.rng.pick(&options))
    }
}
