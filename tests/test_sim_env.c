/* test_sim_env: the simulated driver's settings (sim/fabsim.h) that are not
 * values are refused: cuInit fails with CUDA_ERROR_INVALID_VALUE and says on
 * stderr which variable and what it takes, and the driver stays uninitialized
 * (a wrong setting must not run a test on another device than meant); good
 * values, units in any case, are taken.  The simulated driver only. */
#include <fcntl.h>

#include "testutil.h"

/* cuInit with FABSIM_<name>=value (NULL: unset), its stderr in said. */
static CUresult init_with(const char *name, const char *value, char *said, size_t cap)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    fflush(stderr);
    FILE *f = tmpfile();
    int saved = dup(2);
    if (!f || saved < 0 || dup2(fileno(f), 2) < 0) {
        fprintf(stderr, "test_sim_env: cannot capture stderr\n");
        exit(2);
    }
    CUresult r = cuInit(0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t n = fread(said, 1, cap - 1, f);
    said[n] = '\0';
    fclose(f);
    return r;
}

static void refused(const char *name, const char *value, const char *needle)
{
    char said[1024];
    CUresult r = init_with(name, value, said, sizeof said);
    char want[128];
    snprintf(want, sizeof want, "%s='%s'", name, value);
    CHECK(r == CUDA_ERROR_INVALID_VALUE);
    CHECK(strstr(said, want) != NULL && strstr(said, needle) != NULL);
    if (r != CUDA_ERROR_INVALID_VALUE || !strstr(said, want) || !strstr(said, needle))
        fprintf(stderr, "  %s='%s': cuInit %d, said: %s\n", name, value, (int)r, said);
    int n = -1;
    CHECK(cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED); /* nothing was set up */
    unsetenv(name);
}

int main(void)
{
    unsetenv("FABSIM_DEVICES");
    unsetenv("FABSIM_MEMORY");
    unsetenv("FABSIM_HOST_MEMORY");
    refused("FABSIM_MEMORY", "banana", "is not a size");
    refused("FABSIM_MEMORY", "16GiBs", "is not a size");
    refused("FABSIM_MEMORY", "16 GiB", "is not a size");
    refused("FABSIM_MEMORY", "-1", "is not a size");
    refused("FABSIM_MEMORY", "0", "is not a size");
    refused("FABSIM_MEMORY", "99999999999999999999", "is not a size");
    refused("FABSIM_MEMORY", "16777216TiB", "is not a size"); /* 2^64 bytes */
    refused("FABSIM_HOST_MEMORY", "lots", "is not a size");
    refused("FABSIM_DEVICES", "100", "from 0 to 16");
    refused("FABSIM_DEVICES", "17", "from 0 to 16");
    refused("FABSIM_DEVICES", "-1", "from 0 to 16");
    refused("FABSIM_DEVICES", "2x", "from 0 to 16");
    refused("FABSIM_DEVICES", "two", "from 0 to 16");

    /* good values, units in any case: taken (the last cuInit, as the driver initializes once) */
    setenv("FABSIM_DEVICES", "16", 1);
    setenv("FABSIM_HOST_MEMORY", "1p", 1);
    char said[1024];
    CHECK(init_with("FABSIM_MEMORY", "3gib", said, sizeof said) == CUDA_SUCCESS && said[0] == '\0');
    int n = 0;
    CHECK(cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 16);
    CUdevice d = 0;
    size_t total = 0;
    CHECK(cuDeviceGet(&d, 15) == CUDA_SUCCESS && cuDeviceTotalMem(&total, d) == CUDA_SUCCESS &&
          total == (size_t)3 << 30);
    return t_done("test_sim_env");
}
