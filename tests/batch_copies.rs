//! Batches run as copies of the batch-1 executable (`DynamicOptions::batch_copies`): one
//! compile for every batch size, each kernel touching the batch called once per
//! element — against onnxruntime, against the buckets it replaces, through faults, `i1`
//! and pass-through results, results without the batch, and a model whose elements
//! read each other (which must not run as copies).
//!
//! Data: `scripts/make_batch_models.py` writes it to `target/onnx-tests/batches`.

mod common;

use std::path::PathBuf;

use smelt::{DynamicExecutable, DynamicOptions, Options, Tensor};

fn data(model: &str) -> PathBuf {
    common::generated_data(
        "batches",
        "make_batch_models.py",
        "onnx 1.23.2 onnxruntime 1.32.0 batches 1",
    )
    .join(model)
}

fn open(model: &str, threads: usize, batch_copies: bool) -> DynamicExecutable {
    let mut options = Options::default();
    options.compile.threads = threads;
    let dynamic = DynamicOptions {
        batch_copies,
        ..DynamicOptions::default()
    };
    DynamicExecutable::new(&data(model).join("model.onnx"), &options, dynamic)
        .expect("a model with a dynamic batch")
}

fn npy(model: &str, file: &str) -> Tensor {
    common::read_npy(&data(model).join(file))
}

/// The first `n` elements of a batched tensor.
fn first(t: &Tensor, n: usize) -> Tensor {
    let mut dims = t.ty.dims.clone();
    let per = t.ty.storage_len() / dims[0];
    dims[0] = n;
    let ty = smelt::TensorType {
        dims,
        ..t.ty.clone()
    };
    let bytes = t.data.to_le_bytes();
    let size = t.ty.dtype.size_bytes();
    Tensor {
        data: smelt::ir::TensorData::from_le_bytes(t.ty.dtype, &bytes[..n * per * size])
            .expect("a prefix of whole elements"),
        ty,
    }
}

fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.ty.dims, want.ty.dims, "{what}");
    let err = smelt::ir::ErrorStats::between_tensors(got, want).expect("comparable tensors");
    assert!(err.relative <= 1e-5, "{what}: {err:?}");
}

#[test]
fn a_batch_runs_as_copies_of_one_compile_and_matches_onnxruntime() {
    let ids = npy("embed_classify", "ids.npy");
    let want: Vec<Tensor> = ["probs", "confident", "ids_out", "table_sum"]
        .iter()
        .map(|o| npy("embed_classify", &format!("want_{o}.npy")))
        .collect();
    for threads in [1, 2] {
        let exe = open("embed_classify", threads, true);
        // every batch size from one compile; a batch is a prefix of the file's five
        for n in [5, 3, 1, 2] {
            let got = exe
                .run(&[first(&ids, n)])
                .unwrap_or_else(|e| panic!("batch {n}: {e}"));
            assert_close(&got[0], &first(&want[0], n), "probs");
            // bools, ids and the unbatched sum exactly
            assert_eq!(got[1], first(&want[1], n), "confident at batch {n}");
            assert_eq!(
                got[2],
                first(&want[2], n),
                "ids passed through at batch {n}"
            );
            assert_close(&got[3], &want[3], "table_sum");
            assert_eq!(common::chunk_buckets(&exe, n, 1), vec![1], "batch {n}");
        }
        let compiled = exe.specializations();
        let batches: Vec<usize> = compiled.iter().map(|s| s.batch).collect();
        assert_eq!(
            batches,
            vec![1],
            "{threads} threads: bucket 1 serves every batch"
        );
        assert_eq!(compiled[0].copies, Some(Ok(())));
        assert_eq!(exe.chunks(5, 1).unwrap(), vec![5]);
    }
}

