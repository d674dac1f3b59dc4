/* How many GPUs this process sees, with the reason when the CUDA runtime cannot tell: a missing
 * GPU or driver is a count of 0, but a driver too old for the runtime this module was built with (CUDA 13
 * needs an R580 or newer driver) is an error that says so, with both versions, rather than
 * "no CUDA device". */
#include <stdio.h>

#include "cuda_backend.h"

/* The oldest Linux driver branch of each CUDA major release (NVIDIA's CUDA Toolkit release
 * notes, "CUDA Toolkit and Minimum Required Driver Version"). */
static int min_driver(int runtime) {
    int major = runtime / 1000;
    return major >= 13 ? 580 : major == 12 ? 525 : major == 11 ? 450 : 0;
}

zt_status zt_cuda_visible(int *count) {
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(count);
    if (e == cudaSuccess)
        return ZT_OK;
    cudaGetLastError(); /* not sticky: clear it for the calls that follow */
    *count = 0;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    /* No GPU, or no driver at all (no libcuda: the runtime then reports an insufficient driver
     * of version 0), is a machine without GPUs, not a fault. */
    if (e == cudaErrorNoDevice || driver == 0)
        return ZT_OK;
    if (e == cudaErrorInsufficientDriver)
        return zt_error(ZT_ERR_UNSUPPORTED,
                        "the NVIDIA driver is too old for this build: it supports CUDA %d.%d, "
                        "the build's runtime is CUDA %d.%d (%s); CUDA %d needs driver R%d or "
                        "newer (nvidia-smi shows the driver's version)",
                        driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10,
                        cudaGetErrorString(e), runtime / 1000, min_driver(runtime));
    return zt_error(ZT_ERR_UNSUPPORTED, "cannot count the CUDA devices: %s (%s; driver supports "
                    "CUDA %d.%d)", cudaGetErrorString(e), cudaGetErrorName(e), driver / 1000,
                    driver % 1000 / 10);
}
