//! Random valid small graphs, built with `FuncBuilder` from choices read out of fuzzer bytes.
//!
//! [`generate`] turns any byte string into a verified single-function module and inputs
//! for it: an NCHW input (plus, by choice, a residual-shaped and a 2-D input), then up to
//! [`GenOptions::max_steps`] steps, each one of: a conv block (conv2d → batch_norm? →
//! add? → activation?, the fusable ResNet tail), a gemm or matmul block (bias,
//! activation), a pool, a unary or broadcasting binary op, a standalone batch_norm,
//! layer_norm, softmax, a shape op (flatten, reshape, transpose) or a concat. Shapes are
//! valid by construction; when the builder rejects a step anyway, that is reported as
//! [`GenError::Rejected`] (a generator or type-rule bug), never skipped silently.
//! Running out of bytes ends the graph early, so every input yields a graph.
//!
//! Values are kept numerically tame so that the fused and JIT-compiled results can be
//! compared with the interpreter at 1e-4 relative error: inputs and weights in [-1, 1],
//! batch-norm variances in [0.1, 2], divisors are constants of magnitude in [0.5, 2].

use arbitrary::Unstructured;
use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::{broadcast, Conv2dAttrs, GeluApproximation, GemmAttrs, Pool2dAttrs};
use smelt_ir::weights::random_f32;
use smelt_ir::{BinaryOp, Module, Op, Tensor, TensorType, UnaryOp, Value, F32};

/// How big and what kind of graphs to make.
#[derive(Clone, Copy, Debug)]
pub struct GenOptions {
    /// Most steps (each adds one to four instructions).
    pub max_steps: usize,
    /// Sprinkle NaN, ±inf, -0.0 and subnormals into the inputs.
    pub special_inputs: bool,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            max_steps: 8,
            special_inputs: false,
        }
    }
}

/// A generated case: a module with one function `g`, and one input per parameter.
#[derive(Clone, Debug)]
pub struct Case {
    /// The module (verified by construction: every instruction went through the builder).
    pub module: Module,
    /// Inputs, one per parameter of `g`.
    pub inputs: Vec<Tensor>,
}

/// Why no case was generated.
#[derive(Clone, Debug)]
pub enum GenError {
    /// The builder refused an instruction the generator believed valid: a bug on one side.
    Rejected(String),
}

/// Largest tensor the generator lets grow further (elements).
const GROW_LIMIT: usize = 2048;

struct Gen<'u, 'd, 'm> {
    u: &'u mut Unstructured<'d>,
    b: FuncBuilder<'m>,
    /// Every value defined so far with its dims, in definition order.
    values: Vec<(Value, Vec<usize>)>,
    next_seed: u64,
}

/// Builds a case from `u`'s bytes. Never fails for lack of bytes: the graph just ends.
pub fn generate(u: &mut Unstructured<'_>, opts: &GenOptions) -> Result<Case, GenError> {
    let mut module = Module::default();
    let seed = u.arbitrary::<u32>().unwrap_or(0) as u64;
    let mut param_dims: Vec<Vec<usize>> = Vec::new();
    {
        let mut g = Gen {
            b: FuncBuilder::new(&mut module, "g"),
            u,
            values: Vec::new(),
            next_seed: seed.wrapping_mul(7919) + 1,
        };
        let n = g.int(1, 2);
        let c = g.int(1, 6);
        let h = g.int(1, 7);
        let w = g.int(1, 7);
        let x_dims = vec![n, c, h, w];
        g.add_param("x", x_dims.clone(), &mut param_dims);
        if g.flag() {
            g.add_param("skip", x_dims.clone(), &mut param_dims);
        }
        if g.flag() {
            let m = g.int(1, 4);
            let k = g.int(1, 8);
            g.add_param("a", vec![m, k], &mut param_dims);
        }
        let steps = g.int(1, opts.max_steps.max(1));
        for _ in 0..steps {
            if g.u.is_empty() && g.values.len() > param_dims.len() {
                break;
            }
            g.step()?;
        }
        let (last, _) = g.values.last().cloned().expect("at least one parameter");
        let mut results = vec![("y", last)];
        if g.flag() {
            let (other, _) = g.pick_any().0;
            results.push(("z", other));
        }
        g.b.finish(&results);
    }
    let inputs = param_dims
        .iter()
        .enumerate()
        .map(|(i, dims)| {
            let len: usize = dims.iter().product();
            let mut data = random_f32(seed + 101 * i as u64, len, -1.0, 1.0);
            if opts.special_inputs {
                sprinkle_specials(&mut data, seed + i as u64);
            }
            Tensor {
                ty: TensorType::f32(dims.clone()),
                data: data.into(),
            }
        })
        .collect();
    Ok(Case { module, inputs })
}

