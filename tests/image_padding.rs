//! Images of any size run at a larger bucket (issue #23): `symbolic::pad_images` masks
//! every value a window op reads across its border and rescales global average pools;
//! the masked function, specialized at the bucket, run by the interpreter on the input
//! padded with zeros and cropped, gives what the function specialized at the real size
//! gives. Functions that read across the border otherwise are refused by name.

mod common;

use std::collections::BTreeMap;

use smelt_ir::symbolic::{bind_symbols, pad_images, specialize, PaddedFunc, NOT_IMAGE_PADDABLE};
use smelt_ir::text;
use smelt_ir::{interp, ErrorStats, Module, Tensor, TensorData, TensorType};

fn detector() -> Module {
    let path = common::root().join("tests/cases/image_padding/detector.tir");
    text::parse_file(&path).expect("the detector case parses")
}

fn image(h: usize, w: usize) -> BTreeMap<String, Vec<usize>> {
    [("x".to_string(), vec![1, 3, h, w])].into()
}

/// `t` (rank 4, f32) placed at the origin of zeros of `dims`.
fn padded(t: &Tensor, dims: &[usize]) -> Tensor {
    let mut out = vec![0f32; dims.iter().product()];
    let src = t.f32s();
    let d = &t.ty.dims;
    for n in 0..d[0] {
        for c in 0..d[1] {
            for y in 0..d[2] {
                let from = ((n * d[1] + c) * d[2] + y) * d[3];
                let to = ((n * dims[1] + c) * dims[2] + y) * dims[3];
                out[to..to + d[3]].copy_from_slice(&src[from..from + d[3]]);
            }
        }
    }
    Tensor {
        ty: TensorType::f32(dims.to_vec()),
        data: TensorData::F32(out),
    }
}

/// The first `dims` of each axis of `t` (rank 4, f32).
fn cropped(t: &Tensor, dims: &[usize]) -> Tensor {
    let src = t.f32s();
    let d = &t.ty.dims;
    let mut out = Vec::with_capacity(dims.iter().product());
    for n in 0..dims[0] {
        for c in 0..dims[1] {
            for y in 0..dims[2] {
                let from = ((n * d[1] + c) * d[2] + y) * d[3];
                out.extend_from_slice(&src[from..from + dims[3]]);
            }
        }
    }
    Tensor {
        ty: TensorType::f32(dims.to_vec()),
        data: TensorData::F32(out),
    }
}

/// `m` with its entry replaced by `p`'s padded form, specialized at `bucket`, and that
/// module's inputs: the image `x` padded with zeros, the masks and scales of a run at
/// `real` (a run whose "real" size is the bucket gets masks of ones and scales of 1).
fn at_bucket(
    m: &Module,
    p: &PaddedFunc,
    x: &Tensor,
    real: (usize, usize),
    bucket: (usize, usize),
) -> (Module, Vec<Tensor>) {
    let f = m.entry().expect("an entry function");
    let mut masked = m.clone();
    masked.funcs[0] = p.func.clone();
    let real_b = bind_symbols(f, &image(real.0, real.1)).unwrap();
    let bucket_b = bind_symbols(f, &image(bucket.0, bucket.1)).unwrap();
    let mut inputs = vec![padded(x, &[1, 3, bucket.0, bucket.1])];
    inputs.extend(
        p.extra_inputs(&real_b, &bucket_b)
            .expect("masks and scales"),
    );
    let shapes: BTreeMap<String, Vec<usize>> = p
        .func
        .params
        .iter()
        .zip(&inputs)
        .map(|(param, t)| (param.name.clone(), t.ty.dims.clone()))
        .collect();
    let module = specialize(&masked, &shapes).expect("specializes at the bucket");
    (module, inputs)
}

/// The largest relative error between the function run at `real` and its padded form
/// run at `bucket` and cropped, over every result.
fn padded_against_exact(m: &Module, real: (usize, usize), bucket: (usize, usize)) -> f64 {
    let f = m.entry().expect("an entry function");
    let x = Tensor::random(&TensorType::f32(vec![1, 3, real.0, real.1]), 7);
    let exact = specialize(m, &image(real.0, real.1)).expect("specializes at the real size");
    let want = interp::run(&exact, exact.entry().unwrap(), std::slice::from_ref(&x))
        .expect("the exact run");
    let p = pad_images(f).expect("the detector runs padded");
    let (module, inputs) = at_bucket(m, &p, &x, real, bucket);
    let got = interp::run(&module, module.entry().unwrap(), &inputs).expect("runs");
    got.iter()
        .zip(&want)
        .map(|(g, w)| {
            let g = cropped(g, &w.ty.dims);
            ErrorStats::between(g.f32s(), w.f32s()).relative
        })
        .fold(0.0, f64::max)
}

#[test]
fn a_detector_padded_to_a_bucket_gives_the_exact_results_cropped() {
    let p = pad_images(detector().entry().unwrap()).expect("paddable");
    // one mask per distinct size read across a border: the image's half (the depthwise
    // conv's input and the pool's), the upsampled size (the average pool's and the last
    // conv's); one scale for the squeeze-and-excitation pool
    assert_eq!(p.masks.len(), 2, "{:?}", p.masks);
    assert_eq!(p.scales.len(), 1);
    // odd and even sizes inside buckets of several shapes, and a bucket of the size itself
    for (real, bucket) in [
        ((21, 26), (32, 32)),
        ((17, 9), (24, 40)),
        ((30, 30), (31, 33)),
        ((16, 16), (16, 16)),
    ] {
        let e = padded_against_exact(&detector(), real, bucket);
        assert!(e <= 1e-5, "{real:?} in {bucket:?}: relative error {e:.3e}");
    }
}

