"""A typed job-spec builder: the job file of ztrain's docs/job-spec (name, world_size, device,
model, data, train, training_args, deepspeed, ...) built in Python, checked locally for what can
be judged without the server, and turned into the JobSpec message that SubmitJob takes.

    spec = (JobSpec(name="gpt2-tiny", world_size=1)
            .model(type="gpt2", n_layer=2, n_head=2, n_embd=32, vocab_size=256, block_size=32)
            .data(train="train.txt")
            .train(max_steps=50, log_interval=5)
            .deepspeed({"train_micro_batch_size_per_gpu": 2,
                        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))

What is checked here: keys (every section's keys are the proto's fields, so a misspelling is
refused by name, as the server would), types, ranges, n_embd divisible by n_head, the train
options that need another (eval_interval needs data.val; resume and checkpoint_interval need no
checkpoint_dir, as ztraind gives a job without one <runs root>/<job id>/ckpt) and DeepSpeed's
batch rule for any of the three batch keys given (the missing ones inferred as DeepSpeed infers
them; then train_batch_size = micro batch x gradient accumulation x world_size, each > 0). What
only the server can judge (paths under its roots, memory, its GPUs) it judges, and its refusal
names the field the same way: "spec.model.n_embd"."""
import copy
import json
import os
from typing import Any, Dict, Optional, Union

from google.protobuf import json_format

from ._gen import ztrain_pb2 as pb
from .errors import SpecError

# Sections of the job file that map onto one message of the proto, by key.
_SECTIONS = {
    "model": pb.ModelSpec,
    "data": pb.DataSpec,
    "train": pb.TrainOptions,
    "training_args": pb.TrainingArgs,
    "pipeline": pb.PipelineSpec,
    "fork_from": pb.ForkFrom,
}
# Top-level keys: the scalar fields of JobSpec, the sections, and the three JSON-valued ones.
_SCALARS = {"name", "world_size", "device", "nodes", "comm", "max_restarts"}
_JSON_VALUED = {"deepspeed": "deepspeed_json", "events": "events_json", "alerts": "alerts_json"}
_TOP = _SCALARS | set(_SECTIONS) | set(_JSON_VALUED)
_POSITIVE_MODEL = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")


def _fields(msg_cls):
    return {f.name: f for f in msg_cls.DESCRIPTOR.fields}