/// Replaces about one element in eight by NaN, ±inf, -0.0 or a subnormal.
fn sprinkle_specials(data: &mut [f32], seed: u64) {
    const SPECIALS: [f32; 5] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 1e-40];
    let picks = random_f32(seed ^ 0x5eed, data.len(), 0.0, 40.0);
    for (v, p) in data.iter_mut().zip(picks) {
        let k = p as usize;
        if k < SPECIALS.len() {
            *v = SPECIALS[k];
        }
    }
}

impl Gen<'_, '_, '_> {
    fn int(&mut self, lo: usize, hi: usize) -> usize {
        self.u.int_in_range(lo..=hi).unwrap_or(lo)
    }

    fn flag(&mut self) -> bool {
        self.u.arbitrary::<bool>().unwrap_or(false)
    }

    fn choose<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.int(0, items.len() - 1)]
    }

    fn seed(&mut self) -> u64 {
        self.next_seed += 1;
        self.next_seed
    }

    fn add_param(&mut self, name: &str, dims: Vec<usize>, all: &mut Vec<Vec<usize>>) {
        let v = self.b.param(name, TensorType::f32(dims.clone()));
        self.values.push((v, dims.clone()));
        all.push(dims);
    }

    /// A value, most often one of the latest three (to grow chains).
    fn pick_any(&mut self) -> ((Value, Vec<usize>), usize) {
        let len = self.values.len();
        let i = if self.flag() {
            len - 1 - self.int(0, len.min(3) - 1)
        } else {
            self.int(0, len - 1)
        };
        (self.values[i].clone(), i)
    }

    /// A value of rank `rank` (the latest one when choices run out), if any exists.
    fn pick_rank(&mut self, rank: usize) -> Option<(Value, Vec<usize>)> {
        let found: Vec<usize> = (0..self.values.len())
            .filter(|&i| self.values[i].1.len() == rank && small(&self.values[i].1))
            .collect();
        if found.is_empty() {
            return None;
        }
        let i = if self.flag() {
            *found.last().expect("non-empty")
        } else {
            found[self.int(0, found.len() - 1)]
        };
        Some(self.values[i].clone())
    }

    fn emit(&mut self, op: Op, operands: &[Value]) -> Result<(Value, Vec<usize>), GenError> {
        let types: Vec<String> = operands
            .iter()
            .map(|v| self.b.type_of(*v).to_string())
            .collect();
        let v = self
            .b
            .op(op.clone(), operands)
            .map_err(|d| GenError::Rejected(format!("{op:?} on ({}): {d}", types.join(", "))))?;
        let dims = self.b.type_of(v).dims.clone();
        self.values.push((v, dims.clone()));
        Ok((v, dims))
    }

    /// A constant of `dims` with values uniform in [lo, hi].
    fn constant(&mut self, dims: &[usize], lo: f32, hi: f32) -> Result<Value, GenError> {
        let n = dims.iter().product();
        let values = random_f32(self.seed(), n, lo, hi);
        self.b
            .constant("c", TensorType::f32(dims.to_vec()), &values)
            .map_err(|d| GenError::Rejected(format!("constant {dims:?}: {d}")))
    }

    /// A divisor-safe constant: magnitudes in [0.5, 2], either sign.
    fn nonzero_constant(&mut self, dims: &[usize]) -> Result<Value, GenError> {
        let n = dims.iter().product();
        let mags = random_f32(self.seed(), n, 0.5, 2.0);
        let signs = random_f32(self.seed(), n, -1.0, 1.0);
        let values: Vec<f32> = mags
            .iter()
            .zip(signs)
            .map(|(m, s)| if s < 0.0 { -m } else { *m })
            .collect();
        self.b
            .constant("d", TensorType::f32(dims.to_vec()), &values)
            .map_err(|d| GenError::Rejected(format!("constant {dims:?}: {d}")))
    }

    fn step(&mut self) -> Result<(), GenError> {
        match self.int(0, 12) {
            0..=2 => self.conv_block(),
            3 | 4 => self.gemm_block(),
            5 => self.pool(),
            6 => self.unary().map(drop),
            7 | 8 => self.binary().map(drop),
            9 => self.norm(),
            10 => self.shape_op(),
            11 => self.concat(),
            _ => self.softmax(),
        }
    }

    fn random_unary(&mut self) -> UnaryOp {
        match self.int(0, 9) {
            0 => UnaryOp::Relu,
            1 => {
                let (lo, hi) = self.choose(&[(0.0, 6.0), (-0.5, 0.5), (0.0, 0.25), (-1.0, 0.0)]);
                UnaryOp::Clip {
                    min: F32(lo),
                    max: F32(hi),
                }
            }
            2 => UnaryOp::LeakyRelu {
                alpha: F32(self.choose(&[0.01, 0.2, 1.5])),
            },
            3 => UnaryOp::Sigmoid,
            4 => UnaryOp::Tanh,
            5 => UnaryOp::Erf,
            6 => UnaryOp::Gelu {
                approximate: GeluApproximation::None,
            },
            7 => UnaryOp::HardSigmoid {
                alpha: F32(self.choose(&[0.2, 1.0 / 6.0])),
                beta: F32(0.5),
            },
            8 => UnaryOp::HardSwish,
            _ => UnaryOp::Silu,
        }
    }

    fn maybe_activation(&mut self, v: Value) -> Result<Value, GenError> {
        if self.flag() {
            let op = if self.flag() {
                UnaryOp::Relu
            } else {
                self.random_unary()
            };
            Ok(self.emit(Op::Unary(op), &[v])?.0)
        } else {
            Ok(v)
        }
    }

    /// conv2d (bias?) → batch_norm? → add(skip)? → activation?
    fn conv_block(&mut self) -> Result<(), GenError> {
        let Some((x, d)) = self.pick_rank(4) else {
            return self.unary().map(drop);
        };
        let (c, h, w) = (d[1], d[2], d[3]);
        let depthwise = c > 1 && self.flag();
        let (groups, o) = if depthwise {
            (c, c * self.int(1, 2))
        } else {
            (1, self.int(1, 8))
        };
        let mut attrs = Conv2dAttrs {
            strides: [self.int(1, 2), self.int(1, 2)],
            pads: [
                self.int(0, 1),
                self.int(0, 1),
                self.int(0, 1),
                self.int(0, 1),
            ],
            dilations: [self.int(1, 2), self.int(1, 2)],
            groups,
            ..Conv2dAttrs::default()
        };
        let mut k = [self.int(1, 3), self.int(1, 3)];
        for (i, size) in [h, w].into_iter().enumerate() {
            let padded = size + attrs.pads[i] + attrs.pads[i + 2];
            if attrs.dilations[i] * (k[i] - 1) + 1 > padded {
                k[i] = 1;
                attrs.dilations[i] = 1;
            }
        }
        let wt = self.constant(&[o, c / groups, k[0], k[1]], -0.5, 0.5)?;
        let mut operands = vec![x, wt];
        if self.flag() {
            operands.push(self.constant(&[o], -0.5, 0.5)?);
        }
        let (mut y, yd) = self.emit(Op::Conv2d(attrs), &operands)?;
        if self.flag() {
            y = self.batch_norm(y, o)?;
        }
        if self.flag() {
            let same: Vec<Value> = self
                .values
                .iter()
                .filter(|(v, dd)| *dd == yd && *v != y)
                .map(|(v, _)| *v)
                .collect();
            let z = if !same.is_empty() && self.flag() {
                same[self.int(0, same.len() - 1)]
            } else if self.flag() {
                self.constant(&[o, 1, 1], -1.0, 1.0)?
            } else {
                self.constant(&yd, -1.0, 1.0)?
            };
            let operands = if self.flag() { [y, z] } else { [z, y] };
            y = self.emit(Op::Binary(BinaryOp::Add), &operands)?.0;
        }
        self.maybe_activation(y)?;
        Ok(())
    }

    fn batch_norm(&mut self, x: Value, c: usize) -> Result<Value, GenError> {
        let g = self.constant(&[c], 0.5, 1.5)?;
        let beta = self.constant(&[c], -0.5, 0.5)?;
        let mean = self.constant(&[c], -0.5, 0.5)?;
        let var = self.constant(&[c], 0.1, 2.0)?;
        let epsilon = F32(self.choose(&[1e-5, 1e-3]));
        Ok(self
            .emit(Op::BatchNorm { epsilon }, &[x, g, beta, mean, var])?
            .0)
    }

    /// gemm (C?) → activation?, or matmul with a constant right operand.
    fn gemm_block(&mut self) -> Result<(), GenError> {
        let (a, ad) = match self.pick_rank(2) {
            Some(found) => found,
            None => {
                let ((x, xd), _) = self.pick_any();
                if xd.is_empty() || !small(&xd) {
                    return self.unary().map(drop);
                }
                let axis = self.int(0, xd.len());
                self.emit(Op::Flatten { axis }, &[x])?
            }
        };
        let n = self.int(1, 8);
        if self.flag() {
            let bt = self.constant(&[ad[1], n], -0.5, 0.5)?;
            let (y, _) = self.emit(Op::MatMul, &[a, bt])?;
            self.maybe_activation(y)?;
            return Ok(());
        }
        let attrs = GemmAttrs {
            alpha: F32(self.choose(&[1.0, 0.5, 2.0])),
            beta: F32(self.choose(&[1.0, 0.5, 2.0])),
            trans_a: self.flag(),
            trans_b: self.flag(),
        };
        let (m, k) = if attrs.trans_a {
            (ad[1], ad[0])
        } else {
            (ad[0], ad[1])
        };
        let b_dims = if attrs.trans_b { [n, k] } else { [k, n] };
        let bt = self.constant(&b_dims, -0.5, 0.5)?;
        let mut operands = vec![a, bt];
        if self.flag() {
            let c_dims: Vec<usize> = match self.int(0, 4) {
                0 => vec![n],
                1 => vec![1, n],
                2 => vec![m, n],
                3 => vec![m, 1],
                _ => vec![],
            };
            operands.push(self.constant(&c_dims, -1.0, 1.0)?);
        }
        let (y, _) = self.emit(Op::Gemm(attrs), &operands)?;
        self.maybe_activation(y)?;
        Ok(())
    }

    fn pool(&mut self) -> Result<(), GenError> {
        let Some((x, d)) = self.pick_rank(4) else {
            return self.unary().map(drop);
        };
        if self.int(0, 3) == 0 {
            self.emit(Op::GlobalAvgPool, &[x])?;
            return Ok(());
        }
        let mut p = Pool2dAttrs {
            kernel: [self.int(1, 3), self.int(1, 3)],
            strides: [self.int(1, 2), self.int(1, 2)],
            pads: [0; 4],
            dilations: [self.int(1, 2), self.int(1, 2)],
            ceil_mode: self.flag(),
            layout: smelt_ir::Layout::RowMajor,
        };
        // Every window must hold an input element (a window of padding alone is NaN in
        // the interpreter, and the JIT drops NaN — see fuzz/README.md): padded axes get
        // dilation 1 and pads below the kernel, so each window's taps are contiguous and
        // reach the input.
        for i in 0..4 {
            p.pads[i] = self.int(0, (p.kernel[i % 2] - 1).min(1));
            if p.pads[i] > 0 {
                p.dilations[i % 2] = 1;
            }
        }
        for (i, size) in [d[2], d[3]].into_iter().enumerate() {
            if !matches!(p.output_size(i, size), Some(s) if s > 0) {
                p.kernel[i] = 1;
                p.dilations[i] = 1;
                p.pads[i] = 0;
                p.pads[i + 2] = 0;
            }
        }
        let op = if self.flag() {
            Op::MaxPool2d(p)
        } else {
            Op::AvgPool2d {
                pool: p,
                count_include_pad: self.flag(),
            }
        };
        let (y, _) = self.emit(op, &[x])?;
        self.maybe_activation(y)?;
        Ok(())
    }

    fn unary(&mut self) -> Result<Value, GenError> {
        let ((x, _), _) = self.pick_any();
        let op = self.random_unary();
        Ok(self.emit(Op::Unary(op), &[x])?.0)
    }

    /// A binary op against another value that broadcasts with it, or a constant of a
    /// broadcast shape (full, per-channel, last axis, scalar). `div` only divides by
    /// constants bounded away from zero.
    fn binary(&mut self) -> Result<Value, GenError> {
        let ((a, ad), ai) = self.pick_any();
        let op = self.choose(&[
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Min,
            BinaryOp::Max,
        ]);
        let shapes = broadcast_shapes(&ad);
        let other_dims = shapes[self.int(0, shapes.len() - 1)].clone();
        if op == BinaryOp::Div {
            let d = self.nonzero_constant(&other_dims)?;
            return Ok(self.emit(Op::Binary(op), &[a, d])?.0);
        }
        let partners: Vec<Value> = self
            .values
            .iter()
            .enumerate()
            .filter(|(i, (_, dd))| {
                *i != ai && small(dd) && broadcast(&ad, dd).is_ok_and(|r| small(&r))
            })
            .map(|(_, (v, _))| *v)
            .collect();
        let b = if !partners.is_empty() && self.flag() {
            partners[self.int(0, partners.len() - 1)]
        } else {
            self.constant(&other_dims, -1.0, 1.0)?
        };
        let operands = if self.flag() { [a, b] } else { [b, a] };
        Ok(self.emit(Op::Binary(op), &operands)?.0)
    }

    /// batch_norm (rank ≥ 2) or layer_norm over a tail of at least two elements.
    fn norm(&mut self) -> Result<(), GenError> {
        let ((x, d), _) = self.pick_any();
        if self.flag() && d.len() >= 2 {
            self.batch_norm(x, d[1])?;
            return Ok(());
        }
        let axes: Vec<usize> = (0..d.len())
            .filter(|&a| d[a..].iter().product::<usize>() >= 2)
            .collect();
        if axes.is_empty() {
            return self.unary().map(drop);
        }
        let axis = axes[self.int(0, axes.len() - 1)];
        let scale = self.constant(&d[axis..], 0.5, 1.5)?;
        let mut operands = vec![x, scale];
        if self.flag() {
            operands.push(self.constant(&d[axis..], -0.5, 0.5)?);
        }
        let epsilon = F32(self.choose(&[1e-5, 1e-3]));
        self.emit(Op::LayerNorm { axis, epsilon }, &operands)?;
        Ok(())
    }

    fn softmax(&mut self) -> Result<(), GenError> {
        let ((x, d), _) = self.pick_any();
        if d.is_empty() {
            return self.unary().map(drop);
        }
        let axis = self.int(0, d.len() - 1);
        self.emit(Op::Softmax { axis }, &[x])?;
        Ok(())
    }

    /// flatten, reshape (to a permutation of the dims or to one axis) or transpose.
    fn shape_op(&mut self) -> Result<(), GenError> {
        let ((x, d), _) = self.pick_any();
        match self.int(0, 2) {
            0 => {
                let axis = self.int(0, d.len());
                self.emit(Op::Flatten { axis }, &[x])?;
            }
            1 => {
                let shape = if self.flag() {
                    vec![d.iter().product()]
                } else {
                    self.permutation(d.len()).iter().map(|&p| d[p]).collect()
                };
                self.emit(Op::Reshape { shape }, &[x])?;
            }
            _ => {
                let perm = self.permutation(d.len());
                self.emit(Op::Transpose { perm }, &[x])?;
            }
        }
        Ok(())
    }

    fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut perm: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.int(0, i);
            perm.swap(i, j);
        }
        perm
    }

    /// concat of a value with itself or with another value matching it off the axis.
    fn concat(&mut self) -> Result<(), GenError> {
        let ((x, d), xi) = self.pick_any();
        if d.is_empty() || !small(&d) {
            return self.unary().map(drop);
        }
        let axis = self.int(0, d.len() - 1);
        let partners: Vec<Value> = self
            .values
            .iter()
            .enumerate()
            .filter(|(i, (_, dd))| {
                *i != xi
                    && small(dd)
                    && dd.len() == d.len()
                    && dd
                        .iter()
                        .zip(&d)
                        .enumerate()
                        .all(|(k, (p, q))| k == axis || p == q)
            })
            .map(|(_, (v, _))| *v)
            .collect();
        let y = if !partners.is_empty() && self.flag() {
            partners[self.int(0, partners.len() - 1)]
        } else {
            x
        };
        let operands = if self.flag() {
            vec![x, y]
        } else {
            vec![y, x, y]
        };
        self.emit(Op::Concat { axis }, &operands)?;
        Ok(())
    }
}

fn small(dims: &[usize]) -> bool {
    dims.iter().product::<usize>() <= GROW_LIMIT
}

/// Shapes that broadcast against `dims` without growing it: itself, a scalar, the last
/// axis, and (rank ≥ 3) per-channel `[C, 1, 1]` / `[1, C, 1, 1]`.
fn broadcast_shapes(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![dims.to_vec(), vec![]];
    if let Some(&last) = dims.last() {
        out.push(vec![last]);
    }
    if dims.len() >= 3 {
        let mut per_channel = vec![1; dims.len() - 1];
        per_channel[0] = dims[1];
        out.push(per_channel.clone());
        let mut full_rank = vec![1; dims.len()];
        full_rank[1] = dims[1];
        out.push(full_rank);
    }
    out
}
