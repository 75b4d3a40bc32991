/* fabpool_trace_gen: writes a SYNTHETIC fabpool trace (its header carries the
 * synthetic flag, and fabpool_trace / fabpool_replay say so): a PyTorch-like
 * training loop at the framework's level (app_alloc / app_free with their
 * streams, as the PyTorch shim records them) beside HybridEP's two dispatch
 * buffers on a communication stream (fabpool_buffer_create / resize /
 * destroy, sized as adapters/hybridep/hybridep_sizes.h sizes them).  It
 * stands in for a recorded trace until one of the real training benchmark
 * is recorded on a GPU (perf/train/h200-trace.sh).
 *
 *   fabpool_trace_gen OUT [--steps N] [--layers N] [--d-model N] [--vocab N] [--tokens N] [--seed N]
 *   (--help says what each option does)
 *
 * The model (defaults: perf/train/train_bench.py's): a pre-norm transformer
 * encoder, fp32 weights, bf16 autocast (each step casts the weights it uses
 * anew), flash attention (no seq x seq scores), AdamW (its two states made at
 * the first step), gradients freed at every zero_grad(set_to_none=True).
 * Each step draws a sequence length from 64 to 2,048 with a fixed token count
 * (batch = tokens / length), so most activations change size every step.
 * Forward runs on thread 1 and the NULL stream; backward on thread 2 (the
 * autograd engine's) and the NULL stream; HybridEP's buffers on a side stream
 * with a token count per step around tokens / 4 per rank. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fabpool_trace_format.h"

static const char usage_line[] =
    "usage: fabpool_trace_gen [--steps N] [--layers N] [--d-model N] [--vocab N] [--tokens N] [--seed N] OUT\n";

static void help(void)
{
    printf("%s\n"
           "Writes a SYNTHETIC fabpool trace to OUT: a PyTorch-like training loop of a transformer encoder\n"
           "(fp32 weights, bf16 autocast, flash attention, AdamW) at the framework's level, beside HybridEP's\n"
           "two dispatch buffers on a side stream.  Each step draws a sequence length from 64 to 2048 with a\n"
           "fixed token count.  fabpool_trace and fabpool_replay read it (and say it is synthetic).\n\n"
           "  --steps N     training steps (default 24)\n"
           "  --layers N    encoder layers, 1 to 200 (default 8)\n"
           "  --d-model N   the model width (default 1024)\n"
           "  --vocab N     the vocabulary (default 32000)\n"
           "  --tokens N    tokens a step, at least 64 (default 16384)\n"
           "  --seed N      the random sequence lengths' seed (default 20261203)\n"
           "  --help        this text\n\n"
           "Exit status: 0; 1 if OUT cannot be written; 2 for a wrong command line.\n",
           usage_line);
}

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static uint64_t rnd_in(uint64_t lo, uint64_t hi) { return lo + rnd() % (hi - lo + 1); }

static FILE *out;
static uint64_t t_ns, n_recs, sum = FABPOOL_FNV_OFFSET, next_addr = 0x7f2000000000ull;
static const uint64_t COMM_STREAM = 0x55aa00c0ffee00ull;

static void rec(unsigned op, uint64_t ptr, uint64_t size, uint64_t arg, unsigned status, unsigned thread)
{
    unsigned char b[FABPOOL_TRACE_RECORD_BYTES];
    t_ns += 800 + rnd() % 2400; /* 0.8 to 3.2 us between calls */
    fabpool_trace_rec r = {t_ns, ptr, size, arg, (uint8_t)op, (uint8_t)status, thread, 0};
    fabpool_trace_encode_rec(b, &r);
    sum = fabpool_fnv1a(sum, b, sizeof b);
    n_recs++;
    if (fwrite(b, 1, sizeof b, out) != sizeof b) {
        perror("fabpool_trace_gen: write");
        exit(1);
    }
}

static uint64_t app_alloc(uint64_t size, unsigned thread)
{
    uint64_t p = next_addr;
    next_addr += (size + 511) / 512 * 512 + 512;
    rec(FABPOOL_TR_APP_ALLOC, p, size, 0, 0, thread);
    return p;
}
static void app_free(uint64_t p, uint64_t size, unsigned thread) { rec(FABPOOL_TR_APP_FREE, p, size, 0, FABPOOL_TRACE_STATUS_UNKNOWN, thread); }

/* a stack of live tensors of a step, freed in reverse (what backward does) */
typedef struct tensor {
    uint64_t p, size;
} tensor;

