/* Anomaly events on the job page: a dashed vertical marker at each event's step (or its time,
 * with the wall-time x axis) on the chart of the value it is about (a loss spike on the loss
 * chart, a gradient-norm spike on the gradient-norm chart, ...: KIND_CHARTS), and the page's
 * list of events with their messages. Markers closer than CLUSTER_PX pixels are drawn as one,
 * with the count above it; what a marker stands for (kinds, steps) shows when the pointer is on
 * it, never as text over the plot, so dense events stay readable.
 *
 * The markers are drawn by one Chart.js plugin, registered once, that draws on any chart given
 * a $ztEvents array ([{step, x_time, kind, policy}]); charts without one are left alone. Tests
 * read the markers from Chart.getChart(canvas).$ztEvents, the drawn clusters from $ztClusters,
 * the hovered one from $ztHover, and the list's rows (data-testid="event-row"). The list's
 * title counts the events it holds and, when ztraind has dropped older ones (it keeps a job's
 * newest 1,000), how many the job has had: "(1000 newest of 4443)". */
import {$, setText} from './dom.js';

/* Red for what stops or skips, amber for what is only recorded. */
const COLORS = {record: 'rgba(154,103,0,0.85)', skip: 'rgba(207,34,46,0.85)',
  checkpoint_and_stop: 'rgba(130,20,30,0.95)'};

/* The charts (charts.js CHARTS names) that show the value each kind of event is about. A stall
 * is the job making no progress, shown where its progress is: the loss. */
export const KIND_CHARTS = {
  nonfinite: ['loss', 'grad_norm'],
  loss_spike: ['loss'],
  grad_norm_spike: ['grad_norm'],
  loss_scale_collapse: ['loss_scale'],
  slow_rank: ['step_time'],
  stall: ['loss'],
};
const CLUSTER_PX = 6;
const HOVER_PX = 5;

/* Groups the chart's markers by pixel: each cluster {px, events, policy (the most severe)}. */
function clusters(chart) {
  const x = chart.scales.x;
  const {left, right} = chart.chartArea;
  const placed = [];
  for (const ev of chart.$ztEvents || []) {
    const v = chart.$ztXMode === 'time' ? ev.x_time : ev.step;
    if (!Number.isFinite(v)) continue;
    const px = x.getPixelForValue(v);
    if (px < left || px > right) continue;
    placed.push({px, ev});
  }
  placed.sort((a, b) => a.px - b.px);
  const out = [];
  for (const p of placed) {
    const last = out[out.length - 1];
    if (last && p.px - last.px1 <= CLUSTER_PX) {
      last.events.push(p.ev);
      last.px1 = p.px;
    } else {
      out.push({px0: p.px, px1: p.px, events: [p.ev]});
    }
  }
  const rank = {record: 0, skip: 1, checkpoint_and_stop: 2};
  for (const c of out) {
    c.px = (c.px0 + c.px1) / 2;
    c.policy = c.events.reduce((a, e) => ((rank[e.policy] || 0) > (rank[a] || 0) ? e.policy : a),
      'record');
  }
  return out;
}

function hoverText(c) {
  const kinds = {};
  for (const e of c.events) kinds[e.kind] = (kinds[e.kind] || 0) + 1;
  const what = Object.entries(kinds).map(([k, n]) => (n > 1 ? `${k} ×${n}` : k)).join(', ');
  const steps = c.events.map((e) => e.step);
  const at = steps.length === 1 ? `step ${steps[0]}`
    : `steps ${Math.min(...steps)}–${Math.max(...steps)}`;
  return `${what} (${at})`;
}

let registered = false;

