"""The dashboard, driven in headless Chromium (selenium, Debian's chromium-driver) against a real
ztraind running real jobs; the daemon's JSON API is the reference for everything the page shows.

A daemon with --max-ranks 2 gets job A (2 ranks, a few hundred steps, eval and checkpoints)
and then job B (2 ranks, endless), which therefore waits in QUEUED until A is done.

  a. The jobs page lists both: A reaches RUNNING and B shows QUEUED with the daemon's reason,
     and, not started (no startTime in the API), Elapsed and ETA "—" (Elapsed said "0s").
     Tab reaches A's link (with a visible focus outline) and Enter opens A's page.
  b. During training: a screenshot of the job page at laptop size goes to
     $ZTRAIN_BUILD/dashboard.png and one at phone size (390 px, mobile emulation) to
     $ZTRAIN_BUILD/dashboard-phone.png; neither width scrolls sideways, and on the phone the
     charts stack in one column. Then, five times, a new train/loss step is seen in
     /api/v1/jobs/{id}/metrics and becomes a point of the loss chart without a reload (the lag
     is printed, not judged).
  c. When A has SUCCEEDED (shown on the page without a reload): every chart's raw points equal
     /metrics for its key, step for step and bit for bit (train/loss, eval/loss, learning rate,
     step time, tokens/s, TFLOPS, grad norm); the smoothed loss equals TensorBoard's debiased EMA
     computed here from the API's values; wall-time mode puts each point at
     (time_unix_ms - started_unix_ms) / 1000 of /records; the log-scale toggle makes the loss
     axis logarithmic; hovering the chart shows a step and that step's exact loss. The rank
     table (exit status, memory of the last record), checkpoints, job spec, DeepSpeed config
     and log tail match the API.
  d. The jobs page shows A SUCCEEDED and B RUNNING; on B's page, Cancel and then the in-page
     confirmation (both by keyboard) cancel it: CANCELLED in the API and on both pages.
  e. A job whose init_from file holds no safetensors fails in its worker (a data file too short
     is refused at submit now): the FAILED state and
     the daemon's reason show in the jobs table (also under the FAILED filter) and on its page.
  f. No SEVERE entry in the browser's console in a-e and h (a missing favicon would be one).
  g. A daemon with a token: the page says 401 and asks for the token (focus in the field); a
     token with a zero-width space pasted along is refused naming the character (fetch()
     refused to send it, and the page said ztraind was not answering); a
     wrong token is rejected with 401 shown; the right one lists the job, and after a reload
     the stored token is used without asking. The console's only SEVERE entries are those 401
     responses.
  h. The job page's event stream, cut four times by a fetch() wrapper (inside an event, and
     between the two records of an eval step), resumes after the last event it had: each
     reconnection sends the last complete event's id as Last-Event-ID with the first stream's
     since_step, the streams together pass every record of /records from there once and in
     order, and the loss chart ends equal to /metrics.
  i. An ended job's stream opens with its end state and ends with it again after its history:
     cut right after that opening event, the page opens another stream (it used to take the
     opening end state for the stream's end and stop, missing every record), and the streams
     together pass every record of /records once."""
import json
import math
import os
import re
import shutil
import sys
import time
import urllib.request

sys.stdout.reconfigure(line_buffering=True)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
from svc import BUILD, TERMINAL, Checker, Daemon, submit, temp_dir, tiny_job, wait_state, write_data  # noqa: E402

from page import api, api_series, q, severe, start_browser, wait_until  # noqa: E402
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402

PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True}
TOKEN = "dash-7c41e2b9"
# The loss chart's keys and the other charts' (data-testid of the canvas, key).
CHART_KEYS = [("chart-loss", "train/loss"), ("chart-loss", "eval/loss"),
              ("chart-lr", "train/learning_rate"), ("chart-step-time", "perf/step_time_ms"),
              ("chart-tps", "perf/tokens_per_second"), ("chart-tflops", "perf/tflops"),
              ("chart-grad-norm", "train/grad_norm")]

ck = Checker()


# ---- the API, as a script sees it -------------------------------------------------------------

# ---- the browser ------------------------------------------------------------------------------

def text_of(drv, testid):
    try:
        return q(drv, testid).text
    except WebDriverException:
        return ""


def row_states(drv):
    """{job id: (state, reason)} as the jobs table shows them."""
    return drv.execute_script("""
        const out = {};
        for (const tr of document.querySelectorAll('[data-testid="job-row"]'))
          out[tr.dataset.jobId] = [tr.querySelector('[data-testid="state"]').textContent,
                                   tr.querySelector('[data-testid="reason"]').textContent];
        return out;""")


