/* Embedding smelt from C: compile a model, run it, check the result independently.
 *
 *     residual_block [MODEL.tir [MODEL.onnx]]
 *                  (defaults: residual_block.tir, residual_block.onnx)
 *
 * The model is a residual block tail, y = relu(batch_norm(conv3x3(x) + bias) + x). The
 * program
 *   1. reads the model text and compiles it with smelt (fusion turns the four ops into
 *      one fused conv2d kernel),
 *   2. runs it on a seeded random input,
 *   3. recomputes y with a naive loop nest in double precision, from weights it derives
 *      itself: every weight in the .tir is a `random<seed = S, min = A, max = B>`
 *      constant, and `smelt_random_f32` below is smelt's documented generator (SplitMix64,
 *      the top 24 bits as a float in [0, 1), scaled to [A, B]),
 *   4. prints the max absolute and relative error (max |got - ref| / max |ref|) and fails
 *      if the relative error is above 1e-4,
 *   5. shows two mistakes the API catches before any native code runs: a wrong buffer
 *      length and a wrong number of outputs (status code plus smelt_last_error()),
 *   6. opens the same block as an ONNX model whose batch is dynamic (N x C x H x W, made
 *      from the .tir's weights by make_residual_block_onnx.py) as one dynamic executable,
 *      runs batches 1, 3 and 8 on it (compiled once, at batch 1: every batch runs as
 *      copies of it, each kernel once per element, since the block computes each element
 *      on its own), checks every batch element against the same reference, lists the
 *      specializations compiled, and shows a shape the model refuses (a wrong channel
 *      count).
 * Exit status: 0 when every check passed, 1 otherwise, 2 on a setup problem.
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "smelt.h"

/* The graph structure mirrored from residual_block.tir (the weights come from the file). */
#define EPSILON 1.0e-3 /* batch_norm epsilon */
#define PAD 1          /* conv2d pads = [1, 1, 1, 1], 3x3 kernel, stride 1 */
#define K 3
#define TOLERANCE 1e-4

/* smelt's `random<seed, min, max>` weights (ir/src/weights.rs, random_f32), bit for bit. */
static void smelt_random_f32(uint64_t seed, size_t len, float min, float max, float *out) {
    uint64_t state = seed;
    for (size_t i = 0; i < len; i++) {
        state += 0x9e3779b97f4a7c15ULL;
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        float unit = (float)(z >> 40) / 16777216.0f;
        out[i] = min + (max - min) * unit;
    }
}

/* One `const @NAME : tensor<DIMSxf32> = random<...>` line of the model file. */
struct weight {
    char name[64];
    size_t len;
    float *data;
};

enum { MAX_WEIGHTS = 16 };
static struct weight weights[MAX_WEIGHTS];
static size_t num_weights;

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    buf[size] = '\0';
    fclose(f);
    *len = (size_t)size;
    return buf;
}

/* Collects the model's random<...> weights. Only that form is understood: a weight
 * written any other way (dense, external) stops the program rather than being guessed. */
static void load_weights(const char *text) {
    const char *line = text;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        if (n < sizeof buf && strncmp(line, "const @", 7) == 0) {
            memcpy(buf, line, n);
            buf[n] = '\0';
            char name[64], type[128];
            uint64_t seed;
            float min, max;
            int got = sscanf(buf,
                             "const @%63[^ :] : tensor<%127[^>]> = random<seed = %" SCNu64
                             ", min = %f, max = %f>",
                             name, type, &seed, &min, &max);
            if (got != 5 || num_weights == MAX_WEIGHTS) {
                fprintf(stderr, "unsupported weight declaration: %s\n", buf);
                exit(2);
            }
            /* "6x6x3x3xf32": the product of the numbers before "f32". */
            size_t len = 1;
            for (char *p = type; *p >= '0' && *p <= '9';) {
                len *= (size_t)strtoull(p, &p, 10);
                if (*p == 'x') p++;
            }
            struct weight *w = &weights[num_weights++];
            snprintf(w->name, sizeof w->name, "%s", name);
            w->len = len;
            w->data = malloc(len * sizeof(float));
            smelt_random_f32(seed, len, min, max, w->data);
        }
        line += n + (end != NULL);
    }
}

static const float *weight(const char *name, size_t len) {
    for (size_t i = 0; i < num_weights; i++) {
        if (strcmp(weights[i].name, name) == 0) {
            if (weights[i].len != len) {
                fprintf(stderr, "weight @%s has %zu elements, expected %zu\n", name,
                        weights[i].len, len);
                exit(2);
            }
            return weights[i].data;
        }
    }
    fprintf(stderr, "the model has no weight @%s\n", name);
    exit(2);
}

