/* The job page's recovery panel and lineage line: every attempt of the job's ranks (restarts
 * after failures, max_restarts) with why it ended, and for a fork the job and checkpoint step it
 * started from. Filled from the job JSON's "attempts" and its spec's "max_restarts" and
 * "fork_from"; the markup is the job-view template's (index.html). */
import {$, setText} from './dom.js';
import {fmtDuration} from './format.js';

/* "rank 1: signal 9", "rank 0: exit 1" or "—": how an attempt's first failed rank ended. */
function rankEnd(a) {
  if (a.rank < 0) return '—';
  if (a.signal) return `rank ${a.rank}: signal ${a.signal}`;
  return `rank ${a.rank}: exit ${a.exit_code}`;
}

function outcome(a) {
  if (!a.ended_unix_ms) return 'running';
  return a.failed ? 'failed' : 'ended';
}

/* Shows the attempts when the job may restart or did, and the lineage of a fork. Rebuilds the
 * table only when the attempts change; every text is set as text. */
export function renderRecovery(root, job) {
  const tid = (name) => $(root, `[data-testid="${name}"]`);
  const spec = job.spec || {};
  const attempts = job.attempts || [];
  const fork = spec.fork_from;
  const lineage = tid('lineage');
  lineage.hidden = !fork;
  if (fork) {
    const link = tid('lineage-link');
    link.href = `#/jobs/${encodeURIComponent(fork.job)}`;
    setText(link, fork.job);
    setText(tid('lineage-step'), String(fork.step));
  }
  const panel = tid('attempts-panel');
  const maxRestarts = spec.max_restarts || 0;
  panel.hidden = maxRestarts === 0 && attempts.length <= 1;
  if (panel.hidden) return;
  const used = Math.max(0, attempts.length - 1);
  setText(tid('attempts-summary'), `${used} of max_restarts ${maxRestarts} restart(s) used`);
  const body = tid('attempts-body');
  const key = JSON.stringify(attempts);
  if (body.dataset.key === key) return;
  body.dataset.key = key;
  body.replaceChildren(...attempts.map((a) => {
    const tr = document.createElement('tr');
    tr.dataset.testid = 'attempt-row';
    tr.dataset.failed = String(!!a.failed);
    const took = a.ended_unix_ms ? fmtDuration(a.ended_unix_ms - a.started_unix_ms) : '—';
    const cells = [[String(a.attempt), 'num'], [String(a.resumed_from_step || 0), 'num'],
      [String(a.step), 'num'], [outcome(a), ''], [rankEnd(a), ''], [took, 'num'],
      [a.reason || '', 'reason']];
    for (const [text, cls] of cells) {
      const td = document.createElement('td');
      td.className = cls;
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  }));
}
