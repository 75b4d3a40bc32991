/* make_seeds: writes the descriptor seed corpus (fuzz/corpus/desc): full
 * descriptors of buffers of 1, 3 and 0 chunks beyond the first, and a delta;
 * and a block's descriptor of several chunks (each record's generation its
 * chunk's identity). */
#include <stdio.h>

#include "../tests/testutil.h"

#define MB (1ull << 20)

static void save(const char *dir, const char *name, const void *d, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(d, 1, len, f);
        fclose(f);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    t_driver_init();
    fabpool_t *p;
    fabpool_buffer_t *b;
    static uint8_t d[1 << 14];
    int fds[16];
    size_t len, nfds;
    if (fabpool_create(NULL, &p) != FABPOOL_OK || fabpool_buffer_create(p, 256 * MB, 8 * MB, &b) != FABPOOL_OK)
        return 1;
    fabpool_buffer_export(b, 0, d, sizeof d, &len, fds, 16, &nfds);
    save(argv[1], "full-1-chunk", d, len);
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    fabpool_buffer_get_info(b, &bi);
    fabpool_buffer_resize(b, 40 * MB, NULL);
    fabpool_buffer_resize(b, 100 * MB, NULL);
    fabpool_buffer_export(b, bi.generation, d, sizeof d, &len, fds, 16, &nfds);
    save(argv[1], "delta-2-chunks", d, len);
    fabpool_buffer_export(b, 0, d, sizeof d, &len, fds, 16, &nfds);
    save(argv[1], "full-3-chunks", d, len);
    fabpool_buffer_get_info(b, &bi);
    fabpool_buffer_resize(b, 4 * MB, NULL);
    fabpool_buffer_export(b, bi.generation, d, sizeof d, &len, fds, 16, &nfds);
    save(argv[1], "delta-shrink", d, len);
    fabpool_buffer_export_done(b);
    fabpool_buffer_peers_ack(b, UINT64_MAX);
    fabpool_buffer_destroy(b, NULL);
    void *blk = NULL;
    size_t off = 0;
    if (fabpool_alloc(p, 100 * MB, &blk) == FABPOOL_OK &&
        fabpool_block_export(p, blk, d, sizeof d, &len, fds, 16, &nfds, &off) == FABPOOL_OK)
        save(argv[1], "block-chunks", d, len);
    fabpool_free(p, blk);
    fabpool_destroy(p);
    return 0;
}
