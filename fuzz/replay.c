/* replay: runs a fuzz target's LLVMFuzzerTestOneInput over files and
 * directories of inputs (the corpus), for the regular build and CI. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int n_inputs;

static void one(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    n_inputs++;
}

static void walk(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        exit(1);
    }
    if (!S_ISDIR(st.st_mode)) {
        one(path);
        return;
    }
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        walk(sub);
    }
    if (d)
        closedir(d);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        walk(argv[i]);
    printf("replay: %d inputs, none failed\n", n_inputs);
    return n_inputs ? 0 : 1;
}
