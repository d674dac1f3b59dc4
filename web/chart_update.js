/* What every chart of the dashboard does when its points change, besides drawing them: a flat
 * line gets a y axis around its value, and the canvas's text alternative says what the chart
 * shows. The job page's charts (charts.js), the system panel's and the comparison page's call
 * updateChart() where they would call chart.update().
 *
 * Chart.js 3 (Debian's) widens a flat line's axis by ±1, so a constant learning rate of 3e-4
 * was drawn on an axis from -1 to 1.5 and read as 0; Chart.js 4 widens it by 5% of the value,
 * which is done here. A canvas is a picture to a screen reader: its aria-label carried only the
 * chart's name, and a user who cannot see it had no value at all. */

/* Four significant figures, without trailing zeros: 0.001, 3.916, 213200, 1e-7. */
export const fmtValue = (v) => String(Number(v.toPrecision(4)));

/* Sets each y axis that draws one finite value only, other than 0, to that value ± 5%; other
 * axes are left to Chart.js. */
function fitFlatAxes(chart) {
  for (const [id, scale] of Object.entries(chart.options.scales)) {
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

/* The canvas's aria-label: the chart's name as index.html gives it, then each line drawn
 * (smoothed copies and hidden lines left out), or "no data". */
function describeChart(chart, fmt) {
  const canvas = chart.canvas;
  if (canvas.dataset.ztName === undefined) canvas.dataset.ztName = canvas.getAttribute('aria-label') || '';
  const lines = [];
  chart.data.datasets.forEach((d, i) => {
    if (d.ztRole === 'smoothed' || !chart.isDatasetVisible(i)) return;
    const line = describeLine(d.label, d.data, fmt);
    if (line) lines.push(line);
  });
  const text = `${canvas.dataset.ztName}: ${lines.length ? lines.join('; ') : 'no data'}`;
  if (canvas.getAttribute('aria-label') !== text) canvas.setAttribute('aria-label', text);
}

/* Draws chart's datasets as they are now (points {x, y, step}); fmt writes a value for the
 * text alternative (fmtValue unless the chart's unit needs another, as bytes do). */
export function updateChart(chart, fmt = fmtValue) {
  fitFlatAxes(chart);
  describeChart(chart, fmt);
  chart.update('none');
}
