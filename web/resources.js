/* The API's resources as the views use them. Every HTTP body is the proto3 JSON mapping of a
 * message of proto/ztrain.proto (lowerCamelCase names, int64 as strings, enums by name,
 * Timestamps as RFC 3339 text, NaN as "NaN", defaults left out); the views work on plain
 * numbers instead: steps as numbers, times as milliseconds since the epoch, a value that is not
 * known (NaN, absent) as null (but a metric's NaN or infinite value as that number: the charts
 * mark it), the state without its JOB_STATE_ prefix, and the spec in the job file's form
 * (snake_case keys, "deepspeed" as an object). This module is the one place that knows both. */
import {apiJson, ApiError, jobPath} from './api.js';
import {isNum} from './format.js';

/* An int64 (a string) or int32 field; absent is the default, 0. */
export function int(v) {
  if (v === undefined || v === null || v === '') return 0;
  const n = Number(v);
  return Number.isFinite(n) ? n : 0;
}

/* A double: null when absent-as-unknown is meant (`absent`), NaN or infinite. */
export function num(v, absent = 0) {
  if (v === undefined || v === null) return absent;
  if (typeof v === 'string') v = Number(v);
  return Number.isFinite(v) ? v : null;
}

/* A metric's value: absent is 0, and NaN and ±Infinity stay what they are ("NaN", "Infinity",
 * "-Infinity"), where the charts mark them. */
export function metricValue(v) {
  if (v === undefined || v === null) return 0;
  return typeof v === 'string' ? Number(v) : v;
}

/* A Timestamp as milliseconds since the epoch; 0 when unset. */
export function timeMs(v) {
  if (!v) return 0;
  const t = Date.parse(v);
  return Number.isFinite(t) ? t : 0;
}

/* A Duration ("12.500s") as milliseconds; null when unset. */
export function durationMs(v) {
  if (!v) return null;
  const s = parseFloat(v);
  return Number.isFinite(s) ? Math.round(s * 1000) : null;
}

export function stateName(s) {
  return (s || 'JOB_STATE_UNSPECIFIED').replace(/^JOB_STATE_/, '');
}

function snake(key) {
  return key.replace(/[A-Z]/g, (c) => '_' + c.toLowerCase());
}

/* The JobSpec message as the job file writes it: the *_json text fields ("deepspeedJson",
 * "eventsJson", "alertsJson") parsed into the sections they carry. */
export function specFromApi(spec) {
  const conv = (v) => {
    if (Array.isArray(v)) return v.map(conv);
    if (v && typeof v === 'object') {
      const out = {};
      for (const [k, x] of Object.entries(v)) out[snake(k)] = conv(x);
      return out;
    }
    return v;
  };
  const out = conv(spec || {});
  for (const [field, section] of [['deepspeed_json', 'deepspeed'], ['events_json', 'events'],
    ['alerts_json', 'alerts']]) {
    if (out[field] === undefined) continue;
    try {
      out[section] = JSON.parse(out[field]);
    } catch (e) {
      out[section] = out[field];
    }
    delete out[field];
  }
  /* int64 fields of the spec (train.max_steps, fork_from.step) arrive as strings. */
  if (out.train && out.train.max_steps !== undefined) out.train.max_steps = int(out.train.max_steps);
  if (out.fork_from && out.fork_from.step !== undefined) out.fork_from.step = int(out.fork_from.step);
  return out;
}

const FIGURES = ['stepTimeMs', 'dataMs', 'fwdMs', 'bwdMs', 'stepMs', 'commMs', 'computeMs',
  'cpuUtil', 'rssBytes', 'peakRssBytes', 'gpuUtil', 'gpuMemoryUsedBytes', 'gpuPowerWatts',
  'gpuTemperatureC'];

function rankFromApi(r) {
  const out = {rank: int(r.rank), pid: int(r.pid), running: !!r.running,
    exit_code: int(r.exitCode), signal: int(r.signal), exit_unknown: !!r.exitUnknown};
  /* A figure not reported yet is NaN ("NaN"); the views show it as unknown. */
  for (const k of FIGURES) out[snake(k)] = num(r[k]);
  return out;
}

