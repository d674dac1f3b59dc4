"""The same resources over both transports: a job's checkpoints, effective DeepSpeed config,
anomaly events and webhook deliveries through gRPC (the Python client: ListCheckpoints,
GetEffectiveConfig, ListAnomalies, ListWebhookDeliveries) and through HTTP (GET
/api/v1/jobs/{id}, /anomalies, /webhooks), each checked against what is on disk or what the job
was made to produce (run in .venv/).

A real job of 6 steps checkpoints every 2 steps, gets a NaN gradient injected at step 3 (an
anomaly "nonfinite", policy skip; ZTRAIN_INJECT_NAN_GRAD as test_anomaly_events uses it) and
sends its end to a webhook nobody listens on (one attempt, "failed").

  a. Checkpoints: gRPC and HTTP list the checkpoint directory's entries as on disk (tags, DONE
     markers, the "latest" file).
  b. The effective config: gRPC and HTTP give the file rank 0 wrote, parsed.
  c. Anomalies: one event, nonfinite at step 3, the same over both; paging one event at a time
     with page_size/page_token gives the same list over both.
  d. Webhook deliveries: the same attempts over both, the dead receiver's ending "failed".
  e. A missing job is NotFound naming jobs/ID for each new method."""
import json
import os
import socket
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, SOURCE, Checker, Daemon, temp_dir, tiny_job  # noqa: E402

sys.path.insert(0, os.path.join(SOURCE, "clients", "python"))
import ztrain  # noqa: E402

ck = Checker()
TOKEN = "parity-token"


def http(d, path):
    req = urllib.request.Request(d.http_url + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def dead_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    tmp = temp_dir("ztrain-parity-")
    os.environ["ZTRAIN_INJECT_NAN_GRAD"] = "3"
    with Daemon(BUILD, os.path.join(tmp, "d"), token=TOKEN,
                extra_args=["--webhook-attempts", "1", "--webhook-allow", "127.0.0.1",
                            "--webhook-allow-private"]) as d:
        c = ztrain.Client(d.grpc_addr, token=TOKEN)
        job = tiny_job(d.data_root, name="parity", max_steps=6, checkpoint_dir="ck",
                       checkpoint_interval=2)
        job["events"] = {"nonfinite": {"policy": "skip"}}
        job["alerts"] = {"webhooks": [{"url": f"http://127.0.0.1:{dead_port()}/hook",
                                       "on": ["end"]}]}
        j = c.submit(job)
        end = c.wait(j.id, timeout=120)
        ck.check(ztrain.state_name(end.state) == "SUCCEEDED", f"the job ran ({end.reason})")
        detail = http(d, f"/api/v1/jobs/{j.id}")

        # a. checkpoints
        ckdir = end.checkpoint_dir
        on_disk = sorted((t, os.path.exists(os.path.join(ckdir, t, "DONE")))
                         for t in os.listdir(ckdir)
                         if os.path.isdir(os.path.join(ckdir, t)) and not t.startswith("."))
        with open(os.path.join(ckdir, "latest")) as f:
            latest = f.read().strip()
        got = c.checkpoints(j.id)
        via_grpc = sorted((x.tag, x.complete) for x in got.checkpoints)
        via_http = sorted((x["tag"], x["complete"]) for x in detail["checkpoints"])
        ck.check(len(on_disk) == 3 and via_grpc == on_disk and via_http == on_disk,
                 f"a: checkpoints as on disk {on_disk}: gRPC {via_grpc}, HTTP {via_http}")
        ck.check(got.latest == latest == detail["latest"],
                 f"a: latest {latest!r}: gRPC {got.latest!r}, HTTP {detail['latest']!r}")
        steps = sorted(x.step for x in got.checkpoints)
        ck.check(steps == [2, 4, 6], f"a: their steps {steps}")

        # b. effective config
        with open(os.path.join(end.run_dir, "ds_config.effective.json")) as f:
            written = json.load(f)
        eff = c.effective_config(j.id)
        ck.check(eff == written == detail["effective_config"] and
                 eff.get("train_micro_batch_size_per_gpu") == 2,
                 "b: the effective config is the file rank 0 wrote, over both")

        # c. anomalies
        events = list(c.anomalies(j.id))
        listed = http(d, f"/api/v1/jobs/{j.id}/anomalies")
        ck.check([(a.kind, a.step, a.policy, a.seq) for a in events] == [("nonfinite", 3, "skip", 1)]
                 and [(a["kind"], a["train/global_step"], a["policy"], a["seq"])
                      for a in listed["anomalies"]] == [("nonfinite", 3, "skip", 1)] and
                 listed["next_page_token"] == "",
                 f"c: one nonfinite event at step 3 over both ({[(a.kind, a.step) for a in events]})")
        paged_grpc = [a.seq for a in c.anomalies(j.id, page_size=1)]
        paged_http, token, pages = [], "", 0
        while pages < 10:
            page = http(d, f"/api/v1/jobs/{j.id}/anomalies?page_size=1" +
                        (f"&page_token={token}" if token else ""))
            paged_http += [a["seq"] for a in page["anomalies"]]
            token, pages = page["next_page_token"], pages + 1
            if not token:
                break
        ck.check(paged_grpc == paged_http == [1],
                 f"c: paging by one: gRPC {paged_grpc}, HTTP {paged_http} ({pages} pages)")

        # d. webhook deliveries (the end is delivered after the job ends: wait for it)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            hooks = c.webhook_deliveries(j.id)
            if hooks and all(h.outcome != "retrying" for h in hooks):
                break
            time.sleep(0.2)
        via_http = http(d, f"/api/v1/jobs/{j.id}/webhooks")["deliveries"]
        as_grpc = [{"delivery_id": h.delivery_id, "url": h.url, "type": h.type,
                    "attempt": h.attempt, "time_unix_ms": h.time_unix_ms,
                    "http_status": h.http_status, "error": h.error, "outcome": h.outcome}
                   for h in hooks]
        ck.check(len(as_grpc) == 1 and as_grpc == via_http and as_grpc[0]["outcome"] == "failed"
                 and as_grpc[0]["type"] == "job.end",
                 f"d: the dead receiver's delivery, the same over both: {as_grpc}")

        # e. a missing job
        for name, call in (("ListCheckpoints", lambda: c.checkpoints("job-424242")),
                           ("GetEffectiveConfig", lambda: c.effective_config("job-424242")),
                           ("ListAnomalies", lambda: list(c.anomalies("job-424242"))),
                           ("ListWebhookDeliveries", lambda: c.webhook_deliveries("job-424242"))):
            try:
                call()
                err = None
            except ztrain.NotFound as e:
                err = e
            ck.check(err is not None and err.resource == "jobs/job-424242",
                     f"e: {name} of a missing job: {err!r}")
        c.close()
    ck.done()


if __name__ == "__main__":
    main()
