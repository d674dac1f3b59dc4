#!/usr/bin/python3
"""ztrain's optimizer against torch.optim over ten steps of a million parameters, on every
instruction-set path this CPU has; and the fused mixed-precision Adam kernel against torch and
against the engine's four-pass path.

Random parameters (several tensors' worth, concatenated into one flat slice as the engine holds
them) and a fresh random gradient per step are written as raw float32 files;
$ZTRAIN_BUILD/zt_optim_dump runs ztrain's optimizer, configured by a DeepSpeed config, over them,
and the final parameters are compared with torch.optim.AdamW, torch.optim.Adam (the L2 mode that
"adam_w_mode": false selects), torch.optim.SGD (maximize among its cases), and a plain torch
transcription of Adam without bias correction (torch has no switch for that).

The measure, element by element: rel = |ztrain - torch| / max(|torch|, rms(torch)), i.e. the
relative error, where values smaller than the parameters' RMS (~0.5 here) are held to an absolute
error relative to the RMS. The floor is the RMS rather than a fixed 1e-3 because a parameter that
starts near 0.5 and ends near 0 carries rounding errors of a few ulps of 0.5 (~1e-7) in torch and
ztrain alike; both are that close to a float64 run. Every case must have max rel <= 1e-5; the
torch.optim.AdamW cases max rel < 1e-6. The norm-relative error is printed as well.

Each path (portable, avx2, avx512: those /proc/cpuinfo lists) is forced in turn with
ZTRAIN_OPTIM_ISA, checked with `zt_optim_dump --isa`, and every case must give the same bits on
every path.

Mixed precision (`zt_optim_dump --mixed`): bf16 and fp16 gradients (the fp32 ones times a loss scale
of 1024, rounded to 16 bits; the last step's are tiny, so fp16 gets subnormals) multiplied by
grad_mul = 1/(1024 * 1.25) (unscale and a clipping factor), ten AdamW steps on fp32 masters, 16-bit
parameters out. Pass conditions, on every path: the 16-bit parameters equal torch's cast of ztrain's
fp32 masters bit for bit; the masters are within rel < 1e-6 of torch.optim.AdamW run on the same
16-bit gradients widened with .float() and multiplied by grad_mul in fp32; and masters, moments and
16-bit parameters equal, bit for bit, those of the engine's four-pass path (from_half, scale,
adam_update, to_half through a 64K-float buffer) on the same path. Then an edge set (all 65536
16-bit gradient patterns, random fp32 bit patterns, infinities, NaNs, subnormals, parameters past
the 16-bit ranges, a slice of 3*65536+11) for every gradient type (f32, bf16, f16) times every
output (bf16, f16, none), AdamW and L2-mode Adam: fused equals four-pass, and every path the
same bits, NaNs included; the 16-bit output equals torch's cast except that a NaN need only be
a NaN.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

from ztref import cpu_paths, tool

REL_TOL = 1e-5
ADAMW_REL_TOL = 1e-6
STEPS = 10
# An odd total, so slice and thread-chunk tails are exercised.
SHAPES = [(768, 768), (256, 1024), (384, 384), (1031,), (7,)]

TOOL = tool("zt_optim_dump")

LOSS_SCALE = 1024.0
GRAD_MUL = np.float32(1.0 / (LOSS_SCALE * 1.25))
HALF = {"bf16": torch.bfloat16, "f16": torch.float16}
ADAMW = {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                     "weight_decay": 0.1}}
ADAM_L2 = {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.8, 0.99], "eps": 1e-6,
                                      "weight_decay": 0.01, "adam_w_mode": False}}


def path_env(path):
    """Forces the optimizer's path, and the cast kernels' (the four-pass reference uses them)."""
    return dict(os.environ, ZTRAIN_OPTIM_ISA=path, ZTRAIN_CAST_ISA=path)


def run_tool(args, path, what):
    proc = subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=120, env=path_env(path))
    if proc.returncode != 0:
        print(f"FAIL {what}: zt_optim_dump exited {proc.returncode}: {proc.stderr.strip()}")
        return None
    return proc.stdout


def make_data():
    g = torch.Generator().manual_seed(1234)
    params = [torch.randn(s, generator=g) * 0.5 for s in SHAPES]
    grads = []
    for step in range(STEPS):
        # Gradient scales change from step to step so the moments see more than one magnitude.
        scale = 10.0 ** (-3 + (step % 4))
        grads.append([torch.randn(s, generator=g) * scale for s in SHAPES])
    return params, grads


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors]).numpy().astype(np.float32)


def torch_run(params, grads, make_opt):
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = make_opt(ps)
    for step_grads in grads:
        for p, gr in zip(ps, step_grads):
            p.grad = gr.clone()
        opt.step()
    return flat([p.detach() for p in ps])


def adam_no_bias_correction(params, grads, lr, betas, eps, weight_decay):
    """DeepSpeed's Adam with bias_correction false, decoupled decay, in fp32 torch ops."""
    b1, b2 = betas
    ps = [p.clone() for p in params]
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    for step_grads in grads:
        for p, m, v, gr in zip(ps, ms, vs, step_grads):
            p.mul_(1 - lr * weight_decay)
            m.mul_(b1).add_(gr, alpha=1 - b1)
            v.mul_(b2).addcmul_(gr, gr, value=1 - b2)
            p.addcdiv_(m, v.sqrt().add_(eps), value=-lr)
    return flat(ps)