# Points of one dataset of a chart: [[step, x, y], ...]; role "raw" or "smoothed".
SERIES_JS = """
const c = document.querySelector(`[data-testid="${arguments[0]}"]`);
const ch = c && window.Chart && Chart.getChart(c);
if (!ch) return null;
const d = ch.data.datasets.find(d => d.ztKey === arguments[1] && d.ztRole === arguments[2]);
return d ? d.data.map(p => [p.step, p.x, p.y]) : null;"""


def chart_points(drv, testid, key, role="raw"):
    return drv.execute_script(SERIES_JS, testid, key, role) or []


def chart_max_step(drv):
    return drv.execute_script("""
        const c = document.querySelector('[data-testid="chart-loss"]');
        const ch = c && window.Chart && Chart.getChart(c);
        const d = ch && ch.data.datasets.find(d => d.ztKey === 'train/loss' && d.ztRole === 'raw');
        return d && d.data.length ? d.data[d.data.length - 1].step : -1;""")


def no_sideways_scroll(drv):
    return drv.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth + 1;")


def tensorboard_smooth(values, w):
    """TensorBoard's scalar smoothing: EMA from 0, debiased by 1 - w^n; a constant series is
    left as it is."""
    if all(v == values[0] for v in values):
        return list(values)
    out, last, n = [], 0.0, 0
    for v in values:
        last = last * w + (1 - w) * v
        n += 1
        out.append(last / (1 - w ** n))
    return out


def js_number(v):
    """How JavaScript's String() writes a double (the same as repr for the values here, except
    that integral values have no ".0")."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def fmt_bytes(v):
    """The page's byte format (binary units, one decimal)."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while abs(v) >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    return (f"{v:.1f}" if i else str(int(v))) + " " + units[i]


# ---- the cases --------------------------------------------------------------------------------

def main_job(d):
    job = tiny_job(d.data_root, name="dash-train", max_steps=800, world_size=2,
                   eval_interval=100, eval_steps=2, checkpoint_interval=200, warmup_steps=2)
    job["data"]["val"] = "train.txt"
    job["model"].update(n_layer=2, n_head=2, n_embd=64, block_size=64)
    job["deepspeed"] = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
                        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
                        "scheduler": {"type": "WarmupDecayLR",
                                      "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                                                 "warmup_num_steps": 50, "total_num_steps": 800}},
                        "zero_optimization": {"stage": 2}}
    return job


def case_list(drv, d, a_id, b_id):
    seen = {a_id: [], b_id: []}

    def watch():
        rows = row_states(drv)
        for jid in seen:
            if jid in rows and (not seen[jid] or seen[jid][-1] != rows[jid][0]):
                seen[jid].append(rows[jid][0])
        return rows.get(a_id, ("",))[0] == "RUNNING" and rows.get(b_id, ("",))[0] == "QUEUED"

    wait_until(watch, 30, poll=0.1)
    rows = row_states(drv)
    b_api = api(d, f"/api/v1/jobs/{b_id}")
    ck.check(seen[a_id] and seen[a_id][-1] == "RUNNING",
             f"a: the jobs page shows job A reaching RUNNING (states seen {seen[a_id]})")
    ck.check(rows.get(b_id, ("", ""))[0] == "QUEUED" and b_api["state"] == "QUEUED" and
             b_api["reason"] and rows[b_id][1] == b_api["reason"],
             f"a: job B is QUEUED with the daemon's reason ({rows.get(b_id)} vs {b_api['reason']!r})")
    times = drv.execute_script(
        "const tr = document.querySelector(`tr[data-job-id=\"${arguments[0]}\"]`);"
        "return tr && ['elapsed', 'eta'].map(t => tr.querySelector(`[data-testid=\"${t}\"]`).textContent);",
        b_id)
    ck.check(not b_api.get("started_unix_ms") and times == ["—", "—"],
             f"a: queued job B, not started ({b_api.get('started_unix_ms')}), shows Elapsed and ETA "
             f"as unknown: {times}")
    order = drv.execute_script("return [...document.querySelectorAll('[data-testid=\"job-row\"]')]"
                               ".map(tr => tr.dataset.jobId);")
    ck.check(order[:2] == [b_id, a_id], f"a: newest first ({order})")

    # Keyboard: Tab from the top of the page until A's link has the focus, then Enter.
    drv.execute_script("if (document.activeElement) document.activeElement.blur();")
    link = None
    for _ in range(40):
        ActionChains(drv).send_keys(Keys.TAB).perform()
        link = drv.switch_to.active_element
        if link.get_attribute("href") and link.get_attribute("href").endswith(f"#/jobs/{a_id}"):
            break
        link = None
    outline = drv.execute_script("return getComputedStyle(document.activeElement).outlineStyle;")
    ck.check(link is not None and outline not in ("none", ""),
             f"a: Tab reaches job A's link, with a visible focus outline ({outline})")
    if link is not None:
        ActionChains(drv).send_keys(Keys.ENTER).perform()
    else:
        drv.get(f"{d.http_url}/#/jobs/{a_id}")
    ok = wait_until(lambda: drv.execute_script(
        "const v = document.querySelector('[data-testid=\"job-view\"]');"
        "return v && v.dataset.loaded === 'true';"), 15)
    ck.check(ok and f"#/jobs/{a_id}" in drv.current_url, "a: Enter opens job A's page")
    return seen


