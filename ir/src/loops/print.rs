//! The loop IR's text form (`--dump-loops`, snapshot tests): deterministic, one
//! statement per line, nested loops indented.

use std::fmt::{self, Write as _};

use super::winograd::{WinogradInputRow, WinogradOutputRow};
use super::{Access, Affine, BufPtr, CmpOp, Expr, Kernel, ReduceOp, Stmt, Width};

impl fmt::Display for Affine {
    /// `4*i0 + 58*i1 + 7`; `0` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for &(v, c) in &self.terms {
            if !first {
                f.write_str(" + ")?;
            }
            first = false;
            if c == 1 {
                write!(f, "i{}", v.0)?;
            } else {
                write!(f, "{c}*i{}", v.0)?;
            }
        }
        if first {
            write!(f, "{}", self.offset)
        } else if self.offset != 0 {
            write!(f, " + {}", self.offset)
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Var(v) => write!(f, "${}", v.0),
            Expr::Const(c, Width::F32x4) => write!(f, "splat({c})"),
            Expr::Const(c, _) => write!(f, "{c}"),
            Expr::Int(v, w) => write!(f, "{v}.{}", w.name()),
            Expr::LoadAt {
                buf,
                base,
                index,
                stride,
                bound,
                width,
            } => write!(
                f,
                "load.{} {buf}[{base} + {stride}*checked({index} < {bound})]",
                width.name()
            ),
            Expr::Cast(w, x) => write!(f, "cast.{}({x})", w.name()),
            Expr::Compare(cmp, a, b) => write!(f, "({a} {} {b})", cmp_text(*cmp)),
            Expr::Load { buf, index, width } => {
                write!(f, "load.{} {buf}[{index}]", width.name())
            }
            Expr::Splat(x) => write!(f, "splat({x})"),
            Expr::Unary(op, x) => write!(f, "{}({x})", format!("{op:?}").to_lowercase()),
            Expr::Binary(op, a, b) => {
                write!(f, "{}({a}, {b})", format!("{op:?}").to_lowercase())
            }
            Expr::Fma(a, b, c) => write!(f, "fma({a}, {b}, {c})"),
            Expr::Select {
                cmp,
                a,
                b,
                if_true,
                if_false,
            } => {
                let c = cmp_text(*cmp);
                write!(f, "select({a} {c} {b}, {if_true}, {if_false})")
            }
            Expr::Reduce(op, x) => {
                let n = match op {
                    ReduceOp::Add => "reduce_add",
                    ReduceOp::Max => "reduce_max",
                };
                write!(f, "{n}({x})")
            }
            Expr::Lane(x, lane) => write!(f, "lane({x}, {lane})"),
            Expr::Shuffle(a, b, [m0, m1, m2, m3]) => {
                write!(f, "shuffle({a}, {b}, [{m0}, {m1}, {m2}, {m3}])")
            }
        }
    }
}

fn cmp_text(cmp: CmpOp) -> &'static str {
    match cmp {
        CmpOp::Eq => "==",
        CmpOp::Ne => "!=",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    }
}

