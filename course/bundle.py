"""Gradescope's autograder bundle: setup.sh and run_autograder at its root, with the grading installation (the
lesson's reference files, this package, and the course's secret), and the submitters Gradescope names."""
import json
import math
from pathlib import Path

import course
from course.exercises import EXERCISES, EXPERIMENTS, SILENT_BUGS, TIME_LIMIT
from course.handouts import check_only
from course.ids import strong_secret, student_name


AUTOGRADER_SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, in /autograder/source, to build the grading image.
set -euo pipefail
apt-get update && apt-get install -y python3 python3-pip
cd /autograder/source
flags=""   # pip 23.0+ guards the system's packages; Ubuntu 22.04's pip 22.0.2 neither needs nor knows the flag
if python3 -m pip install --help | grep -q -- --break-system-packages; then flags="--break-system-packages"; fi
python3 -m pip install $flags torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu   # has Python 3.10 wheels
python3 -m pip install $flags -r requirements.txt
id -u agentic_rl_student >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin agentic_rl_student
chmod -R go-rwx /autograder/source   # the sandbox user cannot read the grader, its checks or its secret
"""
AUTOGRADER_RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission, as root; the student's files are in /autograder/submission.
cd /autograder/source
rm -f /autograder/results/results.json
python3 -m course grade /autograder/submission --metadata /autograder/submission_metadata.json \\
  --json /autograder/results/results.json --require-isolation{only}{rerun}
status=$?
if [ ! -s /autograder/results/results.json ]; then
  echo "run_autograder: the grader wrote no results.json (exit $status): a grader failure, not the student's" >&2
  exit 1
fi
"""


def installation_files() -> list:
    """What a grading installation holds of this repository: the lesson's reference files (the grader grades
    against them and compiles its visible checks from test_agentic_rl.py) and this package, less its tests."""
    package = sorted(f"course/{p.name}" for p in (course.REPO / "course").glob("*.py")
                     if not p.name.startswith(("test_", "conftest")))
    tools = sorted(f"tools/{p.name}" for p in (course.REPO / "tools").glob("*.py") if not p.name.startswith("test_"))
    return ["agentic_rl.py", "envs.py", "envload.py", "test_agentic_rl.py", "requirements.txt", *tools, *package]


def write_autograder(path, only=None, silent_bug=None, hidden_seed=None, rerun: float = 0.0) -> list:
    """`homework --autograder OUT.zip`: Gradescope's bundle, setup.sh and run_autograder at its root
    with the grading installation (the reference, every check, the secret); it grades --only's
    exercises when given, each submission against the handout ids of its submitters (Gradescope's
    submission_metadata.json), and audits the experiments' records with `rerun` seconds of training: an
    experiment's points are 0 when contradicted, and pending review otherwise, with the audit's evidence for the
    staff (0: no audit, every experiment pending)."""
    import zipfile
    path = Path(path)
    if path.suffix != ".zip" or path.exists():
        raise ValueError(f"--autograder {path}: name a new .zip file")
    hidden_seed = hidden_seed and strong_secret(hidden_seed)
    if silent_bug not in (None, *SILENT_BUGS):
        raise ValueError(f"--silent-bug {silent_bug}: use one of {', '.join(SILENT_BUGS)}")
    check_only(only, [*EXERCISES, *EXPERIMENTS])
    if not (math.isfinite(rerun) and rerun >= 0):
        raise ValueError(f"--rerun {rerun}: seconds for the audit, 0 (off) or more")
    run = AUTOGRADER_RUN.format(only=f" --only {','.join(only)}" if only else "",
                                rerun=f" --rerun {rerun:g}")      # 0 too: grade's own default audits
    members = {"setup.sh": AUTOGRADER_SETUP, "run_autograder": run,
               **{name: (course.REPO / name).read_text() for name in installation_files()}}
    members.update({"silent_bug.txt": silent_bug + "\n"} if silent_bug else {})
    members.update({"hidden_seed.txt": hidden_seed + "\n"} if hidden_seed else {})
    try:
        with zipfile.ZipFile(path, "w") as z:
            for name, text in members.items():
                info = zipfile.ZipInfo(name)
                info.external_attr = (0o755 if name in ("setup.sh", "run_autograder") else 0o600) << 16
                z.writestr(info, text)
    except OSError as e:
        raise ValueError(f"--autograder {path}: cannot write there ({e.strerror or e})") from None
    return list(members)


def gradescope_minutes(rerun: float, time_limit: float = TIME_LIMIT) -> int:
    """The autograder timeout to set on Gradescope: a submission whose code hangs in every exercise (each costs its
    time limit once, the two files' compilers theirs), the audit's seconds, and a minute to start and write."""
    return math.ceil((time_limit * (len(EXERCISES) + 2) + rerun + 60) / 60)


def gradescope_students(path) -> list:
    """The submitters' emails in Gradescope's submission_metadata.json (several for a group): a handout id
    must be bound to one of them."""
    try:
        emails = [user["email"] for user in json.loads(Path(path).read_text())["users"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--metadata {path}: cannot read the submitters' emails (users[].email) from it "
                         f"({type(e).__name__}); name Gradescope's submission_metadata.json") from None
    if not emails or not all(isinstance(e, str) and student_name(e) for e in emails):
        raise ValueError(f"--metadata {path}: its users carry no email to bind a handout id to")
    return emails