def case_training(drv, d, a_id, build):
    # Enough steps for the charts to have a shape.
    j = wait_until(lambda: (lambda j: j if j["step"] >= 60 or j["state"] in TERMINAL else None)(
        api(d, f"/api/v1/jobs/{a_id}")), 60)
    running = j["state"] == "RUNNING"
    wait_until(lambda: chart_max_step(drv) >= 60, 5)
    shot = os.path.join(build, "dashboard.png")
    drv.save_screenshot(shot)
    ck.check(running and os.path.getsize(shot) > 10_000,
             f"b: laptop screenshot of the job page while it trains at step {j['step']}: {shot}")
    ck.check(no_sideways_scroll(drv), "b: at 1366 px the page does not scroll sideways")

    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
    time.sleep(0.5)
    phone_shot = os.path.join(build, "dashboard-phone.png")
    drv.save_screenshot(phone_shot)
    widths = drv.execute_script("""
        return [window.innerWidth,
                ...[...document.querySelectorAll('.chart-card')]
                    .filter(c => getComputedStyle(c).display !== 'none')
                    .map(c => c.getBoundingClientRect().left)];""")
    ck.check(widths[0] == PHONE["width"] and no_sideways_scroll(drv) and len(set(widths[1:])) == 1,
             f"b: at {widths[0]} px (phone) nothing scrolls sideways and the charts stack in one "
             f"column; screenshot {phone_shot}")
    drv.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    time.sleep(0.3)

    # A new step in the API becomes a point of the loss chart without a reload. The lag is
    # printed as a measurement, never judged: a loaded CI machine may take seconds; a page
    # that stopped following the job never shows the step at all (30 s bound).
    lags, missed = [], []
    for _ in range(5):
        steps, _ = api_series(d, a_id, "train/loss")
        known = steps[-1] if steps else 0
        new = wait_until(lambda: api_series(d, a_id, "train/loss", known + 1)[0], 10, poll=0.01)
        if not new:
            break  # job A finished: no newer step will come
        t_api = time.monotonic()
        if wait_until(lambda: chart_max_step(drv) >= new[0], 30, poll=0.01):
            lags.append(time.monotonic() - t_api)
        else:
            missed.append(new[0])
    if not lags and not missed:
        # Job A ended before a new step could be watched: the chart must still reach its last.
        steps, _ = api_series(d, a_id, "train/loss")
        last = steps[-1] if steps else 0
        if wait_until(lambda: chart_max_step(drv) >= last, 30, poll=0.05):
            lags.append(0.0)
        else:
            missed.append(last)
    ck.check(lags and not missed,
             "b: new steps reach the loss chart without a reload (lag after the API: "
             + (", ".join(f"{x * 1000:.0f} ms" for x in lags) or "none measured")
             + (f"; never shown: steps {missed}" if missed else "") + ")")


