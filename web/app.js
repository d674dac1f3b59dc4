/* ztrain dashboard: the jobs table and the job page, built on ztraind's HTTP API alone (the API a
 * script would use), with Debian's Chart.js for the charts. No build step and no framework: the
 * markup lives in index.html's templates and this file fills it in.
 *
 * The job page loads a job's history once (/records, /logs) and then follows the job's event
 * stream, which it reads with fetch() rather than EventSource because EventSource cannot send the
 * bearer token. New records are appended to the charts in place; nothing is fetched twice. */
'use strict';

(function () {
  const TOKEN_KEY = 'ztrain.token';
  const TERMINAL = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);
  const LIST_POLL_MS = 1500;
  const JOB_POLL_MS = 2000;
  /* Records arriving together (a replayed history, or several ranks' steps) are drawn in one
   * chart update; this bounds how late a new point can appear. */
  const FLUSH_MS = 150;
  const LOG_TAIL = 200;
  const LOG_MAX_LINES = 2000;

  const $ = (root, sel) => root.querySelector(sel);
  const main = document.getElementById('main');
  const banner = document.getElementById('banner');
  const tokenPanel = document.getElementById('token-panel');
  const tokenInput = document.getElementById('token-input');

  /* ---- formatting ------------------------------------------------------------------------- */

  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

  function fmtFixed(v, digits) {
    return isNum(v) ? v.toFixed(digits) : '—';
  }

  function fmtCompact(v) {
    if (!isNum(v)) return '—';
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(2) + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(2) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    return a >= 100 ? v.toFixed(0) : v.toPrecision(3);
  }

  function fmtDuration(ms) {
    if (!isNum(ms) || ms < 0) return '—';
    let s = Math.round(ms / 1000);
    const h = Math.floor(s / 3600);
    s -= h * 3600;
    const m = Math.floor(s / 60);
    s -= m * 60;
    if (h) return `${h}h ${String(m).padStart(2, '0')}m`;
    if (m) return `${m}m ${String(s).padStart(2, '0')}s`;
    return `${s}s`;
  }

  function fmtClock(seconds) {
    const s = Math.round(seconds);
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const ss = String(s % 60).padStart(2, '0');
    return h ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
  }

  function fmtBytes(v) {
    if (!isNum(v)) return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) {
      v /= 1024;
      i++;
    }
    return (i ? v.toFixed(1) : String(v)) + ' ' + units[i];
  }

  function fmtProgress(job) {
    if (!job) return '—';
    return job.max_steps > 0 ? `${job.step} / ${job.max_steps}` : `step ${job.step}`;
  }

  const SIGNALS = {1: 'SIGHUP', 2: 'SIGINT', 6: 'SIGABRT', 9: 'SIGKILL', 11: 'SIGSEGV', 15: 'SIGTERM'};

  function fmtRankState(r) {
    if (r.running) return 'running';
    if (!r.pid) return 'not started';
    if (r.signal) return `killed by signal ${r.signal}` + (SIGNALS[r.signal] ? ` (${SIGNALS[r.signal]})` : '');
    return `exited ${r.exit_code}`;
  }

  /* ---- banner and token ------------------------------------------------------------------- */

  let bannerKind = null;

  function showBanner(kind, text) {
    bannerKind = kind;
    banner.textContent = text;
    banner.dataset.kind = kind;
    banner.className = 'banner' + (kind === 'info' ? ' info' : '');
    banner.hidden = false;
  }

  function clearBanner(kind) {
    if (kind && bannerKind !== kind) return;
    bannerKind = null;
    banner.hidden = true;
    banner.textContent = '';
  }

  function getToken() {
    try {
      return localStorage.getItem(TOKEN_KEY) || '';
    } catch (e) {
      return '';
    }
  }

  function setToken(t) {
    try {
      if (t) localStorage.setItem(TOKEN_KEY, t);
      else localStorage.removeItem(TOKEN_KEY);
    } catch (e) {
      /* Private windows may refuse storage; the token then lasts until the page is closed. */
    }
    sessionToken = t;
  }

  let sessionToken = getToken();
  /* Set by a 401 until a token is entered, so the polling loops stop repeating a failing call. */
  let authBlocked = false;

  function openTokenPanel() {
    const wasHidden = tokenPanel.hidden;
    tokenPanel.hidden = false;
    tokenInput.value = '';
    if (wasHidden) tokenInput.focus();
  }

  function onUnauthorized(message) {
    authBlocked = true;
    const detail = message ? ` (${message})` : '';
    if (sessionToken) {
      showBanner('auth', `401 Unauthorized: ztraind rejected the API token${detail}. Enter the right token below.`);
    } else {
      showBanner('auth', `401 Unauthorized: this ztraind requires an API token${detail}. Enter it below.`);
    }
    openTokenPanel();
  }

  document.getElementById('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = tokenInput.value.trim();
    if (!t) return;
    setToken(t);
    tokenInput.value = '';
    tokenPanel.hidden = true;
    authBlocked = false;
    clearBanner('auth');
    route();
  });

  document.getElementById('token-forget').addEventListener('click', () => {
    setToken('');
    tokenInput.value = '';
    tokenPanel.hidden = true;
    authBlocked = false;
    clearBanner('auth');
    route();
  });

  document.getElementById('token-button').addEventListener('click', () => {
    if (tokenPanel.hidden) openTokenPanel();
    else tokenPanel.hidden = true;
  });

  /* ---- API -------------------------------------------------------------------------------- */

  class AuthError extends Error {}

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function errorText(res) {
    try {
      const body = await res.json();
      return body && body.error ? String(body.error) : res.statusText;
    } catch (e) {
      return res.statusText;
    }
  }

  /* fetch() with the bearer token; a 401 opens the token form and throws AuthError, any other
   * failure throws ApiError carrying the server's message. */
  async function apiFetch(path, opts = {}) {
    const headers = Object.assign({Accept: 'application/json'}, opts.headers || {});
    if (sessionToken) headers.Authorization = 'Bearer ' + sessionToken;
    let res;
    try {
      res = await fetch(path, Object.assign({}, opts, {headers}));
    } catch (e) {
      if (e.name === 'AbortError') throw e;
      throw new ApiError(0, `cannot reach ztraind (${e.message})`);
    }
    if (res.status === 401) {
      const msg = await errorText(res);
      onUnauthorized(msg);
      throw new AuthError(msg);
    }
    if (!res.ok) throw new ApiError(res.status, await errorText(res));
    return res;
  }

  async function apiJson(path, opts) {
    const res = await apiFetch(path, opts);
    return res.json();
  }

  function jobPath(id, rest = '') {
    return `/api/v1/jobs/${encodeURIComponent(id)}${rest}`;
  }

  /* Reports a failed call in the banner; aborts (leaving a view) and 401s (already reported)
   * are quiet. */
  function reportError(e, what) {
    if (e.name === 'AbortError' || e instanceof AuthError) return;
    if (e instanceof ApiError && e.status === 0) showBanner('net', `ztraind is not answering: ${e.message}`);
    else showBanner('error', `${what}: ${e.message}`);
  }

  /* Reads a Server-Sent Events response, calling onEvent({event, data}) for each event. */
  async function readEvents(res, onEvent) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    let name = '';
    let data = [];
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += decoder.decode(value, {stream: true});
      for (;;) {
        const m = /\r\n|\n|\r(?!$)/.exec(buf);
        if (!m) break;
        const line = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        if (line === '') {
          if (data.length) onEvent({event: name || 'message', data: data.join('\n')});
          name = '';
          data = [];
          continue;
        }
        if (line[0] === ':') continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? '' : line.slice(colon + 1);
        if (val[0] === ' ') val = val.slice(1);
        if (field === 'event') name = val;
        else if (field === 'data') data.push(val);
      }
    }
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  /* ---- health ----------------------------------------------------------------------------- */

  async function refreshHealth() {
    const el = document.getElementById('health');
    try {
      const res = await fetch('/healthz', {headers: {Accept: 'application/json'}});
      const h = await res.json();
      el.textContent = `ztraind ${h.status} · ${h.jobs} jobs · ${h.running} running · ${h.queued} queued`;
    } catch (e) {
      el.textContent = 'ztraind unreachable';
    }
  }

  /* ---- router ----------------------------------------------------------------------------- */

  let view = null;

  function parseQuery(s) {
    const q = {};
    new URLSearchParams(s || '').forEach((v, k) => {
      q[k] = v;
    });
    return q;
  }

  function route() {
    if (view) view.destroy();
    view = null;
    main.replaceChildren();
    clearBanner('error');
    const hash = location.hash || '#/';
    const m = /^#\/jobs\/([^/?]+)/.exec(hash);
    if (m) {
      view = jobView(decodeURIComponent(m[1]));
    } else {
      const qi = hash.indexOf('?');
      view = jobsView(parseQuery(qi >= 0 ? hash.slice(qi + 1) : ''));
    }
  }

  function cloneTemplate(id) {
    return document.getElementById(id).content.firstElementChild.cloneNode(true);
  }

  function setText(el, text) {
    if (el && el.textContent !== text) el.textContent = text;
  }

  function stateBadge(el, state) {
    setText(el, state || '');
    el.className = 'state state-' + (state || 'UNKNOWN');
    el.dataset.state = state || '';
  }

  /* ---- jobs view -------------------------------------------------------------------------- */

  function jobsView(q) {
    const root = cloneTemplate('jobs-view');
    main.append(root);
    document.title = 'Jobs · ztrain';
    const filter = $(root, '[data-testid=state-filter]');
    const body = $(root, '[data-testid=jobs-body]');
    const empty = $(root, '[data-testid=jobs-empty]');
    const older = $(root, '[data-testid=page-older]');
    const newest = $(root, '[data-testid=page-newest]');
    filter.value = q.state || '';
    filter.addEventListener('change', () => {
      location.hash = '#/' + (filter.value ? '?state=' + encodeURIComponent(filter.value) : '');
    });
    newest.hidden = !q.after;
    newest.addEventListener('click', () => {
      location.hash = '#/' + (q.state ? '?state=' + encodeURIComponent(q.state) : '');
    });
    let nextAfter = null;
    older.addEventListener('click', () => {
      const p = new URLSearchParams();
      if (q.state) p.set('state', q.state);
      p.set('after', nextAfter);
      location.hash = '#/?' + p;
    });

    const rows = new Map();
    const ctrl = new AbortController();
    let alive = true;
    let timer = null;

    function makeRow(id) {
      const tr = document.createElement('tr');
      tr.dataset.testid = 'job-row';
      tr.dataset.jobId = id;
      tr.innerHTML =
        '<td data-label="Job"><div><a data-testid="job-link"></a><span class="job-id"></span></div></td>' +
        '<td data-label="State"><div><span class="state" data-testid="state"></span>' +
        '<span class="reason" data-testid="reason"></span></div></td>' +
        '<td data-label="Progress" class="progress-cell"><div><span data-testid="progress"></span>' +
        '<progress max="1" value="0" aria-label="Progress"></progress></div></td>' +
        '<td data-label="Loss" class="num" data-testid="loss"></td>' +
        '<td data-label="Tokens/s" class="num" data-testid="tps"></td>' +
        '<td data-label="Elapsed" class="num" data-testid="elapsed"></td>' +
        '<td data-label="ETA" class="num" data-testid="eta"></td>';
      const a = $(tr, 'a');
      a.href = '#/jobs/' + encodeURIComponent(id);
      setText($(tr, '.job-id'), id);
      return tr;
    }

    function fillRow(tr, job) {
      tr.dataset.state = job.state;
      const a = $(tr, 'a');
      setText(a, job.name || job.id);
      a.setAttribute('aria-label', `${job.name || job.id} (${job.id}), ${job.state}`);
      stateBadge($(tr, '[data-testid=state]'), job.state);
      setText($(tr, '[data-testid=reason]'), job.reason || '');
      setText($(tr, '[data-testid=progress]'), fmtProgress(job));
      const bar = $(tr, 'progress');
      bar.value = job.max_steps > 0 ? Math.min(1, job.step / job.max_steps) : 0;
      setText($(tr, '[data-testid=loss]'), fmtFixed(job.loss, 4));
      setText($(tr, '[data-testid=tps]'), fmtCompact(job.tokens_per_second));
      setText($(tr, '[data-testid=elapsed]'), fmtDuration(job.elapsed_ms));
      setText($(tr, '[data-testid=eta]'), TERMINAL.has(job.state) ? '—' : fmtDuration(job.eta_ms));
    }

    function render(jobs) {
      const ids = jobs.map((j) => j.id);
      for (const [id, tr] of rows) {
        if (!ids.includes(id)) {
          tr.remove();
          rows.delete(id);
        }
      }
      jobs.forEach((job, i) => {
        let tr = rows.get(job.id);
        if (!tr) {
          tr = makeRow(job.id);
          rows.set(job.id, tr);
        }
        fillRow(tr, job);
        /* Rows are moved only when out of place, so a focused link keeps its focus. */
        if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
      });
      empty.hidden = jobs.length > 0;
    }

    async function poll() {
      if (!alive) return;
      if (!authBlocked) {
        try {
          const p = new URLSearchParams({limit: '50'});
          if (q.state) p.set('state', q.state);
          if (q.after) p.set('after', q.after);
          const data = await apiJson('/api/v1/jobs?' + p, {signal: ctrl.signal});
          if (!alive) return;
          render(data.jobs || []);
          nextAfter = data.next_after || null;
          older.hidden = !nextAfter;
          clearBanner('net');
          clearBanner('error');
          refreshHealth();
        } catch (e) {
          reportError(e, 'Listing jobs failed');
        }
      }
      if (alive) timer = setTimeout(poll, LIST_POLL_MS);
    }

    poll();
    return {
      destroy() {
        alive = false;
        clearTimeout(timer);
        ctrl.abort();
      },
    };
  }

  /* ---- charts ----------------------------------------------------------------------------- */

  /* Each chart draws one or more metric keys. A smoothed key gets two datasets, as in
   * TensorBoard: the raw points faded (role "raw") and their moving average (role "smoothed"). */
  const CHARTS = {
    loss: {logToggle: true, series: [
      {key: 'train/loss', label: 'train loss', color: '31,111,235', smooth: true},
      {key: 'eval/loss', label: 'eval loss', color: '227,98,9', points: true},
    ]},
    lr: {series: [{key: 'train/learning_rate', label: 'learning rate', color: '130,80,223'}]},
    step_time: {series: [{key: 'perf/step_time_ms', label: 'step time (ms)', color: '10,127,127', smooth: true}]},
    tps: {series: [{key: 'perf/tokens_per_second', label: 'tokens/s', color: '26,127,55', smooth: true}]},
    tflops: {series: [
      {key: 'perf/tflops', label: 'TFLOPS', color: '191,57,137', smooth: true},
      {key: 'perf/mfu', label: 'MFU', color: '154,103,0', smooth: true, axis: 'y1'},
    ]},
    grad_norm: {series: [{key: 'train/grad_norm', label: 'grad norm', color: '207,34,46', smooth: true}]},
    loss_scale: {series: [{key: 'train/loss_scale', label: 'loss scale', color: '87,96,106'}]},
  };

  /* TensorBoard's smoothing: an exponential moving average started at 0 and divided by
   * (1 - w^n) so the first points are not pulled towards 0; constant series and non-finite
   * values are left as they are. */
  function smooth(points, w) {
    const out = new Array(points.length);
    const constant = points.every((p) => p.y === points[0].y);
    let last = 0;
    let n = 0;
    for (let i = 0; i < points.length; i++) {
      const p = points[i];
      let y = p.y;
      if (!constant && Number.isFinite(y) && w > 0) {
        last = last * w + (1 - w) * y;
        n++;
        y = w === 1 ? last : last / (1 - Math.pow(w, n));
      }
      out[i] = {x: p.x, y, step: p.step, t: p.t};
    }
    return out;
  }

  /* ---- job view --------------------------------------------------------------------------- */

  function jobView(id) {
    const root = cloneTemplate('job-view');
    main.append(root);
    document.title = `${id} · ztrain`;
    const field = (name) => $(root, `[data-field="${name}"]`);
    const tid = (name) => $(root, `[data-testid="${name}"]`);
    const ctrl = new AbortController();
    const signal = ctrl.signal;

    const st = {
      job: null,
      alive: true,
      maxStep: -1,
      logSeq: 0,
      t0: null,
      xMode: 'step',
      smoothing: Number(tid('smoothing').value),
      logLoss: false,
      memory: {},        /* "rank0/params_bytes" -> value, from the newest record that has it */
      lastStepTime: null,
      series: new Map(), /* key -> {points: [{x, y, step, t}], byStep: Map, chart, def, dirty} */
      charts: {},
      flushTimer: null,
      allDirty: false,
      pollTimer: null,
      specShown: false,
      streamEnded: false,
    };

    /* -- charts -- */

    const tooltipNumber = (v) => (isNum(v) ? String(v) : '—');

    function xTitle() {
      return st.xMode === 'step' ? 'step' : 'wall time since start (m:ss)';
    }

    function makeChart(name, def) {
      const canvas = $(root, `canvas[data-chart="${name}"]`);
      const datasets = [];
      for (const s of def.series) {
        const entry = {points: [], byStep: new Map(), chart: name, def: s, dirty: false};
        st.series.set(s.key, entry);
        const base = {
          ztKey: s.key, label: s.label, yAxisID: s.axis || 'y', data: entry.points,
          borderColor: `rgba(${s.color},${s.smooth ? 0.28 : 1})`,
          backgroundColor: `rgba(${s.color},${s.smooth ? 0.28 : 1})`,
          borderWidth: s.smooth ? 1 : 1.6,
          pointRadius: s.points ? 2.5 : 0,
        };
        datasets.push(Object.assign({}, base, {ztRole: 'raw', ztLegend: !s.smooth}));
        if (s.smooth) {
          datasets.push(Object.assign({}, base, {
            ztRole: 'smoothed', ztLegend: true, data: [],
            borderColor: `rgb(${s.color})`, backgroundColor: `rgb(${s.color})`, borderWidth: 1.8,
            pointRadius: s.points ? 2.5 : 0,
          }));
        }
      }
      const scales = {
        x: {type: 'linear', title: {display: true, text: xTitle()},
          ticks: {maxTicksLimit: 8, callback: (v) => (st.xMode === 'step' ? v : fmtClock(v))}},
        y: {type: 'linear', ticks: {maxTicksLimit: 6}},
      };
      if (def.series.some((s) => s.axis === 'y1')) {
        scales.y1 = {type: 'linear', position: 'right', display: false, grid: {drawOnChartArea: false},
          title: {display: true, text: 'MFU'}};
      }
      const chart = new Chart(canvas, {
        type: 'line',
        data: {datasets},
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,
          parsing: false,
          normalized: true,
          spanGaps: true,
          interaction: {mode: 'nearest', axis: 'x', intersect: false},
          elements: {line: {tension: 0}, point: {hitRadius: 4, hoverRadius: 3}},
          scales,
          plugins: {
            decimation: {enabled: true, algorithm: 'min-max'},
            legend: {
              display: false,
              labels: {boxWidth: 12, filter: (item, data) => {
                const d = data.datasets[item.datasetIndex];
                return d.ztLegend && d.data.length > 0;
              }},
              /* A legend entry stands for a key: hiding it hides its raw and smoothed lines. */
              onClick: (e, item, legend) => {
                const ch = legend.chart;
                const key = ch.data.datasets[item.datasetIndex].ztKey;
                const show = !ch.isDatasetVisible(item.datasetIndex);
                ch.data.datasets.forEach((d, i) => {
                  if (d.ztKey === key) ch.setDatasetVisibility(i, show);
                });
                ch.update('none');
              },
            },
            tooltip: {
              filter: (item) => !(item.dataset.ztRole === 'smoothed' && st.smoothing === 0),
              callbacks: {
                title: (items) => {
                  if (!items.length) return '';
                  const p = items[0].raw;
                  return st.xMode === 'step' ? `step ${p.step}` : `${fmtClock(p.x)} since start · step ${p.step}`;
                },
                label: (item) => {
                  const d = item.dataset;
                  const suffix = d.ztRole === 'smoothed' ? ' (smoothed)' : '';
                  return `${d.label}${suffix}: ${tooltipNumber(item.raw.y)}`;
                },
              },
            },
          },
        },
      });
      canvas.dataset.keys = def.series.map((s) => s.key).join(',');
      st.charts[name] = chart;
    }

    for (const [name, def] of Object.entries(CHARTS)) makeChart(name, def);

    function xOf(p) {
      return st.xMode === 'step' ? p.step : (p.t - st.t0) / 1000;
    }

    function addRecord(rec) {
      const values = rec.values || {};
      const step = rec.step;
      if (!isNum(step)) return;
      if (step > st.maxStep) st.maxStep = step;
      if (st.t0 === null && isNum(rec.time_unix_ms)) setT0(rec.time_unix_ms);
      for (const key in values) {
        const v = values[key];
        if (!isNum(v)) continue;
        const m = /^memory\/(rank\d+\/.+)$/.exec(key);
        if (m) {
          st.memory[m[1]] = v;
          continue;
        }
        if (key === 'perf/step_time_ms') st.lastStepTime = v;
        const s = st.series.get(key);
        if (!s) continue;
        const old = s.byStep.get(step);
        if (old) {
          /* A record replayed by a reconnected stream: same step, same values. */
          old.y = v;
          s.dirty = true;
          continue;
        }
        const p = {x: 0, y: v, step, t: rec.time_unix_ms};
        p.x = xOf(p);
        const pts = s.points;
        if (!pts.length || pts[pts.length - 1].step < step) {
          pts.push(p);
        } else {
          let i = pts.length;
          while (i > 0 && pts[i - 1].step > step) i--;
          pts.splice(i, 0, p);
        }
        s.byStep.set(step, p);
        s.dirty = true;
      }
      scheduleFlush();
    }

    function setT0(ms) {
      if (st.t0 === ms) return;
      st.t0 = ms;
      if (st.xMode === 'time') {
        st.allDirty = true;
        scheduleFlush();
      }
    }

    function scheduleFlush() {
      if (st.flushTimer === null) st.flushTimer = setTimeout(flush, FLUSH_MS);
    }

    function flush() {
      st.flushTimer = null;
      if (!st.alive) return;
      const touched = new Set();
      for (const s of st.series.values()) {
        if (!s.dirty && !st.allDirty) continue;
        if (st.allDirty) for (const p of s.points) p.x = xOf(p);
        touched.add(s.chart);
        s.dirty = false;
      }
      st.allDirty = false;
      for (const name of touched) {
        const chart = st.charts[name];
        let empty = true;
        for (const d of chart.data.datasets) {
          const s = st.series.get(d.ztKey);
          if (s.points.length) empty = false;
          if (d.ztRole === 'smoothed') d.data = smooth(s.points, st.smoothing);
          else d.data = s.points;
        }
        const hasMfu = chart.options.scales.y1 && st.series.get('perf/mfu').points.length > 0;
        if (chart.options.scales.y1) {
          chart.options.scales.y1.display = hasMfu;
          setText(field('mfu-hint'), hasMfu ? '(MFU on the right axis)' : '');
        }
        chart.canvas.parentElement.classList.toggle('no-data', empty);
        const named = chart.data.datasets.filter((d) => d.ztLegend && d.data.length > 0);
        chart.options.plugins.legend.display = named.length > 1;
        chart.update('none');
      }
      renderLive();
      renderRanks();
    }

    /* The header follows the records as they arrive; the job itself is polled less often. */
    function lastValue(key) {
      const pts = st.series.get(key).points;
      return pts.length ? pts[pts.length - 1] : null;
    }

    function renderLive() {
      const job = st.job;
      if (!job || st.maxStep <= job.step) return;
      const loss = lastValue('train/loss');
      const tps = lastValue('perf/tokens_per_second');
      const live = Object.assign({}, job, {step: st.maxStep});
      setText(field('progress'), fmtProgress(live));
      field('progress-bar').value = job.max_steps > 0 ? Math.min(1, st.maxStep / job.max_steps) : 0;
      if (loss && loss.step === st.maxStep) setText(field('loss'), fmtFixed(loss.y, 4));
      if (tps && tps.step === st.maxStep) setText(field('tps'), fmtCompact(tps.y));
    }

    function redrawAll() {
      for (const s of st.series.values()) s.dirty = true;
      flush();
    }

    /* Charts with no data show "no data" from the start. */
    for (const chart of Object.values(st.charts)) chart.canvas.parentElement.classList.add('no-data');

    tid('x-step').addEventListener('change', () => setXMode('step'));
    tid('x-time').addEventListener('change', () => setXMode('time'));

    function setXMode(mode) {
      st.xMode = mode;
      for (const chart of Object.values(st.charts)) chart.options.scales.x.title.text = xTitle();
      st.allDirty = true;
      redrawAll();
    }

    tid('loss-log').addEventListener('change', (e) => {
      st.logLoss = e.target.checked;
      const chart = st.charts.loss;
      chart.options.scales.y.type = st.logLoss ? 'logarithmic' : 'linear';
      chart.update('none');
    });

    const smoothingOut = tid('smoothing-value');
    tid('smoothing').addEventListener('input', (e) => {
      st.smoothing = Number(e.target.value);
      smoothingOut.value = st.smoothing.toFixed(2);
      redrawAll();
    });

    /* -- job header, ranks, checkpoints, spec -- */

    function renderJob(job) {
      st.job = Object.assign({}, st.job || {}, job);
      job = st.job;
      document.title = `${job.name || job.id} · ztrain`;
      setText(field('name'), job.name || job.id);
      setText(field('id'), job.id);
      stateBadge(tid('job-state'), job.state);
      setText(tid('job-reason'), job.reason || '');
      setText(field('progress'), fmtProgress(job));
      field('progress-bar').value = job.max_steps > 0 ? Math.min(1, job.step / job.max_steps) : 0;
      setText(field('loss'), fmtFixed(job.loss, 4));
      setText(field('tps'), fmtCompact(job.tokens_per_second));
      renderLive();
      setText(field('elapsed'), fmtDuration(job.elapsed_ms));
      setText(field('eta'), TERMINAL.has(job.state) ? '—' : fmtDuration(job.eta_ms));
      setText(field('world'), `${job.world_size} × ${job.device || 'cpu'}`);
      if (job.started_unix_ms > 0) setT0(job.started_unix_ms);
      const terminal = TERMINAL.has(job.state);
      tid('cancel').hidden = terminal;
      if (terminal) tid('cancel-confirm-box').hidden = true;
      renderRanks();
      renderCheckpoints(job);
      if (job.spec && !st.specShown) {
        st.specShown = true;
        const spec = Object.assign({}, job.spec);
        const ds = spec.deepspeed;
        delete spec.deepspeed;
        tid('spec').textContent = JSON.stringify(spec, null, 2);
        tid('ds-config').textContent = ds === undefined ? '(none)' : JSON.stringify(ds, null, 2);
      }
    }

    function renderRanks() {
      const job = st.job;
      if (!job) return;
      const body = tid('ranks-body');
      const ranks = job.ranks && job.ranks.length ? job.ranks
        : Array.from({length: job.world_size || 0}, (_, r) => ({rank: r, pid: 0, running: false}));
      ranks.forEach((r, i) => {
        let tr = body.children[i];
        if (!tr) {
          tr = document.createElement('tr');
          tr.dataset.testid = 'rank-row';
          for (let c = 0; c < 8; c++) tr.append(document.createElement('td'));
          for (let c = 3; c < 8; c++) tr.children[c].className = 'num';
          body.append(tr);
        }
        tr.dataset.rank = r.rank;
        const mem = (k) => st.memory[`rank${r.rank}/${k}`];
        const rankStepTime = st.memory[`rank${r.rank}/step_time_ms`];
        const cells = [String(r.rank), fmtRankState(r), r.pid ? String(r.pid) : '—',
          fmtBytes(mem('params_bytes')), fmtBytes(mem('grads_bytes')), fmtBytes(mem('optimizer_bytes')),
          fmtBytes(mem('peak_rss_bytes')),
          isNum(rankStepTime) ? rankStepTime.toFixed(1) + ' ms'
            : isNum(st.lastStepTime) ? st.lastStepTime.toFixed(1) + ' ms' : '—'];
        cells.forEach((text, c) => setText(tr.children[c], text));
      });
      while (body.children.length > ranks.length) body.lastElementChild.remove();
    }

    function renderCheckpoints(job) {
      const body = tid('checkpoints-body');
      const list = job.checkpoints || [];
      setText(field('checkpoint-dir'), job.checkpoint_dir ? `in ${job.checkpoint_dir}` : '');
      const html = list.map((c) => {
        const latest = job.latest && c.tag === job.latest ? ' (latest)' : '';
        return `<tr data-testid="checkpoint-row"><td class="mono"></td><td class="num">${isNum(c.step) ? c.step : '—'}</td>` +
          `<td>${c.complete ? 'yes (DONE)' : 'no'}${latest}</td></tr>`;
      }).join('');
      if (body.dataset.html !== html || body.dataset.tags !== list.map((c) => c.tag).join('\n')) {
        body.innerHTML = html;
        list.forEach((c, i) => {
          body.children[i].children[0].textContent = c.tag;
        });
        body.dataset.html = html;
        body.dataset.tags = list.map((c) => c.tag).join('\n');
      }
      tid('checkpoints-empty').hidden = list.length > 0;
    }

    /* -- log -- */

    const logEl = tid('log');

    function addLogs(lines) {
      if (!lines.length) return;
      const atBottom = logEl.scrollHeight - logEl.scrollTop - logEl.clientHeight < 8;
      const frag = document.createDocumentFragment();
      for (const l of lines) {
        if (isNum(l.seq)) {
          if (l.seq <= st.logSeq) continue;
          st.logSeq = l.seq;
        }
        const span = document.createElement('span');
        span.className = l.stream || '';
        const who = l.rank >= 0 ? `rank ${l.rank}` : 'ztraind';
        span.textContent = `[${who}] ${l.text}\n`;
        frag.append(span);
      }
      logEl.append(frag);
      while (logEl.childElementCount > LOG_MAX_LINES) logEl.firstElementChild.remove();
      if (atBottom) logEl.scrollTop = logEl.scrollHeight;
    }

    /* -- cancel: a two-step confirmation inside the page -- */

    const cancelBtn = tid('cancel');
    const confirmBox = tid('cancel-confirm-box');
    const cancelStatus = tid('cancel-status');
    cancelBtn.addEventListener('click', () => {
      confirmBox.hidden = false;
      tid('cancel-abort').focus();
    });
    tid('cancel-abort').addEventListener('click', () => {
      confirmBox.hidden = true;
      cancelBtn.focus();
    });
    tid('cancel-confirm').addEventListener('click', async () => {
      const force = tid('cancel-force').checked;
      confirmBox.hidden = true;
      cancelBtn.disabled = true;
      setText(cancelStatus, force ? 'Killing the job…' : 'Asking the job to stop…');
      try {
        const job = await apiJson(jobPath(id, '/cancel'), {
          method: 'POST', signal,
          headers: {'Content-Type': 'application/json'},
          body: JSON.stringify({force}),
        });
        setText(cancelStatus, `Cancel requested: the job is ${job.state}.`);
        renderJob(job);
      } catch (e) {
        setText(cancelStatus, e instanceof AuthError ? 'Cancel needs the API token.' : `Cancel failed: ${e.message}`);
        reportError(e, 'Cancel failed');
      } finally {
        cancelBtn.disabled = false;
      }
    });

    /* -- loading and following -- */

    async function follow() {
      while (st.alive && !(st.job && TERMINAL.has(st.job.state) && st.streamEnded)) {
        let terminalSeen = false;
        try {
          const since = Math.max(0, st.maxStep);
          const res = await apiFetch(jobPath(id, `/events?since_step=${since}&logs=1`),
            {signal, headers: {Accept: 'text/event-stream'}});
          await readEvents(res, (ev) => {
            if (!st.alive) return;
            let data;
            try {
              data = JSON.parse(ev.data);
            } catch (e) {
              return;
            }
            if (ev.event === 'metrics') addRecord(data);
            else if (ev.event === 'log') addLogs([data]);
            else if (ev.event === 'job') {
              renderJob(data);
              if (TERMINAL.has(data.state)) terminalSeen = true;
            }
          });
          clearBanner('net');
        } catch (e) {
          if (e.name === 'AbortError' || e instanceof AuthError) return;
          reportError(e, 'Following the job failed');
        }
        if (terminalSeen) {
          st.streamEnded = true;
          return;
        }
        /* The stream ended early (daemon restart, proxy timeout): pick up from the last step;
         * records seen twice are merged by step. */
        await sleep(1000);
      }
    }

    async function pollJob() {
      if (!st.alive) return;
      if (!authBlocked) {
        try {
          renderJob(await apiJson(jobPath(id), {signal}));
        } catch (e) {
          reportError(e, 'Reading the job failed');
        }
      }
      if (st.alive && !(st.job && TERMINAL.has(st.job.state))) st.pollTimer = setTimeout(pollJob, JOB_POLL_MS);
    }

    (async () => {
      try {
        renderJob(await apiJson(jobPath(id), {signal}));
        const [recs, logs] = await Promise.all([
          apiJson(jobPath(id, '/records?since_step=0'), {signal}),
          apiJson(jobPath(id, `/logs?tail=${LOG_TAIL}`), {signal}),
        ]);
        for (const r of recs.records || []) addRecord(r);
        addLogs(logs.lines || []);
        flush();
        root.dataset.loaded = 'true';
        st.pollTimer = setTimeout(pollJob, JOB_POLL_MS);
        follow();
      } catch (e) {
        if (e instanceof ApiError && e.status === 404) {
          setText(tid('job-name'), id);
          showBanner('error', `No job ${id} on this ztraind.`);
        } else {
          reportError(e, 'Loading the job failed');
        }
      }
    })();

    return {
      destroy() {
        st.alive = false;
        clearTimeout(st.flushTimer);
        clearTimeout(st.pollTimer);
        ctrl.abort();
        for (const chart of Object.values(st.charts)) chart.destroy();
      },
    };
  }

  window.addEventListener('hashchange', () => {
    route();
    main.focus({preventScroll: true});
  });
  route();
  refreshHealth();
})();
