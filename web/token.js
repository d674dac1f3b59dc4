/* The API token: kept in this tab's session storage (gone when the tab closes; local storage,
 * which every later visit and any script of this origin can read, only when the user ticks
 * "remember"), sent by api.js as a bearer token, and asked for in the token panel when ztraind
 * answers 401. A dashboard needs no more than a read token (docs/security.md). While a 401 stands the views stop polling (see
 * isAuthBlocked), so a page left open does not repeat a failing call every second. */
import {clearBanner, showBanner} from './banner.js';

const TOKEN_KEY = 'ztrain.token';
const tokenPanel = document.getElementById('token-panel');
const tokenInput = document.getElementById('token-input');

function storedToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY) || '';
  } catch (e) {
    return '';
  }
}

let sessionToken = storedToken();
/* Set by a 401 until a token is entered. */
let authBlocked = false;

function setToken(t, remember) {
  try {
    sessionStorage.removeItem(TOKEN_KEY);
    localStorage.removeItem(TOKEN_KEY);
    if (t) (remember ? localStorage : sessionStorage).setItem(TOKEN_KEY, t);
  } catch (e) {
    /* Private windows may refuse storage; the token then lasts until the page is closed. */
  }
  sessionToken = t;
}

/* The token to send, or '' for none. */
export function bearerToken() {
  return sessionToken;
}

export function isAuthBlocked() {
  return authBlocked;
}

function openTokenPanel() {
  const wasHidden = tokenPanel.hidden;
  tokenPanel.hidden = false;
  tokenInput.value = '';
  if (wasHidden) tokenInput.focus();
}

/* Called by api.js on a 401: says why in the banner and opens the token panel. */
export function onUnauthorized(message) {
  authBlocked = true;
  const detail = message ? ` (${message})` : '';
  if (sessionToken) {
    showBanner('auth', `401 Unauthorized: ztraind rejected the API token${detail}. Enter the right token below.`);
  } else {
    showBanner('auth', `401 Unauthorized: this ztraind requires an API token${detail}. Enter it below.`);
  }
  openTokenPanel();
}

/* Why t cannot be a token, or '' when it can. ztraind's tokens have no white space or control
 * characters, and a browser sends a header only in ISO-8859-1 while ztraind compares UTF-8
 * bytes: a character outside printable ASCII (a zero-width space or a typographic quote pasted
 * along) would make every request fail, which fetch() reports as the daemon not answering. */
function tokenProblem(t) {
  const m = /[^\x21-\x7e]/u.exec(t);
  if (!m) return '';
  const code = m[0].codePointAt(0).toString(16).toUpperCase().padStart(4, '0');
  return `The token has U+${code} at character ${[...t.slice(0, m.index)].length + 1}, which ` +
    'no API token holds (printable ASCII without spaces): enter it again without it.';
}

/* Wires the token button and panel; onTokenChanged runs after a token is saved or forgotten,
 * so the current view can reload with it. */
export function initTokenPanel(onTokenChanged) {
  document.getElementById('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = tokenInput.value.trim();
    if (!t) return;
    const problem = tokenProblem(t);
    if (problem) {
      showBanner('auth', problem);
      tokenInput.focus();
      return;
    }
    const remember = document.getElementById('token-remember');
    setToken(t, remember && remember.checked);
    if (remember) remember.checked = false;
    tokenInput.value = '';
    tokenPanel.hidden = true;
    authBlocked = false;
    clearBanner('auth');
    onTokenChanged();
  });

  document.getElementById('token-forget').addEventListener('click', () => {
    setToken('', false);
    tokenInput.value = '';
    tokenPanel.hidden = true;
    authBlocked = false;
    clearBanner('auth');
    onTokenChanged();
  });

  document.getElementById('token-button').addEventListener('click', () => {
    if (tokenPanel.hidden) openTokenPanel();
    else tokenPanel.hidden = true;
  });
}
