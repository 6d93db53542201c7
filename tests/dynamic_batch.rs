//! A model with a dynamic batch compiled once and run at batch sizes on and off its
//! buckets (`smelt::DynamicExecutable`), against executables specialized for each batch.

mod common;

use std::path::PathBuf;

use smelt::dynamic::SharedModule;
use smelt::{DynamicExecutable, DynamicOptions, Options, Tensor, TensorType};

fn mobilenet() -> PathBuf {
    common::exported_models().join("mobilenet_v3_small/model.onnx")
}

fn input(batch: usize) -> Tensor {
    Tensor::random(&TensorType::f32(vec![batch, 3, 224, 224]), 7)
}

/// The same batch run by an executable compiled for exactly that batch.
fn specialized(batch: usize, x: &Tensor) -> Tensor {
    let mut opts = Options::default();
    opts.load
        .input_shapes
        .insert("input".into(), vec![batch, 3, 224, 224]);
    let (exe, _) = smelt::compile_file(&mobilenet(), &opts).expect("specialized compile");
    exe.run(std::slice::from_ref(x))
        .expect("specialized run")
        .remove(0)
}

/// Batch copies (the default: every batch runs as copies of bucket 1) and buckets (a
/// compile per power of two) give a specialized executable's results.
#[test]
fn batches_on_and_off_buckets_match_specialized_executables() {
    for batch_copies in [true, false] {
        batches_match_specialized_executables(batch_copies);
    }
}

/// Options of one thread: its runs of copies go step by step, each copy in its own
/// arena, and so are split into chunks the cache holds.
fn one_thread() -> Options {
    let mut options = Options::default();
    options.compile.threads = 1;
    options
}

fn batches_match_specialized_executables(batch_copies: bool) {
    let dynamic = DynamicExecutable::new(
        &mobilenet(),
        &one_thread(),
        DynamicOptions {
            max_bucket: 2,
            // any real cache holds two elements of MobileNetV3-small (2.3 MB each)
            cache_bytes: Some(1 << 30),
            batch_copies,
            ..DynamicOptions::default()
        },
    )
    .expect("a dynamic batch");
    assert_eq!(dynamic.inputs()[0].shape_text(), "Nx3x224x224");
    assert_eq!(dynamic.bucket_sizes(), vec![1, 2]);
    assert!(
        dynamic.specializations().is_empty(),
        "nothing compiled before a run"
    );
    assert_eq!(dynamic.shared_module(), SharedModule::Pending);
    for batch in [3, 1] {
        let x = input(batch);
        let got = dynamic
            .run(std::slice::from_ref(&x))
            .expect("dynamic run")
            .remove(0);
        let want = specialized(batch, &x);
        assert_eq!(got.ty, want.ty, "batch {batch}");
        let (smelt::ir::TensorData::F32(g), smelt::ir::TensorData::F32(w)) =
            (&got.data, &want.data)
        else {
            panic!("f32 logits expected")
        };
        let err = smelt::ir::ErrorStats::between(g, w);
        assert!(err.relative <= 1e-5, "batch {batch}: {err:?}");
    }
    let compiled: Vec<usize> = dynamic.specializations().iter().map(|s| s.batch).collect();
    assert_eq!(dynamic.chunks(5, 1).unwrap(), vec![2, 2, 1]);
    if batch_copies {
        assert_eq!(
            compiled,
            vec![1],
            "batch 3 runs as 2 + 1 copies of bucket 1"
        );
        assert_eq!(common::chunk_buckets(&dynamic, 5, 1), vec![1, 1, 1]);
        assert_eq!(dynamic.specializations()[0].copies, Some(Ok(())));
    } else {
        assert_eq!(compiled, vec![1, 2], "batch 3 runs buckets 2 and 1");
        assert_eq!(common::chunk_buckets(&dynamic, 5, 1), vec![2, 2, 1]);
    }
    // both buckets specialized the one module fused with a symbolic batch
    assert!(
        matches!(dynamic.shared_module(), SharedModule::Symbolic { ms } if ms > 0.0),
        "{:?}",
        dynamic.shared_module()
    );
}

/// Chunks are no larger than the cache holds: with a cache smaller than one element's
/// arena every chunk is 1, bucket 2 is never compiled, and the results are the same —
/// unless the copies run whole, one arena per thread (two threads): then the whole
/// batch is one run, whatever the cache.
#[test]
fn chunks_stay_within_the_cache() {
    let x = input(3);
    let want = specialized(3, &x);
    for (threads, chunks) in [(1, vec![1, 1, 1]), (2, vec![3])] {
        let mut options = Options::default();
        options.compile.threads = threads;
        let dynamic = DynamicExecutable::new(
            &mobilenet(),
            &options,
            DynamicOptions {
                max_bucket: 8,
                cache_bytes: Some(1 << 20),
                ..DynamicOptions::default()
            },
        )
        .expect("a dynamic batch");
        assert_eq!(dynamic.largest_chunk().unwrap(), 1);
        assert_eq!(dynamic.chunks(3, 1).unwrap(), chunks, "{threads} threads");
        let got = dynamic.run(std::slice::from_ref(&x)).expect("dynamic run");
        assert_eq!(got[0].ty, want.ty);
        let err = smelt::ir::ErrorStats::between_tensors(&got[0], &want).unwrap();
        assert!(err.relative <= 1e-5, "{threads} threads: {err:?}");
        let compiled: Vec<usize> = dynamic.specializations().iter().map(|s| s.batch).collect();
        assert_eq!(compiled, vec![1], "only bucket 1 runs");
    }
}

#[test]
fn a_wrong_shape_is_an_error_naming_the_dimension() {
    let dynamic =
        DynamicExecutable::new(&mobilenet(), &Options::default(), DynamicOptions::default())
            .expect("a dynamic batch");
    let bad = Tensor::random(&TensorType::f32(vec![2, 3, 224, 200]), 1);
    let e = dynamic.run(&[bad]).expect_err("a wrong width").to_string();
    assert!(e.contains("dimension 3 must be 224"), "{e}");
    assert!(
        dynamic.specializations().is_empty(),
        "a refused run compiles nothing"
    );
}
