"""The documentation cannot rot (issue 30): every fenced block marked ```sh in README.md,
CONTRIBUTING.md, clients/python/README.md and docs/**/*.md is run, page by page, as written.

- A page's runnable blocks run in order in one bash (`set -euo pipefail`), so a block may use
  what an earlier one on the page made (`id=$(ztrain submit ...)`), in a scratch copy of the
  repository's files (git's tracked and unignored ones: what a fresh clone holds) with the built
  programs first on PATH, then .venv/bin when there is one (the Hugging Face quick start's
  python3 needs transformers). Pages are independent of each other.
- Blocks that cannot run here (a GPU, a cluster, root, the network, the whole test suite) are
  marked ```console (or ```text for output): that is the convention CONTRIBUTING.md states.
- Each page runs in a network namespace of its own when the kernel allows one (`unshare -rn`),
  so its fixed ports (the README's 50051 and 8080) do not meet another test's daemon; every
  process a page starts is killed when the page ends, failed or not.
- Besides running them, the test checks that README.md is at most 350 lines, that every
  relative link of these pages names a file that exists (and a heading of it, by GitHub's
  fragments, when the link has one), and that docs/service.md's copy of
  `ztraind --help` and docs/deepspeed.md's key table (tests/cli/test_config_keys.py) are what the
  programs print. `--regenerate` rewrites the ztraind flags section instead of comparing it.
- The comments of docker/, examples/ and packaging/ name pages too: every README or docs/*.md
  they name exists, and so does the heading after it in double quotes (`docs/deploy/docker.md
  "Run with Docker"`) or its #fragment.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SRC = os.environ.get("ZTRAIN_SOURCE") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(os.environ.get("ZTRAIN_BUILD", os.path.join(SRC, "build")))
PAGE_TIMEOUT_S = float(os.environ.get("ZTRAIN_DOCS_PAGE_TIMEOUT", "600"))
# Pages that the README's map links and other branches write (docs/api.md, ...): a link to one
# of them is not a broken link while its branch is not merged.
PAGES_ELSEWHERE = set()
failed = 0


def check(ok, what):
    global failed
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    failed += 0 if ok else 1


def pages():
    found = [os.path.join(SRC, "README.md"), os.path.join(SRC, "CONTRIBUTING.md"),
             os.path.join(SRC, "clients", "python", "README.md")]
    found += sorted(glob.glob(os.path.join(SRC, "docs", "**", "*.md"), recursive=True))
    return [p for p in found if os.path.exists(p)]


FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


def blocks(path):
    """(info, first line number, text) of each fenced block; indentation of the fence removed."""
    out, cur = [], None
    with open(path) as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line.rstrip("\n"))
            if cur is None and m:
                cur = (m.group(2), n + 1, len(m.group(1)), [])
            elif cur is not None and m and not m.group(2):
                out.append((cur[0], cur[1], "".join(cur[3])))
                cur = None
            elif cur is not None:
                cur[3].append(line[cur[2]:] if line[:cur[2]].strip() == "" else line)
    check(cur is None, f"{rel(path)}: every fence is closed")
    return out


def rel(path):
    return os.path.relpath(path, SRC)


def scratch_copy(dst):
    """The files a clone holds, copied (not linked: pages write beside the examples)."""
    try:
        names = subprocess.run(["git", "-C", SRC, "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], capture_output=True, check=True,
                               timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        names = None
    if names is None:
        shutil.copytree(SRC, dst, dirs_exist_ok=True, symlinks=True,
                        ignore=shutil.ignore_patterns("build*", ".git", ".venv", "runs"))
        return
    for name in names:
        if not name or name.startswith(".venv"):
            continue
        src = os.path.join(SRC, name)
        if not os.path.isfile(src):
            continue
        os.makedirs(os.path.dirname(os.path.join(dst, name)), exist_ok=True)
        shutil.copy2(src, os.path.join(dst, name))


def netns_prefix():
    """`unshare -rn` with loopback brought up, when this kernel lets us; else nothing."""
    up_lo = ("import fcntl,os,socket,struct,sys\n"
             "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
             "f=struct.unpack('16sH14s',fcntl.ioctl(s,0x8913,struct.pack('16sH14s',b'lo',0,bytes(14))))[1]\n"
             "fcntl.ioctl(s,0x8914,struct.pack('16sH14s',b'lo',f|1,bytes(14)))\n"
             "os.execvp(sys.argv[1],sys.argv[1:])\n")
    cmd = ["unshare", "-rn", sys.executable, "-c", up_lo]
    try:
        ok = subprocess.run(cmd + ["true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return cmd if ok else []


def run_page(path, runnable, prefix):
    script = ["set -euo pipefail"]
    for _, line, text in runnable:
        script.append(f"echo '>>> {rel(path)}:{line}' >&2")
        script.append(text)
    with tempfile.TemporaryDirectory(prefix="ztrain-docs-") as tmp:
        work = os.path.join(tmp, "src")
        scratch_copy(work)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ZTRAIN_") or k in ("ZTRAIN_BUILD", "ZTRAIN_SOURCE")}
        path_dirs = [BUILD]
        venv = os.path.join(SRC, ".venv", "bin")
        if os.path.isdir(venv):
            path_dirs.append(venv)
        env["PATH"] = os.pathsep.join(path_dirs + [env.get("PATH", "/usr/bin:/bin")])
        env["HOME"] = tmp
        env.setdefault("OMP_NUM_THREADS", "2")
        with open(os.path.join(tmp, "page.sh"), "w") as f:
            f.write("\n".join(script) + "\n")
        t0 = time.monotonic()
        # Output goes to a file, not a pipe: a daemon the page left running (started with &)
        # would hold a pipe open, and a page that failed early would then wait for the timeout.
        log_path = os.path.join(tmp, "page.log")
        with open(log_path, "wb") as log:
            p = subprocess.Popen(prefix + ["bash", os.path.join(tmp, "page.sh")], cwd=work,
                                 env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            try:
                rc = p.wait(timeout=PAGE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                rc = "timeout"
            finally:
                # Whatever the page left running goes with it.
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        with open(log_path, "rb") as log:
            text = log.read().decode(errors="replace")
        took = time.monotonic() - t0
        ok = rc == 0
        check(ok, f"{rel(path)}: {len(runnable)} runnable block(s) ran "
                  f"({'exit ' + str(rc) if rc != 'timeout' else 'timed out'}, {took:.0f} s)")
        if not ok:
            print(text[-6000:])


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path):
    """The fragments GitHub gives a Markdown page's headings: lower case, punctuation other than
    '-' and '_' dropped, spaces made '-', a repeated one numbered -1, -2, ..."""
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    seen, out = {}, set()
    for title in re.findall(r"^#{1,6} +(.+?) *#* *$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def check_links(path):
    with open(path) as f:
        text = f.read()
    # Links inside fenced blocks are code, not links.
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
            if file_part else path
        if not os.path.exists(resolved):
            if rel(resolved) not in PAGES_ELSEWHERE:
                bad.append(target)
        elif fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
            bad.append(target)
    check(not bad, f"{rel(path)}: every relative link names a file, and a heading of it, that "
                   "exists" + (f" (missing: {', '.join(bad)})" if bad else ""))


# A page named from a comment of docker/, examples/ or packaging/: README (or README.md) or
# docs/PAGE.md, optionally followed by the title of one of its headings in double quotes
# ('docs/deploy/docker.md "Run with Docker"', 'the README's "Security" section') or by a
# fragment ('docs/parallelism.md#ranks-on-several-hosts-the-gloo-transport').
PAGE_REF = re.compile(r"(?<![\w/.-])(README(?:\.md)?|docs/[\w./-]+?\.md)(?:'s)?"
                      r"(?:\s+\"([^\"]+)\"|#([\w-]+))?")
REF_DIRS = ("docker", "examples", "packaging")


def tracked_files(top):
    """The files of top/ a clone holds (git's tracked and unignored ones), else every file."""
    try:
        out = subprocess.run(["git", "-C", SRC, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard", "--", top], capture_output=True,
                             check=True, timeout=60).stdout.decode()
        return [os.path.join(SRC, n) for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        return [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(SRC, top)) for f in fs]


def headings(path):
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    return {t.strip() for t in re.findall(r"^#{1,6} +(.+?) *#* *$", text, flags=re.M)}


def check_file_references():
    """Every page, heading and fragment that the comments of docker/, examples/ and packaging/
    name exists (a README section that moved to docs/ leaves such a reference behind)."""
    for top in REF_DIRS:
        for path in sorted(tracked_files(top)):
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (UnicodeDecodeError, OSError):
                continue
            # A reference may run over comment lines: '# (docs/x.md "Ranks on several\n# hosts")'.
            flat = re.sub(r"[ \t]*\n[ \t]*(?:#+|//)?[ \t]*", " ", text)
            bad, seen = [], 0
            for m in PAGE_REF.finditer(flat):
                page, title, fragment = m.groups()
                seen += 1
                target = os.path.join(SRC, "README.md" if page.startswith("README") else page)
                if not os.path.exists(target):
                    bad.append(m.group(0))
                elif title and title not in headings(target):
                    bad.append(m.group(0))
                elif fragment and fragment not in anchors(target):
                    bad.append(m.group(0))
            if seen:
                check(not bad, f"{rel(path)}: the {seen} page and section reference(s) name a "
                               "page and heading that exist" +
                               (f" (missing: {'; '.join(bad)})" if bad else ""))


def check_generated(regenerate):
    page = os.path.join(SRC, "docs", "service.md")
    printed = subprocess.run([os.path.join(BUILD, "ztraind"), "--help"], capture_output=True,
                             text=True, timeout=30).stdout
    # A development build's default --web-dir is its checkout's web/: written as SOURCE/web, so
    # that the page is the same in every clone.
    printed = printed.replace(os.path.join(SRC, "web"), "SOURCE/web")
    with open(page) as f:
        text = f.read()
    pat = re.compile(r"(<!-- ztraind-help: [^\n]*-->\n```text\n)(.*?)(```\n<!-- ztraind-help end -->)",
                     re.S)
    m = pat.search(text)
    if regenerate and m:
        with open(page, "w") as f:
            f.write(text[:m.start(2)] + printed + text[m.end(2):])
        print(f"rewrote the ztraind flags of {rel(page)}")
        return
    check(m is not None, "docs/service.md has the ztraind flags between their markers")
    check(bool(m) and m.group(2) == printed, "docs/service.md's ztraind flags are what "
          "`ztraind --help` prints (regenerate: tests/docs/test_docs.py --regenerate)")


def main():
    regenerate = "--regenerate" in sys.argv[1:]
    check_generated(regenerate)
    if regenerate:
        return
    with open(os.path.join(SRC, "README.md")) as f:
        n = sum(1 for _ in f)
    check(n <= 350, f"README.md is {n} lines (at most 350)")
    check_file_references()
    prefix = netns_prefix()
    print(f"pages run {'in network namespaces of their own' if prefix else 'in this network namespace (unshare -rn is not allowed here)'}")
    only = os.environ.get("ZTRAIN_DOCS_ONLY")
    for path in pages():
        check_links(path)
        found = blocks(path)
        runnable = [b for b in found if b[0] == "sh"]
        unmarked = [b[1] for b in found if b[0] in ("", "bash", "shell")]
        check(not unmarked, f"{rel(path)}: every shell block says whether it runs "
                            f"(sh) or not (console){': lines ' + str(unmarked) if unmarked else ''}")
        if runnable and (not only or only in rel(path)):
            run_page(path, runnable, prefix)
    print("FAILED" if failed else "PASSED")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
