/* The steps_per_print line as DeepSpeed's engine logs it (step_report.h). DeepSpeed formats its
 * lists with Python's str(), so the numbers are Python's float repr and the betas keep the
 * container they were given in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step_report.h"

void zt_step_report_print(FILE *f, long long step, long long skipped, double lr, double mom,
                          bool cycled, const zt_optimizer_config *o) {
    char lr_s[40], m1[40], m2[40], mom_s[96];
    zt_ds_py_float(lr, lr_s, sizeof lr_s);
    zt_ds_py_float(mom, m1, sizeof m1);
    if (o->type == ZT_OPTIM_SGD) {
        /* torch.optim.SGD's default momentum is the int 0. */
        if (mom == 0)
            snprintf(m1, sizeof m1, "0");
        snprintf(mom_s, sizeof mom_s, "%s", m1);
    } else {
        zt_ds_py_float(o->beta2, m2, sizeof m2);
        bool list = o->betas_given && !cycled;
        snprintf(mom_s, sizeof mom_s, "%c%s, %s%c", list ? '[' : '(', m1, m2, list ? ']' : ')');
    }
    fprintf(f, "[ztrain] step=%lld, skipped=%lld, lr=[%s], mom=[%s]\n", step, skipped, lr_s,
            mom_s);
}
