#!/usr/bin/env python3
"""Runs clang-tidy (.clang-tidy's checks, warnings as errors) on attend's C++ sources.

Which sources: those changed by the commits made in the ATTEND_TIDY_HOURS hours (default 12)
before HEAD's commit, or in the last ATTEND_TIDY_COMMITS commits when that is set ("all" for
every compiled source). A fresh clone of main has no branch to compare with, so "changed" means
recent history: a landing (a session's commits, made within hours) is checked whole, however
many commits it has, while older files are not parsed again. Headers are checked through the
sources that include them (.clang-tidy's HeaderFilterRegex).

clang-tidy parses each source with gRPC's and protobuf's headers, about 12 s a file on one core,
so a clean result is remembered: the key is the clang-tidy version, .clang-tidy and the source
preprocessed with its compile command (paths under the checkout written relative to it, so a
fresh clone elsewhere hits the same key). A source whose own text or any header it includes
changed is checked again. The cache lives in ATTEND_TIDY_CACHE (default ~/.cache/attend-tidy);
findings are never cached. Exit 1 naming the findings.

Usage: scripts/tidy.py [--build DIR] [--jobs N] [FILE...]
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compiled_sources(build_dir):
  """Maps each compiled source under the checkout (generated code left out) to its entry."""
  with open(os.path.join(build_dir, "compile_commands.json")) as f:
    entries = json.load(f)
  build_abs = os.path.abspath(build_dir)
  out = {}
  for e in entries:
    path = os.path.abspath(os.path.join(e["directory"], e["file"]))
    if path.startswith(build_abs + os.sep) or not path.startswith(ROOT + os.sep):
      continue
    out[os.path.relpath(path, ROOT)] = e
  return out


def git(*args):
  return subprocess.check_output(["git", *args], cwd=ROOT, text=True).strip()


def changed_sources(commits, hours):
  """The .cc files changed since the base: `commits` commits back when given, else the newest
  commit made more than `hours` before HEAD (the whole of a session's landing, however many
  commits it has), else the first commit."""
  if commits is not None:
    total = int(git("rev-list", "--count", "HEAD"))
    base = f"HEAD~{min(commits, total - 1)}"
  else:
    head_time = int(git("log", "-1", "--format=%ct", "HEAD"))
    base = git("rev-list", "-1", f"--before={head_time - int(hours * 3600)}", "HEAD")
    if not base:
      base = git("rev-list", "--max-parents=0", "HEAD").splitlines()[0]
  out = git("diff", "--name-only", "--diff-filter=AMR", base, "HEAD", "--", "*.cc")
  return [line for line in out.splitlines() if line]


def cache_key(entry, salt):
  """The hash of the source as the compiler sees it, or None when it cannot be preprocessed."""
  args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
  pre = []
  skip = False
  for a in args:
    if skip:
      skip = False
      continue
    if a == "-o":
      skip = True
      continue
    if a == "-c":
      continue
    pre.append(a)
  pre += ["-E", "-P"]
  run = subprocess.run(pre, cwd=entry["directory"], capture_output=True)
  if run.returncode != 0:
    return None
  text = run.stdout.replace(ROOT.encode(), b"@ROOT@")
  return hashlib.sha256(salt + text).hexdigest()


def check(path, entry, build_dir, cache_dir, salt):
  """Returns (path, findings text or "", whether the cache answered)."""
  key = cache_key(entry, salt) if cache_dir else None
  stamp = os.path.join(cache_dir, key) if key else None
  if stamp and os.path.exists(stamp):
    return path, "", True
  run = subprocess.run(["clang-tidy", "-p", build_dir, "--quiet", path], cwd=ROOT,
                       capture_output=True, text=True)
  if run.returncode != 0:
    return path, run.stdout + run.stderr, False
  if stamp:
    os.makedirs(cache_dir, exist_ok=True)
    with open(stamp, "w") as f:
      f.write(path + "\n")
  return path, "", False


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--build", default=os.environ.get("ATTEND_BUILD_DIR", "build"))
  parser.add_argument("--jobs", type=int, default=int(os.environ.get("ATTEND_JOBS", os.cpu_count())))
  parser.add_argument("files", nargs="*", help="sources to check (default: recently changed)")
  args = parser.parse_args()
  os.chdir(ROOT)
  if shutil.which("clang-tidy") is None:
    sys.exit("tidy: clang-tidy is not installed (scripts/setup.sh installs it)")
  if not os.path.exists(os.path.join(args.build, "compile_commands.json")):
    sys.exit(f"tidy: {args.build}/compile_commands.json is missing: configure the build first")
  compiled = compiled_sources(args.build)
  commits = os.environ.get("ATTEND_TIDY_COMMITS", "")
  hours = float(os.environ.get("ATTEND_TIDY_HOURS", "12"))
  if args.files:
    wanted = [os.path.relpath(os.path.abspath(f), ROOT) for f in args.files]
    unknown = [f for f in wanted if f not in compiled]
    if unknown:
      sys.exit(f"tidy: not compiled in {args.build}: {', '.join(unknown)}")
    what = "named"
  elif commits == "all":
    wanted = sorted(compiled)
    what = "compiled"
  elif commits:
    wanted = [f for f in changed_sources(int(commits), None) if f in compiled]
    what = f"changed in the last {commits} commits"
  else:
    wanted = [f for f in changed_sources(None, hours) if f in compiled]
    what = f"changed in the {hours:g} hours of commits before HEAD"
  if not wanted:
    print(f"tidy: no compiled C++ source {what}")
    return 0
  cache_dir = os.environ.get("ATTEND_TIDY_CACHE",
                             os.path.join(os.path.expanduser("~"), ".cache", "attend-tidy"))
  version = subprocess.check_output(["clang-tidy", "--version"])
  with open(os.path.join(ROOT, ".clang-tidy"), "rb") as f:
    salt = version + f.read()
  print(f"tidy: {len(wanted)} sources {what}, {args.jobs} at a time", flush=True)
  failed = []
  cached = 0
  with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
    jobs = [pool.submit(check, f, compiled[f], args.build, cache_dir, salt) for f in wanted]
    for job in concurrent.futures.as_completed(jobs):
      path, findings, hit = job.result()
      cached += hit
      if findings:
        failed.append(path)
        lines = [l for l in findings.splitlines() if "error:" in l or "warning:" in l]
        print("\n".join(lines or findings.splitlines()[-20:]))
        print(f"tidy: FAILED {path}", flush=True)
  if failed:
    print(f"tidy: findings in {len(failed)} of {len(wanted)} sources (see .clang-tidy)",
          file=sys.stderr)
    return 1
  print(f"tidy: {len(wanted)} sources clean ({cached} known clean from {cache_dir})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
