#!/usr/bin/python3
"""ztrain's mixed-precision conversions against PyTorch's own casts, on every code path this CPU
has.

$ZTRAIN_BUILD/zt_cast_tool runs the CPU backend's to_half, from_half, round_to, accumulate_half and
sum_squares_half over raw files. The references are torch's .to(torch.bfloat16) / .to(torch.float16)
and .float() (viewed as 16-bit or 32-bit patterns), and numpy's float64 sum of squares.

Inputs: all 65536 16-bit patterns for from_half; for to_half and round_to a few million fp32 values:
random bit patterns over the whole range, random values inside the binary16 range and among fp32
subnormals, every power of two with its bit neighbours, every 16-bit value with its fp32 neighbours,
every halfway point between consecutive 16-bit values (ties to even) with its neighbours, the
largest finite values and the overflow thresholds, ±0, ±inf and NaNs.

Pass condition: bitwise equality, except that a NaN only has to be a NaN (torch writes its own
canonical NaN); ztrain's NaNs are separately required to keep the input's sign and be quiet.
round_to must equal from_half(to_half(x)) bit for bit, NaNs included. sum_squares_half must be
within 1e-12 relative of numpy, +inf when an element is inf, NaN when one is NaN, and the same bits
with 1, 2 and 3 threads. Every path must give the same bits as the first, NaN payloads included.

Each path is selected with ZTRAIN_CAST_ISA (portable, avx2, avx512), for those /proc/cpuinfo lists.
"""
import os
import tempfile

import numpy as np
import torch

from ztref import Checker, run, tool, cpu_paths

TOOL = tool("zt_cast_tool")
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
rng = np.random.default_rng(20240611)


def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bits32(x):
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def all_halves(name):
    """Every 16-bit pattern, and the fp32 value of each (exact, from the bit layout)."""
    h = np.arange(65536, dtype=np.uint32)
    if name == "bf16":
        return h.astype(np.uint16), f32(h << 16)
    x = torch.from_numpy(h.astype(np.uint16).view(np.int16)).view(torch.float16).float().numpy()
    return h.astype(np.uint16), x


def neighbours(bits, k):
    """bits and the k fp32 patterns either side of each (wrapping, which stays inside uint32)."""
    bits = np.asarray(bits, dtype=np.uint32)
    return np.concatenate([bits + np.uint32(d) if d >= 0 else bits - np.uint32(-d)
                           for d in range(-k, k + 1)])


def to_half_inputs():
    parts = [rng.integers(0, 2**32, size=4_000_000, dtype=np.uint64).astype(np.uint32)]
    # Random values inside and around binary16's range (2^-26 .. 2^17), and random fp32 subnormals.
    mant = rng.integers(0, 2**23, size=1_000_000, dtype=np.uint32)
    exp = rng.integers(127 - 26, 127 + 17, size=1_000_000, dtype=np.uint32)
    sign = rng.integers(0, 2, size=1_000_000, dtype=np.uint32) << 31
    parts.append(sign | (exp << 23) | mant)
    parts.append((rng.integers(0, 2, size=300_000, dtype=np.uint32) << 31)
                 | rng.integers(0, 2**23, size=300_000, dtype=np.uint32))
    # Every power of two an fp32 holds (subnormal ones included) and its neighbours.
    pow2 = bits32(np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32))
    parts.append(neighbours(pow2, 4))
    # Every 16-bit value, the halfway points between consecutive ones, and their neighbours.
    bf_h = np.arange(65536, dtype=np.uint32)
    parts.append(neighbours(bf_h << 16, 2))
    parts.append(neighbours((bf_h << 16) + 0x8000, 2))
    _, f16_x = all_halves("f16")
    finite = np.arange(0, 0x7C00)
    lo = f16_x[finite].astype(np.float64)
    hi = np.append(f16_x[1:0x7C00].astype(np.float64), 65520.0 + 16.0)  # past the top: 65536
    mid = ((lo + hi) / 2).astype(np.float32)  # exact: 12 significant bits
    parts.append(neighbours(bits32(f16_x[finite]), 2))
    parts.append(neighbours(bits32(mid), 2))
    # Specials and thresholds, both signs.
    special = [0x00000000, 0x7F800000, 0x7F7FFFFF, 0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001,
               0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000,  # 65504, 65520, 65536
               0x33000000, 0x33000001, 0x337FFFFF, 0x33800000, 0x33C00000,  # around 2^-25, 2^-24
               0x387FC000, 0x387FE000, 0x387FFFFF, 0x38800000,  # largest f16 subnormal region
               0x007FFFFF, 0x00800000, 0x00000001, 0x00008000, 0x00008001, 0x00018000,
               0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0x7FFFFFFF, 0x7FA00000, 0x7F801000,
               0x7F810000, 0x7FC0FFFF]
    special = np.array(special, dtype=np.uint32)
    parts.append(np.concatenate([special, special | np.uint32(0x80000000)]))
    bits = np.concatenate(parts)
    return bits, f32(bits)


