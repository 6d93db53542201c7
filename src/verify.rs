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
//! ```no_run
//! use smelt::verify::{verify, VerifyOptions};
//! let module = smelt::load_model("model.tir".as_ref(), &Default::default())?;
//! let report = verify(&module, &VerifyOptions::default())?;
//! print!("{}", report.to_text());
//! assert!(report.passed());
//! # Ok::<(), smelt::Error>(())
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use smelt_ir::diag::Location;
use smelt_ir::graph::{Func, Module};
use smelt_ir::interp;
use smelt_ir::weights::random_f32;
use smelt_ir::{ErrorStats, Op, Tensor, TensorType};
use smelt_passes::fusion::{op_summary, FusionSite};

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
    /// Compare every intermediate value that survives fusion with the unfused graph.
    pub per_layer: bool,
    /// On a mismatch, find the first fusion site whose inclusion causes it.
    pub bisect: bool,
    /// Run the JIT legs (compile the fused module with Cranelift). On by default.
    pub jit: bool,
}

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
}

impl Run {
    /// Short label used in reports: `interp(unfused)`, `interp(fused)`, `jit(fused)`.
    pub fn label(self) -> &'static str {
        match self {
            Run::InterpUnfused => "interp(unfused)",
            Run::InterpFused => "interp(fused)",
            Run::JitFused => "jit(fused)",
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
    /// The run whose outputs are compared with the reference at each probe.
    pub oracle: Run,
    /// Fusion sites of the full optimization.
    pub total_sites: usize,
    /// Probes in the order they ran.
    pub probes: Vec<BisectProbe>,
    /// The result.
    #[serde(serialize_with = "serialize_outcome")]
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
                .all(|o| o.comparisons.iter().all(|c| c.pass))
            && self
                .per_layer
                .as_ref()
                .is_none_or(|p| p.first_divergence.is_none())
    }

    /// The worst relative error of `got` against `reference` over all outputs.
    pub fn worst(&self, got: Run, reference: Run) -> Option<f64> {
        self.outputs
            .iter()
            .flat_map(|o| &o.comparisons)
            .filter(|c| c.got == got && c.reference == reference)
            .map(|c| c.stats.relative)
            .reduce(f64::max)
    }
}

/// Verifies the entry function of `module`: see the module documentation.
///
/// Errors are for what prevents verification (bad inputs, a pass failing, the reference
/// interpreter failing); a JIT that cannot compile the model is reported in
/// [`VerifyReport::jit_error`] and fails the report.
pub fn verify(module: &Module, opts: &VerifyOptions) -> Result<VerifyReport, Error> {
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
    let (jit_fused, jit_error) = if opts.jit {
        match jit_run(&fused, &func.name, &inputs) {
            Ok(out) => (Some(out), None),
            Err(e) => (None, Some(e.to_string())),
        }
    } else {
        (None, None)
    };

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
            opts.rtol,
            &r.name,
        )?];
        if let Some(jit) = &jit_fused {
            let j = jit
                .get(i)
                .ok_or_else(|| missing_result("the JIT", &r.name))?;
            comparisons.push(compare(
                Run::JitFused,
                Run::InterpUnfused,
                j,
                want,
                opts.rtol,
                &r.name,
            )?);
            comparisons.push(compare(
                Run::JitFused,
                Run::InterpFused,
                j,
                got,
                opts.rtol,
                &r.name,
            )?);
        }
        outputs.push(OutputCheck {
            name: r.name.clone(),
            ty: func.type_of(r.value).clone(),
            comparisons,
        });
    }

    let per_layer = match (&reference_all, &fused_all) {
        (Some(reference_all), Some(fused_all)) => Some(per_layer(
            func,
            fused_func,
            &fused,
            &sites,
            reference_all,
            fused_all,
            &inputs,
            opts,
        )),
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
        per_layer,
        bisect: None,
    };
    if opts.bisect {
        report.bisect = Some(bisect(module, func, &inputs, &reference, &report, opts));
    }
    Ok(report)
}

