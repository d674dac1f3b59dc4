"""The builds meant for other machines configure themselves as those machines need, read from
the files that make them (make's dry run and the Dockerfiles: nothing is built here; `make
test-package` builds the .deb and checks its programs, tests/package/check_portable.py):

  a. `make -n package` and `make -n install PREFIX=/opt/zt` configure a build directory of their
     own, never the development build/ (whose -march=native code dies with SIGILL on an older
     CPU, and whose ztraind looks for the dashboard in the checkout): -DZT_NATIVE=OFF,
     -DCMAKE_INSTALL_PREFIX=<prefix> and -DZT_WEB_DIR=<prefix>/share/ztrain/web, the directory
     packaging/CMakeLists.txt installs web/ into; package for /usr, made with cpack there,
     install with cmake --install of that directory.
  b. tests/package/test_package.sh makes its .deb with `make package`, so CI tests the target
     users run, and checks the packaged programs with check_portable.py.
  c. docker/Dockerfile and docker/Dockerfile.cuda: ZT_NATIVE defaults to OFF, and the build
     stage's cmake passes -DZT_WEB_DIR with the directory the runtime stage copies web/ into
     and docker/entrypoint.sh gives as --web-dir, so that `--entrypoint ztraind` and its --help
     name the image's dashboard rather than the build stage's /src/web.
"""
import os
import re
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import SRC, Checks  # noqa: E402

ck = Checks()
check = ck.check


def installed_web_dir(prefix):
    """Where packaging/CMakeLists.txt installs the dashboard under prefix (GNUInstallDirs'
    CMAKE_INSTALL_DATADIR is share)."""
    text = open(os.path.join(SRC, "packaging", "CMakeLists.txt")).read()
    m = re.search(r"install\(DIRECTORY \$\{PROJECT_SOURCE_DIR\}/web/ DESTINATION (\S+)\)", text)
    return os.path.join(prefix, m.group(1).replace("${CMAKE_INSTALL_DATADIR}", "share"))


def dry_run(*args):
    """The commands `make -n ARGS` would run, each split into words (continuations joined)."""
    out = subprocess.run(["make", "-n", "-C", SRC, "--no-print-directory", *args],
                         capture_output=True, text=True, timeout=60)
    text = out.stdout.replace("\\\n", " ")
    return out.returncode, [shlex.split(line) for line in text.splitlines() if line.strip()]


def defines(cmd):
    """-DNAME=VALUE words of a cmake command as a dict."""
    return dict(w[2:].split("=", 1) for w in cmd if w.startswith("-D") and "=" in w)


def flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


def case_a():
    for target, prefix in (("package", "/usr"), ("install", "/opt/zt")):
        rc, cmds = dry_run(target, f"PREFIX={prefix}", "JOBS=2")
        configure = [c for c in cmds if c[:1] == ["cmake"] and "-S" in c]
        check(rc == 0 and len(configure) == 1, f"a: make {target} configures one build "
              f"directory ({[' '.join(c) for c in configure]})")
        if rc or len(configure) != 1:
            continue
        c = configure[0]
        build = flag(c, "-B")
        d = defines(c)
        check(build and os.path.normpath(build) != "build",
              f"a: make {target} builds in {build}, not the development build/")
        check(d.get("ZT_NATIVE") == "OFF", f"a: make {target}: -DZT_NATIVE=OFF "
              f"(got {d.get('ZT_NATIVE')})")
        check(d.get("CMAKE_INSTALL_PREFIX") == prefix and
              d.get("ZT_WEB_DIR") == installed_web_dir(prefix),
              f"a: make {target}: prefix {prefix}, ztraind's default --web-dir "
              f"{installed_web_dir(prefix)} where packaging/ installs web/ (got "
              f"{d.get('CMAKE_INSTALL_PREFIX')}, {d.get('ZT_WEB_DIR')})")
        words = [w for cmd in cmds for w in cmd]
        if target == "package":
            check(["cmake", "--build", build] == [w for w in cmds[1][:3]] and
                  any(cmd[-3:] == ["cpack", "-G", "DEB"] for cmd in cmds) and
                  build in words[words.index("cpack") - 3:],
                  "a: make package builds there and runs cpack -G DEB there")
        else:
            check(any(cmd[:3] == ["cmake", "--install", build] and flag(cmd, "--prefix") ==
                      prefix for cmd in cmds),
                  f"a: make install installs that build into {prefix}")


def case_b():
    text = open(os.path.join(SRC, "tests", "package", "test_package.sh")).read()
    code = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    check(re.search(r"\bmake -C \S+ package\b", code) is not None and "cpack" not in code
          and "cmake -S" not in code,
          "b: test_package.sh makes the .deb with `make package`, not a build of its own")
    check("check_portable.py" in code, "b: test_package.sh checks the packaged programs with "
          "check_portable.py")


def case_c():
    entry = open(os.path.join(SRC, "docker", "entrypoint.sh")).read()
    entry_web = re.search(r"--web-dir (\S+)", entry).group(1)
    for name in ("Dockerfile", "Dockerfile.cuda"):
        text = open(os.path.join(SRC, "docker", name)).read()
        flat = text.replace("\\\n", " ")
        copied = re.search(r"^COPY web (\S+)$", text, re.M).group(1)
        configure = [l for l in flat.splitlines() if "cmake -S" in l]
        d = defines(shlex.split(configure[0][configure[0].index("cmake -S"):])) \
            if configure else {}
        check(re.search(r"^ARG ZT_NATIVE=OFF$", text, re.M) is not None and
              d.get("ZT_NATIVE") == "${ZT_NATIVE}",
              f"c: docker/{name}: ZT_NATIVE defaults to OFF and reaches cmake")
        check(d.get("ZT_WEB_DIR") == copied == entry_web,
              f"c: docker/{name}: -DZT_WEB_DIR {d.get('ZT_WEB_DIR')} is where the image has "
              f"web/ ({copied}) and the entry point's --web-dir ({entry_web})")


case_a()
case_b()
case_c()
ck.done()