def is_nan16(h, name):
    h = h.astype(np.uint32) & 0x7FFF
    return h > (0x7F80 if name == "bf16" else 0x7C00)


def nan_ok(ours_nan_bits, sign_bits, name, width):
    """ztrain's NaNs keep the input's sign and have the quiet bit set."""
    b = ours_nan_bits.astype(np.uint32)
    if width == 16:
        quiet = 0x0040 if name == "bf16" else 0x0200
        sign_ok = (b >> 15) == sign_bits
    else:
        quiet = 0x00400000
        sign_ok = (b >> 31) == sign_bits
    return bool(np.all(sign_ok) and np.all(b & quiet))


def compare16(c, what, ours, ref, name):
    nan_ref = is_nan16(ref, name)
    nan_ours = is_nan16(ours, name)
    bad = (ours != ref) & ~(nan_ref & nan_ours)
    n_bad = int(bad.sum())
    if n_bad:
        i = np.flatnonzero(bad)[:3]
        print(f"      e.g. index {i.tolist()}: ours {[hex(v) for v in ours[i]]}"
              f" torch {[hex(v) for v in ref[i]]}")
    c.check(n_bad == 0, f"{what}: {len(ours)} values, {n_bad} differ from torch "
                        f"({int(nan_ref.sum())} NaNs compared as NaN)")
    return nan_ours


def compare32(c, what, ours_f, ref_f):
    ours, ref = bits32(ours_f), bits32(ref_f)
    both_nan = np.isnan(ours_f) & np.isnan(ref_f)
    bad = (ours != ref) & ~both_nan
    n_bad = int(bad.sum())
    if n_bad:
        i = np.flatnonzero(bad)[:3]
        print(f"      e.g. index {i.tolist()}: ours {[hex(v) for v in ours[i]]}"
              f" torch {[hex(v) for v in ref[i]]}")
    c.check(n_bad == 0, f"{what}: {len(ours)} values, {n_bad} differ from torch "
                        f"({int(np.isnan(ref_f).sum())} NaNs compared as NaN)")


def torch_to16(x, name):
    return torch.from_numpy(x).to(DTYPES[name]).view(torch.int16).numpy().view(np.uint16)


def torch_from16(h, name):
    return torch.from_numpy(h.view(np.int16)).view(DTYPES[name]).float().numpy()


def cast(d, env, op, name, *arrays_and_out):
    """Writes the input arrays, runs the tool, returns the output file's path."""
    args, paths = [], []
    for k, a in enumerate(arrays_and_out[:-1]):
        p = os.path.join(d, f"in{k}.bin")
        a.tofile(p)
        args.append(p)
    out = os.path.join(d, arrays_and_out[-1])
    run([TOOL, op, name] + args + [out], env=env)
    return out


def sumsq(d, env, name, h):
    p = os.path.join(d, "sumsq.u16")
    h.tofile(p)
    return float(run([TOOL, "sumsq", name, p], env=env).stdout)


def accumulate_inputs(name, n=1_000_003):
    """Random finite 16-bit accumulators with every 16-bit pattern mixed in, and addends from far
    below to far above them: exact cancellation, sums in the subnormal range, overflow, NaN."""
    h, _ = all_halves(name)
    a = rng.integers(0, 65536, size=n, dtype=np.uint32).astype(np.uint16)
    a &= np.uint16(0x8000 | (0x7F7F if name == "bf16" else 0x7BFF))
    a[:len(h)] = np.where(rng.random(len(h)) < 0.5, h, a[:len(h)])
    af = torch_from16(a, name)
    with np.errstate(all="ignore"):
        scale = np.ldexp(np.float32(1), rng.integers(-30, 12, size=n)).astype(np.float32)
        b = (af * rng.standard_normal(n).astype(np.float32) * scale).astype(np.float32)
    b[::7] = -af[::7]
    b[1::7] = f32(rng.integers(0, 2**32, size=len(b[1::7]), dtype=np.uint64).astype(np.uint32))
    b[2::7] = (rng.standard_normal(len(b[2::7])) * 1e-5).astype(np.float32)
    ref = (torch.from_numpy(af) + torch.from_numpy(b)).to(DTYPES[name])
    return a, b, ref.view(torch.int16).numpy().view(np.uint16)


def sumsq_inputs(name, n=2_500_007):
    """Random finite 16-bit values over several thread chunks and a tail, and numpy's sum."""
    s = rng.integers(0, 65536, size=n, dtype=np.uint32).astype(np.uint16)
    inf16 = 0x7F80 if name == "bf16" else 0x7C00
    s[(s & 0x7FFF) >= inf16] = 0
    sv = torch_from16(s, name).astype(np.float64)
    return s, float(np.sum(sv * sv))


