/* What every chart of the dashboard does when its points change, besides drawing them: a flat
 * line gets a y axis around its value, the canvas's text alternative says what the chart shows,
 * and a chart with a legend gets it as buttons. The job page's charts (charts.js), the system
 * panel's and the comparison page's call updateChart() where they would call chart.update().
 *
 * Chart.js 3 (Debian's) widens a flat line's axis by ±1, so a constant learning rate of 3e-4
 * was drawn on an axis from -1 to 1.5 and read as 0; Chart.js 4 widens it by 5% of the value,
 * which is done here. A canvas is a picture to a screen reader: its aria-label carried only the
 * chart's name, and a user who cannot see it had no value at all. And a legend drawn on the
 * canvas hides and shows lines on a click, but cannot be reached with Tab. */

import {nonFiniteName} from './nonfinite_marks.js';

/* Four significant figures, without trailing zeros: 0.001, 3.916, 213200, 1e-7. */
export const fmtValue = (v) => String(Number(v.toPrecision(4)));

/* Sets each y axis that draws one finite value only, other than 0, to that value ± 5%; other
 * axes are left to Chart.js. The bounds go in the chart's own configuration (chart.config),
 * which chart.options resolves from. */
function fitFlatAxes(chart) {
  for (const [id, scale] of Object.entries(chart.config.options.scales)) {
    if (id === 'x') continue;
    let lo = Infinity;
    let hi = -Infinity;
    chart.data.datasets.forEach((d, i) => {
      if ((d.yAxisID || 'y') !== id || !chart.isDatasetVisible(i)) return;
      for (const p of d.data) {
        if (!Number.isFinite(p.y)) continue;
        if (p.y < lo) lo = p.y;
        if (p.y > hi) hi = p.y;
      }
    });
    if (lo === hi && lo !== 0) {
      const pad = Math.abs(lo) * 0.05;
      scale.suggestedMin = lo - pad;
      scale.suggestedMax = hi + pad;
    } else {
      delete scale.suggestedMin;
      delete scale.suggestedMax;
    }
  }
}

/* One line of the text alternative: its newest value, its first, and its range. */
function describeLine(label, pts, fmt) {
  let first = null;
  let last = null;
  let lo = Infinity;
  let hi = -Infinity;
  for (const p of pts) {
    if (!Number.isFinite(p.y)) continue;
    if (!first) first = p;
    last = p;
    lo = Math.min(lo, p.y);
    hi = Math.max(hi, p.y);
  }
  if (!last) return null;
  return `${label} ${fmt(last.y)} at step ${last.step}, from ${fmt(first.y)} at step ` +
    `${first.step} (lowest ${fmt(lo)}, highest ${fmt(hi)})`;
}

/* Where a line's values were not finite (nonfinite_marks.js): "train loss NaN at step 5", at
 * most the first three steps and how many more. */
function describeNonFinite(label, marks) {
  if (!marks.length) return null;
  const shown = marks.slice(0, 3).map((p) => `${nonFiniteName(p.y)} at step ${p.step}`);
  const more = marks.length > 3 ? ` and ${marks.length - 3} more steps` : '';
  return `${label} ${shown.join(', ')}${more}`;
}

/* The canvas's aria-label: the chart's name as index.html gives it, then each line drawn
 * (smoothed copies and hidden lines left out) and where it was not finite, or "no data". */
function describeChart(chart, fmt) {
  const canvas = chart.canvas;
  if (canvas.dataset.ztName === undefined) canvas.dataset.ztName = canvas.getAttribute('aria-label') || '';
  const lines = [];
  chart.data.datasets.forEach((d, i) => {
    if (d.ztRole === 'smoothed' || !chart.isDatasetVisible(i)) return;
    const line = describeLine(d.label, d.data, fmt);
    if (line) lines.push(line);
    if (d.ztRole !== 'raw') return;
    const marks = (chart.$ztNonFinite || []).filter((p) => p.key === d.ztKey);
    const bad = describeNonFinite(d.label, marks);
    if (bad) lines.push(bad);
  });
  const text = `${canvas.dataset.ztName}: ${lines.length ? lines.join('; ') : 'no data'}`;
  if (canvas.getAttribute('aria-label') !== text) canvas.setAttribute('aria-label', text);
}

/* The legend's entries: one per metric key (ztKey) with points, named by its dataset that
 * carries the legend (ztLegend, where a key has a raw and a smoothed line), in its colour. */
function legendEntries(chart) {
  const entries = new Map();
  chart.data.datasets.forEach((d) => {
    if (!d.data.length || d.ztLegend === false || entries.has(d.ztKey)) return;
    entries.set(d.ztKey, {key: d.ztKey, label: d.label, color: d.borderColor});
  });
  return [...entries.values()];
}

function setKeyVisible(chart, key, show) {
  chart.data.datasets.forEach((d, i) => {
    if (d.ztKey === key) chart.setDatasetVisibility(i, show);
  });
}

/* A chart whose owner sets chart.$ztLegend has its legend as buttons above the canvas, one per
 * key, pressed while the key's lines are shown; pressing one hides or shows them. The buttons
 * are made again only when the entries change, so focus stays on the one pressed. */
function syncLegend(chart, fmt) {
  const box = chart.canvas.parentElement;
  let bar = box.previousElementSibling;
  if (!bar || !bar.classList.contains('chart-legend')) {
    if (!chart.$ztLegend) return;
    bar = document.createElement('div');
    bar.className = 'chart-legend';
    bar.setAttribute('role', 'group');
    bar.setAttribute('aria-label', 'Lines shown');
    box.before(bar);
  }
  const entries = chart.$ztLegend ? legendEntries(chart) : [];
  const shape = JSON.stringify(entries);
  if (bar.dataset.shape !== shape) {
    bar.dataset.shape = shape;
    bar.replaceChildren(...entries.map((e) => {
      const b = document.createElement('button');
      b.type = 'button';
      b.className = 'legend-item';
      b.dataset.key = e.key;
      const swatch = document.createElement('span');
      swatch.className = 'swatch';
      swatch.style.background = e.color;
      b.append(swatch, e.label);
      b.addEventListener('click', () => {
        setKeyVisible(chart, e.key, b.getAttribute('aria-pressed') !== 'true');
        updateChart(chart, fmt);
      });
      return b;
    }));
  }
  bar.hidden = !entries.length;
  for (const b of bar.children) {
    const i = chart.data.datasets.findIndex((d) => d.ztKey === b.dataset.key);
    b.setAttribute('aria-pressed', String(i >= 0 && chart.isDatasetVisible(i)));
  }
}

/* Draws chart's datasets as they are now (points {x, y, step}); fmt writes a value for the
 * text alternative (fmtValue unless the chart's unit needs another, as bytes do). */
export function updateChart(chart, fmt = fmtValue) {
  fitFlatAxes(chart);
  describeChart(chart, fmt);
  syncLegend(chart, fmt);
  chart.update('none');
}
