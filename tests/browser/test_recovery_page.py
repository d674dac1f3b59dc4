"""The job page's recovery panel and lineage (web/job_recovery.js), in headless Chromium against
a real ztraind; the daemon's JSON API is the reference.

  a. A two-rank job with max_restarts 1 whose rank 1 is SIGKILLed mid-run restarts and
     SUCCEEDS: its page shows the attempts table with one row per attempt of the API's
     "attempts" (number, resumed-from step, step reached, outcome, the failed rank's signal and
     the reason), the failed one marked, and "1 of max_restarts 1 restart(s) used".
  b. A fork of it (fork_from at a checkpoint step): its page shows "Forked from <parent> at step
     N" with a link to the parent's page, and no attempts panel (no restarts asked for).
  c. A plain job's page shows neither.
  d. No SEVERE entry in the browser's console.
  e. The ETA the pages show (resources.js's jobFromApi on a Job as the API writes it) is at the
     pace of the current attempt: a fork from step 10,000 at step 10,100 after 10 s, of 20,000
     steps, has 9,900 steps at 10 steps/s left, 990 s (it was given 9.8 s, the inherited steps
     counted as made in no time); a job restarted 60 s into its 100 s from step 400, now at
     600 of 1,000, has 400 steps at 5 steps/s left, 80 s; a job never restarted at 250 of 1,000
     after 50 s, 150 s.
  f. Wall time after a restart: job R (one rank, max_restarts 1, killed mid-run) runs the steps
     from its checkpoint to where it was killed again, and they have two records each. On R's
     page, open through the restart and
     opened again after the end (its history, /metrics thinned), every train/loss point is the
     newest /records record of its step: its value, at (that record's time_unix_ms -
     started_unix_ms) / 1000 on the wall-time axis. Such a point kept the first attempt's time
     with the second attempt's value."""
import os
import signal
import sys
import time

sys.stdout.reconfigure(line_buffering=True)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
from svc import (BUILD, Checker, Daemon, get_job, spec_proto, state_name, stubs,  # noqa: E402
                 temp_dir, tiny_job, wait_state)

from page import api, start_browser, wait_until  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

ck = Checker()
pb = stubs()[0]
STEPS, INTERVAL = 240, 20
# Job R: a larger model, some 30 steps a second on a loaded 2-core machine.
R_STEPS = 300


def submit(d, job, max_restarts=0, fork=None):
    spec = spec_proto(job)
    spec.max_restarts = max_restarts
    if fork:
        spec.fork_from.job, spec.fork_from.step = fork
    return d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)


def page_state(drv):
    """What the page shows: the attempts panel (hidden, summary, rows) and the lineage line."""
    return drv.execute_script("""
        const q = (id) => document.querySelector(`[data-testid="${id}"]`);
        if (!q('attempts-panel')) return null;
        const rows = [...document.querySelectorAll('[data-testid="attempt-row"]')].map((tr) => ({
          failed: tr.dataset.failed, cells: [...tr.children].map((td) => td.textContent)}));
        return {panelHidden: q('attempts-panel').hidden, summary: q('attempts-summary').textContent,
                rows, lineageHidden: q('lineage').hidden, link: q('lineage-link').textContent,
                href: q('lineage-link').getAttribute('href'), step: q('lineage-step').textContent,
                state: q('job-state').textContent};
    """)


# jobFromApi's ETA of each Job given (JSON as the API writes it), in ms.
ETA_JS = """
const done = arguments[arguments.length - 1];
import('/static/resources.js').then((m) => done(arguments[0].map((j) => m.jobFromApi(j).eta_ms)),
                                    (e) => done(String(e)));"""


def running_job(step, max_steps, run_duration, attempts):
    """A RUNNING Job in the API's JSON, started at T0; attempts are (seconds after T0 it
    started, the step it resumed from)."""
    t0 = 1_800_000_000
    iso = lambda s: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0 + s))  # noqa: E731
    return {"id": "job-eta", "state": "JOB_STATE_RUNNING", "step": str(step),
            "maxSteps": str(max_steps), "startTime": iso(0), "runDuration": run_duration,
            "attempts": [{"attempt": i + 1, "startTime": iso(at), "resumedFromStep": str(frm)}
                         for i, (at, frm) in enumerate(attempts)]}


