/* One job's page (#/jobs/<id>): its header and stats, charts, ranks, log, checkpoints, spec, and
 * the cancel button.
 *
 * The page loads the job's history once, thinned by the API (/metrics?max_points=, as many
 * points as a chart keeps), then follows the job's event stream from a few records before the
 * history's end; new records join the charts' bounded series (series_store.js), and the charts,
 * the log and the header are redrawn at most a few times a second in an animation frame, so a
 * job logging every step at hundreds of steps a second does not hold up the page. The job
 * itself is polled every JOB_POLL_MS until it ends. */
import {AuthError, ApiError, TERMINAL, apiFetch, apiJson, jobPath, readEvents, reportError} from './api.js';
import {anomalyFromApi, getJob, int, jobFromApi, logFromApi, recordFromApi, thinnedHistory} from './resources.js';
import {clearBanner, showBanner} from './banner.js';
import {CHARTS, JobCharts, MAX_POINTS, hideEmptyCharts, usesFp16} from './charts.js';
import {renderRecovery} from './job_recovery.js';
import {SystemPanel, rankHistoryKeys} from './system_panel.js';
import {EventMarkers} from './event_markers.js';
import {$, cloneTemplate, setText, stateBadge} from './dom.js';
import {fmtBytes, fmtCompact, fmtDuration, fmtFixed, fmtProgress, fmtRankState, isNum} from './format.js';
import {isAuthBlocked} from './token.js';

const JOB_POLL_MS = 2000;
const LOG_TAIL = 200;
/* The log keeps only this many lines, so that a chatty job does not slow the page down. */
const LOG_MAX_LINES = 2000;
/* The log is appended to at most once per LOG_DRAW_MS, in an animation frame: each append lays
 * the log out again to keep it scrolled to the end. */
const LOG_DRAW_MS = 250;
/* The event stream starts this many logged steps before the thinned history ends, so that the
 * newest records (the rank strip, memory, the header) arrive whole. */
const TAIL_RECORDS = 40;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* Shows job id's page in main. Returns the view, whose destroy() stops its polling, closes its
 * event stream and frees its charts. */
