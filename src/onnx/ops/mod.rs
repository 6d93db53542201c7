//! The operator table: each supported ONNX op type, the operator versions ONNX defines
//! for it, the oldest version smelt implements, and the handler (one per op family).

mod attention;
mod control;
mod conv;
mod elementwise;
mod indexing;
mod linalg;
mod logic;
mod loss;
mod movement;
mod norm;
mod pad_split;
mod pool;
mod recurrent;
mod reduce;
mod resize;
mod shape;

use smelt_ir::Diagnostic;

use super::context::{Entry, NodeCtx};

/// Newest `ai.onnx` opset whose operator versions the table below lists (onnx 1.23.2).
pub const MAX_OPSET: i64 = 28;

/// Imports one node; returns an entry per node output, in order (fewer entries than
/// outputs means the remaining outputs do not exist for this op).
pub type Handler = fn(&mut NodeCtx) -> Result<Vec<Entry>, Diagnostic>;

/// One row of the table.
pub struct OpRule {
    /// ONNX op type.
    pub op_type: &'static str,
    /// Every `since_version` of the op in the `ai.onnx` domain up to [`MAX_OPSET`].
    pub versions: &'static [i64],
    /// Oldest version smelt implements (older ones have semantics it does not model).
    pub min_version: i64,
    /// The handler.
    pub import: Handler,
}

macro_rules! rules {
    ($($op:literal $versions:expr, from $min:literal => $f:path;)*) => {
        &[$(OpRule { op_type: $op, versions: &$versions, min_version: $min, import: $f },)*]
    };
}