fn missing_result(who: &str, name: &str) -> Error {
    Error::Unsupported(format!("{who} returned no value for result {name}"))
}

/// The inputs: given ones checked against the parameters, the rest seeded random.
fn make_inputs(func: &Func, opts: &VerifyOptions) -> Result<(Vec<Tensor>, Vec<InputInfo>), Error> {
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
                let row_major = Tensor {
                    ty: p.ty.with_layout(smelt_ir::Layout::default()),
                    data: random_f32(seed, p.ty.num_elements(), -1.0, 1.0),
                };
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
fn jit_run(module: &Module, name: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
    Executable::compile(module, Some(name), &CompileOptions::default())?.run(inputs)
}

/// Compiles function `name` of `module` keeping every intermediate, runs it, and returns
/// each computed value by instruction index.
fn jit_intermediates(
    module: &Module,
    name: &str,
    inputs: &[Tensor],
) -> Result<BTreeMap<usize, Tensor>, Error> {
    let opts = CompileOptions {
        keep_intermediates: true,
        ..CompileOptions::default()
    };
    let (_, values) = Executable::compile(module, Some(name), &opts)?.run_keeping(inputs)?;
    Ok(values.into_iter().map(|v| (v.inst, v.tensor)).collect())
}

/// The location an op of the fused module is compared under: the last user op it
/// merged (for a fused op, the one whose value it produces).
fn last_location(loc: &Location) -> Option<&Location> {
    match loc {
        Location::Unknown => None,
        Location::Fused(parts) => parts.last().and_then(last_location),
        other => Some(other),
    }
}

/// Every user location an op merged, in program order.
fn user_locations(loc: &Location) -> Vec<Location> {
    match loc {
        Location::Unknown => Vec::new(),
        Location::Fused(parts) => parts.iter().flat_map(user_locations).collect(),
        other => vec![other.clone()],
    }
}

/// Non-constant instructions of the unfused function by location.
fn ops_by_location(func: &Func) -> BTreeMap<&Location, Vec<usize>> {
    let mut map: BTreeMap<&Location, Vec<usize>> = BTreeMap::new();
    for (i, inst) in func.insts.iter().enumerate() {
        if !matches!(inst.op, Op::Const(_)) {
            map.entry(&inst.loc).or_default().push(i);
        }
    }
    map
}

/// Whether instruction `later` of `func` (transitively) reads the value of instruction
/// `earlier`.
fn depends_on(func: &Func, later: usize, earlier: usize) -> bool {
    let target = func.inst_value(earlier);
    let mut seen = vec![false; func.insts.len()];
    let mut stack = vec![later];
    while let Some(i) = stack.pop() {
        let Some(inst) = func.insts.get(i) else {
            continue;
        };
        for v in &inst.operands {
            if *v == target {
                return true;
            }
            if let Some(k) = v.index().checked_sub(func.params.len()) {
                if k > earlier && k < seen.len() && !seen[k] {
                    seen[k] = true;
                    stack.push(k);
                }
            }
        }
    }
    false
}

fn user_ops(
    loc: &Location,
    unfused: &Func,
    by_loc: &BTreeMap<&Location, Vec<usize>>,
) -> Vec<UserOp> {
    user_locations(loc)
        .into_iter()
        .map(|l| {
            let op = match by_loc.get(&l).map(|v| v.as_slice()) {
                Some([i]) => unfused.insts[*i].op.name().to_string(),
                _ => "?".to_string(),
            };
            UserOp { op, location: l }
        })
        .collect()
}

/// The rules that built the fused op at `inst`: the report site with the same
/// location and op (instruction indices change in const_fold and dce).
fn rules_of(sites: &[FusionSite], loc: &Location, op: &str) -> Vec<String> {
    sites
        .iter()
        .find(|s| s.op == op && &Location::fuse(s.merged.clone()) == loc)
        .map(|s| s.rules.clone())
        .unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
fn per_layer(
    unfused: &Func,
    fused_func: &Func,
    fused: &Module,
    sites: &[FusionSite],
    reference_all: &[Tensor],
    fused_all: &[Tensor],
    inputs: &[Tensor],
    opts: &VerifyOptions,
) -> PerLayerReport {
    let by_loc = ops_by_location(unfused);
    let np_unfused = unfused.params.len();
    let np_fused = fused_func.params.len();
    let mut skipped = Vec::new();
    // Fused instruction -> the unfused instruction of its last user op.
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    for (i, inst) in fused_func.insts.iter().enumerate() {
        if matches!(inst.op, Op::Const(_)) {
            continue;
        }
        let op = op_summary(&inst.op);
        let skip = |reason: String| SkippedLayer {
            inst: i,
            op: op.clone(),
            location: inst.loc.clone(),
            reason,
        };
        let Some(last) = last_location(&inst.loc) else {
            skipped.push(skip("it has no location".into()));
            continue;
        };
        match by_loc.get(last).map(|v| v.as_slice()) {
            Some([u]) => {
                let ref_ty = &unfused.insts[*u].ty;
                if ref_ty.dims != inst.ty.dims {
                    skipped.push(skip(format!(
                        "its type {} differs from the unfused value's {}",
                        inst.ty, ref_ty
                    )));
                } else {
                    candidates.push((i, *u));
                }
            }
            Some(several) => skipped.push(skip(format!(
                "{} unfused ops share its location {last}",
                several.len()
            ))),
            None => skipped.push(skip(format!("no unfused op has the location {last}"))),
        }
    }
    // A fused op computes all of its last user op only if no op downstream of it also
    // merged that user op: otherwise a rewrite split the user op (e.g. a batch norm
    // turned into a scale kept here and a shift folded into the next conv), or this op
    // is an inner node of a rewrite whose root produces the user op's value.
    let mut compared: Vec<(usize, usize)> = Vec::new();
    for &(i, u) in &candidates {
        let inst = &fused_func.insts[i];
        let Some(last) = last_location(&inst.loc) else {
            continue;
        };
        let rest = (i + 1..fused_func.insts.len()).find(|&j| {
            let later = &fused_func.insts[j];
            !matches!(later.op, Op::Const(_))
                && user_locations(&later.loc).contains(last)
                && depends_on(fused_func, j, i)
        });
        match rest {
            Some(j) => skipped.push(SkippedLayer {
                inst: i,
                op: op_summary(&inst.op),
                location: inst.loc.clone(),
                reason: format!(
                    "it computes only part of {} {last}; %{j} downstream merges it too",
                    unfused.insts[u].op.name()
                ),
            }),
            None => compared.push((i, u)),
        }
    }
    skipped.sort_by_key(|s| s.inst);

    // The JIT's intermediates: the fused function compiled with its own memory per
    // value, every value read back after one run.
    let (jit_values, jit_note) = if !opts.jit {
        (None, Some("the JIT legs are off".to_string()))
    } else {
        match jit_intermediates(fused, &fused_func.name, inputs) {
            Ok(values) => (Some(values), None),
            Err(e) => (
                None,
                Some(format!(
                    "the JIT could not run with intermediates kept: {e}"
                )),
            ),
        }
    };

    let mut layers = Vec::with_capacity(compared.len());
    for &(i, u) in &compared {
        let inst = &fused_func.insts[i];
        let op = op_summary(&inst.op);
        let (Some(got), Some(want)) = (
            fused_all.get(np_fused + i),
            reference_all.get(np_unfused + u),
        ) else {
            continue;
        };
        let Ok(interp_stats) = ErrorStats::between_tensors(got, want) else {
            continue;
        };
        let jit = jit_values
            .as_ref()
            .and_then(|v| v.get(&i))
            .and_then(|t| ErrorStats::between_tensors(t, want).ok());
        let pass = interp_stats.relative <= opts.rtol
            && jit.as_ref().is_none_or(|j| j.relative <= opts.rtol);
        layers.push(LayerCheck {
            inst: i,
            rules: rules_of(sites, &inst.loc, &op),
            op,
            user_ops: user_ops(&inst.loc, unfused, &by_loc),
            reference_inst: u,
            interp: interp_stats,
            jit,
            pass,
        });
    }
    let first_divergence = layers.iter().position(|l| !l.pass);
    PerLayerReport {
        layers,
        skipped,
        first_divergence,
        jit_note,
    }
}

/// Bisects over fusion sites; see [`BisectReport`].
fn bisect(
    module: &Module,
    func: &Func,
    inputs: &[Tensor],
    reference: &[Tensor],
    report: &VerifyReport,
    opts: &VerifyOptions,
) -> BisectReport {
    let interp_bad = report
        .worst(Run::InterpFused, Run::InterpUnfused)
        .is_some_and(|r| r > opts.rtol);
    let jit_bad = report
        .worst(Run::JitFused, Run::InterpUnfused)
        .is_some_and(|r| r > opts.rtol);
    let oracle = if interp_bad || !jit_bad {
        Run::InterpFused
    } else {
        Run::JitFused
    };
    let mut out = BisectReport {
        oracle,
        total_sites: report.sites.len(),
        probes: Vec::new(),
        outcome: BisectOutcome::NotNeeded,
    };
    if !interp_bad && !jit_bad {
        return out;
    }
    let sites = &report.sites;
    out.outcome = match bisect_sites(
        module,
        func,
        inputs,
        reference,
        sites,
        oracle,
        opts,
        &mut out.probes,
    ) {
        Ok(outcome) => outcome,
        Err(e) => BisectOutcome::Unavailable(e.to_string()),
    };
    out
}

/// Runs the fused module limited to the first `limit` sites under `oracle`; returns
/// the largest relative error over the outputs.
fn probe(
    module: &Module,
    func: &Func,
    inputs: &[Tensor],
    reference: &[Tensor],
    oracle: Run,
    opts: &VerifyOptions,
    limit: usize,
) -> Result<f64, Error> {
    let mut optimize = opts.optimize.clone();
    optimize.fusion.site_limit = Some(limit);
    let mut fused = module.clone();
    crate::optimize(&mut fused, &optimize, None)?;
    let fused_func = fused.func(&func.name).ok_or_else(|| {
        Error::Unsupported(format!("optimization removed function @{}", func.name))
    })?;
    let got = match oracle {
        Run::JitFused => jit_run(&fused, &func.name, inputs)?,
        Run::InterpFused | Run::InterpUnfused => interp::run(&fused, fused_func, inputs)?,
    };
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(reference).enumerate() {
        let stats = ErrorStats::between_tensors(g, w).map_err(|m| {
            Error::Unsupported(format!("result {i} changed shape with {limit} sites: {m}"))
        })?;
        worst = worst.max(stats.relative);
    }
    Ok(worst)
}

/// Binary search for the smallest site count that disagrees. The full fusion
/// (`sites.len()` sites, as the report lists them in canonical order) is known to
/// disagree; a limit of N keeps exactly the first N of those sites.
#[allow(clippy::too_many_arguments)]
fn bisect_sites(
    module: &Module,
    func: &Func,
    inputs: &[Tensor],
    reference: &[Tensor],
    sites: &[FusionSite],
    oracle: Run,
    opts: &VerifyOptions,
    probes: &mut Vec<BisectProbe>,
) -> Result<BisectOutcome, Error> {
    let mut run = |limit: usize| -> Result<bool, Error> {
        let relative = probe(module, func, inputs, reference, oracle, opts, limit)?;
        let agree = relative <= opts.rtol;
        probes.push(BisectProbe {
            sites: limit,
            relative,
            agree,
        });
        Ok(agree)
    };
    if !run(0)? {
        return Ok(BisectOutcome::WithoutFusion);
    }
    // Invariant: the first `good` sites agree, the first `bad` disagree.
    let (mut good, mut bad) = (0usize, sites.len());
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if run(mid)? {
            good = mid;
        } else {
            bad = mid;
        }
    }
    let Some(site) = bad.checked_sub(1).and_then(|i| sites.get(i)).cloned() else {
        return Ok(BisectOutcome::NotReproduced);
    };
    let by_loc = ops_by_location(func);
    let user_ops = user_ops(&Location::fuse(site.merged.clone()), func, &by_loc);
    Ok(BisectOutcome::Culprit {
        sites: bad,
        site,
        user_ops,
    })
}

/// An error figure in reports: three significant digits, `inf` and `nan` spelled out.
fn sci(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2e}")
    } else {
        format!("{x}")
    }
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "ok"
    } else {
        "FAIL"
    }
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rule names, comma-separated, user rules marked `(user rule)`.
fn rule_list(rules: &[String], user_rules: &[String]) -> String {
    rules
        .iter()
        .map(|r| {
            if user_rules.contains(r) {
                format!("{r} (user rule)")
            } else {
                r.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn site_line(site: &FusionSite, user_rules: &[String]) -> String {
    let merged: Vec<String> = site.merged.iter().map(|l| l.to_string()).collect();
    format!(
        "{} <- {} [{}]",
        site.op,
        rule_list(&site.rules, user_rules),
        merged.join(", ")
    )
}

impl VerifyReport {
    /// The report as text, byte-identical across runs with the same inputs.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "verify @{} (rtol {:e})", self.func, self.rtol);
        for i in &self.inputs {
            let source = match &i.source {
                InputSource::Given => "given".to_string(),
                InputSource::Random { seed } => format!("random in [-1, 1], seed {seed}"),
            };
            let _ = writeln!(out, "  input %{}: {} ({source})", i.name, i.ty);
        }
        let _ = writeln!(out, "  fusion sites: {}", self.sites.len());
        for (k, s) in self.sites.iter().enumerate() {
            let _ = writeln!(out, "    {}. {}", k + 1, site_line(s, &self.user_rules));
        }
        if let Some(e) = &self.jit_error {
            let _ = writeln!(out, "  jit(fused): FAIL, could not run: {e}");
        }
        for o in &self.outputs {
            let _ = writeln!(out, "output {}: {}", o.name, o.ty);
            for c in &o.comparisons {
                let pair = format!("{} vs {}", c.got.label(), c.reference.label());
                let _ = writeln!(
                    out,
                    "  {pair:<33} max abs {:>9}  relative {:>9}  RMSE {:>9}  {}",
                    sci(c.stats.max_abs),
                    sci(c.stats.relative),
                    sci(c.stats.rmse),
                    verdict(c.pass)
                );
            }
        }
        if let Some(p) = &self.per_layer {
            p.write_text(&mut out, self.rtol, &self.user_rules);
        }
        if let Some(b) = &self.bisect {
            b.write_text(&mut out, &self.user_rules);
        }
        let comparisons: usize = self.outputs.iter().map(|o| o.comparisons.len()).sum();
        let failed: usize = self
            .outputs
            .iter()
            .flat_map(|o| &o.comparisons)
            .filter(|c| !c.pass)
            .count();
        let _ = writeln!(
            out,
            "{}: {} of {comparisons} comparisons within rtol {:e}{}",
            if self.passed() { "PASS" } else { "FAIL" },
            comparisons - failed,
            self.rtol,
            match (
                &self.jit_error,
                self.per_layer.as_ref().and_then(|p| p.first_divergence)
            ) {
                (Some(_), _) => "; the JIT did not run",
                (None, Some(_)) => "; an intermediate diverges",
                (None, None) => "",
            }
        );
        out
    }
}

impl PerLayerReport {
    fn write_text(&self, out: &mut String, rtol: f64, user_rules: &[String]) {
        let _ = writeln!(
            out,
            "per layer: {} compared, {} skipped",
            self.layers.len(),
            self.skipped.len()
        );
        if let Some(note) = &self.jit_note {
            let _ = writeln!(out, "  note: {note}");
        }
        // Compared and skipped values, in program order.
        let mut rows: Vec<(usize, String)> = Vec::new();
        for (k, l) in self.layers.iter().enumerate() {
            let jit = l
                .jit
                .as_ref()
                .map_or_else(|| "-".to_string(), |j| sci(j.relative));
            let marker = if self.first_divergence == Some(k) {
                "  <- first divergence"
            } else {
                ""
            };
            let last = l
                .user_ops
                .last()
                .map_or_else(|| "?".to_string(), |u| u.to_string());
            rows.push((
                l.inst,
                format!(
                    "  %{:<4} {:32} relative interp {:>9}  jit {:>9}  {:4}  = {last}{marker}",
                    l.inst,
                    l.op,
                    sci(l.interp.relative),
                    jit,
                    verdict(l.pass),
                ),
            ));
        }
        for s in &self.skipped {
            rows.push((
                s.inst,
                format!("  %{:<4} {:32} skipped: {}", s.inst, s.op, s.reason),
            ));
        }
        rows.sort_by_key(|(inst, _)| *inst);
        for (_, row) in rows {
            let _ = writeln!(out, "{row}");
        }
        match self.first_divergence.and_then(|k| self.layers.get(k)) {
            Some(l) => {
                let _ = writeln!(
                    out,
                    "first divergence: %{} {} (relative {} > {:e})",
                    l.inst,
                    l.op,
                    sci(l
                        .jit
                        .as_ref()
                        .map_or(l.interp.relative, |j| j.relative.max(l.interp.relative))),
                    rtol
                );
                let _ = writeln!(out, "  user ops: {}", list(&l.user_ops));
                let rules = if l.rules.is_empty() {
                    "none (the op is as the input had it)".to_string()
                } else {
                    rule_list(&l.rules, user_rules)
                };
                let _ = writeln!(out, "  rules:    {rules}");
            }
            None => {
                let _ = writeln!(out, "no intermediate diverges");
            }
        }
    }
}

impl BisectReport {
    fn write_text(&self, out: &mut String, user_rules: &[String]) {
        let _ = writeln!(
            out,
            "bisect over {} fusion sites ({} vs interp(unfused)):",
            self.total_sites,
            self.oracle.label()
        );
        for p in &self.probes {
            let _ = writeln!(
                out,
                "  first {:>4} of {} sites: relative {:>9}  {}",
                p.sites,
                self.total_sites,
                sci(p.relative),
                if p.agree { "agree" } else { "DISAGREE" }
            );
        }
        match &self.outcome {
            BisectOutcome::NotNeeded => {
                let _ = writeln!(out, "  nothing to bisect: fused and unfused agree");
            }
            BisectOutcome::Culprit {
                sites,
                site,
                user_ops,
            } => {
                let _ = writeln!(out, "first bad site: {sites}. {}", site.op);
                let _ = writeln!(out, "  rules:    {}", rule_list(&site.rules, user_rules));
                let _ = writeln!(out, "  user ops: {}", list(user_ops));
            }
            BisectOutcome::WithoutFusion => {
                let _ = writeln!(
                    out,
                    "  the mismatch is there with no fusion site: it comes from another pass or the JIT"
                );
            }
            BisectOutcome::NotReproduced => {
                let _ = writeln!(
                    out,
                    "  limiting fusion sites does not reproduce the mismatch"
                );
            }
            BisectOutcome::Unavailable(why) => {
                let _ = writeln!(out, "  bisection failed: {why}");
            }
        }
    }
}

impl VerifyReport {
    /// The report as one JSON object, fields in a fixed order: `func`, `rtol`, `passed`,
    /// `inputs`, `sites`, `user_rules`, `jit_error`, `outputs` (each with `comparisons` of
    /// `got`, `reference`, `stats` — `max_abs`, `relative`, `rmse`, `count` — and `pass`),
    /// `per_layer` and `bisect` (null when not asked for). Non-finite errors are null.
    /// docs/json.md has the schema.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&ReportJson::of(self))
            .expect("a verify report serializes: it has no maps")
    }
}

/// The JSON form of a [`VerifyReport`]: its fields with the verdict after the tolerance.
#[derive(Serialize)]
struct ReportJson<'a> {
    func: &'a str,
    rtol: f64,
    passed: bool,
    inputs: Vec<InputJson<'a>>,
    sites: &'a [FusionSite],
    user_rules: &'a [String],
    jit_error: &'a Option<String>,
    outputs: &'a [OutputCheck],
    per_layer: Option<PerLayerJson<'a>>,
    bisect: &'a Option<BisectReport>,
}

impl<'a> ReportJson<'a> {
    fn of(report: &'a VerifyReport) -> Self {
        ReportJson {
            func: &report.func,
            rtol: report.rtol,
            passed: report.passed(),
            inputs: report.inputs.iter().map(InputJson::of).collect(),
            sites: &report.sites,
            user_rules: &report.user_rules,
            jit_error: &report.jit_error,
            outputs: &report.outputs,
            per_layer: report.per_layer.as_ref().map(PerLayerJson::of),
            bisect: &report.bisect,
        }
    }
}

/// An input with its source flattened: `source` is `given` or `random`, `seed` is the
/// random seed or null.
#[derive(Serialize)]
struct InputJson<'a> {
    name: &'a str,
    #[serde(rename = "type")]
    ty: &'a TensorType,
    source: &'static str,
    seed: Option<u64>,
}

