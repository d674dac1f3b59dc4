"""The GPU checks' own plumbing on a machine without a GPU (issue 15, item 6): the training checks
that scripts/gpu-check.sh runs on a GPU (tests/gpu/train_check.py) run here with the CPU backend
standing in for the GPU — the fp32 step and the 20-step curve against the CPU engine, ZeRO 3 with
2 ranks against 1, and the bit-exact resume — and must pass, since the CPU engine meets them
exactly; a check whose runs cannot happen must fail, so the script can tell. bench/bench_gpu.py's
argument handling and --dry-run plan are checked too: the model sizes it states against GPT-2
124M's and the 1.1B Llama's parameter counts, computed here."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, SRC, Checks  # noqa: E402

CHECK = os.path.join(SRC, "tests", "gpu", "train_check.py")
BENCH = os.path.join(SRC, "bench", "bench_gpu.py")
ck = Checks()
check = ck.check


def run(args, timeout=300):
    return subprocess.run([sys.executable] + args, capture_output=True, text=True,
                          timeout=timeout)


p = run([CHECK, "--bin", BUILD, "--device", "cpu", "--checks", "gpt2,curve,zero,resume,memory",
         "--zero-stages", "3"])
print(p.stdout[-3000:], p.stderr[-2000:])
oks = [line for line in p.stdout.splitlines() if line.startswith("ok ")]
check(p.returncode == 0 and len(oks) == 7,  # memory: one a configuration
      f"train_check on the CPU: every check passes ({len(oks)} ok, exit {p.returncode})")
figs = dict(line.split(" ", 2)[1:] for line in p.stdout.splitlines()
            if line.startswith("FIGURE "))
check(json.loads(figs.get("curve_rel_err", "1")) == 0,
      f"the CPU against itself: the 20-step curves agree exactly ({figs.get('curve_rel_err')})")
check(json.loads(figs.get("gpt2_step_rel_err", "1")) == 0,
      f"the CPU against itself: the gpt2 steps agree exactly ({figs.get('gpt2_step_rel_err')})")

# A check whose runs cannot happen must fail and say so.
p = run([CHECK, "--bin", "/nonexistent", "--device", "cpu", "--checks", "gpt2"])
check(p.returncode == 1 and "FAIL" in p.stdout, f"a check without its runs fails (exit "
      f"{p.returncode})")
p = run([CHECK, "--bin", BUILD, "--checks", "gpt2,warp"])
check(p.returncode == 2 and "--checks: unknown warp" in p.stderr, f"an unknown check is refused: "
      f"{p.stderr.strip()[-200:]}")

# The benchmark cannot run here; its plan can.
p = run([BENCH, "--dry-run", "--ztrain-bin", BUILD])
check(p.returncode == 0, f"bench_gpu --dry-run exits 0: {p.stderr.strip()[-500:]}")
try:
    plan = json.loads(p.stdout)
except ValueError as e:
    plan = {}
    check(False, f"bench_gpu --dry-run prints JSON: {e}: {p.stdout[:300]}")
# GPT-2 124M: wte 50304·768 (padded vocab), wpe 1024·768, 12 blocks of 12·768² + 13·768, final LN.
C, L, V, T = 768, 12, 50304, 1024
gpt2 = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
got = plan.get("gpt2", {}).get("params")
check(got == gpt2, f"bench plan: GPT-2 124M has {got} parameters, expected {gpt2}")
# The ~1.1B Llama (TinyLlama's shape): 22 layers, 2048 wide, 32 heads (4 for k/v), 5632 MLP,
# vocab 32000, untied: 1,100,048,384 parameters, as TinyLlama's model card counts.
C, L, H, KV, FF, V = 2048, 22, 32, 4, 5632, 32000
kv = C // H * KV
llama = 2 * V * C + L * (C * C * 2 + 2 * C * kv + 3 * C * FF + 2 * C) + C
got = plan.get("llama", {}).get("params")
check(got == llama == 1100048384, f"bench plan: the Llama has {got} parameters, expected {llama}")
# MFU's FLOPs per token are llm.c's (train_gpt2.cu, gpt2_estimate_mfu): 6 per parameter (less an
# untied input embedding) and 6·L·C·T, as bench/perf_model.py's model FLOPs.
want = {"gpt2": 6 * gpt2 + 6 * 12 * 768 * 1024,
        "llama": 6 * (llama - 32000 * 2048) + 6 * 22 * 2048 * 2048}
got = {k: plan.get(k, {}).get("flops_per_token") for k in want}
check(got == want, f"bench plan: FLOPs per token by llm.c's count ({got}, expected {want})")
check(plan.get("peak", {}).get("H100 SXM") == 989e12 and "ztrain" in plan.get("runs", []) and
      "torch_compile" in plan.get("runs", []),
      f"bench plan: states the peak and the runs ({plan.get('peak')}, {plan.get('runs')})")
# The benchmark's MFU peaks by device name, against NVIDIA's data sheets (dense bf16: half the
# sparse figure), the table tests/unit/test_gpu_pool.c checks ztrain/gpu.h's against.
sys.path.insert(0, os.path.dirname(BENCH))
import bench_gpu  # noqa: E402
for name, tflops in (("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 NVL", 835),
                     ("NVIDIA H100 PCIe", 756), ("NVIDIA H200", 989), ("NVIDIA H200 NVL", 835),
                     ("NVIDIA A100-SXM4-80GB", 312)):
    label, peak = bench_gpu.peak_of(name)
    check(peak == tflops * 1e12, f"bench peak of {name}: {peak / 1e12:g} TFLOPS ({label}), "
          f"data sheet {tflops}")
# llm.c's leg: the command trains its own GPT-2 124M from scratch at the plan's micro-batch for
# warmup + steps steps, and its tokens/s comes from its per-step lines, printed with the format
# of llm.c's train_gpt2.cu (copied here as its source has it): the median step after the warmup.
cmd = plan.get("llmc_command", [])
check(cmd[1:] == ["-i", "tokens.bin", "-j", "tokens.bin", "-e", "d12", "-b", "32", "-t", "1024",
                  "-x", "25", "-v", str(1 << 30), "-m", "1", "-s", "0"],
      f"bench plan: llm.c's command {cmd}")
LLMC_STEP = ("step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | "
             "%.1f%% bf16 MFU | %.0f tok/s")
times = [900.0, 80.0, 50.0, 41.0, 40.5, 40.0, 39.0, 45.0, 38.0]  # steps 1..9, warmup 3
text = "\n".join(["allocated 474 MiB for model parameters", "val loss 10.98"] +
                 [LLMC_STEP % (i + 1, len(times), 10.9, 0.0, 1.2, 0.0, 3e-4, ms, 40.0, 1e5)
                  for i, ms in enumerate(times)] + ["val loss 10.5", "total average iteration"])
got = bench_gpu.llmc_tokens_per_s(text, 16, 3)
after = sorted(times[3:])
want = 16 * 1024 * 1000.0 / after[len(after) // 2]
check(got == want, f"llm.c's tokens/s from its step lines: {got}, expected {want}")
check(bench_gpu.llmc_tokens_per_s("no steps here", 16, 3) is None,
      "llm.c's output without step lines gives no figure")

# The micro-batch search: a size that does not fit (each run's own words for it) is retried at
# half the size; any other failure would fail alike at every size, each try the GPU's minutes.
def tries(error, exact=False):
    sizes = []

    def fake_run(micro):
        sizes.append(micro)
        return {"error": error} if micro > 2 else {"tokens_per_s": 1.0}
    return sizes, bench_gpu.largest(fake_run, 16, exact)


for oom in ("ztrain: job.json: the job does not fit on the GPU: it needs an estimated 96.4 GiB",
            "gpt2: out of memory", "out of memory", "llm.c micro-batch 16: its optimizer state "
            "fell back to managed memory (the device is full)"):
    sizes, res = tries(oom)
    check(sizes == [16, 8, 4, 2] and res.get("micro_batch") == 2,
          f"a micro-batch that does not fit is retried at half ({oom[:40]}...): {sizes} {res}")
for other in ("InductorError: LoweringException: RuntimeError: mix of the legacy and new APIs",
              "ztrain run micro-batch 16: no result within --timeout 180 s",
              "cuda backend: an illegal memory access was encountered"):
    sizes, res = tries(other)
    check(sizes == [16] and res.get("micro_batch") == 0 and res.get("error") == other,
          f"any other failure is not retried at smaller sizes ({other[:40]}...): {sizes}")
sizes, res = tries("out of memory", exact=True)
check(sizes == [16] and res.get("micro_batch") == 0, f"--exact-batch tries one size: {sizes}")


# A PyTorch run that fails in a way of its own (Inductor, Triton or the host compiler raise more
# than RuntimeError) is recorded as the run's error, not raised past the runs after it.
class FakeCuda:
    OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})

    def empty_cache(self):
        pass

    def reset_peak_memory_stats(self):
        pass


class FakeTorch:
    cuda = FakeCuda()

    @property
    def nn(self):
        raise AssertionError("inductor: an internal assertion")


args = bench_gpu.argparse.Namespace(steps=1, warmup=0)
try:
    res = bench_gpu.run_torch(args, FakeTorch(), "gpt2", bench_gpu.GPT2, 4, True)
except Exception as e:  # noqa: BLE001
    res = {"raised": repr(e)}
check(res.get("error") == "AssertionError: inductor: an internal assertion",
      f"a torch.compile failure that is no RuntimeError is the run's error: {res}")

# ztrain's figures without PyTorch's CUDA (this Python's torch has none): a fake nvidia-smi and a
# fake `ztrain run` that writes the metrics a run writes; the PyTorch run fails alone, saying why.
fake = tempfile.mkdtemp(prefix="zt-bench-gpu-")
with open(os.path.join(fake, "nvidia-smi"), "w") as f:
    f.write("#!/bin/sh\ncase \"$*\" in *name*) echo 'NVIDIA H100 80GB HBM3';; "
            "*memory.used*) echo 1000;; esac\n")
with open(os.path.join(fake, "ztrain"), "w") as f:
    f.write("#!/bin/sh\n# ztrain run JOB --out DIR\nmkdir -p \"$4\"\nfor i in 1 2 3; do echo "
            "'{\"step\": '$i', \"perf/tokens_per_second\": 100000.0}'; done "
            ">\"$4/metrics.jsonl\"\n")
for name in ("nvidia-smi", "ztrain"):
    os.chmod(os.path.join(fake, name), 0o755)
out_json = os.path.join(fake, "out.json")
p = subprocess.run([sys.executable, BENCH, "--ztrain-bin", fake, "--runs", "ztrain,torch_eager",
                    "--models", "gpt2", "--steps", "2", "--warmup", "1", "--out", out_json],
                   capture_output=True, text=True, timeout=120,
                   env=dict(os.environ, PATH=fake + os.pathsep + os.environ["PATH"]))
try:
    res = json.load(open(out_json))
except (OSError, ValueError):
    res = {}
z, t = res.get("gpt2", {}).get("ztrain", {}), res.get("gpt2", {}).get("torch_eager", {})
fpt = bench_gpu.flops_per_token(bench_gpu.GPT2, bench_gpu.gpt2_params(bench_gpu.GPT2))
check(p.returncode == 1 and res.get("device") == "NVIDIA H100 80GB HBM3" and
      z.get("tokens_per_s") == 100000.0 and z.get("mfu") == 100000.0 * fpt / 989e12,
      f"ztrain's tokens/s and MFU without PyTorch's CUDA: exit {p.returncode} {z} "
      f"{p.stderr.strip()[-300:]}")
check("torch.cuda.is_available() is False" in t.get("error", "") or
      "import torch failed" in t.get("error", ""),
      f"the PyTorch run fails alone, saying why: {t}")
check(p.stderr.strip().splitlines()[-1:] == ["bench_gpu: no figure from gpt2 torch_eager"],
      f"a run without a figure fails the benchmark, named in its last line: {p.stderr[-300:]}")
shutil.rmtree(fake, ignore_errors=True)
p = run([BENCH, "--micro-batch", "0", "--dry-run"])
check(p.returncode == 2 and "--micro-batch" in p.stderr, "a micro-batch of 0 is refused")
p = run([BENCH])
check(p.returncode != 0 and ("GPU" in p.stderr or "CUDA" in p.stderr or "cuda" in p.stderr),
      f"without a GPU bench_gpu says so and fails: {p.stderr.strip()[-300:]}")
ck.done()