# name, DeepSpeed optimizer section, torch reference (None: adam_no_bias_correction), bound.
CASES = [
    ("adamw", ADAMW,
     lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
     ADAMW_REL_TOL),
    ("adam_default_is_decoupled", {"type": "Adam", "params": {"lr": 3e-3, "weight_decay": 0.05}},
     lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.05), ADAMW_REL_TOL),
    ("adam_l2_mode", ADAM_L2,
     lambda ps: torch.optim.Adam(ps, lr=1e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01),
     REL_TOL),
    ("adam_no_bias_correction", {"type": "AdamW", "params": {
        "lr": 1e-3, "betas": [0.9, 0.999], "weight_decay": 0.01, "bias_correction": False}},
     None, REL_TOL),
    ("sgd", {"type": "SGD", "params": {"lr": 0.1}},
     lambda ps: torch.optim.SGD(ps, lr=0.1), REL_TOL),
    ("sgd_momentum_wd", {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9,
                                                    "weight_decay": 1e-3}},
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3), REL_TOL),
    ("sgd_dampening", {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.8, "dampening": 0.3}},
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, dampening=0.3), REL_TOL),
    ("sgd_nesterov", {"type": "SGD", "params": {"lr": 0.02, "momentum": 0.9, "nesterov": True,
                                                 "weight_decay": 1e-2}},
     lambda ps: torch.optim.SGD(ps, lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-2),
     REL_TOL),
    # maximize (torch_adam: torch.optim.Adam/AdamW): the gradient negated before anything else.
    ("adamw_maximize", {"type": "AdamW", "params": {
        "lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True,
        "maximize": True}},
     lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  maximize=True),
     ADAMW_REL_TOL),
    ("adam_l2_maximize", {"type": "Adam", "params": {
        "lr": 1e-3, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.01, "adam_w_mode": False,
        "torch_adam": True, "maximize": True}},
     lambda ps: torch.optim.Adam(ps, lr=1e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01,
                                 maximize=True),
     REL_TOL),
    # maximize: torch negates the gradient before the decay and the momentum.
    ("sgd_maximize", {"type": "SGD", "params": {"lr": 0.02, "momentum": 0.9, "nesterov": True,
                                                 "weight_decay": 1e-2, "maximize": True}},
     lambda ps: torch.optim.SGD(ps, lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-2,
                                maximize=True),
     REL_TOL),
]


