//! Verification of fusion: the model run three ways (interpreter unfused, interpreter
//! fused, JIT fused), compared output by output, layer by layer, and bisected over the
//! fusion sites to name the rewrite that broke it.
//!
//! The reference is always the interpreter on the module as loaded (no passes). The
//! fused module is what [`crate::optimize`] makes of it with the given options, so rule
//! switches (`disabled_rules`, `only_rules`, `extra_rules`, `enabled: false`) apply.
//! Errors are measured as FACTS.md defines them: relative error = max |got − ref| /
//! max |ref| over an output, in f64; a comparison passes when it is at most `rtol`.
//!
//! Random inputs in [-1, 1] alone cannot see a rewrite that is wrong only at larger
//! magnitudes (hard-swish written without its clip agrees on [-3, 3]), so the outputs are
//! compared again on random inputs in each of [`VerifyOptions::input_ranges`] (by default
//! ±20, past every activation's knee, and ±1e3); those comparisons count like the first.
//! The per-layer comparison and the bisection run on the inputs of the first range whose
//! outputs failed, so they look where the failure shows.
//!
//! ```no_run
//! use smelt::verify::{verify, VerifyOptions};
//! let module = smelt::load_model("model.tir".as_ref(), &Default::default())?;
//! let report = verify(&module, &VerifyOptions::default())?;
//! print!("{}", report.to_text());
//! assert!(report.passed());
//! # Ok::<(), smelt::Error>(())
//! ```
//!
//! This file holds the options, the report types and the three-way comparison; `layers`
//! the per-layer comparison, `bisect` the bisection, `text` and `json` the two output
//! forms ([`VerifyReport::to_text`], [`VerifyReport::to_json`]).

mod bisect;
mod json;
mod layers;
mod text;

use serde::Serialize;
use smelt_ir::diag::Location;
use smelt_ir::graph::{Func, Module};
use smelt_ir::interp;
use smelt_ir::{ErrorStats, Tensor, TensorType};
use smelt_passes::fusion::FusionSite;

use crate::{CompileOptions, Error, Executable, OptimizeOptions};

/// The default tolerance on the relative error (FACTS.md's definition).
pub const DEFAULT_RTOL: f64 = 1e-4;

/// What to verify and how.
#[derive(Clone, Debug)]
pub struct VerifyOptions {
    /// How to optimize the model into its fused form (pipeline and rule switches).
    pub optimize: OptimizeOptions,
    /// Inputs by parameter name; parameters not named here get seeded random values.
    pub inputs: Vec<(String, Tensor)>,
    /// Seed of the random inputs: parameter `i` uses `seed + i`, values in [-1, 1].
    pub seed: u64,
    /// Largest relative error that passes.
    pub rtol: f64,
    /// Compare every intermediate value that survives fusion with the unfused graph, on
    /// the inputs of the first range whose outputs failed ([`PerLayerReport::input_range`]).
    pub per_layer: bool,
    /// On a mismatch, find the first fusion site whose inclusion causes it (on the same
    /// inputs as `per_layer`).
    pub bisect: bool,
    /// Run the JIT legs (compile the fused module with Cranelift). On by default.
    pub jit: bool,
    /// Compare the outputs again on random inputs in [-r, r] for each `r` here (the same
    /// seeds; given inputs stay as given); none when every input is given.
    pub input_ranges: Vec<f32>,
}

/// The default [`VerifyOptions::input_ranges`]: past every activation's knee, and large.
pub const DEFAULT_INPUT_RANGES: [f32; 2] = [20.0, 1e3];

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            optimize: OptimizeOptions::default(),
            inputs: Vec::new(),
            seed: 0,
            rtol: DEFAULT_RTOL,
            per_layer: false,
            bisect: false,
            jit: true,
            input_ranges: DEFAULT_INPUT_RANGES.to_vec(),
        }
    }
}

/// One way of running the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Run {
    /// The reference interpreter on the module as loaded.
    InterpUnfused,
    /// The reference interpreter on the optimized (fused) module.
    InterpFused,
    /// Cranelift-compiled code of the optimized module.
    JitFused,
    /// A dynamic-batch executable ([`crate::DynamicExecutable`]): the batch run as its
    /// chunks, each on its bucket's compiled code.
    JitDynamic,
}

