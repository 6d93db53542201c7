//! ResNet-style networks built in code with seeded random weights: the demo's model and
//! the test and benchmark workloads (same structure as the ONNX model-zoo ResNets).

use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::{Conv2dAttrs, GemmAttrs, Pool2dAttrs};
use smelt_ir::weights::{random_f32, WeightOrigin};
use smelt_ir::{
    AlignedBuf, BinaryOp, Diagnostic, Location, Module, Op, TensorType, UnaryOp, Value, F32,
};

/// Largest channel count and plane size [`residual_tail`] builds (each also bounded by
/// the tensor limit together).
pub const MAX_TAIL_SIZE: usize = 16384;

/// Shape of a ResNet: residual blocks per stage, block kind, widths and input size.
#[derive(Clone, Debug)]
pub struct ResNetConfig {
    /// Blocks in each stage; stage `i > 0` halves the resolution in its first block.
    pub blocks: Vec<usize>,
    /// Bottleneck blocks (1×1, 3×3, 1×1 with 4× expansion) instead of basic (3×3, 3×3).
    pub bottleneck: bool,
    /// Channels of the stem and of the first stage; each later stage doubles them.
    pub width: usize,
    /// Use the ImageNet stem (7×7 stride-2 conv + 3×3 stride-2 max pool) instead of a 3×3 conv.
    pub imagenet_stem: bool,
    /// Input height and width.
    pub input_hw: usize,
    /// Classes of the final gemm.
    pub classes: usize,
    /// Seed of every weight.
    pub seed: u64,
}

impl ResNetConfig {
    /// The demo's network: 3×3 stem, two stages of one basic block (16 and 32 channels), 32×32 input.
    pub fn demo() -> ResNetConfig {
        ResNetConfig {
            blocks: vec![1, 1],
            bottleneck: false,
            width: 16,
            imagenet_stem: false,
            input_hw: 32,
            classes: 10,
            seed: 42,
        }
    }

    /// ResNet-18 (v1.5 style) at 224×224, 1000 classes.
    pub fn resnet18() -> ResNetConfig {
        ResNetConfig {
            blocks: vec![2, 2, 2, 2],
            bottleneck: false,
            width: 64,
            imagenet_stem: true,
            input_hw: 224,
            classes: 1000,
            seed: 18,
        }
    }

    /// ResNet-50 (v1.5: stride in the 3×3 conv) at 224×224, 1000 classes.
    pub fn resnet50() -> ResNetConfig {
        ResNetConfig {
            blocks: vec![3, 4, 6, 3],
            bottleneck: true,
            ..ResNetConfig::resnet18()
        }
    }
}

struct Net<'m> {
    b: FuncBuilder<'m>,
    seed: u64,
    count: usize,
    named: usize,
}

