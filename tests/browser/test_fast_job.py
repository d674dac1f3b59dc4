"""The job page keeps up with a job logging every step (issue 34), in headless Chromium against a
real ztraind and a real 2-rank job; the daemon's JSON API is the reference.

A tiny 2-rank job logs every one of its 4,000 steps (hundreds of records a second on a free
machine). Its page is opened as it starts; Chromium's long tasks (PerformanceObserver
'longtask') and the intervals between animation frames are recorded from before the page's
first script and printed, never judged.

  a. While the job runs the loss chart follows it without a reload: its newest step grows, and
     once the job has ended the chart's newest point is the API's last train/loss step, its value
     bit for bit.
  b. Bounded work, by formula rather than by time: every dataset of every chart on the page
     (the main charts and the system panel) holds at most MAX_POINTS = 1,000 points
     (web/charts.js), however many records came; the log keeps at most 2,000 lines; and the
     JavaScript heap after a garbage collection grows between the middle and the end of the run
     by less than 200 bytes per point the page may hold plus 8 MiB (a page that kept every
     record grows with the job instead).
  c. Every raw point of the loss and step-time charts is the API's value at that step (a
     thinned series, not an interpolated one), and the loss chart still spans the job: its
     first step is the API's first.
  d. Reloaded after the end, the page draws the history thinned by the API (/metrics
     max_points): at most 1,000 points per dataset, ending at the API's last step; in wall-time
     mode each point sits at (time_unix_ms - started_unix_ms) / 1000 of that step's record in
     /records (the series API's time_unix_ms key).
  e. No SEVERE entry in the browser's console.
  f. The page's polls ask for the job's effective config (/config, which never changes once
     written) at most twice while the job runs, however many polls there were (the resource
     timing entries of the page count the requests)."""
import os
import shutil
import sys
import time

sys.stdout.reconfigure(line_buffering=True)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
from svc import BUILD, TERMINAL, Checker, Daemon, submit, temp_dir, tiny_job, wait_state  # noqa: E402

from page import api, api_series, q, severe, start_browser, wait_until  # noqa: E402

STEPS = 4000
MAX_POINTS = 1000       # web/charts.js
LOG_MAX_LINES = 2000    # web/job_page.js
BYTES_PER_POINT = 200   # a point object {x, y, step, t} and its share of the arrays, generously

ck = Checker()

# Installed before any script of the page: long tasks and animation-frame intervals.
PROBE = """
window.__zt = {longtasks: [], frames: [], last: 0};
performance.setResourceTimingBufferSize(100000);
try {
  new PerformanceObserver((l) => { for (const e of l.getEntries()) __zt.longtasks.push(e.duration); })
    .observe({type: 'longtask', buffered: true});
} catch (e) {}
const tick = (t) => { if (__zt.last) __zt.frames.push(t - __zt.last); __zt.last = t; requestAnimationFrame(tick); };
requestAnimationFrame(tick);
"""

# Every chart on the page: [testid, key, role, number of points, first step, last step].
DATASETS_JS = """
const out = [];
for (const c of document.querySelectorAll('canvas')) {
  const ch = window.Chart && Chart.getChart(c);
  if (!ch) continue;
  for (const d of ch.data.datasets) {
    const n = d.data.length;
    out.push([c.dataset.testid, d.ztKey, d.ztRole, n, n ? d.data[0].step : null, n ? d.data[n - 1].step : null]);
  }
}
return out;"""

POINTS_JS = """
const c = document.querySelector(`[data-testid="${arguments[0]}"]`);
const ch = c && window.Chart && Chart.getChart(c);
const d = ch && ch.data.datasets.find(d => d.ztKey === arguments[1] && d.ztRole === 'raw');
return d ? d.data.map(p => [p.step, p.x, p.y]) : [];"""


# How many requests of the page went to the job's /config and /checkpoints routes.
REQUESTS_JS = """
const n = {'/config': 0, '/checkpoints': 0};
for (const e of performance.getEntriesByType('resource')) {
  const path = new URL(e.name).pathname;
  for (const k of Object.keys(n)) if (path === arguments[0] + k) n[k]++;
}
return n;"""


