/* The job page's system panel: each rank's CPU utilisation, resident memory and (on GPU jobs)
 * GPU utilisation and memory, the step broken into data wait, forward, backward, optimizer step
 * and communication, and a strip of every rank's compute time over the last logged steps with
 * the straggler outlined. It reads the per-rank keys of the metric records (perf/rank<r>/...,
 * system/rank<r>/...; the README's "System and efficiency metrics").
 *
 * Like the main charts, each dataset carries ztKey (its metric key; for the breakdown the phase's
 * name, e.g. "fwd_ms") and ztRole ("raw", or "mean" for the breakdown's mean over the ranks), so
 * tests reach the points through Chart.getChart(canvas). */
import {fmtValue, updateChart} from './chart_update.js';
import {$, setText} from './dom.js';
import {fmtBytes, isNum} from './format.js';
import {SeriesGroup} from './series_store.js';
import {MAX_POINTS} from './charts.js';

const RANK_KEY = /^(?:perf|system)\/rank(\d+)\/(.+)$/;
/* The step's parts, drawn stacked: together they are the step time. */
const PHASES = [
  ['data_ms', 'data wait', '154,103,0'],
  ['fwd_ms', 'forward', '31,111,235'],
  ['bwd_ms', 'backward', '130,80,223'],
  ['step_ms', 'optimizer step', '26,127,55'],
  ['comm_ms', 'communication', '207,34,46'],
];
/* Per-rank charts: one line per rank. */
const RANK_CHARTS = [
  {name: 'cpu', figure: 'cpu_util', title: 'CPU utilisation (1 = one core)', testid: 'chart-cpu-util'},
  {name: 'rss', figure: 'rss_bytes', title: 'Resident memory', testid: 'chart-rss', bytes: true},
  {name: 'gpu', figure: 'gpu_util', title: 'GPU utilisation', testid: 'chart-gpu-util', gpu: true},
  {name: 'gpu_mem', figure: 'gpu_memory_used_bytes', title: 'GPU memory in use', testid: 'chart-gpu-memory',
    bytes: true, gpu: true},
];
const RANK_COLORS = ['31,111,235', '227,98,9', '26,127,55', '130,80,223', '207,34,46', '10,127,127',
  '191,57,137', '154,103,0'];
/* Logged steps the strip shows, newest on the right. */
const STRIP_STEPS = 40;
/* Each line keeps at most MAX_POINTS points, at the same steps for every series (one stride for
 * the panel, series_store.js), so the stacked breakdown's bands stay aligned, which Chart.js's
 * decimation cannot keep; and the panel redraws at most once per REDRAW_MS: a job logging every
 * step sends hundreds of records a second, and redrawing every rank's whole history for each of
 * them froze the page. */
const REDRAW_MS = 1000;

const rankColor = (r) => RANK_COLORS[r % RANK_COLORS.length];

/* The per-rank keys whose history the panel draws, for nRanks ranks (the page loads them
 * thinned from the API; the strip needs only the newest records, which the event stream
 * replays). */
export function rankHistoryKeys(nRanks) {
  const keys = [];
  for (let r = 0; r < nRanks; r++) {
    for (const rc of RANK_CHARTS) keys.push(`system/rank${r}/${rc.figure}`);
    for (const [phase] of PHASES) keys.push(`perf/rank${r}/${phase}`);
  }
  return keys;
}

function el(tag, attrs = {}, children = []) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v);
  }
  e.append(...children);
  return e;
}

function chartCard(title, testid, wide) {
  const canvas = el('canvas', {'data-testid': testid, role: 'img', 'aria-label': title + ' chart'});
  const box = el('div', {class: 'chart-box no-data'}, [canvas]);
  const card = el('figure', {class: 'chart-card' + (wide ? ' wide' : '')},
    [el('figcaption', {text: title}), box]);
  return {card, canvas, box};
}

function lineChart(canvas, bytes, stacked) {
  const chart = new Chart(canvas, {
    type: 'line',
    data: {datasets: []},
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
      normalized: true, spanGaps: true,
      interaction: {mode: 'nearest', axis: 'x', intersect: false},
      elements: {line: {tension: 0}, point: {radius: 0, hitRadius: 4, hoverRadius: 3}},
      scales: {
        x: {type: 'linear', title: {display: true, text: 'step'}, ticks: {maxTicksLimit: 8}},
        y: {type: 'linear', stacked: !!stacked, beginAtZero: true,
          ticks: {maxTicksLimit: 6, callback: bytes ? (v) => fmtBytes(v) : undefined}},
      },
      plugins: {
        /* Thinning what is drawn (not the data) as the main charts do; the stacked breakdown
         * is drawn whole, as its bands must stay aligned point for point. */
        decimation: {enabled: !stacked, algorithm: 'min-max'},
        /* The legend is chart_update.js's buttons (chart.$ztLegend). */
        legend: {display: false},
        tooltip: {callbacks: {
          title: (items) => (items.length ? `step ${items[0].raw.step}` : ''),
          label: (item) => `${item.dataset.label}: ${bytes ? fmtBytes(item.raw.y) : String(item.raw.y)}`,
        }},
      },
    },
  });
  chart.$ztLegend = true;
  return chart;
}