# The loss chart's raw train/loss points: [[step, x, y], ...].
LOSS_JS = """
const ch = Chart.getChart(document.querySelector('[data-testid="chart-loss"]'));
const d = ch && ch.data.datasets.find((d) => d.ztKey === 'train/loss' && d.ztRole === 'raw');
return d ? (d._data || d.data).map((p) => [p.step, p.x, p.y]) : [];"""


def newest_losses(d, job_id):
    """[(step, wall seconds since the start, train/loss)] of each step's newest record with a
    train/loss (/records), and how many steps have more than one."""
    started = api(d, f"/api/v1/jobs/{job_id}")["started_unix_ms"]
    newest, seen, query = {}, set(), "since_step=0"
    while query:
        page = api(d, f"/api/v1/jobs/{job_id}/records?{query}")
        for r in page["records"]:
            v = r["values"].get("train/loss")
            if isinstance(v, (int, float)):
                if r["step"] in newest:
                    seen.add(r["step"])
                newest[r["step"]] = (r["step"], (r["time_unix_ms"] - started) / 1000, v)
        query = page["next_page_token"] and f"page_token={page['next_page_token']}"
    return [newest[s] for s in sorted(newest)], len(seen)


def check_wall_time(drv, d, job_id, what):
    want, again = newest_losses(d, job_id)
    got = drv.execute_script(LOSS_JS)
    bad = [(g, w) for g, w in zip(got, want)
           if g[0] != w[0] or g[2] != w[2] or abs(g[1] - w[1]) > 1e-9]
    ck.check(again > 0 and len(got) == len(want) and not bad,
             f"f: {what}: the loss chart's {len(got)} points are each step's newest record "
             f"({len(want)}, {again} steps logged twice), on the wall-time axis: {bad[:2]}")


def job_loaded(drv):
    return drv.execute_script("const v = document.querySelector('[data-testid=\"job-view\"]');"
                              "return !!v && v.dataset.loaded === 'true';")


def open_job(drv, d, job_id):
    drv.get(f"{d.http_url}/#/jobs/{job_id}")
    return wait_until(lambda: (s := page_state(drv)) and s["state"] in ("SUCCEEDED",) and s, 30)


