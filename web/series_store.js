/* Bounded, decimated point series for the job page's charts and system panel.
 *
 * A job logging every step sends hundreds of records a second for hours; a chart cannot show
 * more points than it has pixels, and keeping them all made the page's memory and every redraw
 * grow with the job. A group of series shares one step stride: each series keeps, per bucket of
 * `stride` steps, its first point and its newest one, and when any series of the group holds
 * more than `cap` points the stride doubles and every series of the group is thinned the same
 * way. Series logged at the same steps therefore keep the same steps (the stacked breakdown's
 * bands stay aligned), a series never holds more than `cap` points, and the newest point is
 * always kept, so a chart follows the job's last step. The history the page loads comes already
 * thinned by the HTTP API (max_points), and live points join it here. */

/* Each point is {x, y, step, ...} as the caller made it; points are kept in step order. */
export class SeriesGroup {
  constructor(cap) {
    this.cap = cap;
    this.stride = 1;
    this.members = [];
  }

  series() {
    const s = new Series(this);
    this.members.push(s);
    return s;
  }

  bucket(step) {
    return Math.floor(step / this.stride);
  }

  /* Doubles the stride until the series that overflowed fits, thinning every member. */
  coarsen(over) {
    while (over.points.length > this.cap) {
      this.stride *= 2;
      for (const s of this.members) s.thin();
    }
  }
}

export class Series {
  constructor(group) {
    this.group = group;
    this.points = [];
    this.dirty = false;
  }

  /* Adds point p (p.step set) or, when the step is kept already, replaces that point with p (a
   * record replayed by a reconnected stream, or the step run again after a restart: its value
   * and its time are the newer record's). Returns the kept point, or null when p was older
   * than what is kept of its bucket and dropped. */
  add(p) {
    const pts = this.points;
    const g = this.group;
    const n = pts.length;
    if (!n || pts[n - 1].step < p.step) {
      /* The newest point replaces the previous newest when both fall in a bucket whose first
       * point is kept already. */
      if (n >= 2 && g.bucket(pts[n - 1].step) === g.bucket(p.step) &&
          g.bucket(pts[n - 2].step) === g.bucket(p.step)) {
        pts[n - 1] = p;
      } else {
        pts.push(p);
      }
      this.dirty = true;
      if (pts.length > g.cap) g.coarsen(this);
      return p;
    }
    let lo = 0;
    let hi = n;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (pts[mid].step < p.step) lo = mid + 1;
      else hi = mid;
    }
    if (lo < n && pts[lo].step === p.step) {
      pts[lo] = p;
      this.dirty = true;
      return p;
    }
    /* An older step: kept only where its bucket has no point yet. */
    const b = g.bucket(p.step);
    if ((lo > 0 && g.bucket(pts[lo - 1].step) === b) || (lo < n && g.bucket(pts[lo].step) === b)) {
      return null;
    }
    pts.splice(lo, 0, p);
    this.dirty = true;
    if (pts.length > g.cap) g.coarsen(this);
    return p;
  }

  /* Keeps the first point of each bucket under the group's stride, and the newest point. */
  thin() {
    const pts = this.points;
    if (pts.length < 2) return;
    const g = this.group;
    const out = [];
    let last = null;
    for (let i = 0; i < pts.length - 1; i++) {
      const b = g.bucket(pts[i].step);
      if (b !== last) out.push(pts[i]);
      last = b;
    }
    out.push(pts[pts.length - 1]);
    this.points = out;
    this.dirty = true;
  }

  last() {
    return this.points.length ? this.points[this.points.length - 1] : null;
  }
}