function attemptFromApi(a) {
  return {attempt: int(a.attempt), started_unix_ms: timeMs(a.startTime),
    ended_unix_ms: timeMs(a.endTime), step: int(a.step), resumed_from_step: int(a.resumedFromStep),
    rank: int(a.rank), exit_code: int(a.exitCode), signal: int(a.signal), failed: !!a.failed,
    reason: a.reason || ''};
}

/* A Job message as the views use it (no checkpoints: getJob adds them). */
export function jobFromApi(j) {
  const spec = specFromApi(j.spec);
  const started = timeMs(j.startTime);
  const job = {
    id: j.id || '', name: j.name || '', state: stateName(j.state), reason: j.reason || '',
    world_size: spec.world_size || 1, device: spec.device || 'cpu', comm: j.comm || '',
    grid: {dp: int(j.grid && j.grid.dp) || 1, pp: int(j.grid && j.grid.pp) || 1,
      tp: int(j.grid && j.grid.tp) || 1},
    created_unix_ms: timeMs(j.createTime), started_unix_ms: started,
    /* null (shown "—") for a job that has not started: a queued one ran for no time at all. */
    finished_unix_ms: timeMs(j.endTime), elapsed_ms: started ? durationMs(j.runDuration) || 0 : null,
    step: int(j.step), max_steps: int(j.maxSteps), loss: num(j.loss),
    tokens_per_second: num(j.tokensPerSecond),
    ranks: (j.ranks || []).map(rankFromApi), attempts: (j.attempts || []).map(attemptFromApi),
    run_dir: j.runDir || '', checkpoint_dir: j.checkpointDir || '',
    idempotency_key: j.idempotencyKey || '', submitter: j.submitter || '',
    submitter_scope: j.submitterScope || '', spec,
  };
  job.eta_ms = etaMs(job);
  return job;
}

/* The remaining time of a running job at the pace of its current attempt: the steps it made
 * since its ranks last started (from a checkpoint's step, for a restart or a fork) over the time
 * since then, on the server's clock. The pace since the job's start counted a fork's inherited
 * steps as made in no time (a fork from step 10,000 was given a hundredth of its ETA) and a
 * restart's lost attempt as progress. null before the attempt's first step. */
function etaMs(job) {
  if (job.state !== 'RUNNING' || !(job.max_steps > 0) || !(job.elapsed_ms > 0)) return null;
  const current = job.attempts[job.attempts.length - 1];
  const from = current ? current.resumed_from_step : 0;
  let ms = job.elapsed_ms;
  if (current && current.started_unix_ms > 0 && job.started_unix_ms > 0) {
    ms -= current.started_unix_ms - job.started_unix_ms;
  }
  const done = job.step - from;
  if (!(done > 0) || !(ms > 0)) return null;
  return Math.max(0, Math.floor((job.max_steps - job.step) * ms / done));
}

/* A MetricRecord: {step, time_unix_ms, values: {key: number}}. */
export function recordFromApi(r) {
  const values = {};
  for (const v of r.values || []) values[v.key] = metricValue(v.value);
  return {step: int(r.step), time_unix_ms: timeMs(r.time), values};
}

export function logFromApi(l) {
  return {seq: int(l.seq), time_unix_ms: timeMs(l.time), rank: int(l.rank),
    stream: l.stream || '', text: l.text || ''};
}

export function anomalyFromApi(a) {
  return {seq: int(a.seq), step: int(a.step), time_unix_ms: timeMs(a.time), kind: a.kind || '',
    policy: a.policy || '', value: num(a.value, null), rank: int(a.rank),
    message: a.message || ''};
}

/* The time of a step's points, of the times of its records (in the order they came) and the
 * start times of the job's attempts: its first record's, the training one (an evaluation record
 * of the step comes after it), in the newest attempt that logged the step (a restart runs the
 * steps since its checkpoint again, and the page draws their newer values). NaN for none. */
export function stepTime(times, attemptStarts) {
  if (!times.length) return NaN;
  const last = times[times.length - 1];
  const from = Math.max(-Infinity, ...attemptStarts.filter((t) => t <= last));
  return times.find((t) => t >= from);
}

