//! A BERT encoder exported from PyTorch with a symbolic sequence length, compiled once
//! (`smelt::DynamicExecutable`) and run at lengths on and off its length buckets, against
//! executables specialized for exactly that length; and the padding proof refusing a
//! model whose padded positions would reach valid ones.

mod common;

use std::path::{Path, PathBuf};

use smelt::dynamic::{sequence_buckets, DynamicDim, SharedModule};
use smelt::ir::{ErrorStats, TensorData};
use smelt::{DynamicExecutable, DynamicOptions, Options, Tensor, TensorType};

fn bert() -> PathBuf {
    common::exported_models().join("bert_opset14/model.onnx")
}

/// Token ids, an attention mask whose last quarter is padding, and token types, for
/// `batch` sequences of `length`.
fn bert_inputs(batch: usize, length: usize, seed: u64) -> Vec<Tensor> {
    let ty = TensorType::new(smelt::ir::DType::I64, vec![batch, length]);
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut ids = Vec::with_capacity(batch * length);
    for _ in 0..batch * length {
        // xorshift: token ids over the whole vocabulary
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ids.push((state % 30522) as i64);
    }
    let mask: Vec<i64> = (0..batch * length)
        .map(|i| i64::from(i % length < length - length / 4))
        .collect();
    let types: Vec<i64> = (0..batch * length)
        .map(|i| i64::from(i % length >= length / 2))
        .collect();
    [ids, mask, types]
        .into_iter()
        .map(|v| Tensor {
            ty: ty.clone(),
            data: TensorData::I64(v),
        })
        .collect()
}

/// The same inputs run by an executable compiled for exactly their shape.
fn specialized(model: &Path, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut opts = Options::default();
    for (name, t) in ["input_ids", "attention_mask", "token_type_ids"]
        .iter()
        .zip(inputs)
    {
        opts.load
            .input_shapes
            .insert(name.to_string(), t.ty.dims.clone());
    }
    let (exe, _) = smelt::compile_file(model, &opts).expect("specialized compile");
    exe.run(inputs).expect("specialized run")
}

fn assert_close(got: &[Tensor], want: &[Tensor], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: result count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.ty, w.ty, "{what}");
        let err = ErrorStats::between_tensors(g, w).expect("comparable results");
        assert!(err.relative <= 1e-5, "{what}: {err:?}");
    }
}

#[test]
fn lengths_on_and_off_buckets_match_specialized_executables() {
    let model = bert();
    let dynamic = DynamicExecutable::new(&model, &Options::default(), DynamicOptions::default())
        .expect("a dynamic sequence");
    assert_eq!(dynamic.inputs()[0].shape_text(), "NxS");
    assert_eq!(
        dynamic.inputs()[1].dims,
        vec![DynamicDim::Batch, DynamicDim::Sequence]
    );
    assert_eq!(dynamic.length_buckets(), &sequence_buckets(512)[..]);
    // 100 pads to 128, 16 is a bucket itself; 17 pads to 32
    for length in [100, 16, 17] {
        let inputs = bert_inputs(1, length, length as u64);
        let got = dynamic.run(&inputs).expect("dynamic run");
        assert_eq!(got[0].ty.dims, vec![1, length, 384], "length {length}");
        assert_close(
            &got,
            &specialized(&model, &inputs),
            &format!("length {length}"),
        );
    }
    let compiled: Vec<Option<usize>> = dynamic.specializations().iter().map(|s| s.length).collect();
    assert_eq!(compiled, vec![Some(16), Some(32), Some(128)]);
    // the buckets serving shorter lengths stop their products at each run's length
    // (bucket 16 serves 1..=16, analysed against length 1, whose fusion differs)
    for s in dynamic.specializations() {
        match s.length {
            Some(32 | 128) => assert_eq!(s.valid_rows, Some(Ok(())), "bucket {:?}", s.length),
            _ => assert!(
                s.valid_rows.is_some(),
                "bucket {:?}: {:?}",
                s.length,
                s.valid_rows
            ),
        }
    }
    // the three buckets packed BERT's 36 projection weights once: the first computed
    // them, the other two took them
    let shared = dynamic.shared_constants();
    assert_eq!(shared.constants, 36, "{shared:?}");
    assert_eq!(shared.hits, 2 * 36, "{shared:?}");
    let bucket = dynamic.bucket(1, 100).expect("the bucket of length 100");
    assert_eq!(bucket.padded_rows(), Some(128));
    let (full, at_100) = (bucket.executed_flops(), bucket.executed_flops_at(100));
    let at_65 = bucket.executed_flops_at(65);
    assert!(at_65 < at_100 && at_100 < full, "{at_65} {at_100} {full}");
    assert_eq!(bucket.executed_flops_at(128), full);
    // BERT's position ids are a constant the importer folds from the length (the add of
    // the position embeddings): each bucket imports and fuses the model at its length
    match dynamic.shared_module() {
        SharedModule::PerBucket { reason, .. } => {
            assert!(reason.contains("/bert/embeddings/Add_1"), "{reason}")
        }
        other => panic!("BERT cannot keep its length symbolic, yet {other:?}"),
    }
}

