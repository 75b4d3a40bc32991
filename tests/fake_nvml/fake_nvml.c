/* fake_nvml.c - a stand-in for libnvidia-ml.so.1 with the three entry points tests/held.h uses, so that
 * test_held checks held.h's arithmetic on the simulated driver. What it lists is set by the test through
 * fake_nvml_set (found with dlsym): processes and their used bytes, and for how many calls the bytes of the
 * processes that are not the caller move at each call (another process allocating between two readings). */
#include <string.h>

#define MAXP 8
typedef struct fake_proc {
    unsigned int pid;
    unsigned long long used;
    unsigned int gpu_instance, compute_instance;
} fake_proc;

static fake_proc procs[MAXP];
static unsigned n_procs, moving, calls;
static unsigned self_pid;
static char uuid_asked[96];
static int handle_token;

void fake_nvml_set(const unsigned *pids, const unsigned long long *used, unsigned n, unsigned self, unsigned move)
{
    n_procs = n < MAXP ? n : MAXP;
    for (unsigned i = 0; i < n_procs; i++) {
        memset(&procs[i], 0, sizeof procs[i]);
        procs[i].pid = pids[i];
        procs[i].used = used[i];
    }
    self_pid = self;
    moving = move;
    calls = 0;
}

unsigned fake_nvml_calls(void) { return calls; }
const char *fake_nvml_uuid(void) { return uuid_asked; }

int nvmlInit_v2(void) { return 0; }

int nvmlDeviceGetHandleByUUID(const char *uuid, void **device)
{
    strncpy(uuid_asked, uuid, sizeof uuid_asked - 1);
    *device = &handle_token;
    return 0;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, fake_proc *infos)
{
    if (device != &handle_token)
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    calls++;
    if (*count < n_procs) {
        *count = n_procs;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    for (unsigned i = 0; i < n_procs; i++) {
        infos[i] = procs[i];
        if (moving && procs[i].pid != self_pid)
            infos[i].used += (unsigned long long)calls << 20; /* a MiB more at every call while it moves */
    }
    if (moving)
        moving--;
    *count = n_procs;
    return 0;
}
