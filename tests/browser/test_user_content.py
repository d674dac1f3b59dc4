"""What a user's own content does to the dashboard, and what it tells a reader who cannot see
its charts, in headless Chromium against a real ztraind; the daemon's JSON API is the reference.

  a. Hostile and long content: a job named `<img src=x onerror=...>` followed by 90 letters
     without a break, and a job whose log and failure reason carry markup (its init_from path),
     never run a script (window.__xss stays unset). The name shows as text in the jobs table,
     on the job page (heading and title) and on the comparison page. At laptop width no view
     scrolls sideways and the jobs table shows all its columns without scrolling (the name
     pushed Loss, Tokens/s, Elapsed and ETA out of sight); at 400 px (mobile emulation) no view
     scrolls sideways (the job page's heading did).
  b. Text alternatives: each chart canvas (role img) has an aria-label that names its lines'
     newest value and step, which match /metrics's last point to 4 significant figures (the loss
     chart's train and eval loss, the learning rate, the gradient norm); a chart with no data
     says "no data". They said only "Loss chart".
  c. A constant learning rate gets a y axis around its value, as Chart.js 4 does (5% either
     side): Debian's Chart.js 3 drew 1e-3 on an axis from -1 to 1.5, where it read as 0.
  d. A chart's legend is reached with Tab: from the smoothing slider, Tab comes to the loss
     chart's "eval loss" entry; Space hides the eval loss line (and takes it out of the text
     alternative, the button no longer pressed), Enter shows it again. The legend was drawn on
     the canvas, where only a mouse could use it.
  e. The top bar's health line follows the daemon on a job page: "ztraind unreachable" while it
     is down, "ztraind ok" once it is back. It was only refreshed by the jobs page's polling,
     so elsewhere it kept saying "ok" with the counts of when the page was opened. It is a
     live region, and on the jobs page, nothing changing, it is not rewritten (it was, every
     1.5 s, for a screen reader to read out again)."""
import math
import os
import re
import shutil
import sys
import time

sys.stdout.reconfigure(line_buffering=True)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
from svc import BUILD, TERMINAL, Checker, Daemon, submit, temp_dir, tiny_job, wait_state, write_data  # noqa: E402

from page import api, api_series, q, start_browser, wait_until  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

ck = Checker()
HOSTILE = '<img src=x onerror="window.__xss=1">' + "L" * 90
# The init_from path is in the worker's error line and in the job's failure reason.
HOSTILE_FILE = "<img src=x onerror=window.__xss=2>.bin"
PHONE = {"width": 400, "height": 900, "deviceScaleFactor": 1, "mobile": True}


def loaded(drv):
    return drv.execute_script(
        "const v = document.querySelector('[data-testid=\"job-view\"],[data-testid=\"compare-view\"]');"
        "return !!v && (v.dataset.loaded === 'true' || v.dataset.testid === 'compare-view');")


def no_sideways_scroll(drv):
    return drv.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1;")


def xss(drv):
    return drv.execute_script("return window.__xss === undefined ? null : window.__xss;")


def chart_label(drv, testid):
    return q(drv, testid).get_attribute("aria-label") or ""


def labelled_value(label, name, step):
    """The value the text alternative gives for line `name` at `step`, or None."""
    m = re.search(re.escape(name) + r" (\S+) at step " + str(step) + r"\b", label)
    return float(m.group(1)) if m else None


def close(a, b):
    return a is not None and math.isclose(a, b, rel_tol=5e-4)


def open_view(drv, url):
    drv.get("about:blank")
    drv.get(url)
    wait_until(lambda: loaded(drv), 15)
    time.sleep(1)  # the charts are redrawn a few times a second


