/* The smelt C API from C, run by tests/capi.rs (also built with -fsanitize=address):
 *
 *     capi_test DIR N
 *
 * DIR holds tail.tir (a residual tail with inputs x, skip and output y of N floats each),
 * x.bin, skip.bin and expected.bin (little-endian floats; expected computed by smelt's
 * reference interpreter in Rust) and relu.onnx (y = Relu(x), 2x3). The program compiles
 * the tail (from text, from a file, fused and unfused), runs one executable from 4
 * pthreads at once (outputs bit-identical), makes and destroys 1000 executables with
 * stale handles tried between them, compiles 100 with threads 0-16 and counts the
 * process's threads, forces an internal error and checks that nothing reached stderr,
 * then tries the misuse table and expects error codes. Prints "capi_test: all checks
 * passed" and exits 0 only if every check passed; on success it writes nothing to stderr.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT, dirent, dup */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "smelt.h"

/* A test hook of the library, exported but not in the header (src/capi/mod.rs): a call
 * whose body panics inside smelt, as an internal bug would. */
SmeltStatus smelt_testing_force_internal_error(void);

static int failures;
static int checks;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        checks++;                                                                     \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                               \
        }                                                                             \
    } while (0)

/* Expects `status == want`, and a non-empty message exactly when it is an error. */
static void expect(SmeltStatus status, SmeltStatus want, const char *what) {
    const char *msg = smelt_last_error();
    checks++;
    if (status != want) {
        fprintf(stderr, "%s: expected %s, got %s: %s\n", what, smelt_status_name(want),
                smelt_status_name(status), msg);
        failures++;
    } else if ((want == SMELT_STATUS_OK) != (msg[0] == '\0')) {
        fprintf(stderr, "%s: status %s but last error '%s'\n", what, smelt_status_name(status), msg);
        failures++;
    } else if (want != SMELT_STATUS_OK) {
        printf("  %-44s -> %s: %.100s\n", what, smelt_status_name(status), msg);
    }
}

static char *read_file(const char *dir, const char *name, size_t *len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
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

static float *read_floats(const char *dir, const char *name, size_t n) {
    size_t len;
    char *bytes = read_file(dir, name, &len);
    if (len != n * sizeof(float)) {
        fprintf(stderr, "%s holds %zu bytes, expected %zu\n", name, len, n * sizeof(float));
        exit(2);
    }
    float *v = malloc(len);
    memcpy(v, bytes, len);
    free(bytes);
    return v;
}

/* max |got - want| / max |want|, the project's relative error. */
static double relative_error(const float *got, const float *want, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > diff || d != d) diff = d != d ? INFINITY : d;
        if (fabs((double)want[i]) > scale) scale = fabs((double)want[i]);
    }
    return scale > 0 ? diff / scale : diff;
}

struct job {
    SmeltExecutable *exe;
    const float *x, *skip, *expected;
    size_t n;
    float *out;
    int runs_ok;
    double worst_error;
    int misuse_ok;
};

static void *worker(void *arg) {
    struct job *j = arg;
    const float *ins[2] = {j->x, j->skip};
    size_t in_lens[2] = {j->n, j->n};
    float *outs[1] = {j->out};
    size_t out_lens[1] = {j->n};
    j->worst_error = 0;
    for (int r = 0; r < 20; r++) {
        memset(j->out, 0xff, j->n * sizeof(float)); /* NaN: a skipped write shows */
        SmeltStatus s = smelt_executable_run(j->exe, ins, in_lens, 2, outs, out_lens, 1);
        if (s == SMELT_STATUS_OK) j->runs_ok++;
        double e = relative_error(j->out, j->expected, j->n);
        if (e > j->worst_error) j->worst_error = e;
    }
    /* The last error is per thread: a failure here must not show in other threads. */
    size_t short_lens[2] = {j->n - 1, j->n};
    SmeltStatus s = smelt_executable_run(j->exe, ins, short_lens, 2, outs, out_lens, 1);
    j->misuse_ok = s == SMELT_STATUS_INVALID_ARGUMENT && smelt_last_error()[0] != '\0';
    return NULL;
}

