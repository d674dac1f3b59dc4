"""Safetensors interop between ztrain's C reader/writer and an independent Python implementation.

The `safetensors` package is not available here, so this file carries its own small reader and
writer, written from the format description (8-byte little-endian header length, JSON header with
dtype/shape/data_offsets relative to the data section, then the raw little-endian data). Tensors
come from torch; comparisons are exact, bit for bit (NaNs by sign and payload).

  1. Python writes F32, F16 and BF16 tensors; the C tool (tests/tools/zt_st_tool) reads them and
     dumps fp32; Python compares with torch's own conversion to fp32.
  2. The C tool writes F32 tensors; Python parses the file with its own reader and compares with
     the torch tensors it started from. It also writes fp32 values as F16 and BF16 (round to
     nearest even: ties, subnormals, overflow to infinity, NaN), compared with torch's casts.
  3. Files broken in known ways are refused by the C reader with a message naming file and tensor.

Run: ZTRAIN_BUILD=<build dir> /usr/bin/python3 tests/reference/test_safetensors_io.py
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

BUILD = os.environ.get("ZTRAIN_BUILD", "build")
TOOL = os.path.join(BUILD, "zt_st_tool")

DTYPE_NAME = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def raw_bytes(t):
    """The tensor's little-endian bytes, read through an integer view so no conversion happens."""
    t = t.contiguous()
    if t.dtype == torch.float32:
        return t.view(torch.int32).numpy().astype("<i4").tobytes()
    return t.view(torch.int16).numpy().astype("<i2").tobytes()


