"""`python -m course homework ...` and `python -m course grade ...`: the course's command line."""
import argparse
import itertools
import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path

import agentic_rl as A
from course.audit import AUDIT_SECONDS, RERUN_TOLERANCE
from course.bundle import gradescope_students, write_autograder
from course.exercises import EXERCISES, SILENT_BUGS
from course.grading import SUBMISSION_FILES, grade, printable
from course.handouts import write_handout
from course.ids import SECRET_ENV
from course.report import grader_failed, gradescope_results, print_grade
from course.sandbox import IsolationMissing, missing_isolation
from course.similarity import side_by_side, similarity


SECRET_ON_THE_COMMAND_LINE = (f"--hidden-seed: a secret on the command line can be read by every process of the "
                              f"machine, a student's code among them; put it in the environment ({SECRET_ENV}) or, in "
                              "a grading installation, in hidden_seed.txt, readable by root only")


def main(argv):
    """`python -m course homework ...` and `python -m course grade ...`; the course's secret comes from the
    environment (AGENTIC_RL_HIDDEN_SEED) or the installation's hidden_seed.txt, never a flag."""
    parser = argparse.ArgumentParser(prog="python -m course", description="The course's machinery.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    p_hw = sub.add_parser("homework", help="write a student handout (or --autograder: Gradescope's zip)",
                          allow_abbrev=False)
    target = p_hw.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", help="a new directory outside this repository, for the handout")
    target.add_argument("--autograder", help="a new .zip: setup.sh, run_autograder and the grading installation "
                        f"(with the course's secret, from {SECRET_ENV})")
    p_hw.add_argument("--only", default=None, help=f"comma-separated exercise ids (default all: {', '.join(EXERCISES)})")
    p_hw.add_argument("--silent-bug", default=None, choices=("random",) + tuple(SILENT_BUGS),
                      help="plant one of the silent bugs (E8); with --student the handout's id names it to the grader "
                           "only")
    p_hw.add_argument("--student", default=None, help=f"bind the handout to this student (their email, as Gradescope "
                      f"knows it): answers.json carries an id and the experiments' seeds, made with the course's "
                      f"secret ({SECRET_ENV})")
    p_hw.add_argument("--rerun", type=float, default=None, help="with --autograder: seconds each grading spends "
                      "training experiment records again (the audit; default 600: set Gradescope's autograder timeout "
                      "to this plus 10 minutes); 0 = no audit")
    p_grade = sub.add_parser("grade", help="grade a submission (or a class of them) in a sandbox against this "
                             "installation's checks", allow_abbrev=False)
    p_grade.add_argument("dirs", nargs="*", default=["."], metavar="DIR", help="the submission's folder (default: "
                         "here); several, or one folder that holds them, grade a class: each folder's name is its "
                         "student, and every pair of students is compared")
    p_grade.add_argument("--only", default=None, help="comma-separated exercise ids (default: all)")
    p_grade.add_argument("--json", default=None, help="also write Gradescope's results.json here (a class: a folder, "
                         "one NAME.json each)")
    p_grade.add_argument("--html", default=None, help="also draw the code similarity page here: the matching code "
                         "side by side, for the course staff")
    p_grade.add_argument("--require-isolation", action="store_true", help="refuse to grade on a machine that gives "
                         "the student's code less than the whole sandbox (namespaces, cgroup, seccomp, sandbox user)")
    p_grade.add_argument("--time-limit", type=float, default=60.0, help="seconds per exercise (default 60)")
    p_grade.add_argument("--silent-bug", default=None, choices=tuple(SILENT_BUGS),
                         help="the bug planted in the handouts (those without an id)")
    whose = p_grade.add_mutually_exclusive_group()
    whose.add_argument("--student", default=None, help="whose submission this is: its handout id must be bound to them")
    whose.add_argument("--metadata", default=None, help="Gradescope's submission_metadata.json: the handout id must be "
                       "bound to one of its submitters (the bundle's run_autograder passes it)")
    p_grade.add_argument("--rerun", type=float, default=AUDIT_SECONDS, help="seconds for the audit (default "
                         f"{AUDIT_SECONDS:g}, as the bundle's): every E3 and E8 record's demonstrations recomputed, then "
                         "runs trained again, one of each experiment at random and more while the seconds last (dev "
                         f"and mean training success within {RERUN_TOLERANCE}); a record that does not reproduce zeroes "
                         "its experiment; 0 = no audit")
    for p in (p_hw, p_grade):
        p.add_argument("--hidden-seed", default=None, help=argparse.SUPPRESS)     # refused below, by name
    args = parser.parse_args(argv)
    if args.hidden_seed is not None:
        parser.error(SECRET_ON_THE_COMMAND_LINE)
    secret = os.environ.get(SECRET_ENV) or None
    only = args.only.split(",") if args.only else None
    t = time.time()
    try:
        if args.command == "homework":
            bug = random.choice(sorted(SILENT_BUGS)) if args.silent_bug == "random" else args.silent_bug
            if args.autograder:
                if args.student:
                    raise ValueError("--student: a handout is made for a student (--out), the bundle grades them all")
                rerun = AUDIT_SECONDS if args.rerun is None else args.rerun
                print(f"wrote {args.autograder}: {', '.join(write_autograder(args.autograder, only, bug, secret, rerun))}"
                      + (f"; each grading audits for up to {rerun:g} s: set Gradescope's autograder timeout to "
                         f"{rerun / 60 + 10:.0f} minutes or more" if rerun else ""))
            elif args.rerun is not None:
                raise ValueError("--rerun: the audit's seconds go into a bundle (--autograder); a handout has none")
            else:
                blanked = write_handout(args.out, only, bug, secret, args.student)
                print(f"wrote a handout to {args.out} with {len(blanked)} blanked exercises: {', '.join(blanked)}\n"
                      f"students: grep -n 'TODO(' *.py; python -m pytest -q -m homework")
            if args.student:
                print(f"its answers.json carries an id bound to {args.student!r}: grade with --student (Gradescope: "
                      "the submitter's email)" + (", and the id tells the grader which bug was planted" if bug else ""))
            elif bug:
                print(f"the planted bug is {bug!r}: keep it from the students; grade with --silent-bug {bug}")
            if args.out and secret and not args.student:
                print("no --student: this handout carries no id, so a grader holding the course's secret cannot "
                      "grade its experiments (make one per student: homework --out DIR --student NAME)")
            return
        if args.rerun < 0 or not math.isfinite(args.rerun):
            raise ValueError(f"--rerun {args.rerun}: seconds for the audit, 0 (off) or more")
        graded = submissions(args.dirs)
        if len(graded) > 1 and (args.student or args.metadata):
            raise ValueError("--student and --metadata name one submission's students; in a class, each folder's "
                             "name is its student")
        reports = {}
        for name, folder in graded.items():
            students = gradescope_students(args.metadata) if args.metadata else \
                [args.student] if args.student else [name] if len(graded) > 1 else []
            try:
                reports[name] = grade(folder, only, args.time_limit, args.silent_bug, secret, rerun_seconds=args.rerun,
                                      students=students, require_isolation=args.require_isolation)
            except Exception as e:               # in a class, one grading's failure is that student's alone
                if len(graded) == 1 or isinstance(e, (ValueError, IsolationMissing)):
                    raise
                reports[name] = {"~failed": printable(repr(e))}
    except IsolationMissing as e:                # refused before any of the student's code ran
        if args.json and len(args.dirs) == 1:
            failed = json.dumps(grader_failed("the grading machine lacks part of its sandbox", time.time() - t))
            A.atomic_write(args.json, lambda f: f.write(failed.encode()))
        parser.exit(2, f"python -m course grade: {e}\n")
    except ValueError as e:
        parser.error(str(e))
    except Exception as e:                       # the grader's own failure: say so, in results.json too
        if args.command == "grade" and args.json and len(args.dirs) == 1:
            failed = json.dumps(grader_failed(repr(e), time.time() - t)).encode()
            A.atomic_write(args.json, lambda f: f.write(failed))
        raise
    sys.exit(0 if report_class(reports, args.json, args.html, time.time() - t) else 1)


def submissions(dirs: list) -> dict:
    """name -> folder of each submission to grade: the folders given, or the folders inside the one given when it
    holds no submitted file itself (a class, as a TA downloads it); each named by its folder."""
    folders = [Path(d) for d in dirs]
    if len(folders) == 1 and folders[0].is_dir() and not any((folders[0] / n).exists() for n in SUBMISSION_FILES):
        folders = sorted(p for p in folders[0].iterdir() if p.is_dir() and not p.name.startswith(".")) or folders
    names = [f.resolve().name for f in folders]
    if len(set(names)) != len(names):
        raise ValueError(f"{' '.join(dirs)}: two submissions share a folder name; name each folder after its student")
    return dict(zip(names, folders))


def report_class(reports: dict, json_path, html_path, seconds: float) -> bool:
    """Compare every pair of a class's submissions, then print each report (the staff's lines first) and write
    results.json and the similarity page; a class run ends with one line per degraded, flagged or failed
    submission. A folder's name is shown escaped (it is the student's to choose). Returns whether every check of
    every submission passed."""
    graded = [name for name, report in reports.items() if "~failed" not in report]
    for a, b in itertools.permutations(graded, 2):
        reports[a]["~similarity"][shown(b)] = similarity(reports[a]["~own"], reports[b]["~own"])
    passed, tail = True, []
    if json_path and len(reports) > 1:
        Path(json_path).mkdir(parents=True, exist_ok=True)
    for name, report in reports.items():     # every process the submissions started is gone by now
        if len(reports) > 1:
            print(f"\n=== {shown(name)} ===")
        failed = report.get("~failed")
        if failed:
            print(f"the grader failed on this submission, not the student: {failed}")
        passed &= not failed and print_grade(report)
        if json_path:
            path = Path(json_path) / (re.sub(r"[^\w@.+-]", "_", name) + ".json") if len(reports) > 1 else Path(json_path)
            results = json.dumps(grader_failed(failed, seconds / len(reports)) if failed else
                                 gradescope_results(report, seconds / len(reports)), indent=2).encode()
            A.atomic_write(path, lambda f: f.write(results))
        if failed:
            tail.append(f"GRADER FAILED {shown(name)}: {failed}")
            continue
        missing = missing_isolation(report["~sandbox"])
        tail += [f"DEGRADED {shown(name)}: its code ran without {', '.join(missing)}"] * bool(missing)
        tail += [f"FLAGGED {shown(name)}: {sim['share']:.2f} of its own code is {against}'s" for against, sim in
                 report["~similarity"].items() if sim["flagged"]]
    if html_path:
        rows = [{"name": shown(name), "against": against, **row, "exercise": ex} for name in graded
                for against, sim in reports[name]["~similarity"].items() if sim["flagged"] or len(reports) == 1
                for ex, row in sim["exercises"].items() if row["fingerprints"]]
        page = side_by_side(f"code similarity: {len(reports)} submission{'s' * (len(reports) > 1)}", rows)
        A.atomic_write(html_path, lambda f: f.write(page.encode()))
        tail.append(f"wrote {html_path} (the matching code side by side)")
    if len(reports) > 1:
        print("\n" + "\n".join(tail or ["no submission degraded, flagged or failed"]))
    elif tail[-1:] and tail[-1].startswith("wrote"):
        print(tail[-1])
    return passed


def shown(name: str) -> str:
    """A folder's name as the TA's terminal shows it: control characters and line breaks escaped."""
    return printable(name).replace("\n", "\\n").replace("\t", "\\t")