export function jobView(main, id) {
  const root = cloneTemplate('job-view');
  main.append(root);
  document.title = `${id} · ztrain`;
  const field = (name) => $(root, `[data-field="${name}"]`);
  const tid = (name) => $(root, `[data-testid="${name}"]`);
  const ctrl = new AbortController();
  const signal = ctrl.signal;

  const st = {
    job: null,
    alive: true,
    maxStep: -1,
    logSeq: 0,
    memory: {},        /* "rank0/params_bytes" -> value, from the newest record that has it */
    lastStepTime: null,
    pollTimer: null,
    specShown: false,
    streamEnded: false,
    followFrom: 0,     /* the streams' since_step: a filter, the same for every reconnection */
    lastEventId: '',   /* the stream's cursor (its last record, anomaly event and log line): a
                        * reconnection goes on after it, so no record or line comes twice or
                        * is lost */
    pendingLogs: [],   /* log lines waiting for the next draw */
    logTimer: null,
    logFrame: null,
    lastLogDraw: -Infinity,
  };

  const system = new SystemPanel(root);
  const charts = new JobCharts(root, () => {
    renderLive();
    renderRanks();
    system.flush();
  });
  const markers = new EventMarkers(root, charts);
  root.querySelectorAll('[data-testid="x-step"], [data-testid="x-time"]').forEach(
    (el) => el.addEventListener('change', () => markers.redraw()));

  /* -- records -- */

  /* A record of the event stream, or of the thinned history (inStrip false: see SystemPanel). */
  function addRecord(rec, inStrip = true) {
    const values = rec.values || {};
    const step = rec.step;
    if (!isNum(step)) return;
    if (step > st.maxStep) st.maxStep = step;
    if (charts.t0 === null && isNum(rec.time_unix_ms)) charts.setT0(rec.time_unix_ms);
    system.addRecord(rec, inStrip);
    for (const key in values) {
      const v = values[key];
      /* A NaN or infinite value goes to its chart only, which marks it at the plot's edge. */
      if (typeof v !== 'number') continue;
      if (!isNum(v)) {
        charts.addPoint(key, step, rec.time_unix_ms, v);
        continue;
      }
      const m = /^memory\/(rank\d+\/.+)$/.exec(key);
      if (m) {
        st.memory[m[1]] = v;
        continue;
      }
      if (key === 'perf/step_time_ms') st.lastStepTime = v;
      charts.addPoint(key, step, rec.time_unix_ms, v);
    }
    /* Even a record with memory alone is flushed: the rank table follows it. */
    charts.scheduleFlush();
  }

  /* The header follows the records as they arrive; the job itself is polled less often. */
  function renderLive() {
    const job = st.job;
    if (!job || st.maxStep <= job.step) return;
    const loss = charts.lastPoint('train/loss');
    const tps = charts.lastPoint('perf/tokens_per_second');
    const live = Object.assign({}, job, {step: st.maxStep});
    setText(field('progress'), fmtProgress(live));
    field('progress-bar').value = job.max_steps > 0 ? Math.min(1, st.maxStep / job.max_steps) : 0;
    if (loss && loss.step === st.maxStep) setText(field('loss'), fmtFixed(loss.y, 4));
    if (tps && tps.step === st.maxStep) setText(field('tps'), fmtCompact(tps.y));
  }

  /* -- job header, ranks, checkpoints, spec -- */

  /* job may be partial (a "job" event); it is merged into what the page already knows. */
  function renderJob(job) {
    st.job = Object.assign({}, st.job || {}, job);
    job = st.job;
    document.title = `${job.name || job.id} · ztrain`;
    setText(field('name'), job.name || job.id);
    setText(field('id'), job.id);
    stateBadge(tid('job-state'), job.state);
    setText(tid('job-reason'), job.reason || '');
    setText(field('progress'), fmtProgress(job));
    field('progress-bar').value = job.max_steps > 0 ? Math.min(1, job.step / job.max_steps) : 0;
    setText(field('loss'), fmtFixed(job.loss, 4));
    setText(field('tps'), fmtCompact(job.tokens_per_second));
    renderLive();
    setText(field('elapsed'), fmtDuration(job.elapsed_ms));
    setText(field('eta'), TERMINAL.has(job.state) ? '—' : fmtDuration(job.eta_ms));
    // The transport only matters, and is only shown, when several ranks talk.
    const comm = job.world_size > 1 && job.comm ? ` over ${job.comm}` : '';
    /* The grid where there is more than data parallelism: "8 × cpu (dp 2 × pp 2 × tp 2)". */
    const g = job.grid;
    const grid = g && (g.pp > 1 || g.tp > 1) ? ` (dp ${g.dp} × pp ${g.pp} × tp ${g.tp})` : '';
    setText(field('world'), `${job.world_size} × ${job.device || 'cpu'}${comm}${grid}`);
    if (job.spec) setText(field('data-format'), dataFormat(job.spec.data));
    if (job.started_unix_ms > 0) charts.setT0(job.started_unix_ms);
    const terminal = TERMINAL.has(job.state);
    tid('cancel').hidden = terminal;
    if (terminal) tid('cancel-confirm-box').hidden = true;
    renderRanks();
    renderCheckpoints(job);
    renderRecovery(root, job);
    if (job.spec) hideUnfillable(job);
    if (job.spec && !st.specShown) {
      st.specShown = true;
      const spec = Object.assign({}, job.spec);
      const ds = spec.deepspeed;
      delete spec.deepspeed;
      tid('spec').textContent = JSON.stringify(spec, null, 2);
      tid('ds-config').textContent = ds === undefined ? '(none)' : JSON.stringify(ds, null, 2);
    }
  }

  /* What the job trains on, as its spec says (docs/fine-tuning.md): every token, or the tokens
   * its loss mask marks, with documents packed into windows or one per padded row. */
  function dataFormat(data) {
    const d = data || {};
    if ((d.format || 'tokens') === 'tokens') return 'tokens: every token trained';
    const layout = d.packing === 'padded' ? 'padded, one document per row' : 'packed documents';
    return `${d.format}: loss on the trained tokens · ${layout}`;
  }

  /* Panels the job cannot fill are hidden instead of saying "no data" (issue 34): the loss
   * scale of a job not in fp16, the pipeline bubble of a job without stages. */
  function hideUnfillable(job) {
    const stages = job.spec && job.spec.pipeline ? job.spec.pipeline.stages || 1 : 1;
    hideEmptyCharts(root, {loss_scale: usesFp16(job), pipeline_bubble: stages > 1});
  }

  /* A rank of a pipelined or tensor-parallel job carries its coordinates in the job's grid
   * (job.grid): rank = ((stage · dp) + replica) · tp + tp_rank. */
  function rankLabel(job, rank) {
    const g = job.grid || {dp: job.world_size || 1, pp: 1, tp: 1};
    if ((g.pp || 1) <= 1 && (g.tp || 1) <= 1) return String(rank);
    const tp = g.tp || 1, dp = g.dp || 1;
    const parts = [String(rank)];
    if (g.pp > 1) parts.push(`stage ${Math.floor(rank / (tp * dp))}`);
    if (dp > 1) parts.push(`dp ${Math.floor(rank / tp) % dp}`);
    if (tp > 1) parts.push(`tp ${rank % tp}`);
    return parts.join(' · ');
  }

  /* Process state from the job, memory and step time from the newest records. */
  function renderRanks() {
    const job = st.job;
    if (!job) return;
    const body = tid('ranks-body');
    const ranks = job.ranks && job.ranks.length ? job.ranks
      : Array.from({length: job.world_size || 0}, (_, r) => ({rank: r, pid: 0, running: false}));
    ranks.forEach((r, i) => {
      let tr = body.children[i];
      if (!tr) {
        tr = document.createElement('tr');
        tr.dataset.testid = 'rank-row';
        for (let c = 0; c < 9; c++) tr.append(document.createElement('td'));
        for (let c = 3; c < 9; c++) tr.children[c].className = 'num';
        body.append(tr);
      }
      tr.dataset.rank = r.rank;
      const mem = (k) => st.memory[`rank${r.rank}/${k}`];
      /* The rank's own step time where the job reports one (its per-rank figures), else the
       * job's. */
      const stepTime = isNum(r.step_time_ms) ? r.step_time_ms : st.lastStepTime;
      const cells = [rankLabel(job, r.rank), fmtRankState(r), r.pid ? String(r.pid) : '—',
        fmtBytes(mem('params_bytes')), fmtBytes(mem('grads_bytes')), fmtBytes(mem('optimizer_bytes')),
        fmtBytes(mem('peak_rss_bytes')),
        /* The CUDA backend's own device peak; '—' for a CPU job, which has none. */
        fmtBytes(mem('device_peak_bytes')),
        isNum(stepTime) ? stepTime.toFixed(1) + ' ms' : '—'];
      cells.forEach((text, c) => setText(tr.children[c], text));
    });
    while (body.children.length > ranks.length) body.lastElementChild.remove();
  }

  /* The table is rebuilt only when the checkpoints or latest change; tags are set as text. */
  function renderCheckpoints(job) {
    const body = tid('checkpoints-body');
    const list = job.checkpoints || [];
    setText(field('checkpoint-dir'), job.checkpoint_dir ? `in ${job.checkpoint_dir}` : '');
    const key = JSON.stringify([job.latest, list]);
    if (body.dataset.key !== key) {
      body.dataset.key = key;
      body.replaceChildren(...list.map((c) => {
        const tr = document.createElement('tr');
        tr.dataset.testid = 'checkpoint-row';
        const latest = job.latest && c.tag === job.latest ? ' (latest)' : '';
        const cells = [[c.tag, 'mono'], [isNum(c.step) ? String(c.step) : '—', 'num'],
          [(c.complete ? 'yes (DONE)' : 'no') + latest, '']];
        for (const [text, cls] of cells) {
          const td = document.createElement('td');
          td.className = cls;
          td.textContent = text;
          tr.append(td);
        }
        return tr;
      }));
    }
    tid('checkpoints-empty').hidden = list.length > 0;
  }

  /* -- log -- */

  const logEl = tid('log');

  /* Queues lines not seen yet (by seq) for the next draw: a job printing a line per step gets
   * a few DOM updates a second, and only the lines that stay shown are made. */
  function addLogs(lines) {
    for (const l of lines) {
      if (isNum(l.seq)) {
        if (l.seq <= st.logSeq) continue;
        st.logSeq = l.seq;
      }
      st.pendingLogs.push(l);
    }
    if (st.pendingLogs.length > LOG_MAX_LINES) st.pendingLogs.splice(0, st.pendingLogs.length - LOG_MAX_LINES);
    if (!st.pendingLogs.length || st.logTimer !== null || st.logFrame !== null) return;
    st.logTimer = setTimeout(() => {
      st.logTimer = null;
      st.logFrame = requestAnimationFrame(drawLogs);
    }, Math.max(0, st.lastLogDraw + LOG_DRAW_MS - performance.now()));
  }

  /* Appends the queued lines, and keeps the log scrolled to the end if it was there. */
  function drawLogs() {
    clearTimeout(st.logTimer);
    cancelAnimationFrame(st.logFrame);
    st.logTimer = null;
    st.logFrame = null;
    st.lastLogDraw = performance.now();
    const lines = st.pendingLogs;
    st.pendingLogs = [];
    if (!st.alive || !lines.length) return;
    const atBottom = logEl.scrollHeight - logEl.scrollTop - logEl.clientHeight < 8;
    const frag = document.createDocumentFragment();
    for (const l of lines) {
      const span = document.createElement('span');
      span.className = l.stream || '';
      const who = l.rank >= 0 ? `rank ${l.rank}` : 'ztraind';
      span.textContent = `[${who}] ${l.text}\n`;
      frag.append(span);
    }
    logEl.append(frag);
    while (logEl.childElementCount > LOG_MAX_LINES) logEl.firstElementChild.remove();
    if (atBottom) logEl.scrollTop = logEl.scrollHeight;
  }

  /* -- cancel: a two-step confirmation inside the page -- */

  const cancelBtn = tid('cancel');
  const confirmBox = tid('cancel-confirm-box');
  const cancelStatus = tid('cancel-status');
  cancelBtn.addEventListener('click', () => {
    confirmBox.hidden = false;
    tid('cancel-abort').focus();
  });
  tid('cancel-abort').addEventListener('click', () => {
    confirmBox.hidden = true;
    cancelBtn.focus();
  });
  tid('cancel-confirm').addEventListener('click', async () => {
    const force = tid('cancel-force').checked;
    confirmBox.hidden = true;
    cancelBtn.disabled = true;
    setText(cancelStatus, force ? 'Killing the job…' : 'Asking the job to stop…');
    try {
      const job = jobFromApi(await apiJson(jobPath(id, '/cancel'), {
        method: 'POST', signal,
        headers: {'Content-Type': 'application/json'},
        body: JSON.stringify({force}),
      }));
      setText(cancelStatus, `Cancel requested: the job is ${job.state}.`);
      renderJob(job);
    } catch (e) {
      setText(cancelStatus, e instanceof AuthError ? 'Cancel needs the API token.' : `Cancel failed: ${e.message}`);
      reportError(e, 'Cancel failed');
    } finally {
      cancelBtn.disabled = false;
    }
  });

  /* -- loading and following -- */

  async function follow() {
    while (st.alive && !(st.job && TERMINAL.has(st.job.state) && st.streamEnded)) {
      /* The stream is over once it has given an ended job's state after its other events: a
       * stream opens with the job's state, which for an ended job is its end state too, and
       * ends with it again after the history it replays, so a stream cut after its opening
       * event has not finished. */
      let terminalSeen = false, events = 0;
      try {
        const headers = {Accept: 'text/event-stream'};
        if (st.lastEventId) headers['Last-Event-ID'] = st.lastEventId;
        const res = await apiFetch(jobPath(id, `/events?since_step=${st.followFrom}&logs=1`),
          {signal, headers});
        await readEvents(res, (ev) => {
          if (!st.alive) return;
          if (ev.lastEventId) st.lastEventId = ev.lastEventId;
          events++;
          let data;
          try {
            data = JSON.parse(ev.data);
          } catch (e) {
            return;
          }
          if (ev.event === 'metrics') addRecord(recordFromApi(data));
          else if (ev.event === 'log') addLogs([logFromApi(data)]);
          else if (ev.event === 'anomaly') markers.add(anomalyFromApi(data));
          else if (ev.event === 'job') {
            const job = jobFromApi(data);
            renderJob(job);
            if (TERMINAL.has(job.state) && events > 1) terminalSeen = true;
          }
        });
        clearBanner('net');
      } catch (e) {
        if (e.name === 'AbortError' || e instanceof AuthError) return;
        reportError(e, 'Following the job failed');
      }
      if (terminalSeen) {
        st.streamEnded = true;
        return;
      }
      /* The stream ended early (daemon restart, proxy timeout): go on after the last record,
       * anomaly event and log line it gave (Last-Event-ID, as EventSource would send it). */
      await sleep(1000);
    }
  }

  async function pollJob() {
    if (!st.alive) return;
    if (!isAuthBlocked()) {
      try {
        renderJob(await getJob(id, {signal}, st.job));
      } catch (e) {
        reportError(e, 'Reading the job failed');
      }
    }
    if (st.alive && !(st.job && TERMINAL.has(st.job.state))) st.pollTimer = setTimeout(pollJob, JOB_POLL_MS);
  }

  /* The history of the charted keys and of each rank's figures, thinned by the API. */
  function loadHistory(job) {
    const keys = [...new Set(Object.values(CHARTS).flatMap((c) => c.series.map((s) => s.key)))]
      .concat(rankHistoryKeys(job.world_size || 1));
    return thinnedHistory(job, keys, MAX_POINTS, {signal});
  }

  /* Where the first event stream starts: TAIL_RECORDS logged steps before the history's end. */
  function tailStart(job, recs) {
    if (!recs.length) return 0;
    const train = (job.spec && job.spec.train) || {};
    const interval = isNum(train.log_interval) && train.log_interval > 0 ? train.log_interval : 1;
    return Math.max(0, recs[recs.length - 1].step - TAIL_RECORDS * interval);
  }

  (async () => {
    try {
      const job = await getJob(id, {signal});
      renderJob(job);
      const [recs, logs, anomalies] = await Promise.all([
        loadHistory(job),
        apiJson(jobPath(id, `/logs?tail=${LOG_TAIL}`), {signal}),
        apiJson(jobPath(id, '/anomalies'), {signal}),
      ]);
      for (const r of recs) addRecord(r, false);
      st.followFrom = tailStart(job, recs);
      for (const a of anomalies.anomalies || []) markers.add(anomalyFromApi(a));
      markers.setTotal(int(anomalies.totalSize));
      addLogs((logs.lines || []).map(logFromApi));
      drawLogs();
      charts.flush();
      /* Tests wait for this before reading the page. */
      root.dataset.loaded = 'true';
      st.pollTimer = setTimeout(pollJob, JOB_POLL_MS);
      follow();
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        setText(tid('job-name'), id);
        showBanner('error', `No job ${id} on this ztraind.`);
      } else {
        reportError(e, 'Loading the job failed');
      }
    }
  })();

  return {
    destroy() {
      st.alive = false;
      clearTimeout(st.pollTimer);
      clearTimeout(st.logTimer);
      cancelAnimationFrame(st.logFrame);
      ctrl.abort();
      charts.destroy();
      system.destroy();
    },
  };
}