/* Runs `exe` from 4 threads at once and checks every result. */
static void run_threads(SmeltExecutable *exe, const float *x, const float *skip,
                        const float *expected, size_t n, const char *what) {
    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    struct job jobs[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t] = (struct job){exe, x, skip, expected, n, malloc(n * sizeof(float)), 0, 0, 0};
        CHECK(pthread_create(&threads[t], NULL, worker, &jobs[t]) == 0);
    }
    for (int t = 0; t < THREADS; t++) CHECK(pthread_join(threads[t], NULL) == 0);
    /* The main thread's last call succeeded: the workers' failures are theirs only. */
    CHECK(smelt_last_error()[0] == '\0');
    for (int t = 0; t < THREADS; t++) {
        printf("  %s thread %d: %d/20 runs ok, relative error %.3g\n", what, t, jobs[t].runs_ok,
               jobs[t].worst_error);
        CHECK(jobs[t].runs_ok == 20);
        CHECK(jobs[t].worst_error <= 1e-4);
        CHECK(jobs[t].misuse_ok);
        CHECK(memcmp(jobs[t].out, jobs[0].out, n * sizeof(float)) == 0);
    }
    for (int t = 0; t < THREADS; t++) free(jobs[t].out);
}

/* A one-op model, quick to compile many times. */
static const char RELU[] =
    "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = relu %x : tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";

static SmeltStatus relu_with_threads(unsigned threads, SmeltExecutable **out) {
    SmeltOptions o = smelt_options_default();
    o.threads = threads;
    return smelt_executable_from_text(RELU, strlen(RELU), &o, out);
}

static SmeltStatus run_relu(SmeltExecutable *exe) {
    float in[4] = {-1, 2, -3, 4}, out[4];
    const float *ins[1] = {in};
    float *outs[1] = {out};
    size_t lens[1] = {4};
    return smelt_executable_run(exe, ins, lens, 1, outs, lens, 1);
}

/* 1000 create/destroy cycles; between them, the last 8 stale handles and the very first
 * are tried with every kind of call: each is INVALID_ARGUMENT, and the live executable
 * is untouched (it still answers, and destroying it succeeds exactly once). */
static void create_destroy_cycles(void) {
    enum { CYCLES = 1000, RECENT = 8 };
    SmeltExecutable *recent[RECENT] = {NULL};
    SmeltExecutable *first = NULL;
    int cycles_ok = 0;
    for (int c = 0; c < CYCLES; c++) {
        SmeltExecutable *e = NULL;
        int ok = relu_with_threads(1, &e) == SMELT_STATUS_OK && e != NULL;
        for (int k = 0; k <= RECENT; k++) {
            SmeltExecutable *old = k < RECENT ? recent[k] : first;
            size_t count = 99;
            if (old == NULL) continue;
            ok &= old != e;
            ok &= smelt_executable_input_count(old, &count) == SMELT_STATUS_INVALID_ARGUMENT;
            ok &= count == 99;
            ok &= run_relu(old) == SMELT_STATUS_INVALID_ARGUMENT;
            ok &= smelt_executable_destroy(old) == SMELT_STATUS_INVALID_ARGUMENT;
            ok &= smelt_last_error()[0] != '\0';
        }
        size_t count = 0;
        ok &= smelt_executable_input_count(e, &count) == SMELT_STATUS_OK && count == 1;
        ok &= run_relu(e) == SMELT_STATUS_OK;
        ok &= smelt_executable_destroy(e) == SMELT_STATUS_OK;
        ok &= smelt_executable_destroy(e) == SMELT_STATUS_INVALID_ARGUMENT;
        if (c == 0) first = e;
        recent[c % RECENT] = e;
        if (ok) cycles_ok++;
        else fprintf(stderr, "cycle %d: a stale or live handle misbehaved: %s\n", c, smelt_last_error());
    }
    printf("  %d/%d create/destroy cycles with stale handles refused\n", cycles_ok, CYCLES);
    CHECK(cycles_ok == CYCLES);
}

/* Threads of this process (every task in /proc/self/task), and how many of them are
 * smelt's pool workers (named smelt-worker-N). */
static int count_threads(int *smelt_workers) {
    DIR *d = opendir("/proc/self/task");
    int all = 0;
    *smelt_workers = 0;
    if (!d) return -1;
    struct dirent *t;
    while ((t = readdir(d)) != NULL) {
        if (t->d_name[0] == '.') continue;
        all++;
        char path[300], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", t->d_name);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fgets(comm, sizeof comm, f) && strncmp(comm, "smelt-worker", 12) == 0)
                (*smelt_workers)++;
            fclose(f);
        }
    }
    closedir(d);
    return all;
}

