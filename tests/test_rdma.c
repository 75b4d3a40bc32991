/* test_rdma: RDMA-ready memory.
 *   - the rdma option (auto, on, off): the driver's own properties of a chunk
 *     (cuMemRetainAllocationHandle + cuMemGetAllocationPropertiesFromHandle)
 *     say whether it was made GPUDirect RDMA capable;
 *   - fabpool_buffer_dmabuf over one chunk, several chunks, a range that
 *     starts and ends inside chunks; refusals of unaligned and out-of-range
 *     requests (clear status, no fd, nothing left in the driver's ledger);
 *   - a fault injected into cuMemGetHandleForAddressRange;
 *   - an fd open across a sleep and a wake keeps the old memory, not the new.
 * On a device without the support (the simulated driver with FABSIM_RDMA=0,
 * test_rdma_unsupported): auto makes ordinary chunks, on fails pool creation,
 * and dma-buf export says it is unsupported.  Runs on the real driver too
 * (the checks that need the ledger or fault injection are the sim's). */
#include <fcntl.h>
#include <unistd.h>

#include "testutil.h"

#define MB (1ull << 20)

typedef int (*fault_set_fn)(const char *, uint64_t, int, int);
typedef void (*fault_clear_fn)(void);

static int sim, supported;
static CUdevice dev;

/* The driver's word on a chunk: its allocation properties, from the address. */
static int chunk_rdma_flag(const void *addr)
{
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0xff, sizeof prop);
    CHECK_CU(cuMemRetainAllocationHandle(&h, (void *)addr));
    if (!h)
        return -1;
    CHECK_CU(cuMemGetAllocationPropertiesFromHandle(&prop, h));
    CHECK_CU(cuMemRelease(h));
    CHECK(prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop.location.id == dev);
    return prop.allocFlags.gpuDirectRDMACapable;
}

static fabpool_t *make_pool(const char *conf, fabpool_status want)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.conf = conf;
    o.max_chunk_bytes = 2 * MB; /* a buffer grows in 2 MiB chunks: several chunks to export over */
    fabpool_t *p = NULL;
    fabpool_status st = fabpool_create(&o, &p);
    CHECK(st == want);
    if (st != want)
        fprintf(stderr, "  fabpool_create(%s) -> %s: %s\n", conf, fabpool_status_name(st), fabpool_last_error());
    return p;
}

static void options(void)
{
    fabpool_options o;
    fabpool_options_init(&o);
    CHECK(o.rdma == FABPOOL_RDMA_AUTO);
    CHECK_OK(fabpool_options_parse(&o, "rdma:off"));
    CHECK(o.rdma == FABPOOL_RDMA_OFF);
    CHECK_OK(fabpool_options_parse(&o, "rdma:ON"));
    CHECK(o.rdma == FABPOOL_RDMA_ON);
    CHECK_OK(fabpool_options_parse(&o, "rdma:auto"));
    CHECK(o.rdma == FABPOOL_RDMA_AUTO);
    CHECK_STATUS(fabpool_options_parse(&o, "rdma:yes"), FABPOOL_ERR_CONFIG);
    CHECK(strstr(fabpool_last_error(), "'rdma'") && strstr(fabpool_last_error(), "auto, on or off"));
    CHECK(o.rdma == FABPOOL_RDMA_AUTO);
    /* a field out of range is refused at pool creation like its conf key */
    o.rdma = (fabpool_rdma)7;
    fabpool_t *p = NULL;
    CHECK_STATUS(fabpool_create(&o, &p), FABPOOL_ERR_CONFIG);
    CHECK(strstr(fabpool_last_error(), "rdma") != NULL);
}

