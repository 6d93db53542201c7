//! Pieces shared by the subcommands: model loading with rendered diagnostics, fusion
//! switches, input files.

pub mod bench;
pub mod check_rules;
pub mod demo;
pub mod dot;
pub mod dump;
pub mod explain;
pub mod import;
pub mod opt;
pub mod out;
pub mod run;
pub mod verify;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use smelt::dynamic::{DynamicDim, DynamicInput};
use smelt::ir::{Module, Tensor};
use smelt::passes::fusion::load_rules;
use smelt::{DynamicExecutable, DynamicOptions, LoadOptions, OptimizeOptions};

/// The value of a `--shape` flag pinning input `name` to `dims`: `x=1x3x640x480`.
pub fn shape_pin(name: &str, dims: &[usize]) -> String {
    let dims: Vec<String> = dims.iter().map(usize::to_string).collect();
    format!("{name}={}", dims.join("x"))
}

/// The error for an input with symbols (an image's height and width) that no `--input`
/// file gives: nothing else sets its sizes.
pub fn no_file_for_symbols(exe: &DynamicExecutable, info: &DynamicInput) -> anyhow::Error {
    anyhow!(
        "input {} is tensor<{}x{}> with the symbols {}: give it with --input {}=FILE.npy, \
         or pin it with --shape {}=DIMS",
        info.name,
        info.shape_text(),
        info.dtype,
        exe.symbols().join(", "),
        info.name,
        info.name
    )
}

/// Refuses `--batch` and `--sequence` for a model with symbols besides the batch and
/// sequence length: its input files set every size.
pub fn refuse_sizes_for_symbols(
    model: &Path,
    exe: &DynamicExecutable,
    batch: bool,
    sequence: bool,
) -> Result<()> {
    if batch || sequence {
        bail!(
            "{} has the symbols {}: its input files set every size, so --batch and \
             --sequence do not apply",
            model.display(),
            exe.symbols().join(", ")
        );
    }
    Ok(())
}

/// A model file and how to read it.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// The model: a `.tir` text file or an `.onnx` file.
    pub model: PathBuf,
    /// Pin a dynamic input dimension of an ONNX model, e.g. `--shape input=1x3x224x224`.
    #[arg(long = "shape", value_name = "NAME=DIMS")]
    pub shapes: Vec<String>,
    /// One more folder the files a model names (`external<...>` sidecars, ONNX external
    /// data) may be read from; by default only the model's own folder.
    #[arg(long, value_name = "DIR")]
    pub allow_root: Option<PathBuf>,
    /// The memory budget for weights, folded constants and the run-time arena, in bytes
    /// or with a K, M, G or T suffix (powers of 1024), e.g. `--memory-budget 32G`.
    /// Default: half the machine's memory (and half of `ulimit -v`, if set).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub memory_budget: Option<u64>,
    /// For a model with a dynamic batch: compile a bucket per power of two the batch
    /// needs, instead of running every batch as copies of the batch-1 executable.
    #[arg(long)]
    pub batch_buckets: bool,
}

/// Parses a byte count with an optional binary suffix: `4096`, `512M`, `32G`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("'{s}': the unit must be K, M, G or T")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a byte count like 4096, 512M or 32G"))?;
    n.checked_mul(1 << shift)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("'{s}' must be between 1 byte and 16 EiB"))
}

impl ModelArgs {
    /// Loads the model; IR diagnostics are rendered with a caret excerpt of the source.
    pub fn load(&self) -> Result<Module> {
        load(&self.model, &self.load_options()?)
    }

    /// Loads the model, a `.tir` model with symbolic sizes specialized at the shapes of
    /// its `--input` files (`given`); without a file for such an input, the error names
    /// it and the two ways to give its shape.
    pub fn load_at(&self, given: &[(String, Tensor)]) -> Result<Module> {
        let module = self.load()?;
        let Some(entry) = module.entry().filter(|f| f.is_symbolic()) else {
            return Ok(module);
        };
        let mut shapes = std::collections::BTreeMap::new();
        for p in entry.params.iter().filter(|p| p.ty.is_symbolic()) {
            let Some((_, t)) = given.iter().find(|(n, _)| *n == p.name) else {
                bail!(
                    "input '{}' of {} has symbolic sizes ({}): give it with --input {}=FILE.npy \
                     or pin its shape with --shape {}=...",
                    p.name,
                    self.model.display(),
                    p.ty,
                    p.name,
                    p.name
                );
            };
            shapes.insert(p.name.clone(), t.ty.dims.clone());
        }
        smelt::ir::symbolic::specialize(&module, &shapes)
            .map_err(|d| anyhow!("{}: {}", self.model.display(), d.to_string().trim_end()))
    }