def _read_json(field_path: str, path: str):
    """A JSON file's value; a file that is not JSON is a SpecError naming `field_path`, the
    file, and the line and column where parsing stopped."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise SpecError(field_path, f"{path}: not JSON: {e}") from None
        except UnicodeDecodeError as e:
            raise SpecError(field_path, f"{path}: not UTF-8 text: {e}") from None


def _int(path, v, lo=None):
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(path, f"must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise SpecError(path, f"must be >= {lo}, got {v}")
    return v


class JobSpec:
    """A job spec under construction. Each section method merges its keywords into the section
    and returns the spec, so calls chain; validate() judges the whole, to_proto() validates and
    gives the JobSpec message."""

    def __init__(self, name: str = "", world_size: int = 1, device: str = "cpu", **top: Any):
        self._d: Dict[str, Any] = {"name": name, "world_size": world_size, "device": device}
        for k, v in top.items():
            self._set_top(k, v)

    # ---- building -------------------------------------------------------------------------

    def _set_top(self, key, value):
        if key not in _TOP:
            raise SpecError(f"spec.{key}", f"unknown key (a job spec has {', '.join(sorted(_TOP))})")
        if key in _SECTIONS and isinstance(value, dict):
            self._section(key, **value)
        else:
            self._d[key] = value

    def _section(self, name, **kw):
        known = _fields(_SECTIONS[name])
        sec = self._d.setdefault(name, {})
        for k, v in kw.items():
            # The job file writes a weighted mixture as a list under data.train.
            if k not in known and not (name == "data" and k == "train"):
                raise SpecError(f"spec.{name}.{k}", f"unknown key (the {name} section has "
                                f"{', '.join(sorted(known))})")
            sec[k] = v
        return self

    def model(self, **kw) -> "JobSpec":
        return self._section("model", **kw)

    def data(self, **kw) -> "JobSpec":
        return self._section("data", **kw)

    def train(self, **kw) -> "JobSpec":
        return self._section("train", **kw)

    def training_args(self, **kw) -> "JobSpec":
        return self._section("training_args", **kw)

    def pipeline(self, **kw) -> "JobSpec":
        return self._section("pipeline", **kw)

    def fork_from(self, job: str, step: int) -> "JobSpec":
        return self._section("fork_from", job=job, step=step)

    def deepspeed(self, config: Union[dict, str]) -> "JobSpec":
        """The DeepSpeed config: a dict, or the path of a ds_config.json (read now; a file that
        cannot be read or is not JSON is a SpecError naming spec.deepspeed and the file)."""
        if isinstance(config, (str, os.PathLike)):
            try:
                config = _read_json("spec.deepspeed", os.fspath(config))
            except OSError as e:
                raise SpecError("spec.deepspeed", f"{os.fspath(config)}: {e.strerror}") from None
        self._d["deepspeed"] = copy.deepcopy(config)
        return self

    def events(self, rules: dict) -> "JobSpec":
        self._d["events"] = copy.deepcopy(rules)
        return self

    def alerts(self, alerts: dict) -> "JobSpec":
        self._d["alerts"] = copy.deepcopy(alerts)
        return self

    @classmethod
    def from_dict(cls, d: dict, base_dir: Optional[str] = None) -> "JobSpec":
        """A spec from a job file's object; a "deepspeed" path is read relative to base_dir."""
        if not isinstance(d, dict):
            raise SpecError("spec", f"a job spec must be a JSON object, got {type(d).__name__}")
        s = cls.__new__(cls)
        s._d = {}
        for k, v in d.items():
            if k == "deepspeed" and isinstance(v, str):
                s.deepspeed(os.path.join(base_dir or ".", v))
            else:
                s._set_top(k, copy.deepcopy(v))
        return s

    @classmethod
    def from_file(cls, path: str) -> "JobSpec":
        d = _read_json("spec", path)
        s = cls.from_dict(d, os.path.dirname(os.path.abspath(path)))
        if not s._d.get("name"):
            s._d["name"] = os.path.splitext(os.path.basename(path))[0]
        return s

    def to_dict(self) -> dict:
        """The job file's object (what `ztrain submit` reads and POST /api/v1/jobs takes)."""
        return copy.deepcopy({k: v for k, v in self._d.items() if v not in (None, "")})

    # ---- judging --------------------------------------------------------------------------

    def validate(self) -> "JobSpec":
        d = self._d
        name = d.get("name", "")
        if not isinstance(name, str):
            raise SpecError("spec.name", "must be a string")
        if len(name.encode("utf-8")) > 128:
            raise SpecError("spec.name", f"{len(name.encode())} bytes is above the limit of 128")
        if any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in name):
            raise SpecError("spec.name", "a job name is printable text (no control characters)")
        ws = _int("spec.world_size", d.get("world_size", 1), 1)
        nodes = _int("spec.nodes", d.get("nodes", 1), 1)
        if nodes > ws:
            raise SpecError("spec.nodes", f"{nodes} nodes for world_size {ws}: at most world_size")
        if d.get("device", "cpu") not in ("cpu", "cuda"):
            raise SpecError("spec.device", f"must be \"cpu\" or \"cuda\", got {d.get('device')!r}")
        if d.get("comm", "auto") not in ("auto", "shm", "gloo"):
            raise SpecError("spec.comm", f"must be \"auto\", \"shm\" or \"gloo\", got {d.get('comm')!r}")
        _int("spec.max_restarts", d.get("max_restarts", 0), 0)
        self._validate_model(d.get("model", {}))
        self._validate_data(d.get("data"))
        self._validate_train(d.get("train", {}), d.get("data") or {})
        self._validate_deepspeed(d.get("deepspeed"), ws, d.get("pipeline") or {},
                                 d.get("training_args") or {})
        self.to_proto(validate=False)  # types the proto cannot hold are refused here
        return self

    @staticmethod
    def _validate_model(m):
        for k in _POSITIVE_MODEL:
            if k in m:
                _int(f"spec.model.{k}", m[k], 1)
        nh, ne = m.get("n_head"), m.get("n_embd")
        if nh and ne and not m.get("head_dim") and ne % nh:
            raise SpecError("spec.model.n_embd", f"n_embd {ne} must be divisible by n_head {nh}")
        nkv = m.get("n_kv_head")
        if nkv and nh and nh % _int("spec.model.n_kv_head", nkv, 1):
            raise SpecError("spec.model.n_kv_head", f"n_head {nh} must be divisible by "
                            f"n_kv_head {nkv}")

    @staticmethod
    def _validate_data(data):
        if not data or not data.get("train"):
            raise SpecError("spec.data.train", "required: a token file, a glob or a mixture")
        train = data["train"]
        if isinstance(train, list):
            for i, src in enumerate(train):
                if not isinstance(src, dict) or not src.get("path"):
                    raise SpecError(f"spec.data.train[{i}]", "must be {\"path\", \"weight\"}")
                w = src.get("weight", 1)
                if not isinstance(w, (int, float)) or isinstance(w, bool) or w <= 0:
                    raise SpecError(f"spec.data.train[{i}].weight", f"must be > 0, got {w!r}")
        elif not isinstance(train, str):
            raise SpecError("spec.data.train", "must be a path or a list of {path, weight}")

    @staticmethod
    def _validate_train(t, data):
        for k, lo in (("max_steps", 0), ("epochs", 1), ("log_interval", 1),
                      ("eval_interval", 0), ("eval_steps", 1), ("checkpoint_interval", 0),
                      ("bench_steps", 0), ("warmup_steps", 0), ("seed", 0)):
            if k in t:
                _int(f"spec.train.{k}", t[k], lo)
        if t.get("eval_interval") and not data.get("val"):
            raise SpecError("spec.train.eval_interval", "needs data.val")
        # resume and checkpoint_interval need a checkpoint_dir, which ztraind supplies
        # (<runs root>/<job id>/ckpt) when the spec has none: nothing to refuse here.

    @staticmethod
    def _validate_deepspeed(ds, world_size, pipeline, training_args):
        if ds is None:
            return
        if not isinstance(ds, dict):
            raise SpecError("spec.deepspeed", "must be an object (or a path, read when building)")
        stages = pipeline.get("stages", 1) or 1
        dp = world_size // stages if isinstance(stages, int) and stages >= 1 else world_size
        verdict = _batch_verdict(ds, dp, stages != 1, training_args)
        if verdict:
            raise SpecError(*verdict)

    # ---- the message ----------------------------------------------------------------------

    def to_proto(self, validate: bool = True) -> "pb.JobSpec":
        """The JobSpec message (validated first unless validate=False)."""
        if validate:
            self.validate()
        d = self._d
        spec = pb.JobSpec()
        for k in _SCALARS:
            if d.get(k) not in (None, ""):
                try:
                    setattr(spec, k, d[k])
                except (TypeError, ValueError) as e:
                    raise SpecError(f"spec.{k}", str(e)) from None
        for key, field_name in _JSON_VALUED.items():
            if d.get(key) is not None:
                setattr(spec, field_name, json.dumps(d[key]))
        for name, cls in _SECTIONS.items():
            sec = dict(d.get(name) or {})
            if not sec:
                continue
            if name == "data" and isinstance(sec.get("train"), list):
                sec["mixture"] = sec.pop("train")
            try:
                getattr(spec, name).CopyFrom(json_format.ParseDict(sec, cls()))
            except json_format.ParseError as e:
                raise SpecError(f"spec.{name}", str(e)) from None
        return spec


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _batch_verdict(ds: dict, world: int, pipelined: bool, args: dict):
    """DeepSpeed 0.19's batch rule (DeepSpeedConfig._set_batch_related_parameters, then
    _batch_assertion) on the job's data-parallel size: the missing batch keys are inferred from
    the given ones with Python's floor division, then each of the three must be > 0 and
    train_batch_size = micro batch x accumulation x world size. Where a config gives neither
    train_batch_size nor the micro batch, ztraind first supplies the micro batch (and a missing
    accumulation) from training_args as Hugging Face's Trainer does, which DeepSpeed would
    refuse. None when the rule holds, or cannot be judged here (a key "auto", which ztraind
    fills from training_args, or not an integer, which it refuses itself); else (field,
    message), the message DeepSpeed's, with how the inferred key was computed."""
    t, m, g = (ds.get(k) for k in _BATCH_KEYS)
    for v in (t, m, g):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            return None
    w_name = "(world_size / pipeline.stages)" if pipelined else "world_size"
    if t is None and m is None:
        m = args.get("per_device_train_batch_size", 8)
        if g is None:
            g = args.get("gradient_accumulation_steps", 1)
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (m, g)):
            return None
    how = ""
    if t is not None and m is not None and g is not None:
        pass
    elif t is not None and m is not None:
        # A micro batch of 0 is DeepSpeed's ZeroDivisionError; ztraind (and this) refuse it by
        # the first of the keys that is not > 0, as _batch_assertion would.
        g = t // m // world if m != 0 else 0
        how = (f"gradient_accumulation_steps = train_batch_size // "
               f"train_micro_batch_size_per_gpu // {w_name} = {t} // {m} // {world} = {g}"
               if m != 0 else "gradient_accumulation_steps by dividing by "
               "train_micro_batch_size_per_gpu")
    elif t is not None and g is not None:
        m = t // world // g if g != 0 else t // world
        how = (f"train_micro_batch_size_per_gpu = train_batch_size // {w_name} // "
               f"gradient_accumulation_steps = {t} // {world} // {g} = {m}"
               if g != 0 else "train_micro_batch_size_per_gpu by dividing by "
               "gradient_accumulation_steps")
    elif m is not None and g is not None:
        t = m * g * world
        how = (f"train_batch_size = train_micro_batch_size_per_gpu * "
               f"gradient_accumulation_steps * {w_name} = {m} * {g} * {world} = {t}")
    elif t is not None:
        m, g = t // world, 1
        how = (f"train_micro_batch_size_per_gpu = train_batch_size // {w_name} = "
               f"{t} // {world} = {m}, gradient_accumulation_steps = 1")
    else:
        t, g = m * world, 1
        how = (f"train_batch_size = train_micro_batch_size_per_gpu * {w_name} = "
               f"{m} * {world} = {t}, gradient_accumulation_steps = 1")
    why = f" (DeepSpeed infers {how})" if how else ""
    if t <= 0:
        return ("spec.deepspeed.train_batch_size",
                f"Train batch size: {t} has to be greater than 0{why}")
    if m <= 0:
        return ("spec.deepspeed.train_micro_batch_size_per_gpu",
                f"Micro batch size per gpu: {m} has to be greater than 0{why}")
    if g <= 0:
        return ("spec.deepspeed.gradient_accumulation_steps",
                f"Gradient accumulation steps: {g} has to be greater than 0{why}")
    if t != m * g * world:
        return ("spec.deepspeed.train_batch_size",
                f"Check batch related parameters. train_batch_size is not equal to "
                f"micro_batch_per_gpu * gradient_acc_step * world_size "
                f"{t} != {m} * {g} * {world}{why}")
    if t > 0x7fffffff:
        return ("spec.deepspeed.train_batch_size", f"train_batch_size {t} is too large")
    return None


def load(spec: Union["JobSpec", dict, str]) -> JobSpec:
    """A JobSpec from a builder, a job file's object, or the path of a job file."""
    if isinstance(spec, JobSpec):
        return spec
    if isinstance(spec, dict):
        return JobSpec.from_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        return JobSpec.from_file(os.fspath(spec))
    raise TypeError(f"a spec is a JobSpec, a dict or a path, not {type(spec).__name__}")
