/* nvml_probe.c - what the instruments of tests/held.h show for VMM allocations on the real driver: the
 * device's used memory, NVML's count for this process, and held.h's reading (device less the other processes),
 * after create, map, the handle's release, the unmap with an exported fd still open, and the fd's close; then for
 * a POSIX-fd allocation that a child process imports and maps, and a child's own allocation. The children are
 * forked before this process initializes CUDA (a forked child cannot use the parent's). Prints one line per
 * reading. Not a CTest: built and run by hand on a GPU machine (perf/h200/held-check.sh). */
#include "../held.h"

#include <sys/socket.h>
#include <sys/wait.h>

#define MIB (1ll << 20)
#define DO(x)                                                                                                          \
    do {                                                                                                               \
        CUresult r_ = (x);                                                                                             \
        if (r_ != CUDA_SUCCESS) {                                                                                      \
            fprintf(stderr, "%s: %d\n", #x, (int)r_);                                                                  \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* one byte, and an fd with it if fd >= 0 */
static void send_fd(int sock, int fd)
{
    char c = 0, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&c, 1};
    struct msghdr m = {0};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    if (fd >= 0) {
        memset(ctl, 0, sizeof ctl);
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    }
    if (sendmsg(sock, &m, 0) != 1)
        exit(3);
}

static int recv_fd(int sock)
{
    char c, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&c, 1};
    struct msghdr m = {0};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (recvmsg(sock, &m, 0) != 1)
        exit(3);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    int fd = -1;
    if (cm && cm->cmsg_type == SCM_RIGHTS)
        memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    return fd;
}

static CUdevice dev;

/* NVML's own count for this process and its children (what held.h does not rely on) */
static int64_t nvml_self(void)
{
    const t_nvml_proc *procs;
    int n = t_nvml_list(dev, &procs);
    int64_t sum = 0;
    for (int i = 0; i < n; i++)
        if (t_pid_under(procs[i].pid, (unsigned)getpid()))
            sum += (int64_t)procs[i].used;
    return n < 0 ? -1 : sum;
}

static int64_t base_dev, base_self, base_held;

static void readings(int64_t *d, int64_t *self, int64_t *held, int *whole)
{
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    *d = (int64_t)t - (int64_t)f;
    *self = nvml_self();
    *held = t_used_bytes(dev, whole);
}

static void show(const char *what)
{
    int whole;
    int64_t d, self, held;
    readings(&d, &self, &held, &whole);
    printf("%-56s device %+7lld MiB, NVML this tree %+7lld MiB, held.h %+7lld MiB%s\n", what,
           (long long)((d - base_dev) / MIB), (long long)((self - base_self) / MIB),
           (long long)((held - base_held) / MIB), whole ? " (whole device)" : "");
    fflush(stdout);
}

static void child_init(void)
{
    CUcontext cc;
    DO(cuInit(0));
    DO(cuDeviceGet(&dev, 0));
    DO(cuDevicePrimaryCtxRetain(&cc, dev));
    DO(cuCtxSetCurrent(cc));
}

static CUmemAllocationProp prop_of(CUmemAllocationHandleType t)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = t;
    return prop;
}

/* the importer: waits for the fd, imports and maps 1 GiB, says so; unmaps on the next byte, says so; exits on
 * the next */
static int importer(int sock, size_t sz)
{
    int fd = recv_fd(sock);
    child_init();
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    DO(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    DO(cuMemAddressReserve(&va, sz, 0, 0, 0));
    DO(cuMemMap(va, sz, 0, h, 0));
    DO(cuMemRelease(h));
    send_fd(sock, -1);
    recv_fd(sock);
    DO(cuMemUnmap(va, sz));
    send_fd(sock, -1);
    recv_fd(sock);
    return 0;
}

/* the allocator: on the first byte makes and maps 512 MiB of its own, says so; exits on the next */
static int allocator(int sock)
{
    recv_fd(sock);
    child_init();
    CUmemAllocationProp prop = prop_of(CU_MEM_HANDLE_TYPE_NONE);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    DO(cuMemAddressReserve(&va, 512 * MIB, 0, 0, 0));
    DO(cuMemCreate(&h, 512 * MIB, &prop, 0));
    DO(cuMemMap(va, 512 * MIB, 0, h, 0));
    DO(cuMemRelease(h));
    send_fd(sock, -1);
    recv_fd(sock);
    return 0;
}

int main(void)
{
    size_t sz = 1024 * MIB;
    int sa[2], sb[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sa) || socketpair(AF_UNIX, SOCK_STREAM, 0, sb))
        return 1;
    pid_t pa = fork();
    if (pa == 0)
        _exit(importer(sa[1], sz));
    pid_t pb = fork();
    if (pb == 0)
        _exit(allocator(sb[1]));

    CUcontext ctx;
    DO(cuInit(0));
    DO(cuDeviceGet(&dev, 0));
    DO(cuDevicePrimaryCtxRetain(&ctx, dev));
    DO(cuCtxSetCurrent(ctx));
    int whole;
    readings(&base_dev, &base_self, &base_held, &whole);
    printf("baseline: device %lld MiB used, NVML this tree %lld MiB, held.h %lld MiB%s\n", (long long)(base_dev / MIB),
           (long long)(base_self / MIB), (long long)(base_held / MIB), whole ? " (whole device)" : "");

    CUmemAllocationProp prop = prop_of(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    DO(cuMemAddressReserve(&va, sz, 0, 0, 0));
    DO(cuMemCreate(&h, sz, &prop, 0));
    show("1 GiB created");
    DO(cuMemMap(va, sz, 0, h, 0));
    DO(cuMemSetAccess(va, sz, &acc, 1));
    show("mapped");
    int fd = -1;
    DO(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    DO(cuMemRelease(h));
    show("handle released, still mapped, fd open");
    DO(cuMemUnmap(va, sz));
    show("unmapped, fd open");
    DO(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    DO(cuMemMap(va, sz, 0, h, 0));
    DO(cuMemRelease(h));
    DO(cuMemSetAccess(va, sz, &acc, 1));
    show("imported back and mapped again, fd open");

    send_fd(sa[0], fd); /* the importer takes it */
    close(fd);
    recv_fd(sa[0]);
    show("a child (its own context) imported and mapped it");
    DO(cuMemUnmap(va, sz));
    show("this process unmapped it; the child still maps it");
    send_fd(sa[0], -1);
    recv_fd(sa[0]);
    show("the child unmapped it (its context still open)");
    send_fd(sa[0], -1);
    int st;
    waitpid(pa, &st, 0);
    show("the child exited");
    DO(cuMemAddressFree(va, sz));

    send_fd(sb[0], -1);
    recv_fd(sb[0]);
    show("another child holds 512 MiB of its own (+ its context)");
    send_fd(sb[0], -1);
    waitpid(pb, &st, 0);
    show("that child exited");
    return 0;
}
