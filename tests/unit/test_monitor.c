/* The monitors' building blocks against independent references: the CRC-32C of the standard
 * check string "123456789" (0xE3069283, from the CRC catalogue), and the CSV values against
 * Python's repr() of the same doubles (printed by /usr/bin/python3 and pasted here). The files
 * themselves are read back by TensorBoard and Python's csv in tests/reference/test_monitors.py. */
#include <stdio.h>
#include <string.h>

#include "ztrain/tb_events.h"
#include "check.h"
#include "ztrain/monitor.h"

static void test_crc32c(void) {
    CHECK(zt_crc32c("123456789", 9) == 0xE3069283u);
    CHECK(zt_crc32c("", 0) == 0);
}

static void test_python_repr(void) {
    static const struct {
        double v;
        const char *want;
    } cases[] = {
        {0.001, "0.001"},
        {1e-05, "1e-05"},
        {65536.0, "65536.0"},
        {2.5e-4, "0.00025"},
        {1.0 / 3.0, "0.3333333333333333"},
        {1e16, "1e+16"},
        {1234567890123456.0, "1234567890123456.0"},
        {-0.5, "-0.5"},
        {3.0000000000000004e-05, "3.0000000000000004e-05"},
        {123.456, "123.456"},
        {6e-5 * 0.7, "4.2e-05"},
        {1.5e300, "1.5e+300"},
        {-2.5e-7, "-2.5e-07"},
        {100.0, "100.0"},
        {0.1 + 0.2, "0.30000000000000004"},
        {0.0, "0.0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char got[64];
        zt_monitor_format_float(got, sizeof got, cases[i].v);
        CHECK(strcmp(got, cases[i].want) == 0, "repr of %.17g: got %s, want %s", cases[i].v,
                  got, cases[i].want);
    }
}

int main(void) {
    test_crc32c();
    test_python_repr();
    return check_summary("test_monitor");
}