impl<'a> InputJson<'a> {
    fn of(input: &'a InputInfo) -> Self {
        let (source, seed) = match input.source {
            InputSource::Given => ("given", None),
            InputSource::Random { seed } => ("random", Some(seed)),
        };
        InputJson {
            name: &input.name,
            ty: &input.ty,
            source,
            seed,
        }
    }
}

/// A [`PerLayerReport`] naming its first divergence by instruction rather than by its
/// index into `layers`, so a reader need not count.
#[derive(Serialize)]
struct PerLayerJson<'a> {
    layers: &'a [LayerCheck],
    skipped: &'a [SkippedLayer],
    first_divergence_inst: Option<usize>,
    jit_note: &'a Option<String>,
}

impl<'a> PerLayerJson<'a> {
    fn of(per_layer: &'a PerLayerReport) -> Self {
        PerLayerJson {
            layers: &per_layer.layers,
            skipped: &per_layer.skipped,
            first_divergence_inst: per_layer
                .first_divergence
                .and_then(|k| per_layer.layers.get(k))
                .map(|l| l.inst),
            jit_note: &per_layer.jit_note,
        }
    }
}

/// A [`BisectOutcome`] as an object tagged by `kind`; a failure's message is its `reason`.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum OutcomeJson<'a> {
    NotNeeded,
    Culprit {
        sites: usize,
        site: &'a FusionSite,
        user_ops: &'a [UserOp],
    },
    WithoutFusion,
    NotReproduced,
    Unavailable {
        reason: &'a str,
    },
}

fn serialize_outcome<S: serde::Serializer>(
    outcome: &BisectOutcome,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let view = match outcome {
        BisectOutcome::NotNeeded => OutcomeJson::NotNeeded,
        BisectOutcome::Culprit {
            sites,
            site,
            user_ops,
        } => OutcomeJson::Culprit {
            sites: *sites,
            site,
            user_ops,
        },
        BisectOutcome::WithoutFusion => OutcomeJson::WithoutFusion,
        BisectOutcome::NotReproduced => OutcomeJson::NotReproduced,
        BisectOutcome::Unavailable(why) => OutcomeJson::Unavailable { reason: why },
    };
    view.serialize(serializer)
}
