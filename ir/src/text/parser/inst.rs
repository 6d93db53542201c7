//! Statements: `%r = OP OPERANDS {ATTRS} : RESULT_TYPE [loc(...)]`, fused ops with their
//! post-ops, and the `Inst` built from them.

use std::collections::HashMap;

use super::{Named, PResult, Parser, Slot};
use crate::diag::{Diagnostic, Location};
use crate::graph::{Func, Inst, Value};
use crate::op::{FusedOp, Op, PostOp};
use crate::text::attr_dict::AttrDict;
use crate::text::attrs::{build_op, suggest};
use crate::text::lexer::Tok;
use crate::types::TensorType;

enum PostSyntax {
    Unary {
        name: Named,
        attrs: AttrDict,
    },
    Binary {
        name: Named,
        operand: Named,
        acc_is_lhs: bool,
    },
}

/// One `%r = ...` statement as written, before names and types are resolved.
struct OpSyntax {
    result: Named,
    mnemonic: Named,
    weight: Option<Named>,
    anchor: Option<Named>,
    operands: Vec<Named>,
    attrs: AttrDict,
    post: Vec<PostSyntax>,
    ty: TensorType,
    ty_at: usize,
    loc: Option<Location>,
}

impl<'a> Parser<'a> {
    fn post_op(&mut self) -> PResult<PostSyntax> {
        let name = self.expect_ident("a post-op like relu or add(_, %v)")?;
        if !self.eat(&Tok::LParen) {
            let entries = if self.eat(&Tok::LBrace) {
                self.attr_entries(Tok::RBrace, "bad-attribute")?
            } else {
                Vec::new()
            };
            let owner = format!("post-op '{}'", name.name);
            let attrs = AttrDict::new(&owner, name.at, entries);
            return Ok(PostSyntax::Unary { name, attrs });
        }
        let arg = |p: &mut Self| -> PResult<Option<Named>> {
            if p.is_ident("_") {
                p.bump();
                Ok(None)
            } else {
                p.expect_value("'_' (the accumulator) or a value").map(Some)
            }
        };
        let lhs = arg(self)?;
        self.expect(Tok::Comma, "',' between the two operands of the post-op")?;
        let rhs = arg(self)?;
        self.expect(Tok::RParen, "')' to close the post-op's operands")?;
        match (lhs, rhs) {
            (None, Some(operand)) => Ok(PostSyntax::Binary {
                name,
                operand,
                acc_is_lhs: true,
            }),
            (Some(operand), None) => Ok(PostSyntax::Binary {
                name,
                operand,
                acc_is_lhs: false,
            }),
            _ => Err(self.map.error(
                name.at,
                format!(
                    "binary post-op '{}' needs exactly one '_' (the accumulator) and one value, as in {}(_, %v)",
                    name.name, name.name
                ),
            )),
        }
    }