int main(int argc, char **argv)
{
    const char *path = NULL;
    uint64_t steps = 24, layers = 8, d = 1024, vocab = 32000, tokens = 16384, seed = 20261203;
    static const struct option opts[] = {
        {"steps", required_argument, NULL, 's'},  {"layers", required_argument, NULL, 'l'},
        {"d-model", required_argument, NULL, 'd'}, {"vocab", required_argument, NULL, 'v'},
        {"tokens", required_argument, NULL, 't'}, {"seed", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},         {0}};
    const char *me = "fabpool_trace_gen";
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 's': bad = cli_u64(me, "--steps", optarg, 1, 1u << 20, &steps); break;
        case 'l': bad = cli_u64(me, "--layers", optarg, 1, 200, &layers); break;
        case 'd': bad = cli_u64(me, "--d-model", optarg, 1, 1u << 20, &d); break;
        case 'v': bad = cli_u64(me, "--vocab", optarg, 1, 1u << 24, &vocab); break;
        case 't': bad = cli_u64(me, "--tokens", optarg, 64, 1u << 24, &tokens); break;
        case 'r': bad = cli_u64(me, "--seed", optarg, 0, UINT64_MAX, &seed); break;
        case 'h': help(); return CLI_OK;
        default: bad = 1;
        }
        if (bad)
            return cli_usage_error(usage_line);
    }
    if (optind != argc - 1) {
        fprintf(stderr, "fabpool_trace_gen: %s\n", optind == argc ? "no OUT file named" : "one OUT file only");
        return cli_usage_error(usage_line);
    }
    path = argv[optind];
    rng_state = seed ? seed : 1;
    out = fopen(path, "wb");
    if (!out) {
        perror(path);
        return 1;
    }
    unsigned char hb[FABPOOL_TRACE_HEADER_BYTES];
    fabpool_trace_header h = {0, FABPOOL_TRACE_VERSION, FABPOOL_TRACE_F_SYNTHETIC, 0, 2u << 20, 4u << 20, FABPOOL_TRACE_OPEN, 0};
    fabpool_trace_encode_header(hb, &h);
    fwrite(hb, 1, sizeof hb, out);

    /* weights (fp32), per layer: ln1, qkv, out proj, ln2, ff1, ff2 (weights and biases) */
    const uint64_t lw[] = {4 * d, 4 * d, 3 * d * d * 4, 3 * d * 4, d * d * 4, d * 4, 4 * d, 4 * d,
                           4 * d * d * 4, 4 * d * 4, d * 4 * d * 4, d * 4};
    const size_t nlw = sizeof lw / sizeof lw[0];
    size_t nparams = 1 + layers * nlw + 4; /* the embedding, the layers, the final norm's two and the head's two */
    uint64_t *psize = calloc(nparams, sizeof *psize), *pw = calloc(nparams, sizeof *pw);
    uint64_t *grad = calloc(nparams, sizeof *grad), *m1 = calloc(nparams, sizeof *m1),
             *m2 = calloc(nparams, sizeof *m2);
    tensor *stack = malloc(4096 * sizeof *stack);
    if (!psize || !pw || !grad || !m1 || !m2 || !stack)
        return 1;
    size_t np = 0;
    psize[np++] = vocab * d * 4; /* embedding */
    for (uint64_t l = 0; l < layers; l++)
        for (size_t k = 0; k < nlw; k++)
            psize[np++] = lw[k];
    psize[np++] = 4 * d; /* final norm */
    psize[np++] = 4 * d;
    psize[np++] = d * vocab * 4; /* head */
    psize[np++] = vocab * 4;
    nparams = np;
    for (size_t i = 0; i < nparams; i++)
        pw[i] = app_alloc(psize[i], 1);

    /* HybridEP: 4 ranks a domain, 8 experts a rank, hidden 7168, bf16 tokens */
    const uint64_t hidden = 7168, ranks = 4, experts = 8;
    uint64_t max_tokens = tokens; /* per rank, at most */
    uint64_t hmax[2] = {max_tokens * ranks * hidden * 2, max_tokens * ranks * experts * ranks * 4};
    uint64_t hbuf[2];
    for (int b = 0; b < 2; b++) {
        uint64_t t0 = 512 * ranks;
        uint64_t size = b == 0 ? t0 * hidden * 2 : t0 * experts * ranks * 4;
        hbuf[b] = next_addr;
        next_addr += (hmax[b] + (2u << 20) - 1) / (2u << 20) * (2u << 20) + (2u << 20);
        rec(FABPOOL_TR_BUF_CREATE, hbuf[b], size, hmax[b], 0, 1);
    }

    for (uint64_t step = 0; step < steps; step++) {
        uint64_t seq = rnd_in(64, 2048), batch = tokens / seq ? tokens / seq : 1, T = batch * seq;
        size_t sp = 0;
#define PUSH(sz) (stack[sp].size = (sz), stack[sp].p = app_alloc(stack[sp].size, 1), sp++)
        /* data (int64 token ids, batch x (seq+1)), the embedding's output (fp32) */
        uint64_t data = app_alloc(batch * (seq + 1) * 8, 1);
        PUSH(T * d * 4);
        size_t p = 1;
        for (uint64_t l = 0; l < layers; l++) {
            /* autocast: bf16 copies of this layer's matrices, kept for backward */
            for (size_t k = 0; k < nlw; k++, p++)
                if (psize[p] >= d * d * 4)
                    PUSH(psize[p] / 2);
            PUSH(T * d * 4);                        /* ln1 out (fp32) */
            PUSH(T * d * 4 + 8 * T);                /* ln1 mean / rstd */
            PUSH(T * 3 * d * 2);                    /* qkv (bf16) */
            PUSH(T * d * 2);                        /* attention out */
            PUSH(batch * 16 * seq * 4);             /* flash attention's logsumexp */
            PUSH(T * d * 2);                        /* out proj */
            PUSH(T * d * 4);                        /* residual */
            PUSH(T * d * 4);                        /* ln2 out */
            PUSH(T * 4 * d * 2);                    /* ff1 */
            PUSH(T * 4 * d * 2);                    /* gelu */
            PUSH(T * d * 2);                        /* ff2 */
            PUSH(T * d * 4);                        /* residual */
            /* hybridep: this step's dispatch (tokens per rank around T / 4, HybridEP's alignment) */
            if (l == layers / 2) {
                uint64_t tpr = T / 4 / 2 + rnd() % (T / 4 + 1);
                tpr = (tpr + 15) / 16 * 16;
                if (tpr < 512)
                    tpr = 512;
                if (tpr > max_tokens)
                    tpr = max_tokens;
                uint64_t te = tpr * ranks;
                rec(FABPOOL_TR_BUF_RESIZE, hbuf[0], te * hidden * 2, COMM_STREAM, 0, 1);
                rec(FABPOOL_TR_BUF_RESIZE, hbuf[1], te * experts * ranks * 4, COMM_STREAM, 0, 1);
            }
        }
        PUSH(T * d * 4);                            /* final norm */
        PUSH(d * vocab * 2);                        /* head weight, bf16 */
        PUSH(T * vocab * 2);                        /* logits, bf16 */
        PUSH(T * vocab * 4);                        /* logits.float() */
        uint64_t lse = app_alloc(T * 4, 1);         /* cross entropy */
        uint64_t loss = app_alloc(4, 1);
        /* backward, on the autograd thread: grads of activations, freed as it goes; weight grads */
        uint64_t gl = app_alloc(T * vocab * 4, 2);  /* grad of logits.float() */
        app_free(lse, T * 4, 2);
        size_t gi = nparams;
        while (sp > 0) {
            tensor t = stack[--sp];
            uint64_t g = app_alloc(t.size, 2);      /* the grad flowing back has the activation's size */
            app_free(gl, 0, 2);
            gl = g;
            app_free(t.p, t.size, 2);
            /* a weight's grad when its layer's matrices go by */
            if (gi > 0 && (sp % 6) == 0) {
                gi--;
                if (!grad[gi])
                    grad[gi] = app_alloc(psize[gi], 2);
            }
        }
        while (gi > 0) {
            gi--;
            if (!grad[gi])
                grad[gi] = app_alloc(psize[gi], 2);
        }
        app_free(gl, 0, 2);
        app_free(loss, 4, 1);
        app_free(data, batch * (seq + 1) * 8, 1);
        /* AdamW: states at the first step; foreach temporaries a group at a time */
        for (size_t i = 0; i < nparams; i++)
            if (!m1[i]) {
                m1[i] = app_alloc(psize[i], 1);
                m2[i] = app_alloc(psize[i], 1);
            }
        for (size_t i = 0; i < nparams; i += 16) {
            uint64_t tmp[16];
            size_t k = 0;
            for (; k < 16 && i + k < nparams; k++)
                tmp[k] = app_alloc(psize[i + k], 1);
            while (k-- > 0)
                app_free(tmp[k], psize[i + k], 1);
        }
        /* zero_grad(set_to_none=True) */
        for (size_t i = 0; i < nparams; i++) {
            app_free(grad[i], psize[i], 1);
            grad[i] = 0;
        }
        t_ns += 150000000ull; /* the step's kernels */
    }
    for (int b = 0; b < 2; b++)
        rec(FABPOOL_TR_BUF_DESTROY, hbuf[b], 0, COMM_STREAM, 0, 1);
    for (size_t i = 0; i < nparams; i++) {
        app_free(m1[i], psize[i], 1);
        app_free(m2[i], psize[i], 1);
        app_free(pw[i], psize[i], 1);
    }
    rec(FABPOOL_TR_APP_EMPTY, 0, 0, 0, FABPOOL_TRACE_STATUS_UNKNOWN, 1);
    h.n_records = n_recs;
    h.checksum = sum;
    fabpool_trace_encode_header(hb, &h);
    if (fseek(out, 0, SEEK_SET) != 0 || fwrite(hb, 1, sizeof hb, out) != sizeof hb || fclose(out) != 0) {
        perror(path);
        return 1;
    }
    printf("fabpool_trace_gen: %s: %" PRIu64 " records, %" PRIu64 " steps (SYNTHETIC)\n", path, n_recs, steps);
    free(psize);
    free(pw);
    free(grad);
    free(m1);
    free(m2);
    free(stack);
    return 0;
}