impl Run {
    /// Short label used in reports: `interp(unfused)`, `interp(fused)`, `jit(fused)`.
    pub fn label(self) -> &'static str {
        match self {
            Run::InterpUnfused => "interp(unfused)",
            Run::InterpFused => "interp(fused)",
            Run::JitFused => "jit(fused)",
            Run::JitDynamic => "jit(dynamic)",
        }
    }
}

/// A run serializes as its [`Run::label`].
impl Serialize for Run {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.label())
    }
}

/// Where an input came from.
#[derive(Clone, Debug, PartialEq)]
pub enum InputSource {
    /// Given by the caller.
    Given,
    /// Seeded random values in [-1, 1].
    Random {
        /// The seed used for this parameter.
        seed: u64,
    },
}

/// One input of the verified function.
#[derive(Clone, Debug, PartialEq)]
pub struct InputInfo {
    /// Parameter name.
    pub name: String,
    /// Its type.
    pub ty: TensorType,
    /// Where its values came from.
    pub source: InputSource,
}

/// One pair of runs compared on one tensor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// The run checked.
    pub got: Run,
    /// The run it is checked against.
    pub reference: Run,
    /// Max abs, relative and RMSE error.
    pub stats: ErrorStats,
    /// Whether `stats.relative <= rtol`.
    pub pass: bool,
}

/// The outputs compared on random inputs of one wider range.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RangeCheck {
    /// Random inputs are uniform in [-range, range].
    pub range: f32,
    /// Per-output comparisons, as in [`VerifyReport::outputs`].
    pub outputs: Vec<OutputCheck>,
}

/// The comparisons of one output.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutputCheck {
    /// Result name.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub ty: TensorType,
    /// Every pair compared, in a fixed order.
    pub comparisons: Vec<Comparison>,
}

/// A user op (of the unfused module) merged into a fused op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UserOp {
    /// The op's mnemonic in the unfused module (`?` when no unfused op has the location).
    pub op: String,
    /// Its location: the node name, or file:line:col.
    pub location: Location,
}

impl std::fmt::Display for UserOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.op, self.location)
    }
}

/// An intermediate value of the fused module compared with its unfused counterpart.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerCheck {
    /// Instruction index in the fused function (value `%i` in its printed form, counting
    /// parameters first, is `params + index`).
    pub inst: usize,
    /// The op, e.g. `fused conv2d post [add, relu]`.
    pub op: String,
    /// The user ops it computes, in program order (the last one is the value compared).
    pub user_ops: Vec<UserOp>,
    /// Rules that built it (empty for an op that came through unchanged).
    pub rules: Vec<String>,
    /// Instruction index in the unfused function of the value compared against.
    pub reference_inst: usize,
    /// Interpreter on the fused module against interpreter on the unfused module.
    pub interp: ErrorStats,
    /// JIT on the fused module against the interpreter on the unfused module, when the
    /// JIT's intermediates could be read.
    pub jit: Option<ErrorStats>,
    /// Whether every error is within the tolerance.
    pub pass: bool,
}

/// A fused-module op that had no unfused value to compare with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedLayer {
    /// Instruction index in the fused function.
    pub inst: usize,
    /// The op.
    pub op: String,
    /// Its location.
    pub location: Location,
    /// Why it was not compared.
    pub reason: String,
}

/// The per-layer comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct PerLayerReport {
    /// Random inputs were uniform in [-input_range, input_range]: the first range whose
    /// outputs failed (1 when the [-1, 1] comparison did, or when nothing failed).
    pub input_range: f32,
    /// Compared values, in the fused function's program order.
    pub layers: Vec<LayerCheck>,
    /// Values not compared, with the reason.
    pub skipped: Vec<SkippedLayer>,
    /// Index into `layers` of the first value that diverges.
    pub first_divergence: Option<usize>,
    /// Why the JIT's intermediates were not compared, if they were not.
    pub jit_note: Option<String>,
}

/// One probe of the bisection: fusion limited to the first `sites` sites.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BisectProbe {
    /// Sites allowed.
    pub sites: usize,
    /// Largest relative error over the outputs.
    pub relative: f64,
    /// Whether that is within the tolerance.
    pub agree: bool,
}

