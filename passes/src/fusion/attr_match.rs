//! Written-out float attributes matched within a tolerance.
//!
//! A rule that spells out `hard_sigmoid[alpha=0.1666667, beta=0.5]` means the constant
//! 1/6, and an exporter may have written it `0.16666667`: the two are different f32s (two
//! ulps apart), so an exact match would silently never fire. A literal payload with float
//! fields therefore matches any payload of the same variant whose other fields are equal
//! and whose float fields are within [`ATTR_TOLERANCE`] (relative) of the literal's.
//!
//! Why relative 1e-6: a decimal literal written with 7 significant digits differs from the
//! number it rounds by at most 5e-7 relative, and f32 rounding adds at most 6e-8; 1e-6
//! covers both while staying about eight f32 ulps wide, far below any difference between
//! attribute values that are meant to differ (a leaky-ReLU slope of 0.1 against 0.01, an
//! epsilon of 1e-5 against 1e-3). A value within [`NEAR_MISS_TOLERANCE`] but outside the
//! tolerance (the same constant written with too few digits, `0.166667`) is a near miss:
//! the rule does not fire and the report says why; farther values are simply other
//! attributes and no match, as before.

use super::lang::Attrs;
use smelt_ir::types::F32;

/// Relative tolerance within which a written-out float attribute matches the model's.
pub const ATTR_TOLERANCE: f64 = 1e-6;

/// Relative difference up to which a float attribute outside [`ATTR_TOLERANCE`] is
/// reported as a near miss (the values agree in about their first three digits).
pub const NEAR_MISS_TOLERANCE: f64 = 1e-3;

/// How a model's attribute payload compares with a rule's written-out one.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrMatch {
    /// Equal payloads.
    Exact,
    /// Float fields differ within the tolerance; one note per differing field.
    Within(Vec<String>),
    /// Some float field is outside the tolerance but within the near-miss band, every
    /// other field equal; the notes name the fields outside the tolerance.
    Near(Vec<String>),
    /// Different attributes.
    Different,
}

/// The payload with its float fields zeroed, and those fields by their text-form key.
fn split_floats(a: &Attrs) -> (Attrs, Vec<(&'static str, f32)>) {
    let z = F32(0.0);
    match a {
        Attrs::Epsilon(e) => (Attrs::Epsilon(z), vec![("epsilon", e.0)]),
        Attrs::Alpha(x) => (Attrs::Alpha(z), vec![("alpha", x.0)]),
        Attrs::Clip { min, max } => (
            Attrs::Clip { min: z, max: z },
            vec![("min", min.0), ("max", max.0)],
        ),
        Attrs::HardSigmoid { alpha, beta } => (
            Attrs::HardSigmoid { alpha: z, beta: z },
            vec![("alpha", alpha.0), ("beta", beta.0)],
        ),
        Attrs::LayerNorm { axis, epsilon } => (
            Attrs::LayerNorm {
                axis: *axis,
                epsilon: z,
            },
            vec![("epsilon", epsilon.0)],
        ),
        Attrs::Gemm(g) => {
            let mut rest = g.clone();
            rest.alpha = z;
            rest.beta = z;
            (
                Attrs::Gemm(rest),
                vec![("alpha", g.alpha.0), ("beta", g.beta.0)],
            )
        }
        other => (other.clone(), Vec::new()),
    }
}

/// Whether a written-out payload has float fields (only those need the tolerant match;
/// the others stay exact e-graph patterns).
pub fn has_float_fields(a: &Attrs) -> bool {
    !split_floats(a).1.is_empty()
}

/// The relative difference of two values (0 when equal, infinite when either is NaN).
fn relative(model: f32, rule: f32) -> f64 {
    let (m, r) = (model as f64, rule as f64);
    if m == r {
        return 0.0;
    }
    let d = (m - r).abs() / m.abs().max(r.abs());
    if d.is_nan() {
        f64::INFINITY
    } else {
        d
    }
}

/// Compares the model's payload with the rule's literal.
pub fn compare(model: &Attrs, rule: &Attrs) -> AttrMatch {
    if model == rule {
        return AttrMatch::Exact;
    }
    let (m_rest, m_floats) = split_floats(model);
    let (r_rest, r_floats) = split_floats(rule);
    if m_rest != r_rest || m_floats.len() != r_floats.len() {
        return AttrMatch::Different;
    }
    let mut within = Vec::new();
    let mut outside = Vec::new();
    for ((key, m), (_, r)) in m_floats.iter().zip(&r_floats) {
        let d = relative(*m, *r);
        if d == 0.0 {
            continue;
        }
        if d <= ATTR_TOLERANCE {
            within.push(format!(
                "{key} = {} in the model, {} in the rule: within the tolerance \
                 (relative {d:.1e} <= {ATTR_TOLERANCE:e})",
                F32(*m),
                F32(*r)
            ));
        } else if d <= NEAR_MISS_TOLERANCE {
            outside.push(format!(
                "{key} = {} in the model, {} in the rule: outside the tolerance \
                 (relative {d:.1e} > {ATTR_TOLERANCE:e}); write the value with more digits",
                F32(*m),
                F32(*r)
            ));
        } else {
            return AttrMatch::Different;
        }
    }
    match (within.is_empty(), outside.is_empty()) {
        (_, false) => AttrMatch::Near(outside),
        (false, true) => AttrMatch::Within(within),
        // a -0.0 against 0.0 compares equal as a number though the payloads differ
        (true, true) => AttrMatch::Exact,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hs(alpha: f32, beta: f32) -> Attrs {
        Attrs::HardSigmoid {
            alpha: F32(alpha),
            beta: F32(beta),
        }
    }

    #[test]
    fn a_literal_with_seven_digits_matches_the_exporters_value() {
        let got = compare(&hs(0.16666667, 0.5), &hs(0.1666667, 0.5));
        let AttrMatch::Within(notes) = got else {
            panic!("{got:?}")
        };
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].starts_with("alpha = 0.16666667 in the model, 0.1666667 in the rule"),
            "{notes:?}"
        );
    }

    #[test]
    fn a_literal_with_six_digits_is_a_near_miss_and_other_values_differ() {
        let got = compare(&hs(0.16666667, 0.5), &hs(0.166667, 0.5));
        assert!(
            matches!(&got, AttrMatch::Near(n) if n[0].contains("outside the tolerance")),
            "{got:?}"
        );
        assert_eq!(
            compare(&hs(0.2, 0.5), &hs(0.1666667, 0.5)),
            AttrMatch::Different
        );
        // one field far off makes the whole payload another op's, even if another is near
        assert_eq!(
            compare(&hs(0.166667, 0.6), &hs(0.1666667, 0.5)),
            AttrMatch::Different
        );
        assert_eq!(
            compare(&hs(f32::NAN, 0.5), &hs(0.1666667, 0.5)),
            AttrMatch::Different
        );
        // non-float fields stay exact
        let ln = |axis| Attrs::LayerNorm {
            axis,
            epsilon: F32(1e-5),
        };
        assert_eq!(compare(&ln(1), &ln(2)), AttrMatch::Different);
        assert_eq!(compare(&ln(1), &ln(1)), AttrMatch::Exact);
    }

    #[test]
    fn an_epsilon_is_compared_relative_to_itself() {
        // an absolute tolerance would make 1e-5 match 1.1e-5
        let e = |x| Attrs::Epsilon(F32(x));
        assert_eq!(compare(&e(1.1e-5), &e(1e-5)), AttrMatch::Different);
        assert!(matches!(
            compare(&e(1.000_000_2e-5), &e(1e-5)),
            AttrMatch::Within(_)
        ));
    }
}