    /// Loads the model with the dynamic dimensions of an ONNX model that no `--shape`
    /// pins kept as symbols (for the commands that print or optimize it).
    pub fn load_symbolic(&self) -> Result<Module> {
        let opts = LoadOptions {
            symbolic: true,
            ..self.load_options()?
        };
        load(&self.model, &opts)
    }

    /// The model as a [`DynamicExecutable`] (nothing compiled yet) when it is an ONNX
    /// file whose inputs keep a dynamic leading batch that no `--shape` pins, and no
    /// other dynamic dimension; `None` for any other model, which then loads as
    /// [`ModelArgs::load`] does (and fails there, naming the dims to pin, if some other
    /// dim is dynamic). `opts` are the compile options of every bucket.
    pub fn dynamic(&self, opts: &smelt::Options) -> Result<Option<DynamicExecutable>> {
        let is_onnx = self
            .model
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
        if !is_onnx {
            return Ok(None);
        }
        let mut opts = opts.clone();
        opts.load = self.load_options()?;
        let dynamic = DynamicOptions {
            batch_copies: !self.batch_buckets,
            ..DynamicOptions::default()
        };
        Ok(DynamicExecutable::new(&self.model, &opts, dynamic).ok())
    }

    /// These model arguments with the inputs that have symbols besides the batch and
    /// sequence length (an image's height and width: [`DynamicExecutable::symbols`])
    /// pinned to the shapes of their `given` files, for commands that compile one
    /// executable; an input with symbols and no file is an error naming it.
    pub fn pinned_by_files(
        &self,
        exe: &DynamicExecutable,
        given: &[(String, Tensor)],
    ) -> Result<ModelArgs> {
        let mut pinned = self.clone();
        for info in exe.inputs() {
            if !info.dims.iter().any(|d| matches!(d, DynamicDim::Symbol(_))) {
                continue;
            }
            let Some((_, t)) = given.iter().find(|(n, _)| *n == info.name) else {
                return Err(no_file_for_symbols(exe, info));
            };
            pinned.shapes.push(shape_pin(&info.name, &t.ty.dims));
        }
        Ok(pinned)
    }

    /// How to read the model: its pinned shapes and file limits.
    fn load_options(&self) -> Result<LoadOptions> {
        let mut opts = LoadOptions {
            interface: smelt::Interface::Cli,
            allowed_root: self.allow_root.clone(),
            memory_budget: self.memory_budget,
            ..LoadOptions::default()
        };
        for arg in &self.shapes {
            let (name, dims) = arg
                .split_once('=')
                .ok_or_else(|| anyhow!("--shape '{arg}' must look like NAME=1x3x224x224"))?;
            let dims = dims
                .split('x')
                .map(|d| d.trim().parse::<usize>().ok())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    anyhow!(
                        "--shape '{arg}': dimensions must be non-negative integers joined by 'x'"
                    )
                })?;
            if opts.input_shapes.insert(name.to_string(), dims).is_some() {
                bail!("--shape gives input '{name}' twice");
            }
        }
        Ok(opts)
    }
}

fn load(path: &Path, opts: &LoadOptions) -> Result<Module> {
    smelt::load_model(path, opts).map_err(|e| match &e {
        smelt::Error::Ir(diags) => {
            // read again for the excerpt, with the same limits (it may be /dev/zero)
            let src = smelt::ir::files::read_regular(path, smelt::ir::text::MAX_TEXT_BYTES)
                .ok()
                .and_then(|b| String::from_utf8(b).ok());
            anyhow!("{}", diags.render(src.as_deref()).trim_end())
        }
        _ => anyhow!(e),
    })
}