#[test]
fn convolutions_in_copies_match_onnxruntime_and_the_buckets_they_replace() {
    let image = npy("conv_pool", "image.npy");
    let want = npy("conv_pool", "want_logits.npy");
    for threads in [1, 2] {
        let copies = open("conv_pool", threads, true);
        let buckets = open("conv_pool", threads, false);
        let got = copies.run(std::slice::from_ref(&image)).expect("copies");
        assert_close(&got[0], &want, "copies");
        let by_buckets = buckets.run(std::slice::from_ref(&image)).expect("buckets");
        assert_close(&by_buckets[0], &want, "buckets");
        assert_eq!(buckets.chunks(5, 1).unwrap(), vec![4, 1]);
        let compiled: Vec<usize> = buckets.specializations().iter().map(|s| s.batch).collect();
        assert_eq!(compiled, vec![1, 4], "the buckets compile two sizes");
        assert_eq!(copies.specializations().len(), 1, "copies compile one");
    }
}

#[test]
fn a_fault_in_one_copy_stops_the_run_naming_it() {
    let exe = open("embed_classify", 2, true);
    let mut ids = npy("embed_classify", "ids.npy");
    let smelt::ir::TensorData::I64(values) = &mut ids.data else {
        panic!("int64 ids")
    };
    // element 3's third token is past the 20-row table
    values[3 * 6 + 2] = 99;
    let e = exe.run(&[ids]).expect_err("an id out of range").to_string();
    assert!(e.contains("an index is out of range"), "{e}");
    assert!(e.contains("copy 3 of the batch"), "{e}");
    // the executable is unharmed: a good batch still runs
    let good = npy("embed_classify", "ids.npy");
    let got = exe.run(&[good]).expect("a good batch after a fault");
    assert_close(
        &got[0],
        &npy("embed_classify", "want_probs.npy"),
        "after the fault",
    );
}

#[test]
fn elements_that_read_each_other_never_run_as_copies() {
    let exe = open("batch_mixer", 2, true);
    let x = npy("batch_mixer", "x.npy");
    // batch 4 is a bucket: it runs whole, compiled for 4
    let got = exe.run(std::slice::from_ref(&x)).expect("a bucket's batch");
    assert_close(&got[0], &npy("batch_mixer", "want_centered.npy"), "batch 4");
    assert_eq!(common::chunk_buckets(&exe, 4, 1), vec![4]);
    let bucket1 = exe
        .specializations()
        .into_iter()
        .find(|s| s.batch == 1)
        .expect("bucket 1 decides the chunks");
    let why = bucket1.copies.expect("decided").expect_err("refused");
    assert!(
        why.contains("ReduceMean") || why.contains("reduce"),
        "{why}"
    );
    // a batch that is no bucket would need a split: an error naming the op
    let e = exe
        .run(&[first(&x, 3)])
        .expect_err("batch 3 cannot be split")
        .to_string();
    assert!(e.contains("ReduceMean") || e.contains("reduce"), "{e}");
}

#[test]
fn copies_past_the_memory_budget_are_an_error_not_an_allocation() {
    let image = npy("conv_pool", "image.npy");
    let one = open("conv_pool", 1, true);
    let arena = one.bucket(1, 1).expect("bucket 1").arena_bytes() as u64;
    assert!(arena > 0);
    // bucket 1 fits (its weights and one arena), five arenas do not
    let tight = |threads: usize| {
        let mut options = Options::default();
        options.load.memory_budget = Some(3 * arena);
        options.compile.threads = threads;
        DynamicExecutable::new(
            &data("conv_pool").join("model.onnx"),
            &options,
            DynamicOptions::default(),
        )
        .expect("a model with a dynamic batch")
    };
    // one thread runs the copies step by step, each in its own arena
    let serial = tight(1);
    serial
        .run(&[first(&image, 1)])
        .expect("batch 1 fits the budget");
    let e = serial
        .run(std::slice::from_ref(&image))
        .expect_err("five arenas past the budget")
        .to_string();
    assert!(e.contains("run-time arenas of 5 copies"), "{e}");
    assert!(e.contains("budget"), "{e}");
    // two threads run each copy whole, in one arena per thread: five copies fit
    let shared = tight(2);
    let bucket = shared.bucket(1, 1).expect("bucket 1");
    assert_eq!(bucket.copies_arena_bytes(5) as u64, 2 * arena);
    let got = shared
        .run(std::slice::from_ref(&image))
        .expect("five copies in two arenas fit the budget");
    assert_close(&got[0], &npy("conv_pool", "want_logits.npy"), "two arenas");
}
