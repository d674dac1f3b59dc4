/* The steps_per_print line as DeepSpeed's engine logs it (step_report.h). DeepSpeed formats its
 * lists with Python's str(), so the numbers are Python's float repr and the betas keep the
 * container they were given in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step_report.h"

void zt_step_report_float(double v, char *buf, size_t n) {
    /* The fewest significant digits that read back exactly, as repr() chooses them. */
    char sci[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec - 1, v);
        if (strtod(sci, NULL) == v)
            break;
    }
    char *e = strchr(sci, 'e');
    if (!e) { /* inf or nan: Python writes them so too */
        snprintf(buf, n, "%s", v != v ? "nan" : v < 0 ? "-inf" : "inf");
        return;
    }
    int exp = atoi(e + 1);
    *e = '\0';
    /* The digits alone, without sign and point. */
    char digits[24];
    size_t nd = 0;
    for (const char *p = sci; *p && nd + 1 < sizeof digits; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    digits[nd] = '\0';
    const char *sign = v < 0 ? "-" : "";
    if (exp < -4 || exp >= 16) {
        /* d.ddde[+-]XX, at least two exponent digits. */
        snprintf(buf, n, "%s%c%s%.*s%s%c%02d", sign, digits[0], nd > 1 ? "." : "", (int)nd - 1,
                 digits + 1, "e", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    char out[64];
    size_t k = 0;
    if (exp < 0) {
        k += (size_t)snprintf(out + k, sizeof out - k, "0.");
        for (int i = -1; i > exp; i--)
            out[k++] = '0';
        k += (size_t)snprintf(out + k, sizeof out - k, "%s", digits);
    } else {
        for (int i = 0; i <= exp; i++)
            out[k++] = (size_t)i < nd ? digits[i] : '0';
        out[k++] = '.';
        if ((size_t)exp + 1 < nd)
            k += (size_t)snprintf(out + k, sizeof out - k, "%s", digits + exp + 1);
        else
            out[k++] = '0';
    }
    out[k] = '\0';
    snprintf(buf, n, "%s%s", sign, out);
}

void zt_step_report_print(FILE *f, long long step, long long skipped, double lr, double mom,
                          bool cycled, const zt_optimizer_config *o) {
    char lr_s[40], m1[40], m2[40], mom_s[96];
    zt_step_report_float(lr, lr_s, sizeof lr_s);
    zt_step_report_float(mom, m1, sizeof m1);
    if (o->type == ZT_OPTIM_SGD) {
        /* torch.optim.SGD's default momentum is the int 0. */
        if (mom == 0)
            snprintf(m1, sizeof m1, "0");
        snprintf(mom_s, sizeof mom_s, "%s", m1);
    } else {
        zt_step_report_float(o->beta2, m2, sizeof m2);
        bool list = o->betas_given && !cycled;
        snprintf(mom_s, sizeof mom_s, "%c%s, %s%c", list ? '[' : '(', m1, m2, list ? ']' : ')');
    }
    fprintf(f, "[ztrain] step=%lld, skipped=%lld, lr=[%s], mom=[%s]\n", step, skipped, lr_s,
            mom_s);
}
