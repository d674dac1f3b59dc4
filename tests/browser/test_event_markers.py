"""Anomaly events on the dashboard (headless Chromium, as test_dashboard.py), against a real
ztraind whose ranks get ZTRAIN_INJECT_NAN_GRAD=3 (and ZTRAIN_INJECT_SLOW_RANK=50, which paces
them).

  a. A finished job with a non-finite step 3 and a loss spike at step 12 (a batch of random
     bytes), both "skip": the page's event list holds exactly the events of
     /api/v1/jobs/{id}/anomalies (step, kind, policy); each marker is on the chart of the value
     it is about (issue 34): the loss chart at steps 3 and 12, the gradient-norm chart at step
     3 (the non-finite gradient), no marker on the learning-rate, step-time or tokens/s charts;
     markers are drawn inside the plot area, with no text over it until the pointer is on one:
     then the chart names the event (its kind and step); in wall-time mode the markers move to
     (time_unix_ms - started_unix_ms) / 1000 of each event. The job (fp32, no pipeline) shows no
     loss-scale or pipeline-bubble panel, which it could never fill. Step 3's gradient norm,
     "NaN" in the API's series, is marked at the top edge of the gradient-norm chart and named
     in its text alternative (a line cannot draw it: it was left out), the loss chart has no
     such mark.
  b. A running job whose rank is stopped (SIGSTOP) with events.stall.seconds 2: the stall shows
     in the open page's list and as a marker without a reload (the event stream).
  c. No SEVERE entry in the browser console.
  d. A job with more events than ztraind keeps (its newest 1,000): loss_spike and
     grad_norm_spike with a threshold of almost 0 over a window of 2 fire some 1,800 times in
     1,500 steps. The list holds 1,000 rows and its title says "(1000 newest of N)", N the
     lines of the run directory's events.jsonl, where rank 0 writes every event; case a's title
     is "(2)"."""
import faulthandler
import os
import random
import shutil
import signal
import sys

sys.stdout.reconfigure(line_buffering=True)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
from svc import (BUILD, LONG, TEXT, Checker, Daemon, get_job, submit, temp_dir, tiny_job,  # noqa: E402
                 wait_state, wait_step, write_data)

from page import api, api_series, start_browser, wait_until  # noqa: E402

ck = Checker()
# The markers each chart must carry in case a: the event's own value's chart only.
WANT_MARKS = {"chart-loss": [3, 12], "chart-grad-norm": [3], "chart-lr": [],
              "chart-step-time": [], "chart-tps": []}


def open_job(drv, d, job_id):
    """Opens the job's page and waits until its view, not the previous job's, has loaded."""
    drv.get(f"{d.http_url}/#/jobs/{job_id}")
    return wait_until(lambda: drv.execute_script(
        "const v = document.querySelector('[data-testid=\"job-view\"]');"
        "return v && v.dataset.loaded === 'true' && "
        "v.querySelector('[data-field=\"id\"]').textContent === arguments[0];", job_id), 30)


def count_text(drv):
    return drv.execute_script(
        "return document.querySelector('[data-field=\"events-count\"]').textContent;")


def rows(drv):
    return drv.execute_script("""
        return [...document.querySelectorAll('[data-testid="event-row"]')].map(
          tr => [Number(tr.dataset.step), tr.dataset.kind, tr.children[2].textContent]);""")


# Each chart's markers: [[step, x_time, pixel, left, right], ...].
MARKS_JS = """
const c = document.querySelector(`[data-testid="${arguments[0]}"]`);
const ch = c && Chart.getChart(c);
if (!ch || !ch.$ztEvents) return null;
const time = ch.$ztXMode === 'time';
return ch.$ztEvents.map(e => [e.step, e.x_time,
  ch.scales.x.getPixelForValue(time ? e.x_time : e.step), ch.chartArea.left, ch.chartArea.right]);"""


def marks(drv, testid):
    return drv.execute_script(MARKS_JS, testid) or []


def non_finite(drv, testid):
    """The chart's marks of non-finite values as drawn: [{step, edge, px, left, right}]."""
    return drv.execute_script("""
        const ch = Chart.getChart(document.querySelector(`[data-testid="${arguments[0]}"]`));
        return (ch.$ztNonFiniteDrawn || []).map(m => ({step: m.step, edge: m.edge, px: m.px,
          left: ch.chartArea.left, right: ch.chartArea.right}));""", testid)


