#!/usr/bin/python3
"""ztrain's pipeline schedules and layer partitions against DeepSpeed's rules.

DeepSpeed's TrainSchedule (1F1B), InferenceSchedule, num_pipe_buffers, partition_uniform,
partition_balanced (the linear-partition dynamic programme) and PipelineModule's method dispatch
(`uniform`, `parameters`, `type:REGEX`) are re-derived here in plain Python from
deepspeed/runtime/pipe/schedule.py, runtime/utils.py and pipe/module.py; $ZTRAIN_BUILD/zt_pipe_plan
prints what ztrain's C code computes, and every command of every step must agree for all stage
counts 1-6 and micro-batch counts 1-10, and every partition of random and hand-made layer lists.
A schedule is also simulated as blocking point-to-point pairs between the stages to show it never
deadlocks and that every activation and gradient sent is received.
"""
import os
import random
import re
import subprocess
import sys

BUILD = os.environ.get("ZTRAIN_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
TOOL = os.path.join(BUILD, "zt_pipe_plan")
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL", msg)


# ---- DeepSpeed's schedules ----------------------------------------------------------------------

def train_buffers(stages, stage, mbs):
    return max(2, min(stages - stage + 1, mbs))


def train_schedule(stages, stage, mbs):
    """[(step, name, buffer, micro_batch)] in the order DeepSpeed's generator yields them."""
    def step_to_mb(step):
        if step % 2 == 0 and stage % 2 == 0:
            return step // 2 - stage // 2, True
        if step % 2 == 1 and stage % 2 == 1:
            return (step - 1) // 2 - stage // 2, True
        if step % 2 == 0 and stage % 2 == 1:
            return step // 2 - stages + (stage + 1) // 2, False
        return (step - 1) // 2 - stages + 1 + stage // 2, False

    valid_mb = lambda m: 0 <= m < mbs
    valid_stage = lambda s: 0 <= s < stages
    nbuf = train_buffers(stages, stage, mbs)
    out, prev = [], -1
    total = 2 * (mbs + stages - 1)
    for step in range(total):
        mb, fwd = step_to_mb(step)
        cmd = lambda name, m: out.append((step, name, m % nbuf, m))
        if fwd:
            if valid_mb(mb) and valid_stage(stage - 1):
                cmd("RecvActivation", mb)
            if valid_mb(prev) and valid_stage(stage - 1):
                cmd("SendGrad", prev)
        else:
            if valid_mb(prev) and valid_stage(stage + 1):
                cmd("SendActivation", prev)
            if valid_mb(mb) and valid_stage(stage + 1):
                cmd("RecvGrad", mb)
        if (stage == 0 or stage == stages - 1) and fwd and valid_mb(mb):
            cmd("LoadMicroBatch", mb)
        if valid_mb(mb):
            cmd("ForwardPass" if fwd else "BackwardPass", mb)
        if step == total - 1:
            for name in ("ReduceTiedGrads", "ReduceGrads", "OptimizerStep"):
                out.append((step, name, -1, -1))
        prev = mb
    return out


def inference_schedule(stages, stage, mbs):
    out = []
    valid_mb = lambda m: 0 <= m < mbs
    for step in range(mbs + stages - 1):
        mb = step - stage
        if stage % 2 == 0:
            recv_buf, send_buf = step % 2, (step + 1) % 2
        else:
            recv_buf, send_buf = (step + 1) % 2, step % 2
        if (stage == 0 or stage == stages - 1) and valid_mb(mb):
            out.append((step, "LoadMicroBatch", recv_buf, mb))
        send = stage + 1 < stages and valid_mb(mb - 1)
        recv = stage > 0 and valid_mb(mb)
        pair = [(send, (step, "SendActivation", send_buf, mb - 1)),
                (recv, (step, "RecvActivation", recv_buf, mb))]
        if stage % 2 == 1:
            pair.reverse()
        out.extend(c for ok, c in pair if ok)
        if valid_mb(mb):
            out.append((step, "ForwardPass", recv_buf, mb))
    return out


# ---- DeepSpeed's partitions ---------------------------------------------------------------------

def partition_uniform(n, parts):
    if n <= parts:
        return [min(p, n) for p in range(parts + 1)]
    chunk, residual = n // parts, n % parts
    bounds = [p * chunk for p in range(parts + 1)]
    for i in range(residual):
        for k in range(i + 1, parts + 1):
            bounds[k] += 1
    return bounds


def partition_balanced(weights, parts):
    n, m = len(weights), parts
    if n <= m:
        return partition_uniform(n, m)
    inf = float("inf")
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    dp_max[0][0] = 0
    dp_cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                mx = max(dp_max[k][j - 1], prefix[i] - prefix[k])
                mn = min(dp_min[k][j - 1], prefix[i] - prefix[k])
                cost = mx - mn
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j], dp_max[i][j], dp_min[i][j] = cost, mx, mn
                    position[i][j] = k
    parts_ = [n]
    for i in reversed(range(1, m + 1)):
        parts_.append(position[parts_[-1]][i])
    return list(reversed(parts_))


