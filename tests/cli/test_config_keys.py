"""The DeepSpeed key table (issue 20): docs/deepspeed.md's table "DeepSpeed config keys" is exactly what
`ztrain config-keys` prints from the parser's own table, so the two cannot drift apart; and the
table is the parser's truth: every key it lists, written with DeepSpeed's default, is accepted
without a word, every warned key set away from its default draws exactly one warning naming it,
and every refused key, at any depth, set to a value DeepSpeed does not default to is refused by name.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, SRC, ZTRAIN, Checks  # noqa: E402
CHECK_TOOL = os.path.join(BUILD, "zt_job_check")
ck = Checks()
check = ck.check


def readme_table():
    with open(os.path.join(SRC, "docs", "deepspeed.md")) as f:
        text = f.read()
    m = re.search(r"<!-- config-keys: [^\n]*-->\n(.*?)<!-- config-keys end -->", text, re.S)
    return m.group(1) if m else None


def parse_rows(table):
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        path = cells[0].split("`")[1]
        rows.append((path, "(contents not listed)" in cells[0], cells[1], cells[2]))
    return rows


# Warned keys whose section's parser gives one warning for the whole section rather than one per
# key, and the text that warning names.
def section_warning(path):
    """The text of the one warning that covers a key warned by its section, or None."""
    if path.split(".")[0] in ("wandb", "comet"):
        return path.split(".")[0] + ".enabled: nothing is sent"
    return None


def nest(path, value):
    # The 16-bit master flags exist only with ZeRO (DeepSpeed's own check), states only with masters.
    ds = {"train_batch_size": 8, "zero_optimization": {"stage": 1}}
    if path.endswith("bf16_optimizer_states"):
        ds[path.split(".")[0]] = {"bf16_master_weights_and_grads": True}
    key = path.split(".")[-1]
    if path.startswith("optimizer."):
        ds["optimizer"] = {"type": "Adam"}
        # Only torch.optim's Adam takes these: DeepSpeed builds it with torch_adam.
        if key in ("fused", "foreach", "capturable", "differentiable"):
            ds["optimizer"]["params"] = {"torch_adam": True}
    if path.split(".")[0] in ("wandb", "comet") and key != "enabled":
        ds[path.split(".")[0]] = {"enabled": True}
    node = ds
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return ds


def run_check(tmp, ds):
    job = {"model": {"type": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 8, "vocab_size": 256,
                     "block_size": 8},
           "data": {"train": "train.txt"}, "deepspeed": ds}
    path = os.path.join(tmp, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    return subprocess.run([CHECK_TOOL, path], capture_output=True, text=True, timeout=30)


def main():
    printed = subprocess.run([ZTRAIN, "config-keys"], capture_output=True, text=True, check=True).stdout
    readme = readme_table()
    check(readme is not None, "docs/deepspeed.md has the generated table between its markers")
    check(readme == printed, "docs/deepspeed.md's key table is what `ztrain config-keys` prints "
          "(regenerate it with `build/ztrain config-keys`)")
    rows = parse_rows(printed)
    check(len(rows) > 200, f"{len(rows)} keys in the table")
    # -o json: the same rows, as a list of objects Python's json module reads.
    forms = [subprocess.run([ZTRAIN, "config-keys"] + f, capture_output=True, text=True)
             for f in (["-o", "json"], ["-o=json"], ["--output", "json"], ["--json"])]
    objs = json.loads(forms[0].stdout) if forms[0].returncode == 0 else []
    check(all(f.returncode == 0 and f.stdout == forms[0].stdout for f in forms),
          "config-keys -o json, -o=json, --output json and --json print the same")
    as_rows = []
    for o in objs:
        fate = o["fate"]
        if fate == "honoured" and o["stages"]:
            fate = "honoured at stage " + ",".join(str(s) for s in o["stages"])
        as_rows.append((o["key"], not o["contents_listed"], fate, o["note"]))
    check(as_rows == rows and all(set(o) == {"key", "fate", "stages", "default", "section",
                                             "contents_listed", "note"} for o in objs),
          f"config-keys -o json: the table's {len(rows)} rows as objects ({len(objs)} read)")
    by_key = {o["key"]: o for o in objs}
    check(by_key.get("zero_optimization.stage", {}).get("default") == 0
          and by_key.get("zero_optimization", {}).get("section") is True,
          "config-keys -o json: defaults as JSON values, sections marked")
    bad = subprocess.run([ZTRAIN, "config-keys", "-o", "yaml"], capture_output=True, text=True)
    check(bad.returncode == 2 and "yaml" in bad.stderr, "config-keys -o yaml is bad usage")
    check(len({r[0] for r in rows}) == len(rows), "no key is listed twice")

    # Defaults come from the C table, which the markdown does not show: they are read back from
    # the parser by setting each scalar key to a value that cannot be a default.
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "train.txt"), "wb").write(b"x" * 4096)
        paths = {r[0] for r in rows}
        sections = {p for p in paths if any(q.startswith(p + ".") for q in paths)}
        warned = [r for r in rows if r[2] == "warned" and r[0] not in sections and not r[1]]
        n = 0
        for path, _, _, note in warned:
            # A value of another type than every default: the parser's typed sections refuse it,
            # so the probe uses a value of the right kind for each family of knobs ("Fail" for
            # checkpoint.tag_validation, whose other values DeepSpeed refuses).
            text = section_warning(path) or f"{path} has no effect"
            for probe in (True, False, 4, 0.5, "x", "fp16", "Fail"):
                p = run_check(tmp, nest(path, probe))
                lines = [l for l in p.stderr.splitlines() if l.startswith("ztrain: warning:")]
                hits = [l for l in lines if text in l]
                if p.returncode == 0 and hits:
                    break
            check(p.returncode == 0 and len(hits) == 1,
                  f"warned key {path}: accepted with exactly one warning naming it "
                  f"({p.stderr.strip()[-200:]})")
            n += 1
        check(n > 50, f"{n} warned keys probed")

        # Every refused key (nested ones too: tensor_parallel.tp.mpu) set away from its default
        # is an error naming it, never accepted in silence. The probes are values DeepSpeed never
        # defaults to, of each kind a knob takes; a refused section is turned on.
        # A feature's switch is refused once the sections above it are on (DeepSpeed reads it only
        # then); a row whose note says when it is accepted ("read only when enabled", "accepted
        # while ...") is not probed alone.
        refused_sections = {r[0] for r in rows if r[2] == "refused" and r[0] in sections}
        refused = [r for r in rows if r[2] == "refused" and r[0] not in sections
                   and "read only" not in r[3] and "accepted while" not in r[3]]
        n = 0
        for path, _, _, note in refused:
            leaf = path.split(".")[-1]
            for probe in (True, 7, -1, "liger", {"enabled": True}, [1]):
                ds = nest(path, probe)
                parts = path.split(".")
                for k in range(1, len(parts)):
                    if ".".join(parts[:k]) not in refused_sections:
                        continue
                    node = ds
                    for part in parts[:k]:
                        node = node[part]
                    node.setdefault("enabled", True)
                p = run_check(tmp, ds)
                if p.returncode != 0 and leaf in p.stderr and "Traceback" not in p.stderr:
                    break
            check(p.returncode != 0 and leaf in p.stderr,
                  f"refused key {path}: an error naming it ({p.stderr.strip()[-200:]})")
            n += 1
        check(n > 30, f"{n} refused keys probed")
    ck.finish()


if __name__ == "__main__":
    main()
