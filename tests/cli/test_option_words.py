"""How ztrain reads its words, against util-linux getopt(1) as the reference (the parser POSIX
tools and shell scripts use): for each argument list, getopt says which words are options, which
are an option's value and which are operands, and ztrain must agree.

  a. A value given as --opt=VALUE or as the word after an option that takes one is that value,
     whatever it looks like: `sample D --prompt=--help`, `--prompt -h`, `--prompt --help` ask
     for no help (getopt: --prompt's value); `sample D --tokens 3 --help` does (control).
  b. `--help=x` is refused, exit 2, "--help takes no value" (getopt: "doesn't allow an
     argument"), for a command and for ztrain itself.
  c. `--` ends the options: `run -- FILE` and `validate -- -job.json` read the file named
     (a job file beginning with '-' can be given), `validate -- --help` reads a file named
     --help, and `list -- -o json` has two operands, which list refuses (exit 2)."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import ZTRAIN, Checks  # noqa: E402

ck = Checks()
check = ck.check

# The options getopt is told about, as `ztrain help CMD` lists them.
LONGOPTS = {"sample": "help,prompt:,tokens:,tag:", "run": "help,out:,set:,threads:",
            "validate": "help,set:,output:,json", "list": "help,state:,limit:,output:,json"}


def getopt(command, args):
    """getopt(1)'s reading: (options with their values, operands), or None when it refuses."""
    p = subprocess.run(["getopt", "-o", "ho:", "-l", LONGOPTS[command], "--"] + args,
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None
    words = [w.strip("'") for w in p.stdout.split()]
    with_value = {"--" + o[:-1] for o in LONGOPTS[command].split(",") if o.endswith(":")}
    with_value.add("-o")
    options, i = [], 0
    while words[i] != "--":
        options.append((words[i], words[i + 1] if words[i] in with_value else None))
        i += 2 if words[i] in with_value else 1
    return options, words[i + 1:]


def ztrain(*args, cwd=None):
    return subprocess.run([ZTRAIN] + list(args), capture_output=True, text=True, timeout=60,
                          cwd=cwd)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for args in (["ckpt", "--prompt=--help", "--tokens", "3"],
                     ["ckpt", "--prompt", "-h", "--tokens", "3"],
                     ["ckpt", "--prompt", "--help"],
                     ["ckpt", "--tokens", "3", "--help"]):
            ref = getopt("sample", args)
            help_wanted = any(opt in ("--help", "-h") for opt, _ in ref[0])
            p = ztrain("sample", *args, cwd=tmp)
            got_help = p.stdout.startswith("usage: ztrain sample")
            check(got_help == help_wanted,
                  f"a: sample {' '.join(args)}: help {got_help}, getopt says {help_wanted} "
                  f"(exit {p.returncode}: {p.stderr.strip()[:100]})")
        check(getopt("run", ["--help=anything"]) is None, "b: getopt refuses --help=anything")
        for argv in (["run", "--help=anything"], ["--help=x"]):
            p = ztrain(*argv)
            check(p.returncode == 2 and "--help takes no value" in p.stderr and not p.stdout,
                  f"b: ztrain {' '.join(argv)}: exit {p.returncode}, {p.stderr.strip()[:100]}")

        ref = getopt("run", ["--", "missing-job.json"])
        p = ztrain("run", "--", "missing-job.json", cwd=tmp)
        check(ref == ([], ["missing-job.json"]) and p.returncode == 1 and
              "missing-job.json" in p.stderr,
              f"c: run -- missing-job.json reads that file (exit {p.returncode}: "
              f"{p.stderr.strip()[:120]})")
        for name in ("-job.json", "--help"):
            ref = getopt("validate", ["--", name])
            p = ztrain("validate", "--", name, cwd=tmp)
            check(ref == ([], [name]) and p.returncode == 1 and name in p.stderr and
                  "usage" not in p.stdout,
                  f"c: validate -- {name} reads a file named {name} (exit {p.returncode}: "
                  f"{p.stderr.strip()[:120]})")
        ref = getopt("list", ["--", "-o", "json"])
        p = ztrain("list", "--", "-o", "json")
        check(ref == ([], ["-o", "json"]) and p.returncode == 2 and
              "unexpected argument" in p.stderr,
              f"c: list -- -o json: two operands, refused (exit {p.returncode}: "
              f"{p.stderr.strip()[:120]})")
    ck.finish()


if __name__ == "__main__":
    main()
