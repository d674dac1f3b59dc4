"""ztrain's and ztraind's usage errors and help, against references of their own: an edit
distance computed here (Damerau's, as git counts a typo) over the options each program's help
lists, and the exit statuses getting-started.md documents.

  a. Did you mean: `ztrain lsit` names list, `ztrain list --limt 3` --limit, `ztrain help lsit`
     list, `ztraind --max-rank 2` --max-ranks: each time the one word of the help within the
     distance this test computes; a word near nothing gets no suggestion; exit 2.
  b. A value option without its value is "needs a value", not an unknown option.
  c. ztraind's bad flag, stray argument or bad value is one line naming it (a stray argument
     in ztrain's words) and a pointer to --help, not its whole help on stderr; exit 2.
  d. Global options misused name their own value (--token-file FILE, not HOST:PORT); a
     leading unknown option is an unknown option, not a command; `ztrain --server X --help`
     prints the help, exit 0, as kubectl's does.
  e. `status -o yaml` lists what status takes (json, name), not wide.
  f. `ztrain help` (and the man page made from it) lists every exit status getting-started.md
     lists, 137 among them.
  g. `ztrain cancel --grace` above the day ztraind allows (docs/service.md: at most 86400 s) is
     refused before any connection, naming --grace and the bound, exit 2 (it was sent, and the
     server's error named grace_seconds, a field the user never typed)."""
import gzip
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import Checks, BUILD, SRC, ZTRAIN, ZTRAIND  # noqa: E402

ck = Checks()
check = ck.check


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


def damerau(a, b):
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def nearest(word, candidates):
    """The nearest candidate within two edits and a third of the word's letters."""
    letters = len(word.lstrip("-"))
    limit = min(2, letters // 3)
    best = sorted((damerau(word, c), c) for c in set(candidates) if c != word)
    return best[0][1] if best and best[0][0] <= limit else None


def main():
    help_all = run(ZTRAIN, "--help").stdout
    commands = re.findall(r"^  ([a-z][a-z0-9-]*)", help_all, re.M)
    list_opts = re.findall(r"--?[a-z][a-z-]*", run(ZTRAIN, "help", "list").stdout)
    daemon_opts = re.findall(r"--[a-z][a-z-]*", run(ZTRAIND, "--help").stdout)
    for argv, candidates, word in (([ZTRAIN, "lsit"], commands, "lsit"),
                                   ([ZTRAIN, "help", "lsit"], commands, "lsit"),
                                   ([ZTRAIN, "list", "--limt", "3"], list_opts, "--limt"),
                                   ([ZTRAIN, "list", "--bogus"], list_opts, "--bogus"),
                                   ([ZTRAIND, "--max-rank", "2"], daemon_opts, "--max-rank"),
                                   ([ZTRAIND, "--bogus-flag", "2"], daemon_opts, "--bogus-flag")):
        want = nearest(word, candidates)
        p = run(*argv)
        said = re.search(r"did you mean (\S+?)\?", p.stderr)
        check(p.returncode == 2 and (said.group(1) if said else None) == want,
              f"a: {' '.join(os.path.basename(a) for a in argv)}: suggests "
              f"{said.group(1) if said else None}, the nearest is {want} ({p.stderr.strip()[:90]})")
    p = run(ZTRAIN, "run", "job.json", "--out")
    check(p.returncode == 2 and "--out needs a value" in p.stderr,
          f"b: run job.json --out: {p.stderr.strip()[:80]}")
    p = run(ZTRAIND, "--max-rank", "2")
    check(len(p.stderr.strip().splitlines()) <= 2 and "--help" in p.stderr,
          f"c: ztraind's bad flag is short ({len(p.stderr.splitlines())} lines)")
    # A stray argument, an unknown option and a bad value: each one line naming the word, as
    # ztrain's own usage error names it ("unexpected argument 'stray'"), and the pointer to
    # ztraind --help, exit 2.
    ztrain_stray = run(ZTRAIN, "list", "stray").stderr.splitlines()[0]
    for args, word in ((["stray"], "unexpected argument 'stray'"),
                       (["--grace", "5", "stray"], "unexpected argument 'stray'"),
                       (["--bogus"], "unknown option '--bogus'"),
                       (["--grace", "0"], "--grace expects")):
        p = run(ZTRAIND, *args)
        lines = p.stderr.strip().splitlines()
        check(p.returncode == 2 and len(lines) == 2 and word in lines[0] and
              "ztraind --help" in lines[1] and
              (not word.startswith("unexpected") or word in ztrain_stray),
              f"c: ztraind {' '.join(args)}: {word} and --help, exit 2 "
              f"({p.returncode}: {p.stderr.strip()[:120]})")
    p = run(ZTRAIN, "--token-file", "token", "help", "list")
    check(p.returncode == 2 and "--token-file FILE" in p.stderr and "HOST:PORT" not in p.stderr,
          f"d: --token-file misplaced names FILE: {p.stderr.strip()[-60:]}")
    p = run(ZTRAIN, "--tls-ca", "ca.pem", "validate", "x.json")
    check(p.returncode == 2 and "--tls-ca FILE" in p.stderr, "d: --tls-ca misplaced names FILE")
    p = run(ZTRAIN, "--bogus", "list")
    check(p.returncode == 2 and "unknown option '--bogus'" in p.stderr,
          f"d: ztrain --bogus list: {p.stderr.strip().splitlines()[0]}")
    p = run(ZTRAIN, "--server", "127.0.0.1:1", "--help")
    check(p.returncode == 0 and p.stdout == help_all, "d: ztrain --server X --help is the help")
    p = run(ZTRAIN, "status", "job-000001", "-o", "yaml")
    synopsis = re.search(r"-o ([a-z|]+)", run(ZTRAIN, "help", "status").stdout).group(1)
    said = re.search(r"-o expects (.*), got", p.stderr)
    check(p.returncode == 2 and said and
          sorted(re.findall(r"[a-z]+", said.group(1).replace(" or ", " "))) ==
          sorted(synopsis.split("|")),
          f"e: status -o yaml lists status's formats ({synopsis}): {p.stderr.strip()[:70]}")

    doc = open(os.path.join(SRC, "docs", "getting-started.md")).read()
    # The statuses are the numbers that open an item of the list ("Exit status: 0 success, 1
    # ..."), not those inside one ("137 (128 + SIGKILL)").
    item = re.compile(r"[:,]\s+(\d+)\s")
    documented = set(item.findall(doc[doc.index("- Exit status:"):][:600]))
    listed = set(item.findall(help_all[help_all.index("Exit status:"):]))
    check(documented and documented <= listed,
          f"f: ztrain --help lists the exit statuses {sorted(documented)} (lists {sorted(listed)})")
    service = open(os.path.join(SRC, "docs", "service.md")).read()
    day = re.search(r"at most (\d+) s, a\s+day", service).group(1)
    p = run(ZTRAIN, "--server", "127.0.0.1:1", "cancel", "job-000001", "--grace",
            str(int(day) + 1))
    check(p.returncode == 2 and "--grace" in p.stderr and day in p.stderr and
          "grace_seconds" not in p.stderr,
          f"g: cancel --grace {int(day) + 1} is refused naming --grace and {day} "
          f"({p.returncode}: {p.stderr.strip()[:120]})")
    man = os.path.join(BUILD, "packaging", "man", "ztrain.1.gz")
    if os.path.exists(man):
        text = gzip.open(man, "rt").read().replace("\\-", "-")
        check("137" in text, "f: the man page lists 137")
    ck.finish()


if __name__ == "__main__":
    main()
