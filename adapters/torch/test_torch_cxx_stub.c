/* test_torch_cxx_stub.c - a stand-in for libfabpool_torch_cxx.so in the test
 * of fabpool_torch.install() (test_torch_install.py), where no PyTorch is
 * installed: the shim's C functions are linked in, as in the real library,
 * and the C++ allocator's entry points record their calls instead of
 * installing anything.  FABPOOL_STUB_TORCH_VERSION names the PyTorch it
 * says it was built against (default 2.11.0+cu130); FABPOOL_STUB_REFUSE=1
 * makes its install refuse, as the real one does once CUDA is initialized. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fabpool.h"

static int installs;

FABPOOL_API const char *fabpool_torch_cxx_built_for(void)
{
    const char *v = getenv("FABPOOL_STUB_TORCH_VERSION");
    return v ? v : "2.11.0+cu130";
}

FABPOOL_API int fabpool_torch_cxx_install(char *msg, size_t cap)
{
    if (getenv("FABPOOL_STUB_REFUSE")) {
        snprintf(msg, cap, "the stub refuses: CUDA was initialized before install()");
        return FABPOOL_ERR_BUSY;
    }
    installs++;
    return FABPOOL_OK;
}

FABPOOL_API int fabpool_torch_cxx_installed(void) { return installs; }

FABPOOL_API int fabpool_torch_cxx_cpp_view(int device, int64_t *out, char *msg, size_t cap)
{
    (void)msg, (void)cap;
    for (int i = 0; i < 5; i++)
        out[i] = device * 10 + i;
    return 0;
}
