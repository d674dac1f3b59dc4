/* The comparison page (#/compare?jobs=a,b,c&x=time&log=1&all=1): several jobs' curves overlaid on
 * the job page's charts, and their job specs and effective DeepSpeed configs side by side as a
 * key-by-key diff against the first job listed, the baseline. Everything the view shows is in
 * its URL (the jobs, the x axis, the loss scale, whether unchanged keys show), so a copied link
 * opens the same view.
 *
 * Each job's history is read once, thinned by the API (/metrics?max_points=, as many points as
 * a line keeps) as the job page reads it, and then followed by polling /records past its newest
 * step while the job runs (a comparison of many jobs would otherwise hold an event stream per
 * job). Reading every record made a comparison of a 100,000-step job download 120 MB and hold
 * every key of every record. */
import {TERMINAL, reportError} from './api.js';
import {getJob, thinnedHistory} from './resources.js';
import {clearBanner} from './banner.js';
import {CHARTS, MAX_POINTS, hideEmptyCharts, usesFp16} from './charts.js';
import {CompareCharts, JOB_COLORS} from './compare_charts.js';
import {$, cloneTemplate, setText, stateBadge} from './dom.js';
import {diffJson, leafText} from './json_diff.js';
import {isAuthBlocked} from './token.js';

/* At most one job per colour. */
export const MAX_COMPARE = JOB_COLORS.length;
const POLL_MS = 3000;

/* The job ids of the URL's jobs= (comma-separated), repeats dropped, at most MAX_COMPARE. */
export function parseJobIds(list) {
  const ids = [];
  for (const s of (list || '').split(',')) {
    const id = s.trim();
    if (id && !ids.includes(id)) ids.push(id);
  }
  return ids.slice(0, MAX_COMPARE);
}

/* The hash of a comparison view: the jobs, then the options that differ from the defaults. */
export function compareHash(ids, opts = {}) {
  const p = [`jobs=${ids.map(encodeURIComponent).join(',')}`];
  if (opts.x === 'time') p.push('x=time');
  if (opts.log) p.push('log=1');
  if (opts.all) p.push('all=1');
  return '#/compare?' + p.join('&');
}

/* The job spec without its DeepSpeed config, which has a table of its own. */
function specOnly(job) {
  if (!job || !job.spec) return null;
  const spec = Object.assign({}, job.spec);
  delete spec.deepspeed;
  return spec;
}

/* The effective config (what rank 0 wrote: "auto" resolved, defaults filled in), or the config
 * as written before the job has started. */
function dsConfig(job) {
  if (!job) return null;
  if (job.effective_config) return job.effective_config;
  return job.spec && job.spec.deepspeed !== undefined ? job.spec.deepspeed : null;
}

/* Fills a diff table: a key column and one column per job, each cell marked with its status
 * (data-status and a diff-<status> class); rows where nothing differs are hidden unless showAll.
 * Returns how many rows differ. */
function renderDiff(table, jobs, docs, showAll) {
  const rows = diffJson(docs);
  const head = document.createElement('tr');
  const th = (text) => {
    const el = document.createElement('th');
    el.scope = 'col';
    el.textContent = text;
    head.append(el);
    return el;
  };
  th('Key');
  jobs.forEach((j, i) => {
    const el = th(i === 0 ? `${j.name} (baseline)` : j.name);
    el.title = j.id;
    el.style.borderTop = `3px solid rgb(${JOB_COLORS[i]})`;
  });
  $(table, 'thead').replaceChildren(head);
  const body = $(table, 'tbody');
  body.replaceChildren();
  let differing = 0;
  for (const row of rows) {
    const tr = document.createElement('tr');
    tr.dataset.testid = 'diff-row';
    tr.dataset.path = row.path;
    tr.classList.toggle('differs', row.differs);
    tr.hidden = !showAll && !row.differs;
    if (row.differs) differing++;
    const key = document.createElement('th');
    key.scope = 'row';
    key.className = 'path';
    key.textContent = row.path || '(whole document)';
    tr.append(key);
    row.values.forEach((v, i) => {
      const td = document.createElement('td');
      const st = row.status[i];
      td.dataset.status = st;
      td.className = 'diff-' + st;
      td.textContent = v === undefined ? '(absent)' : leafText(v);
      if (st !== 'base' && st !== 'same') td.title = st;
      tr.append(td);
    });
    body.append(tr);
  }
  return {differing, total: rows.length};
}

/* Shows the comparison of q.jobs in main; q is the hash's query. Returns the view, whose
 * destroy() stops its polling and frees its charts. */