def write_config(tmp, name, optimizer):
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "optimizer": optimizer}
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def compare(got, want, start):
    """(max rel, index of it, norm-relative error, description) by the measure above."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    rms = float(np.sqrt(np.mean(want64 ** 2)))
    rel = np.abs(got64 - want64) / np.maximum(np.abs(want64), rms)
    worst = int(np.argmax(rel))
    norm_rel = float(np.linalg.norm(got64 - want64) / np.linalg.norm(want64))
    moved = float(np.max(np.abs(want64 - start)))
    line = (f"max rel err {rel[worst]:.2e} (at {worst}: ztrain {got[worst]!r}, "
            f"torch {want[worst]!r}), norm-relative err {norm_rel:.2e}, max |change| {moved:.3g}")
    ok = bool(np.all(np.isfinite(got))) and rel[worst] <= 1.0 and np.isfinite(rel[worst])
    return float(rel[worst]), ok, line


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def run_case(tmp, paths, params_path, grads_path, params, grads, name, optimizer, make_opt, tol):
    cfg_path = write_config(tmp, name, optimizer)
    if make_opt is None:
        p = optimizer["params"]
        want = adam_no_bias_correction(params, grads, p["lr"], p["betas"], 1e-8, p["weight_decay"])
    else:
        want = torch_run(params, grads, make_opt)
    failed, first = 0, None
    for path in paths:
        out_path = os.path.join(tmp, f"{name}.{path}.out.f32")
        if run_tool([cfg_path, params_path, grads_path, STEPS, out_path], path,
                    f"{name} [{path}]") is None:
            failed += 1
            continue
        got = np.fromfile(out_path, dtype=np.float32)
        if got.shape != want.shape:
            print(f"FAIL {name} [{path}]: {got.size} parameters back, expected {want.size}")
            failed += 1
            continue
        rel, ok, line = compare(got, want, flat(params).astype(np.float64))
        ok = ok and rel < tol
        print(f"{'PASS' if ok else 'FAIL'} {name} [{path}]: {line} (bound {tol:g})")
        failed += not ok
        if first is None:
            first = (path, got)
        elif not same_bits(got, first[1]):
            print(f"FAIL {name}: [{path}] and [{first[0]}] differ in "
                  f"{int(np.sum(got.view(np.uint32) != first[1].view(np.uint32)))} elements")
            failed += 1
    return failed


# ---- mixed precision ---------------------------------------------------------------------------

def half_bits(x, dtype):
    """torch's cast of fp32 values to a 16-bit type, as raw bits."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(HALF[dtype]) \
        .view(torch.int16).numpy().view(np.uint16)


def widen(bits, dtype):
    return torch.from_numpy(bits.view(np.int16).copy()).view(HALF[dtype]).float()


def is_nan16(h, dtype):
    return (h.astype(np.uint32) & 0x7FFF) > (0x7F80 if dtype == "bf16" else 0x7C00)


def mixed_outputs(prefix, out_type):
    out = {k: np.fromfile(f"{prefix}.{k}.f32", dtype=np.float32) for k in ("master", "m", "v")}
    if out_type != "none":
        out["param16"] = np.fromfile(f"{prefix}.param16", dtype=np.uint16)
    return out


def run_mixed(tmp, cfg_path, grad_type, out_type, params_path, grads_path, steps, tag, path,
              mode):
    prefix = os.path.join(tmp, f"{tag}.{grad_type}.{out_type}.{path}.{mode}")
    if run_tool(["--mixed", cfg_path, grad_type, out_type, repr(float(GRAD_MUL)), params_path,
                 grads_path, steps, prefix, mode], path,
                f"{tag} {grad_type}->{out_type} [{path}] {mode}") is None:
        return None
    return mixed_outputs(prefix, out_type)


def first_difference(a, b):
    """None when every output of two mixed runs has the same bits, else what differs."""
    for k in a:
        if not same_bits(a[k], b[k]):
            word = np.uint16 if a[k].itemsize == 2 else np.uint32
            bad = np.flatnonzero(a[k].view(word) != b[k].view(word))
            return f"{k} differs in {bad.size} elements (first {bad[:3].tolist()})"
    return None