def case_hostile(drv, d, named_id, failing_id, plain_id):
    drv.get(f"{d.http_url}/#/")
    wait_until(lambda: len(drv.find_elements("css selector", '[data-testid="job-row"]')) >= 3, 15)
    link = drv.execute_script(
        f"return document.querySelector('[data-job-id=\"{named_id}\"] [data-testid=\"job-link\"]')"
        ".textContent;")
    wrap = drv.execute_script("const w = document.querySelector('.table-wrap');"
                              "return [w.scrollWidth, w.clientWidth];")
    eta = drv.execute_script("const r = document.querySelector('[data-testid=\"eta\"]')"
                             ".getBoundingClientRect(); return r.right <= window.innerWidth;")
    ck.check(link == HOSTILE and xss(drv) is None,
             f"a: the jobs table shows the name as text and runs nothing ({xss(drv)})")
    ck.check(wrap[0] <= wrap[1] + 1 and eta and no_sideways_scroll(drv),
             f"a: at laptop width the jobs table fits, ETA column in sight (table {wrap[0]} px "
             f"wide in {wrap[1]} px)")

    open_view(drv, f"{d.http_url}/#/jobs/{named_id}")
    ck.check(q(drv, "job-name").text == HOSTILE and drv.title.startswith(HOSTILE) and
             xss(drv) is None and no_sideways_scroll(drv),
             f"a: the job page shows the name as its heading and title, runs nothing and does not "
             f"scroll sideways ({drv.execute_script('return document.documentElement.scrollWidth')} px)")

    reason = api(d, f"/api/v1/jobs/{failing_id}")["reason"]
    open_view(drv, f"{d.http_url}/#/jobs/{failing_id}")
    log = wait_until(lambda: HOSTILE_FILE in q(drv, "log").text and q(drv, "log").text, 10)
    ck.check(HOSTILE_FILE in reason and q(drv, "job-reason").text == reason and log and
             xss(drv) is None,
             f"a: a reason and log lines with markup are shown as text ({reason!r})")

    open_view(drv, f"{d.http_url}/#/compare?jobs={named_id},{plain_id}")
    names = wait_until(lambda: (lambda n: n if HOSTILE in n else None)(drv.execute_script(
        "return [...document.querySelectorAll('[data-testid=\"compare-job\"] a')]"
        ".map(a => a.textContent);")), 15) or []
    ck.check(HOSTILE in names and xss(drv) is None and no_sideways_scroll(drv),
             f"a: the comparison page shows the name as text, runs nothing, and does not scroll "
             f"sideways ({drv.execute_script('return document.documentElement.scrollWidth')} px)")

    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
    try:
        for view in ("#/", f"#/jobs/{named_id}", f"#/compare?jobs={named_id},{plain_id}"):
            open_view(drv, f"{d.http_url}/{view}")
            width = drv.execute_script("return [document.documentElement.scrollWidth, window.innerWidth];")
            ck.check(no_sideways_scroll(drv) and width[1] == PHONE["width"],
                     f"a: at 400 px {view} does not scroll sideways ({width})")
    finally:
        drv.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def case_text_alternatives(drv, d, plain_id):
    open_view(drv, f"{d.http_url}/#/jobs/{plain_id}")
    for testid, key, name in (("chart-loss", "train/loss", "train loss"),
                              ("chart-loss", "eval/loss", "eval loss"),
                              ("chart-lr", "train/learning_rate", "learning rate"),
                              ("chart-grad-norm", "train/grad_norm", "grad norm")):
        steps, values = api_series(d, plain_id, key)
        label = chart_label(drv, testid)
        got = labelled_value(label, name, steps[-1]) if steps else None
        ck.check(steps and close(got, values[-1]),
                 f"b: {testid}'s text alternative gives {name} {values[-1] if values else None} "
                 f"at step {steps[-1] if steps else None}: {label!r}")
    empty = chart_label(drv, "chart-loss-scale")
    ck.check(empty.endswith(": no data"), f"b: a chart without data says so: {empty!r}")


def case_flat_axis(drv, d, plain_id):
    _, values = api_series(d, plain_id, "train/learning_rate")
    lr = values[-1] if values else None
    scale = drv.execute_script(
        "const s = Chart.getChart(document.querySelector('[data-testid=\"chart-lr\"]')).scales.y;"
        "return [s.min, s.max];")
    ck.check(values and all(v == lr for v in values) and
             scale[0] > 0 and scale[0] <= lr <= scale[1] and scale[1] - scale[0] <= 0.11 * lr,
             f"c: the constant learning rate {lr} is drawn on an axis around it: {scale}")
    # The line no longer flat (its last point doubled), the axis is Chart.js's own again.
    scale = drv.execute_async_script(
        "const done = arguments[0];"
        "const c = Chart.getChart(document.querySelector('[data-testid=\"chart-lr\"]'));"
        "import('/static/chart_update.js').then((m) => {"
        "  const d = c.data.datasets[0].data; d[d.length - 1] = Object.assign({}, d[d.length - 1],"
        "    {y: 2 * d[0].y});"
        "  m.updateChart(c); done([c.scales.y.min, c.scales.y.max]); });")
    ck.check(0.00096 <= scale[0] <= 0.001 and scale[1] >= 0.002,
             f"c: once the line varies its axis is Chart.js's own, not held to 0.00095: {scale}")