/* 100 executables compiled, run and destroyed with threads 0-16 leave at most one thread
 * per core beside the main one (the shared pool has a worker per core but one), and a
 * thread count above MAX_THREADS (1024) is refused. Call with no thread of the test's
 * own alive. */
static void thread_count_is_bounded(void) {
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int all_ok = 1;
    for (unsigned i = 0; i < 100; i++) {
        SmeltExecutable *e = NULL;
        all_ok &= relu_with_threads(i % 17, &e) == SMELT_STATUS_OK;
        all_ok &= run_relu(e) == SMELT_STATUS_OK;
        all_ok &= smelt_executable_destroy(e) == SMELT_STATUS_OK;
    }
    CHECK(all_ok);
    int workers;
    int all = count_threads(&workers);
    printf("  after 100 executables with threads 0-16: %d threads (%d smelt workers) on %d cores\n",
           all, workers, cores);
    CHECK(all >= 1 && all <= cores + 1);
    CHECK(workers < cores || workers == 0);
    SmeltExecutable *e = NULL;
    expect(relu_with_threads(100000, &e), SMELT_STATUS_INVALID_ARGUMENT, "threads = 100000");
    CHECK(e == NULL);
    expect(relu_with_threads(1025, &e), SMELT_STATUS_INVALID_ARGUMENT, "threads = 1025");
    expect(relu_with_threads(1024, &e), SMELT_STATUS_OK, "threads = 1024 (the cap)");
    expect(smelt_executable_destroy(e), SMELT_STATUS_OK, "destroy threads = 1024");
}

/* A panic inside smelt (forced) is INTERNAL with its message, and writes nothing to the
 * process's stderr, even with RUST_BACKTRACE=1 (set in main): fd 2 goes to a temporary
 * file for the call, whose size is then checked. */