/* The reference: direct convolution, batch norm, skip add and relu, in double. */
static void reference(const float *x, size_t c, size_t h, size_t w, double *y) {
    const float *wt = weight("w", c * c * K * K);
    const float *bias = weight("bias", c);
    const float *gamma = weight("gamma", c);
    const float *beta = weight("beta", c);
    const float *mean = weight("mean", c);
    const float *var = weight("var", c);
    for (size_t o = 0; o < c; o++) {
        double scale = gamma[o] / sqrt((double)var[o] + EPSILON);
        for (size_t r = 0; r < h; r++) {
            for (size_t s = 0; s < w; s++) {
                double acc = bias[o];
                for (size_t i = 0; i < c; i++) {
                    for (size_t kr = 0; kr < K; kr++) {
                        for (size_t ks = 0; ks < K; ks++) {
                            /* Unsigned wrap-around makes out-of-range rows fail `< h`. */
                            size_t rr = r + kr - PAD, ss = s + ks - PAD;
                            if (rr < h && ss < w) {
                                acc += (double)wt[((o * c + i) * K + kr) * K + ks] *
                                       x[(i * h + rr) * w + ss];
                            }
                        }
                    }
                }
                double v = (acc - mean[o]) * scale + beta[o] + x[(o * h + r) * w + s];
                y[(o * h + r) * w + s] = v > 0 ? v : 0;
            }
        }
    }
}

static int failures;

/* Prints a failed call's status and message, and counts it unless it was the expected one. */
static void expect_error(SmeltStatus status, SmeltStatus want, const char *what) {
    const char *msg = smelt_last_error();
    printf("  %s -> %s: %s\n", what, smelt_status_name(status), msg);
    if (status != want || msg[0] == '\0') {
        fprintf(stderr, "%s: expected %s with a message\n", what, smelt_status_name(want));
        failures++;
    }
}

/* Compares `n` outputs against the reference of `n` inputs; the relative error. */
static double compare(const float *got, const double *want, size_t n, size_t *zeros) {
    double max_abs = 0, max_ref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= max_abs)) max_abs = d; /* a NaN makes the error NaN, never 0 */
        if (fabs(want[i]) > max_ref) max_ref = fabs(want[i]);
        *zeros += want[i] == 0;
    }
    return max_ref > 0 ? max_abs / max_ref : max_abs;
}

