/* unit.h - CHECK for the unit tests of one layer's files (test_vaspace,
 * test_pagemap, test_sizeclass_grid): each failing check prints a line,
 * and unit_result() is main's status (1 if any check failed). */
#ifndef FP_TEST_UNIT_H
#define FP_TEST_UNIT_H

#include <stdio.h>

static int unit_failures, unit_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        unit_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            unit_failures++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

static inline int unit_result(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, unit_checks, unit_failures);
    return unit_failures ? 1 : 0;
}

#endif
