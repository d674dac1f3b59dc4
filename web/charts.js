/* The job page's metric charts: Chart.js set up for them, the series they draw, TensorBoard-style
 * smoothing, the step or wall-time x axis, and the chart controls above them.
 *
 * Chart is the global of Debian's Chart.js build, which index.html loads with a classic script
 * ahead of the modules; tests reach the charts through Chart.getChart(canvas), and each dataset
 * carries ztKey (its metric key) and ztRole ("raw" or "smoothed") for them. */
import {updateChart} from './chart_update.js';
import {$, setText} from './dom.js';
import {fmtClock, isNum} from './format.js';
import {registerNonFiniteMarks} from './nonfinite_marks.js';
import {SeriesGroup} from './series_store.js';

/* The charts are redrawn at most once per DRAW_MS, in an animation frame, whatever the record
 * rate: records arriving in between (a replayed history, several ranks' steps, a job logging
 * every step) are drawn in one update. This also bounds how late a new point can appear. */
const DRAW_MS = 250;
/* Points kept per series (series_store.js): a chart is a few hundred pixels wide, and a job
 * logging every step for hours must not grow the page. The page asks the API for at most this
 * many points of history (max_points). */
export const MAX_POINTS = 1000;

/* Each chart draws one or more metric keys. A smoothed key gets two datasets, as in
 * TensorBoard: the raw points faded (role "raw") and their moving average (role "smoothed").
 * The comparison page (compare_charts.js) draws the same charts. */
export const CHARTS = {
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
  pipeline_bubble: {series: [{key: 'perf/pipeline_bubble', label: 'bubble fraction', color: '154,103,0', smooth: true}]},
};

/* Whether the job trains in fp16, the one precision with a loss scale: its resolved DeepSpeed
 * config when rank 0 has written it, else the config or training arguments it was given. */
export function usesFp16(job) {
  const on = (cfg) => !!(cfg && typeof cfg === 'object' && cfg.fp16 && cfg.fp16.enabled === true);
  if (job.effective_config) return on(job.effective_config);
  const spec = job.spec || {};
  return on(spec.deepspeed) || !!(spec.training_args && spec.training_args.fp16);
}

/* Hides the card of each chart of root named in `can` (chart name -> whether the jobs shown can
 * fill it) that they cannot fill and that has no data, instead of its saying "no data"; a chart
 * that has data after all stays. The job page calls it as the job refreshes, the comparison
 * page after each redraw of its charts. */
export function hideEmptyCharts(root, can) {
  for (const [name, fill] of Object.entries(can)) {
    const canvas = root.querySelector(`canvas[data-chart="${name}"]`);
    const card = canvas && canvas.closest('figure');
    if (card) card.hidden = !fill && canvas.parentElement.classList.contains('no-data');
  }
}

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

/* The tooltip shows the exact value, as the API has it, not a rounded one. */
const tooltipNumber = (v) => (isNum(v) ? String(v) : '—');

export class JobCharts {
  /* Takes over the canvases (data-chart=<name>) and chart controls inside root, the job view.
   * onFlush runs after every redraw, so the page's header can follow the newest records. */
  constructor(root, onFlush) {
    this.root = root;
    this.onFlush = onFlush;
    this.alive = true;
    /* Wall-time origin in Unix ms: the job's start, or its first record until that is known. */
    this.t0 = null;
    this.xMode = 'step';
    this.smoothing = Number($(root, '[data-testid="smoothing"]').value);
    this.logLoss = false;
    /* key -> {store: Series of points {x, y, step, t}, chart, def}; one stride for all keys */
    this.group = new SeriesGroup(MAX_POINTS);
    this.series = new Map();
    this.charts = {};
    this.flushTimer = null;
    this.flushFrame = null;
    this.lastDraw = -Infinity;
    this.allDirty = false;

    registerNonFiniteMarks();
    for (const [name, def] of Object.entries(CHARTS)) this.makeChart(name, def);
    /* Charts with no data show "no data" from the start, and say so to a screen reader. */
    for (const chart of Object.values(this.charts)) {
      chart.canvas.parentElement.classList.add('no-data');
      updateChart(chart);
    }
    this.bindControls();
  }

  xTitle() {
    return this.xMode === 'step' ? 'step' : 'wall time since start (m:ss)';
  }

