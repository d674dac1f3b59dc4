"""The dashboard's comparison page, driven in headless Chromium (selenium, Debian's chromium-driver)
against a real ztraind; the daemon's JSON API is the reference for what the page shows, and the
diff is checked against one computed here in Python from the jobs' specs and effective configs.

Two one-rank jobs, the same but for their names and learning rates (1e-3 and 5e-4), run to the
end with an eval every 20 steps.

  a. On the jobs page, checking both rows' boxes enables "Compare selected", which opens
     #/compare?jobs=<A>,<B>.
  b. Every chart's line of each job equals /metrics for its key, step for step and bit for bit
     (train/loss, eval/loss, learning rate, step time, tokens/s, TFLOPS, grad norm), with x the
     step; the two learning-rate lines differ.
  c. The job-spec and effective-config tables show exactly the keys that differ (the paths of a
     flattening done here): the name, and optimizer.params.lr with B's cell marked "changed"
     holding 0.0005 against A's 0.001; "show unchanged keys" shows every key of both configs.
  d. Wall time on the x axis puts each point at (time_unix_ms - started_unix_ms) / 1000 of
     /records, and the URL says x=time and all=1; opening that URL afresh restores the view (the
     jobs in their order, wall time, every key shown, the same points). The log-scale box makes
     the loss axis logarithmic and adds log=1.
  e. No SEVERE entry in the browser's console.
  f. A running job compared with A: its lines grow as it trains (the page polls), every point
     equal to /metrics.
  g. A job id that does not exist is marked "not found", the banner names it, and the other
     job is still drawn.
  h. A job of 3,000 steps logged every step, compared with A: each of its lines holds at most
     1,000 points, up to its last step, each equal to /metrics at its step; the page read no
     more than a megabyte for it (it read every record, all keys, 3.5 MB here and 120 MB for
     100,000 steps, and kept them all).
  i. The loss-scale card is hidden while no job compared trains in fp16 (A and B: the API has
     no train/loss_scale for either), as the job page hides it; it showed an empty chart. The
     other cards stay. A compared with a one-rank fp16 job shows it, the fp16 job's line equal
     to /metrics.
A screenshot of the restored view goes to $ZTRAIN_BUILD/compare.png."""
import json
import os
import re
import sys
import time

sys.stdout.reconfigure(line_buffering=True)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
from svc import (BUILD, LONG, Checker, Daemon, stubs, submit, temp_dir, tiny_job,  # noqa: E402
                 wait_state, wait_step)

from page import api, api_series, q, start_browser, wait_until  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHART_KEYS = [("cmp-chart-loss", "train/loss"), ("cmp-chart-loss", "eval/loss"),
              ("cmp-chart-lr", "train/learning_rate"), ("cmp-chart-step-time", "perf/step_time_ms"),
              ("cmp-chart-tps", "perf/tokens_per_second"), ("cmp-chart-tflops", "perf/tflops"),
              ("cmp-chart-grad-norm", "train/grad_norm")]

ck = Checker()


def all_records(d, job_id):
    out, query = [], "since_step=0"
    while query:
        page = api(d, f"/api/v1/jobs/{job_id}/records?{query}")
        out += page["records"]
        query = page["next_page_token"] and f"page_token={page['next_page_token']}"
    return out


# ---- an independent flattening of JSON, for the diff ------------------------------------------

def flatten(doc):
    """{path: leaf} with the page's path syntax: .key for identifiers, ["key"] otherwise, [i] for
    array elements; empty objects and arrays are leaves."""
    out = {}

    def walk(v, path):
        if isinstance(v, list) and v:
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")
        elif isinstance(v, dict) and v:
            for k, x in v.items():
                seg = f".{k}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) else f"[{json.dumps(k)}]"
                walk(x, path + seg)
        else:
            out[path[1:] if path.startswith(".") else path] = v

    walk(doc, "")
    return out


def differing_paths(a, b):
    fa, fb = flatten(a), flatten(b)
    return {p for p in set(fa) | set(fb)
            if p not in fa or p not in fb or json.dumps(fa[p]) != json.dumps(fb[p])}


# ---- the page ---------------------------------------------------------------------------------

POINTS_JS = """
const c = document.querySelector(`[data-testid="${arguments[0]}"]`);
const ch = c && window.Chart && Chart.getChart(c);
if (!ch) return null;
const d = ch.data.datasets.find(d => d.ztKey === arguments[1] && d.ztJob === arguments[2]);
// Decimation (long lines) swaps dataset.data for the thinned points and keeps the whole in _data.
return d ? (d._data || d.data).map(p => [p.step, p.x, p.y]) : null;"""


