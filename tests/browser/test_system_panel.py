"""The job page's system panel (web/system_panel.js) in headless Chromium, against a real ztraind
running a real 2-rank job; the daemon's JSON API is the reference:

  - the CPU utilisation and resident-memory charts have one line per rank whose points equal
    /metrics for system/rank<r>/cpu_util and rss_bytes, step for step and bit for bit;
  - the step-breakdown chart's five phases are the mean over the ranks of perf/rank<r>/<phase>;
  - a CPU job's page has no GPU charts, and the panel says why;
  - the per-rank strip has a row per rank and a cell per logged step (the last 40), each holding
    the rank's compute time of that step, with the record's straggler outlined;
  - the rank table's step time is each rank's own (the job JSON's ranks[r].step_time_ms);
  - no SEVERE entry in the browser console. A screenshot goes to
    $ZTRAIN_BUILD/dashboard-system.png."""
import math
import os
import shutil
import sys

sys.stdout.reconfigure(line_buffering=True)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
from svc import BUILD, Checker, Daemon, submit, temp_dir, tiny_job, wait_state  # noqa: E402

from page import api, api_series, wait_until  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

STEPS = 50
PHASES = ("data_ms", "fwd_ms", "bwd_ms", "step_ms", "comm_ms")
ck = Checker()


POINTS_JS = """
const c = document.querySelector(`[data-testid="${arguments[0]}"]`);
const ch = c && window.Chart && Chart.getChart(c);
if (!ch) return null;
const d = ch.data.datasets.find(d => d.ztKey === arguments[1] && d.ztRole === arguments[2]);
return d ? d.data.map(p => [p.step, p.y]) : null;"""


def main():
    o = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1366,1800"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)
    try:
        with Daemon(BUILD, temp_dir("ztrain-syspanel-"), max_ranks=2) as d:
            job = tiny_job(d.data_root, name="sys-panel", max_steps=STEPS, world_size=2,
                           deepspeed={"train_micro_batch_size_per_gpu": 2,
                                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                      "zero_optimization": {"stage": 2}})
            jid = submit(d, job).id
            wait_state(d, jid, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
            a = api(d, f"/api/v1/jobs/{jid}")
            ck.check(a["state"] == "SUCCEEDED", f"the 2-rank job succeeded ({a['reason']})")
            drv.get(f"{d.http_url}/#/jobs/{jid}")
            wait_until(lambda: drv.execute_script(
                "const v = document.querySelector('[data-testid=\"job-view\"]');"
                "return v && v.dataset.loaded === 'true';"), 15)
            # The panel draws at the charts' flush, shortly after the history is loaded (on a
            # loaded machine it may first draw from part of it, 40 cells of earlier steps among
            # them): wait for both strip rows with their 40 cells ending at the job's last
            # logged step, and for the note the whole history gives.
            last_step = max(api_series(d, jid, "perf/straggler_rank")[0])
            wait_until(lambda: drv.execute_script("""
                const rows = document.querySelectorAll('[data-testid="strip-row"]');
                const note = document.querySelector('[data-testid="system-note"]');
                return rows.length === 2 &&
                  [...rows].every(r => {
                    const cells = r.querySelectorAll('.strip-cell');
                    return cells.length === 40 &&
                      Number(cells[cells.length - 1].dataset.step) === arguments[0];
                  }) && note !== null && note.textContent.includes('No GPU figures');""",
                last_step), 30)
            panel = drv.find_element(By.CSS_SELECTOR, '[data-testid="system-panel"]')
            drv.execute_script("arguments[0].scrollIntoView();", panel)
            shot = os.path.join(BUILD, "dashboard-system.png")
            drv.save_screenshot(shot)
            ck.check(os.path.getsize(shot) > 10_000, f"screenshot of the system panel: {shot}")

            api_vals = {}
            for r in range(2):
                for fig, testid in (("cpu_util", "chart-cpu-util"), ("rss_bytes", "chart-rss")):
                    key = f"system/rank{r}/{fig}"
                    want = list(zip(*api_series(d, jid, key)))
                    got = [tuple(p) for p in drv.execute_script(POINTS_JS, testid, key, "raw") or []]
                    ck.check(len(want) == STEPS and got == want,
                             f"{testid}: rank {r}'s line equals /metrics {key} ({len(got)} points)")
                for p in PHASES + ("compute_ms",):
                    api_vals[(r, p)] = dict(zip(*api_series(d, jid, f"perf/rank{r}/{p}")))
            for p in PHASES:
                got = drv.execute_script(POINTS_JS, "chart-breakdown", p, "mean") or []
                want = [(s, (api_vals[(0, p)][s] + api_vals[(1, p)][s]) / 2) for s in sorted(api_vals[(0, p)])]
                ok = len(got) == len(want) == STEPS and all(
                    gs == ws and math.isclose(gv, wv, rel_tol=1e-12, abs_tol=1e-15)
                    for (gs, gv), (ws, wv) in zip(got, want))
                ck.check(ok, f"chart-breakdown: {p} is the mean over the ranks at every step ({len(got)} points)")

            absent = drv.execute_script("""
                return ['chart-gpu-util', 'chart-gpu-memory'].map(t =>
                  document.querySelector(`[data-testid="${t}"]`) === null);""")
            note = drv.find_element(By.CSS_SELECTOR, '[data-testid="system-note"]').text
            ck.check(absent == [True, True] and "No GPU figures" in note,
                     f"a CPU job's page has no GPU charts ({absent}), and the panel says why: {note!r}")

            strip = drv.execute_script("""
                return [...document.querySelectorAll('[data-testid="strip-row"]')].map(row =>
                  [row.dataset.rank, [...row.querySelectorAll('.strip-cell')].map(c =>
                    [Number(c.dataset.step), Number(c.dataset.ms), c.classList.contains('straggler')])]);""")
            straggler = dict(zip(*api_series(d, jid, "perf/straggler_rank")))
            last = sorted(straggler)[-40:]
            ok = [row[0] for row in strip] == ["0", "1"]
            for r, (_, cells) in enumerate(strip):
                want = [[s, api_vals[(r, "compute_ms")][s], straggler[s] == r] for s in last]
                ok = ok and cells == want
            ck.check(ok and len(last) == 40,
                     f"the strip has a row per rank, a cell per step of the last 40, with each rank's compute "
                     f"time and the straggler outlined ({sum(1 for _, c in strip for x in c if x[2])} outlined; "
                     f"steps {[c[0][0] for _, c in strip if c]}..{[c[-1][0] for _, c in strip if c]}, "
                     f"the API's {last[:1]}..{last[-1:]})")

            rows = drv.execute_script("""
                return [...document.querySelectorAll('[data-testid="rank-row"]')]
                  .map(tr => tr.children[8].textContent);""")
            want = [f"{a['ranks'][r]['step_time_ms']:.1f} ms" for r in range(2)]
            ck.check(rows == want, f"the rank table shows each rank's own step time: {rows} vs {want}")
            # Read while the daemon still answers: the page keeps polling, and once the daemon
            # has stopped each poll is a refused connection in the console.
            errors = [e["message"] for e in drv.get_log("browser") if e["level"] == "SEVERE"]
            ck.check(not errors, f"no SEVERE entries in the browser console: {errors}")
    finally:
        drv.quit()
    ck.done()


if __name__ == "__main__":
    if not shutil.which("/usr/bin/chromedriver"):
        raise SystemExit("FAIL: /usr/bin/chromedriver is missing (scripts/install-deps.sh installs it)")
    main()
