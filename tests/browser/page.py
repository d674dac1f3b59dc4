"""What the browser tests share: the daemon's JSON API, waiting, and a headless Chromium.

Each test starts its own ztraind (tests/service/svc.py) and drives the dashboard through
selenium with Debian's chromium-driver; these helpers are the calls every one of them makes."""
import json
import os
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "service"))
from api_view import view  # noqa: E402

LAPTOP = (1366, 1500)


def api(d, path, method="GET", body=None):
    """The answer of the daemon d's HTTP API at path (with d's token when it has one), as plain
    values (api_view.py)."""
    req = urllib.request.Request(d.http_url + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    if getattr(d, "token", None):
        req.add_header("Authorization", f"Bearer {d.token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return view(path, json.load(r))


def api_series(d, job_id, key, since=0):
    """(steps, values) of one metric key from /metrics (all points: no max_points)."""
    s = api(d, f"/api/v1/jobs/{job_id}/metrics?keys={key}&since_step={since}")
    for ser in s["series"]:
        if ser["key"] == key:
            return ser["steps"], ser["values"]
    return [], []


def wait_until(fn, timeout, poll=0.05):
    """fn()'s first truthy value, or its last value when the time ran out."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(poll)


def start_browser(size=LAPTOP, extra=()):
    """Headless Chromium keeping its console log (extra: more command-line switches); a page
    that does not load fails within the test's time (60 s) rather than after it."""
    o = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={size[0]},{size[1]}", *extra):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)
    drv.set_page_load_timeout(60)
    return drv


def q(drv, testid, root=None):
    """The element with data-testid=testid (under root when given)."""
    return (root or drv).find_element(By.CSS_SELECTOR, f'[data-testid="{testid}"]')


def severe(drv, allowed=lambda m: False):
    """The browser console's SEVERE entries since the last call, less the allowed ones."""
    return [e["message"] for e in drv.get_log("browser")
            if e["level"] == "SEVERE" and not allowed(e["message"])]