def chart_points(drv, testid, key, job_id):
    return drv.execute_script(POINTS_JS, testid, key, job_id) or []


DIFF_JS = """
return [...document.querySelectorAll(`[data-testid="${arguments[0]}"] [data-testid="diff-row"]`)]
  .map(tr => ({path: tr.dataset.path, hidden: tr.hidden, differs: tr.classList.contains('differs'),
               cells: [...tr.querySelectorAll('td')].map(td => [td.dataset.status, td.textContent])}));"""


def diff_rows(drv, table):
    return drv.execute_script(DIFF_JS, table)


def cards_shown(drv):
    """{chart testid: whether its card is shown} of the comparison's charts."""
    return drv.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('[data-testid=\"compare-view\"] "
        "canvas[data-chart]')].map(c => [c.dataset.testid, getComputedStyle(c.closest('figure'))"
        ".display !== 'none']));")


def loaded(drv):
    return drv.execute_script(
        "const v = document.querySelector('[data-testid=\"compare-view\"]');"
        "return v && v.dataset.loaded === 'true';")


def check_lines(drv, d, ids, series, what):
    for testid, key in CHART_KEYS:
        for jid in ids:
            got = [(s, y) for s, x, y in chart_points(drv, testid, key, jid)]
            xs_ok = all(s == x for s, x, _ in chart_points(drv, testid, key, jid))
            ck.check(got == series[jid][key] and len(got) > 0 and xs_ok,
                     f"{what}: {testid} {key} of {jid}: {len(got)} points equal /metrics, x = step")


def check_time_axis(drv, d, ids, what):
    for jid in ids:
        job = api(d, f"/api/v1/jobs/{jid}")
        recs = all_records(d, jid)
        want = [(r["step"], (r["time_unix_ms"] - job["started_unix_ms"]) / 1000) for r in recs
                if isinstance(r["values"].get("train/loss"), (int, float))]
        got = [(s, x) for s, x, _ in chart_points(drv, "cmp-chart-loss", "train/loss", jid)]
        ck.check(len(got) == len(want) and all(a == b and abs(x - y) < 1e-9
                                               for (a, x), (b, y) in zip(got, want)),
                 f"{what}: wall time of {jid}'s loss points is (time_unix_ms - started) / 1000")


