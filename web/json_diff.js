/* A JSON-aware diff of several documents (job specs, DeepSpeed configs), key by key: each
 * document is flattened to its leaves, named by their path (optimizer.params.lr, layers[2]), and
 * every path is compared with the first document, the baseline. No Debian package ships a
 * structural JSON diff built for the browser (node-diff compares text lines; node-difflet and
 * node-concordance are Node-only), so this small one lives here.
 *
 * Pure functions, no DOM: compare_page.js renders the rows, and the browser test can import
 * this module to check them. */

/* A key as a path segment: identifiers after a dot, anything else quoted in brackets. */
function segment(key) {
  return /^[A-Za-z_][A-Za-z0-9_]*$/.test(key) ? '.' + key : '[' + JSON.stringify(key) + ']';
}

/* Map path -> leaf value, in document order. An empty object or array is a leaf of its own, so
 * that {} and a missing key stay different. The root's path is "" (and a leading "." is
 * dropped from the others). */
export function flatten(doc) {
  const out = new Map();
  const walk = (v, path) => {
    if (Array.isArray(v) && v.length) {
      v.forEach((x, i) => walk(x, `${path}[${i}]`));
    } else if (v !== null && typeof v === 'object' && Object.keys(v).length) {
      for (const k of Object.keys(v)) walk(v[k], path + segment(k));
    } else {
      out.set(path.startsWith('.') ? path.slice(1) : path, v);
    }
  };
  walk(doc, '');
  return out;
}

/* How a leaf reads in the table: JSON text, so that "1" and 1 differ visibly. */
export function leafText(v) {
  return v === undefined ? '' : JSON.stringify(v);
}

/* Rows of the diff of docs (an array; a missing document is null or undefined, and has no
 * keys): [{path, values, status, differs}] in the order the paths first appear, baseline first.
 * status[i] is "base" for the first document and, for the others, compared with it:
 * "same", "changed" (in both, different values), "added" (only in this one), "removed" (only in
 * the baseline) or "absent" (in neither). differs: some status is changed/added/removed. */
export function diffJson(docs) {
  const flats = docs.map((d) => (d === null || d === undefined ? new Map() : flatten(d)));
  const paths = [];
  const seen = new Set();
  for (const f of flats) {
    for (const p of f.keys()) {
      if (!seen.has(p)) {
        seen.add(p);
        paths.push(p);
      }
    }
  }
  return paths.map((path) => {
    const values = flats.map((f) => f.get(path));
    const has = flats.map((f) => f.has(path));
    const status = values.map((v, i) => {
      if (i === 0) return 'base';
      if (has[0] && has[i]) return leafText(v) === leafText(values[0]) ? 'same' : 'changed';
      if (has[i]) return 'added';
      return has[0] ? 'removed' : 'absent';
    });
    const differs = status.some((s) => s === 'changed' || s === 'added' || s === 'removed');
    return {path, values, status, differs};
  });
}