/// What the bisection found.
#[derive(Clone, Debug, PartialEq)]
pub enum BisectOutcome {
    /// Fused and unfused agree: nothing to bisect.
    NotNeeded,
    /// Allowing the first `sites - 1` sites agrees, the first `sites` disagree: the
    /// `sites`-th site (1-based) is the first bad one.
    Culprit {
        /// How many sites were allowed when the mismatch first appeared.
        sites: usize,
        /// The site, as the fusion report of that run names it.
        site: FusionSite,
        /// The user ops the site merges.
        user_ops: Vec<UserOp>,
    },
    /// The mismatch is there with no fusion site at all (another pass, or the JIT).
    WithoutFusion,
    /// The full fusion has no site, yet disagrees while no site agrees: limiting sites
    /// cannot reproduce the mismatch.
    NotReproduced,
    /// Bisection could not run.
    Unavailable(String),
}

/// The bisection over fusion sites.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BisectReport {
    /// Random inputs were uniform in [-input_range, input_range], as for
    /// [`PerLayerReport::input_range`]: the first range where the outputs disagreed.
    pub input_range: f32,
    /// The run whose outputs are compared with the reference at each probe.
    pub oracle: Run,
    /// Fusion sites of the full optimization.
    pub total_sites: usize,
    /// Probes in the order they ran.
    pub probes: Vec<BisectProbe>,
    /// The result.
    #[serde(serialize_with = "json::serialize_outcome")]
    pub outcome: BisectOutcome,
}

/// Everything `verify` found.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyReport {
    /// The verified function.
    pub func: String,
    /// The tolerance used.
    pub rtol: f64,
    /// Inputs and where they came from.
    pub inputs: Vec<InputInfo>,
    /// Fusion sites of the fused module (from the fusion report).
    pub sites: Vec<FusionSite>,
    /// Names of the user rules (`extra_rules`) that were loaded, marked in the text.
    pub user_rules: Vec<String>,
    /// Why the JIT legs did not run, if they did not (compile or run error).
    pub jit_error: Option<String>,
    /// Per-output comparisons.
    pub outputs: Vec<OutputCheck>,
    /// The outputs compared again on wider random inputs ([`VerifyOptions::input_ranges`]).
    pub ranges: Vec<RangeCheck>,
    /// Warnings of the optimization (a user rule that failed the numerical check and
    /// runs only because unchecked rules are allowed, a fusion limit hit), as text.
    pub warnings: Vec<String>,
    /// The per-layer comparison, when asked for.
    pub per_layer: Option<PerLayerReport>,
    /// The bisection, when asked for.
    pub bisect: Option<BisectReport>,
}

impl VerifyReport {
    /// Whether every comparison passed and, when the JIT was asked for, it ran.
    pub fn passed(&self) -> bool {
        self.jit_error.is_none()
            && self
                .outputs
                .iter()
                .chain(self.ranges.iter().flat_map(|r| &r.outputs))
                .all(|o| o.comparisons.iter().all(|c| c.pass))
            && self
                .per_layer
                .as_ref()
                .is_none_or(|p| p.first_divergence.is_none())
    }

    /// The worst relative error of `got` against `reference` over the outputs on
    /// inputs in [-1, 1].
    pub fn worst(&self, got: Run, reference: Run) -> Option<f64> {
        worst_of(&self.outputs, got, reference)
    }

    /// The outputs compared on inputs in [-`range`, `range`] (1: [`VerifyReport::outputs`]).
    pub fn outputs_in(&self, range: f32) -> Option<&[OutputCheck]> {
        if range == 1.0 {
            return Some(&self.outputs);
        }
        self.ranges
            .iter()
            .find(|r| r.range == range)
            .map(|r| r.outputs.as_slice())
    }
}

/// The worst relative error of `got` against `reference` over `outputs`.
pub(crate) fn worst_of(outputs: &[OutputCheck], got: Run, reference: Run) -> Option<f64> {
    outputs
        .iter()
        .flat_map(|o| &o.comparisons)
        .filter(|c| c.got == got && c.reference == reference)
        .map(|c| c.stats.relative)
        .reduce(f64::max)
}

