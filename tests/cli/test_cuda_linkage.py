"""The CUDA module owns NCCL and the CUDA runtime (issue 26 item 3, issue 27): in a CUDA build the
programs ztraind, ztrain and ztrain-worker load libztrain_cuda.so on first use and link neither
libnccl nor libcudart (GPU discovery opens the runtime with dlopen), as `ldd` shows; the module
itself links NCCL and exports the table the engine's "nccl" transport reaches it through; and no
engine source includes a CUDA, NCCL or kernels/cuda/ header.

In a build without the CUDA toolkit the programs trivially pass and the module checks are
skipped, which the test prints."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, SRC, Checks  # noqa: E402

ck = Checks()
check = ck.check


def ldd(path):
    p = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=60)
    return {line.split()[0] for line in p.stdout.splitlines() if line.strip()}, p


module = os.path.join(BUILD, "libztrain_cuda.so")
cuda_build = os.path.exists(module)

for prog in ("ztraind", "ztrain", "ztrain-worker"):
    path = os.path.join(BUILD, prog)
    libs, p = ldd(path)
    check(p.returncode == 0 and libs, f"ldd {prog} runs ({p.returncode}): {p.stderr.strip()[:200]}")
    nccl = sorted(l for l in libs if l.startswith("libnccl"))
    check(not nccl, f"{prog} does not link NCCL ({nccl or 'none'})")
    cudart = sorted(l for l in libs if l.startswith("libcudart"))
    check(not cudart, f"{prog} does not link the CUDA runtime ({cudart or 'none'})")
    cublas = sorted(l for l in libs if l.startswith("libcublas"))
    check(not cublas, f"{prog} does not link cuBLAS ({cublas or 'none'})")

if cuda_build:
    libs, p = ldd(module)
    check(any(l.startswith("libnccl") for l in libs),
          f"libztrain_cuda.so links NCCL ({sorted(l for l in libs if 'nccl' in l)})")
    syms = subprocess.run(["nm", "-D", "--defined-only", module], capture_output=True,
                          text=True, timeout=60).stdout
    check(re.search(r"\bT zt_cuda_nccl_api$", syms, re.M) is not None,
          "libztrain_cuda.so exports zt_cuda_nccl_api, the table kernels/backend.c looks up")
else:
    print("skip  no libztrain_cuda.so in this build (no CUDA toolkit): module checks skipped")

# The engine includes nothing of a backend's internals and no CUDA or NCCL header.
bad = []
pattern = re.compile(r'#\s*include\s*[<"]([^>"]+)[>"]')
for root, _, files in os.walk(os.path.join(SRC, "engine")):
    for name in files:
        if not name.endswith((".c", ".h", ".cc")):
            continue
        path = os.path.join(root, name)
        for inc in pattern.findall(open(path, errors="replace").read()):
            if (inc.startswith(("cuda", "nccl", "cublas")) or "kernels/cuda" in inc or
                    inc in ("cuda_backend.h", "cuda_host.h")):
                bad.append(f"{os.path.relpath(path, SRC)}: {inc}")
check(not bad, f"engine/ includes no CUDA, NCCL or kernels/cuda header ({bad or 'none'})")

ck.done()
