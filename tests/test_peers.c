/* test_peers: a pool that gives other local devices access to its memory
 * (one process driving several GPUs).  Every chunk the pool maps, slabs,
 * spans and buffer chunks, grants the peers read-write access, growth keeps
 * it, and a pool without peers grants none.  Needs two devices: the
 * simulated driver with FABSIM_DEVICES=2, or a machine with two GPUs (on one
 * GPU it says so and checks only the refusals). */
#include "testutil.h"

#define MB (1ull << 20)

static unsigned long long access_of(void *ptr, int dev)
{
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    unsigned long long flags = 0;
    CHECK_CU(cuMemGetAccess(&flags, &loc, (CUdeviceptr)(uintptr_t)ptr));
    return flags;
}

int main(void)
{
    t_driver_init();
    int n = 0;
    cuDeviceGetCount(&n);
    fabpool_options o;
    fabpool_t *p = NULL;

    /* refusals: the pool's own device, a device that does not exist */
    fabpool_options_init(&o);
    o.n_peer_devices = 1;
    o.peer_devices[0] = 0;
    CHECK_STATUS(fabpool_create(&o, &p), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), "peer device 0") != NULL);
    o.peer_devices[0] = 64;
    CHECK_STATUS(fabpool_create(&o, &p), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_options_parse(&o, "peers:1;x"), FABPOOL_ERR_CONFIG);
    if (n < 2) {
        printf("test_peers: one device only: the access checks need two (FABSIM_DEVICES=2)\n");
        return t_done("test_peers");
    }

    fabpool_options_init(&o);
    CHECK_OK(fabpool_options_parse(&o, "peers:1"));
    CHECK_OK(fabpool_create(&o, &p));
    fabpool_t *solo = NULL;
    CHECK_OK(fabpool_create(NULL, &solo));
    if (!p || !solo)
        return t_done("test_peers");

    void *small, *big, *alone;
    CHECK_OK(fabpool_alloc(p, 4096, &small));
    CHECK_OK(fabpool_alloc(p, 64 * MB, &big));
    CHECK_OK(fabpool_alloc(solo, 4096, &alone));
    CHECK(access_of(small, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(access_of(small, 1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(access_of(big, 1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(access_of(alone, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(access_of(alone, 1) == CU_MEM_ACCESS_FLAGS_PROT_NONE);

    /* a buffer that grows: every chunk, old and new, is the peer's too */
    fabpool_buffer_t *b;
    CHECK_OK(fabpool_buffer_create(p, 2048 * MB, 100 * MB, &b));
    char *base = fabpool_buffer_ptr(b);
    CHECK_OK(fabpool_buffer_resize(b, 900 * MB, NULL));
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    fabpool_buffer_get_info(b, &bi);
    CHECK(bi.n_chunks >= 2);
    for (size_t off = 0; off < bi.mapped; off += 2 * MB)
        if (access_of(base + off, 1) != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
            CHECK(!"peer access missing");
            break;
        }

    /* the peer device's context writes into device 0's buffer, device 0 reads it */
    CUdevice d1;
    CUcontext c1;
    CHECK_CU(cuDeviceGet(&d1, 1));
    CHECK_CU(cuDevicePrimaryCtxRetain(&c1, d1));
    CHECK_CU(cuCtxSetCurrent(c1));
    uint64_t v = 0x1234abcd, r = 0;
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)(base + 800 * MB), &v, 8));
    CHECK_CU(cuMemsetD8((CUdeviceptr)(uintptr_t)small, 0x5a, 4096));
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    CHECK_CU(cuMemcpyDtoH(&r, (CUdeviceptr)(uintptr_t)(base + 800 * MB), 8));
    CHECK(r == v);
    CHECK_CU(cuMemcpyDtoH(&r, (CUdeviceptr)(uintptr_t)small, 8));
    CHECK(r == 0x5a5a5a5a5a5a5a5aull);

    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_free(p, small));
    CHECK_OK(fabpool_free(p, big));
    CHECK_OK(fabpool_free(solo, alone));
    CHECK_OK(fabpool_destroy(p));
    CHECK_OK(fabpool_destroy(solo));
    cuDevicePrimaryCtxRelease(d1);
    CHECK(t_near(t_held(), 0));
    return t_done("test_peers");
}
