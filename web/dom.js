/* Small DOM helpers the views share. The views' markup lives in index.html's templates; these
 * clone it and update it in place, touching an element only when its text really changes so that
 * polling does not disturb selection, focus or screen readers. */

export const $ = (root, sel) => root.querySelector(sel);

export function cloneTemplate(id) {
  return document.getElementById(id).content.firstElementChild.cloneNode(true);
}

export function setText(el, text) {
  if (el && el.textContent !== text) el.textContent = text;
}

/* A job state as a coloured badge; style.css colours it by its state-<STATE> class. */
export function stateBadge(el, state) {
  setText(el, state || '');
  el.className = 'state state-' + (state || 'UNKNOWN');
  el.dataset.state = state || '';
}
