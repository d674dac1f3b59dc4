"""The job page's "Data" line (web/job_page.js), in headless Chromium against a real ztraind: what
the job trains on, as the daemon's JSON API gives its spec (data.format and data.packing,
docs/fine-tuning.md).

  a. A loss-masked job (DataSpec.format "masked", packing left to its default) shows
     "masked: loss on the trained tokens · packed documents".
  b. One with packing "padded" shows "... · padded, one document per row".
  c. A plain job (no format) shows "tokens: every token trained".
  d. For each, the API's spec.data is what the page's words say (format, and packing where
     given), and the browser's console has no SEVERE entry."""
import os
import struct
import sys

sys.stdout.reconfigure(line_buffering=True)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
from svc import (BUILD, Checker, Daemon, state_name, submit, temp_dir, tiny_job,  # noqa: E402
                 wait_state, write_data)

from page import api, q, severe, start_browser, wait_until  # noqa: E402

ck = Checker()
T = 32


def token_file(tokens):
    return struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)) + \
        struct.pack(f"<{len(tokens)}H", *tokens)


def mask_file(flags):
    return struct.pack("<256i", 20261204, 1, len(flags), *([0] * 253)) + bytes(flags)


n = 8 * T + 1
d = Daemon(BUILD, temp_dir("ztrain-data-format-"), max_ranks=1)
write_data(d.data_root, "sft.bin", token_file([(7 * i) % 256 for i in range(n)]))
# Trained in runs of five, a document starting every 13 tokens.
write_data(d.data_root, "sft.bin.mask",
           mask_file([(1 if (i // 5) % 2 else 0) | (2 if i % 13 == 0 else 0) for i in range(n)]))
jobs = {}
for name, data, want in (
        ("packed", {"train": "sft.bin", "format": "masked"},
         "masked: loss on the trained tokens · packed documents"),
        ("padded", {"train": "sft.bin", "format": "masked", "packing": "padded"},
         "masked: loss on the trained tokens · padded, one document per row"),
        ("plain", None, "tokens: every token trained")):
    job = tiny_job(d.data_root, name=name, max_steps=2)
    if data:
        job["data"] = data
    r = submit(d, job)
    j = wait_state(d, r.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    ck.check(state_name(j.state) == "SUCCEEDED", f"job {name}: {state_name(j.state)} {j.reason}")
    jobs[name] = (r.id, data, want)

drv = start_browser()
try:
    for name, (job_id, data, want) in jobs.items():
        spec = api(d, f"/api/v1/jobs/{job_id}")["spec"].get("data", {})
        ck.check(spec.get("format", "tokens") == (data or {}).get("format", "tokens") and
                 spec.get("packing", "packed") == (data or {}).get("packing", "packed"),
                 f"{name}: the API's spec.data is the one submitted ({spec})")
        drv.get(f"{d.http_url}/#/jobs/{job_id}")
        shown = wait_until(lambda: q(drv, "job-data-format").text, 30)
        ck.check(shown == want, f"{name}: the page's Data line is {shown!r} (want {want!r})")
    bad = severe(drv)
    ck.check(not bad, f"no SEVERE console entries: {bad[:3]}")
finally:
    drv.quit()
    d.stop()
ck.done()
