/* Anomaly events on the job page: a vertical marker on every chart at each event's step (or its
 * time, with the wall-time x axis), labelled with the event's kind, and the page's list of
 * events with their messages.
 *
 * The markers are drawn by one Chart.js plugin, registered once, that draws on any chart given
 * a $ztEvents array ([{step, t, kind}]); charts without one are left alone. Tests read the
 * markers from Chart.getChart(canvas).$ztEvents and the list's rows (data-testid="event-row"). */
import {$, setText} from './dom.js';

/* Red for what stops or skips, amber for what is only recorded. */
const COLORS = {record: 'rgba(154,103,0,0.85)', skip: 'rgba(207,34,46,0.85)',
  checkpoint_and_stop: 'rgba(130,20,30,0.95)'};

let registered = false;

function registerPlugin() {
  if (registered) return;
  registered = true;
  Chart.register({
    id: 'ztEventMarkers',
    afterDatasetsDraw(chart) {
      const events = chart.$ztEvents;
      const x = chart.scales.x;
      if (!events || !events.length || !x) return;
      const {top, bottom, left, right} = chart.chartArea;
      const ctx = chart.ctx;
      ctx.save();
      ctx.lineWidth = 1;
      ctx.setLineDash([4, 3]);
      ctx.font = '10px sans-serif';
      for (const ev of events) {
        const v = chart.$ztXMode === 'time' ? ev.x_time : ev.step;
        if (!Number.isFinite(v)) continue;
        const px = x.getPixelForValue(v);
        if (px < left || px > right) continue;
        ctx.strokeStyle = COLORS[ev.policy] || COLORS.record;
        ctx.fillStyle = ctx.strokeStyle;
        ctx.beginPath();
        ctx.moveTo(px, top);
        ctx.lineTo(px, bottom);
        ctx.stroke();
        ctx.fillText(ev.kind, Math.min(px + 3, right - 60), top + 10);
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
    this.body = $(root, '[data-testid="events-body"]');
  }

  /* One event as /anomalies and the SSE stream give it; one seen before (by seq) is skipped. */
  add(ev) {
    if (!ev || this.seen.has(ev.seq)) return;
    this.seen.add(ev.seq);
    this.events.push({seq: ev.seq, step: ev['train/global_step'], t: ev.time_unix_ms,
      kind: ev.kind, policy: ev.policy, message: ev.message || ''});
    this.events.sort((a, b) => a.seq - b.seq);
    this.renderList();
    this.redraw();
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
    setText($(this.root, '[data-field="events-count"]'),
      this.events.length ? `(${this.events.length})` : '');
  }

  /* Hands every chart the markers in its current x mode, and redraws. */
  redraw() {
    const t0 = this.charts.t0;
    const marks = this.events.map((ev) => Object.assign({}, ev, {
      x_time: t0 !== null && Number.isFinite(ev.t) ? (ev.t - t0) / 1000 : NaN,
    }));
    for (const chart of Object.values(this.charts.charts)) {
      chart.$ztEvents = marks;
      chart.$ztXMode = this.charts.xMode;
      chart.update('none');
    }
  }
}
