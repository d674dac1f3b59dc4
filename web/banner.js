/* The banner under the top bar: one message at a time, tagged with a kind ("auth", "net",
 * "error", "info") so that whoever clears it clears only the kind of trouble it knows is over
 * (a successful poll clears "net" but leaves a 401 message standing). */

const banner = document.getElementById('banner');
let bannerKind = null;

export function showBanner(kind, text) {
  bannerKind = kind;
  banner.textContent = text;
  banner.dataset.kind = kind;
  banner.className = 'banner' + (kind === 'info' ? ' info' : '');
  banner.hidden = false;
}

/* Clears the banner if it shows this kind of message, or whatever it shows when kind is omitted. */
export function clearBanner(kind) {
  if (kind && bannerKind !== kind) return;
  bannerKind = null;
  banner.hidden = true;
  banner.textContent = '';
}
