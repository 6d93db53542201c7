//! Weight declarations: `const @name : T = dense<...> | random<...> | external<...>`
//! (or elided), their dense literals and the safetensors sidecars they read.

use safetensors::{Dtype, SafeTensors};

use super::{Named, PResult, Parser, MAX_NESTING};
use crate::diag::quote;
use crate::files::{read_regular, Confinement};
use crate::tensor::{Tensor, TensorData};
use crate::text::attr_dict::{to_f32, AttrDict, AttrError, AttrLit};
use crate::text::lexer::Tok;
use crate::types::{DType, Layout, TensorType};
use crate::weights::{random_f32, AlignedBuf, WeightOrigin};

/// Number literals with their source offsets.
type Literals = Vec<(AttrLit, usize)>;

/// A weight initializer as written; dense literals keep their offsets and are converted
/// once the weight's element type is known.
enum Init {
    Dense { values: Literals, splat: bool },
    Random { seed: u64, min: f32, max: f32 },
    External { file: String, key: String },
    Elided,
}

/// The logical row-major elements of a weight declaration, by element type.
enum WeightValues {
    F32(Vec<f32>),
    /// Integer, `i1`, `f16` or `bf16` elements (row-major).
    Typed(TensorData),
}

/// The value of an integer literal (not a float) when it fits an i64.
fn lit_to_i64(lit: &AttrLit) -> Option<i64> {
    match lit {
        AttrLit::Num {
            negative,
            text,
            is_float: false,
        } => if *negative {
            format!("-{text}")
        } else {
            text.clone()
        }
        .parse()
        .ok(),
        _ => None,
    }
}

impl<'a> Parser<'a> {
    fn dense_values(&mut self, depth: usize, out: &mut Literals) -> PResult<()> {
        let at = self.at();
        if self.eat(&Tok::LBracket) {
            if depth >= MAX_NESTING {
                return Err(self.diag(
                    "too-deep",
                    format!("brackets nested deeper than {MAX_NESTING} levels"),
                    at,
                ));
            }
            if self.eat(&Tok::RBracket) {
                return Ok(());
            }
            loop {
                self.dense_values(depth + 1, out)?;
                if self.eat(&Tok::Comma) {
                    continue;
                }
                self.expect(Tok::RBracket, "',' or ']' in the dense list")?;
                return Ok(());
            }
        }
        out.push(self.number_lit()?);
        Ok(())
    }

    fn weight_init(&mut self) -> PResult<(Init, usize)> {
        let kind =
            self.expect_ident("the weight's data: dense<...>, random<...> or external<...>")?;
        let open = |p: &mut Self| p.expect(Tok::Lt, &format!("'<' after {}", kind.name));
        let init = match kind.name.as_str() {
            "dense" => {
                open(self)?;
                let splat = *self.peek() != Tok::LBracket;
                let mut values = Vec::new();
                self.dense_values(0, &mut values)?;
                self.expect(Tok::Gt, "'>' to close dense<...>")?;
                Init::Dense { values, splat }
            }
            "random" => {
                open(self)?;
                let entries = self.attr_entries(Tok::Gt, "bad-weight")?;
                let mut d = AttrDict::new("random<...>", kind.at, entries);
                let r = (|| {
                    let (seed, min, max) = (d.u64("seed")?, d.f32("min")?, d.f32("max")?);
                    Ok::<_, AttrError>((seed, min, max))
                })()
                .map_err(|e| self.attr_diag(e, "bad-weight"))?;
                d.finish().map_err(|e| self.attr_diag(e, "bad-weight"))?;
                match r {
                    (Some(seed), Some(min), Some(max)) => Init::Random {
                        seed,
                        min: min.0,
                        max: max.0,
                    },
                    _ => {
                        return Err(self.diag(
                            "bad-weight",
                            "random<...> needs seed, min and max",
                            kind.at,
                        ))
                    }
                }
            }
            "external" => {
                open(self)?;
                let file = self.expect_string("the sidecar file name as a string")?;
                self.expect(Tok::Comma, "',' and the tensor's name in the sidecar")?;
                let key = self.expect_string("the tensor's name as a string")?;
                self.expect(Tok::Gt, "'>' to close external<...>")?;
                Init::External { file, key }
            }
            "elided" => {
                open(self)?;
                self.expect_string("the content hash as a string")?;
                self.expect(Tok::Gt, "'>' to close elided<...>")?;
                Init::Elided
            }
            other => {
                return Err(self.diag(
                    "bad-weight",
                    format!(
                        "unknown weight data '{other}': expected dense<...>, random<...> or external<...>"
                    ),
                    kind.at,
                ))
            }
        };
        Ok((init, kind.at))
    }