def hover_marker(drv, testid, step):
    """Moves the pointer onto the chart's marker at `step`; returns [[kind, step], ...] of the
    events the chart then says are under it ($ztHover), or None."""
    from selenium.webdriver.common.action_chains import ActionChains
    canvas = drv.find_element("css selector", f'[data-testid="{testid}"]')
    where = drv.execute_script("""
        const c = arguments[0], ch = Chart.getChart(c), r = c.getBoundingClientRect();
        return [ch.scales.x.getPixelForValue(arguments[1]) - r.width / 2,
                (ch.chartArea.top + ch.chartArea.bottom) / 2 - r.height / 2];""", canvas, step)
    ActionChains(drv).move_to_element_with_offset(canvas, int(where[0]), int(where[1])).perform()
    return wait_until(lambda: drv.execute_script("""
        const h = Chart.getChart(arguments[0]).$ztHover;
        return h ? h.events.map(e => [e.kind, e.step]) : null;""", canvas), 5)


def main():
    # A hang shows where it is before ctest's limit ends the test.
    faulthandler.dump_traceback_later(270, exit=True)
    tmp = temp_dir("ztrain-events-")
    os.environ["ZTRAIN_INJECT_NAN_GRAD"] = "3"
    # Every rank 0 sleeps 50 ms a step, so that the endless job of b sends the open page 20
    # records a second rather than hundreds, which two shared cores cannot draw.
    os.environ["ZTRAIN_INJECT_SLOW_RANK"] = "50"
    drv = start_browser()
    try:
        with Daemon(os.path.abspath(BUILD), tmp, max_ranks=2) as d:
            data = bytearray(TEXT)
            rnd = random.Random(5)
            for i in range(11 * 64, 12 * 64 + 1):
                data[i] = rnd.randrange(256)
            job = tiny_job(d.data_root, name="spiky", max_steps=16, data_name="spiky.txt",
                           deepspeed={"train_micro_batch_size_per_gpu": 2,
                                      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})
            write_data(d.data_root, "spiky.txt", bytes(data))
            job["data"]["shuffle"] = False
            job["events"] = {"nonfinite": {"policy": "skip"},
                             "loss_spike": {"zscore": 3, "window": 5, "policy": "skip"}}
            a = submit(d, job)
            wait_state(d, a.id, {"SUCCEEDED"}, timeout=120)
            want = [(e["step"], e["kind"], e["policy"])
                    for e in api(d, f"/api/v1/jobs/{a.id}/anomalies")["anomalies"]]
            ck.check([(s, k) for s, k, _ in want] == [(3, "nonfinite"), (12, "loss_spike")],
                     f"a: the API has both events: {want}")
            ck.check(open_job(drv, d, a.id), "a: the job page loads")
            got = wait_until(lambda: [tuple(r) for r in rows(drv)] == want and rows(drv), 10)
            ck.check([tuple(r) for r in (got or rows(drv))] == want,
                     f"a: the page lists the API's events: {rows(drv)}")
            ck.check(count_text(drv) == "(2)", f"a, d: the list's title counts them: "
                     f"{count_text(drv)!r}")
            for testid, steps in WANT_MARKS.items():
                m = marks(drv, testid)
                ck.check([x[0] for x in m] == steps and
                         all(left <= px <= right for _, _, px, left, right in m),
                         f"a: {testid} has markers at steps {steps} inside its plot: {m}")
            # The non-finite gradient norm of step 3 (NaN in the API's series) is marked at
            # the top edge of its chart (a line cannot draw it) and named in its text.
            steps, values = api_series(d, a.id, "train/grad_norm")
            nan_steps = [st for st, v in zip(steps, values) if v is None]
            ck.check(nan_steps == [3], f"a: the API's grad_norm is NaN at step 3 only: {nan_steps}")
            drawn = wait_until(lambda: non_finite(drv, "chart-grad-norm"), 5)
            ck.check([(x["step"], x["edge"]) for x in drawn or []] == [(3, "top")] and
                     all(x["left"] <= x["px"] <= x["right"] for x in drawn),
                     f"a: the grad-norm chart marks step 3's NaN at its top edge: {drawn}")
            ck.check(non_finite(drv, "chart-loss") == [], "a: the loss chart marks no NaN")
            label = drv.execute_script("return document.querySelector("
                                       "'[data-testid=\"chart-grad-norm\"]').getAttribute('aria-label');")
            ck.check("grad norm NaN at step 3" in (label or ""),
                     f"a: the chart's text names the NaN step: {label!r}")
            hidden = drv.execute_script(
                "return ['chart-loss-scale', 'chart-pipeline-bubble', 'chart-loss'].map(t => "
                "getComputedStyle(document.querySelector(`[data-testid=\"${t}\"]`).closest('figure'))"
                ".display === 'none');")
            ck.check(hidden == [True, True, False],
                     f"a: an fp32 job without stages shows no loss-scale or bubble panel "
                     f"(hidden: {hidden})")
            hovered = hover_marker(drv, "chart-loss", 12)
            ck.check(hovered == [["loss_spike", 12]],
                     f"a: the pointer on the loss chart's step-12 marker names it: {hovered}")
            started = api(d, f"/api/v1/jobs/{a.id}")["started_unix_ms"]
            times = {e["step"]: (e["time_unix_ms"] - started) / 1000
                     for e in api(d, f"/api/v1/jobs/{a.id}/anomalies")["anomalies"]}
            drv.find_element("css selector", '[data-testid="x-time"]').click()
            m = wait_until(lambda: drv.execute_script(
                "const ch = Chart.getChart(document.querySelector('[data-testid=\"chart-loss\"]'));"
                "return ch.$ztXMode === 'time';") and marks(drv, "chart-loss"), 5)
            ck.check(m and all(abs(x[1] - times[x[0]]) < 1e-6 for x in m),
                     f"a: wall-time markers at the events' times {times}: {m}")

            # b. A stall while the page is open.
            long = tiny_job(d.data_root, name="stalls", max_steps=LONG)
            long["events"] = {"stall": {"seconds": 2}, "nonfinite": {"policy": "skip"}}
            b = submit(d, long)
            wait_step(d, b.id, 3, timeout=120)
            ck.check(open_job(drv, d, b.id), "b: the running job's page loads")
            pid = get_job(d, b.id).ranks[0].pid
            os.kill(pid, signal.SIGSTOP)
            try:
                seen = wait_until(lambda: any(r[1] == "stall" for r in rows(drv)), 15)
                ck.check(seen, f"b: the stall appears on the open page: {rows(drv)}")
                ck.check(any(x[0] == get_job(d, b.id).step for x in marks(drv, "chart-loss")),
                         f"b: and as a marker at the last step: {marks(drv, 'chart-loss')}")
            finally:
                os.kill(pid, signal.SIGCONT)
            errors = [e["message"] for e in drv.get_log("browser") if e["level"] == "SEVERE"]
            ck.check(not errors, f"c: no SEVERE entries in the browser console: {errors}")
            # Off the page before its daemon stops, whose stream would fail to reconnect.
            drv.get("about:blank")

        # d. More events than are kept, on a daemon whose ranks neither sleep nor fail a step.
        for var in ("ZTRAIN_INJECT_NAN_GRAD", "ZTRAIN_INJECT_SLOW_RANK"):
            os.environ.pop(var, None)
        with Daemon(os.path.abspath(BUILD), temp_dir("ztrain-events-cap-"), max_ranks=1) as d:
            many = tiny_job(d.data_root, name="many", max_steps=1500, log_interval=500)
            many["events"] = {"loss_spike": {"zscore": 1e-6, "window": 2, "policy": "record"},
                              "grad_norm_spike": {"zscore": 1e-6, "window": 2,
                                                  "policy": "record"}}
            m = wait_state(d, submit(d, many).id, {"SUCCEEDED", "FAILED"}, timeout=120)
            with open(os.path.join(m.run_dir, "events.jsonl")) as f:
                n = sum(1 for line in f if line.strip())
            ck.check(n > 1100, f"d: rank 0 wrote {n} events, more than ztraind keeps")
            ck.check(open_job(drv, d, m.id), "d: the job page loads")
            want = f"(1000 newest of {n})"
            wait_until(lambda: count_text(drv) == want, 10)
            ck.check(count_text(drv) == want and len(rows(drv)) == 1000,
                     f"d: the list's title is {want!r}: {count_text(drv)!r}, "
                     f"{len(rows(drv))} rows")
            errors = [e["message"] for e in drv.get_log("browser") if e["level"] == "SEVERE"]
            ck.check(not errors, f"c, d: no SEVERE entries in the browser console: {errors}")
            drv.get("about:blank")
    finally:
        drv.quit()
    ck.done()


if __name__ == "__main__":
    if not shutil.which("/usr/bin/chromedriver"):
        raise SystemExit("FAIL: /usr/bin/chromedriver is missing (scripts/install-deps.sh installs it)")
    main()
