/* The daemon's health line in the top bar, on every view: refreshed every HEALTH_POLL_MS (and by
 * the jobs page after each of its polls), so that it says "unreachable" while ztraind is down and
 * "ok" again once it is back. /healthz needs no token, so it is fetched directly rather than
 * through api.js: it shows even while the page waits for a token. */

import {setText} from './dom.js';

const HEALTH_POLL_MS = 5000;

/* The line is a polite live region: it is written only when it changes, so that a screen
 * reader does not repeat it every few seconds. */
export async function refreshHealth() {
  const el = document.getElementById('health');
  try {
    const res = await fetch('/healthz', {headers: {Accept: 'application/json'}});
    const h = await res.json();
    setText(el, `ztraind ${h.status} · ${h.jobs} jobs · ${h.running} running · ${h.queued} queued`);
  } catch (e) {
    setText(el, 'ztraind unreachable');
  }
}

/* Refreshes the line now and then every HEALTH_POLL_MS, one request at a time. */
export async function followHealth() {
  await refreshHealth();
  setTimeout(followHealth, HEALTH_POLL_MS);
}