def case_finished(drv, d, a_id):
    j = wait_state(d, a_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    a = api(d, f"/api/v1/jobs/{a_id}")
    ck.check(a["state"] == "SUCCEEDED", f"c: job A SUCCEEDED ({a['state']} {a['reason']})")
    shown = wait_until(lambda: text_of(drv, "job-state") == "SUCCEEDED", 5)
    ck.check(shown, f"c: the job page shows SUCCEEDED without a reload ({text_of(drv, 'job-state')})")
    time.sleep(0.5)

    for testid, key in CHART_KEYS:
        steps, values = api_series(d, a_id, key)
        pts = chart_points(drv, testid, key)
        ok = len(steps) > 0 and [p[0] for p in pts] == steps and [p[2] for p in pts] == values
        ck.check(ok, f"c: {testid} plots {key} exactly as /metrics: {len(pts)} points vs "
                     f"{len(steps)} in the API")

    steps, values = api_series(d, a_id, "train/loss")
    drv.execute_script("""
        const s = document.querySelector('[data-testid="smoothing"]');
        s.value = '0.9'; s.dispatchEvent(new Event('input'));""")
    sm = chart_points(drv, "chart-loss", "train/loss", "smoothed")
    ref = tensorboard_smooth(values, 0.9)
    worst = max((abs(p[2] - r) / abs(r) for p, r in zip(sm, ref)), default=math.inf)
    ck.check(len(sm) == len(ref) and worst < 1e-12 and text_of(drv, "smoothing-value") == "0.90",
             f"c: smoothing 0.9 is TensorBoard's debiased EMA of the API values (worst rel. "
             f"difference {worst:.1e})")

    recs = api(d, f"/api/v1/jobs/{a_id}/records?since_step=0")["records"]
    t_of = {r["step"]: r["time_unix_ms"] for r in recs if "train/loss" in r["values"]}
    q(drv, "x-time").click()
    pts = chart_points(drv, "chart-loss", "train/loss")
    bad = [p for p in pts if abs(p[1] - (t_of[p[0]] - a["started_unix_ms"]) / 1000) > 1e-9]
    title = drv.execute_script("return Chart.getChart(document.querySelector("
                               "'[data-testid=\"chart-loss\"]')).options.scales.x.title.text;")
    ck.check(pts and not bad and "wall time" in title,
             f"c: wall-time mode: x = seconds since the job started, from /records ({len(bad)} off;"
             f" axis '{title}')")
    q(drv, "x-step").click()

    q(drv, "loss-log").click()
    scale = drv.execute_script("return Chart.getChart(document.querySelector("
                               "'[data-testid=\"chart-loss\"]')).scales.y.type;")
    ck.check(scale == "logarithmic", f"c: the log-scale toggle makes the loss axis {scale}")
    q(drv, "loss-log").click()

    # Hover in the middle of the loss chart: the tooltip names a step and its exact loss.
    canvas = q(drv, "chart-loss")
    drv.execute_script("arguments[0].scrollIntoView({block: 'center'});", canvas)
    ActionChains(drv).move_to_element(canvas).perform()
    tip = wait_until(lambda: drv.execute_script("""
        const ch = Chart.getChart(document.querySelector('[data-testid="chart-loss"]'));
        const t = ch.tooltip;
        if (!t || !t.opacity || !t.title || !t.title.length) return null;
        return [t.title[0], t.body.map(b => b.lines.join(' '))];"""), 3)
    value_at = dict(zip(steps, values))
    ok = False
    if tip:
        step = int(tip[0].split()[-1])
        ok = tip[0].startswith("step ") and f"train loss: {js_number(value_at[step])}" in tip[1]
    ck.check(ok, f"c: hovering the loss chart shows a step and its exact loss ({tip})")

    # Ranks: exit status and the memory of the last record.
    last = [r for r in recs if "memory/rank1/params_bytes" in r["values"]][-1]["values"]
    rows = drv.execute_script("""
        return [...document.querySelectorAll('[data-testid="rank-row"]')]
          .map(tr => [...tr.children].map(td => td.textContent));""")
    want = [[str(r), "exited 0", str(a["ranks"][r]["pid"]),
             fmt_bytes(last[f"memory/rank{r}/params_bytes"]),
             fmt_bytes(last[f"memory/rank{r}/grads_bytes"]),
             fmt_bytes(last[f"memory/rank{r}/optimizer_bytes"]),
             fmt_bytes(last[f"memory/rank{r}/peak_rss_bytes"]),
             "—"] for r in range(2)]  # a CPU job has no device peak
    ck.check([row[:8] for row in rows] == want,
             f"c: the rank table shows exit status and memory from the last record: {rows}")

    # The page lists the checkpoints as it polls; the last one may land between two polls, so
    # the page is given a few seconds to show what the API lists.
    deadline = time.time() + 10
    while True:
        tags = drv.execute_script("""
            return [...document.querySelectorAll('[data-testid="checkpoint-row"]')]
              .map(tr => tr.children[0].textContent);""")
        want_tags = [c["tag"] for c in api(d, f"/api/v1/jobs/{a_id}/checkpoints")["checkpoints"]]
        if (tags and tags == want_tags) or time.time() > deadline:
            break
        time.sleep(0.25)
    ck.check(tags and tags == want_tags, f"c: checkpoints as in the API: {tags} vs {want_tags}")
    spec = dict(a["spec"])
    ds = spec.pop("deepspeed")
    ck.check(json.loads(text_of(drv, "spec")) == spec and json.loads(text_of(drv, "ds-config")) == ds,
             "c: the job spec and the DeepSpeed config are shown as the API has them")
    tail = api(d, f"/api/v1/jobs/{a_id}/logs?tail=3")["lines"]
    log_text = drv.execute_script("return document.querySelector('[data-testid=\"log\"]').textContent;")
    ck.check(tail and all(line["text"] in log_text for line in tail),
             f"c: the log tail ends with the API's last lines ({tail[-1]['text'] if tail else None!r})")


def case_cancel(drv, d, a_id, b_id, seen):
    drv.get(f"{d.http_url}/#/")

    def watch():
        rows = row_states(drv)
        for jid in seen:
            if jid in rows and seen[jid][-1:] != [rows[jid][0]]:
                seen[jid].append(rows[jid][0])
        return rows.get(a_id, ("",))[0] == "SUCCEEDED" and rows.get(b_id, ("",))[0] == "RUNNING"

    ok = wait_until(watch, 30, poll=0.1)
    ck.check(ok, f"d: the jobs page shows A {seen[a_id]} and B {seen[b_id]}")
    drv.get(f"{d.http_url}/#/jobs/{b_id}")
    wait_until(lambda: text_of(drv, "job-state") == "RUNNING", 10)
    # Leaving the page while its event stream is open, and coming back, is quiet (f).
    q(drv, "back").click()
    wait_until(lambda: b_id in row_states(drv), 5)
    drv.back()
    wait_until(lambda: text_of(drv, "job-state") == "RUNNING", 10)
    q(drv, "cancel").send_keys(Keys.ENTER)
    confirm_shown = q(drv, "cancel-confirm-box").is_displayed()
    still = api(d, f"/api/v1/jobs/{b_id}")["state"]
    q(drv, "cancel-confirm").send_keys(Keys.ENTER)
    j = wait_state(d, b_id, TERMINAL, timeout=30)
    b = api(d, f"/api/v1/jobs/{b_id}")
    ck.check(confirm_shown and still == "RUNNING" and b["state"] == "CANCELLED",
             f"d: Cancel asks first (job still {still}), the confirmation cancels it: "
             f"{b['state']} ({b['reason']})")
    shown = wait_until(lambda: text_of(drv, "job-state") == "CANCELLED", 5)
    ck.check(shown and not q(drv, "cancel").is_displayed(),
             f"d: the job page shows CANCELLED and no cancel button "
             f"({text_of(drv, 'job-state')}; {text_of(drv, 'cancel-status')})")
    q(drv, "back").click()
    wait_until(lambda: row_states(drv).get(b_id, ("",))[0] == "CANCELLED", 5)
    watch()
    ck.check(seen[b_id][-1:] == ["CANCELLED"] and "QUEUED" in seen[b_id] and
             seen[b_id].index("QUEUED") < seen[b_id].index("RUNNING"),
             f"d: the jobs page followed B: {' -> '.join(seen[b_id])}; A: {' -> '.join(seen[a_id])}")


def case_failed(drv, d):
    job = tiny_job(d.data_root, name="dash-fails", max_steps=50)
    job["model"]["init_from"] = write_data(d.data_root, "short.txt", b"far too short")
    c_id = submit(d, job).id
    wait_state(d, c_id, TERMINAL, timeout=30)
    c = api(d, f"/api/v1/jobs/{c_id}")
    ck.check(c["state"] == "FAILED" and c["reason"], f"e: the job fails: {c['reason']!r}")
    drv.get(f"{d.http_url}/#/")
    row = wait_until(lambda: row_states(drv).get(c_id), 5)
    ck.check(row == ["FAILED", c["reason"]], f"e: the jobs table shows FAILED and the reason: {row}")
    Select(q(drv, "state-filter")).select_by_visible_text("FAILED")
    only = wait_until(lambda: (lambda r: r if list(r) == [c_id] else None)(row_states(drv)), 5)
    ck.check(only and "state=FAILED" in drv.current_url,
             f"e: the FAILED filter lists only that job ({list(row_states(drv))})")
    drv.get(f"{d.http_url}/#/jobs/{c_id}")
    wait_until(lambda: text_of(drv, "job-reason"), 5)
    ck.check(text_of(drv, "job-state") == "FAILED" and text_of(drv, "job-reason") == c["reason"],
             f"e: the job page shows FAILED and the reason ({text_of(drv, 'job-reason')!r})")


# Wraps fetch() before the page's first script: each event stream the page opens is recorded
# (its URL, the Last-Event-ID it sent, and the complete events it passed on as [event, seq, id,
# step, state]), and cut where the rule says. The rule is a JS object: before(n, rec), asked
# before each complete event of the n-th stream, returns null to pass the event on, 'half' to
# pass half of it and end the stream, or 'before' to end the stream without it; after(n, rec,
# name, data), when given, sees each event passed on.
STREAM_RECORDER_JS = r"""
(() => {
  const real = window.fetch;
  const rule = RULE;
  window.__streams = [];
  window.fetch = async function (input, init) {
    const url = typeof input === 'string' ? input : input.url;
    if (!/\/events\?/.test(url)) return real.apply(this, arguments);
    const rec = {url, lastEventId: new Headers((init && init.headers) || {}).get('Last-Event-ID'),
                 events: [], cut: false, done: false};
    const n = window.__streams.push(rec);
    const res = await real.apply(this, arguments);
    const reader = res.body.getReader();
    const enc = new TextEncoder(), dec = new TextDecoder();
    let pending = '';
    const body = new ReadableStream({
      async pull(ctrl) {
        for (;;) {
          const i = pending.indexOf('\n\n');
          if (i >= 0) {
            const ev = pending.slice(0, i + 2);
            pending = pending.slice(i + 2);
            const name = /^event: (\w+)$/m.exec(ev), data = /^data: (.*)$/m.exec(ev);
            const id = /^id: (.*)$/m.exec(ev);
            const how = name && data ? rule.before(n, rec) : null;
            if (how) {
              if (how === 'half') ctrl.enqueue(enc.encode(ev.slice(0, Math.floor(ev.length / 2))));
              rec.cut = true;
              reader.cancel();
              ctrl.close();
              return;
            }
            if (name && data) {
              const d = JSON.parse(data[1]);
              rec.events.push([name[1], Number(d.seq || 0), id ? id[1] : null, Number(d.step),
                               d.state || null]);
              if (rule.after) rule.after(n, rec, name[1], d);
            }
            ctrl.enqueue(enc.encode(ev));
            return;
          }
          const {value, done} = await reader.read();
          if (done) {
            rec.done = true;
            if (pending) ctrl.enqueue(enc.encode(pending));
            ctrl.close();
            return;
          }
          pending += dec.decode(value, {stream: true});
        }
      },
      cancel() { rec.done = true; reader.cancel(); },
    });
    return new Response(body, {status: res.status, statusText: res.statusText,
                               headers: res.headers});
  };
})();
"""


def stream_recorder(rule):
    """STREAM_RECORDER_JS with the cut rule `rule` (JS source of the rule object)."""
    return STREAM_RECORDER_JS.replace("RULE", rule)


# Case h: the first four streams are cut, as a network drop or a proxy would: the first two
# inside their seventh and ninth event, the next two right after the first record of an eval
# step (of two records), each with part of the following event passed on.
CUT_STREAMS_JS = stream_recorder("""{
  before: (n, rec) => (rec.cutNext || (n <= 2 && rec.events.length === 4 + 2 * n)) ? 'half' : null,
  after: (n, rec, name, d) => {
    rec.cutNext = n > 2 && n <= 4 && name === 'metrics' && Number(d.step) > 0 &&
                  Number(d.step) % 20 === 0 && rec.events.length > 3;
  },
}""")


def case_resume(drv, d):
    """h. The job page's event stream cut four times (inside an event, and between the two
    records of an eval step) resumes each time after the last event it had: every reconnection
    sends the id of the last complete event before it as Last-Event-ID with the first stream's
    since_step; together the streams pass every record of /records from that step once, in
    order; and once the job has ended the loss chart is /metrics exactly."""
    job = tiny_job(d.data_root, name="dash-resume", max_steps=600, eval_interval=20,
                   eval_steps=1, warmup_steps=2)
    job["data"]["val"] = "train.txt"
    # Steps slow enough that the page, opened at submission, streams most of them.
    job["model"].update(n_embd=64, block_size=64)
    job["deepspeed"]["train_micro_batch_size_per_gpu"] = 4
    script = drv.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                 {"source": CUT_STREAMS_JS})
    try:
        c_id = submit(d, job).id
        # A new document, so that the wrapper runs before the page's scripts (a change of the
        # hash alone keeps the page that is open).
        drv.get("about:blank")
        drv.get(f"{d.http_url}/#/jobs/{c_id}")
        wait_until(lambda: drv.execute_script(
            "const v = document.querySelector('[data-testid=\"job-view\"]');"
            "return v && v.dataset.loaded === 'true';"), 15)
        wait_state(d, c_id, TERMINAL, timeout=120)
        # The last stream ends with the terminal job event, after which the page opens none. On
        # a loaded machine (the suite's other tests) the page takes its time over 600 steps, and
        # may reconnect only after the job ended: that stream opens with the end state too, so
        # it counts once it is over (done), not at its first event.
        streams = wait_until(lambda: (lambda s: s if s and not s[-1]["cut"] and s[-1]["done"] and
                                      s[-1]["events"][-1:] and s[-1]["events"][-1][0] == "job"
                                      and text_of(drv, "job-state") in TERMINAL else None)(
            drv.execute_script("return window.__streams;")), 120) or \
            drv.execute_script("return window.__streams;") or []
    finally:
        drv.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                            {"identifier": script["identifier"]})
    urls = [s["url"] for s in streams]
    cuts = [s["cut"] for s in streams]
    ck.check(len(streams) >= 5 and cuts[:4] == [True] * 4 and len(set(urls)) == 1,
             f"h: the page reconnected after each of the 4 cuts, with the same query "
             f"({len(streams)} streams, cut {cuts}, {set(urls)})")
    last = None
    sent_ok = True
    for s in streams:
        sent_ok &= s["lastEventId"] == last
        ids = [e[2] for e in s["events"] if e[2]]
        last = ids[-1] if ids else last
    ck.check(sent_ok, "h: each reconnection sends the id of the last complete event before it "
             f"as Last-Event-ID ({[s['lastEventId'] for s in streams]})")
    since = int(re.search(r"since_step=(\d+)", urls[0]).group(1)) if urls else -1
    # The records' seqs as the API gives them (proto3 JSON: int64 as text).
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{c_id}/records?since_step={since}",
                                timeout=30) as r:
        recs = [int(x["seq"]) for x in json.load(r)["records"]]
    got = [e[1] for s in streams for e in s["events"] if e[0] == "metrics"]
    two = [e[3] for s in streams[2:4] for e in s["events"][-1:]]
    ck.check(got == recs and len(got) >= 20,
             f"h: the streams passed every record from step {since} once, in order "
             f"({len(got)} of {len(recs)}; cut after the first record of steps {two})")
    # 600 steps: fewer than a chart line keeps (1,000), so the chart holds every one.
    # The charts are redrawn a few times a second: the last redraw may still be to come.
    steps, values = api_series(d, c_id, "train/loss")
    pts = wait_until(lambda: (lambda p: p if [x[0] for x in p] == steps else None)(
        chart_points(drv, "chart-loss", "train/loss")), 10) or \
        chart_points(drv, "chart-loss", "train/loss")
    ck.check(steps and [p[0] for p in pts] == steps and [p[2] for p in pts] == values,
             f"h: the loss chart is /metrics exactly ({len(pts)} points, {len(steps)} in the API)")


