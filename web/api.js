/* ztraind's HTTP API as the views use it: fetch() with the bearer token, errors turned into
 * AuthError (a 401, already reported by opening the token panel) or ApiError (anything else,
 * with the server's message), and a reader for the jobs' Server-Sent Events streams.
 *
 * Event streams are read with fetch() rather than EventSource because EventSource cannot send
 * the bearer token. */
import {showBanner} from './banner.js';
import {bearerToken, onUnauthorized} from './token.js';

/* Job states after which a job never changes again. */
export const TERMINAL = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);

export class AuthError extends Error {}

export class ApiError extends Error {
  /* status is the HTTP status, or 0 when ztraind could not be reached at all. */
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorText(res) {
  try {
    const body = await res.json();
    return body && body.error ? String(body.error) : res.statusText;
  } catch (e) {
    return res.statusText;
  }
}

/* fetch() with the bearer token; a 401 opens the token form and throws AuthError, any other
 * failure throws ApiError carrying the server's message. */
export async function apiFetch(path, opts = {}) {
  const headers = Object.assign({Accept: 'application/json'}, opts.headers || {});
  const token = bearerToken();
  if (token) headers.Authorization = 'Bearer ' + token;
  let res;
  try {
    res = await fetch(path, Object.assign({}, opts, {headers}));
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, `cannot reach ztraind (${e.message})`);
  }
  if (res.status === 401) {
    const msg = await errorText(res);
    onUnauthorized(msg);
    throw new AuthError(msg);
  }
  if (!res.ok) throw new ApiError(res.status, await errorText(res));
  return res;
}

export async function apiJson(path, opts) {
  const res = await apiFetch(path, opts);
  return res.json();
}

export function jobPath(id, rest = '') {
  return `/api/v1/jobs/${encodeURIComponent(id)}${rest}`;
}

/* Reports a failed call in the banner; aborts (leaving a view) and 401s (already reported)
 * are quiet. */
export function reportError(e, what) {
  if (e.name === 'AbortError' || e instanceof AuthError) return;
  if (e instanceof ApiError && e.status === 0) showBanner('net', `ztraind is not answering: ${e.message}`);
  else showBanner('error', `${what}: ${e.message}`);
}

/* Reads a Server-Sent Events response, calling onEvent({event, data, lastEventId}) for each
 * event, until the server closes the stream. lastEventId is the stream's last event id as
 * EventSource keeps it (the HTML standard's parser: an `id:` line takes effect when its event
 * is dispatched, so an event cut short by the connection does not move it; an event without
 * one leaves it as it was; '' before any): what a reconnect sends back as Last-Event-ID to go
 * on after it. */
export async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let name = '';
  let data = [];
  let lastEventId = '';
  let idBuffer = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += decoder.decode(value, {stream: true});
    for (;;) {
      /* A lone '\r' at the end of the buffer may be the first half of "\r\n": wait for more. */
      const m = /\r\n|\n|\r(?!$)/.exec(buf);
      if (!m) break;
      const line = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      if (line === '') {
        lastEventId = idBuffer;
        if (data.length) onEvent({event: name || 'message', data: data.join('\n'), lastEventId});
        name = '';
        data = [];
        continue;
      }
      if (line[0] === ':') continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let val = colon < 0 ? '' : line.slice(colon + 1);
      if (val[0] === ' ') val = val.slice(1);
      if (field === 'event') name = val;
      else if (field === 'data') data.push(val);
      /* As the HTML standard's parser: an id with a NUL is ignored. */
      else if (field === 'id' && !val.includes('\0')) idBuffer = val;
    }
  }
}