function registerPlugin() {
  if (registered) return;
  registered = true;
  Chart.register({
    id: 'ztEventMarkers',
    afterEvent(chart, args) {
      if (!chart.$ztClusters) return;
      const e = args.event;
      let hover = null;
      if (e.type === 'mousemove' && e.y >= chart.chartArea.top && e.y <= chart.chartArea.bottom) {
        for (const c of chart.$ztClusters) {
          if (e.x >= c.px0 - HOVER_PX && e.x <= c.px1 + HOVER_PX) hover = c;
        }
      }
      if (hover !== (chart.$ztHover || null)) {
        chart.$ztHover = hover;
        args.changed = true;
      }
    },
    afterDatasetsDraw(chart) {
      const x = chart.scales.x;
      chart.$ztClusters = chart.$ztEvents && chart.$ztEvents.length && x ? clusters(chart) : [];
      if (!chart.$ztClusters.length) {
        chart.$ztHover = null;
        return;
      }
      const {top, bottom, right} = chart.chartArea;
      const ctx = chart.ctx;
      ctx.save();
      ctx.lineWidth = 1;
      ctx.font = '10px sans-serif';
      for (const c of chart.$ztClusters) {
        ctx.strokeStyle = COLORS[c.policy] || COLORS.record;
        ctx.fillStyle = ctx.strokeStyle;
        ctx.setLineDash([4, 3]);
        ctx.beginPath();
        ctx.moveTo(c.px, top);
        ctx.lineTo(c.px, bottom);
        ctx.stroke();
        /* A small flag at the top; a cluster says how many events it holds. */
        ctx.setLineDash([]);
        ctx.beginPath();
        ctx.moveTo(c.px - 3, top);
        ctx.lineTo(c.px + 3, top);
        ctx.lineTo(c.px, top + 5);
        ctx.fill();
        if (c.events.length > 1) ctx.fillText(String(c.events.length), c.px + 4, top + 8);
      }
      const h = chart.$ztHover;
      if (h && chart.$ztClusters.some((c) => c.px0 === h.px0)) {
        const text = hoverText(h);
        const w = ctx.measureText(text).width + 8;
        const bx = Math.min(h.px + 6, right - w);
        ctx.fillStyle = 'rgba(255,255,255,0.95)';
        ctx.strokeStyle = COLORS[h.policy] || COLORS.record;
        ctx.fillRect(bx, top + 10, w, 16);
        ctx.strokeRect(bx, top + 10, w, 16);
        ctx.fillStyle = '#24292f';
        ctx.fillText(text, bx + 4, top + 22);
      }
      ctx.restore();
    },
  });
}

export class EventMarkers {
  /* root is the job view; charts its JobCharts, whose charts get the markers. */
  constructor(root, charts) {
    registerPlugin();
    this.root = root;
    this.charts = charts;
    this.events = [];
    this.seen = new Set();
    this.drawPending = false; /* a draw of the list and the charts is asked for (add) */
    /* How many events the job has had (/anomalies' totalSize): ztraind keeps only the newest
     * 1,000, so the list may hold fewer than there were. */
    this.total = 0;
    this.body = $(root, '[data-testid="events-body"]');
  }

  /* One event as /anomalies and the SSE stream give it; one seen before (by seq) is skipped.
   * The list and the charts are drawn once per animation frame, not once per event: a job's
   * thousand events arrive one by one (its /anomalies page, then the stream's replay), and
   * drawing every table row and chart for each of them kept the page busy for tens of seconds. */
  add(ev) {
    if (!ev || this.seen.has(ev.seq)) return;
    this.seen.add(ev.seq);
    this.events.push({seq: ev.seq, step: ev.step, t: ev.time_unix_ms,
      kind: ev.kind, policy: ev.policy, message: ev.message || ''});
    if (this.drawPending) return;
    this.drawPending = true;
    requestAnimationFrame(() => {
      this.drawPending = false;
      this.events.sort((a, b) => a.seq - b.seq);
      this.renderList();
      this.redraw();
    });
  }

  /* The job's count of events, from /anomalies (totalSize); events that come later raise it
   * through their seq, which numbers a job's events from 1. */
  setTotal(total) {
    this.total = Number.isFinite(total) ? total : 0;
    this.renderList();
  }

  renderList() {
    this.body.replaceChildren(...this.events.map((ev) => {
      const tr = document.createElement('tr');
      tr.dataset.testid = 'event-row';
      tr.dataset.kind = ev.kind;
      tr.dataset.step = ev.step;
      for (const [text, cls] of [[String(ev.step), 'num'], [ev.kind, 'mono'], [ev.policy, ''],
        [ev.message, '']]) {
        const td = document.createElement('td');
        td.className = cls;
        td.textContent = text;
        tr.append(td);
      }
      return tr;
    }));
    $(this.root, '[data-testid="events-empty"]').hidden = this.events.length > 0;
    const n = this.events.length;
    const total = Math.max(this.total, n ? this.events[n - 1].seq : 0);
    setText($(this.root, '[data-field="events-count"]'),
      !n ? '' : total > n ? `(${n} newest of ${total})` : `(${n})`);
  }

  /* Hands each chart the markers of the events about its values, in its current x mode, and
   * redraws. An event of a kind not in KIND_CHARTS goes on the loss chart. */
  redraw() {
    const t0 = this.charts.t0;
    const marks = this.events.map((ev) => Object.assign({}, ev, {
      x_time: t0 !== null && Number.isFinite(ev.t) ? (ev.t - t0) / 1000 : NaN,
    }));
    for (const [name, chart] of Object.entries(this.charts.charts)) {
      chart.$ztEvents = marks.filter((ev) => (KIND_CHARTS[ev.kind] || ['loss']).includes(name));
      chart.$ztXMode = this.charts.xMode;
      chart.update('none');
    }
  }
}