# Case i: the first stream is cut right after its first complete event (the job's state),
# passing nothing more of it; later streams pass through.
CUT_AFTER_OPENING_JS = stream_recorder("""{
  before: (n, rec) => (n === 1 && rec.events.length === 1 ? 'before' : null),
}""")


def case_ended_cut(drv, d):
    """i. An ended job's stream cut right after its opening event (its end state)."""
    job = tiny_job(d.data_root, name="dash-ended-cut", max_steps=12)
    c_id = submit(d, job).id
    wait_state(d, c_id, TERMINAL, timeout=120)
    script = drv.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                 {"source": CUT_AFTER_OPENING_JS})
    try:
        drv.get("about:blank")
        drv.get(f"{d.http_url}/#/jobs/{c_id}")
        # The second stream opens with the end state as well: over once it is done.
        streams = wait_until(lambda: (lambda s: s if len(s) >= 2 and s[-1]["done"] and
                                      s[-1]["events"][-1:] and
                                      s[-1]["events"][-1][0] == "job" else None)(
            drv.execute_script("return window.__streams;")), 60) or \
            drv.execute_script("return window.__streams;") or []
    finally:
        drv.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                            {"identifier": script["identifier"]})
    first = streams[0]["events"] if streams else []
    ck.check(len(streams) >= 2 and streams[0]["cut"] and [e[0] for e in first] == ["job"],
             f"i: the ended job's first stream, cut after its opening state, is followed by "
             f"another ({len(streams)} streams, the first gave {first})")
    since = int(re.search(r"since_step=(\d+)", streams[0]["url"]).group(1)) if streams else -1
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{c_id}/records?since_step={since}",
                                timeout=30) as r:
        recs = [int(x["seq"]) for x in json.load(r)["records"]]
    got = [e[1] for s in streams for e in s["events"] if e[0] == "metrics"]
    ck.check(got == recs, f"i: the streams passed every record from step {since} once ({got} of "
             f"{recs})")
    drv.get("about:blank")


