//! E-graph fusion: egg language, analysis, rules as data, cost model, extraction, explanations.
