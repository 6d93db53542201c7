//! Models whose image sizes are symbolic, compiled once (`smelt::DynamicExecutable`) and
//! run at sizes of the caller's choosing against onnxruntime: a DBNet-style detector
//! (height and width), an any-size segmenter whose two inputs share both symbols, and a
//! text-line recognizer whose one symbol, its width, cannot be padded.
//!
//! Data: `scripts/make_image_size_models.py` writes it to `target/onnx-tests/image_sizes`
//! (regenerated when its stamp changes; missing data fails, naming the set-up command).

mod common;

use std::path::PathBuf;

use smelt::dynamic::{DynamicDim, SharedModule};
use smelt::ir::padding::NOT_PADDABLE;
use smelt::ir::ErrorStats;
use smelt::{DynamicExecutable, DynamicOptions, Options, Tensor};

fn data_dir() -> PathBuf {
    common::image_size_models()
}

fn open(model: &str, dynamic: DynamicOptions) -> DynamicExecutable {
    let path = data_dir().join(model).join("model.onnx");
    DynamicExecutable::new(&path, &Options::default(), dynamic)
        .unwrap_or_else(|e| panic!("{model}: {e}"))
}

/// The inputs `names` and onnxruntime's result `output` at size `tag` (HEIGHTxWIDTH).
fn case(model: &str, names: &[&str], output: &str, tag: &str) -> (Vec<Tensor>, Tensor) {
    let dir = data_dir().join(model);
    let read = |name: &str| common::read_npy(&dir.join(format!("{name}_{tag}.npy")));
    let inputs = names.iter().map(|n| read(n)).collect();
    (inputs, read(&format!("want_{output}")))
}

fn assert_matches(got: &Tensor, want: &Tensor, what: &str) {
    let e = ErrorStats::between_tensors(got, want).unwrap_or_else(|e| panic!("{what}: {e}"));
    println!(
        "{what}: relative {:.3e} over {} values",
        e.relative, e.count
    );
    assert!(e.relative <= 1e-4, "{what}: relative {:.3e}", e.relative);
}

/// The sizes each specialization was compiled for, oldest first.
fn compiled_sizes(exe: &DynamicExecutable) -> Vec<Vec<usize>> {
    exe.specializations()
        .into_iter()
        .map(|s| s.symbols)
        .collect()
}

#[test]
fn dbnet_runs_images_of_three_sizes_within_1e4_of_onnxruntime() {
    let exe = open("dbnet_fpn", DynamicOptions::default());
    assert_eq!(exe.symbols(), ["height", "width"]);
    assert_eq!(
        exe.inputs()[0].dims,
        [
            DynamicDim::Fixed(1),
            DynamicDim::Fixed(3),
            DynamicDim::Symbol(0),
            DynamicDim::Symbol(1)
        ]
    );
    assert!(exe.specializations().is_empty(), "nothing compiled yet");
    for tag in ["320x320", "640x480", "960x960"] {
        let (inputs, want) = case("dbnet_fpn", &["x"], "maps", tag);
        let got = exe.run(&inputs).expect("a run at a new size");
        assert_eq!(got[0].ty, want.ty, "the result is cropped to {tag}");
        assert_matches(&got[0], &want, &format!("dbnet {tag}"));
    }
    // each size ran padded to its image bucket (a side of 480 to 512, 960 to 1024)
    assert_eq!(
        compiled_sizes(&exe),
        [vec![320, 320], vec![640, 512], vec![1024, 1024]]
    );
    // the buckets packed the convolutions' weights once: the later two took them
    let shared = exe.shared_constants();
    assert!(
        shared.constants > 0 && shared.hits >= shared.constants,
        "{shared:?}"
    );
    assert_fused_once(&exe);
    // compiled exactly instead, each size is its own specialization
    let exact = open(
        "dbnet_fpn",
        DynamicOptions {
            image_buckets: false,
            ..DynamicOptions::default()
        },
    );
    for tag in ["320x320", "640x480", "960x960"] {
        let (inputs, want) = case("dbnet_fpn", &["x"], "maps", tag);
        let got = exact.run(&inputs).expect("an exact run");
        assert_matches(&got[0], &want, &format!("dbnet {tag}, exact"));
    }
    assert_eq!(
        compiled_sizes(&exact),
        [vec![320, 320], vec![640, 480], vec![960, 960]]
    );
}