export class SystemPanel {
  /* Builds the panel after the job view's charts (root is the view). */
  constructor(root) {
    this.alive = true;
    /* key -> Series of points {x, y, step} in step order: each rank chart's keys
     * ("system/rank0/cpu_util") and the breakdown's phases ("fwd_ms", the mean over the ranks) */
    this.group = new SeriesGroup(MAX_POINTS);
    this.series = new Map();
    /* step -> {ranks: Map(rank -> {figure: value}), straggler}: the strip's newest steps */
    this.recent = new Map();
    this.nRanks = 0;
    this.dirty = false;
    this.hasGpu = false;
    this.lastDraw = 0;
    this.timer = null;

    const section = el('section', {class: 'system-panel', 'data-testid': 'system-panel',
      'aria-labelledby': 'system-title'});
    section.append(el('h2', {id: 'system-title', text: 'System and step breakdown'}));
    this.note = el('p', {class: 'hint', 'data-testid': 'system-note'});
    section.append(this.note);
    const grid = el('div', {class: 'charts'});
    section.append(grid);

    const bd = chartCard('Step breakdown, mean over the ranks (ms)', 'chart-breakdown', true);
    grid.append(bd.card);
    this.breakdown = {chart: lineChart(bd.canvas, false, true), box: bd.box};
    /* Each phase fills down to the one below it, so the bands add up to the step time. */
    this.breakdown.chart.data.datasets = PHASES.map(([key, label, color], i) => ({
      ztKey: key, ztRole: 'mean', label, data: [], fill: i ? '-1' : 'origin', borderWidth: 1,
      borderColor: `rgb(${color})`, backgroundColor: `rgba(${color},0.35)`,
    }));

    /* The GPU charts join the grid only once a record has GPU figures. */
    this.grid = grid;
    this.rankCharts = RANK_CHARTS.map((def) => {
      const c = chartCard(def.title, def.testid, false);
      if (!def.gpu) grid.append(c.card);
      return Object.assign({}, def, {chart: lineChart(c.canvas, def.bytes, false), box: c.box, card: c.card});
    });

    this.strip = el('div', {class: 'rank-strip', 'data-testid': 'rank-strip'});
    section.append(el('figure', {class: 'chart-card wide strip-card'}, [
      el('figcaption', {text: 'Compute time by rank (step less communication; the slowest rank of each step outlined)'}),
      this.strip,
    ]));
    $(root, '[data-testid="charts"]').after(section);
    this.section = section;
  }

  /* Takes the per-rank figures of one record (the page's /records or event stream format): the
   * charts' points are kept as they come, so a redraw copies nothing, and the strip keeps the
   * newest STRIP_STEPS steps. A record of a thinned history (inStrip false) joins the lines
   * only: the strip shows consecutive logged steps. */
  addRecord(rec, inStrip = true) {
    const values = rec.values || {};
    const step = rec.step;
    if (!isNum(step)) return;
    let ranks = null;
    for (const key in values) {
      const m = RANK_KEY.exec(key);
      if (!m || !isNum(values[key])) continue;
      if (!ranks) ranks = new Map();
      const r = Number(m[1]);
      if (!ranks.has(r)) ranks.set(r, {});
      ranks.get(r)[m[2]] = values[key];
      if (m[2].startsWith('gpu_')) this.hasGpu = true;
      this.nRanks = Math.max(this.nRanks, r + 1);
    }
    if (!ranks) return;
    for (const rc of this.rankCharts) {
      for (const [r, f] of ranks) {
        if (isNum(f[rc.figure])) this.upsert(`system/rank${r}/${rc.figure}`, step, f[rc.figure]);
      }
    }
    for (const [phase] of PHASES) {
      const vals = [...ranks.values()].map((f) => f[phase]).filter(isNum);
      if (vals.length) this.upsert(phase, step, vals.reduce((a, b) => a + b, 0) / vals.length);
    }
    this.dirty = true;
    if (!inStrip) return;
    /* A replayed record (reconnected stream) replaces the step's figures. */
    this.recent.set(step, {ranks, straggler: values['perf/straggler_rank']});
    if (this.recent.size > STRIP_STEPS) {
      const keep = [...this.recent.keys()].sort((a, b) => a - b).slice(-STRIP_STEPS);
      for (const s of [...this.recent.keys()]) if (!keep.includes(s)) this.recent.delete(s);
    }
    this.dirty = true;
  }

