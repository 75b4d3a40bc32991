/* shapes.c - seeded allocation shapes (shapes.h). */
#include "shapes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t shape_rng(uint64_t *s)
{ /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double shape_unit(uint64_t *s) { return (double)(shape_rng(s) >> 11) / 9007199254740992.0; }

double shape_normal(uint64_t *s)
{
    double u = shape_unit(s), v = shape_unit(s);
    if (u < 1e-300)
        u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static int step_blocks(const shape *s) { return s->layers * s->n_factors; }

long shape_ops(const shape *s) { return s->kind == SHAPE_STEPS ? 2L * s->steps * step_blocks(s) : s->n_ops; }

int shape_max_live(const shape *s)
{
    return s->kind == SHAPE_STEPS ? step_blocks(s) : s->kind == SHAPE_REALLOC ? s->n_live + s->layers + 2 : s->n_live;
}

static int tracked(const shape *s) { return s->kind == SHAPE_FIFO || s->kind == SHAPE_REALLOC; }

int shape_start(shape_run *r, const shape *s)
{
    memset(r, 0, sizeof *r);
    r->s = *s;
    r->rng = s->seed;
    r->total = shape_ops(s);
    r->big = -1;
    if (tracked(s)) {
        r->slot_id = calloc((size_t)shape_max_live(s) + 1, sizeof *r->slot_id);
        r->id_slot = calloc((size_t)r->total + 1, sizeof *r->id_slot);
        if (!r->slot_id || !r->id_slot) {
            shape_end(r);
            return -1;
        }
    }
    return 0;
}

void shape_end(shape_run *r)
{
    free(r->slot_id);
    free(r->id_slot);
    r->slot_id = r->id_slot = NULL;
}

/* An allocation of size bytes into the caller's next slot. */
static int give(shape_run *r, uint64_t size, uint64_t *out)
{
    if (r->slot_id) {
        r->slot_id[r->nlive] = r->next_id;
        r->id_slot[r->next_id] = r->nlive;
    }
    r->next_id++;
    r->nlive++;
    *out = size ? size : 1;
    return 1;
}

/* A free of the block in slot j; the caller moves its last live block there. */
static int take(shape_run *r, int j, uint64_t *size, int *index)
{
    r->nlive--;
    if (r->slot_id) {
        long moved = r->slot_id[r->nlive];
        r->slot_id[j] = moved;
        r->id_slot[moved] = j;
    }
    *size = 0;
    *index = j;
    return 1;
}

/* A size log-uniform in lo..hi. */
static uint64_t logu_in(uint64_t *rng, uint64_t lo, uint64_t hi)
{
    double l = log((double)lo), h = log((double)hi);
    uint64_t x = (uint64_t)exp(l + shape_unit(rng) * (h - l));
    return x < lo ? lo : x > hi ? hi : x;
}

/* FIFO and realloc: the shapes that free particular blocks (shapes.h). */
static int tracked_next(shape_run *r, uint64_t *size, int *index)
{
    const shape *s = &r->s;
    if (s->kind == SHAPE_FIFO) {
        if (r->nlive < s->n_live)
            return give(r, logu_in(&r->rng, s->min_size, s->max_size), size);
        return take(r, (int)r->id_slot[r->oldest++], size, index);
    }
    for (;;) {
        if (r->left > 0) {
            r->left--;
            return give(r, logu_in(&r->rng, 4096, 2u << 20), size);
        }
        if (r->phase == 0) { /* the next size, allocated before the old buffer goes */
            uint64_t next = r->big_size + r->big_size / 4;
            r->big_size = !r->big_size || next > s->max_size ? s->min_size : next;
            r->phase = 1;
            r->fresh = r->next_id;
            return give(r, r->big_size, size);
        }
        if (r->phase == 1) {
            r->phase = 2;
            long old = r->big;
            r->big = r->fresh;
            if (old >= 0)
                return take(r, (int)r->id_slot[old], size, index);
        }
        if (r->nlive > s->n_live) { /* a random small block */
            int j = (int)(shape_rng(&r->rng) % (uint64_t)r->nlive);
            if (r->slot_id[j] == r->big)
                j = (j + 1) % r->nlive;
            return take(r, j, size, index);
        }
        r->phase = 0;
        r->left = s->layers;
    }
}

/* The size of a random live set's next block. */
static uint64_t mixed_size(shape_run *r)
{
    const shape *s = &r->s;
    double x;
    switch (s->kind) {
    case SHAPE_UNIFORM:
        return 1 + shape_rng(&r->rng) % s->max_size;
    case SHAPE_NORMAL:
        x = (double)s->max_size / 2 * (1.0 + shape_normal(&r->rng) / 3.0);
        return x < 1 ? 1 : x > (double)s->max_size ? s->max_size : (uint64_t)x;
    case SHAPE_PARETO:
        x = (double)s->min_size * pow(1.0 - shape_unit(&r->rng) * 0.999999, -1.0 / 0.8);
        return x > (double)s->max_size ? s->max_size : (uint64_t)x;
    case SHAPE_DRIFT: { /* up to twice the last mean */
        double mean = (double)s->min_size + (double)(s->max_size - s->min_size) * (double)r->done / (double)r->total;
        x = mean * (1.0 + shape_normal(&r->rng) / 4.0);
        return x < 4096 ? 4096 : x > 2.0 * (double)s->max_size ? 2 * s->max_size : (uint64_t)x;
    }
    default:
        return logu_in(&r->rng, s->min_size, s->max_size);
    }
}

int shape_next(shape_run *r, uint64_t *size, int *index)
{
    const shape *s = &r->s;
    if (r->done >= r->total)
        return 0;
    r->done++;
    if (tracked(s))
        return tracked_next(r, size, index);
    if (s->kind == SHAPE_STEPS) {
        if (r->nlive == 0 && r->left == 0) { /* a new step */
            r->len = s->len_lo + (int)(shape_rng(&r->rng) % (uint64_t)(s->len_hi - s->len_lo + 1));
            r->left = step_blocks(s);
            r->step++;
        }
        if (r->left) {
            int k = step_blocks(s) - r->left--;
            *size = (uint64_t)s->factors[k % s->n_factors] * (uint64_t)r->len * s->unit;
            r->nlive++;
        } else {
            *size = 0;
            *index = --r->nlive; /* the last allocated first */
        }
        return 1;
    }
    int cap = s->n_live;
    if (r->nlive == 0 || (r->nlive < cap && shape_unit(&r->rng) < 0.5 + 0.5 * (1.0 - (double)r->nlive / cap))) {
        *size = mixed_size(r);
        r->nlive++;
    } else {
        *size = 0;
        *index = (int)(shape_rng(&r->rng) % (uint64_t)r->nlive);
        r->nlive--;
    }
    return 1;
}