def main():
    c = Checker()
    x_bits, x = to_half_inputs()
    x_sign = x_bits >> 31
    x_nan = np.isnan(x)
    print(f"to_half inputs: {len(x)} fp32 values ({int(x_nan.sum())} NaNs)")
    acc_in = {name: accumulate_inputs(name) for name in DTYPES}
    ss_in = {name: sumsq_inputs(name) for name in DTYPES}

    # (op, dtype) -> (first path, its output bytes), for the every-path-agrees checks.
    first = {}

    def same_on_every_path(c, op, name, path, out):
        key = (op, name)
        if key not in first:
            first[key] = (path, out.tobytes())
            return
        c.check(out.tobytes() == first[key][1],
                f"{op} {name} [{path}]: same bits as [{first[key][0]}], NaN payloads included")

    with tempfile.TemporaryDirectory() as d:
        for path in cpu_paths():
            env = dict(os.environ, ZTRAIN_CAST_ISA=path)
            for name in DTYPES:
                tag = f"{name} [{path}]"

                # from_half over every 16-bit pattern.
                h, _ = all_halves(name)
                ours = np.fromfile(cast(d, env, "from", name, h, "from.f32"), dtype=np.float32)
                compare32(c, f"from_half {tag} all 65536 patterns", ours, torch_from16(h, name))
                nan_in = is_nan16(h, name)
                c.check(nan_ok(bits32(ours[nan_in]), h[nan_in].astype(np.uint32) >> 15, name, 32),
                        f"from_half {tag}: {int(nan_in.sum())} NaNs stay quiet NaNs of their sign")
                same_on_every_path(c, "from_half", name, path, ours)

                # to_half.
                ours16 = np.fromfile(cast(d, env, "to", name, x, "to.u16"), dtype=np.uint16)
                ref16 = torch_to16(x, name)
                nan_ours = compare16(c, f"to_half {tag}", ours16, ref16, name)
                c.check(np.array_equal(nan_ours, x_nan)
                        and nan_ok(ours16[x_nan], x_sign[x_nan], name, 16),
                        f"to_half {tag}: exactly the NaN inputs give NaNs, quiet, sign kept")
                same_on_every_path(c, "to_half", name, path, ours16)

                # round_to: torch's round trip, and ztrain's own from_half(to_half(x)) exactly.
                rounded = np.fromfile(cast(d, env, "round", name, x, "round.f32"), dtype=np.float32)
                compare32(c, f"round_to {tag}", rounded, torch_from16(ref16, name))
                trip = np.fromfile(cast(d, env, "from", name, ours16, "trip.f32"), dtype=np.float32)
                c.check(np.array_equal(bits32(rounded), bits32(trip)),
                        f"round_to {tag} == from_half(to_half(x)) bit for bit, NaNs included")
                same_on_every_path(c, "round_to", name, path, rounded)

                # accumulate_half: torch's (a.float() + b).to(dtype).
                a, b, ref_acc = acc_in[name]
                ours_acc = np.fromfile(cast(d, env, "accumulate", name, a, b, "acc.u16"),
                                       dtype=np.uint16)
                compare16(c, f"accumulate_half {tag}", ours_acc, ref_acc, name)
                same_on_every_path(c, "accumulate_half", name, path, ours_acc)

                # sum_squares_half.
                s, ref_ss = ss_in[name]
                got = {t: sumsq(d, dict(env, OMP_NUM_THREADS=str(t)), name, s) for t in (1, 2, 3)}
                rel = abs(got[2] - ref_ss) / ref_ss
                c.check(rel <= 1e-12, f"sum_squares_half {tag}: {got[2]:.17g} vs numpy "
                                      f"{ref_ss:.17g}, rel {rel:.1e}")
                c.check(got[1] == got[2] == got[3],
                        f"sum_squares_half {tag}: same bits with 1, 2 and 3 threads")
                same_on_every_path(c, "sum_squares_half", name, path, np.float64(got[2]))
                inf16 = 0x7F80 if name == "bf16" else 0x7C00
                nan16 = 0x7FC0 if name == "bf16" else 0x7E00
                for what, v, want_nan in (("+inf", inf16, False), ("-inf", inf16 | 0x8000, False),
                                          ("NaN", nan16, True)):
                    t = s[:100_003].copy()
                    t[77_777] = v
                    r = sumsq(d, env, name, t)
                    c.check(r != r if want_nan else r == float("inf"),
                            f"sum_squares_half {tag} with one {what}: {r}")
                c.check(sumsq(d, env, name, s[:0]) == 0.0, f"sum_squares_half {tag} of nothing: 0")
    c.done()


if __name__ == "__main__":
    main()