/// The range `--per-layer` and `--bisect` look at: where the outputs first fail — [-1, 1],
/// else the first wider range that fails — so a rewrite wrong only at large magnitudes is
/// located on inputs that show it; [-1, 1] when nothing fails.
fn failing_range(outputs: &[OutputCheck], ranges: &[RangeCheck]) -> f32 {
    let fails = |o: &[OutputCheck]| o.iter().any(|o| o.comparisons.iter().any(|c| !c.pass));
    if fails(outputs) {
        return 1.0;
    }
    ranges
        .iter()
        .find(|r| fails(&r.outputs))
        .map_or(1.0, |r| r.range)
}

/// Verifies the entry function of `module`: see the module documentation.
///
/// Errors are for what prevents verification (bad inputs, a pass failing, the reference
/// interpreter failing); a JIT that cannot compile the model is reported in
/// [`VerifyReport::jit_error`] and fails the report.
pub fn verify(module: &Module, opts: &VerifyOptions) -> Result<VerifyReport, Error> {
    verify_with(module, opts, None)
}

/// [`verify`], and with `dynamic` (the executable and its batch, `module` being the
/// model at that batch) the dynamic run of the same inputs against the reference too.
fn verify_with(
    module: &Module,
    opts: &VerifyOptions,
    dynamic: Option<(&crate::DynamicExecutable, usize)>,
) -> Result<VerifyReport, Error> {
    let func = module
        .entry()
        .ok_or_else(|| Error::InvalidArgument(module.no_entry_reason()))?;
    let (inputs, input_infos) = make_inputs(func, opts)?;

    let mut fused = module.clone();
    let cx = crate::optimize(&mut fused, &opts.optimize, None)?;
    let fused_func = fused.func(&func.name).ok_or_else(|| {
        Error::Unsupported(format!("optimization removed function @{}", func.name))
    })?;
    let sites: Vec<FusionSite> = cx
        .fusion_reports
        .iter()
        .find(|r| r.func == func.name)
        .map(|r| r.sites.clone())
        .unwrap_or_default();

    // Interpreter runs; all values when comparing layer by layer.
    let (reference_all, fused_all) = if opts.per_layer {
        (
            Some(interp::run_keep_all(module, func, &inputs)?),
            Some(interp::run_keep_all(&fused, fused_func, &inputs)?),
        )
    } else {
        (None, None)
    };
    let reference = match &reference_all {
        Some(all) => results_of(func, all),
        None => interp::run(module, func, &inputs)?,
    };
    let interp_fused = match &fused_all {
        Some(all) => results_of(fused_func, all),
        None => interp::run(&fused, fused_func, &inputs)?,
    };
    let exe = if opts.jit {
        Some(Executable::compile(
            &fused,
            Some(&func.name),
            &CompileOptions::default(),
        ))
    } else {
        None
    };
    let jit = |inputs: &[Tensor]| -> (Option<Vec<Tensor>>, Option<String>) {
        match &exe {
            Some(Ok(exe)) => match exe.run(inputs) {
                Ok(out) => (Some(out), None),
                Err(e) => (None, Some(e.to_string())),
            },
            Some(Err(e)) => (None, Some(e.to_string())),
            None => (None, None),
        }
    };
    let (jit_fused, mut jit_error) = jit(&inputs);
    let mut outputs = compare_outputs(
        func,
        &reference,
        &interp_fused,
        jit_fused.as_deref(),
        opts.rtol,
    )?;
    if let Some((exe, batch)) = dynamic {
        match exe.run(&inputs) {
            Ok(got) => {
                for ((out, g), (r, want)) in outputs
                    .iter_mut()
                    .zip(&got)
                    .zip(func.results.iter().zip(&reference))
                {
                    out.comparisons.push(compare(
                        Run::JitDynamic,
                        Run::InterpUnfused,
                        g,
                        want,
                        opts.rtol,
                        &r.name,
                    )?);
                }
            }
            Err(e) => {
                let why = format!("the dynamic executable at batch {batch}: {e}");
                jit_error = Some(match jit_error.take() {
                    Some(before) => format!("{before}; {why}"),
                    None => why,
                });
            }
        }
    }

    // The same comparison on wider random inputs (only the random ones change).
    let mut ranges = Vec::new();
    let any_random = input_infos
        .iter()
        .any(|i| matches!(i.source, InputSource::Random { .. }));
    for &range in opts.input_ranges.iter().filter(|_| any_random) {
        if !(range.is_finite() && range > 0.0) {
            return Err(Error::InvalidArgument(format!(
                "an input range must be a finite number > 0, got {range}"
            )));
        }
        let (wide, _) = make_inputs_in(func, opts, range)?;
        let reference = interp::run(module, func, &wide)?;
        let interp_fused = interp::run(&fused, fused_func, &wide)?;
        let (jit_fused, _) = jit(&wide);
        ranges.push(RangeCheck {
            range,
            outputs: compare_outputs(
                func,
                &reference,
                &interp_fused,
                jit_fused.as_deref(),
                opts.rtol,
            )?,
        });
    }

    // Per-layer and bisection look where the outputs failed, on that range's inputs.
    let focus = failing_range(&outputs, &ranges);
    let wide: (Vec<Tensor>, Vec<Tensor>);
    let (focus_inputs, focus_reference): (&[Tensor], &[Tensor]) = if focus == 1.0 {
        (&inputs, &reference)
    } else {
        let (inputs, _) = make_inputs_in(func, opts, focus)?;
        let reference = interp::run(module, func, &inputs)?;
        wide = (inputs, reference);
        (&wide.0, &wide.1)
    };
    let per_layer = match (&reference_all, &fused_all) {
        (Some(reference_all), Some(fused_all)) => {
            let wide_all = if focus == 1.0 {
                None
            } else {
                Some((
                    interp::run_keep_all(module, func, focus_inputs)?,
                    interp::run_keep_all(&fused, fused_func, focus_inputs)?,
                ))
            };
            let (reference_all, fused_all) = match &wide_all {
                Some((r, f)) => (r.as_slice(), f.as_slice()),
                None => (reference_all.as_slice(), fused_all.as_slice()),
            };
            Some(layers::per_layer(
                func,
                fused_func,
                &fused,
                &sites,
                reference_all,
                fused_all,
                focus_inputs,
                focus,
                opts,
            ))
        }
        _ => None,
    };

    let mut report = VerifyReport {
        func: func.name.clone(),
        rtol: opts.rtol,
        inputs: input_infos,
        sites,
        user_rules: opts
            .optimize
            .fusion
            .extra_rules
            .iter()
            .map(|r| r.name.clone())
            .collect(),
        jit_error,
        outputs,
        ranges,
        warnings: cx.warnings.iter().map(|w| w.to_string()).collect(),
        per_layer,
        bisect: None,
    };
    if opts.bisect {
        report.bisect = Some(bisect::bisect(
            module,
            func,
            focus_inputs,
            focus_reference,
            focus,
            &report,
            opts,
        ));
    }
    Ok(report)
}