def case_token(drv, build):
    tmp = temp_dir("ztrain-dash-token-")
    with Daemon(build, tmp, max_ranks=1, token=TOKEN) as d:
        c_id = submit(d, tiny_job(d.data_root, name="dash-token", max_steps=5)).id
        drv.get(f"{d.http_url}/#/")
        asked = wait_until(lambda: q(drv, "token-panel").is_displayed() and
                           "401" in text_of(drv, "banner"), 10)
        focused = drv.switch_to.active_element.get_attribute("data-testid")
        ck.check(asked and focused == "token-input",
                 f"g: without a token the page says {text_of(drv, 'banner')!r} and asks for one "
                 f"(focus: {focused})")
        # A zero-width space pasted along with the token: no header can carry it.
        q(drv, "token-input").send_keys(TOKEN[:4] + "\u200b" + TOKEN[4:])
        q(drv, "token-save").click()
        said = wait_until(lambda: "U+200B at character 5" in text_of(drv, "banner"), 5)
        stored = drv.execute_script("return [localStorage.getItem('ztrain.token'), "
                                    "sessionStorage.getItem('ztrain.token')]")
        ck.check(said and q(drv, "token-panel").is_displayed() and stored == [None, None],
                 f"g: a token with a character no header can carry is refused naming it, not "
                 f"stored: {text_of(drv, 'banner')!r}")
        q(drv, "token-input").clear()
        q(drv, "token-input").send_keys("not-the-token")
        q(drv, "token-save").click()
        rejected = wait_until(lambda: "rejected" in text_of(drv, "banner") and
                              q(drv, "token-panel").is_displayed(), 10)
        ck.check(rejected and "401" in text_of(drv, "banner"),
                 f"g: a wrong token: {text_of(drv, 'banner')!r}")
        q(drv, "token-input").send_keys(TOKEN + Keys.ENTER)
        listed = wait_until(lambda: c_id in row_states(drv), 10)
        ck.check(listed and not q(drv, "banner").is_displayed() and
                 not q(drv, "token-panel").is_displayed(),
                 "g: the right token lists the job and the 401 message is gone")
        drv.refresh()
        listed = wait_until(lambda: c_id in row_states(drv), 10)
        ck.check(listed and not q(drv, "token-panel").is_displayed(),
                 "g: after a reload the stored token is used without asking again")
        stored = drv.execute_script("return [localStorage.getItem('ztrain.token'), "
                                    "sessionStorage.getItem('ztrain.token')]")
        ck.check(stored == [None, TOKEN], f"g: the token is kept for the tab only, not in local "
                 f"storage, unless asked to be remembered ({stored[0] is not None}, "
                 f"{stored[1] == TOKEN})")
        errors = severe(drv, lambda m: "401" in m and "/api/v1/" in m)
        ck.check(not errors, f"g: no console errors besides the 401 responses: {errors}")


