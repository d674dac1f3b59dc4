"""docs/job.schema.json, the JSON Schema of job files, against the job-spec parser it is generated
from (zt_job_check: the parser and file checks `ztrain run` applies). Schemas are judged with
jsonschema_rs (PyPI, installed with schemathesis), in .venv/.

  a. tests/tools/zt_job_schema prints exactly the committed docs/job.schema.json, a valid
     draft 2020-12 schema.
  b. Types: every key outside "model" has its type stated, and a value of another type is
     refused by the parser (naming the key) and by the schema.
     Keys, both ways, asked of the parser itself: in every section, every key the schema lists
     is one the parser does not call unknown, and a key it does not list is refused by the
     parser ("unknown key", naming it) and by the schema; for every model family, each of its
     fields likewise, and a field of another family is refused by both.
  c. Sample specs get the same verdict from both: valid ones (a tiny GPT-2, a tiny Llama, a data
     mixture, examples/demo) and ones that break what the schema says (a bound, a type, an
     unknown family, a mixture entry that is not an object)."""
import atexit
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import jsonschema_rs  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, SRC, Checks  # noqa: E402

ck = Checks()
check = ck.check


WORK = tempfile.mkdtemp(prefix="ztrain-schema-")
atexit.register(shutil.rmtree, WORK, True)
with open(os.path.join(WORK, "train.txt"), "wb") as f:
    f.write(b"the quick brown fox jumps over the lazy dog. " * 200)

GPT2 = {"name": "tiny", "world_size": 1, "device": "cpu",
        "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                  "block_size": 32, "init_from": None},
        "data": {"train": "train.txt", "val": "train.txt", "shuffle": True},
        "train": {"max_steps": 10, "log_interval": 1, "eval_interval": 5, "eval_steps": 1,
                  "checkpoint_dir": "ckpt", "checkpoint_interval": 5, "warmup_steps": 0,
                  "seed": 1},
        "deepspeed": {"train_micro_batch_size_per_gpu": 2,
                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}}
LLAMA = copy.deepcopy(GPT2)
LLAMA["model"] = {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
                  "intermediate_size": 64, "vocab_size": 256, "block_size": 32,
                  "rms_norm_eps": 1e-5, "rope_theta": 10000}
MIXTURE = copy.deepcopy(GPT2)
MIXTURE["data"] = {"train": [{"path": "train.txt", "weight": 2}, {"path": "train.txt",
                                                                   "weight": 1}]}
del MIXTURE["train"]["eval_interval"]


def parser_verdict(spec):
    """(accepted, message) of zt_job_check on the spec written as a job file."""
    path = os.path.join(WORK, "job.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    out = subprocess.run([os.path.join(BUILD, "zt_job_check"), path], capture_output=True,
                         text=True, timeout=60, cwd=WORK)
    return out.returncode == 0, out.stderr.strip()


def unknown(message, key):
    return f"unknown key '{key}'" in message


def case_a():
    out = subprocess.run([os.path.join(BUILD, "zt_job_schema")], capture_output=True, text=True,
                         timeout=60)
    with open(os.path.join(SRC, "docs", "job.schema.json")) as f:
        committed = f.read()
    check(out.returncode == 0 and out.stdout == committed,
          "a: zt_job_schema prints the committed docs/job.schema.json")
    schema = json.loads(committed)
    try:
        validator = jsonschema_rs.Draft202012Validator(schema)
    except Exception as e:  # the schema itself is malformed
        check(False, f"a: a valid draft 2020-12 schema: {e}")
        raise SystemExit(1)
    check(True, "a: a valid draft 2020-12 schema")
    # max_steps 0 is not "no training": the epochs decide, and the schema says so.
    train = schema["properties"]["train"]["properties"]
    check("0" in train["max_steps"].get("description", "") and
          "epochs" in train["max_steps"].get("description", ""),
          "a: train.max_steps's description says what 0 means (train.epochs decide)")
    return schema, validator


def sections(schema):
    """{section path: (keys listed, a spec to put keys into, the dict within it)}."""
    props = schema["properties"]
    out = {"": (list(props), GPT2, lambda s: s)}
    for name in ("data", "train", "training_args", "pipeline", "fork_from"):
        out[name] = (list(props[name]["properties"]), GPT2, lambda s, n=name: s.setdefault(n, {}))
    mix_keys = list(props["data"]["properties"]["train"]["items"]["properties"])
    out["data.train[]"] = (mix_keys, MIXTURE, lambda s: s["data"]["train"][0])
    return out


def json_type_of(v):
    if isinstance(v, bool):
        return {"boolean"}
    if isinstance(v, int):
        return {"integer", "number"}
    if isinstance(v, float):
        return {"number"}
    return {str: {"string"}, list: {"array"}, dict: {"object"}}[type(v)]


def key_types(schema, name, key):
    props = schema["properties"]
    node = props if name == "" else props[name]["properties"] if name != "data.train[]" else \
        props["data"]["properties"]["train"]["items"]["properties"]
    t = node[key].get("type", [])
    return {t} if isinstance(t, str) else set(t)