/* Keys of one /metrics query: the API's limit (64), less the record time asked with each. */
const KEYS_PER_QUERY = 63;
const TIME_KEY = 'time_unix_ms';

/* A job's history of `keys` from step `since` on, thinned by the API to at most maxPoints
 * points a key, as records in step order ({step, time_unix_ms, values}), for the charts of the
 * job and comparison pages.
 * Keys logged at the same steps are thinned to the same steps; each query also asks for the
 * records' time (stepTime() picks a step's), and a point whose record time did not come is
 * placed between its neighbours'. */
export async function thinnedHistory(job, keys, maxPoints, opts, since = 0) {
  const bySteps = new Map();
  for (let i = 0; i < keys.length; i += KEYS_PER_QUERY) {
    const ask = keys.slice(i, i + KEYS_PER_QUERY).concat([TIME_KEY]);
    const res = await apiJson(jobPath(job.id, `/metrics?keys=${encodeURIComponent(ask.join(','))}` +
      `&max_points=${maxPoints}&since_step=${since}`), opts);
    for (const ser of res.series || []) {
      /* proto3 JSON: steps are int64 strings, values doubles (NaN as "NaN"). */
      (ser.steps || []).map(int).forEach((step, k) => {
        let rec = bySteps.get(step);
        if (!rec) {
          rec = {step, time_unix_ms: NaN, values: {}, times: []};
          bySteps.set(step, rec);
        }
        /* A step run again after a restart has the newer attempt's values, which come later. */
        if (ser.key !== TIME_KEY) rec.values[ser.key] = metricValue(ser.values[k]);
        else if (isNum(num(ser.values[k]))) rec.times.push(num(ser.values[k]));
      });
    }
  }
  const starts = (job.attempts || []).map((a) => a.started_unix_ms).filter((t) => t > 0);
  for (const rec of bySteps.values()) {
    rec.time_unix_ms = stepTime(rec.times, starts);
    delete rec.times;
  }
  const recs = [...bySteps.values()].sort((a, b) => a.step - b.step);
  let prev = -1;
  for (let k = 0; k < recs.length; k++) {
    if (isNum(recs[k].time_unix_ms)) {
      prev = k;
      continue;
    }
    let next = k + 1;
    while (next < recs.length && !isNum(recs[next].time_unix_ms)) next++;
    const a = prev >= 0 ? recs[prev] : null;
    const b = next < recs.length ? recs[next] : null;
    if (a && b) {
      recs[k].time_unix_ms = a.time_unix_ms +
        (b.time_unix_ms - a.time_unix_ms) * (recs[k].step - a.step) / (b.step - a.step);
    } else if (a || b) {
      recs[k].time_unix_ms = (a || b).time_unix_ms;
    }
  }
  return recs;
}

/* The effective DeepSpeed config (/config), or null. Rank 0 writes it before the first step,
 * so it is only asked for once the job has one: before, the route answers
 * FAILED_PRECONDITION, which the browser would log as a failed load. */
async function effectiveConfig(id, job, opts) {
  if (!(job.step > 0)) return null;
  try {
    const config = await apiJson(jobPath(id, '/config'), opts);
    return config.deepspeedJson ? JSON.parse(config.deepspeedJson) : null;
  } catch (e) {
    if (e instanceof ApiError && e.status === 400) return null;
    throw e;
  }
}

/* One job with its checkpoints (/checkpoints) and its effective DeepSpeed config (null until
 * rank 0 has written it). A job's effective config never changes once written, so a poller
 * passes the job it read last (`prev`) and the config is asked for only until it has come. */
export async function getJob(id, opts, prev) {
  const [job, cks] = await Promise.all([
    apiJson(jobPath(id), opts).then(jobFromApi),
    apiJson(jobPath(id, '/checkpoints'), opts),
  ]);
  job.checkpoints = (cks.checkpoints || []).map((c) => ({tag: c.tag || '',
    step: int(c.step) < 0 ? null : int(c.step), complete: !!c.complete}));
  job.latest = cks.latest || '';
  job.effective_config = prev && prev.effective_config ? prev.effective_config
    : await effectiveConfig(id, job, opts);
  return job;
}