/* The flag of the chunks of a buffer and of a size-class block, for one setting. */
static void flag_for(const char *conf, int want)
{
    fabpool_t *p = make_pool(conf, FABPOOL_OK);
    if (!p)
        return;
    fabpool_options got = {.struct_size = sizeof got};
    CHECK_OK(fabpool_get_options(p, &got));
    CHECK(got.rdma == (want ? FABPOOL_RDMA_ON : FABPOOL_RDMA_OFF));
    fabpool_buffer_t *b = NULL;
    void *blk = NULL, *big = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 6 * MB, &b));
    CHECK_OK(fabpool_alloc(p, 1000, &blk));
    CHECK_OK(fabpool_alloc(p, 20 * MB, &big));
    if (b) {
        uint8_t *base = fabpool_buffer_ptr(b);
        CHECK(chunk_rdma_flag(base) == want);
        CHECK(chunk_rdma_flag(base + 5 * MB) == want); /* the third chunk */
    }
    if (blk)
        CHECK(chunk_rdma_flag(blk) == want);
    if (big)
        CHECK(chunk_rdma_flag(big) == want);
    CHECK_OK(fabpool_free(p, blk));
    CHECK_OK(fabpool_free(p, big));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(p));
}

static off_t fd_size(int fd) { return lseek(fd, 0, SEEK_END); }

/* A refused request: its status, a message with `words`, fd -1, no driver
 * call, nothing new in the ledger. */
static void refused(fabpool_buffer_t *b, size_t off, size_t size, fabpool_status want, const char *words)
{
    fabsim_ledger l0 = t_ledger();
    int fd = 12345;
    fabpool_status st = fabpool_buffer_dmabuf(b, off, size, &fd);
    CHECK(st == want);
    CHECK(fd == -1);
    CHECK(strstr(fabpool_last_error(), words) != NULL);
    if (st != want || !strstr(fabpool_last_error(), words))
        fprintf(stderr, "  dmabuf(%zu, %zu) -> %s: %s\n", off, size, fabpool_status_name(st), fabpool_last_error());
    fabsim_ledger l1 = t_ledger();
    CHECK(l1.dmabuf_fds == l0.dmabuf_fds);
    if (fd >= 0)
        close(fd);
}