    fn load_external(
        &mut self,
        file: &str,
        key: &str,
        ty: &TensorType,
    ) -> Result<Vec<f32>, String> {
        let Some(base) = self.base_dir else {
            return Err(
                "external weights are read relative to the .tir file's directory, \
                        which is unknown for text parsed from memory: parse the file itself \
                        or give a base directory"
                    .into(),
            );
        };
        let (allowed_root, budget) = (self.allowed_root, self.module.weights.memory_budget());
        let bytes = self.sidecars.entry(file.to_string()).or_insert_with(|| {
            // confined to the model's folder, a regular file, no larger than the budget
            let path = Confinement::new(base, allowed_root)
                .and_then(|c| c.resolve(file))
                .map_err(|e| format!("cannot read sidecar: {e}"))?;
            read_regular(&path, budget)
                .map_err(|e| format!("cannot read sidecar {}: {e}", quote(file)))
        });
        let bytes = bytes.as_ref().map_err(|e| e.clone())?;
        let st = SafeTensors::deserialize(bytes).map_err(|e| {
            format!(
                "sidecar {} is not a valid safetensors file: {e}",
                quote(file)
            )
        })?;
        let view = st.tensor(key).map_err(|_| {
            let mut names = st.names();
            names.sort();
            let shown: Vec<String> = names.iter().take(8).map(|n| quote(n)).collect();
            let more = if names.len() > 8 { ", ..." } else { "" };
            format!(
                "sidecar {} has no tensor {} (it has {}{more})",
                quote(file),
                quote(key),
                shown.join(", ")
            )
        })?;
        if view.dtype() != Dtype::F32 {
            return Err(format!(
                "tensor {} in {} has dtype {:?}; only F32 is supported",
                quote(key),
                quote(file),
                view.dtype()
            ));
        }
        if view.shape() != ty.dims.as_slice() {
            return Err(format!(
                "tensor {} in {} has shape {:?}, but {ty} needs {:?}",
                quote(key),
                quote(file),
                view.shape(),
                ty.dims
            ));
        }
        let data = view.data();
        if data.len() != ty.num_elements() * 4 {
            return Err(format!(
                "tensor {} in {} has {} bytes, expected {}",
                quote(key),
                quote(file),
                data.len(),
                ty.num_elements() * 4
            ));
        }
        Ok(data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Sums the declared sizes of every top-level weight before any is made, and fails
    /// at the first declaration that takes the sum over the memory budget: making
    /// weights one by one (a `random<...>` of 64M elements takes a fraction of a
    /// second) would spend seconds before the same error. Declarations whose header
    /// does not parse are skipped here; the real parse reports them. The cursor is
    /// left where it was.
    pub(super) fn declared_weights_fit(&mut self) -> PResult<()> {
        let start = self.pos;
        let budget = self.module.weights.memory_budget();
        let mut declared = self.module.weights.bytes();
        let mut depth = 0usize;
        let mut result = Ok(());
        while *self.peek() != Tok::Eof {
            let header = depth == 0
                && self.is_ident("const")
                && matches!(self.peek_nth(1), Tok::Global(_))
                && *self.peek_nth(2) == Tok::Colon;
            if !header {
                match self.bump().tok {
                    Tok::LBrace => depth += 1,
                    Tok::RBrace => depth = depth.saturating_sub(1),
                    _ => {}
                }
                continue;
            }
            self.bump();
            let name = match self.bump().tok {
                Tok::Global(name) => name,
                _ => String::new(),
            };
            let at = self.toks[self.pos - 1].start;
            self.bump();
            let Ok((ty, _)) = self.parse_type() else {
                continue;
            };
            let bytes = (ty.storage_len() as u64).saturating_mul(ty.dtype.size_bytes() as u64);
            if let Err(m) =
                crate::budget::check(&format!("weight @{name} ({ty})"), bytes, declared, budget)
            {
                result = Err(self.diag("memory-budget", m, at).with_note(
                    "the declared sizes of all weights are summed before any is made; \
                     'already held' counts the weights declared before this one",
                ));
                break;
            }
            declared = declared.saturating_add(bytes);
        }
        self.pos = start;
        result
    }

    /// `const @name : TYPE = INIT`
    pub(super) fn weight_decl(&mut self) -> PResult<()> {
        self.expect_keyword("const", "'const'")?;
        let name = self.expect_global("a weight name like @w0")?;
        self.expect(Tok::Colon, "':' and the weight's type")?;
        let (ty, ty_at) = self.parse_type()?;
        self.expect(Tok::Eq, "'=' and the weight's data")?;
        let (init, init_at) = self.weight_init()?;
        // checked before the values are made (a splat or random<...> of a billion
        // elements is a few bytes of text), and fatal: every later weight would only
        // repeat it
        let bytes = (ty.storage_len() * ty.dtype.size_bytes()) as u64;
        self.module
            .weights
            .check_room(&format!("weight @{} ({ty})", name.name), bytes)
            .map_err(|m| self.diag("memory-budget", m, name.at))?;
        let redefined = self.module.weights.lookup(&name.name).is_some();
        if !redefined {
            // Until it is added successfully, uses of the name are poisoned, not reported.
            self.failed_weights.insert(name.name.clone());
        }
        match self.weight_data(&name, &ty, ty_at, init, init_at) {
            Ok((values, origin)) => {
                let data = match values {
                    WeightValues::Typed(values) => AlignedBuf::from_data(&values),
                    WeightValues::F32(values) => match ty.layout {
                        Layout::RowMajor => AlignedBuf::from_f32(&values),
                        Layout::Blocked { .. } => AlignedBuf::from_data(
                            &Tensor {
                                ty: ty.with_layout(Layout::RowMajor),
                                data: values.into(),
                            }
                            .to_layout(ty.layout)
                            .data,
                        ),
                    },
                };
                match self.module.weights.add(name.name.clone(), ty, data, origin) {
                    Ok(_) => {
                        self.failed_weights.remove(&name.name);
                    }
                    Err(m) => self.report(self.diag("bad-weight", m, name.at))?,
                }
            }
            Err(d) => self.report(d)?,
        }
        Ok(())
    }

    /// The logical row-major values and origin of a weight declaration.
    fn weight_data(
        &mut self,
        name: &Named,
        ty: &TensorType,
        ty_at: usize,
        init: Init,
        init_at: usize,
    ) -> PResult<(WeightValues, WeightOrigin)> {
        if self.module.weights.lookup(&name.name).is_some() {
            return Err(self.diag(
                "duplicate-name",
                format!("weight @{} is defined twice", name.name),
                name.at,
            ));
        }
        let n = ty.num_elements();
        if ty.dtype.is_narrow_float() {
            // f16 and bf16 weights are float lists, each rounded to the type
            return match init {
                Init::Dense { values, splat }
                    if ty.layout == Layout::RowMajor && (values.len() == n || splat) =>
                {
                    let mut floats = Vec::with_capacity(values.len());
                    for (lit, at) in &values {
                        floats.push(
                            to_f32("dense", lit, *at)
                                .map_err(|e| self.attr_diag(e, "bad-weight"))?,
                        );
                    }
                    if splat && floats.len() == 1 {
                        floats = vec![floats[0]; n];
                    }
                    let data = TensorData::from_f32s(ty.dtype, &floats)
                        .ok_or_else(|| self.diag("bad-weight", "not a float type", init_at))?;
                    Ok((WeightValues::Typed(data), WeightOrigin::Inline))
                }
                _ => Err(self.diag(
                    "bad-weight",
                    format!(
                        "weight @{} has type {ty}: {} weights are row-major dense<[...]> lists of {n} numbers",
                        name.name, ty.dtype
                    ),
                    ty_at,
                )),
            };
        }
        if ty.dtype != DType::F32 {
            // Integer and i1 weights (ids, masks, shape tensors) are integer lists.
            return match init {
                Init::Dense { values, splat }
                    if ty.layout == Layout::RowMajor && (values.len() == n || splat) =>
                {
                    let mut ints = Vec::with_capacity(values.len());
                    for (lit, at) in &values {
                        let int = lit_to_i64(lit)
                            .and_then(|v| TensorData::from_i64s(ty.dtype, vec![v]).ok().map(|_| v));
                        ints.push(int.ok_or_else(|| {
                            self.diag(
                                "bad-weight",
                                format!(
                                    "{} weights hold integers in the {} range (no floats, no fractions)",
                                    ty.dtype, ty.dtype
                                ),
                                *at,
                            )
                        })?);
                    }
                    if splat && ints.len() == 1 {
                        ints = vec![ints[0]; n];
                    }
                    let data = TensorData::from_i64s(ty.dtype, ints)
                        .map_err(|m| self.diag("bad-weight", m, init_at))?;
                    Ok((WeightValues::Typed(data), WeightOrigin::Inline))
                }
                _ => Err(self.diag(
                    "bad-weight",
                    format!(
                        "weight @{} has type {ty}: {} weights are row-major dense<[...]> lists of {n} integers",
                        name.name, ty.dtype
                    ),
                    ty_at,
                )),
            };
        }
        match init {
            Init::Dense { values, splat } => {
                let mut floats = Vec::with_capacity(values.len());
                for (lit, at) in &values {
                    floats.push(
                        to_f32("dense", lit, *at).map_err(|e| self.attr_diag(e, "bad-weight"))?,
                    );
                }
                if splat && floats.len() == 1 {
                    Ok((WeightValues::F32(vec![floats[0]; n]), WeightOrigin::Inline))
                } else if floats.len() == n {
                    Ok((WeightValues::F32(floats), WeightOrigin::Inline))
                } else {
                    Err(self.diag(
                        "bad-weight",
                        format!(
                            "dense<...> has {} elements, but {ty} has {n}",
                            floats.len()
                        ),
                        init_at,
                    ))
                }
            }
            Init::Random { seed, min, max } => {
                if !(min.is_finite() && max.is_finite() && min <= max) {
                    return Err(self.diag(
                        "bad-weight",
                        format!("random<...> needs finite min <= max, got min = {min}, max = {max}"),
                        init_at,
                    ));
                }
                Ok((
                    WeightValues::F32(random_f32(seed, n, min, max)),
                    WeightOrigin::Random { seed, min, max },
                ))
            }
            Init::External { file, key } => match self.load_external(&file, &key, ty) {
                Ok(values) => Ok((
                    WeightValues::F32(values),
                    WeightOrigin::External { file, key },
                )),
                Err(m) => Err(self.diag("bad-weight", m, init_at)),
            },
            Init::Elided => Err(self
                .diag(
                    "elided-weight",
                    format!(
                        "the data of weight @{} was elided when this text was printed; it cannot be loaded",
                        name.name
                    ),
                    init_at,
                )
                .with_note("print the module without elide_weights (--elide-weights) to get loadable text")),
        }
    }
}