def main():
    tmp = temp_dir("ztrain-compare-")
    drv = None
    with Daemon(BUILD, tmp, max_ranks=2) as d:
        ids = []
        for name, lr in (("cmp-a", 1e-3), ("cmp-b", 5e-4)):
            job = tiny_job(d.data_root, name=name, max_steps=80, eval_interval=20, eval_steps=1)
            job["data"]["val"] = "train.txt"
            job["deepspeed"]["optimizer"]["params"]["lr"] = lr
            ids.append(submit(d, job).id)
        fp16 = tiny_job(d.data_root, name="cmp-fp16", max_steps=40)
        fp16["deepspeed"]["fp16"] = {"enabled": True}
        fp16_id = submit(d, fp16).id
        for jid in ids + [fp16_id]:
            j = wait_state(d, jid, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
            ck.check(j.state == 5, f"job {jid} succeeded ({j.reason})")
        jobs = {jid: api(d, f"/api/v1/jobs/{jid}") for jid in ids}
        series = {jid: {key: list(zip(*api_series(d, jid, key))) for _, key in CHART_KEYS} for jid in ids}
        try:
            drv = start_browser()
            # a. select both on the jobs page
            drv.get(d.http_url + "/")
            wait_until(lambda: len(drv.find_elements(By.CSS_SELECTOR, '[data-testid="job-select"]')) == 3, 15)
            button = q(drv, "compare-selected")
            ck.check(button.get_attribute("disabled") is not None, "a: Compare is disabled with nothing checked")
            for jid in ids:
                drv.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{jid}"] [data-testid="job-select"]').click()
            ck.check(button.get_attribute("disabled") is None, "a: two checked jobs enable Compare")
            button.click()
            ok = wait_until(lambda: loaded(drv), 20)
            url = drv.execute_script("return location.hash;")
            ck.check(ok and url == f"#/compare?jobs={ids[0]},{ids[1]}", f"a: the comparison opens at {url}")

            # b. the lines
            check_lines(drv, d, ids, series, "b")
            lr = [chart_points(drv, "cmp-chart-lr", "train/learning_rate", jid) for jid in ids]
            ck.check(lr[0] and lr[1] and lr[0][0][2] != lr[1][0][2], "b: the learning-rate lines differ")

            # i. no job in fp16: no loss-scale card
            scales = [api_series(d, jid, "train/loss_scale")[0] for jid in ids]
            shown = cards_shown(drv)
            ck.check(scales == [[], []] and shown == {**{t: True for t, _ in CHART_KEYS},
                                                      "cmp-chart-loss-scale": False},
                     f"i: two fp32 jobs: the loss-scale card hidden, the others shown ({shown})")

            # c. the diffs
            specs = [{k: v for k, v in jobs[j]["spec"].items() if k != "deepspeed"} for j in ids]
            eff = [api(d, f"/api/v1/jobs/{j}/config")["deepspeed"] for j in ids]
            ck.check(all(eff), "c: both jobs have an effective config in the API")
            for table, docs in (("diff-spec", specs), ("diff-ds", eff)):
                rows = diff_rows(drv, table)
                shown = {r["path"] for r in rows if not r["hidden"]}
                want = differing_paths(*docs)
                ck.check(shown == want and {r["path"] for r in rows if r["differs"]} == want,
                         f"c: {table} shows exactly the differing keys {sorted(want)} (shown {sorted(shown)})")
                ck.check({r["path"] for r in rows} == set(flatten(docs[0])) | set(flatten(docs[1])),
                         f"c: {table} has a row for every key of both ({len(rows)})")
            lr_row = [r for r in diff_rows(drv, "diff-ds") if r["path"] == "optimizer.params.lr"]
            ck.check(lr_row and lr_row[0]["cells"] == [["base", "0.001"], ["changed", "0.0005"]],
                     f"c: optimizer.params.lr: A 0.001, B 0.0005 marked changed ({lr_row})")
            q(drv, "cmp-show-all").click()
            hidden = [r for r in diff_rows(drv, "diff-ds") if r["hidden"]]
            ck.check(not hidden, f"c: 'show unchanged keys' shows every row ({len(hidden)} hidden)")

            # d. wall time, the URL, and a fresh load of it
            q(drv, "cmp-x-time").click()
            time.sleep(0.3)
            check_time_axis(drv, d, ids, "d")
            url = drv.execute_script("return location.href;")
            ck.check(url.endswith(f"#/compare?jobs={ids[0]},{ids[1]}&x=time&all=1"),
                     f"d: the URL keeps the view ({url})")
            drv.get("about:blank")
            drv.get(url)
            ok = wait_until(lambda: loaded(drv), 20)
            order = drv.execute_script("return [...document.querySelectorAll('[data-testid=\"compare-job\"]')]"
                                       ".map(li => li.dataset.jobId);")
            ck.check(ok and order == ids, f"d: the copied URL restores the jobs in order ({order})")
            ck.check(q(drv, "cmp-x-time").is_selected() and q(drv, "cmp-show-all").is_selected(),
                     "d: ... with wall time and every key shown")
            check_time_axis(drv, d, ids, "d (restored)")
            hidden = [r for r in diff_rows(drv, "diff-spec") if r["hidden"]]
            ck.check(not hidden, "d (restored): every spec key shown")
            q(drv, "cmp-loss-log").click()
            axis = drv.execute_script("return Chart.getChart(document.querySelector("
                                      "'[data-testid=\"cmp-chart-loss\"]')).options.scales.y.type;")
            hash_args = drv.execute_script("return location.hash;").split("?", 1)[1].split("&")
            ck.check(axis == "logarithmic" and "log=1" in hash_args,
                     f"d: log scale for the loss ({axis}) and log=1 in the URL")
            q(drv, "cmp-x-step").click()
            check_lines(drv, d, ids, series, "d (back to steps)")

            drv.save_screenshot(os.path.join(BUILD, "compare.png"))

            # e.
            severe = [e["message"] for e in drv.get_log("browser") if e["level"] == "SEVERE"]
            ck.check(not severe, f"e: no SEVERE console entries ({severe[:3]})")

            # i. an fp16 job compared: the loss-scale card shows its line
            drv.get("about:blank")
            drv.get(f"{d.http_url}/#/compare?jobs={ids[0]},{fp16_id}")
            wait_until(lambda: loaded(drv), 20)
            want = list(zip(*api_series(d, fp16_id, "train/loss_scale")))
            # the card's line is drawn once the job's history has come, after the page loaded
            wait_until(lambda: len(chart_points(drv, "cmp-chart-loss-scale", "train/loss_scale",
                                                fp16_id)) >= len(want), 20)
            got = [(s, y) for s, _, y in chart_points(drv, "cmp-chart-loss-scale", "train/loss_scale", fp16_id)]
            ck.check(cards_shown(drv)["cmp-chart-loss-scale"] and want and got == want,
                     f"i: with an fp16 job the loss-scale card shows, its {len(got)} points equal "
                     f"to /metrics ({len(want)})")

            # f. a running job's lines grow while the page is open
            run_id = submit(d, tiny_job(d.data_root, name="cmp-running", max_steps=LONG)).id
            wait_step(d, run_id, 5)
            drv.get("about:blank")
            drv.get(f"{d.http_url}/#/compare?jobs={ids[0]},{run_id}")
            wait_until(lambda: loaded(drv), 20)
            n0 = len(chart_points(drv, "cmp-chart-loss", "train/loss", run_id))
            # grown, and past 100 points (a loaded machine trains it more slowly)
            grew = wait_until(lambda: len(chart_points(drv, "cmp-chart-loss", "train/loss",
                                                       run_id)) >= max(n0 + 1, 100), 30)
            got = [(s, y) for s, _, y in chart_points(drv, "cmp-chart-loss", "train/loss", run_id)]
            # The job runs on while this reads, thousands of steps a second, so that the line is
            # thinned (at most 1,000 points): its first point and its newest 20 are checked
            # against the exact records of their steps (/records).
            def record_at(step):
                page = api(d, f"/api/v1/jobs/{run_id}/records?since_step={step}&page_size=1")
                return [(r["step"], r["values"].get("train/loss")) for r in page["records"]][0]
            sample = got[:1] + got[-20:]
            ck.check(grew and n0 > 0 and 100 <= len(got) <= 1000 and
                     [record_at(s) for s, _ in sample] == sample,
                     f"f: the running job's loss line grew from {n0} to {len(got)} points (at most "
                     f"1,000), its first and newest 20 equal to /records")
            d.stub().CancelJob(stubs()[0].CancelJobRequest(id=run_id, force=True), metadata=d.metadata)

            # g. a job that does not exist
            drv.get("about:blank")
            drv.get(f"{d.http_url}/#/compare?jobs={ids[0]},job-999999")
            wait_until(lambda: loaded(drv), 20)
            state = drv.execute_script(
                "const li = document.querySelector('[data-job-id=\"job-999999\"]');"
                "return li && li.querySelector('.state').textContent;")
            banner = q(drv, "banner").text
            ck.check(state == "not found" and "job-999999" in banner and
                     len(chart_points(drv, "cmp-chart-loss", "train/loss", ids[0])) == 80,
                     f"g: an unknown job is marked not found ({state!r}, banner {banner!r}); "
                     "the other is drawn")

            # h. a long job's lines are bounded
            long_id = submit(d, tiny_job(d.data_root, name="cmp-long", max_steps=3000)).id
            wait_state(d, long_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
            drv.get("about:blank")
            drv.get(f"{d.http_url}/#/compare?jobs={ids[0]},{long_id}")
            wait_until(lambda: loaded(drv), 30)
            read = drv.execute_script(
                "return performance.getEntriesByType('resource').filter(e => e.name.includes("
                f"'/jobs/{long_id}/')).reduce((n, e) => n + e.encodedBodySize, 0);")
            for testid, key in CHART_KEYS:
                if key == "eval/loss":
                    continue
                steps, values = api_series(d, long_id, key)
                exact = dict(zip(steps, values))
                got = [(s, y) for s, _, y in chart_points(drv, testid, key, long_id)]
                ck.check(0 < len(got) <= 1000 and got[-1][0] == steps[-1] == 3000 and
                         all(exact.get(s) == y for s, y in got),
                         f"h: {testid} {key} of the 3,000-step job: {len(got)} points up to step "
                         f"{got[-1][0] if got else None}, each equal to /metrics")
            ck.check(0 < read <= 1_000_000, f"h: the page read {read} bytes of the long job")
        finally:
            if drv:
                drv.quit()
    ck.done()


main()
