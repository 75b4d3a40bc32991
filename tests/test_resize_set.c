/* A set of buffers shrunk at once, when a shrink would refit a chunk (replace
 * it by a smaller one) but the device has no memory for the smaller chunk: every buffer
 * still reaches its size, the chunk that could not be refit stays mapped whole,
 * and every byte below the new sizes is kept.  The set is never left half
 * resized. */
#include "testutil.h"

#define MB (1ull << 20)

static void fill(fabpool_buffer_t *b, size_t n, unsigned char v)
{
    CHECK_CU(cuMemsetD8((CUdeviceptr)(uintptr_t)fabpool_buffer_ptr(b), v, n));
}

static int kept(fabpool_buffer_t *b, size_t n, unsigned char v)
{
    unsigned char first = 0, last = 0;
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)fabpool_buffer_ptr(b);
    if (cuMemcpyDtoH(&first, at, 1) != CUDA_SUCCESS || cuMemcpyDtoH(&last, at + n - 1, 1) != CUDA_SUCCESS)
        return 0;
    return first == v && last == v;
}

static size_t size_of(fabpool_buffer_t *b)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_buffer_get_info(b, &i));
    return i.size;
}

/* x (64 MiB in two 32 MiB chunks) shrinks to 30 MiB by retiring a chunk; y
 * (100 MiB) to 1 MiB must refit its first chunk, and the device has no memory
 * for the smaller one (every cuMemCreate fails, on the simulated driver). */
static void shrink_set_without_memory(void)
{
    t_sim_hooks h = t_sim_hooks_get();
    if (!h.fault_set) {
        printf("test_resize_set: the driver injects no faults: skipped\n");
        return;
    }
    fabpool_t *p = t_pool("max_chunk:32MiB,handle_type:none");
    if (!p)
        return;
    fabpool_buffer_t *x = NULL, *y = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 64 * MB, &x));
    CHECK_OK(fabpool_buffer_create(p, 100 * MB, 100 * MB, &y));
    if (!x || !y)
        return;
    fill(x, 64 * MB, 0x5a);
    fill(y, 100 * MB, 0xa5);
    fabpool_buffer_t *set[2] = {x, y};
    size_t sizes[2] = {30 * MB, 1 * MB};
    h.fault_set("cuMemCreate", 1, 1, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_OK(fabpool_buffer_resize_set(set, sizes, 2, NULL));
    h.fault_clear();
    CHECK(size_of(x) == 30 * MB && size_of(y) == 1 * MB);
    CHECK(kept(x, 30 * MB, 0x5a) && kept(y, 1 * MB, 0xa5));
    CHECK_OK(fabpool_check(p));
    /* with memory again, the next shrink refits what stayed whole */
    uint64_t before = t_mapped(p);
    CHECK_OK(fabpool_buffer_resize(y, 1 * MB, NULL));
    CHECK(t_mapped(p) + 16 * MB <= before);
    CHECK(kept(y, 1 * MB, 0xa5));
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(x, NULL));
    CHECK_OK(fabpool_buffer_destroy(y, NULL));
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    t_driver_init();
    shrink_set_without_memory();
    return t_done("test_resize_set");
}