static void dmabuf(void)
{
    fabpool_t *p = make_pool("shrink_hysteresis:0", FABPOOL_OK);
    if (!p)
        return;
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 2 * MB, &b));
    if (!b) {
        fabpool_destroy(p);
        return;
    }
    CHECK_OK(fabpool_buffer_resize(b, 8 * MB, NULL));
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    CHECK_OK(fabpool_buffer_get_info(b, &bi));
    CHECK(bi.mapped == 8 * MB && bi.n_chunks == 4);
    fabsim_ledger l0 = t_ledger();
    int64_t held0 = t_held();

    /* one chunk, four chunks, and a range that starts and ends inside chunks */
    static const struct {
        size_t off, size;
        const char *what;
    } ok[] = {
        {0, 2 * MB, "one chunk"},
        {2 * MB, 2 * MB, "the second chunk"},
        {0, 8 * MB, "four chunks"},
        {2 * MB, 4 * MB, "two chunks in the middle"},
        {1 * MB, 2 * MB, "inside two chunks (page-aligned, not chunk-aligned)"},
        {4096, 8 * MB - 8192, "all but the first and last pages"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (!supported)
            break;
        int fd = -1;
        fabpool_status st = fabpool_buffer_dmabuf(b, ok[i].off, ok[i].size, &fd);
        CHECK(st == FABPOOL_OK);
        if (st != FABPOOL_OK) {
            fprintf(stderr, "  dmabuf of %s -> %s: %s\n", ok[i].what, fabpool_status_name(st), fabpool_last_error());
            continue;
        }
        CHECK(fd >= 0);
        CHECK(fd_size(fd) == (off_t)ok[i].size);
        if (sim)
            CHECK(t_ledger().dmabuf_fds == l0.dmabuf_fds + 1);
        close(fd);
        if (sim)
            CHECK(t_ledger().dmabuf_fds == l0.dmabuf_fds);
    }
    if (!supported) {
        refused(b, 0, 2 * MB, FABPOOL_ERR_NOT_SUPPORTED, "DMA_BUF_SUPPORTED");
    } else {
        /* refusals: nothing asked of the driver */
        fabpool_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
        fabpool_get_stats(p, &s0);
        refused(b, 100, 2 * MB, FABPOOL_ERR_INVALID_ARG, "host page size");
        refused(b, 0, 2 * MB + 100, FABPOOL_ERR_INVALID_ARG, "host page size");
        refused(b, 6 * MB, 4 * MB, FABPOOL_ERR_INVALID_ARG, "outside the buffer's");
        refused(b, 8 * MB, 2 * MB, FABPOOL_ERR_INVALID_ARG, "outside the buffer's");
        refused(b, SIZE_MAX - 4095, 8192, FABPOOL_ERR_INVALID_ARG, "outside the buffer's"); /* no overflow */
        refused(b, 0, 0, FABPOOL_ERR_INVALID_ARG, "size is 0");
        refused(b, 10 * MB, 2 * MB, FABPOOL_ERR_INVALID_ARG, "outside"); /* in the window, not mapped */
        fabpool_get_stats(p, &s1);
        CHECK(t_calls(&s1, "cuMemGetHandleForAddressRange") == t_calls(&s0, "cuMemGetHandleForAddressRange"));
    }
    CHECK_STATUS(fabpool_buffer_dmabuf(b, 0, 2 * MB, NULL), FABPOOL_ERR_INVALID_ARG);
    {
        int fd = 5;
        CHECK_STATUS(fabpool_buffer_dmabuf(NULL, 0, 2 * MB, &fd), FABPOOL_ERR_INVALID_ARG);
        CHECK(fd == -1);
    }

    /* sim: an open dma-buf keeps its memory after the buffer shrinks, until it is closed */
    if (sim && supported) {
        int fd = -1;
        CHECK_OK(fabpool_buffer_dmabuf(b, 4 * MB, 4 * MB, &fd));
        CHECK_OK(fabpool_buffer_resize(b, 2 * MB, NULL));
        CHECK_OK(fabpool_collect(p, 1));
        CHECK(t_mapped(p) == 2 * MB);
        CHECK(t_held() - held0 == -(int64_t)(2 * MB)); /* [2, 4) MiB is gone; [4, 8) lives on in the fd */
        close(fd);
        CHECK(t_held() - held0 == -(int64_t)(6 * MB)); /* 4 MiB with the fd, 2 more were dropped by the shrink */
        CHECK(t_ledger().dmabuf_fds == l0.dmabuf_fds);
        CHECK_OK(fabpool_buffer_resize(b, 8 * MB, NULL));
    }

    /* a fault in the driver call: its error, its name in the message, no fd, nothing left */
    fault_set_fn fault_set = (fault_set_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_set");
    fault_clear_fn fault_clear = (fault_clear_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_clear");
    if (sim && supported && fault_set && fault_clear) {
        static const struct {
            CUresult err;
            fabpool_status st;
        } faults[] = {
            {CUDA_ERROR_OUT_OF_MEMORY, FABPOOL_ERR_OUT_OF_MEMORY},
            {CUDA_ERROR_INVALID_VALUE, FABPOOL_ERR_DRIVER},
            {CUDA_ERROR_NOT_SUPPORTED, FABPOOL_ERR_NOT_SUPPORTED},
        };
        for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
            fabsim_ledger a = t_ledger();
            int fd = 7;
            fault_set("cuMemGetHandleForAddressRange", 1, 0, (int)faults[i].err);
            fabpool_status st = fabpool_buffer_dmabuf(b, 0, 4 * MB, &fd);
            fault_clear();
            CHECK(st == faults[i].st);
            CHECK(fd == -1);
            CHECK(strstr(fabpool_last_error(), "cuMemGetHandleForAddressRange") != NULL);
            CHECK(strstr(fabpool_last_error(), "2 chunks") != NULL);
            fabsim_ledger z = t_ledger();
            CHECK(z.dmabuf_fds == a.dmabuf_fds && z.bytes_held == a.bytes_held && z.handles == a.handles);
        }
        /* a fault in the context switch before it */
        int fd = 7;
        fault_set("cuCtxGetCurrent", 1, 0, CUDA_ERROR_UNKNOWN);
        CHECK(fabpool_buffer_dmabuf(b, 0, 4 * MB, &fd) == FABPOOL_ERR_DRIVER);
        fault_clear();
        CHECK(fd == -1 && strstr(fabpool_last_error(), "cuCtxGetCurrent") != NULL);
        /* and it works again */
        CHECK_OK(fabpool_buffer_dmabuf(b, 0, 4 * MB, &fd));
        CHECK(fd >= 0 && fd_size(fd) == (off_t)(4 * MB));
        if (fd >= 0)
            close(fd);
    }

    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_STATUS(fabpool_destroy(p), FABPOOL_OK);
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.bytes_held == 0 && l.dmabuf_fds == 0 && l.exported_fds == 0);
    }
}