/// The table, sorted by op type.
pub static RULES: &[OpRule] = rules! {
    "Abs"                 [1, 6, 13],                     from 6  => elementwise::unary;
    "Add"                 [1, 6, 7, 13, 14],              from 7  => elementwise::binary;
    "And"                 [1, 7],                         from 7  => logic::logical;
    "ArgMax"              [1, 11, 12, 13],                from 1  => reduce::arg_extremum;
    "ArgMin"              [1, 11, 12, 13],                from 1  => reduce::arg_extremum;
    "Attention"           [23, 24, 25],                   from 23 => attention::attention;
    "AveragePool"         [1, 7, 10, 11, 19, 22],         from 1  => pool::average_pool;
    "BatchNormalization"  [1, 6, 7, 9, 14, 15],           from 6  => norm::batch_norm;
    "Cast"                [1, 6, 9, 13, 19, 21, 23, 24, 25, 28], from 6 => logic::cast;
    "CastLike"            [15, 19, 21, 23, 24, 25],       from 15 => logic::cast;
    "Ceil"                [1, 6, 13],                     from 6  => elementwise::unary;
    "Celu"                [12, 28],                       from 12 => elementwise::activation;
    "CenterCropPad"       [18],                           from 18 => pad_split::center_crop_pad;
    "Clip"                [1, 6, 11, 12, 13],             from 6  => elementwise::clip;
    "Compress"            [9, 11, 28],                    from 9  => indexing::compress;
    "Concat"              [1, 4, 11, 13],                 from 4  => shape::concat;
    "Constant"            [1, 9, 11, 12, 13, 19, 21, 23, 24, 25], from 1 => shape::constant;
    "ConstantOfShape"     [9, 20, 21, 23, 24, 25],        from 9  => shape::constant_of_shape;
    "Conv"                [1, 11, 22],                    from 1  => conv::conv;
    "ConvTranspose"       [1, 11, 22],                    from 1  => conv::conv_transpose;
    "CumProd"             [26],                           from 26 => reduce::cumulative;
    "CumSum"              [11, 14],                       from 11 => reduce::cumulative;
    "DFT"                 [17, 20],                       from 17 => linalg::dft;
    "DepthToSpace"        [1, 11, 13, 28],                from 1  => movement::depth_space;
    "Div"                 [1, 6, 7, 13, 14],              from 7  => elementwise::binary;
    "Dropout"             [1, 6, 7, 10, 12, 13, 22],      from 1  => shape::dropout;
    "Elu"                 [1, 6, 22],                     from 6  => elementwise::activation;
    "Equal"               [1, 7, 11, 13, 19],             from 7  => logic::compare;
    "Erf"                 [9, 13],                        from 9  => elementwise::unary;
    "Exp"                 [1, 6, 13],                     from 6  => elementwise::unary;
    "Expand"              [8, 13],                        from 8  => movement::expand;
    "Flatten"             [1, 9, 11, 13, 21, 23, 24, 25], from 1  => shape::flatten;
    "Floor"               [1, 6, 13],                     from 6  => elementwise::unary;
    "GRU"                 [1, 3, 7, 14, 22],              from 7  => recurrent::recurrent;
    "Gather"              [1, 11, 13],                    from 1  => shape::gather;
    "GatherElements"      [11, 13],                       from 11 => indexing::gather_elements;
    "GatherND"            [11, 12, 13],                   from 11 => shape::gather_nd;
    "Gelu"                [20],                           from 20 => elementwise::gelu;
    "Gemm"                [1, 6, 7, 9, 11, 13],           from 6  => linalg::gemm;
    "GlobalAveragePool"   [1, 22],                        from 1  => pool::global_average_pool;
    "GlobalMaxPool"       [1, 22],                        from 1  => reduce::global_max_pool;
    "Greater"             [1, 7, 9, 13],                  from 7  => logic::compare;
    "GreaterOrEqual"      [12, 16],                       from 12 => logic::compare;
    "HardSigmoid"         [1, 6, 22],                     from 6  => elementwise::unary;
    "HardSwish"           [14, 22],                       from 14 => elementwise::unary;
    "Identity"            [1, 13, 14, 16, 19, 21, 23, 24, 25], from 1 => shape::identity;
    "If"                  [1, 11, 13, 16, 19, 21, 23, 24, 25], from 1 => control::if_;
    "InstanceNormalization" [1, 6, 22],                   from 1  => norm::instance_norm;
    "IsNaN"               [9, 13, 20],                    from 9  => logic::is_nan;
    "LRN"                 [1, 13],                        from 1  => norm::lrn;
    "LSTM"                [1, 7, 14, 22],                 from 7  => recurrent::recurrent;
    "LayerNormalization"  [17],                           from 17 => norm::layer_norm;
    "LeakyRelu"           [1, 6, 16],                     from 6  => elementwise::unary;
    "Less"                [1, 7, 9, 13],                  from 7  => logic::compare;
    "LessOrEqual"         [12, 16],                       from 12 => logic::compare;
    "Log"                 [1, 6, 13],                     from 6  => elementwise::unary;
    "LogSoftmax"          [1, 11, 13],                    from 1  => linalg::log_softmax;
    "LpNormalization"     [1, 22],                        from 1  => norm::lp_norm;
    "LpPool"              [1, 2, 11, 18, 22],             from 2  => pool::lp_pool;
    "MatMul"              [1, 9, 13],                     from 1  => linalg::matmul;
    "Max"                 [1, 6, 8, 12, 13],              from 8  => logic::min_max;
    "MaxPool"             [1, 8, 10, 11, 12, 22],         from 1  => pool::max_pool;
    "Mean"                [1, 6, 8, 13],                  from 8  => elementwise::mean;
    "Min"                 [1, 6, 8, 12, 13],              from 8  => logic::min_max;
    "Mish"                [18, 22],                       from 18 => elementwise::activation;
    "Mod"                 [10, 13, 28],                   from 10 => logic::mod_;
    "Mul"                 [1, 6, 7, 13, 14],              from 7  => elementwise::binary;
    "Neg"                 [1, 6, 13],                     from 6  => elementwise::unary;
    "NegativeLogLikelihoodLoss" [12, 13, 22],             from 12 => loss::negative_log_likelihood_loss;
    "Not"                 [1],                            from 1  => logic::logical;
    "OneHot"              [9, 11, 28],                    from 9  => indexing::one_hot;
    "Or"                  [1, 7],                         from 7  => logic::logical;
    "PRelu"               [1, 6, 7, 9, 16],               from 7  => elementwise::activation;
    "Pad"                 [1, 2, 11, 13, 18, 19, 21, 23, 24, 25], from 2 => pad_split::pad;
    "Pow"                 [1, 7, 12, 13, 15],             from 7  => elementwise::pow;
    "RMSNormalization"    [23],                           from 23 => norm::rms_norm;
    "RNN"                 [1, 7, 14, 22],                 from 7  => recurrent::recurrent;
    "Range"               [11, 27],                       from 11 => logic::range;
    "Reciprocal"          [1, 6, 13],                     from 6  => elementwise::unary;
    "ReduceL1"            [1, 11, 13, 18],                from 1  => reduce::reduce;
    "ReduceL2"            [1, 11, 13, 18],                from 1  => reduce::reduce;
    "ReduceLogSum"        [1, 11, 13, 18, 28],            from 1  => reduce::reduce;
    "ReduceLogSumExp"     [1, 11, 13, 18, 28],            from 1  => reduce::reduce;
    "ReduceMax"           [1, 11, 12, 13, 18, 20],        from 1  => reduce::reduce;
    "ReduceMean"          [1, 11, 13, 18],                from 1  => reduce::reduce;
    "ReduceMin"           [1, 11, 12, 13, 18, 20],        from 1  => reduce::reduce;
    "ReduceProd"          [1, 11, 13, 18],                from 1  => reduce::reduce;
    "ReduceSum"           [1, 11, 13],                    from 1  => reduce::reduce;
    "ReduceSumSquare"     [1, 11, 13, 18],                from 1  => reduce::reduce;
    "Relu"                [1, 6, 13, 14],                 from 6  => elementwise::unary;
    "Reshape"             [1, 5, 13, 14, 19, 21, 23, 24, 25], from 1 => shape::reshape;
    "Resize"              [10, 11, 13, 18, 19],           from 10 => resize::resize;
    "RotaryEmbedding"     [23],                           from 23 => attention::rotary_embedding;
    "Round"               [11, 22],                       from 11 => elementwise::unary;
    "Selu"                [1, 6, 22],                     from 6  => elementwise::activation;
    "Shape"               [1, 13, 15, 19, 21, 23, 24, 25], from 1 => shape::shape;
    "Sigmoid"             [1, 6, 13],                     from 6  => elementwise::unary;
    "Size"                [1, 13, 19, 21, 23, 24, 25],    from 1  => logic::size;
    "Slice"               [1, 10, 11, 13],                from 1  => movement::slice;
    "Softmax"             [1, 11, 13],                    from 1  => linalg::softmax;
    "SoftmaxCrossEntropyLoss" [12, 13],                   from 12 => loss::softmax_cross_entropy_loss;
    "Softplus"            [1, 22],                        from 1  => elementwise::activation;
    "Softsign"            [1, 22],                        from 1  => elementwise::activation;
    "SpaceToDepth"        [1, 13, 28],                    from 1  => movement::depth_space;
    "Split"               [1, 2, 11, 13, 18],             from 1  => pad_split::split;
    "Sqrt"                [1, 6, 13],                     from 6  => elementwise::unary;
    "Squeeze"             [1, 11, 13, 21, 23, 24, 25],    from 1  => shape::squeeze;
    "Sub"                 [1, 6, 7, 13, 14],              from 7  => elementwise::binary;
    "Sum"                 [1, 6, 8, 13],                  from 6  => elementwise::sum;
    "Swish"               [24],                           from 24 => elementwise::swish;
    "Tanh"                [1, 6, 13],                     from 6  => elementwise::unary;
    "ThresholdedRelu"     [10, 22],                       from 10 => elementwise::activation;
    "Tile"                [1, 6, 13],                     from 6  => movement::tile;
    "Transpose"           [1, 13, 21, 23, 24, 25],        from 1  => shape::transpose;
    "Trilu"               [14],                           from 14 => indexing::trilu;
    "Unsqueeze"           [1, 11, 13, 21, 23, 24, 25],    from 1  => shape::unsqueeze;
    "Upsample"            [1, 7, 9, 10],                  from 7  => resize::resize;
    "Where"               [9, 16],                        from 9  => logic::where_;
    "Xor"                 [1, 7],                         from 7  => logic::logical;
};

/// The rule for `op_type`, if smelt supports it.
pub fn rule(op_type: &str) -> Option<&'static OpRule> {
    RULES
        .binary_search_by(|r| r.op_type.cmp(op_type))
        .ok()
        .map(|i| &RULES[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_versions_ascend() {
        for w in RULES.windows(2) {
            assert!(
                w[0].op_type < w[1].op_type,
                "{} before {}",
                w[0].op_type,
                w[1].op_type
            );
        }
        for r in RULES {
            assert!(r.versions.windows(2).all(|v| v[0] < v[1]), "{}", r.op_type);
            assert!(r.versions.contains(&r.min_version), "{}", r.op_type);
            assert!(r.versions.iter().all(|&v| v <= MAX_OPSET), "{}", r.op_type);
        }
        assert!(rule("Conv").is_some());
        assert!(rule("Conv3d").is_none());
    }
}