def heap(drv):
    """The page's JavaScript heap in bytes after a full garbage collection."""
    return drv.execute_script("window.gc(); window.gc(); return performance.memory.usedJSHeapSize;")


def last_chart_step(drv):
    pts = drv.execute_script(POINTS_JS, "chart-loss", "train/loss")
    return pts[-1][0] if pts else -1


def api_last_step(d, job_id):
    """The newest train/loss step the API has (a thinned series keeps the last point)."""
    s = api(d, f"/api/v1/jobs/{job_id}/metrics?keys=train/loss&max_points=2")
    steps = s["series"][0]["steps"]
    return steps[-1] if steps else -1


def timing_report(drv, what):
    t = drv.execute_script("return [__zt.longtasks, __zt.frames];")
    longs, frames = t
    frames = sorted(frames)
    pct = (lambda p: frames[min(len(frames) - 1, int(p * len(frames)))] if frames else 0)
    print(f"info  {what}: {len(longs)} long tasks, {sum(longs):.0f} ms in all, longest "
          f"{max(longs, default=0):.0f} ms; {len(frames)} frames, interval p50 {pct(0.5):.1f} ms, "
          f"p95 {pct(0.95):.1f} ms, max {frames[-1] if frames else 0:.1f} ms")


def check_bounds(drv, what):
    sets = drv.execute_script(DATASETS_JS)
    big = [s for s in sets if s[3] > MAX_POINTS]
    total = sum(s[3] for s in sets)
    ck.check(sets and not big, f"{what}: each of {len(sets)} datasets holds at most {MAX_POINTS} "
             f"points ({total} in all; over: {big[:3]})")
    lines = drv.execute_script(
        "return document.querySelector('[data-testid=\"log\"]').childElementCount;")
    ck.check(lines <= LOG_MAX_LINES, f"{what}: the log holds {lines} lines (<= {LOG_MAX_LINES})")
    return sets


def case_live(drv, d, job_id):
    drv.get(f"{d.http_url}/#/jobs/{job_id}")
    wait_until(lambda: drv.execute_script(
        "const v = document.querySelector('[data-testid=\"job-view\"]');"
        "return v && v.dataset.loaded === 'true';"), 30)
    seen, lags = [], []
    mid_heap = None
    while True:
        job = api(d, f"/api/v1/jobs/{job_id}")
        a = api_last_step(d, job_id)
        t0 = time.monotonic()
        c = last_chart_step(drv)
        if not seen or c != seen[-1]:
            seen.append(c)
        if a > 0 and c >= 0:
            lags.append(a - c)
        if mid_heap is None and job.get("step", 0) >= STEPS // 2:
            mid_heap = heap(drv)
            mid_sets = check_bounds(drv, "b (half way)")
        if job["state"] in TERMINAL:
            break
        time.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))
    ck.check(job["state"] == "SUCCEEDED", f"the every-step job succeeds ({job.get('reason')})")
    ck.check(len(seen) >= 3, f"a: the loss chart's newest step grew during the run "
             f"({len(seen)} distinct: {seen[:4]}...{seen[-2:]})")
    if lags:
        print(f"info  a: steps between the API and the chart while running: median "
              f"{sorted(lags)[len(lags) // 2]}, max {max(lags)}")
    steps, values = api_series(d, job_id, "train/loss")
    caught = wait_until(lambda: last_chart_step(drv) == steps[-1], 60, poll=0.2)
    pts = drv.execute_script(POINTS_JS, "chart-loss", "train/loss")
    ck.check(caught and pts[-1][2] == values[-1],
             f"a: after the end the chart's newest point is the API's last step {steps[-1]} "
             f"({pts[-1][0]}: {pts[-1][2]} vs {values[-1]})")
    sets = check_bounds(drv, "b (end)")
    end_heap = heap(drv)
    if mid_heap is not None:
        slots = len(mid_sets) * MAX_POINTS
        bound = slots * BYTES_PER_POINT + 8 * 2**20
        ck.check(end_heap - mid_heap < bound,
                 f"b: the JS heap grew by {(end_heap - mid_heap) / 2**20:.1f} MiB over the second "
                 f"half ({mid_heap / 2**20:.1f} -> {end_heap / 2**20:.1f} MiB; bound "
                 f"{bound / 2**20:.1f} MiB for {slots} points)")
    else:
        ck.check(False, "b: the job's step was never seen half way (no heap measured)")
    want = dict(zip(steps, values))
    for testid, key in (("chart-loss", "train/loss"), ("chart-step-time", "perf/step_time_ms")):
        pts = drv.execute_script(POINTS_JS, testid, key)
        ref = want if key == "train/loss" else dict(zip(*api_series(d, job_id, key)))
        bad = [p for p in pts if ref.get(p[0]) != p[2]]
        ck.check(pts and not bad, f"c: {len(pts)} points of {key} are the API's values at their "
                 f"steps (of {len(ref)}; wrong: {bad[:3]})")
    pts = drv.execute_script(POINTS_JS, "chart-loss", "train/loss")
    ck.check(pts and pts[0][0] == steps[0] and len(pts) < len(steps),
             f"c: the loss chart spans the job from step {pts[0][0]} (API {steps[0]}) with "
             f"{len(pts)} of {len(steps)} points")
    timing_report(drv, "while the job ran")
    asked = drv.execute_script(REQUESTS_JS, f"/api/v1/jobs/{job_id}")
    ck.check(asked["/config"] <= 2 and asked["/checkpoints"] >= 2,
             f"f: {asked['/checkpoints']} polls asked for /config {asked['/config']} times (<= 2)")
    return sets


