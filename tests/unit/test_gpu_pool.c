/* Tests for the host-side GPU logic that needs no GPU: ztraind's pool of GPUs (service/
 * gpu_pool.h: how many a job holds, which ones, the CUDA_VISIBLE_DEVICES list, release, the
 * daemon's own CUDA_VISIBLE_DEVICES mapped through), the GPU a rank takes (LOCAL_RANK modulo the
 * visible GPUs) and the MFU peak table (ztrain/gpu.h) against NVIDIA's published dense bf16
 * figures. On a host without a GPU, zt_gpu_count is 0 and a GPU's properties are an error. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "daemon/gpu_pool.h"
#include "ztrain/gpu.h"

static void test_pool(void) {
    zt_gpu_pool p;
    char list[256];
    CHECK(zt_gpu_pool_init(&p, 4, NULL) == ZT_OK, "%s", zt_last_error());
    CHECK(zt_gpu_pool_need(&p, 2) == 2 && zt_gpu_pool_need(&p, 8) == 4, "need");
    CHECK(zt_gpu_pool_take(&p, "job-a", 2, list, sizeof list) && strcmp(list, "0,1") == 0,
          "first job: %s", list);
    CHECK(zt_gpu_pool_take(&p, "job-b", 1, list, sizeof list) && strcmp(list, "2") == 0,
          "second job: %s", list);
    CHECK(zt_gpu_pool_free(&p) == 1, "free %d", zt_gpu_pool_free(&p));
    CHECK(!zt_gpu_pool_take(&p, "job-c", 2, list, sizeof list) && zt_gpu_pool_free(&p) == 1,
          "a job that does not fit takes nothing");
    zt_gpu_pool_release(&p, "job-a");
    CHECK(zt_gpu_pool_free(&p) == 3, "release frees the job's GPUs");
    CHECK(zt_gpu_pool_take(&p, "job-c", 3, list, sizeof list) && strcmp(list, "0,1,3") == 0,
          "lowest free first: %s", list);
    zt_gpu_pool_release(&p, "nobody");
    CHECK(zt_gpu_pool_free(&p) == 0, "releasing a job without GPUs changes nothing");

    /* A daemon limited to some GPUs hands out those names, UUIDs included. */
    CHECK(zt_gpu_pool_init(&p, 2, "3,GPU-5f2c") == ZT_OK, "%s", zt_last_error());
    CHECK(zt_gpu_pool_take(&p, "j", 2, list, sizeof list) && strcmp(list, "3,GPU-5f2c") == 0,
          "mapped: %s", list);
    CHECK(zt_gpu_pool_init(&p, 3, "3,4") == ZT_ERR_INVALID && strstr(zt_last_error(), "--gpus 3"),
          "more GPUs than listed: %s", zt_last_error());
    CHECK(zt_gpu_pool_init(&p, 1, "3,,4") == ZT_ERR_INVALID && strstr(zt_last_error(), "empty"),
          "an empty entry: %s", zt_last_error());
    CHECK(zt_gpu_pool_init(&p, 65, NULL) == ZT_ERR_INVALID, "too many");
    CHECK(zt_gpu_pool_init(&p, 0, NULL) == ZT_OK && zt_gpu_pool_need(&p, 4) == 0,
          "no GPUs: a job holds none");
    CHECK(zt_gpu_pool_init(&p, 2, NULL) == ZT_OK &&
              !zt_gpu_pool_take(&p, "j", 2, list, 3) && zt_gpu_pool_free(&p) == 2,
          "a list that does not fit takes nothing");
}

static void test_devices_and_peaks(void) {
    CHECK(zt_gpu_for_rank(0, 4) == 0 && zt_gpu_for_rank(5, 4) == 1, "LOCAL_RANK mod GPUs");
    CHECK(zt_gpu_for_rank(1, 1) == 0, "two ranks share one GPU");
    CHECK(zt_gpu_for_rank(0, 0) == -1, "no GPU");
    char out[64];
    int ids[] = {2, 3, 7};
    CHECK(zt_gpu_visible_list(ids, 3, 1, 2, out, sizeof out) && strcmp(out, "3,7") == 0, "%s",
          out);
    CHECK(!zt_gpu_visible_list(ids, 3, 2, 2, out, sizeof out), "range past the list");

    /* NVIDIA's data sheets, dense bf16 tensor-core peaks: half the "with sparsity" figure the
     * sheets print (H100 SXM 1,979; H100 NVL and H200 NVL 1,671; H100 PCIe 1,513), rounded down
     * to whole TFLOPS; the names as nvidia-smi and cudaGetDeviceProperties report them. */
    static const struct {
        const char *name;
        int major, minor;
        double tflops;
        const char *label_has;
    } sheet[] = {
        {"NVIDIA H100 80GB HBM3", 9, 0, 989, "H100 SXM"},
        {"NVIDIA H100 NVL", 9, 0, 835, "H100 NVL"},
        {"NVIDIA H100 PCIe", 9, 0, 756, "H100 PCIe"},
        {"NVIDIA H200", 9, 0, 989, "H200"},
        {"NVIDIA H200 NVL", 9, 0, 835, "H200 NVL"},
        {"NVIDIA A100-SXM4-80GB", 8, 0, 312, "A100"},
        {"NVIDIA A10", 8, 6, 125, "A10"},
    };
    const char *label = NULL;
    for (size_t i = 0; i < sizeof sheet / sizeof *sheet; i++) {
        double got = zt_gpu_peak_bf16(sheet[i].name, sheet[i].major, sheet[i].minor, &label);
        CHECK(got == sheet[i].tflops * 1e12 && strstr(label, sheet[i].label_has),
              "%s: %g TFLOPS (%s), data sheet %g", sheet[i].name, got / 1e12, label,
              sheet[i].tflops);
    }
    CHECK(!strstr(label, "A100"), "A10 is not an A100: %s", label);
    CHECK(zt_gpu_peak_bf16("Some Future GPU", 9, 0, &label) == 989e12 &&
              strstr(label, "compute capability 9.0"), "by capability: %s", label);
    CHECK(zt_gpu_peak_bf16("Tesla T4", 7, 5, &label) == 0 && strstr(label, "unknown"),
          "unknown: %s", label);

    /* This host's GPUs, whatever it has: a count that agrees with the properties. */
    int n = zt_gpu_count();
    zt_gpu_props props;
    CHECK(zt_gpu_props_get(n, &props) == ZT_ERR_INVALID, "GPU %d past the count", n);
    if (n == 0)
        printf("test_gpu_pool: no GPU visible here (%s): device queries skipped\n",
               zt_gpu_built() ? "built with CUDA" : "built without CUDA");
    else
        CHECK(zt_gpu_props_get(0, &props) == ZT_OK && props.name[0], "%s", zt_last_error());
}

int main(void) {
    test_pool();
    test_devices_and_peaks();
    return check_summary("test_gpu_pool");
}