def mixed_data(dtype):
    """Parameters as the fp32 cases; 16-bit gradients = fp32 ones times the loss scale."""
    g = torch.Generator().manual_seed(4321)
    params = [torch.randn(s, generator=g) * 0.5 for s in SHAPES]
    grads16 = []
    for step in range(STEPS):
        scale = 1e-7 if step == STEPS - 1 else 10.0 ** (-3 + (step % 4))
        gr = torch.cat([(torch.randn(s, generator=g) * scale).reshape(-1) for s in SHAPES])
        grads16.append((gr * LOSS_SCALE).to(HALF[dtype]).view(torch.int16).numpy().view(np.uint16))
    return params, grads16


def check_mixed(tmp, paths, dtype):
    params, grads16 = mixed_data(dtype)
    n = sum(p.numel() for p in params)
    params_path = os.path.join(tmp, f"mixed_{dtype}.params.f32")
    grads_path = os.path.join(tmp, f"mixed_{dtype}.grads.u16")
    flat(params).tofile(params_path)
    np.concatenate(grads16).tofile(grads_path)
    subnormal = sum(int(np.sum(((g & 0x7FFF) > 0) & ((g & 0x7FFF) < (0x0080 if dtype == "bf16"
                                                                     else 0x0400))))
                    for g in grads16)
    cfg_path = write_config(tmp, "mixed", ADAMW)
    # torch.optim.AdamW on the same 16-bit gradients, widened and multiplied by grad_mul in fp32.
    p_ref = torch.nn.Parameter(torch.from_numpy(flat(params)))
    opt = torch.optim.AdamW([p_ref], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    mul = torch.tensor(GRAD_MUL, dtype=torch.float32)
    for g16 in grads16:
        p_ref.grad = widen(g16, dtype) * mul
        opt.step()
    want = p_ref.detach().numpy()
    failed, first = 0, None
    for path in paths:
        fused = run_mixed(tmp, cfg_path, dtype, dtype, params_path, grads_path, STEPS, "mixed",
                          path, "fused")
        four = run_mixed(tmp, cfg_path, dtype, dtype, params_path, grads_path, STEPS, "mixed",
                         path, "4pass")
        if fused is None or four is None:
            failed += 1
            continue
        what = f"mixed {dtype} grads -> {dtype} params [{path}]"
        rel, ok, line = compare(fused["master"], want, flat(params).astype(np.float64))
        ok = ok and rel < ADAMW_REL_TOL
        print(f"{'PASS' if ok else 'FAIL'} {what}: masters vs torch.optim.AdamW: {line} "
              f"(bound {ADAMW_REL_TOL:g}; {subnormal} subnormal gradients)")
        failed += not ok
        cast = half_bits(fused["master"], dtype)
        n_bad = int(np.sum(cast != fused["param16"]))
        print(f"{'PASS' if n_bad == 0 else 'FAIL'} {what}: {dtype} parameters vs torch's cast of "
              f"the masters: {n_bad} of {n} differ")
        failed += n_bad != 0
        diff = first_difference(fused, four)
        print(f"{'PASS' if diff is None else 'FAIL'} {what}: fused vs four-pass: "
              f"{diff or 'masters, m, v and 16-bit parameters bit-identical'}")
        failed += diff is not None
        if first is None:
            first = (path, fused)
        else:
            diff = first_difference(fused, first[1])
            if diff:
                print(f"FAIL {what}: vs [{first[0]}]: {diff}")
                failed += 1
    return failed


def edge_data(rng, n, grad_type):
    """Gradients and parameters full of the values conversions and updates get wrong."""
    params = (rng.standard_normal(n) * 0.5).astype(np.float32)
    k = n // 16
    special = np.array([0.0, -0.0, 1e-40, -1e-40, 3e-8, -6e-5, 7e4, -7e4, 65504.0, 65520.0,
                        3.39e38, -3.4e38, 1e-6, 2.0 ** -24, 2.0 ** -25, np.inf, -np.inf, np.nan],
                       dtype=np.float32)
    params[:k] = rng.choice(special, size=k)
    grads = []
    for step in range(3):
        if grad_type == "f32":
            g = rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)
            g[k:] = (rng.standard_normal(n - k) * 10.0 ** (-step)).astype(np.float32)
            g[k:2 * k] = rng.choice(special, size=k)
        else:
            g = half_bits((rng.standard_normal(n) * LOSS_SCALE * 10.0 ** (-2 * step))
                          .astype(np.float32), grad_type)
            if step == 0:
                g[:65536] = rng.permutation(65536).astype(np.uint16)
            else:
                g[:k] = rng.integers(0, 65536, size=k).astype(np.uint16)
        grads.append(g)
    return params, grads


