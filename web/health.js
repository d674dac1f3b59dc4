/* The daemon's health line in the top bar. /healthz needs no token, so it is fetched directly
 * rather than through api.js: it shows even while the page waits for a token. */

export async function refreshHealth() {
  const el = document.getElementById('health');
  try {
    const res = await fetch('/healthz', {headers: {Accept: 'application/json'}});
    const h = await res.json();
    el.textContent = `ztraind ${h.status} · ${h.jobs} jobs · ${h.running} running · ${h.queued} queued`;
  } catch (e) {
    el.textContent = 'ztraind unreachable';
  }
}
