// consumer_hybridep.cpp - the installed HybridEP adapter header compiles on
// its own and works: allocate, grow in place, free; prints OK.
#include <fabpool_hybridep.hpp>
#include <cstdio>

int main()
{
    try {
        fabpool_hybridep::ExtendedMemoryAllocator a(0, "handle_type:posix_fd");
        void *p = nullptr;
        a.allocate(&p, 4 << 20, 64 << 20);
        void *before = p;
        a.resize(p, 48 << 20);
        fabpool_hybridep::MemHandle h;
        a.get_handle(&h, p);
        bool mine = a.is_accessible(&h);
        a.peers_done(p);
        a.free(p);
        if (p != before || !mine) {
            std::fprintf(stderr, "the buffer moved or its own handle is not accessible\n");
            return 1;
        }
    } catch (const fabpool_hybridep::Error &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    std::printf("OK fabpool_hybridep.hpp\n");
    return 0;
}