/// Which code computes conv tiles (`--kernels`; see [`smelt::Kernels`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kernels {
    /// The widest micro-kernel the CPU runs (AVX-512, else AVX2), else Cranelift code.
    Auto,
    /// Only Cranelift-generated code (the portable path).
    Cranelift,
    /// The AVX2 + FMA micro-kernel.
    Avx2,
    /// The AVX-512 micro-kernel.
    Avx512,
}

impl Kernels {
    /// The library's choice.
    pub fn choice(self) -> smelt::Kernels {
        match self {
            Kernels::Auto => smelt::Kernels::Auto,
            Kernels::Cranelift => smelt::Kernels::Cranelift,
            Kernels::Avx2 => smelt::Kernels::Avx2,
            Kernels::Avx512 => smelt::Kernels::Avx512,
        }
    }

    /// The name in reports.
    pub fn name(self) -> &'static str {
        self.choice().name()
    }
}

/// Options choosing and configuring fusion, shared by every command that compiles.
#[derive(Args, Clone, Debug, Default)]
pub struct FusionArgs {
    /// Disable every fusion rewrite (BN, add and activations stay separate ops).
    #[arg(long)]
    pub no_fuse: bool,
    /// Rules not to run (comma-separated names).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub disable_rules: Vec<String>,
    /// Run only these rules (comma-separated names).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub only_rules: Option<Vec<String>>,
    /// Load extra fusion rules from a rule file.
    #[arg(long, value_name = "FILE")]
    pub rules: Vec<PathBuf>,
    /// Run `--rules` rules that fail the numerical check (unsound or untested), with a
    /// warning each; without it such a rule is an error.
    #[arg(long)]
    pub allow_unchecked_rules: bool,
}

impl FusionArgs {
    /// The optimization options these switches describe, running `passes` (or the default pipeline).
    pub fn options(&self, passes: Option<Vec<String>>) -> Result<OptimizeOptions> {
        let mut opts = OptimizeOptions {
            passes,
            ..OptimizeOptions::default()
        };
        opts.fusion.enabled = !self.no_fuse;
        opts.fusion.disabled_rules = self.disable_rules.clone();
        opts.fusion.only_rules = self.only_rules.clone();
        opts.fusion.allow_unchecked_rules = self.allow_unchecked_rules;
        for path in &self.rules {
            let src = read_text(path)?;
            let rules = load_rules(&src, &path.display().to_string())
                .map_err(|d| anyhow!("{}", d.render(Some(&src)).trim_end()))?;
            opts.fusion.extra_rules.extend(rules);
        }
        Ok(opts)
    }
}

/// Reads a UTF-8 text file (a rule file: a regular file of at most
/// `MAX_RULE_FILE_BYTES`), naming it in the error.
pub fn read_text(path: &Path) -> Result<String> {
    use smelt::passes::fusion::rules::MAX_RULE_FILE_BYTES;
    let bytes = smelt::ir::files::read_regular(path, MAX_RULE_FILE_BYTES)
        .map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    String::from_utf8(bytes).with_context(|| format!("cannot read {}", path.display()))
}

/// Parses `NAME=FILE.npy` arguments into tensors by name; a name given twice is an
/// error (the second would otherwise be ignored). Each file is a regular file of at most
/// the tensor limit (plus its header).
pub fn read_inputs(args: &[String]) -> Result<Vec<(String, Tensor)>> {
    let mut inputs: Vec<(String, Tensor)> = Vec::with_capacity(args.len());
    for arg in args {
        let (name, file) = arg
            .split_once('=')
            .ok_or_else(|| anyhow!("--input '{arg}' must look like NAME=FILE.npy"))?;
        if inputs.iter().any(|(n, _)| n == name) {
            bail!("--input gives '{name}' twice");
        }
        let bytes = smelt::ir::files::read_regular(Path::new(file), MAX_NPY_BYTES)
            .map_err(|e| anyhow!("cannot read {file}: {e}"))?;
        let t = smelt::npy::decode(&bytes).map_err(|e| anyhow!("{file}: {e}"))?;
        inputs.push((name.to_string(), t));
    }
    Ok(inputs)
}