  /* Adds or replaces the point of a series at a step (series_store.js keeps it bounded). */
  upsert(key, step, y) {
    let s = this.series.get(key);
    if (!s) {
      s = this.group.series();
      this.series.set(key, s);
    }
    s.add({x: step, y, step});
  }

  points(key) {
    const s = this.series.get(key);
    return s ? s.points : [];
  }

  /* Redraws what changed since the last call (the page calls it after its charts' flush). */
  flush() {
    if (!this.alive || !this.dirty || this.timer) return;
    const wait = this.lastDraw + REDRAW_MS - performance.now();
    if (wait > 0) {
      this.timer = setTimeout(() => {
        this.timer = null;
        this.flush();
      }, wait);
      return;
    }
    this.lastDraw = performance.now();
    this.dirty = false;
    for (const rc of this.rankCharts) {
      if (rc.gpu && !this.hasGpu) continue;
      if (!rc.card.isConnected) this.grid.append(rc.card);
      const sets = rc.chart.data.datasets;
      for (let r = sets.length; r < this.nRanks; r++) {
        sets.push({ztKey: `system/rank${r}/${rc.figure}`, ztRole: 'raw', label: `rank ${r}`, data: [],
          borderColor: `rgb(${rankColor(r)})`, backgroundColor: `rgb(${rankColor(r)})`, borderWidth: 1.6});
      }
      for (const d of sets) d.data = this.points(d.ztKey).slice();
      rc.box.classList.toggle('no-data', !sets.some((d) => d.data.length));
      updateChart(rc.chart, rc.bytes ? fmtBytes : fmtValue);
    }
    const bdSets = this.breakdown.chart.data.datasets;
    for (const d of bdSets) d.data = this.points(d.ztKey).slice();
    this.breakdown.box.classList.toggle('no-data', !bdSets.some((d) => d.data.length));
    updateChart(this.breakdown.chart);

    setText(this.note, !this.recent.size ? 'No per-rank figures in the records yet.'
      : this.hasGpu ? '' : 'No GPU figures: a CPU job, or NVML not present on the ranks\' host.');
    this.renderStrip([...this.recent.keys()].sort((a, b) => a - b), this.nRanks);
  }

  /* One row per rank, one cell per logged step, shaded by the rank's compute time over the
   * step's median rank. */
  renderStrip(steps, nRanks) {
    const rows = [];
    for (let r = 0; r < nRanks; r++) {
      const row = el('div', {class: 'strip-row', 'data-testid': 'strip-row', 'data-rank': String(r)},
        [el('span', {class: 'strip-label', text: `rank ${r}`})]);
      rows.push(row);
    }
    for (const s of steps) {
      const e = this.recent.get(s);
      const compute = [];
      for (let r = 0; r < nRanks; r++) compute.push((e.ranks.get(r) || {}).compute_ms);
      const known = compute.filter(isNum).sort((a, b) => a - b);
      const h = known.length >> 1;
      const median = known.length % 2 ? known[h] : (known[h - 1] + known[h]) / 2;
      for (let r = 0; r < nRanks; r++) {
        const ms = compute[r];
        const f = e.ranks.get(r) || {};
        const ratio = isNum(ms) && median > 0 ? ms / median : NaN;
        /* Equal ranks are pale; a rank twice the median or more is full red. */
        const heat = isNum(ratio) ? Math.max(0, Math.min(1, ratio - 1)) : 0;
        const cell = el('span', {
          class: 'strip-cell' + (e.straggler === r ? ' straggler' : ''),
          'data-step': String(s), 'data-ms': isNum(ms) ? String(ms) : '',
          title: `rank ${r} · step ${s} · compute ${isNum(ms) ? ms.toFixed(2) : '—'} ms` +
            (isNum(ratio) ? ` (${ratio.toFixed(2)}× the median)` : '') +
            ` · step ${isNum(f.step_time_ms) ? f.step_time_ms.toFixed(2) : '—'} ms`,
        });
        cell.style.backgroundColor = isNum(ms) ? `rgba(207,34,46,${0.12 + 0.88 * heat})` : 'transparent';
        rows[r].append(cell);
      }
    }
    this.strip.replaceChildren(...rows);
  }

  destroy() {
    this.alive = false;
    clearTimeout(this.timer);
    this.breakdown.chart.destroy();
    for (const rc of this.rankCharts) rc.chart.destroy();
  }
}
