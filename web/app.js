/* ztrain dashboard: the jobs table and the job page, built on ztraind's HTTP API alone (the API a
 * script would use), with Debian's Chart.js for the charts. No build step and no framework: the
 * markup lives in index.html's templates, and these ES modules, served as they are from web/,
 * fill it in. This one routes the URL's hash to a view and starts the page:
 *
 *   api.js        fetch with the bearer token, errors, the event-stream reader
 *   token.js      the stored token and the panel that asks for it on a 401
 *   banner.js     the message banner;  health.js  the daemon's health line
 *   jobs_page.js  #/ : the jobs table;  job_page.js  #/jobs/<id> : one job
 *   compare_page.js  #/compare?jobs=<id>,<id> : jobs side by side (compare_charts.js, json_diff.js)
 *   charts.js     the job page's charts;  chart_update.js  what every chart does when redrawn
 *   format.js, dom.js  shared helpers */
import {clearBanner} from './banner.js';
import {compareView} from './compare_page.js';
import {followHealth} from './health.js';
import {jobView} from './job_page.js';
import {jobsView} from './jobs_page.js';
import {initTokenPanel} from './token.js';

const main = document.getElementById('main');
/* The view on screen; each has a destroy() that stops its timers and requests. */
let view = null;

function parseQuery(s) {
  const q = {};
  new URLSearchParams(s || '').forEach((v, k) => {
    q[k] = v;
  });
  return q;
}

/* Replaces the view with the one the hash names; also used to reload it after a token change. */
function route() {
  if (view) view.destroy();
  view = null;
  main.replaceChildren();
  clearBanner('error');
  const hash = location.hash || '#/';
  const m = /^#\/jobs\/([^/?]+)/.exec(hash);
  const qi = hash.indexOf('?');
  if (m) {
    view = jobView(main, decodeURIComponent(m[1]));
  } else if (/^#\/compare(\?|$)/.test(hash)) {
    view = compareView(main, parseQuery(qi >= 0 ? hash.slice(qi + 1) : ''));
  } else {
    view = jobsView(main, parseQuery(qi >= 0 ? hash.slice(qi + 1) : ''));
  }
}

initTokenPanel(route);
window.addEventListener('hashchange', () => {
  route();
  main.focus({preventScroll: true});
});
route();
followHealth();
