/* shapes.c - seeded allocation shapes (shapes.h). */
#include "shapes.h"

#include <math.h>
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

int shape_max_live(const shape *s) { return s->kind == SHAPE_STEPS ? step_blocks(s) : s->n_live; }

void shape_start(shape_run *r, const shape *s)
{
    memset(r, 0, sizeof *r);
    r->s = *s;
    r->rng = s->seed;
    r->total = shape_ops(s);
}

static uint64_t mixed_size(shape_run *r)
{
    const shape *s = &r->s;
    if (s->kind == SHAPE_UNIFORM)
        return 1 + shape_rng(&r->rng) % s->max_size;
    if (s->kind == SHAPE_NORMAL) {
        double x = (double)s->max_size / 2 * (1.0 + shape_normal(&r->rng) / 3.0);
        return x < 1 ? 1 : x > (double)s->max_size ? s->max_size : (uint64_t)x;
    }
    double lo = log((double)s->min_size), hi = log((double)s->max_size);
    uint64_t x = (uint64_t)exp(lo + shape_unit(&r->rng) * (hi - lo));
    return x < s->min_size ? s->min_size : x > s->max_size ? s->max_size : x;
}

int shape_next(shape_run *r, uint64_t *size, int *index)
{
    const shape *s = &r->s;
    if (r->done >= r->total)
        return 0;
    r->done++;
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