def records_time(d, job_id):
    """{step: time_unix_ms} of every record, from /records page by page."""
    out, query = {}, "since_step=0"
    while query:
        page = api(d, f"/api/v1/jobs/{job_id}/records?{query}")
        for r in page["records"]:
            out.setdefault(r["step"], r["time_unix_ms"])
        query = f"page_token={page['next_page_token']}" if page.get("next_page_token") else None
    return out


def case_reload(drv, d, job_id):
    drv.refresh()
    wait_until(lambda: drv.execute_script(
        "const v = document.querySelector('[data-testid=\"job-view\"]');"
        "return v && v.dataset.loaded === 'true';"), 60)
    steps, _ = api_series(d, job_id, "train/loss")
    caught = wait_until(lambda: last_chart_step(drv) == steps[-1], 30, poll=0.2)
    ck.check(caught, f"d: the reloaded page ends at the API's last step ({last_chart_step(drv)} "
             f"vs {steps[-1]})")
    check_bounds(drv, "d (reloaded)")
    q(drv, "x-time").click()
    job = api(d, f"/api/v1/jobs/{job_id}")
    times = records_time(d, job_id)
    t0 = job["started_unix_ms"]
    pts = wait_until(lambda: (lambda p: p if p and p[0][1] != p[0][0] else None)(
        drv.execute_script(POINTS_JS, "chart-loss", "train/loss")), 10)
    bad = [p for p in pts or [] if abs(p[1] - (times[p[0]] - t0) / 1000) > 1e-9]
    ck.check(pts and not bad, f"d: in wall-time mode {len(pts or [])} points sit at their record's "
             f"time since the start (wrong: {bad[:3]})")
    timing_report(drv, "reloading the ended job")


def main():
    build = os.path.abspath(BUILD)
    tmp = temp_dir("ztrain-fast-")
    drv = start_browser(extra=("--js-flags=--expose-gc", "--enable-precise-memory-info"))
    try:
        drv.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": PROBE})
        with Daemon(build, tmp, max_ranks=2) as d:
            job = tiny_job(d.data_root, name="every-step", max_steps=STEPS, world_size=2,
                           log_interval=1)
            job_id = submit(d, job).id
            wait_state(d, job_id, {"RUNNING", *TERMINAL}, timeout=60)
            case_live(drv, d, job_id)
            case_reload(drv, d, job_id)
            errors = severe(drv)
            ck.check(not errors, f"e: no SEVERE entries in the browser console: {errors}")
    finally:
        drv.quit()
    ck.done()


if __name__ == "__main__":
    if not shutil.which("/usr/bin/chromedriver"):
        raise SystemExit("FAIL: /usr/bin/chromedriver is missing (scripts/install-deps.sh installs it)")
    main()