fn print_block(out: &mut String, stmts: &[Stmt], depth: usize) {
    let pad = "  ".repeat(depth);
    for s in stmts {
        match s {
            Stmt::Loop {
                var,
                start,
                end,
                step,
                limit,
                body,
            } => {
                let _ = write!(out, "{pad}for i{} in {start}..{end}", var.0);
                if *step != 1 {
                    let _ = write!(out, " step {step}");
                }
                if let Some(l) = limit {
                    let test = if l.from { ">=" } else { "<" };
                    let _ = write!(out, " where {} {test} {}[0]", l.row, l.extent);
                }
                out.push_str(" {\n");
                print_block(out, body, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::Assign { dst, value } => {
                let _ = writeln!(out, "{pad}${} = {value}", dst.0);
            }
            Stmt::Store {
                buf,
                index,
                value,
                width,
            } => {
                let _ = writeln!(out, "{pad}store.{} {buf}[{index}] = {value}", width.name());
            }
            Stmt::ConvTile {
                x,
                w,
                out: o,
                next,
                bias,
                residual,
                tile,
            } => {
                let next = optional_arg("next", next.as_ref());
                let bias = optional_arg("bias", bias.as_ref());
                let residual = optional_arg("residual", residual.as_ref());
                let _ = writeln!(
                    out,
                    "{pad}call conv_tile(x: {x}, w: {w}, out: {o}{next}{bias}{residual}; {tile})"
                );
            }
            Stmt::DepthwiseRow { x, w, out: o, row } => {
                let _ = writeln!(
                    out,
                    "{pad}call depthwise_row(x: {x}, w: {w}, out: {o}; {row})"
                );
            }
            Stmt::BlockedDepthwiseRow {
                x,
                w,
                bias,
                out: o,
                row,
            } => {
                let bias = optional_arg("bias", bias.as_ref());
                let _ = writeln!(
                    out,
                    "{pad}call blocked_depthwise_row(x: {x}, w: {w}{bias}, out: {o}; {row})"
                );
            }
            Stmt::ActivationRows {
                act,
                buf,
                bias,
                rows,
                lanes,
            } => {
                let bias = optional_arg("bias", bias.as_ref());
                let _ = writeln!(
                    out,
                    "{pad}call {}_rows(buf: {buf}{bias}; rows={rows}, lanes={lanes})",
                    act.name()
                );
            }
            Stmt::StoreRows {
                act,
                sums,
                bias,
                residual,
                out: o,
                rows,
                lanes,
            } => {
                let bias = optional_arg("bias", bias.as_ref());
                let residual = optional_arg("residual", residual.as_ref());
                let _ = writeln!(
                    out,
                    "{pad}call {}_rows(sums: {sums}{bias}{residual}, out: {o}; rows={rows}, lanes={lanes})",
                    act.name()
                );
            }
            Stmt::StorePlanes {
                act,
                sums,
                bias,
                out: o,
                pixels,
                channels,
                lanes,
                plane,
            } => {
                let bias = optional_arg("bias", bias.as_ref());
                let _ = writeln!(
                    out,
                    "{pad}call {}_planes(sums: {sums}{bias}, out: {o}; pixels={pixels}, channels={channels}, lanes={lanes}, plane={plane})",
                    act.name()
                );
            }
            Stmt::WinogradInputRow { x, v, row } => {
                let WinogradInputRow {
                    alpha,
                    tiles,
                    x_row,
                    x_tile,
                    v_plane,
                    v_tile,
                } = row;
                let _ = writeln!(
                    out,
                    "{pad}call winograd_input_row(x: {x}, v: {v}; alpha={alpha}, tiles={tiles}, x_strides=({x_row}, {x_tile}), v_strides=({v_plane}, {v_tile}))"
                );
            }
            Stmt::WinogradOutputRow { m, out: o, row } => {
                let WinogradOutputRow {
                    alpha,
                    tiles,
                    m_plane,
                    m_tile,
                    rows,
                    cols,
                    out_row,
                } = row;
                let _ = writeln!(
                    out,
                    "{pad}call winograd_output_row(m: {m}, out: {o}; alpha={alpha}, tiles={tiles}, m_strides=({m_plane}, {m_tile}), rows={rows}, cols={cols}, out_row={out_row})"
                );
            }
            Stmt::SoftmaxRow { x, out: o, len } => {
                let _ = writeln!(out, "{pad}call softmax_row(x: {x}, out: {o}; len={len})");
            }
            Stmt::Prefetch {
                at,
                rows,
                row_stride,
                row_len,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}prefetch {at}; rows={rows}x{row_stride}, len={row_len}"
                );
            }
        }
    }
}

impl fmt::Display for Kernel {
    /// The deterministic text form used by `--dump-loops` and the snapshots.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = format!(
            "kernel @{}{}(\n",
            self.name,
            if self.parallel { " parallel" } else { "" }
        );
        for (i, a) in self.args.iter().enumerate() {
            let access = match a.access {
                Access::Read => "read",
                Access::Write => "write",
            };
            let _ = writeln!(out, "  %{i} {}: {access} {}[{}]", a.name, a.dtype, a.len);
        }
        for (i, len) in self.locals.iter().enumerate() {
            let _ = writeln!(out, "  %local{i}: local f32[{len}]");
        }
        out.push_str(") {\n");
        // Consecutive variables of the same width print as one range.
        let mut i = 0;
        while i < self.vars.len() {
            let mut j = i;
            while j + 1 < self.vars.len() && self.vars[j + 1] == self.vars[i] {
                j += 1;
            }
            if i == j {
                let _ = writeln!(out, "  var ${i}: {}", self.vars[i].name());
            } else {
                let _ = writeln!(out, "  var ${i}..${j}: {}", self.vars[i].name());
            }
            i = j + 1;
        }
        print_block(&mut out, &self.body, 1);
        out.push_str("}\n");
        f.write_str(&out)
    }
}

/// `, NAME: PTR` for a call's optional pointer argument, nothing when it is absent.
fn optional_arg(name: &str, ptr: Option<&BufPtr>) -> String {
    ptr.map_or(String::new(), |p| format!(", {name}: {p}"))
}