/// Sizes off every bucket share one: 608×480 and 640×512 both run DBNet's 640×512 bucket,
/// and each agrees with the executable compiled for exactly its size; the plan of one
/// size refuses the inputs of another.
#[test]
fn dbnet_sizes_inside_one_bucket_share_its_code_and_stay_exact() {
    let padded = open("dbnet_fpn", DynamicOptions::default());
    let exact = open(
        "dbnet_fpn",
        DynamicOptions {
            image_buckets: false,
            ..DynamicOptions::default()
        },
    );
    for (k, (h, w)) in [(608, 480), (640, 512), (608, 480)].into_iter().enumerate() {
        let x = Tensor::random(&smelt::TensorType::f32(vec![1, 3, h, w]), 20 + k as u64);
        let got = padded.run(std::slice::from_ref(&x)).expect("a padded run");
        let want = exact.run(std::slice::from_ref(&x)).expect("an exact run");
        assert_eq!(got[0].ty.dims, [1, 1, h, w]);
        assert_matches(&got[0], &want[0], &format!("dbnet {h}x{w} padded"));
    }
    assert_eq!(compiled_sizes(&padded), [vec![640, 512]]);
    // a plan's masks are its sizes': other inputs are refused, not run with them
    let shape: &[usize] = &[1, 3, 608, 480];
    let plan = padded.plan(&[shape]).expect("a plan");
    let x = vec![0f32; 3 * 640 * 512];
    let mut y = vec![0f32; 640 * 512];
    let other: &[usize] = &[1, 3, 640, 512];
    let e = padded
        .run_planned(
            &plan,
            &[other],
            &[smelt::runtime::Elements::F32(&x)],
            &mut [smelt::runtime::ElementsMut::F32(&mut y)],
        )
        .expect_err("inputs of another size than the plan's");
    assert!(e.to_string().contains("the plan was made for"), "{e}");
}

/// Every size specialized the one module imported and fused with symbolic sizes.
fn assert_fused_once(exe: &DynamicExecutable) {
    assert!(
        matches!(exe.shared_module(), SharedModule::Symbolic { .. }),
        "{:?}",
        exe.shared_module()
    );
}