/// Every output's comparisons: interp(fused) and, when the JIT ran, jit(fused) against
/// the reference, and jit(fused) against interp(fused).
/// [`verify`] for a model whose batch (or sequence length) is dynamic, at `batch` (and
/// `length`, ignored by a model without one): the model specialized at that shape goes
/// through every check of [`verify`], and the dynamic executable's run
/// of the same inputs (split into its chunks, see [`crate::dynamic`]) is compared with
/// the reference interpreter too (`jit(dynamic)` against `interp(unfused)` for each
/// output). Wider input ranges are checked on the specialized module only.
pub fn verify_dynamic(
    exe: &crate::DynamicExecutable,
    batch: usize,
    length: usize,
    opts: &VerifyOptions,
) -> Result<VerifyReport, Error> {
    verify_with(&exe.module_at(batch, length)?, opts, Some((exe, batch)))
}

fn compare_outputs(
    func: &Func,
    reference: &[Tensor],
    interp_fused: &[Tensor],
    jit_fused: Option<&[Tensor]>,
    rtol: f64,
) -> Result<Vec<OutputCheck>, Error> {
    let mut outputs = Vec::with_capacity(func.results.len());
    for (i, r) in func.results.iter().enumerate() {
        let want = reference
            .get(i)
            .ok_or_else(|| missing_result("the reference interpreter", &r.name))?;
        let got = interp_fused
            .get(i)
            .ok_or_else(|| missing_result("the interpreter on the fused module", &r.name))?;
        let mut comparisons = vec![compare(
            Run::InterpFused,
            Run::InterpUnfused,
            got,
            want,
            rtol,
            &r.name,
        )?];
        if let Some(jit) = jit_fused {
            let j = jit
                .get(i)
                .ok_or_else(|| missing_result("the JIT", &r.name))?;
            comparisons.push(compare(
                Run::JitFused,
                Run::InterpUnfused,
                j,
                want,
                rtol,
                &r.name,
            )?);
            comparisons.push(compare(
                Run::JitFused,
                Run::InterpFused,
                j,
                got,
                rtol,
                &r.name,
            )?);
        }
        outputs.push(OutputCheck {
            name: r.name.clone(),
            ty: func.type_of(r.value).clone(),
            comparisons,
        });
    }
    Ok(outputs)
}