def partition(method, layers, parts):
    method = method.lower()
    if method == "uniform":
        return partition_uniform(len(layers), parts)
    if method == "parameters":
        return partition_balanced([p for _, p in layers], parts)
    if method.startswith("type:"):
        rx = re.compile(method.split(":")[1], re.IGNORECASE)
        return partition_balanced([1 if rx.search(t) else 0 for t, _ in layers], parts)
    raise ValueError(method)


# ---- running ztrain's side ----------------------------------------------------------------------

def tool(*args):
    return subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True)


def c_schedule(kind, stages, stage, mbs):
    r = tool(kind, stages, stage, mbs)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")[:-1]
    cmds = []
    for line in lines[:-1]:
        step, name, buf, mb = line.split()
        cmds.append((int(step), name, int(buf), int(mb)))
    return cmds, int(lines[-1].split()[1])


def simulate(stages, scheds):
    """Runs every stage's commands with blocking sends and receives (a send completes when its
    receiver posts the matching receive) and reports a deadlock or a mismatched message."""
    pos = [0] * stages
    while any(pos[s] < len(scheds[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            while pos[s] < len(scheds[s]):
                _, name, _, mb = scheds[s][pos[s]]
                peer_kind = {"SendActivation": (s + 1, "RecvActivation"),
                             "RecvActivation": (s - 1, "SendActivation"),
                             "SendGrad": (s - 1, "RecvGrad"),
                             "RecvGrad": (s + 1, "SendGrad")}.get(name)
                if peer_kind is None:
                    pos[s] += 1
                    moved = True
                    continue
                peer, want = peer_kind
                if pos[peer] < len(scheds[peer]) and scheds[peer][pos[peer]][1] == want:
                    if scheds[peer][pos[peer]][3] != mb:
                        return f"stage {s} {name} micro-batch {mb} met micro-batch " \
                               f"{scheds[peer][pos[peer]][3]}"
                    pos[s] += 1
                    pos[peer] += 1
                    moved = True
                    continue
                break
        if not moved:
            return "deadlock at " + ", ".join(
                str(scheds[s][pos[s]]) if pos[s] < len(scheds[s]) else "done" for s in range(stages))
    return None


def check_schedules():
    for stages in range(1, 7):
        for mbs in range(1, 11):
            train = []
            for stage in range(stages):
                want = train_schedule(stages, stage, mbs)
                got, nbuf = c_schedule("train", stages, stage, mbs)
                if got != want:
                    fail(f"train S={stages} stage={stage} M={mbs}: first difference "
                         f"{next((g, w) for g, w in zip(got + [None] * len(want), want) if g != w)}")
                if nbuf != train_buffers(stages, stage, mbs):
                    fail(f"train buffers S={stages} stage={stage} M={mbs}: {nbuf}")
                fwd = [c[3] for c in got if c[1] == "ForwardPass"]
                bwd = [c[3] for c in got if c[1] == "BackwardPass"]
                if fwd != list(range(mbs)) or bwd != list(range(mbs)):
                    fail(f"train S={stages} stage={stage} M={mbs}: forwards {fwd} backwards {bwd}")
                # A buffer is never reused while its micro-batch still waits for its backward.
                live = {}
                for _, name, buf, mb in got:
                    if name == "ForwardPass":
                        if buf in live:
                            fail(f"S={stages} stage={stage} M={mbs}: buffer {buf} reused by "
                                 f"micro-batch {mb} while {live[buf]} is in flight")
                        live[buf] = mb
                    elif name == "BackwardPass":
                        live.pop(buf, None)
                train.append(got)
            why = simulate(stages, train)
            if why:
                fail(f"train S={stages} M={mbs}: {why}")
            inf = []
            for stage in range(stages):
                want = inference_schedule(stages, stage, mbs)
                got, nbuf = c_schedule("inference", stages, stage, mbs)
                if got != want or nbuf != 2:
                    fail(f"inference S={stages} stage={stage} M={mbs}: differs")
                inf.append(got)
            why = simulate(stages, inf)
            if why:
                fail(f"inference S={stages} M={mbs}: {why}")


def c_partition(method, layers, parts):
    r = tool("partition", parts, method, *[f"{t}:{p}" for t, p in layers])
    if r.returncode != 0:
        return None, r.stderr.strip()
    return [int(x) for x in r.stdout.split()[1:]], None


def check_partitions():
    gpt2 = [("embed", 39_383_808)] + [("block", 7_087_872)] * 12 + [("final_norm", 1536),
                                                                   ("head", 38_597_376)]
    # Known answers, worked by hand: the embedding and the tied head outweigh three blocks each.
    known = [
        ("uniform", [("a", 1)] * 7, 3, [0, 3, 5, 7]),
        ("uniform", [("a", 1)] * 2, 3, None),  # a stage without layers
        ("parameters", [("embed", 100), ("block", 10), ("block", 10), ("block", 10),
                        ("head", 100)], 2, [0, 3, 5]),
        ("type:block", [("embed", 100)] + [("block", 10)] * 4 + [("head", 100)], 2, [0, 3, 6]),
        ("TYPE:BLOCK", [("embed", 100)] + [("block", 10)] * 4 + [("head", 100)], 2, [0, 3, 6]),
    ]
    for method, layers, parts, want in known:
        got, err = c_partition(method, layers, parts)
        if want is None:
            if got is not None or "gets no layers" not in err:
                fail(f"{method} {layers} {parts}: expected a stage-without-layers error, got {got}")
        elif got != want:
            fail(f"{method} parts={parts}: got {got}, want {want}")
    rng = random.Random(7)
    cases = [(m, gpt2, p) for m in ("parameters", "uniform", "type:block", "type:^b|head")
             for p in range(1, 7)]
    for _ in range(300):
        n = rng.randint(1, 18)
        types = ["embed", "block", "mlp", "norm", "head"]
        layers = [(rng.choice(types), rng.choice([0, 1, rng.randint(1, 10**6)])) for _ in range(n)]
        method = rng.choice(["parameters", "uniform", "type:block", "type:m"])
        cases.append((method, layers, rng.randint(1, 6)))
    for method, layers, parts in cases:
        want = partition(method, layers, parts)
        got, err = c_partition(method, layers, parts)
        empty = any(want[s + 1] <= want[s] for s in range(parts))
        matches = not method.startswith("type:") or any(
            re.search(method.split(":")[1], t, re.IGNORECASE) for t, _ in layers)
        if not matches:
            if got is not None or "matches no layer" not in err:
                fail(f"{method} on {layers}: expected 'matches no layer', got {got} {err}")
        elif empty:
            if got is not None or "gets no layers" not in err:
                fail(f"{method} parts={parts} on {layers}: DeepSpeed leaves a stage empty {want}; "
                     f"expected an error, got {got}")
        elif got != want:
            fail(f"{method} parts={parts} on {layers}: got {got}, DeepSpeed gives {want}")
    for bad, text in (("profile", "unknown method"), ("type:(", "does not compile"),
                      ("type:", "needs a pattern")):
        got, err = c_partition(bad, gpt2, 2)
        if got is not None or text not in (err or ""):
            fail(f"{bad}: expected an error containing {text!r}, got {got} {err}")


check_schedules()
check_partitions()
print("FAILED" if failures else "OK", f"({failures} failures)")
sys.exit(1 if failures else 0)