#[test]
fn dbnet_refuses_641x479_naming_the_input_and_dimension_as_onnxruntime_refuses() {
    let refused = std::fs::read_to_string(data_dir().join("dbnet_fpn/refused_641x479.txt"))
        .expect("onnxruntime's refusal is recorded");
    assert!(refused.contains("41 by 42"), "{refused}");
    let exe = open("dbnet_fpn", DynamicOptions::default());
    let x = Tensor::zeros(&smelt::TensorType::f32(vec![1, 3, 641, 479]));
    let e = exe
        .run(&[x])
        .expect_err("FPN maps of 41 and 42 rows")
        .to_string();
    // the FPN's ×2 upsampling needs the sides multiples of 32 (ORT: an `Add` of 41 by 42)
    assert!(
        e.contains("input %x dimension 2 is 641") && e.contains(r#"no size of "height/32""#),
        "{e}"
    );
}

#[test]
fn a_segmenter_runs_sizes_off_any_multiple_and_keeps_the_newest_shapes() {
    let exe = open(
        "segmenter",
        DynamicOptions {
            max_shapes: 2,
            ..DynamicOptions::default()
        },
    );
    assert_eq!(exe.symbols(), ["height", "width"]);
    for tag in ["641x479", "320x320", "97x203", "641x479"] {
        let (inputs, want) = case("segmenter", &["x", "m"], "y", tag);
        let got = exe.run(&inputs).expect("a run");
        assert_matches(&got[0], &want, &format!("segmenter {tag}"));
    }
    // 641x479 was dropped when 97x203 came, and compiled again
    assert_eq!(compiled_sizes(&exe), [vec![97, 203], vec![641, 479]]);
}

#[test]
fn inputs_that_disagree_on_a_shared_symbol_are_refused_by_name() {
    let exe = open("segmenter", DynamicOptions::default());
    let x = Tensor::zeros(&smelt::TensorType::f32(vec![1, 3, 64, 64]));
    let m = Tensor::zeros(&smelt::TensorType::f32(vec![1, 1, 64, 65]));
    let e = exe.run(&[x, m]).expect_err("widths 64 and 65").to_string();
    assert!(
        e.contains("input m dimension 3 ('width') is 65") && e.contains("input x"),
        "{e}"
    );
    let x = Tensor::zeros(&smelt::TensorType::f32(vec![1, 3, 0, 8]));
    let m = Tensor::zeros(&smelt::TensorType::f32(vec![1, 1, 0, 8]));
    let e = exe.run(&[x, m]).expect_err("height 0").to_string();
    assert!(e.contains("('height') is 0"), "{e}");
    assert!(
        exe.specializations().is_empty(),
        "refused runs compile nothing"
    );
}

/// A text-line recognizer's width is its one symbol, so it is first tried as a padded
/// sequence; its convs read across the width, the padding proof refuses, and from then
/// on each width compiles exactly, the refusal kept as a warning of each specialization.
#[test]
fn a_recognizer_whose_width_cannot_be_padded_compiles_each_width_exactly() {
    let exe = open("recognizer", DynamicOptions::default());
    assert_eq!(exe.inputs()[0].dims[3], DynamicDim::Sequence);
    for tag in ["32x100", "32x257", "32x320"] {
        let (inputs, want) = case("recognizer", &["x"], "probs", tag);
        let got = exe.run(&inputs).expect("a run");
        assert_matches(&got[0], &want, &format!("recognizer {tag}"));
    }
    assert_eq!(exe.symbols(), ["width"]);
    let specializations = exe.specializations();
    let widths: Vec<Vec<usize>> = specializations.iter().map(|s| s.symbols.clone()).collect();
    assert_eq!(widths, [vec![100], vec![257], vec![320]]);
    assert_fused_once(&exe);
    for s in &specializations {
        assert!(
            s.warnings.iter().any(|w| w.code == NOT_PADDABLE),
            "{:?}",
            s.warnings
        );
    }
}

/// Two threads running new sizes at once each compile their own set of sizes, and a
/// third running a size another is compiling waits for that compile: every result is
/// the one a thread alone gets.
#[test]
fn threads_running_new_sizes_at_once_agree_with_runs_alone() {
    let exe = open("segmenter", DynamicOptions::default());
    let tags = ["97x203", "320x320", "97x203"];
    let results: Vec<Tensor> = std::thread::scope(|s| {
        let runs: Vec<_> = tags
            .iter()
            .map(|tag| {
                let exe = &exe;
                s.spawn(move || {
                    let (inputs, _) = case("segmenter", &["x", "m"], "y", tag);
                    exe.run(&inputs).expect("a concurrent run").remove(0)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (tag, got) in tags.iter().zip(&results) {
        let (inputs, _) = case("segmenter", &["x", "m"], "y", tag);
        let alone = open("segmenter", DynamicOptions::default())
            .run(&inputs)
            .expect("a run alone")
            .remove(0);
        assert_eq!(got, &alone, "{tag}");
    }
    let mut sizes = compiled_sizes(&exe);
    sizes.sort();
    assert_eq!(
        sizes,
        [vec![97, 203], vec![320, 320]],
        "one compile per size"
    );
}

#[test]
fn a_cache_of_no_shapes_or_of_absurdly_many_is_refused() {
    let path = data_dir().join("segmenter/model.onnx");
    for max_shapes in [0, smelt::dynamic::MAX_SHAPES_LIMIT + 1] {
        let e = DynamicExecutable::new(
            &path,
            &Options::default(),
            DynamicOptions {
                max_shapes,
                ..DynamicOptions::default()
            },
        )
        .err()
        .expect("refused")
        .to_string();
        assert!(e.contains("max_shapes"), "{e}");
    }
}
