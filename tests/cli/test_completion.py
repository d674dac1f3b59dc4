"""The bash and zsh completion scripts (`ztrain completion bash|zsh`), driven as the shells drive
them: bash's _ztrain with COMP_WORDS/COMP_CWORD and compgen, zsh's through a pseudo-terminal
(zsh/zpty) with compinit, pressing TAB. The references are independent of the scripts: the
values a command's -o really accepts (each candidate run through the command: a usage error,
exit 2, naming -o, is a refusal), the job states of proto/ztrain.proto, and `ztrain --help`'s
command list and global options.

  a. bash: `ztrain <TAB>` offers every command, the global options, --help and --version; the
     command is found after global options in both forms (`--server X li<TAB>`,
     `--server=X li<TAB>`); `help <TAB>` the commands, `completion <TAB>` bash and zsh.
  b. bash: -o (and --output, and `--output=<TAB>`) offers exactly what each command accepts
     (validate/estimate/config-keys json; status json, name; list json, wide, name);
     `list --state <TAB>` the proto's states; `prepare --dtype <TAB>` uint16, uint32; a global
     option's file value completes files.
  c. zsh (needed: scripts/install-deps.sh test installs it): `help <TAB>` lists the commands and
     `completion <TAB>` bash and zsh (not --help); `--server X li<TAB>` gives list; -o of
     status gives name and never wide; `list --state SUCC<TAB>` SUCCEEDED; the command
     descriptions end at a sentence's end, not in the middle of one."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import Checks, BUILD, SRC, ZTRAIN  # noqa: E402

ck = Checks()
check = ck.check


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=60, **kw)


def accepted_outputs(command, args):
    """The -o values `ztrain COMMAND ARGS -o V` does not refuse as bad usage naming -o."""
    ok = []
    for v in ("json", "wide", "name", "yaml"):
        p = run([ZTRAIN, command] + args + ["-o", v, "--server", "127.0.0.1:1"]
                if command in ("list", "status") else [ZTRAIN, command] + args + ["-o", v],
                env=dict(os.environ, ZTRAIN_TOKEN="t"))
        if not (p.returncode == 2 and "-o" in p.stderr):
            ok.append(v)
    return sorted(ok)


def proto_states():
    text = open(os.path.join(SRC, "proto", "ztrain.proto")).read()
    return sorted(set(re.findall(r"JOB_STATE_([A-Z]+) = [1-9]", text)))


def help_facts():
    out = run([ZTRAIN, "--help"]).stdout
    commands = re.findall(r"^  ([a-z][a-z0-9-]*)", out, re.M)
    globals_ = sorted(set(re.findall(r"(--server|--token-file|--tls-ca|--tls-cert|--tls-key)",
                                     out)))
    return commands, globals_


def part_bash(tmp, commands, globals_):
    script = run([ZTRAIN, "completion", "bash"]).stdout

    def complete(*words):
        prog = (script + "\nCOMP_WORDS=(" + " ".join(f"'{w}'" for w in words) + ")\n"
                f"COMP_CWORD={len(words) - 1}\n_ztrain\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
        return sorted(subprocess.run(["bash", "-c", prog], capture_output=True, text=True,
                                     timeout=30, cwd=tmp).stdout.split())

    got = complete("ztrain", "")
    check(got == sorted(commands + globals_ + ["--help", "--version"]),
          f"a: bash `ztrain <TAB>`: commands, global options, --help, --version ({got})")
    check(complete("ztrain", "--server", "x", "li") == ["list"],
          "a: bash `ztrain --server x li<TAB>` gives list")
    check(complete("ztrain", "--server", "=", "x", "--token-file", "t", "li") == ["list"],
          "a: bash `ztrain --server=x --token-file t li<TAB>` gives list")
    check(complete("ztrain", "help", "") == sorted(commands), "a: bash `help <TAB>`: the commands")
    check(complete("ztrain", "completion", "") == ["bash", "zsh"],
          "a: bash `completion <TAB>`: bash zsh")
    for command, args in (("validate", ["/nonexistent.json"]), ("estimate", ["/nonexistent.json"]),
                          ("config-keys", []), ("status", ["job-000001"]), ("list", [])):
        want = accepted_outputs(command, args)
        got = complete("ztrain", command, *args, "-o", "")
        check(got == want, f"b: bash `{command} -o <TAB>` offers what {command} takes: "
                           f"{got}, takes {want}")
        got = complete("ztrain", "--server", "x", command, *args, "--output", "=")
        check(got == want, f"b: bash `ztrain --server x {command} --output=<TAB>`: {got}")
    got = complete("ztrain", "list", "--state", "")
    check(got == proto_states(), f"b: bash `list --state <TAB>`: {got}")
    check(complete("ztrain", "prepare", "--dtype", "") == ["uint16", "uint32"],
          "b: bash `prepare --dtype <TAB>`: uint16 uint32")
    open(os.path.join(tmp, "token-file.txt"), "w").close()
    check(complete("ztrain", "--token-file", "tok") == ["token-file.txt"],
          "b: bash `ztrain --token-file tok<TAB>` completes the file")


ZPTY = r'''
zmodload zsh/zpty
t() {
  zpty z 'zsh -f -i'
  zpty -w z "fpath=($1 \$fpath); autoload -U compinit; compinit -u -D; PROMPT='> '; echo READY"
  local o a=""
  while zpty -r -t z o 2>/dev/null || { sleep 0.3; zpty -r -t z o 2>/dev/null; }; do
    a+=$o; [[ $a == *READY*READY* ]] && break
  done
  # After TAB: read until the screen shows each |-separated part of $3 (15 s at most, a loaded
  # machine's compinit is slow), or, with no $3 (a completion that must offer nothing), until 3 s pass without output.
  zpty -w -n z "$2"$'\t'; a=""
  local clean idle=0 waited=0
  while (( waited < 150 )); do
    if zpty -r -t z o 2>/dev/null; then a+=$o; idle=0; else sleep 0.1; (( idle++, waited++ )); fi
    clean=${${a//$'\e'\[[0-9;?]#[A-Za-z]/}//$'\r'/}
    if [[ -n $3 ]]; then
      local w all=1
      for w in ${(s:|:)3}; do [[ $clean == *"$w"* ]] || all=0; done
      (( all )) && break
    else
      (( idle >= 30 )) && break
    fi
  done
  print -r -- "<<<$2>>>${a//$'\r'/}<<<end>>>"; zpty -d z
}
'''


def part_zsh(tmp):
    if not check(shutil.which("zsh"), "c: zsh is installed (scripts/install-deps.sh test)"):
        return
    fdir = os.path.join(tmp, "zfunc")
    os.makedirs(fdir)
    script = run([ZTRAIN, "completion", "zsh"]).stdout
    with open(os.path.join(fdir, "_ztrain"), "w") as f:
        f.write(script)
    # Each line and what its completion shows once it has come ("": it must offer nothing).
    lines = [("ztrain help ", "estimate|list|zero-to-fp32"), ("ztrain completion ", "zsh"),
             ("ztrain --server x li", "ztrain --server x list"),
             ("ztrain status x -o n", "ztrain status x -o name"), ("ztrain status x -o w", ""),
             ("ztrain list --state SUCC", "SUCCEEDED"),
             ("ztrain validate x.json -o ", "-o json")]
    prog = "setopt extendedglob\n" + ZPTY + "".join(f"t {fdir} '{line}' '{want}'\n"
                                                     for line, want in lines)
    env = dict(os.environ, PATH=BUILD + os.pathsep + os.environ["PATH"])
    out = subprocess.run(["zsh", "-f", "-c", prog], capture_output=True, text=True, timeout=240,
                         env=env, cwd=tmp).stdout
    screens = {m.group(1): re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", m.group(2))
               for m in re.finditer(r"<<<(.*?)>>>(.*?)<<<end>>>", out, re.S)}
    s = screens.get("ztrain help ", "")
    check("--help" not in s and all(c in s for c in ("estimate", "list", "zero-to-fp32")),
          f"c: zsh `help <TAB>` lists the commands ({s[-200:]!r})")
    s = screens.get("ztrain completion ", "")
    check("--help" not in s and "bash" in s and "zsh" in s,
          f"c: zsh `completion <TAB>` gives bash and zsh ({s[-200:]!r})")
    check("ztrain --server x list" in screens.get("ztrain --server x li", ""),
          "c: zsh `--server x li<TAB>` gives list")
    check("ztrain status x -o name" in screens.get("ztrain status x -o n", ""),
          "c: zsh `status x -o n<TAB>` gives name")
    check("wide" not in screens.get("ztrain status x -o w", "x"),
          "c: zsh `status x -o w<TAB>` never offers wide")
    check("ztrain list --state SUCCEEDED" in screens.get("ztrain list --state SUCC", ""),
          "c: zsh `list --state SUCC<TAB>` gives SUCCEEDED")
    check("ztrain validate x.json -o json" in screens.get("ztrain validate x.json -o ", ""),
          "c: zsh `validate x.json -o <TAB>` gives json, its one format")
    p = subprocess.run(["zsh", "-n"], input=script, capture_output=True, text=True)
    check(p.returncode == 0, f"c: zsh parses the script ({p.stderr.strip()})")
    descriptions = re.findall(r"^    '([a-z0-9-]+):(.*)'$", script, re.M)
    cut = [name for name, d in descriptions if d.rstrip().endswith(("(default", " a", " for a",
                                                                    ",", " the"))]
    check(len(descriptions) > 10 and not cut,
          f"c: the zsh descriptions end at a sentence's end (cut: {cut})")


def main():
    commands, globals_ = help_facts()
    check(len(commands) > 10 and len(globals_) == 5,
          f"ztrain --help lists {len(commands)} commands and {globals_}")
    with tempfile.TemporaryDirectory() as tmp:
        part_bash(tmp, commands, globals_)
        part_zsh(tmp)
    ck.finish()


if __name__ == "__main__":
    main()