impl Net<'_> {
    /// Appends `op` with the location `Name(prefix + counter)`, as an ONNX node name would be.
    fn named(&mut self, prefix: &str, op: Op, operands: &[Value]) -> Result<Value, Diagnostic> {
        self.named += 1;
        self.b
            .set_loc(Location::Name(format!("{prefix}{}", self.named).into()));
        self.b.op(op, operands)
    }

    fn weight(
        &mut self,
        name: &str,
        dims: &[usize],
        min: f32,
        max: f32,
    ) -> Result<Value, Diagnostic> {
        self.seed += 1;
        let ty = TensorType::f32(dims);
        let data = random_f32(self.seed, ty.num_elements(), min, max);
        let origin = WeightOrigin::Random {
            seed: self.seed,
            min,
            max,
        };
        let id = self
            .b
            .add_weight(name, ty, AlignedBuf::from_f32(&data), origin)?;
        self.b.op(Op::Const(id), &[])
    }

    /// conv (no bias, He-uniform weights) → batch_norm with random statistics.
    fn conv_bn(
        &mut self,
        x: Value,
        cout: usize,
        k: usize,
        stride: usize,
    ) -> Result<Value, Diagnostic> {
        self.count += 1;
        let n = self.count;
        let cin = self.b.type_of(x).dims[1];
        let bound = (6.0 / (cin * k * k) as f32).sqrt();
        let w = self.weight(&format!("conv{n}.w"), &[cout, cin, k, k], -bound, bound)?;
        let p = k / 2;
        let conv = Op::Conv2d(Conv2dAttrs {
            strides: [stride, stride],
            pads: [p, p, p, p],
            ..Conv2dAttrs::default()
        });
        self.b.set_loc(Location::Name(format!("conv{n}").into()));
        let y = self.b.op(conv, &[x, w])?;
        let scale = self.weight(&format!("bn{n}.scale"), &[cout], 0.5, 1.5)?;
        let bias = self.weight(&format!("bn{n}.bias"), &[cout], -0.1, 0.1)?;
        let mean = self.weight(&format!("bn{n}.mean"), &[cout], -0.1, 0.1)?;
        let var = self.weight(&format!("bn{n}.var"), &[cout], 0.5, 1.5)?;
        self.b.set_loc(Location::Name(format!("bn{n}").into()));
        self.b.op(
            Op::BatchNorm { epsilon: F32(1e-5) },
            &[y, scale, bias, mean, var],
        )
    }

    fn relu(&mut self, x: Value) -> Result<Value, Diagnostic> {
        self.named("relu", Op::Unary(UnaryOp::Relu), &[x])
    }

    fn block(
        &mut self,
        x: Value,
        width: usize,
        stride: usize,
        bottleneck: bool,
    ) -> Result<Value, Diagnostic> {
        let cin = self.b.type_of(x).dims[1];
        let cout = if bottleneck { width * 4 } else { width };
        let y = if bottleneck {
            let a = self.conv_bn(x, width, 1, 1)?;
            let a = self.relu(a)?;
            let a = self.conv_bn(a, width, 3, stride)?;
            let a = self.relu(a)?;
            self.conv_bn(a, cout, 1, 1)?
        } else {
            let a = self.conv_bn(x, width, 3, stride)?;
            let a = self.relu(a)?;
            self.conv_bn(a, cout, 3, 1)?
        };
        let shortcut = if stride != 1 || cin != cout {
            self.conv_bn(x, cout, 1, stride)?
        } else {
            x
        };
        let sum = self.named("add", Op::Binary(BinaryOp::Add), &[y, shortcut])?;
        self.relu(sum)
    }
}

/// Builds a ResNet as function `main(%input: tensor<1x3xHxWxf32>) -> (logits: ...)`.
pub fn resnet(cfg: &ResNetConfig) -> Result<Module, Diagnostic> {
    let mut module = Module::default();
    let mut net = Net {
        b: FuncBuilder::new(&mut module, "main"),
        seed: cfg.seed.wrapping_mul(1000),
        count: 0,
        named: 0,
    };
    let x = net
        .b
        .param("input", TensorType::f32([1, 3, cfg.input_hw, cfg.input_hw]));
    let mut h = if cfg.imagenet_stem {
        let s = net.conv_bn(x, cfg.width, 7, 2)?;
        let s = net.relu(s)?;
        let pool = Op::MaxPool2d(Pool2dAttrs {
            kernel: [3, 3],
            strides: [2, 2],
            pads: [1, 1, 1, 1],
            dilations: [1, 1],
            ceil_mode: false,
            layout: smelt_ir::Layout::RowMajor,
        });
        net.named("maxpool", pool, &[s])?
    } else {
        let s = net.conv_bn(x, cfg.width, 3, 1)?;
        net.relu(s)?
    };
    for (stage, &blocks) in cfg.blocks.iter().enumerate() {
        let width = cfg.width << stage;
        for i in 0..blocks {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            h = net.block(h, width, stride, cfg.bottleneck)?;
        }
    }
    let pooled = net.named("gap", Op::GlobalAvgPool, &[h])?;
    let flat = net.named("flatten", Op::Flatten { axis: 1 }, &[pooled])?;
    let features = net.b.type_of(flat).dims[1];
    let bound = (1.0 / features as f32).sqrt();
    let fc_w = net.weight("fc.w", &[cfg.classes, features], -bound, bound)?;
    let fc_b = net.weight("fc.b", &[cfg.classes], -bound, bound)?;
    let gemm = Op::Gemm(GemmAttrs {
        trans_b: true,
        ..GemmAttrs::default()
    });
    let logits = net.named("fc", gemm, &[flat, fc_w, fc_b])?;
    net.b.finish(&[("logits", logits)]);
    Ok(module)
}

