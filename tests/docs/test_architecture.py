"""docs/architecture.md against the tree: the folder table, the include rules and the diagram.

The table in docs/architecture.md is kept by hand: one row per source folder with the public
headers it owns and the folders it uses. This test reads every C/C++/CUDA file of engine/,
service/ and kernels/ and derives the same facts from their #include lines, then checks:

- the table lists exactly the folders of the tree, and every public header of
  engine/include/ztrain/ and kernels/include/ztrain/ has exactly one owner;
- a file of an engine folder includes only its own folder's files and public headers (a public
  header counts for the folder that owns it; its own includes count for that folder too), and
  nothing of service/ or of a backend's internals, but the exceptions named below;
- service files include another service folder only as "folder/x.h";
- each folder's "uses" column equals the folders its includes reach;
- no folder holds more than 20 source files;
- the dependency diagram in the document is the one the table gives, less the arrows into the
  floors everything uses (kernels/, engine/util/), so the picture cannot drift from the tree.

Run: python3 tests/docs/test_architecture.py (from anywhere; ZTRAIN_SOURCE overrides the root).
"""
import collections
import glob
import os
import re
import sys

ROOT = os.environ.get("ZTRAIN_SOURCE") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "architecture.md")
SOURCES = (".c", ".cc", ".cu")
MAX_SOURCES = 20
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# Includes that cross the rules on purpose, each with its reason in the file that makes it.
EXCEPTIONS = {
    # The host reduction rounds 16-bit values with the CPU backend's own scalar conversions.
    ("engine/comm/comm_reduce.c", "half.h"): "kernels",
}

# Folders every other one uses (status codes, files, JSON): their arrows are not drawn.
FLOORS = {"kernels", "engine/util"}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def doc_table(text):
    """{folder: (headers, uses)} from the table under '## Folders'."""
    rows = {}
    section = text.split("## Folders", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        folder = cells[0].strip("`")
        headers = set(re.findall(r"`([\w.]+\.h)`", cells[2]))
        uses = set(re.findall(r"`([\w/]+)`", cells[3]))
        rows[folder] = (headers, uses)
    return rows


def doc_diagram(text):
    """The set of (from, to) edges of the mermaid block under '## Dependencies'."""
    section = text.split("## Dependencies", 1)[1]
    block = section.split("```mermaid", 1)[1].split("```", 1)[0]
    return set(re.findall(r"^\s*(\S+)\s*-->\s*(\S+)\s*$", block, re.M))


def node(folder):
    return folder.replace("/", "_")


def tree_folders():
    out = []
    for top in ("engine", "service"):
        for d in sorted(os.listdir(os.path.join(ROOT, top))):
            p = os.path.join(ROOT, top, d)
            if os.path.isdir(p) and d != "include":
                out.append(f"{top}/{d}")
    out += ["kernels", "kernels/cpu", "kernels/cuda", "kernels/cuda/attention",
            "kernels/cuda/memory", "kernels/cuda/nccl"]
    return out


def files_of(folder):
    p = os.path.join(ROOT, folder)
    return sorted(f for f in glob.glob(os.path.join(p, "*")) if os.path.isfile(f)
                  and f.endswith(SOURCES + (".h", ".cuh")))


def main():
    text = read(DOC)
    table = doc_table(text)
    folders = tree_folders()
    check(set(table) == set(folders),
          f"the table's folders {sorted(set(table) ^ set(folders))} differ from the tree's")

    # Every public header has exactly one owner.
    owner = {}
    for folder, (headers, _) in table.items():
        for h in headers:
            check(h not in owner, f"{h} is owned by both {owner.get(h)} and {folder}")
            owner[h] = folder
    public = {os.path.basename(h): d for d in ("engine", "kernels")
              for h in glob.glob(os.path.join(ROOT, d, "include", "ztrain", "*.h"))}
    check(set(owner) == set(public),
          f"public headers without an owner or owned but absent: {sorted(set(owner) ^ set(public))}")

    uses = collections.defaultdict(set)

    def reach(folder, path, inc):
        """The folder an include of path reaches, or None when it breaks the rules."""
        rel = os.path.relpath(path, ROOT)
        base = os.path.basename(inc)
        if (rel, base) in EXCEPTIONS:
            return EXCEPTIONS[(rel, base)]
        if inc.startswith("ztrain/") and base in owner:
            return owner[base]
        here = os.path.dirname(path)
        if "/" not in inc and os.path.exists(os.path.join(here, inc)):
            return folder
        if folder.startswith("service/") and "/" in inc:
            target = "service/" + inc.split("/")[0]
            if os.path.exists(os.path.join(ROOT, target, base)):
                return target
        if folder.startswith("service/") and inc.endswith(".pb-c.h"):
            return "proto"
        if folder.startswith("kernels") and os.path.exists(os.path.join(ROOT, "kernels", "cuda", inc)):
            return "kernels/cuda"
        return None

    for folder in folders:
        srcs = files_of(folder)
        n = sum(1 for f in srcs if f.endswith(SOURCES))
        check(n <= MAX_SOURCES, f"{folder} holds {n} source files (at most {MAX_SOURCES})")
        for path in srcs:
            for inc in INCLUDE.findall(read(path)):
                to = reach(folder, path, inc)
                rel = os.path.relpath(path, ROOT)
                if not check(to is not None, f'{rel} includes "{inc}", which no rule allows'):
                    continue
                if folder.startswith("engine/"):
                    check(not to.startswith(("service", "kernels/cuda")),
                          f'{rel}: the engine includes "{inc}" of {to}')
                if to != folder:
                    uses[folder].add(to)
    # A public header's own includes are its owner's uses.
    for d in ("engine", "kernels"):
        for h in glob.glob(os.path.join(ROOT, d, "include", "ztrain", "*.h")):
            base = os.path.basename(h)
            for inc in INCLUDE.findall(read(h)):
                b = os.path.basename(inc)
                check(inc.startswith("ztrain/") and b in owner,
                      f'{d}/include/ztrain/{base} includes "{inc}": public headers include only '
                      f'public headers, as "ztrain/x.h"')
                if base in owner and b in owner and owner[b] != owner[base]:
                    uses[owner[base]].add(owner[b])
    # Seen from above, kernels/ (the backend object) with its cpu/ and cuda/ halves is one
    # library, and so is the engine seen from the service.
    def seen_from(folder, u):
        if u.startswith("kernels") and not folder.startswith("kernels"):
            return "kernels"
        if u.startswith("engine/") and folder.startswith("service/"):
            return "engine"
        return u

    for folder in folders:
        got = {seen_from(folder, u) for u in uses[folder]}
        got.discard("proto")
        check(got == table[folder][1],
              f"{folder} uses {sorted(got)} but the table says {sorted(table[folder][1])}")

    # The picture leaves out the arrows into the two floors everything stands on.
    want_edges = {(node(f), node(u)) for f, (_, us) in table.items() for u in us
                  if u not in FLOORS}
    got_edges = doc_diagram(text)
    check(got_edges == want_edges,
          f"the diagram's edges differ from the table's: missing {sorted(want_edges - got_edges)}, "
          f"extra {sorted(got_edges - want_edges)}")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print(f"ok: {len(folders)} folders, {len(owner)} public headers, {len(want_edges)} arrows")


if __name__ == "__main__":
    main()