    fn op_syntax(&mut self) -> PResult<OpSyntax> {
        let result = self.expect_value("a result name")?;
        self.expect(Tok::Eq, "'=' after the result name")?;
        let mnemonic = self.expect_ident("an op name")?;
        let mut weight = None;
        let mut anchor = None;
        if mnemonic.name == "const" {
            weight = Some(self.expect_global("a weight name like @w0 after 'const'")?);
        } else if mnemonic.name == "fused" {
            anchor = Some(self.expect_ident("the fused op's anchor, e.g. conv2d")?);
        }
        let mut operands = Vec::new();
        if weight.is_none() && matches!(self.peek(), Tok::Value(_)) {
            loop {
                operands.push(self.expect_value("an operand")?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        let owner = anchor.as_ref().unwrap_or(&mnemonic);
        let (owner_name, owner_at) = (format!("'{}'", owner.name), owner.at);
        let entries = if self.eat(&Tok::LBrace) {
            self.attr_entries(Tok::RBrace, "bad-attribute")?
        } else {
            Vec::new()
        };
        let attrs = AttrDict::new(&owner_name, owner_at, entries);
        let mut post = Vec::new();
        if anchor.is_some() {
            self.expect_keyword("post", "'post [...]' with the fused op's post-ops")?;
            self.expect(Tok::LBracket, "'[' and the post-op list")?;
            if !self.eat(&Tok::RBracket) {
                loop {
                    post.push(self.post_op()?);
                    if self.eat(&Tok::Comma) {
                        continue;
                    }
                    self.expect(Tok::RBracket, "',' or ']' in the post-op list")?;
                    break;
                }
            }
        }
        self.expect(Tok::Colon, "':' and the result type")?;
        let (ty, ty_at) = self.parse_type()?;
        let loc = self.opt_loc()?;
        Ok(OpSyntax {
            result,
            mnemonic,
            weight,
            anchor,
            operands,
            attrs,
            post,
            ty,
            ty_at,
            loc,
        })
    }

    pub(super) fn statement(
        &mut self,
        func: &mut Func,
        env: &mut HashMap<String, Slot>,
    ) -> PResult<()> {
        let s = self.op_syntax()?;
        if env.contains_key(&s.result.name) {
            return self.report(
                self.diag(
                    "redefined-value",
                    format!("value %{} is already defined", s.result.name),
                    s.result.at,
                )
                .with_note("each value is assigned exactly once; pick a new name"),
            );
        }
        let result = s.result.name.clone();
        let (line, col) = self.map.line_col(s.result.at);
        for (name, index) in &self.undefined_uses {
            if *name == result {
                if let Some(d) = self.errors.get_mut(*index) {
                    d.notes.push(format!(
                        "%{name} is defined later, on line {line} column {col}; a value must be defined before its first use"
                    ));
                }
            }
        }
        let post_operands = s.post.iter().filter_map(|p| match p {
            PostSyntax::Binary { operand, .. } => Some(operand),
            PostSyntax::Unary { .. } => None,
        });
        let first_undefined = s
            .operands
            .iter()
            .chain(post_operands)
            .find(|n| !env.contains_key(&n.name))
            .map(|n| n.name.clone());
        match self.build_inst(s, func, env) {
            Ok(inst) => {
                env.insert(result, Slot::Val(Value(func.num_values() as u32)));
                func.insts.push(inst);
            }
            Err(d) => {
                env.insert(result, Slot::Poisoned);
                if let Some(d) = d {
                    if let (Some(name), "undefined-value") = (first_undefined, d.code) {
                        self.undefined_uses.push((name, self.errors.len()));
                    }
                    self.report(d)?;
                }
            }
        }
        Ok(())
    }

    /// The op named `name` with its attributes checked.
    fn simple_op(&self, name: &Named, mut attrs: AttrDict) -> Result<Op, Diagnostic> {
        match build_op(&name.name, &mut attrs) {
            Err(e) => Err(self.attr_diag(e, "bad-attribute")),
            Ok(None) => {
                let d = self.diag("unknown-op", format!("unknown op '{}'", name.name), name.at);
                Err(match suggest(&name.name) {
                    Some(s) => d.with_note(format!("did you mean '{s}'?")),
                    None => d,
                })
            }
            Ok(Some(op)) => {
                attrs
                    .finish()
                    .map_err(|e| self.attr_diag(e, "bad-attribute"))?;
                Ok(op)
            }
        }
    }

    /// Resolves names and checks the op; `Err(None)` when an operand is poisoned.
    fn build_inst(
        &self,
        s: OpSyntax,
        func: &Func,
        env: &HashMap<String, Slot>,
    ) -> Result<Inst, Option<Diagnostic>> {
        let mut extra_operands = Vec::new();
        let (op, arity_op, arity_at) = if let Some(w) = &s.weight {
            s.attrs
                .finish()
                .map_err(|e| Some(self.attr_diag(e, "bad-attribute")))?;
            if self.failed_weights.contains(&w.name) {
                return Err(None);
            }
            let id = self.module.weights.lookup(&w.name).ok_or_else(|| {
                Some(
                    self.diag("unknown-weight", format!("unknown weight @{}", w.name), w.at)
                        .with_note("weights are declared at the top, before the functions: const @w : tensor<...> = dense<...>"),
                )
            })?;
            (Op::Const(id), None, s.mnemonic.at)
        } else if let Some(anchor_name) = &s.anchor {
            let anchor = self.simple_op(anchor_name, s.attrs).map_err(Some)?;
            if !anchor.is_anchor() {
                return Err(Some(
                    self.diag(
                        "bad-fused-op",
                        format!("'{}' cannot anchor a fused op", anchor_name.name),
                        anchor_name.at,
                    )
                    .with_note("anchors are conv2d, gemm, matmul, layer_norm, max_pool2d, avg_pool2d and global_avg_pool"),
                ));
            }
            let mut post_ops = Vec::new();
            for p in s.post {
                post_ops.push(self.post_op_of(p, &mut extra_operands)?);
            }
            let arity_op = anchor.clone();
            (
                Op::Fused(FusedOp {
                    anchor: Box::new(anchor),
                    post_ops,
                }),
                Some(arity_op),
                anchor_name.at,
            )
        } else {
            (
                self.simple_op(&s.mnemonic, s.attrs).map_err(Some)?,
                None,
                s.mnemonic.at,
            )
        };
        let arity_of = arity_op.as_ref().unwrap_or(&op);
        if !arity_of.arity().accepts(s.operands.len()) {
            return Err(Some(self.diag(
                "wrong-arity",
                format!(
                    "'{}' takes {} operands, got {}",
                    arity_of.name(),
                    arity_of.arity(),
                    s.operands.len()
                ),
                arity_at,
            )));
        }
        let mut operands = Vec::new();
        for n in s.operands.iter().chain(&extra_operands) {
            match env.get(&n.name) {
                Some(Slot::Val(v)) => operands.push(*v),
                Some(Slot::Poisoned) => return Err(None),
                None => {
                    return Err(Some(self.diag(
                        "undefined-value",
                        format!("undefined value %{}", n.name),
                        n.at,
                    )))
                }
            }
        }
        let types: Vec<&TensorType> = operands.iter().map(|v| func.type_of(*v)).collect();
        let weights = &self.module.weights;
        let inferred = op
            .infer_type(&types, &|id| weights.type_of(id))
            .map_err(|m| Some(self.diag("type-mismatch", m, s.mnemonic.at)))?;
        if inferred != s.ty {
            return Err(Some(self.diag(
                "type-mismatch",
                format!(
                    "'{}' gives {inferred}, but the declared type is {}",
                    s.anchor.as_ref().unwrap_or(&s.mnemonic).name,
                    s.ty
                ),
                s.ty_at,
            )));
        }
        Ok(Inst {
            op,
            operands,
            ty: s.ty,
            loc: s.loc.unwrap_or_else(|| self.map.loc(s.result.at)),
        })
    }

    fn post_op_of(
        &self,
        p: PostSyntax,
        extra: &mut Vec<Named>,
    ) -> Result<PostOp, Option<Diagnostic>> {
        let not_elementwise = |name: &Named| {
            Some(self.diag(
                "bad-fused-op",
                format!(
                    "'{}' is not an elementwise op and cannot be a post-op",
                    name.name
                ),
                name.at,
            ))
        };
        match p {
            PostSyntax::Unary { name, attrs } => {
                let op = self.simple_op(&name, attrs).map_err(Some)?;
                if let Op::Unary(u) = op {
                    Ok(PostOp::Unary(u))
                } else if let Op::Binary(_) = op {
                    Err(Some(self.diag(
                        "bad-fused-op",
                        format!(
                            "'{0}' takes two operands: write {0}(_, %v) or {0}(%v, _), where _ is the accumulator",
                            name.name
                        ),
                        name.at,
                    )))
                } else {
                    Err(not_elementwise(&name))
                }
            }
            PostSyntax::Binary {
                name,
                operand,
                acc_is_lhs,
            } => {
                let owner = format!("post-op '{}'", name.name);
                let op = self
                    .simple_op(&name, AttrDict::new(&owner, name.at, Vec::new()))
                    .map_err(Some)?;
                if let Op::Binary(op) = op {
                    extra.push(operand);
                    Ok(PostOp::Binary { op, acc_is_lhs })
                } else if let Op::Unary(_) = op {
                    Err(Some(self.diag(
                        "bad-fused-op",
                        format!("'{}' takes one operand: write it without (...)", name.name),
                        name.at,
                    )))
                } else {
                    Err(not_elementwise(&name))
                }
            }
        }
    }
}
