/* test_held: tests/held.h, what the real-driver tests read as "held by this process", checked on the simulated
 * driver against a fake NVML (tests/fake_nvml: libnvidia-ml.so.1 found through LD_LIBRARY_PATH) whose list of
 * processes the test sets:
 *   - the device's used memory less the processes outside this process tree (a child's memory is ours, the
 *     parent's is not), and the device asked for by its UUID in NVML's spelling;
 *   - memory mapped by this process shows up byte for byte;
 *   - another process's use moving between the two NVML readings: read again until they agree;
 *   - NVML not listing this process: the whole device's use, and *whole says so. */
#include "testutil.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1ull << 20)
#define GB (1ull << 30)

typedef void (*set_fn)(const unsigned *, const unsigned long long *, unsigned, unsigned, unsigned);

static int64_t device_used(void)
{
    size_t f = 0, t = 0;
    CHECK_CU(cuMemGetInfo(&f, &t));
    return (int64_t)t - (int64_t)f;
}

int main(void)
{
    if (!t_driver_init()) {
        printf("test_held: needs the simulated driver and the fake NVML beside it; skipped\n");
        return 77;
    }
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL); /* the same object held.h loads */
    set_fn set = lib ? (set_fn)dlsym(lib, "fake_nvml_set") : NULL;
    unsigned (*calls)(void) = lib ? (unsigned (*)(void))dlsym(lib, "fake_nvml_calls") : NULL;
    const char *(*uuid)(void) = lib ? (const char *(*)(void))dlsym(lib, "fake_nvml_uuid") : NULL;
    CHECK(set && calls && uuid);
    if (!set || !calls || !uuid)
        return t_done("test_held");

    pid_t kid = fork(); /* a child of this process (it never touches CUDA): its memory counts as ours */
    if (kid == 0) {
        pause();
        _exit(0);
    }
    unsigned me = (unsigned)getpid();
    unsigned pids[3] = {me, (unsigned)kid, (unsigned)getppid()};
    unsigned long long used[3] = {500 * MB, 1 * GB, 3 * GB};
    set(pids, used, 3, me, 0);

    int whole = -1;
    int64_t u0 = t_used_bytes(0, &whole);
    CHECK(whole == 0);
    CHECK(u0 == device_used() - (int64_t)(3 * GB)); /* the parent's 3 GiB are another process's */
    CUuuid id;
    char want[64];
    CHECK_CU(cuDeviceGetUuid(&id, 0));
    const unsigned char *b = (const unsigned char *)id.bytes;
    snprintf(want, sizeof want, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    CHECK(strcmp(uuid(), want) == 0);

    /* 256 MiB mapped by this process */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK_CU(cuMemAddressReserve(&va, 256 * MB, 0, 0, 0));
    CHECK_CU(cuMemCreate(&h, 256 * MB, &prop, 0));
    CHECK_CU(cuMemMap(va, 256 * MB, 0, h, 0));
    CHECK_CU(cuMemRelease(h));
    CHECK(t_used_bytes(0, &whole) - u0 == (int64_t)(256 * MB) && whole == 0);

    /* the other processes' use moves for 4 NVML calls: two tries fail, the third (calls 5 and 6) agrees */
    set(pids, used, 3, me, 4);
    int64_t u1 = t_used_bytes(0, &whole);
    CHECK(whole == 0 && u1 - u0 == (int64_t)(256 * MB));
    CHECK(calls() == 6);

    /* NVML does not list this process: its PIDs are not ours to compare, so the whole device is read */
    set(pids + 2, used + 2, 1, me, 0);
    int64_t u2 = t_used_bytes(0, &whole);
    CHECK(whole == 1 && u2 == device_used());

    CHECK_CU(cuMemUnmap(va, 256 * MB));
    CHECK_CU(cuMemAddressFree(va, 256 * MB));
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    printf("test_held: baseline %lld MiB (device less 3 GiB of another process), +256 MiB mapped read exactly, "
           "%u NVML readings while another process moved, whole-device fallback %lld MiB\n",
           (long long)(u0 >> 20), 6u, (long long)(u2 >> 20));
    return t_done("test_held");
}