static void internal_error_is_quiet(void) {
    fflush(stderr);
    FILE *capture = tmpfile();
    int saved = dup(2);
    CHECK(capture != NULL && saved >= 0);
    if (!capture || saved < 0) return;
    dup2(fileno(capture), 2);
    SmeltStatus s = smelt_testing_force_internal_error();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long written = fseek(capture, 0, SEEK_END) == 0 ? ftell(capture) : -1;
    fclose(capture);
    printf("  forced internal error -> %s: %.80s (%ld bytes on stderr)\n", smelt_status_name(s),
           smelt_last_error(), written);
    CHECK(s == SMELT_STATUS_INTERNAL);
    CHECK(strstr(smelt_last_error(), "a forced internal error") != NULL);
    CHECK(written == 0);
    /* and the library works on afterwards */
    SmeltExecutable *e = NULL;
    expect(relu_with_threads(0, &e), SMELT_STATUS_OK, "compile after an internal error");
    expect(run_relu(e), SMELT_STATUS_OK, "run after an internal error");
    expect(smelt_executable_destroy(e), SMELT_STATUS_OK, "destroy after an internal error");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: capi_test DIR N\n");
        return 2;
    }
    const char *dir = argv[1];
    size_t n = (size_t)strtoull(argv[2], NULL, 10);
    size_t text_len, onnx_len;
    char *text = read_file(dir, "tail.tir", &text_len);
    char *onnx = read_file(dir, "relu.onnx", &onnx_len);
    float *x = read_floats(dir, "x.bin", n);
    float *skip = read_floats(dir, "skip.bin", n);
    float *expected = read_floats(dir, "expected.bin", n);
    /* the panic hook must stay quiet even when a backtrace is asked for */
    setenv("RUST_BACKTRACE", "1", 1);
    printf("smelt %s\n", smelt_version());

    /* ---- compile from text, inspect, run on 4 threads ---- */
    SmeltOptions opts = smelt_options_default();
    CHECK(opts.fuse != 0);
    SmeltExecutable *exe = NULL;
    expect(smelt_executable_from_text(text, text_len, &opts, &exe), SMELT_STATUS_OK, "from_text");
    CHECK(exe != NULL);

    size_t count = 99;
    expect(smelt_executable_input_count(exe, &count), SMELT_STATUS_OK, "input_count");
    CHECK(count == 2);
    expect(smelt_executable_output_count(exe, &count), SMELT_STATUS_OK, "output_count");
    CHECK(count == 1);
    SmeltTensorInfo info;
    expect(smelt_executable_input(exe, 1, &info), SMELT_STATUS_OK, "input 1");
    CHECK(strcmp(info.name, "skip") == 0);
    CHECK(info.rank == 4 && info.dims[0] == 1 && info.element_count == n);
    CHECK(info.dims[0] * info.dims[1] * info.dims[2] * info.dims[3] == n);
    CHECK(strcmp(info.layout, "row_major") == 0);
    expect(smelt_executable_output(exe, 0, &info), SMELT_STATUS_OK, "output 0");
    CHECK(strcmp(info.name, "y") == 0 && info.element_count == n);

    run_threads(exe, x, skip, expected, n, "fused");

    /* ---- unfused, from a file, with a thread count ---- */
    char path[4096];
    snprintf(path, sizeof path, "%s/tail.tir", dir);
    SmeltOptions unfused = smelt_options_default();
    unfused.fuse = 0;
    unfused.threads = 2;
    unfused.kernels = 1; /* Cranelift code only: the portable path */
    SmeltExecutable *exe2 = NULL;
    expect(smelt_executable_from_file(path, &unfused, &exe2), SMELT_STATUS_OK, "from_file unfused");
    run_threads(exe2, x, skip, expected, n, "unfused");
    expect(smelt_executable_destroy(exe2), SMELT_STATUS_OK, "destroy unfused");

    /* ---- an unknown kernel choice is an argument error ---- */
    SmeltOptions bad_kernels = smelt_options_default();
    bad_kernels.kernels = 9;
    SmeltExecutable *none = NULL;
    expect(smelt_executable_from_file(path, &bad_kernels, &none), SMELT_STATUS_INVALID_ARGUMENT,
           "unknown kernels");

    /* ---- ONNX bytes ---- */
    SmeltExecutable *relu = NULL;
    expect(smelt_executable_from_onnx((const uint8_t *)onnx, onnx_len, NULL, &relu),
           SMELT_STATUS_OK, "from_onnx");
    {
        float in[6] = {-1, 2, -3, 4, 0, -0.5f}, out[6];
        const float *ins[1] = {in};
        float *outs[1] = {out};
        size_t lens[1] = {6};
        expect(smelt_executable_run(relu, ins, lens, 1, outs, lens, 1), SMELT_STATUS_OK, "run relu");
        for (int i = 0; i < 6; i++) CHECK(out[i] == (in[i] > 0 ? in[i] : 0));
    }
    expect(smelt_executable_destroy(relu), SMELT_STATUS_OK, "destroy relu");

    /* ---- an empty input (0 rows): its buffer may be NULL; a sum over it is 0 ---- */
    {
        const char *empty_text =
            "func @main(%x: tensor<0x3xf32>) -> (e: tensor<0x3xf32>, s: tensor<3xf32>) {\n"
            "  %e = relu %x : tensor<0x3xf32>\n"
            "  %s = reduce_sum %x {axes = [0]} : tensor<3xf32>\n"
            "  return %e, %s : tensor<0x3xf32>, tensor<3xf32>\n}\n";
        SmeltExecutable *empty = NULL;
        expect(smelt_executable_from_text(empty_text, strlen(empty_text), NULL, &empty),
               SMELT_STATUS_OK, "from_text(empty input)");
        expect(smelt_executable_input(empty, 0, &info), SMELT_STATUS_OK, "empty input 0");
        CHECK(info.rank == 2 && info.dims[0] == 0 && info.element_count == 0);
        float sums[3] = {7, 7, 7};
        const float *ins[1] = {NULL};
        float *outs[2] = {NULL, sums};
        size_t in_lens[1] = {0}, out_lens[2] = {0, 3};
        expect(smelt_executable_run(empty, ins, in_lens, 1, outs, out_lens, 2), SMELT_STATUS_OK,
               "run(empty input, NULL buffers)");
        for (int i = 0; i < 3; i++) CHECK(sums[i] == 0);
        size_t one[1] = {1};
        expect(smelt_executable_run(empty, ins, one, 1, outs, out_lens, 2),
               SMELT_STATUS_INVALID_ARGUMENT, "run(length 1 for an empty input)");
        expect(smelt_executable_destroy(empty), SMELT_STATUS_OK, "destroy empty");
    }

    /* ---- handles, threads and panics, as a host runtime sees them ---- */
    printf("lifetimes:\n");
    create_destroy_cycles();
    thread_count_is_bounded();
    internal_error_is_quiet();

    /* ---- misuse: every one an error code with a message ---- */
    printf("misuse:\n");
    SmeltExecutable *bad = (SmeltExecutable *)&count; /* poison: must be reset to NULL */
    expect(smelt_executable_from_text(NULL, 10, NULL, &bad), SMELT_STATUS_INVALID_ARGUMENT,
           "from_text(NULL text)");
    CHECK(bad == NULL);
    expect(smelt_executable_from_text(text, 0, NULL, &bad), SMELT_STATUS_INVALID_ARGUMENT,
           "from_text(length 0)");
    expect(smelt_executable_from_text(text, text_len, NULL, NULL), SMELT_STATUS_INVALID_ARGUMENT,
           "from_text(NULL out)");
    const char *garbage = "func @main(%x: tensor<2xf32>) -> (y: tensor<2xf32>) {\n  %y = bogus %x\n}";
    expect(smelt_executable_from_text(garbage, strlen(garbage), NULL, &bad), SMELT_STATUS_IR,
           "from_text(malformed IR)");
    CHECK(bad == NULL);
    CHECK(strstr(smelt_last_error(), "--> <text>:") != NULL); /* names line and column */
    SmeltOptions shaped = smelt_options_default();
    /* a pin binds a .tir model's symbolic sizes; against a known size it must agree */
    shaped.input_shapes = "x=1x12x10x11";
    expect(smelt_executable_from_text(text, text_len, &shaped, &bad), SMELT_STATUS_IR,
           "from_text(input_shapes against known sizes)");
    CHECK(strstr(smelt_last_error(), "input %x dimension") != NULL);
    shaped.input_shapes = "x=1xQ";
    expect(smelt_executable_from_onnx((const uint8_t *)onnx, onnx_len, &shaped, &bad),
           SMELT_STATUS_INVALID_ARGUMENT, "from_onnx(bad input_shapes)");
    const uint8_t junk[5] = {0xff, 0xff, 0xff, 0xff, 0xff};
    expect(smelt_executable_from_onnx(junk, sizeof junk, NULL, &bad), SMELT_STATUS_ONNX,
           "from_onnx(junk bytes)");
    expect(smelt_executable_from_onnx(NULL, 5, NULL, &bad), SMELT_STATUS_INVALID_ARGUMENT,
           "from_onnx(NULL)");
    expect(smelt_executable_from_file("/nonexistent/model.tir", NULL, &bad), SMELT_STATUS_IO,
           "from_file(missing file)");
    expect(smelt_executable_from_file(NULL, NULL, &bad), SMELT_STATUS_INVALID_ARGUMENT,
           "from_file(NULL path)");
    expect(smelt_executable_from_file("", NULL, &bad), SMELT_STATUS_INVALID_ARGUMENT,
           "from_file(empty path)");

    expect(smelt_executable_input_count(exe, NULL), SMELT_STATUS_INVALID_ARGUMENT,
           "input_count(NULL count)");
    expect(smelt_executable_input_count(NULL, &count), SMELT_STATUS_INVALID_ARGUMENT,
           "input_count(NULL exe)");
    expect(smelt_executable_input(exe, 2, &info), SMELT_STATUS_INVALID_ARGUMENT,
           "input(index 2 of 2)");
    expect(smelt_executable_output(exe, 0, NULL), SMELT_STATUS_INVALID_ARGUMENT,
           "output(NULL info)");
    expect(smelt_executable_output(exe, 1, &info), SMELT_STATUS_INVALID_ARGUMENT,
           "output(index 1 of 1)");
    expect(smelt_executable_input(NULL, 0, &info), SMELT_STATUS_INVALID_ARGUMENT,
           "input(NULL exe)");
    expect(smelt_executable_output_count(exe, NULL), SMELT_STATUS_INVALID_ARGUMENT,
           "output_count(NULL count)");
    SmeltOptions absurd = smelt_options_default();
    absurd.threads = 100000;
    expect(smelt_executable_from_text(text, text_len, &absurd, &bad),
           SMELT_STATUS_INVALID_ARGUMENT, "from_text(threads = 100000)");
    CHECK(bad == NULL);

    float *out = malloc(n * sizeof(float));
    const float *ins[2] = {x, skip};
    size_t in_lens[2] = {n, n};
    float *outs[1] = {out};
    size_t out_lens[1] = {n};
    expect(smelt_executable_run(exe, ins, in_lens, 2, outs, out_lens, 1), SMELT_STATUS_OK, "run");
    CHECK(relative_error(out, expected, n) <= 1e-4);
    expect(smelt_executable_run(exe, ins, in_lens, 1, outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(1 input of 2)");
    expect(smelt_executable_run(exe, ins, in_lens, 2, outs, out_lens, 0),
           SMELT_STATUS_INVALID_ARGUMENT, "run(0 outputs)");
    {
        const float *three[3] = {x, skip, x};
        size_t three_lens[3] = {n, n, n};
        float *two_outs[2] = {out, out + 1};
        size_t two_lens[2] = {n, n};
        expect(smelt_executable_run(exe, three, three_lens, 3, outs, out_lens, 1),
               SMELT_STATUS_INVALID_ARGUMENT, "run(3 inputs of 2)");
        expect(smelt_executable_run(exe, ins, in_lens, 2, two_outs, two_lens, 2),
               SMELT_STATUS_INVALID_ARGUMENT, "run(2 outputs of 1)");
    }
    size_t short_out[1] = {n - 1};
    expect(smelt_executable_run(exe, ins, in_lens, 2, outs, short_out, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(output one float short)");
    expect(smelt_executable_run(exe, ins, in_lens, 2, outs, NULL, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(NULL output_lens)");
    expect(smelt_executable_run(exe, NULL, in_lens, 2, outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(NULL inputs array)");
    expect(smelt_executable_run(exe, ins, NULL, 2, outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(NULL input_lens)");
    expect(smelt_executable_run(exe, ins, in_lens, 2, NULL, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(NULL outputs array)");
    size_t long_lens[2] = {n + 1, n};
    expect(smelt_executable_run(exe, ins, long_lens, 2, outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(input too long)");
    size_t zero_lens[2] = {0, 0};
    expect(smelt_executable_run(exe, ins, zero_lens, 2, outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(zero lengths)");
    size_t zero_out[1] = {0};
    expect(smelt_executable_run(exe, ins, in_lens, 2, outs, zero_out, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(zero output length)");
    const float *null_in[2] = {x, NULL};
    expect(smelt_executable_run(exe, null_in, in_lens, 2, outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(NULL input buffer)");
    float *null_out[1] = {NULL};
    expect(smelt_executable_run(exe, ins, in_lens, 2, null_out, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(NULL output buffer)");
    float *aliased = malloc(n * sizeof(float));
    memcpy(aliased, x, n * sizeof(float));
    const float *alias_ins[2] = {aliased, skip};
    float *alias_outs[1] = {aliased};
    expect(smelt_executable_run(exe, alias_ins, in_lens, 2, alias_outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(output aliases input)");
    CHECK(memcmp(aliased, x, n * sizeof(float)) == 0); /* rejected before any write */

    /* bad handles: made up, destroyed, destroyed twice */
    SmeltExecutable *made_up = (SmeltExecutable *)out;
    expect(smelt_executable_run(made_up, ins, in_lens, 2, outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(made-up handle)");
    expect(smelt_executable_run(NULL, ins, in_lens, 2, outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(NULL handle)");
    expect(smelt_executable_destroy(exe), SMELT_STATUS_OK, "destroy");
    expect(smelt_executable_run(exe, ins, in_lens, 2, outs, out_lens, 1),
           SMELT_STATUS_INVALID_ARGUMENT, "run(destroyed handle)");
    expect(smelt_executable_input_count(exe, &count), SMELT_STATUS_INVALID_ARGUMENT,
           "input_count(destroyed handle)");
    expect(smelt_executable_destroy(exe), SMELT_STATUS_INVALID_ARGUMENT, "destroy twice");
    expect(smelt_executable_destroy(NULL), SMELT_STATUS_OK, "destroy(NULL) is a no-op");
    CHECK(strcmp(smelt_status_name(12345), "SMELT_STATUS_UNKNOWN") == 0);
    CHECK(strcmp(smelt_status_name(SMELT_STATUS_ONNX), "SMELT_STATUS_ONNX") == 0);

    free(out);
    free(aliased);
    free(text);
    free(onnx);
    free(x);
    free(skip);
    free(expected);
    if (failures) {
        fprintf(stderr, "capi_test: %d of %d checks failed\n", failures, checks);
        return 1;
    }
    printf("capi_test: all checks passed (%d)\n", checks);
    return 0;
}