#[test]
fn without_masks_the_padded_border_leaks_into_the_results() {
    // the check above is not vacuous: with every mask all ones, the border's values
    // (relu(bias) after the first conv) reach the results
    let m = detector();
    let f = m.entry().unwrap();
    let x = Tensor::random(&TensorType::f32(vec![1, 3, 21, 26]), 7);
    let exact = specialize(&m, &image(21, 26)).unwrap();
    let want = interp::run(&exact, exact.entry().unwrap(), std::slice::from_ref(&x)).unwrap();
    let p = pad_images(f).unwrap();
    // "real" = the bucket: masks of ones, scales of 1
    let (module, inputs) = at_bucket(&m, &p, &x, (32, 32), (32, 32));
    let got = interp::run(&module, module.entry().unwrap(), &inputs).unwrap();
    let g = cropped(&got[0], &want[0].ty.dims);
    let e = ErrorStats::between(g.f32s(), want[0].f32s()).relative;
    assert!(e > 1e-3, "the border did not reach the results: {e:.3e}");
}

#[test]
fn ops_that_read_across_the_border_otherwise_are_refused_by_name() {
    let head = "func @main(%x: tensor<1x4xHxWxf32>) -> (y: tensor<";
    for (tail, op) in [
        (
            "1x4x((H + 1) / 2)x((W + 1) / 2)xf32>) {\n  %y = max_pool2d %x {kernel = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} : tensor<1x4x((H + 1) / 2)x((W + 1) / 2)xf32>",
            "max_pool2d",
        ),
        (
            "1x(4*H*W)xf32>) {\n  %y = reshape %x {shape = [1, (4*H*W)]} : tensor<1x(4*H*W)xf32>",
            "reshape",
        ),
        (
            "1x4x(2*H)x(2*W)xf32>) {\n  %y = resize %x {sizes = [1, 4, (2*H), (2*W)], scales = [1.0, 1.0, 0.0, 0.0], mode = linear} : tensor<1x4x(2*H)x(2*W)xf32>",
            "resize",
        ),
        (
            // a fill that need not be the zeros past the real extent
            "1x4x(H + 2)x(W + 2)xf32>) {\n  %y = pad %x, %fill {pads = [0, 0, 1, 1, 0, 0, 1, 1]} : tensor<1x4x(H + 2)x(W + 2)xf32>",
            "pad",
        ),
    ] {
        let ret = tail.split(") {").next().unwrap().to_string();
        let head = match op {
            "pad" => head.replace("f32>) ->", "f32>, %fill: tensor<f32>) ->"),
            _ => head.to_string(),
        };
        let src = format!("{head}{tail}\n  return %y : tensor<{ret}\n}}\n");
        let m = text::parse(&src, "refused.tir").unwrap_or_else(|e| panic!("{src}\n{e}"));
        let e = pad_images(m.entry().unwrap()).expect_err(op);
        assert_eq!(e.code, NOT_IMAGE_PADDABLE, "{e}");
        assert!(e.message.contains(op), "{op}: {e}");
    }
}

/// The whole compiler on an exporter's detector: DBNet (MobileNetV3 backbone with SE
/// pools, an FPN of nearest ×2 upsamplings, a transposed-conv head) imported with its
/// sizes as symbols runs padded — masked, fused, compiled at the bucket 320×320 — and,
/// cropped, gives what the executable compiled for 256×288 itself gives.
#[test]
fn dbnet_from_onnx_runs_padded_through_the_whole_compiler() {
    let path = common::image_size_models().join("dbnet_fpn/model.onnx");
    let m = smelt::onnx::import_file_symbolic(&path, &Default::default()).expect("imports");
    let f = m.entry().unwrap();
    let p = pad_images(f).expect("DBNet runs padded");
    assert!(p.masks.len() >= 4, "{} masks", p.masks.len());
    assert!(!p.scales.is_empty(), "the SE pools are rescaled");
    let (real, bucket) = ((256, 288), (320, 320));
    let x = Tensor::random(&TensorType::f32(vec![1, 3, real.0, real.1]), 11);
    let opts = smelt::Options::default();
    let exact = specialize(&m, &image(real.0, real.1)).unwrap();
    let (exe, _) = smelt::compile(&exact, &opts).expect("compiles at the real size");
    let want = exe.run(std::slice::from_ref(&x)).unwrap();
    let (module, inputs) = at_bucket(&m, &p, &x, real, bucket);
    let (exe, _) = smelt::compile(&module, &opts).expect("compiles at the bucket");
    let got = exe.run(&inputs).unwrap();
    let g = cropped(&got[0], &want[0].ty.dims);
    let e = ErrorStats::between(g.f32s(), want[0].f32s()).relative;
    assert!(e <= 1e-4, "relative error {e:.3e}");
}

#[test]
fn a_segmenter_that_resizes_bilinearly_to_the_image_is_refused() {
    let path = common::image_size_models().join("segmenter/model.onnx");
    let m = smelt::onnx::import_file_symbolic(&path, &Default::default()).expect("imports");
    let e = pad_images(m.entry().unwrap()).expect_err("a bilinear resize to the input size");
    assert_eq!(e.code, NOT_IMAGE_PADDABLE);
    assert!(e.message.contains("resize"), "{e}");
}