d = Daemon(BUILD, temp_dir("ztrain-recovery-page-"), max_ranks=2)
drv = start_browser()
try:
    job = tiny_job(d.data_root, name="restarts", max_steps=STEPS, world_size=2,
                   checkpoint_interval=INTERVAL)
    a = submit(d, job, max_restarts=1)
    running = wait_until(lambda: (j := get_job(d, a.id)) and j.step >= INTERVAL + 5 and
                         all(r.pid and r.running for r in j.ranks) and j, 60)
    ck.check(bool(running) and running.step < STEPS, "job A runs mid-way when rank 1 is killed")
    if running:
        os.kill(running.ranks[1].pid, signal.SIGKILL)
    a = wait_state(d, a.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    ck.check(state_name(a.state) == "SUCCEEDED" and len(a.attempts) == 2,
             f"job A SUCCEEDED after one restart ({state_name(a.state)}, {len(a.attempts)} attempts)")
    # f. job R, slower, killed with its page open on the wall-time axis: the page follows the
    # restart live, then loads R's history afresh.
    rj = tiny_job(d.data_root, name="rerun", max_steps=R_STEPS, checkpoint_interval=50)
    rj["model"].update(n_layer=4, n_embd=128, block_size=64)
    rj["deepspeed"]["train_micro_batch_size_per_gpu"] = 8
    r = submit(d, rj, max_restarts=1)
    drv.get(f"{d.http_url}/#/jobs/{r.id}")
    wait_until(lambda: job_loaded(drv), 30)
    drv.find_element(By.CSS_SELECTOR, '[data-testid="x-time"]').click()
    running = wait_until(lambda: (j := get_job(d, r.id)) and j.step >= 80 and
                         all(x.pid and x.running for x in j.ranks) and j, 60)
    ck.check(bool(running) and running.step < R_STEPS - 20, "job R runs mid-way when it is killed")
    if running:
        os.kill(running.ranks[0].pid, signal.SIGKILL)
    r = wait_state(d, r.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    ck.check(state_name(r.state) == "SUCCEEDED" and len(r.attempts) == 2,
             f"job R SUCCEEDED after one restart ({state_name(r.state)}, {len(r.attempts)} attempts)")
    wait_until(lambda: (s := page_state(drv)) and s["state"] == "SUCCEEDED" and
               [p[0] for p in drv.execute_script(LOSS_JS)[-1:]] == [R_STEPS], 30)
    check_wall_time(drv, d, r.id, "open through the restart")
    drv.get("about:blank")
    drv.get(f"{d.http_url}/#/jobs/{r.id}")
    wait_until(lambda: job_loaded(drv), 30)
    drv.find_element(By.CSS_SELECTOR, '[data-testid="x-time"]').click()
    check_wall_time(drv, d, r.id, "opened after the end")
    fork = submit(d, tiny_job(d.data_root, name="fork", max_steps=INTERVAL + 4, world_size=1,
                              checkpoint_interval=INTERVAL), fork=(a.id, INTERVAL))
    fork = wait_state(d, fork.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)
    ck.check(state_name(fork.state) == "SUCCEEDED", f"fork B SUCCEEDED ({fork.reason!r})")
    plain = submit(d, tiny_job(d.data_root, name="plain", max_steps=5))
    plain = wait_state(d, plain.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)

    s = open_job(drv, d, a.id)
    want = api(d, f"/api/v1/jobs/{a.id}")["attempts"]
    ck.check(bool(s) and not s["panelHidden"], f"a: A's page shows the attempts panel ({s})")
    if s:
        ck.check(s["summary"] == "1 of max_restarts 1 restart(s) used",
                 f"a: the summary counts the restart: {s['summary']!r}")
        rows = s["rows"]
        ck.check(len(rows) == len(want) == 2, f"a: one row per attempt ({len(rows)})")
        for row, w in zip(rows, want):
            cells = row["cells"]
            ck.check(cells[:3] == [str(w["attempt"]), str(w["resumed_from_step"]), str(w["step"])]
                     and row["failed"] == str(w["failed"]).lower() and cells[6] == w["reason"],
                     f"a: attempt {w['attempt']}'s row matches the API: {cells}")
        if len(rows) == 2:
            ck.check(rows[0]["cells"][3] == "failed" and rows[0]["cells"][4] == "rank 1: signal 9"
                     and "SIGKILL" in rows[0]["cells"][6],
                     f"a: the first attempt shows rank 1's SIGKILL: {rows[0]['cells']}")
        ck.check(s["lineageHidden"], "a: no lineage on a job that is not a fork")
    s = open_job(drv, d, fork.id)
    ck.check(bool(s) and not s["lineageHidden"] and s["link"] == a.id and
             s["href"] == f"#/jobs/{a.id}" and s["step"] == str(INTERVAL),
             f"b: the fork's page says where it comes from: "
             f"{s and (s['link'], s['href'], s['step'])}")
    ck.check(bool(s) and s["panelHidden"], "b: and has no attempts panel")
    s = open_job(drv, d, plain.id)
    ck.check(bool(s) and s["panelHidden"] and s["lineageHidden"],
             "c: a plain job's page shows neither")
    etas = drv.execute_async_script(ETA_JS, [
        running_job(10_100, 20_000, "10s", [(0, 10_000)]),
        running_job(600, 1_000, "100s", [(0, 0), (60, 400)]),
        running_job(250, 1_000, "50s", [])])
    ck.check(etas == [990_000, 80_000, 150_000],
             f"e: the ETA is at the current attempt's pace: {etas} ms for a fork, a restarted "
             f"job and a plain one (990000, 80000, 150000)")
    bad = [e["message"] for e in drv.get_log("browser") if e["level"] == "SEVERE"]
    ck.check(not bad, f"d: no SEVERE console entries: {bad[:3]}")
finally:
    drv.quit()
    d.stop()
ck.done()
