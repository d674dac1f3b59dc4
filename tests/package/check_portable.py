"""Whether x86-64 programs run on any x86-64 CPU: outside the CPU kernels that ztrain picks at
run time (kernels/cpu/isa.c asks CPUID, then calls the functions whose names end in _avx2 or
_avx512, compiled with __attribute__((target(...)))), no instruction may need more than the
x86-64 baseline, which has SSE2 and nothing newer. A build with -march=native (ZT_NATIVE=ON, the
development default) fails this on a machine with AVX2 or AVX-512: the compiler then uses those
instructions everywhere, and the program dies with SIGILL on an older CPU.

    /usr/bin/python3 tests/package/check_portable.py PROGRAM...

Reads `objdump -d` of each program (binutils) and looks, function by function, for what the
baseline lacks: VEX/EVEX instructions (AVX, AVX2, FMA, F16C, AVX-512: the mnemonics that start
with 'v', apart from VMX's and verr/verw), the ymm, zmm and k registers, and BMI1/BMI2's integer
instructions. It also checks that the run-time kernels are there (an _avx512 function with zmm
registers), so that a build that lost them does not pass for a portable one, and that the _avx2
kernels use no AVX-512 register (they run on CPUs without it). Exit 0 when every
program passes, 1 otherwise, naming the functions and an instruction of each. On another
architecture than x86-64 there is nothing to check (exit 0, saying so)."""
import re
import subprocess
import sys

# Dispatched at run time by CPUID: their clones (.constprop.0, .part.0, OpenMP's ._omp_fn.0)
# keep the name.
RUNTIME_PICKED = re.compile(r"_(avx2|avx512)(\.|$)")
FUNCTION = re.compile(r"^[0-9a-f]+ <(.+)>:$")
# "  4011d6:\tvmovups %zmm0,(%rax)" with --no-show-raw-insn.
INSN = re.compile(r"^\s*[0-9a-f]+:\s+(?:\{\w+\}\s+)?(\S+)\s*(.*)$")
VMX = {"vmcall", "vmlaunch", "vmresume", "vmxoff", "vmxon", "vmread", "vmwrite", "vmptrld",
       "vmptrst", "vmclear", "vmfunc", "vmrun", "vmload", "vmsave", "vmmcall", "verr", "verw"}
# BMI1 and BMI2 (tzcnt is left out: it is `rep bsf`, which older CPUs run as bsf, and GCC emits
# it for the baseline too).
BMI = {"andn", "bextr", "blsi", "blsmsk", "blsr", "bzhi", "mulx", "pdep", "pext", "rorx",
       "sarx", "shlx", "shrx"}
WIDE_REGISTER = re.compile(r"%(?:ymm|zmm)\d+|%k[0-7]\b")
AVX512_REGISTER = re.compile(r"%zmm\d+|%k[0-7]\b|%[xy]mm(?:1[6-9]|2\d|3[01])\b")


def beyond_baseline(mnemonic, operands):
    m = mnemonic.split(".")[0]
    if m.startswith("v") and m not in VMX:
        return True
    return m in BMI or WIDE_REGISTER.search(operands) is not None


def check(path):
    """(offending functions {name: an instruction}, whether an _avx512 kernel uses zmm)."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                         text=True, check=True).stdout
    bad, wide_kernel, fn = {}, False, "?"
    for line in out.splitlines():
        m = FUNCTION.match(line)
        if m:
            fn = m.group(1)
            continue
        m = INSN.match(line)
        if not m:
            continue
        mnemonic, operands = m.groups()
        picked = RUNTIME_PICKED.search(fn)
        if picked and picked.group(1) == "avx512":
            wide_kernel |= "%zmm" in operands
        elif picked:
            # An AVX2 kernel runs on AVX2 CPUs without AVX-512: no zmm, k or upper 16 registers.
            if fn not in bad and AVX512_REGISTER.search(operands):
                bad[fn] = f"{mnemonic} {operands}".strip()
        elif fn not in bad and beyond_baseline(mnemonic, operands):
            bad[fn] = f"{mnemonic} {operands}".strip()
    return bad, wide_kernel


def main():
    programs = sys.argv[1:]
    if not programs:
        sys.exit(__doc__)
    arch = subprocess.run(["objdump", "-f", programs[0]], capture_output=True,
                          text=True).stdout
    if "x86-64" not in arch:
        print("check_portable: not an x86-64 program, nothing to check")
        return
    failed = 0
    for path in programs:
        bad, wide_kernel = check(path)
        if bad:
            failed += 1
            shown = "; ".join(f"{f}: {i}" for f, i in sorted(bad.items())[:8])
            print(f"FAIL  {path}: {len(bad)} function(s) use instructions that the CPUs they "
                  "run on may lack (beyond x86-64's baseline outside the kernels picked at run "
                  f"time, or AVX-512 in an _avx2 kernel; built with -march=native?): {shown}")
        else:
            print(f"ok    {path}: nothing beyond x86-64's baseline outside the kernels picked "
                  "at run time")
        if "ztrain-worker" in path:
            if not wide_kernel:
                failed += 1
            print(("ok    " if wide_kernel else "FAIL  ") + f"{path}: the AVX-512 kernels "
                  "picked at run time are there")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