def py_write(path, tensors, metadata=None, data_order=None, align=True):
    """Writes a safetensors file. `data_order` lays the data out in a different order than the
    header lists the tensors; align=False leaves the header unpadded (the data unaligned)."""
    names = list(tensors)
    order = data_order or names
    header, chunks, offset = {}, [], 0
    for name in order:
        b = raw_bytes(tensors[name])
        header[name] = {"dtype": DTYPE_NAME[tensors[name].dtype],
                        "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
    ordered = {}
    if metadata is not None:
        ordered["__metadata__"] = metadata
    for name in names:
        ordered[name] = header[name]
    text = json.dumps(ordered, separators=(",", ":")).encode()
    if align:
        text += b" " * (-len(text) % 8)
    elif (8 + len(text)) % 4 == 0:
        text += b" "
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def py_read(path):
    """Reads a safetensors file of F32, F16 and BF16 tensors strictly; returns (header bytes,
    header dict, {name: tensor})."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), "header length beyond the file"
    text = blob[8:8 + n]
    header = json.loads(text)
    data = blob[8 + n:]
    out, spans = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] in DTYPE_SIZE, info
        size = DTYPE_SIZE[info["dtype"]]
        b, e = info["data_offsets"]
        numel = int(np.prod(info["shape"])) if info["shape"] else 1
        assert e - b == numel * size, (name, info)
        assert 0 <= b <= e <= len(data), (name, info)
        spans.append((b, e, name))
        arr = torch.from_numpy(np.frombuffer(data[b:e], dtype="<i4" if size == 4 else "<i2").copy())
        kind = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[info["dtype"]]
        out[name] = arr.view(kind).reshape(info["shape"])
    spans.sort()
    pos = 0
    for b, e, name in spans:
        assert b == pos, f"tensor {name} is not contiguous"
        pos = e
    assert pos == len(data), "data section has trailing bytes"
    return text, header, out


def same_fp32(a, b):
    """Bitwise equality of two fp32 tensors; NaNs must agree in sign and in the top payload bits
    that a 16-bit source carries."""
    a = a.reshape(-1).view(torch.int32)
    b = b.reshape(-1).view(torch.int32)
    if a.shape != b.shape:
        return False
    nan_a = torch.isnan(a.view(torch.float32))
    nan_b = torch.isnan(b.view(torch.float32))
    if not torch.equal(nan_a, nan_b):
        return False
    keep = ~nan_a
    if not torch.equal(a[keep], b[keep]):
        return False
    top = torch.tensor(-(1 << 13), dtype=torch.int32)  # sign, exponent, 10 payload bits
    return torch.equal(a[nan_a] & top, b[nan_a] & top)


def specials(dtype):
    """Values that exercise every branch of a conversion: zeros, subnormals, the largest
    finite value, infinities and NaN."""
    info = torch.finfo(dtype)
    tiny = info.tiny
    vals = [0.0, -0.0, 1.0, -2.5, tiny, -tiny, tiny / 2, tiny / 1024, info.max, -info.max,
            float("inf"), float("-inf"), float("nan")]
    if dtype == torch.float16:
        vals += [2.0 ** -24, 2.0 ** -24 * 3, 65504.0, 6.1e-5]
    return torch.tensor(vals, dtype=torch.float32).to(dtype)


def tool(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True)


def test_python_writes_c_reads(tmp):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "wte": torch.randn(7, 5, generator=g),
        "h.0.attn.c_attn.weight": torch.randn(2, 3, 4, generator=g).half(),
        "h.0.mlp.c_fc.bias": torch.randn(33, generator=g).bfloat16(),
        "f16_specials": specials(torch.float16),
        "bf16_specials": specials(torch.bfloat16),
        "f32_specials": torch.cat([specials(torch.float32),
                                   torch.tensor([1e-45, -3e-42, 1.17549435e-38])]),
        "scalar": torch.tensor(3.25, dtype=torch.float16),
        "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
        "noms-unicode-é": torch.arange(6, dtype=torch.float32).reshape(2, 3),
    }
    meta = {"format": "pt", "source": "test_safetensors_io.py", "note": "quote \" é"}
    for align in (True, False):
        path = os.path.join(tmp, f"py_{align}.safetensors")
        # Data in reverse order of the header: the reader must not rely on header order.
        py_write(path, tensors, meta, data_order=list(reversed(tensors)), align=align)
        out = os.path.join(tmp, f"dump_{align}")
        os.mkdir(out)
        r = tool("dump", path, out)
        check(r.returncode == 0, f"dump {path}: {r.stderr}")
        if r.returncode != 0:
            continue
        with open(os.path.join(out, "manifest.json")) as f:
            man = json.load(f)
        check(man["metadata"] == meta, f"metadata {man['metadata']}")
        check([t["name"] for t in man["tensors"]] == list(tensors), "tensor order as in header")
        for t in man["tensors"]:
            src = tensors[t["name"]]
            check(t["dtype"] == DTYPE_NAME[src.dtype], f"{t['name']} dtype {t['dtype']}")
            check(t["shape"] == list(src.shape), f"{t['name']} shape {t['shape']}")
            got = np.fromfile(os.path.join(out, t["file"]), dtype="<f4")
            got = torch.from_numpy(got.copy())
            want = src.float().reshape(-1)
            check(same_fp32(got, want), f"{t['name']} (align={align}) values differ: "
                                        f"{got[:8].tolist()} vs {want[:8].tolist()}")
    # numpy's own float16 conversion agrees too: a second independent reference.
    h = tensors["f16_specials"]
    np_ref = torch.from_numpy(h.numpy().astype(np.float32))
    check(same_fp32(np_ref, h.float()), "numpy and torch agree on F16")


def test_c_writes_python_reads(tmp):
    g = torch.Generator().manual_seed(1)
    tensors = {
        "lm_head.weight": torch.randn(11, 4, generator=g),
        "ln_f.bias": torch.randn(4, generator=g),
        "h.1.attn.c_proj.weight": torch.randn(3, 2, 2, generator=g) * 1e-39,  # subnormals
        "specials": torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"),
                                  1e-45, 3.4028235e38]),
        "scalar": torch.tensor(-7.5),
        "empty": torch.zeros(2, 0),
        "a \"quoted\" \\ name": torch.ones(1),
    }
    meta = {"format": "pt", "step": "1200", "unicode": "ünï", "nl": "a\nb"}
    spec = {"metadata": meta, "tensors": []}
    for i, (name, t) in enumerate(tensors.items()):
        f = os.path.join(tmp, f"in{i}.f32")
        with open(f, "wb") as fh:
            fh.write(raw_bytes(t))
        spec["tensors"].append({"name": name, "shape": list(t.shape), "file": f})
    spec_path = os.path.join(tmp, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    path = os.path.join(tmp, "c.safetensors")
    r = tool("write", path, spec_path)
    check(r.returncode == 0, f"write: {r.stderr}")
    if r.returncode != 0:
        return
    check(not os.path.exists(path + ".tmp"), "temporary file left behind")
    text, header, got = py_read(path)
    check(len(text) % 8 == 0, "header padded to a multiple of 8")
    check(text == text.rstrip(b" ") + b" " * (len(text) - len(text.rstrip(b" "))),
          "padding is spaces")
    check(header.get("__metadata__") == meta, f"metadata {header.get('__metadata__')}")
    check([k for k in header if k != "__metadata__"] == list(tensors), "header order")
    # The writer lays tensors out in the order given.
    starts = [header[k]["data_offsets"][0] for k in tensors]
    check(starts == sorted(starts), "data in the given order")
    for name, t in tensors.items():
        check(list(got[name].shape) == list(t.shape), f"{name} shape")
        check(same_fp32(got[name], t), f"{name} values differ")


def rounding_values():
    """fp32 values that every branch of an fp32 -> 16-bit rounding meets: exact ties both ways,
    just above and below them, subnormal results and the underflow edge, the overflow edge,
    infinities, NaN, and a million random values over the whole exponent range."""
    g = torch.Generator().manual_seed(5)
    bits = torch.randint(0, 2 ** 31, (1 << 20,), generator=g, dtype=torch.int64)
    rand = (bits.to(torch.int32) ^ torch.randint(0, 2, (1 << 20,), generator=g).to(torch.int32) << 31)
    ties = []
    for base in (1.0, 1.5, 3.0, 2.0 ** -14, 2.0 ** -20, 2.0 ** -127, 1000.0):
        for ulp in (2.0 ** -10, 2.0 ** -7):
            ties += [base + base * ulp / 2, base + base * ulp * 1.5]
    vals = torch.tensor(ties + [65504.0, 65519.0, 65520.0, 65536.0, 2.0 ** -24, 2.0 ** -25,
                                2.0 ** -25 * 1.0000001, 2.0 ** -26, 3.0 * 2.0 ** -26, 1e-40,
                                3.3e38, 3.4028235e38, float("inf"), float("-inf"),
                                float("nan")], dtype=torch.float32)
    vals = torch.cat([vals, -vals, rand.view(torch.float32)])
    return vals


def test_c_writes_16bit(tmp):
    vals = rounding_values()
    f = os.path.join(tmp, "round.f32")
    with open(f, "wb") as fh:
        fh.write(raw_bytes(vals))
    spec = {"tensors": [{"name": "f16", "shape": [vals.numel()], "file": f, "dtype": "F16"},
                        {"name": "bf16", "shape": [vals.numel()], "file": f, "dtype": "BF16"}]}
    spec_path = os.path.join(tmp, "spec16.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    path = os.path.join(tmp, "c16.safetensors")
    r = tool("write", path, spec_path)
    check(r.returncode == 0, f"write 16-bit: {r.stderr}")
    if r.returncode != 0:
        return
    _, header, got = py_read(path)
    for name, dtype in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        check(header[name]["dtype"] == DTYPE_NAME[dtype], f"{name}: dtype {header[name]['dtype']}")
        want = vals.to(dtype)
        nan = torch.isnan(want)
        same = torch.equal(got[name].view(torch.int16)[~nan], want.view(torch.int16)[~nan])
        check(same and bool(torch.isnan(got[name][nan]).all()),
              f"{name}: {vals.numel()} values rounded as torch casts them")


def build(path, header, data_len):
    text = header.encode() if isinstance(header, str) else header
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"\x3f" * data_len)


def test_c_refuses_broken_files(tmp):
    good = os.path.join(tmp, "good.safetensors")
    py_write(good, {"x": torch.randn(4), "y": torch.randn(2).half()})
    r = tool("check", good)
    check(r.returncode == 0 and r.stdout.strip() == "ok 2", f"good file: {r.stdout} {r.stderr}")
    with open(good, "rb") as f:
        blob = f.read()
    cases = []
    p = os.path.join(tmp, "truncated.safetensors")
    with open(p, "wb") as f:
        f.write(blob[:-3])
    cases.append((p, ["runs past the end"]))
    p = os.path.join(tmp, "bigheader.safetensors")
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", 1 << 40) + blob[8:])
    cases.append((p, ["header length 1099511627776"]))
    p = os.path.join(tmp, "json.safetensors")
    build(p, '{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]', 4)
    cases.append((p, ["not valid JSON"]))
    p = os.path.join(tmp, "oob.safetensors")
    build(p, '{"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', 8)
    cases.append((p, ["'x'", "runs past the end"]))
    p = os.path.join(tmp, "numel.safetensors")
    build(p, '{"x": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}}', 16)
    cases.append((p, ["'x'", "need 8 bytes", "span 16"]))
    p = os.path.join(tmp, "dtype.safetensors")
    build(p, '{"x": {"dtype": "float32", "shape": [1], "data_offsets": [0, 4]}}', 4)
    cases.append((p, ["'x'", 'unknown dtype "float32"']))
    for path, facts in cases:
        r = tool("check", path)
        check(r.returncode == 1, f"{path}: exit {r.returncode} {r.stderr}")
        check(path in r.stderr and r.stderr.startswith("format: "), f"{path}: {r.stderr}")
        for fact in facts:
            check(fact in r.stderr, f"{path}: message lacks {fact!r}: {r.stderr}")


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"missing {TOOL}; build the zt_st_tool target and set ZTRAIN_BUILD", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="zt_st_io.") as tmp:
        test_python_writes_c_reads(tmp)
        test_c_writes_python_reads(tmp)
        test_c_writes_16bit(tmp)
        test_c_refuses_broken_files(tmp)
    if failures:
        print(f"test_safetensors_io: {len(failures)} checks failed", file=sys.stderr)
        return 1
    print("test_safetensors_io: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
