/* How the dashboard writes numbers, durations, sizes and rank states. Every formatter takes a
 * value straight from the API and writes "—" for one that is missing or not finite, so the views
 * never have to check first. */

export const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

export function fmtFixed(v, digits) {
  return isNum(v) ? v.toFixed(digits) : '—';
}

/* Three significant figures with k/M/G suffixes, for throughputs that span many orders. */
export function fmtCompact(v) {
  if (!isNum(v)) return '—';
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(2) + 'G';
  if (a >= 1e6) return (v / 1e6).toFixed(2) + 'M';
  if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
  return a >= 100 ? v.toFixed(0) : v.toPrecision(3);
}

export function fmtDuration(ms) {
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

/* A clock reading (h:mm:ss or m:ss) for the wall-time axis, where ticks must line up. */
export function fmtClock(seconds) {
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, '0');
  return h ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
}

/* Binary units with one decimal; whole bytes below 1 KiB. */
export function fmtBytes(v) {
  if (!isNum(v)) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return (i ? v.toFixed(1) : String(v)) + ' ' + units[i];
}

export function fmtProgress(job) {
  if (!job) return '—';
  return job.max_steps > 0 ? `${job.step} / ${job.max_steps}` : `step ${job.step}`;
}

const SIGNALS = {1: 'SIGHUP', 2: 'SIGINT', 6: 'SIGABRT', 9: 'SIGKILL', 11: 'SIGSEGV', 15: 'SIGTERM'};

/* The supervisor records exit code and signal apart; a rank killed by a signal says which. */
export function fmtRankState(r) {
  if (r.running) return 'running';
  if (!r.pid) return 'not started';
  if (r.exit_unknown) return 'end unknown (ztraind was restarted while it ran)';
  if (r.signal) return `killed by signal ${r.signal}` + (SIGNALS[r.signal] ? ` (${SIGNALS[r.signal]})` : '');
  return `exited ${r.exit_code}`;
}