/* Step 6: one dynamic executable, runs of several batch sizes. */
static void run_dynamic(const char *path) {
    SmeltDynamicExecutable *dyn = NULL;
    SmeltStatus status = smelt_dynamic_from_file(path, NULL, 4, &dyn);
    if (status != SMELT_STATUS_OK) {
        fprintf(stderr, "dynamic open failed: %s: %s\n", smelt_status_name(status),
                smelt_last_error());
        failures++;
        return;
    }
    SmeltDynamicInputInfo info;
    if (smelt_dynamic_input(dyn, 0, &info) != SMELT_STATUS_OK || info.shape.rank != 4 ||
        info.shape.dims[0] != (size_t)SMELT_DYNAMIC_DIM) {
        fprintf(stderr, "unexpected dynamic input: %s\n", smelt_last_error());
        failures++;
        smelt_dynamic_destroy(dyn);
        return;
    }
    size_t c = info.shape.dims[1], h = info.shape.dims[2], w = info.shape.dims[3];
    size_t per = c * h * w;
    printf("dynamic %s: input %s Nx%zux%zux%zu\n", path, info.name, c, h, w);
    const size_t batches[] = {1, 3, 8};
    for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
        size_t n = batches[b];
        SmeltTensor in = {NULL, SMELT_ELEMENT_TYPE_F32, {4, {n, c, h, w}}};
        SmeltTensor out;
        /* The outputs' shapes at this batch (compiles the buckets it needs). */
        status = smelt_dynamic_describe_outputs(dyn, &in, 1, &out, 1);
        if (status != SMELT_STATUS_OK) {
            fprintf(stderr, "describe failed: %s\n", smelt_last_error());
            failures++;
            break;
        }
        size_t len = smelt_shape_element_count(&out.shape);
        float *x = malloc(n * per * sizeof(float));
        float *y = malloc(len * sizeof(float));
        double *want = malloc(n * per * sizeof(double));
        smelt_random_f32(100 + n, n * per, -1.0f, 1.0f, x);
        memset(y, 0xff, len * sizeof(float));
        in.data = x;
        out.data = y;
        status = smelt_dynamic_run(dyn, &in, 1, &out, 1);
        if (status != SMELT_STATUS_OK || len != n * per) {
            fprintf(stderr, "dynamic run failed: %s\n", smelt_last_error());
            failures++;
        } else {
            for (size_t e = 0; e < n; e++) reference(x + e * per, c, h, w, want + e * per);
            size_t zeros = 0;
            double rel = compare(y, want, n * per, &zeros);
            printf("  batch %zu: output %zux%zux%zux%zu, relative error %.3g\n", n,
                   out.shape.dims[0], out.shape.dims[1], out.shape.dims[2], out.shape.dims[3],
                   rel);
            if (!(rel <= TOLERANCE)) {
                fprintf(stderr, "FAIL: batch %zu relative error %.3g\n", n, rel);
                failures++;
            }
        }
        free(x);
        free(y);
        free(want);
    }
    size_t count = 0;
    smelt_dynamic_specialization_count(dyn, &count);
    printf("  specializations compiled: %zu (", count);
    for (size_t i = 0; i < count; i++) {
        size_t batch;
        double ms;
        smelt_dynamic_specialization(dyn, i, &batch, &ms);
        printf("%sbatch %zu in %.0f ms", i ? ", " : "", batch, ms);
    }
    printf(")\n");
    if (count != 1) {
        fprintf(stderr, "FAIL: expected batch 1 compiled alone, got %zu\n", count);
        failures++;
    }
    SmeltTensor bad = {NULL, SMELT_ELEMENT_TYPE_F32, {4, {2, c + 1, h, w}}};
    SmeltTensor out;
    expect_error(smelt_dynamic_describe_outputs(dyn, &bad, 1, &out, 1),
                 SMELT_STATUS_INVALID_ARGUMENT, "one channel too many");
    smelt_dynamic_destroy(dyn);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "residual_block.tir";
    size_t text_len;
    char *text = read_text(path, &text_len);
    load_weights(text);
    printf("smelt %s, model %s (%zu random weights)\n", smelt_version(), path, num_weights);

    /* Compile: fusion on, threads = 0 (one per core). */
    SmeltOptions opts = smelt_options_default();
    SmeltExecutable *exe = NULL;
    SmeltStatus status = smelt_executable_from_text(text, text_len, &opts, &exe);
    if (status != SMELT_STATUS_OK) {
        fprintf(stderr, "compile failed: %s: %s\n", smelt_status_name(status), smelt_last_error());
        return 1;
    }

    /* The input's shape comes from the executable: 1 x C x H x W, row-major. */
    SmeltTensorInfo in_info, out_info;
    if (smelt_executable_input(exe, 0, &in_info) != SMELT_STATUS_OK ||
        smelt_executable_output(exe, 0, &out_info) != SMELT_STATUS_OK || in_info.rank != 4 ||
        in_info.dims[0] != 1 || strcmp(in_info.layout, "row_major") != 0 ||
        out_info.element_count != in_info.element_count) {
        fprintf(stderr, "unexpected signature: %s\n", smelt_last_error());
        return 1;
    }
    size_t c = in_info.dims[1], h = in_info.dims[2], w = in_info.dims[3];
    size_t n = in_info.element_count;
    printf("input %s: 1x%zux%zux%zu, output %s\n", in_info.name, c, h, w, out_info.name);

    float *x = malloc(n * sizeof(float));
    float *y = malloc(n * sizeof(float));
    double *want = malloc(n * sizeof(double));
    smelt_random_f32(7, n, -1.0f, 1.0f, x);
    memset(y, 0xff, n * sizeof(float)); /* NaN everywhere: an unwritten element shows */

    const float *inputs[1] = {x};
    size_t input_lens[1] = {n};
    float *outputs[1] = {y};
    size_t output_lens[1] = {n};
    status = smelt_executable_run(exe, inputs, input_lens, 1, outputs, output_lens, 1);
    if (status != SMELT_STATUS_OK) {
        fprintf(stderr, "run failed: %s: %s\n", smelt_status_name(status), smelt_last_error());
        return 1;
    }

    reference(x, c, h, w, want);
    size_t zeros = 0;
    double max_abs = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)y[i] - want[i]);
        if (!(d <= max_abs)) max_abs = d;
    }
    double rel = compare(y, want, n, &zeros);
    printf("max abs error %.3g, relative error %.3g (%zu of %zu clipped by relu)\n", max_abs, rel,
           zeros, n);
    if (!(rel <= TOLERANCE)) {
        fprintf(stderr, "FAIL: relative error %.3g is above %g\n", rel, TOLERANCE);
        failures++;
    }
    if (zeros == 0 || zeros == n) {
        fprintf(stderr, "FAIL: the reference should exercise both sides of the relu\n");
        failures++;
    }

    /* Mistakes are reported, never run: nothing below touches native code. */
    printf("errors the API reports:\n");
    size_t short_lens[1] = {n - 1};
    expect_error(smelt_executable_run(exe, inputs, short_lens, 1, outputs, output_lens, 1),
                 SMELT_STATUS_INVALID_ARGUMENT, "input buffer one float short");
    expect_error(smelt_executable_run(exe, inputs, input_lens, 1, outputs, output_lens, 0),
                 SMELT_STATUS_INVALID_ARGUMENT, "no output buffer");

    smelt_executable_destroy(exe);
    run_dynamic(argc > 2 ? argv[2] : "residual_block.onnx");
    free(x);
    free(y);
    free(want);
    free(text);
    for (size_t i = 0; i < num_weights; i++) free(weights[i].data);
    if (failures) {
        fprintf(stderr, "residual_block: %d check(s) FAILED\n", failures);
        return 1;
    }
    printf("residual_block: OK\n");
    return 0;
}