/// The residual tail Conv3×3 → BatchNorm → Add → Relu at `channels`×`hw`×`hw`, as
/// `tail(%x, %skip) -> (y)`: the motivating case of fusion.
pub fn residual_tail(channels: usize, hw: usize, seed: u64) -> Result<Module, Diagnostic> {
    // Checked before any weight is drawn: the conv's weights grow with channels² and the
    // activations with channels × hw², and either could ask for terabytes.
    if channels == 0 || hw == 0 || channels > MAX_TAIL_SIZE || hw > MAX_TAIL_SIZE {
        return Err(Diagnostic::error(
            "bad-model-size",
            format!(
                "a residual tail of {channels} channels at {hw}x{hw}: channels and size must \
                 be between 1 and {MAX_TAIL_SIZE}"
            ),
            Location::Unknown,
        ));
    }
    let ty = TensorType::f32([1, channels, hw, hw]);
    TensorType::f32([channels, channels, 3, 3])
        .check_size()
        .and_then(|()| ty.check_size())
        .map_err(|m| {
            Diagnostic::error(
                "bad-model-size",
                format!("a residual tail of {channels} channels at {hw}x{hw}: {m}"),
                Location::Unknown,
            )
        })?;
    let mut module = Module::default();
    let mut net = Net {
        b: FuncBuilder::new(&mut module, "tail"),
        seed,
        count: 0,
        named: 0,
    };
    let x = net.b.param("x", ty.clone());
    let skip = net.b.param("skip", ty);
    let y = net.conv_bn(x, channels, 3, 1)?;
    let sum = net.named("add", Op::Binary(BinaryOp::Add), &[y, skip])?;
    let out = net.relu(sum)?;
    net.b.finish(&[("y", out)]);
    Ok(module)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resnet_shapes_match_the_reference_networks() {
        for (cfg, convs, features) in [
            (ResNetConfig::resnet18(), 20, 512),
            (ResNetConfig::resnet50(), 53, 2048),
        ] {
            let m = resnet(&cfg).unwrap();
            let f = &m.funcs[0];
            let n_convs = f
                .insts
                .iter()
                .filter(|i| matches!(i.op, Op::Conv2d(_)))
                .count();
            assert_eq!(n_convs, convs);
            let flat = f
                .insts
                .iter()
                .find(|i| matches!(i.op, Op::Flatten { .. }))
                .unwrap();
            assert_eq!(flat.ty.dims, vec![1, features]);
            assert_eq!(f.type_of(f.results[0].value).dims, vec![1, 1000]);
        }
    }

    #[test]
    fn resnet50_flops_are_about_8_gflop() {
        let m = resnet(&ResNetConfig::resnet50()).unwrap();
        let f = &m.funcs[0];
        let flops: u64 = f
            .insts
            .iter()
            .filter(|i| matches!(i.op, Op::Conv2d(_) | Op::Gemm(_)))
            .map(|i| {
                let ops: Vec<_> = i.operands.iter().map(|v| f.type_of(*v)).collect();
                i.op.flops(&ops, &i.ty)
            })
            .sum();
        // 4.1 G multiply-adds (the published figure), two flops each.
        assert!((8.0e9..8.4e9).contains(&(flops as f64)), "{flops}");
    }
}