/// The inputs of a function with parameters `params` (name and type), in order: each
/// given one (`--input`, from [`read_inputs`]) checked against its parameter's shape, the
/// others seeded random values when `random` holds a seed (`Tensor::random`, seed + index),
/// else an error naming the missing input. Each is put in its parameter's layout.
pub fn inputs_for<'p>(
    params: impl IntoIterator<Item = (&'p str, &'p smelt::ir::TensorType)>,
    mut given: Vec<(String, Tensor)>,
    random: Option<u64>,
    owner: &str,
) -> Result<Vec<Tensor>> {
    let params: Vec<_> = params.into_iter().collect();
    for (name, _) in &given {
        if !params.iter().any(|(p, _)| p == name) {
            let known: Vec<_> = params.iter().map(|(p, _)| format!("%{p}")).collect();
            bail!(
                "{owner} has no parameter %{name} (parameters: {})",
                known.join(", ")
            );
        }
    }
    let mut inputs = Vec::with_capacity(params.len());
    for (i, (name, ty)) in params.into_iter().enumerate() {
        let t = match given.iter().position(|(n, _)| n == name) {
            Some(k) => given.swap_remove(k).1,
            None => match random {
                Some(seed) => Tensor::random(ty, seed + i as u64),
                None => bail!(
                    "missing input %{name}: {ty} (pass --input {name}=FILE.npy, or --random-inputs SEED)"
                ),
            },
        };
        if t.ty.dims != ty.dims {
            bail!(
                "input %{name} must have shape {ty}, the .npy file has {:?}",
                t.ty.dims
            );
        }
        inputs.push(t.to_layout(ty.layout));
    }
    Ok(inputs)
}

/// The batch and sequence length of a run of `exe` (a model with a dynamic batch or
/// sequence length): the sizes of the given inputs, else `batch` (default 1) and
/// `sequence` (default the shortest length bucket; ignored by a model without one).
pub fn dynamic_shape(
    exe: &DynamicExecutable,
    given: &[(String, Tensor)],
    batch: Option<usize>,
    sequence: Option<usize>,
) -> Result<(usize, usize)> {
    let from_files = |dim: DynamicDim| {
        exe.inputs().iter().find_map(|i| {
            let t = &given.iter().find(|(n, _)| *n == i.name)?.1;
            let k = i.dims.iter().position(|&d| d == dim)?;
            t.ty.dims.get(k).copied()
        })
    };
    let pick = |what: &str, flag: &str, from: Option<usize>, asked: Option<usize>, default| {
        let n = match (from, asked) {
            (Some(f), Some(b)) if f != b => {
                bail!("{flag} {b} disagrees with the {what} of the given inputs ({f})")
            }
            (Some(f), _) => f,
            (None, b) => b.unwrap_or(default),
        };
        if n == 0 {
            bail!("the {what} must be at least 1");
        }
        Ok(n)
    };
    let sequenced = !exe.length_buckets().is_empty();
    if sequence.is_some() && !sequenced {
        bail!("--sequence applies to a model with a dynamic sequence length; this one has none");
    }
    let n = pick("batch", "--batch", from_files(DynamicDim::Batch), batch, 1)?;
    let shortest = exe.length_buckets().first().copied().unwrap_or(1);
    let length = pick(
        "sequence length",
        "--sequence",
        from_files(DynamicDim::Sequence),
        sequence,
        shortest,
    )?;
    Ok((n, length))
}

/// The inputs of a run of `exe` (a model with a dynamic batch or sequence length): its
/// batch and length as [`dynamic_shape`] finds them; the inputs not given are seeded
/// random values when `random` holds a seed (as [`inputs_for`]).
pub fn dynamic_inputs(
    exe: &DynamicExecutable,
    given: Vec<(String, Tensor)>,
    random: Option<u64>,
    batch: Option<usize>,
    sequence: Option<usize>,
) -> Result<((usize, usize), Vec<Tensor>)> {
    let (n, length) = dynamic_shape(exe, &given, batch, sequence)?;
    let types: Vec<_> = exe.inputs().iter().map(|i| i.type_at(n, length)).collect();
    let params = exe
        .inputs()
        .iter()
        .zip(&types)
        .map(|(i, t)| (i.name.as_str(), t));
    Ok(((n, length), inputs_for(params, given, random, "the model")?))
}

/// The largest `.npy` input read: a tensor at the tensor limit, as f64, and its header.
const MAX_NPY_BYTES: u64 = 2 * smelt::ir::types::MAX_TENSOR_BYTES + (1 << 20);
