/* The jobs page (#/ and #/?state=...&after=...): the jobs table, newest first, polled every
 * LIST_POLL_MS, with a state filter and paging. The filter and the page live in the URL's hash so
 * that the browser's back button and a reload keep them. Each row has a checkbox: the jobs
 * checked (kept across pages and filters) open side by side on the comparison page. */
import {TERMINAL, apiJson, reportError} from './api.js';
import {jobFromApi} from './resources.js';
import {clearBanner} from './banner.js';
import {MAX_COMPARE, compareHash} from './compare_page.js';
import {$, cloneTemplate, setText, stateBadge} from './dom.js';
import {fmtCompact, fmtDuration, fmtFixed, fmtProgress} from './format.js';
import {refreshHealth} from './health.js';
import {isAuthBlocked} from './token.js';

const LIST_POLL_MS = 1500;

/* The jobs checked for comparison, in the order they were checked; kept while the page is open. */
const selected = [];

function makeRow(id, onSelect) {
  const tr = document.createElement('tr');
  tr.dataset.testid = 'job-row';
  tr.dataset.jobId = id;
  tr.innerHTML =
    '<td data-label="Compare" class="select-cell"><input type="checkbox" data-testid="job-select"></td>' +
    '<td data-label="Job"><div><a data-testid="job-link"></a><span class="job-id"></span></div></td>' +
    '<td data-label="State"><div><span class="state" data-testid="state"></span>' +
    '<span class="reason" data-testid="reason"></span></div></td>' +
    '<td data-label="Progress" class="progress-cell"><div><span data-testid="progress"></span>' +
    '<progress max="1" value="0" aria-label="Progress"></progress></div></td>' +
    '<td data-label="Loss" class="num" data-testid="loss"></td>' +
    '<td data-label="Tokens/s" class="num" data-testid="tps"></td>' +
    '<td data-label="Elapsed" class="num" data-testid="elapsed"></td>' +
    '<td data-label="ETA" class="num" data-testid="eta"></td>';
  const a = $(tr, 'a');
  a.href = '#/jobs/' + encodeURIComponent(id);
  setText($(tr, '.job-id'), id);
  const box = $(tr, '[data-testid=job-select]');
  box.setAttribute('aria-label', `Compare ${id}`);
  box.checked = selected.includes(id);
  box.addEventListener('change', () => onSelect(id, box.checked));
  return tr;
}

function fillRow(tr, job) {
  tr.dataset.state = job.state;
  const a = $(tr, 'a');
  setText(a, job.name || job.id);
  a.setAttribute('aria-label', `${job.name || job.id} (${job.id}), ${job.state}`);
  stateBadge($(tr, '[data-testid=state]'), job.state);
  setText($(tr, '[data-testid=reason]'), job.reason || '');
  setText($(tr, '[data-testid=progress]'), fmtProgress(job));
  const bar = $(tr, 'progress');
  bar.value = job.max_steps > 0 ? Math.min(1, job.step / job.max_steps) : 0;
  setText($(tr, '[data-testid=loss]'), fmtFixed(job.loss, 4));
  setText($(tr, '[data-testid=tps]'), fmtCompact(job.tokens_per_second));
  setText($(tr, '[data-testid=elapsed]'), fmtDuration(job.elapsed_ms));
  setText($(tr, '[data-testid=eta]'), TERMINAL.has(job.state) ? '—' : fmtDuration(job.eta_ms));
}

/* Shows the jobs page in main; q is the hash's query ({state, after}). Returns the view, whose
 * destroy() stops its polling. */
export function jobsView(main, q) {
  const root = cloneTemplate('jobs-view');
  main.append(root);
  document.title = 'Jobs · ztrain';
  const filter = $(root, '[data-testid=state-filter]');
  const body = $(root, '[data-testid=jobs-body]');
  const empty = $(root, '[data-testid=jobs-empty]');
  const older = $(root, '[data-testid=page-older]');
  const newest = $(root, '[data-testid=page-newest]');
  const compare = $(root, '[data-testid=compare-selected]');
  const showSelection = () => {
    compare.disabled = selected.length < 2;
    setText(compare, selected.length ? `Compare selected (${selected.length})` : 'Compare selected');
  };
  /* Checking more jobs than the comparison has colours for is refused: the box stays clear. */
  const onSelect = (id, on) => {
    const i = selected.indexOf(id);
    if (on && i < 0 && selected.length < MAX_COMPARE) selected.push(id);
    else if (!on && i >= 0) selected.splice(i, 1);
    const box = rows.get(id) && $(rows.get(id), '[data-testid=job-select]');
    if (box) box.checked = selected.includes(id);
    showSelection();
  };
  compare.addEventListener('click', () => {
    location.hash = compareHash(selected);
  });
  showSelection();
  filter.value = q.state || '';
  filter.addEventListener('change', () => {
    location.hash = '#/' + (filter.value ? '?state=' + encodeURIComponent(filter.value) : '');
  });
  newest.hidden = !q.after;
  newest.addEventListener('click', () => {
    location.hash = '#/' + (q.state ? '?state=' + encodeURIComponent(q.state) : '');
  });
  let nextAfter = null;
  older.addEventListener('click', () => {
    const p = new URLSearchParams();
    if (q.state) p.set('state', q.state);
    p.set('after', nextAfter);
    location.hash = '#/?' + p;
  });

  const rows = new Map();
  const ctrl = new AbortController();
  let alive = true;
  let timer = null;

  function render(jobs) {
    const ids = jobs.map((j) => j.id);
    for (const [id, tr] of rows) {
      if (!ids.includes(id)) {
        tr.remove();
        rows.delete(id);
      }
    }
    jobs.forEach((job, i) => {
      let tr = rows.get(job.id);
      if (!tr) {
        tr = makeRow(job.id, onSelect);
        rows.set(job.id, tr);
      }
      fillRow(tr, job);
      /* Rows are moved only when out of place, so a focused link keeps its focus. */
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    });
    empty.hidden = jobs.length > 0;
  }

  async function poll() {
    if (!alive) return;
    if (!isAuthBlocked()) {
      try {
        const p = new URLSearchParams({page_size: '50'});
        if (q.state) p.set('state', q.state);
        if (q.after) p.set('page_token', q.after);
        const data = await apiJson('/api/v1/jobs?' + p, {signal: ctrl.signal});
        if (!alive) return;
        render((data.jobs || []).map(jobFromApi));
        nextAfter = data.nextPageToken || null;
        older.hidden = !nextAfter;
        clearBanner('net');
        clearBanner('error');
        refreshHealth();
      } catch (e) {
        reportError(e, 'Listing jobs failed');
      }
    }
    if (alive) timer = setTimeout(poll, LIST_POLL_MS);
  }

  poll();
  return {
    destroy() {
      alive = false;
      clearTimeout(timer);
      ctrl.abort();
    },
  };
}