#[test]
fn a_sweep_of_lengths_compiles_a_bounded_number_of_buckets() {
    // every length 1..=384 pads to one of these: at most 8 specializations per batch
    let buckets = sequence_buckets(384);
    assert_eq!(buckets, vec![16, 32, 64, 128, 192, 256, 384]);
    for length in 1..=384usize {
        let bucket = buckets.iter().find(|&&b| b >= length).copied();
        let bucket = bucket.expect("every length has a bucket");
        // padding costs at most 2x below 128 and 1.5x above
        assert!(
            bucket <= 16 || bucket < 2 * length || (length > 128 && 2 * bucket <= 3 * length),
            "length {length} pads to {bucket}"
        );
    }
    assert_eq!(sequence_buckets(1), vec![1]);
    assert_eq!(sequence_buckets(100), vec![16, 32, 64, 100]);
}

#[test]
fn a_length_past_the_largest_bucket_is_an_error_naming_it() {
    let dynamic = DynamicExecutable::new(
        &bert(),
        &Options::default(),
        DynamicOptions {
            max_sequence: 64,
            ..DynamicOptions::default()
        },
    )
    .expect("a dynamic sequence");
    let e = dynamic
        .run(&bert_inputs(1, 65, 1))
        .expect_err("a length past max_sequence")
        .to_string();
    assert!(
        e.contains("sequence length 65") && e.contains("1..=64"),
        "{e}"
    );
    let mut inputs = bert_inputs(1, 20, 1);
    inputs[1] = bert_inputs(1, 21, 1).remove(1);
    let e = dynamic
        .run(&inputs)
        .expect_err("inputs of different lengths")
        .to_string();
    assert!(
        e.contains("attention_mask") && e.contains("sequence length"),
        "{e}"
    );
    assert!(
        dynamic.specializations().is_empty(),
        "refused runs compile nothing"
    );
}

/// A batch of 3 at length 100 runs as three padded copies of the length bucket's batch-1
/// executable; the torch.export-based export (opset 18) reads its mask through a gather
/// along the flattened `[N·S]` mask, which the batch analysis follows element by element.
/// With `batch_copies` off it runs as three padded elements one after another.
#[test]
fn a_batch_off_its_buckets_at_a_length_off_its_buckets_matches() {
    let model = common::exported_models().join("bert_opset18/model.onnx");
    let dynamic = DynamicExecutable::new(&model, &Options::default(), DynamicOptions::default())
        .expect("a dynamic batch and sequence");
    let inputs = bert_inputs(3, 100, 11);
    let got = dynamic.run(&inputs).expect("dynamic run");
    assert_eq!(got[0].ty.dims, vec![3, 100, 384]);
    assert_eq!(got[1].ty.dims, vec![3, 384]);
    let want = specialized(&model, &inputs);
    assert_close(&got, &want, "batch 3, length 100");
    assert_eq!(dynamic.chunks(3, 100).unwrap(), vec![3]);
    assert_eq!(common::chunk_buckets(&dynamic, 3, 100), vec![1]);
    let compiled: Vec<(usize, Option<usize>)> = dynamic
        .specializations()
        .iter()
        .map(|s| (s.batch, s.length))
        .collect();
    assert!(compiled.contains(&(1, Some(128))), "{compiled:?}");
    assert!(compiled.iter().all(|&(b, _)| b == 1), "{compiled:?}");
    let at_128 = dynamic
        .specializations()
        .into_iter()
        .find(|s| s.length == Some(128))
        .expect("the bucket of length 100");
    assert_eq!(at_128.copies, Some(Ok(())));

    let one_by_one = DynamicExecutable::new(
        &model,
        &Options::default(),
        DynamicOptions {
            batch_copies: false,
            ..DynamicOptions::default()
        },
    )
    .expect("a dynamic batch and sequence");
    let got = one_by_one.run(&inputs).expect("dynamic run, one by one");
    assert_close(&got, &want, "batch 3, length 100, one by one");
    assert_eq!(one_by_one.chunks(3, 100).unwrap(), vec![1, 1, 1]);
}