  makeChart(name, def) {
    const canvas = $(this.root, `canvas[data-chart="${name}"]`);
    const datasets = [];
    for (const s of def.series) {
      /* nonFinite: step -> point of the values a line cannot draw (nonfinite_marks.js), kept
       * apart so that thinning never drops the step where the loss went NaN. */
      const entry = {store: this.group.series(), nonFinite: new Map(), chart: name, def: s};
      this.series.set(s.key, entry);
      const base = {
        ztKey: s.key, label: s.label, yAxisID: s.axis || 'y', data: [],
        borderColor: `rgba(${s.color},${s.smooth ? 0.28 : 1})`,
        backgroundColor: `rgba(${s.color},${s.smooth ? 0.28 : 1})`,
        borderWidth: s.smooth ? 1 : 1.6,
        pointRadius: s.points ? 2.5 : 0,
        ztMarkColor: `rgb(${s.color})`,
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
      x: {type: 'linear', title: {display: true, text: this.xTitle()},
        ticks: {maxTicksLimit: 8, callback: (v) => (this.xMode === 'step' ? v : fmtClock(v))}},
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
          /* The legend is chart_update.js's buttons (chart.$ztLegend). */
          legend: {display: false},
          tooltip: {
            filter: (item) => !(item.dataset.ztRole === 'smoothed' && this.smoothing === 0),
            callbacks: {
              title: (items) => {
                if (!items.length) return '';
                const p = items[0].raw;
                return this.xMode === 'step' ? `step ${p.step}` : `${fmtClock(p.x)} since start · step ${p.step}`;
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
    this.charts[name] = chart;
  }

  bindControls() {
    const tid = (name) => $(this.root, `[data-testid="${name}"]`);
    tid('x-step').addEventListener('change', () => this.setXMode('step'));
    tid('x-time').addEventListener('change', () => this.setXMode('time'));

    tid('loss-log').addEventListener('change', (e) => {
      this.logLoss = e.target.checked;
      const chart = this.charts.loss;
      chart.options.scales.y.type = this.logLoss ? 'logarithmic' : 'linear';
      updateChart(chart);
    });

    const smoothingOut = tid('smoothing-value');
    tid('smoothing').addEventListener('input', (e) => {
      this.smoothing = Number(e.target.value);
      smoothingOut.value = this.smoothing.toFixed(2);
      this.redrawAll();
    });
  }

  setXMode(mode) {
    this.xMode = mode;
    for (const chart of Object.values(this.charts)) chart.options.scales.x.title.text = this.xTitle();
    this.allDirty = true;
    this.redrawAll();
  }

  xOf(p) {
    return this.xMode === 'step' ? p.step : (p.t - this.t0) / 1000;
  }

  setT0(ms) {
    if (this.t0 === ms) return;
    this.t0 = ms;
    if (this.xMode === 'time') {
      this.allDirty = true;
      this.scheduleFlush();
    }
  }

  /* Adds one value of a charted key (other keys are ignored) at a step recorded at tMs (NaN
   * when not known: wall-time mode then places it between its neighbours' times). A value that
   * is not finite is marked at the plot's edge instead (the newest MAX_POINTS of them). The
   * charts are redrawn at the next flush, which the caller schedules. */
  addPoint(key, step, tMs, v) {
    const s = this.series.get(key);
    if (!s) return;
    const p = {x: 0, y: v, step, t: tMs};
    p.x = this.xOf(p);
    if (Number.isFinite(v)) {
      s.nonFinite.delete(step);
      s.store.add(p);
      return;
    }
    s.nonFinite.set(step, p);
    if (s.nonFinite.size > MAX_POINTS) s.nonFinite.delete(Math.min(...s.nonFinite.keys()));
    s.store.dirty = true;
  }

  /* The newest point of a key, or null. */
  lastPoint(key) {
    return this.series.get(key).store.last();
  }

  /* Points of a key held now (at most MAX_POINTS). */
  points(key) {
    return this.series.get(key).store.points;
  }

  /* Asks for a redraw in the first animation frame at least DRAW_MS after the last one. */
  scheduleFlush() {
    if (this.flushTimer !== null || this.flushFrame !== null) return;
    const wait = Math.max(0, this.lastDraw + DRAW_MS - performance.now());
    this.flushTimer = setTimeout(() => {
      this.flushTimer = null;
      this.flushFrame = requestAnimationFrame(() => this.flush());
    }, wait);
  }

  /* Redraws the charts whose series changed since the last flush, then calls onFlush. */
  flush() {
    clearTimeout(this.flushTimer);
    cancelAnimationFrame(this.flushFrame);
    this.flushTimer = null;
    this.flushFrame = null;
    if (!this.alive) return;
    this.lastDraw = performance.now();
    const touched = new Set();
    for (const s of this.series.values()) {
      if (!s.store.dirty && !this.allDirty) continue;
      if (this.allDirty) for (const p of s.store.points) p.x = this.xOf(p);
      touched.add(s.chart);
      s.store.dirty = false;
    }
    this.allDirty = false;
    for (const name of touched) {
      const chart = this.charts[name];
      let empty = true;
      for (const d of chart.data.datasets) {
        const pts = this.points(d.ztKey);
        if (pts.length) empty = false;
        /* A copy: Chart.js hooks the arrays it is given and would re-parse on every point
         * the series gains between two draws. */
        if (d.ztRole === 'smoothed') d.data = smooth(pts, this.smoothing);
        else d.data = pts.slice();
      }
      chart.$ztNonFinite = this.nonFinitePoints(chart);
      if (chart.$ztNonFinite.length) empty = false;
      const hasMfu = chart.options.scales.y1 && this.points('perf/mfu').length > 0;
      if (chart.options.scales.y1) {
        chart.options.scales.y1.display = hasMfu;
        setText($(this.root, '[data-field="mfu-hint"]'), hasMfu ? '(MFU on the right axis)' : '');
      }
      chart.canvas.parentElement.classList.toggle('no-data', empty);
      const named = chart.data.datasets.filter((d) => d.ztLegend && d.data.length > 0);
      chart.$ztLegend = named.length > 1;
      updateChart(chart);
    }
    this.onFlush();
  }

  /* The chart's non-finite values in step order, each {x, y, step, key}. */
  nonFinitePoints(chart) {
    const out = [];
    for (const d of chart.data.datasets) {
      if (d.ztRole !== 'raw') continue;
      for (const p of this.series.get(d.ztKey).nonFinite.values()) {
        out.push({x: this.xOf(p), y: p.y, step: p.step, key: d.ztKey});
      }
    }
    return out.sort((a, b) => a.step - b.step);
  }

  redrawAll() {
    for (const s of this.series.values()) s.store.dirty = true;
    this.flush();
  }

  destroy() {
    this.alive = false;
    clearTimeout(this.flushTimer);
    cancelAnimationFrame(this.flushFrame);
    for (const chart of Object.values(this.charts)) chart.destroy();
  }
}
