/* fuzz_conf: fabpool_options_parse on fuzzed strings.  A refusal leaves the
 * options as they were and says why; an acceptance yields options within the
 * documented ranges, and parsing the same string again gives the same options. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fabpool.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = 0;
    fabpool_options o, before, again;
    fabpool_options_init(&o);
    before = o;
    fabpool_status st = fabpool_options_parse(&o, s);
    if (st != FABPOOL_OK) {
        if (st != FABPOOL_ERR_CONFIG || fabpool_last_error()[0] == 0 || memcmp(&o, &before, sizeof o) != 0)
            abort();
    } else {
        if (o.max_waste_percent > 100 || o.n_peer_devices < 0 || o.n_peer_devices > FABPOOL_MAX_PEERS ||
            o.device < 0 || o.shrink_hysteresis_percent > 1000 || o.slab_max_bytes < 256 ||
            (o.max_chunk_bytes % (2u << 20)) != 0)
            abort();
        fabpool_options_init(&again);
        if (fabpool_options_parse(&again, s) != FABPOOL_OK || memcmp(&o, &again, sizeof o) != 0)
            abort();
    }
    free(s);
    return 0;
}