fn missing_result(who: &str, name: &str) -> Error {
    Error::Unsupported(format!("{who} returned no value for result {name}"))
}

/// The inputs: given ones checked against the parameters, the rest seeded random in
/// [-1, 1].
fn make_inputs(func: &Func, opts: &VerifyOptions) -> Result<(Vec<Tensor>, Vec<InputInfo>), Error> {
    make_inputs_in(func, opts, 1.0)
}

/// [`make_inputs`] with random inputs in [-range, range].
fn make_inputs_in(
    func: &Func,
    opts: &VerifyOptions,
    range: f32,
) -> Result<(Vec<Tensor>, Vec<InputInfo>), Error> {
    for (k, (name, _)) in opts.inputs.iter().enumerate() {
        if !func.params.iter().any(|p| &p.name == name) {
            let known: Vec<String> = func.params.iter().map(|p| format!("%{}", p.name)).collect();
            return Err(Error::InvalidArgument(format!(
                "@{} has no parameter %{name} (parameters: {})",
                func.name,
                known.join(", ")
            )));
        }
        if opts.inputs[..k].iter().any(|(n, _)| n == name) {
            return Err(Error::InvalidArgument(format!(
                "input %{name} is given twice"
            )));
        }
    }
    let mut tensors = Vec::with_capacity(func.params.len());
    let mut infos = Vec::with_capacity(func.params.len());
    for (i, p) in func.params.iter().enumerate() {
        let (tensor, source) = match opts.inputs.iter().find(|(n, _)| n == &p.name) {
            Some((_, t)) => {
                if t.ty.dims != p.ty.dims || t.ty.dtype != p.ty.dtype {
                    return Err(Error::InvalidArgument(format!(
                        "input %{} must be {}, got {}",
                        p.name, p.ty, t.ty
                    )));
                }
                (t.to_layout(p.ty.layout), InputSource::Given)
            }
            None => {
                let seed = opts.seed.wrapping_add(i as u64);
                let row_major = Tensor::random_in(&p.ty, seed, range);
                (
                    row_major.to_layout(p.ty.layout),
                    InputSource::Random { seed },
                )
            }
        };
        tensors.push(tensor);
        infos.push(InputInfo {
            name: p.name.clone(),
            ty: p.ty.clone(),
            source,
        });
    }
    Ok((tensors, infos))
}

/// The results of `func` picked out of a `run_keep_all` vector (value `%i` at `i`).
fn results_of(func: &Func, all: &[Tensor]) -> Vec<Tensor> {
    func.results
        .iter()
        .filter_map(|r| all.get(r.value.index()).cloned())
        .collect()
}

fn compare(
    got_run: Run,
    reference_run: Run,
    got: &Tensor,
    want: &Tensor,
    rtol: f64,
    what: &str,
) -> Result<Comparison, Error> {
    let stats = ErrorStats::between_tensors(got, want).map_err(|m| {
        Error::Unsupported(format!(
            "{what}: {} and {} disagree on the shape: {m}",
            got_run.label(),
            reference_run.label()
        ))
    })?;
    Ok(Comparison {
        got: got_run,
        reference: reference_run,
        pass: stats.relative <= rtol,
        stats,
    })
}

/// Compiles function `name` of `module` and runs it.
pub(super) fn jit_run(
    module: &Module,
    name: &str,
    inputs: &[Tensor],
) -> Result<Vec<Tensor>, Error> {
    Executable::compile(module, Some(name), &CompileOptions::default())?.run(inputs)
}
