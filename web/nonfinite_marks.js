/* Where a charted value was not finite (a loss that went NaN, an infinite gradient norm): a line
 * cannot draw such a point, and leaving it out hid the very step a user looks for. Each one is
 * drawn as a small triangle at the plot's edge, in its line's colour, at its step (or time):
 * pointing up from the top for NaN and +inf, down from the bottom for -inf. The chart's text
 * alternative names those steps (chart_update.js).
 *
 * One Chart.js plugin, registered once, draws on any chart given $ztNonFinite ([{x, y, step,
 * key}], y NaN or ±Infinity); tests read the drawn marks from $ztNonFiniteDrawn ([{px, step,
 * key, edge}]). */

const SIZE = 5;

let registered = false;

export function registerNonFiniteMarks() {
  if (registered) return;
  registered = true;
  Chart.register({
    id: 'ztNonFiniteMarks',
    afterDatasetsDraw(chart) {
      const x = chart.scales.x;
      chart.$ztNonFiniteDrawn = [];
      if (!x || !chart.$ztNonFinite || !chart.$ztNonFinite.length) return;
      const {left, right, top, bottom} = chart.chartArea;
      const ctx = chart.ctx;
      ctx.save();
      for (const p of chart.$ztNonFinite) {
        const i = chart.data.datasets.findIndex((d) => d.ztKey === p.key && d.ztRole === 'raw');
        if (i < 0 || !chart.isDatasetVisible(i) || !Number.isFinite(p.x)) continue;
        const px = x.getPixelForValue(p.x);
        if (px < left || px > right) continue;
        const low = p.y === -Infinity;
        const edge = low ? bottom : top;
        const tip = low ? edge - SIZE * 1.6 : edge + SIZE * 1.6;
        ctx.fillStyle = chart.data.datasets[i].ztMarkColor || chart.data.datasets[i].borderColor;
        ctx.beginPath();
        ctx.moveTo(px - SIZE, tip);
        ctx.lineTo(px + SIZE, tip);
        ctx.lineTo(px, edge);
        ctx.closePath();
        ctx.fill();
        chart.$ztNonFiniteDrawn.push({px, step: p.step, key: p.key, edge: low ? 'bottom' : 'top'});
      }
      ctx.restore();
    },
  });
}

/* The words for a non-finite value: "NaN", "inf" or "-inf". */
export const nonFiniteName = (y) => (Number.isNaN(y) ? 'NaN' : y > 0 ? 'inf' : '-inf');
