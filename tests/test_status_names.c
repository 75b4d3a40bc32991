/* test_status_names: every status code has its name.
 *
 * fabpool_status_name of each code from FABPOOL_OK to FABPOOL_STATUS_LAST is its enumerator's name (distinct,
 * none the unknown answer), and the first code past it is FABPOOL_ERR_UNKNOWN_STATUS.  The header itself (its
 * path in argv[1]) is read: every enumerator it declares, "FABPOOL_OK" or "FABPOOL_ERR_X = N", is the name of
 * code N, and the highest N is FABPOOL_STATUS_LAST, so that a status added without the macro or the table moved
 * fails here. */
#include "testutil.h"

int main(int argc, char **argv)
{
    for (int s = FABPOOL_OK; s <= FABPOOL_STATUS_LAST; s++) {
        const char *n = fabpool_status_name((fabpool_status)s);
        CHECK(n && strncmp(n, "FABPOOL_", 8) == 0 && strcmp(n, "FABPOOL_ERR_UNKNOWN_STATUS") != 0);
        for (int k = FABPOOL_OK; k < s; k++)
            CHECK(strcmp(n, fabpool_status_name((fabpool_status)k)) != 0);
    }
    CHECK(strcmp(fabpool_status_name(FABPOOL_ERR_PARTIAL), "FABPOOL_ERR_PARTIAL") == 0);
    CHECK(strcmp(fabpool_status_name((fabpool_status)(FABPOOL_STATUS_LAST + 1)), "FABPOOL_ERR_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(fabpool_status_name((fabpool_status)-1), "FABPOOL_ERR_UNKNOWN_STATUS") == 0);

    FILE *f = argc > 1 ? fopen(argv[1], "r") : NULL;
    CHECK(f != NULL);
    if (!f)
        return t_done("test_status_names");
    char line[512];
    int highest = -1, seen = 0;
    while (fgets(line, sizeof line, f)) {
        char name[64];
        int code = -1;
        /* "    FABPOOL_ERR_X = N,   comment": the enumerators of fabpool_status, nothing else has that shape */
        if (sscanf(line, " %63[A-Z_] = %d", name, &code) != 2 || strncmp(name, "FABPOOL_", 8) != 0)
            continue;
        seen++;
        CHECK(code >= 0 && code <= FABPOOL_STATUS_LAST);
        if (code > highest)
            highest = code;
        if (code >= 0 && strcmp(fabpool_status_name((fabpool_status)code), name) != 0) {
            fprintf(stderr, "code %d: the header names it %s, fabpool_status_name %s\n", code, name,
                    fabpool_status_name((fabpool_status)code));
            CHECK(!"the header's name and fabpool_status_name agree");
        }
    }
    fclose(f);
    CHECK(seen == FABPOOL_STATUS_LAST + 1 && highest == FABPOOL_STATUS_LAST);
    return t_done("test_status_names");
}