def case_b(schema, validator):
    # Every key outside "model" has its type stated, and a value of another type is refused by
    # the parser, naming the key, and by the schema.
    for name, (keys, base, where) in sections(schema).items():
        untyped, disagree = [], []
        for key in keys:
            types = key_types(schema, name, key) - {"null"}
            if not types:
                untyped.append(key)
                continue
            wrong = next(v for v in (True, "x", 1.5, 7, [], {}) if not json_type_of(v) & types)
            spec = copy.deepcopy(base)
            where(spec)[key] = wrong
            ok, msg = parser_verdict(spec)
            if ok or key not in msg or validator.is_valid(spec):
                disagree.append(f"{key}={wrong!r}: {msg[:80]}")
        check(not untyped and not disagree,
              f"b: {name or 'top level'}: each key's type is stated ({untyped} untyped) and "
              f"another type is refused by both (disagreeing: {disagree[:3]})")
    for name, (keys, base, where) in sections(schema).items():
        called_unknown = []
        for key in keys:
            spec = copy.deepcopy(base)
            target = where(spec)
            if key not in target:
                target[key] = 1
            ok, msg = parser_verdict(spec)
            if unknown(msg, key):
                called_unknown.append(key)
        check(len(keys) > 0 and not called_unknown,
              f"b: {name or 'top level'}: the parser knows the schema's {len(keys)} keys "
              f"(unknown to it: {called_unknown})")
        spec = copy.deepcopy(base)
        where(spec)["zz_unlisted"] = 1
        ok, msg = parser_verdict(spec)
        check(not ok and unknown(msg, "zz_unlisted") and not validator.is_valid(spec),
              f"b: {name or 'top level'}: an unlisted key is refused by both ({msg[:90]})")
    rules = schema["properties"]["model"]["allOf"]
    fields = {r["if"]["properties"]["type"]["const"]: set(r["then"]["properties"]) - {"type"}
              for r in rules}
    samples = {"gpt2": GPT2["model"], "llama": LLAMA["model"]}
    for family, keys in fields.items():
        base = copy.deepcopy(LLAMA if family != "gpt2" else GPT2)
        base["model"] = dict(samples.get(family, LLAMA["model"]), type=family)
        called_unknown = []
        for key in sorted(keys):
            spec = copy.deepcopy(base)
            spec["model"].setdefault(key, 1)
            if unknown(parser_verdict(spec)[1], key):
                called_unknown.append(key)
        check(keys and not called_unknown,
              f"b: model type {family}: the parser knows its {len(keys)} fields "
              f"(unknown to it: {called_unknown})")
        others = sorted(set().union(*fields.values()) - keys)
        if others:
            spec = copy.deepcopy(base)
            spec["model"][others[0]] = 1
            ok, msg = parser_verdict(spec)
            check(not ok and unknown(msg, others[0]) and not validator.is_valid(spec),
                  f"b: model type {family}: another family's {others[0]} is refused by both")


def case_c(validator):
    demo_dir = os.path.join(SRC, "examples", "demo")
    with open(os.path.join(demo_dir, "job.json")) as f:
        demo = json.load(f)
    with open(os.path.join(demo_dir, "ds_config.json")) as f:
        demo["deepspeed"] = json.load(f)
    demo["data"] = {"train": "train.txt", "val": "train.txt"}
    samples = [("a tiny GPT-2", GPT2, True), ("a tiny Llama", LLAMA, True),
               ("a data mixture", MIXTURE, True), ("examples/demo", demo, True)]

    def bad(what, fn, base=GPT2):
        s = copy.deepcopy(base)
        fn(s)
        samples.append((what, s, False))

    bad("n_layer 0", lambda s: s["model"].update(n_layer=0))
    bad("n_embd as a string", lambda s: s["model"].update(n_embd="32"))
    bad("an unknown model type", lambda s: s["model"].update(type="bert"))
    bad("rms_norm_eps 0 (positive)", lambda s: s["model"].update(rms_norm_eps=0), LLAMA)
    bad("tie_word_embeddings as a number", lambda s: s["model"].update(tie_word_embeddings=1),
        LLAMA)
    bad("a mixture entry that is a string", lambda s: s["data"].update(train=["train.txt"]))
    bad("data.train as a number", lambda s: s["data"].update(train=3))
    bad("deepspeed as a number", lambda s: s.update(deepspeed=3))
    bad("n_layer missing", lambda s: s["model"].pop("n_layer"))
    for what, spec, want in samples:
        ok, msg = parser_verdict(spec)
        valid = validator.is_valid(spec)
        check(ok == want and valid == want,
              f"c: {what}: parser {'accepts' if ok else 'refuses'}, schema "
              f"{'accepts' if valid else 'refuses'} ({msg[:100]})")


def main():
    schema, validator = case_a()
    case_b(schema, validator)
    case_c(validator)
    ck.finish()


if __name__ == "__main__":
    main()