export function compareView(main, q) {
  const root = cloneTemplate('compare-view');
  main.append(root);
  document.title = 'Compare · ztrain';
  const tid = (name) => $(root, `[data-testid="${name}"]`);
  const ids = parseJobIds(q.jobs);
  const opts = {x: q.x === 'time' ? 'time' : 'step', log: q.log === '1', all: q.all === '1'};
  const ctrl = new AbortController();
  const signal = ctrl.signal;
  let alive = true;
  let timer = null;
  let charts = null;
  const jobs = ids.map((id) => ({id, name: id, job: null, maxStep: -1, missing: false}));

  tid('cmp-x-step').checked = opts.x === 'step';
  tid('cmp-x-time').checked = opts.x === 'time';
  tid('cmp-loss-log').checked = opts.log;
  tid('cmp-show-all').checked = opts.all;
  tid('compare-empty').hidden = ids.length >= 2;
  tid('compare-body').hidden = ids.length === 0;

  /* The URL follows the controls without a new history entry or a reload of the view. */
  function saveUrl() {
    history.replaceState(null, '', compareHash(ids, opts));
  }

  function renderJobs() {
    const list = tid('compare-jobs');
    list.replaceChildren();
    jobs.forEach((j, i) => {
      const li = document.createElement('li');
      li.dataset.testid = 'compare-job';
      li.dataset.jobId = j.id;
      li.innerHTML = '<span class="swatch" aria-hidden="true"></span><a></a>' +
        '<span class="job-id"></span> <span class="state"></span>';
      $(li, '.swatch').style.background = `rgb(${JOB_COLORS[i]})`;
      const a = $(li, 'a');
      a.href = '#/jobs/' + encodeURIComponent(j.id);
      setText(a, j.name);
      setText($(li, '.job-id'), j.id);
      if (j.job) stateBadge($(li, '.state'), j.job.state);
      else setText($(li, '.state'), j.missing ? 'not found' : '');
      list.append(li);
    });
  }

  function renderDiffs() {
    const present = jobs.filter((j) => j.job);
    const spec = renderDiff(tid('diff-spec'), present, present.map((j) => specOnly(j.job)), opts.all);
    const ds = renderDiff(tid('diff-ds'), present, present.map((j) => dsConfig(j.job)), opts.all);
    setText(tid('diff-spec-count'), `${spec.differing} of ${spec.total} keys differ`);
    setText(tid('diff-ds-count'), `${ds.differing} of ${ds.total} keys differ`);
    const written = present.filter((j) => !j.job.effective_config).map((j) => j.name);
    setText(tid('diff-ds-note'), written.length
      ? `As written, not yet resolved (the job has not started): ${written.join(', ')}.` : '');
  }

  /* The job's charted keys from step `since` on, thinned by the API. A poll goes on from the
   * newest step held, read again: a step's evaluation record may come after its training one. */
  async function loadHistory(j, since = 0) {
    const keys = [...new Set(Object.values(CHARTS).flatMap((c) => c.series.map((s) => s.key)))];
    for (const rec of await thinnedHistory(j.job, keys, MAX_POINTS, {signal}, since)) {
      charts.addRecord(j.id, rec);
      if (rec.step > j.maxStep) j.maxStep = rec.step;
    }
  }

  /* The loss-scale card is hidden, as the job page hides it, while no job compared trains in
   * fp16 or has a loss scale; called after each redraw of the charts. */
  function hideUnfillable() {
    hideEmptyCharts(root, {loss_scale: jobs.some((j) => j.job && usesFp16(j.job))});
  }

  function setJob(j, job) {
    const hadConfig = j.job && j.job.effective_config;
    j.job = job;
    j.name = job.name || j.id;
    if (job.started_unix_ms > 0) charts && charts.setT0(j.id, job.started_unix_ms);
    return !hadConfig && job.effective_config;
  }

  async function start() {
    const got = await Promise.allSettled(ids.map((id) => getJob(id, {signal})));
    if (!alive) return;
    got.forEach((r, i) => {
      if (r.status === 'fulfilled') setJob(jobs[i], r.value);
      else {
        jobs[i].missing = true;
        reportError(r.reason, 'Cannot compare');
      }
    });
    charts = new CompareCharts(root, jobs.map((j) => ({id: j.id, name: j.name})));
    for (const j of jobs) if (j.job && j.job.started_unix_ms > 0) charts.setT0(j.id, j.job.started_unix_ms);
    charts.xMode = opts.x;
    charts.logLoss = opts.log;
    if (charts.charts.loss) charts.charts.loss.options.scales.y.type = opts.log ? 'logarithmic' : 'linear';
    renderJobs();
    renderDiffs();
    try {
      await Promise.all(jobs.filter((j) => j.job).map((j) => loadHistory(j)));
    } catch (e) {
      reportError(e, 'Loading the records failed');
    }
    if (!alive) return;
    charts.setXMode(opts.x);
    hideUnfillable();
    root.dataset.loaded = 'true';
    timer = setTimeout(poll, POLL_MS);
  }

  /* Jobs that have not ended: their state, and the records past the newest step held. */
  async function poll() {
    if (!alive) return;
    const live = jobs.filter((j) => j.job && !TERMINAL.has(j.job.state));
    if (live.length && !isAuthBlocked()) {
      try {
        let configs = false;
        for (const j of live) {
          configs = setJob(j, await getJob(j.id, {signal}, j.job)) || configs;
          await loadHistory(j, Math.max(0, j.maxStep));
        }
        if (!alive) return;
        charts.redraw();
        hideUnfillable();
        renderJobs();
        if (configs) renderDiffs();
        clearBanner('error');
      } catch (e) {
        reportError(e, 'Refreshing the comparison failed');
      }
    }
    if (alive && live.length) timer = setTimeout(poll, POLL_MS);
  }

  tid('cmp-x-step').addEventListener('change', () => {
    opts.x = 'step';
    saveUrl();
    if (charts) charts.setXMode('step');
  });
  tid('cmp-x-time').addEventListener('change', () => {
    opts.x = 'time';
    saveUrl();
    if (charts) charts.setXMode('time');
  });
  tid('cmp-loss-log').addEventListener('change', (e) => {
    opts.log = e.target.checked;
    saveUrl();
    if (charts) charts.setLogLoss(opts.log);
  });
  tid('cmp-show-all').addEventListener('change', (e) => {
    opts.all = e.target.checked;
    saveUrl();
    for (const tr of root.querySelectorAll('[data-testid="diff-row"]')) {
      tr.hidden = !opts.all && !tr.classList.contains('differs');
    }
  });

  renderJobs();
  if (ids.length) start();
  return {
    destroy() {
      alive = false;
      clearTimeout(timer);
      ctrl.abort();
      if (charts) charts.destroy();
    },
  };
}
