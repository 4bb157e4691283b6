"""`python -m course homework ...` and `python -m course grade ...`: the course's command line."""
import argparse
import json
import math
import os
import random
import sys
import time

import agentic_rl as A
from course.bundle import gradescope_students, write_autograder
from course.exercises import EXERCISES, SILENT_BUGS
from course.grading import (AUDIT_SECONDS, RERUN_TOLERANCE, grade, grader_failed, gradescope_results,
                            print_grade)
from course.handouts import write_handout
from course.ids import SECRET_ENV


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
    p_grade = sub.add_parser("grade", help="grade a submission in a sandbox against this installation's checks",
                             allow_abbrev=False)
    p_grade.add_argument("dir", nargs="?", default=".", help="the submission directory (default: here)")
    p_grade.add_argument("--only", default=None, help="comma-separated exercise ids (default: all)")
    p_grade.add_argument("--json", default=None, help="also write Gradescope's results.json here")
    p_grade.add_argument("--time-limit", type=float, default=60.0, help="seconds per exercise (default 60)")
    p_grade.add_argument("--silent-bug", default=None, choices=tuple(SILENT_BUGS),
                         help="the bug planted in the handouts (those without an id)")
    whose = p_grade.add_mutually_exclusive_group()
    whose.add_argument("--student", default=None, help="whose submission this is: its handout id must be bound to them")
    whose.add_argument("--metadata", default=None, help="Gradescope's submission_metadata.json: the handout id must be "
                       "bound to one of its submitters (the bundle's run_autograder passes it)")
    p_grade.add_argument("--rerun", type=float, default=0.0, help="seconds for the audit: E3's and E8's runs, one of "
                         "each chosen at random (more while the seconds last), trained again here (dev success and "
                         f"mean training success within {RERUN_TOLERANCE}); 0 = off")
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
        students = gradescope_students(args.metadata) if args.metadata else [args.student] if args.student else []
        report = grade(args.dir, only, args.time_limit, args.silent_bug, secret, rerun_seconds=args.rerun,
                       students=students)
    except ValueError as e:
        parser.error(str(e))
    except Exception as e:                       # the grader's own failure: say so, in results.json too
        if args.command == "grade" and args.json:
            failed = json.dumps(grader_failed(repr(e), time.time() - t)).encode()
            A.atomic_write(args.json, lambda f: f.write(failed))
        raise
    passed = print_grade(report)                 # every process the submission started is gone by now
    if args.json:
        A.atomic_write(args.json, lambda f: f.write(json.dumps(gradescope_results(report, time.time() - t),
                                                               indent=2).encode()))
    sys.exit(0 if passed else 1)