def check_edges(tmp, paths):
    n = 3 * 65536 + 11
    rng = np.random.default_rng(20240901)
    failed = 0
    configs = (("adamw", write_config(tmp, "edge_adamw", ADAMW)),
               ("adam_l2", write_config(tmp, "edge_adam_l2", ADAM_L2)))
    for grad_type in ("f32", "bf16", "f16"):
        params, grads = edge_data(rng, n, grad_type)
        params_path = os.path.join(tmp, f"edge_{grad_type}.params.f32")
        grads_path = os.path.join(tmp, f"edge_{grad_type}.grads")
        params.tofile(params_path)
        np.concatenate(grads).tofile(grads_path)
        for cname, cfg_path in configs:
            for out_type in ("bf16", "f16", "none"):
                what = f"edges {cname} {grad_type} grads -> {out_type}"
                results, problems = [], []
                for path in paths:
                    for mode in ("fused", "4pass"):
                        r = run_mixed(tmp, cfg_path, grad_type, out_type, params_path, grads_path,
                                      3, "edge_" + cname, path, mode)
                        if r is None:
                            problems.append(f"[{path}] {mode} failed")
                        else:
                            results.append((f"[{path}] {mode}", r))
                for label, r in results[1:]:
                    diff = first_difference(r, results[0][1])
                    if diff:
                        problems.append(f"{label} vs {results[0][0]}: {diff}")
                if results and out_type != "none":
                    ours = results[0][1]["param16"]
                    cast = half_bits(results[0][1]["master"], out_type)
                    both_nan = is_nan16(ours, out_type) & is_nan16(cast, out_type)
                    n_bad = int(np.sum((ours != cast) & ~both_nan))
                    if n_bad:
                        problems.append(f"16-bit parameters differ from torch's cast in {n_bad}")
                nan = int(np.sum(np.isnan(results[0][1]["master"]))) if results else 0
                print(f"{'FAIL' if problems else 'PASS'} {what}: {len(results)} runs "
                      f"({', '.join(paths)} x fused, 4pass) bit-identical ({nan} NaN masters)"
                      + (": " + "; ".join(problems) if problems else ""))
                failed += bool(problems)
    return failed


def main():
    torch.set_num_threads(2)
    if not os.access(TOOL, os.X_OK):
        print(f"FAIL: {TOOL} not built (set ZTRAIN_BUILD to the build directory)")
        return 1
    paths = cpu_paths()
    failed = 0
    for path in paths:
        got = run_tool(["--isa"], path, f"--isa [{path}]")
        ok = got is not None and got.strip() == path
        print(f"{'PASS' if ok else 'FAIL'} ZTRAIN_OPTIM_ISA={path} selects {got and got.strip()}")
        failed += not ok
    params, grads = make_data()
    n = sum(p.numel() for p in params)
    print(f"{n} parameters in {len(SHAPES)} tensors, {STEPS} steps, paths {', '.join(paths)}")
    with tempfile.TemporaryDirectory(prefix="zt_optim_") as tmp:
        params_path = os.path.join(tmp, "params.f32")
        grads_path = os.path.join(tmp, "grads.f32")
        flat(params).tofile(params_path)
        np.concatenate([flat(g) for g in grads]).tofile(grads_path)
        for case in CASES:
            failed += run_case(tmp, paths, params_path, grads_path, params, grads, *case)
        for dtype in ("bf16", "f16"):
            failed += check_mixed(tmp, paths, dtype)
        failed += check_edges(tmp, paths)
    print("all optimizer checks passed" if not failed else f"{failed} optimizer check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
