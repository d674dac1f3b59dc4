/* The comparison page's charts: the job page's charts (charts.js's CHARTS: which keys each chart
 * draws, on which axis) with one line per job and key, every job in its own colour, on a step or
 * wall-time x axis.
 *
 * Each dataset carries ztKey (its metric key), ztJob (its job id) and ztRole "raw", and its
 * points {x, y, step, t}, so that the browser test reads them through Chart.getChart(canvas).
 * Lines are raw values, as the API has them: smoothing would hide which run is which. Each job's
 * lines are bounded as the job page's are (series_store.js: MAX_POINTS points, one step stride
 * for the job), so a comparison of long jobs holds and redraws a few thousand points. */
import {updateChart} from './chart_update.js';
import {CHARTS, MAX_POINTS} from './charts.js';
import {SeriesGroup} from './series_store.js';
import {$, setText} from './dom.js';
import {fmtClock, isNum} from './format.js';

/* One colour per job, in the order the URL lists them (as "r,g,b" for rgba()). */
export const JOB_COLORS = ['31,111,235', '207,34,46', '26,127,55', '130,80,223', '227,98,9',
  '10,127,127', '191,57,137', '87,96,106'];

const tooltipNumber = (v) => (isNum(v) ? String(v) : '—');

export class CompareCharts {
  /* Takes over the canvases (data-chart=<name> of CHARTS) inside root; jobs is [{id, name}] in
   * colour order. */
  constructor(root, jobs) {
    this.root = root;
    this.jobs = jobs;
    this.xMode = 'step';
    this.logLoss = false;
    /* job id -> {t0: wall-time origin (Unix ms) or null, keys: Map key -> Series of points
     * {step, t, y}}, for the charted keys alone */
    this.data = new Map(jobs.map((j) => [j.id, {t0: null, keys: this.chartedSeries()}]));
    this.charts = {};
    for (const canvas of root.querySelectorAll('canvas[data-chart]')) {
      const def = CHARTS[canvas.dataset.chart];
      if (def) this.makeChart(canvas, def);
    }
  }

  /* A bounded series per charted key, sharing one step stride. */
  chartedSeries() {
    const group = new SeriesGroup(MAX_POINTS);
    const keys = Object.values(CHARTS).flatMap((c) => c.series.map((s) => s.key));
    return new Map(keys.map((k) => [k, group.series()]));
  }

  xTitle() {
    return this.xMode === 'step' ? 'step' : 'wall time since start (m:ss)';
  }

  makeChart(canvas, def) {
    const datasets = [];
    this.jobs.forEach((job, i) => {
      const color = JOB_COLORS[i % JOB_COLORS.length];
      def.series.forEach((s, k) => {
        datasets.push({
          ztKey: s.key, ztJob: job.id, ztRole: 'raw', label: `${job.name} · ${s.label}`,
          yAxisID: s.axis || 'y', data: [],
          borderColor: `rgb(${color})`, backgroundColor: `rgb(${color})`,
          borderWidth: 1.5, borderDash: k > 0 ? [5, 3] : [],
          pointRadius: s.points ? 2.5 : 0,
        });
      });
    });
    const scales = {
      x: {type: 'linear', title: {display: true, text: this.xTitle()},
        ticks: {maxTicksLimit: 8, callback: (v) => (this.xMode === 'step' ? v : fmtClock(v))}},
      y: {type: 'linear', ticks: {maxTicksLimit: 6}},
    };
    if (def.series.some((s) => s.axis === 'y1')) {
      scales.y1 = {type: 'linear', position: 'right', display: false, grid: {drawOnChartArea: false}};
    }
    const chart = new Chart(canvas, {
      type: 'line',
      data: {datasets},
      options: {
        animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
        normalized: true, spanGaps: true,
        interaction: {mode: 'nearest', axis: 'x', intersect: false},
        elements: {line: {tension: 0}, point: {hitRadius: 4, hoverRadius: 3}},
        scales,
        plugins: {
          decimation: {enabled: true, algorithm: 'min-max'},
          legend: {display: false},
          tooltip: {
            callbacks: {
              title: (items) => {
                if (!items.length) return '';
                const p = items[0].raw;
                return this.xMode === 'step' ? `step ${p.step}` : `${fmtClock(p.x)} since start`;
              },
              label: (item) => `${item.dataset.label}: ${tooltipNumber(item.raw.y)}` +
                (this.xMode === 'step' ? '' : ` (step ${item.raw.step})`),
            },
          },
        },
      },
    });
    canvas.dataset.keys = def.series.map((s) => s.key).join(',');
    this.charts[canvas.dataset.chart] = chart;
  }

  /* The wall-time origin of a job: its start (or its first record's time until that is known). */
  setT0(jobId, ms) {
    const d = this.data.get(jobId);
    if (d && isNum(ms) && d.t0 !== ms) d.t0 = ms;
  }

  /* Adds one record of a job ({step, time_unix_ms, values}), in step order; a step seen before
   * is replaced, as a replayed record would be. Call redraw() after a batch. */
  addRecord(jobId, rec) {
    const d = this.data.get(jobId);
    if (!d || !isNum(rec.step)) return;
    if (d.t0 === null && isNum(rec.time_unix_ms)) d.t0 = rec.time_unix_ms;
    for (const [key, series] of d.keys) {
      const v = (rec.values || {})[key];
      if (isNum(v)) series.add({step: rec.step, t: rec.time_unix_ms, y: v});
    }
  }

  xOf(d, p) {
    return this.xMode === 'step' ? p.step : (p.t - d.t0) / 1000;
  }

  setXMode(mode) {
    this.xMode = mode;
    for (const chart of Object.values(this.charts)) chart.options.scales.x.title.text = this.xTitle();
    this.redraw();
  }

  setLogLoss(on) {
    this.logLoss = on;
    if (this.charts.loss) this.charts.loss.options.scales.y.type = on ? 'logarithmic' : 'linear';
    this.redraw();
  }

  /* Rebuilds every dataset from the points held. */
  redraw() {
    for (const chart of Object.values(this.charts)) {
      let empty = true;
      for (const ds of chart.data.datasets) {
        const d = this.data.get(ds.ztJob);
        const pts = d.keys.get(ds.ztKey).points;
        ds.data = pts.map((p) => ({x: this.xOf(d, p), y: p.y, step: p.step, t: p.t}));
        if (pts.length) empty = false;
      }
      if (chart.options.scales.y1) {
        chart.options.scales.y1.display = chart.data.datasets.some((ds) => ds.yAxisID === 'y1' && ds.data.length);
      }
      chart.canvas.parentElement.classList.toggle('no-data', empty);
      updateChart(chart);
    }
    const y1 = this.charts.tflops && this.charts.tflops.options.scales.y1;
    const hint = $(this.root, '[data-field="mfu-hint"]');
    if (hint) setText(hint, y1 && y1.display ? '(MFU dashed, on the right axis)' : '');
  }

  destroy() {
    for (const chart of Object.values(this.charts)) chart.destroy();
  }
}