/* A dma-buf fd open across a sleep and a wake: taking one is refused while asleep; the open fd keeps the memory
 * it was taken of (the sleep's unmap does not free it) and after the wake still names that old memory beside the
 * buffer's new one, until it is closed; an fd taken after the wake names the new memory.  Offloaded data is
 * back.  Sim only (the ledger). */
static void dmabuf_across_sleep(void)
{
    if (!sim || !supported)
        return;
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = make_pool("max_chunk:2MiB", FABPOOL_OK);
    fabpool_buffer_t *b = NULL;
    if (!p || fabpool_buffer_create(p, 64 * MB, 8 * MB, &b) != FABPOOL_OK) {
        CHECK(0);
        fabpool_destroy(p);
        return;
    }
    t_put_tag(fabpool_buffer_ptr(b), 8 * MB, 0xd0a);
    int fd = -1, late = -1;
    CHECK_OK(fabpool_buffer_dmabuf(b, 2 * MB, 4 * MB, &fd));
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK_STATUS(fabpool_buffer_dmabuf(b, 0, 2 * MB, &late), FABPOOL_ERR_ASLEEP);
    CHECK(late == -1 && t_ledger().dmabuf_fds == l0.dmabuf_fds + 1);
    CHECK(t_mapped(p) == 0 && t_ledger().bytes_held == l0.bytes_held + 4 * MB); /* the fd's range alone */
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK(t_tag_ok(fabpool_buffer_ptr(b), 8 * MB, 0xd0a));
    CHECK(t_mapped(p) == 8 * MB && t_ledger().bytes_held == l0.bytes_held + 12 * MB); /* new memory, and the old */
    close(fd);
    CHECK(t_ledger().bytes_held == l0.bytes_held + 8 * MB && t_ledger().dmabuf_fds == l0.dmabuf_fds);
    CHECK_OK(fabpool_buffer_dmabuf(b, 2 * MB, 4 * MB, &late)); /* of the new memory: nothing more held */
    CHECK(late >= 0 && t_ledger().bytes_held == l0.bytes_held + 8 * MB);
    if (late >= 0)
        close(late);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(p));
    fabsim_ledger l1 = t_ledger();
    CHECK(t_ledger_same(&l0, &l1) && l1.dmabuf_fds == l0.dmabuf_fds);
}

int main(void)
{
    sim = t_driver_init();
    cuDeviceGet(&dev, 0);
    int vmm_rdma = -1, dmabuf_attr = -1;
    CHECK_CU(cuDeviceGetAttribute(&vmm_rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev));
    CHECK_CU(cuDeviceGetAttribute(&dmabuf_attr, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev));
    supported = vmm_rdma == 1 && dmabuf_attr == 1;
    printf("driver: %s; GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED %d, DMA_BUF_SUPPORTED %d\n",
           sim ? "simulated" : "real", vmm_rdma, dmabuf_attr);

    options();
    flag_for(NULL, vmm_rdma == 1);          /* the default is auto */
    flag_for("rdma:auto", vmm_rdma == 1);
    flag_for("rdma:off", 0);
    if (vmm_rdma == 1) {
        flag_for("rdma:on", 1);
    } else {
        fabpool_t *p = make_pool("rdma:on", FABPOOL_ERR_NOT_SUPPORTED);
        CHECK(p == NULL);
        CHECK(strstr(fabpool_last_error(), "rdma:on") && strstr(fabpool_last_error(), "GPU_DIRECT_RDMA_WITH_CUDA_VMM"));
        if (sim)
            CHECK(t_ledger().reservations == 0 && t_ledger().handles == 0);
    }
    dmabuf();
    dmabuf_across_sleep();
    return t_done("test_rdma");
}