def case_legend(drv, d, plain_id):
    open_view(drv, f"{d.http_url}/#/jobs/{plain_id}")
    q(drv, "smoothing").click()
    reached = None
    for _ in range(6):
        ActionChains(drv).send_keys(Keys.TAB).perform()
        el = drv.switch_to.active_element
        if el.text == "eval loss" and el.get_attribute("class") == "legend-item":
            reached = el
            break
    ck.check(reached is not None and reached.get_attribute("aria-pressed") == "true",
             "d: Tab reaches the loss chart's 'eval loss' legend entry, pressed")
    if reached is None:
        return
    shown = ("return (c => c.data.datasets.map((d, i) => [d.ztKey, c.isDatasetVisible(i)]))"
             "(Chart.getChart(document.querySelector('[data-testid=\"chart-loss\"]')));")
    ActionChains(drv).send_keys(Keys.SPACE).perform()
    hidden = drv.execute_script(shown)
    label = chart_label(drv, "chart-loss")
    ck.check(["eval/loss", False] in hidden and ["train/loss", True] in hidden and
             "eval loss" not in label and reached.get_attribute("aria-pressed") == "false",
             f"d: Space hides the eval loss line ({hidden}; {label!r})")
    ActionChains(drv).send_keys(Keys.ENTER).perform()
    ck.check(["eval/loss", True] in drv.execute_script(shown) and
             "eval loss" in chart_label(drv, "chart-loss"), "d: Enter shows it again")


def case_health(drv, d, plain_id):
    drv.get(f"{d.http_url}/#/")
    wait_until(lambda: q(drv, "health").text.startswith("ztraind ok"), 10)
    drv.execute_script("window.__healthWrites = 0; new MutationObserver((m) => "
                       "{ window.__healthWrites += m.length; }).observe("
                       "document.getElementById('health'), {childList: true, "
                       "characterData: true, subtree: true});")
    time.sleep(7)
    writes = drv.execute_script("return window.__healthWrites;")
    ck.check(writes == 0, f"e: an unchanged health line is not rewritten ({writes} writes in 7 s)")
    open_view(drv, f"{d.http_url}/#/jobs/{plain_id}")
    ok = wait_until(lambda: q(drv, "health").text.startswith("ztraind ok"), 10)
    d.kill()
    down = wait_until(lambda: q(drv, "health").text == "ztraind unreachable", 15)
    ck.check(ok and down, f"e: on a job page the health line says the daemon is down: "
             f"{q(drv, 'health').text!r}")
    d.start()
    back = wait_until(lambda: q(drv, "health").text.startswith("ztraind ok"), 15)
    ck.check(back, f"e: and that it is back: {q(drv, 'health').text!r}")


def main():
    tmp = temp_dir("ztrain-user-content-")
    drv = start_browser()
    try:
        with Daemon(os.path.abspath(BUILD), tmp, max_ranks=1) as d:
            plain = tiny_job(d.data_root, name="plain", max_steps=20, eval_interval=10,
                             eval_steps=1)
            plain["data"]["val"] = "train.txt"
            plain_id = submit(d, plain).id
            named_id = submit(d, tiny_job(d.data_root, name=HOSTILE, max_steps=5)).id
            failing = tiny_job(d.data_root, name="markup-in-log", max_steps=5)
            failing["model"]["init_from"] = write_data(d.data_root, HOSTILE_FILE, b"no tensors")
            failing_id = submit(d, failing).id
            for j in (plain_id, named_id, failing_id):
                wait_state(d, j, TERMINAL, timeout=120)
            case_hostile(drv, d, named_id, failing_id, plain_id)
            case_text_alternatives(drv, d, plain_id)
            case_flat_axis(drv, d, plain_id)
            case_legend(drv, d, plain_id)
            case_health(drv, d, plain_id)
    finally:
        drv.quit()
    ck.done()


if __name__ == "__main__":
    if not shutil.which("/usr/bin/chromedriver"):
        raise SystemExit("FAIL: /usr/bin/chromedriver is missing (scripts/install-deps.sh installs it)")
    main()
