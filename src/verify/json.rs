//! The verify report as JSON: serde derives on the report types, plus views where the
//! JSON form differs from the type (a computed verdict, a flattened input source, the
//! first divergence by instruction, a tagged bisection outcome). docs/json.md has the
//! schema.

use serde::Serialize;
use smelt_ir::TensorType;
use smelt_passes::fusion::FusionSite;

use super::{
    BisectOutcome, BisectReport, InputInfo, InputSource, LayerCheck, OutputCheck, PerLayerReport,
    RangeCheck, SkippedLayer, UserOp, VerifyReport,
};

impl VerifyReport {
    /// The report as one JSON object, fields in a fixed order: `func`, `rtol`, `passed`,
    /// `inputs`, `sites`, `user_rules`, `warnings`, `jit_error`, `outputs` (each with
    /// `comparisons` of `got`, `reference`, `stats` — `max_abs`, `relative`, `rmse`,
    /// `count` — and `pass`), `ranges` (each a `range` and its `outputs`), `per_layer` and
    /// `bisect` (null when not asked for). Non-finite errors are null.
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
    warnings: &'a [String],
    jit_error: &'a Option<String>,
    outputs: &'a [OutputCheck],
    ranges: &'a [RangeCheck],
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
            warnings: &report.warnings,
            jit_error: &report.jit_error,
            outputs: &report.outputs,
            ranges: &report.ranges,
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
    input_range: f32,
    layers: &'a [LayerCheck],
    skipped: &'a [SkippedLayer],
    first_divergence_inst: Option<usize>,
    jit_note: &'a Option<String>,
}

impl<'a> PerLayerJson<'a> {
    fn of(per_layer: &'a PerLayerReport) -> Self {
        PerLayerJson {
            input_range: per_layer.input_range,
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

pub(super) fn serialize_outcome<S: serde::Serializer>(
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