def main():
    build = os.path.abspath(BUILD)
    tmp = temp_dir("ztrain-dash-")
    drv = start_browser()
    try:
        with Daemon(build, tmp, max_ranks=2) as d:
            drv.get(f"{d.http_url}/#/")
            wait_until(lambda: "ztraind ok" in text_of(drv, "health"), 10)
            a_id = submit(d, main_job(d)).id
            b_job = main_job(d)
            b_job["name"] = "dash-cancel-me"
            # Every step: the open page gets hundreds of records a second, which it draws a few
            # times a second from bounded series (test_fast_job measures it).
            b_job["train"] = {"max_steps": 1_000_000, "log_interval": 1, "warmup_steps": 2}
            del b_job["data"]["val"]
            b_job["deepspeed"]["scheduler"]["params"]["total_num_steps"] = 1_000_000
            b_id = submit(d, b_job).id
            seen = case_list(drv, d, a_id, b_id)
            case_training(drv, d, a_id, build)
            case_finished(drv, d, a_id)
            case_cancel(drv, d, a_id, b_id, seen)
            case_failed(drv, d)
            case_resume(drv, d)
            case_ended_cut(drv, d)
            errors = severe(drv)
            ck.check(not errors, f"f: no SEVERE entries in the browser console: {errors}")
        case_token(drv, build)
    finally:
        drv.quit()
    ck.done()


if __name__ == "__main__":
    if not shutil.which("/usr/bin/chromedriver"):
        raise SystemExit("FAIL: /usr/bin/chromedriver is missing (scripts/install-deps.sh installs it)")
    main()
