"""`python -m course homework ...` and `python -m course grade ...`: the course's command line."""
import argparse
import itertools
import json
import math
import os
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from course.audit import AUDIT_SECONDS, FULL_RERUN_SECONDS
from course.bundle import gradescope_minutes, gradescope_students, write_autograder
from course.exercises import EXERCISES, SILENT_BUGS, TIME_LIMIT
from course.grading import SUBMISSION_FILES, grade, printable
from course.handouts import write_handout
from course.ids import SECRET_ENV
from course.report import carried, grader_failed, gradescope_results, print_grade
from course.sandbox import IsolationMissing, missing_isolation
from course.similarity import side_by_side, similarity


SECRET_ON_THE_COMMAND_LINE = (f"--hidden-seed: a secret on the command line can be read by every process of the "
                              f"machine, a student's code among them; put it in the environment ({SECRET_ENV}) or, in "
                              "a grading installation, in hidden_seed.txt, readable by root only")


GRADED, GRADER_FAILED, REFUSED = 0, 1, 2   # grade's exit status: every submission graded (whatever it scored); the
                                         # grader failed on one or more (their results say so); refused before grading


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
                      f"on the audit (default {AUDIT_SECONDS:g}; grade --help): an experiment's points are contradicted "
                      "(0) or pending review, for the staff, with the audit's evidence; 0 = no audit, every experiment "
                      "pending review")
    p_grade = sub.add_parser("grade", help="grade a submission (or a class of them) in a sandbox against this "
                             "installation's checks", allow_abbrev=False, epilog=f"exit status: {GRADED} every "
                             f"submission was graded, whatever it scored; {GRADER_FAILED} the grader failed on one or "
                             f"more (not the students: their results say so); {REFUSED} refused before grading (a flag, "
                             "a setting or the machine)")
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
    p_grade.add_argument("--time-limit", type=float, default=TIME_LIMIT, help=f"seconds per exercise (default "
                         f"{TIME_LIMIT:g}): code that hangs costs each exercise this once")
    p_grade.add_argument("--silent-bug", default=None, choices=tuple(SILENT_BUGS),
                         help="the bug planted in the handouts (those without an id)")
    whose = p_grade.add_mutually_exclusive_group()
    whose.add_argument("--student", default=None, help="whose submission this is: its handout id must be bound to them")
    whose.add_argument("--metadata", default=None, help="Gradescope's submission_metadata.json: the handout id must be "
                       "bound to one of its submitters (the bundle's run_autograder passes it)")
    p_grade.add_argument("--rerun", type=float, default=AUDIT_SECONDS, help="seconds for the audit (default "
                         f"{AUDIT_SECONDS:g}, as the bundle's): every E3 and E8 record's demonstrations recomputed, then "
                         "the warm start of one record of each experiment, drawn at random, trained again (the two at "
                         "once, one thread each). No automatic point: an experiment's points are contradicted (0) when a "
                         "record's demonstrator success is not its settings', and pending otherwise: left to a person "
                         "with the audit's evidence beside each record, never granted, never taken. 0 = no audit: "
                         "every experiment pending")
    p_grade.add_argument("--full-rerun", action="store_true", help="also train a drawn record of each experiment whole "
                         f"again (minutes: up to {FULL_RERUN_SECONDS:g} s), its numbers beside the record's, for the "
                         "staff: evidence, never a point")
    for p in (p_hw, p_grade):
        p.add_argument("--hidden-seed", default=None, help=argparse.SUPPRESS)     # refused below, by name
    args = parser.parse_args(argv)
    if args.command != "grade":
        return run(parser, args)
    try:                                         # killed (Gradescope's timeout, a TA's kill): the sandbox's exits
        before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(GRADER_FAILED))   # run, nothing is left behind
    except ValueError:                           # not the main thread: no handler of ours
        return run(parser, args)
    try:
        return run(parser, args)
    finally:
        signal.signal(signal.SIGTERM, before)


def run(parser, args):
    """main's work, once the command line is parsed."""
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
                      + f"; Gradescope's autograder timeout must be {gradescope_minutes(rerun)} minutes or more (its "
                        f"default, 10, is {'enough' if gradescope_minutes(rerun) <= 10 else 'too short: raise it'}): "
                        "code that hangs in every exercise costs each its time limit once, and the audit its seconds")
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
        graded, skipped = submissions(args.dirs)
        class_run = len(graded) > 1 or bool(skipped)
        if class_run and (args.student or args.metadata):
            raise ValueError("--student and --metadata name one submission's students; in a class, each folder's "
                             "name is its student")
        for line in skipped:
            print(line)
        if class_run and args.json:
            Path(args.json).mkdir(parents=True, exist_ok=True)
        reports, seconds = {}, {}
        for name, folder in graded.items():
            students = gradescope_students(args.metadata) if args.metadata else \
                [args.student] if args.student else [name] if class_run else []
            started = time.time()
            try:
                reports[name] = grade(folder, only, args.time_limit, args.silent_bug, secret, rerun_seconds=args.rerun,
                                      full_rerun=args.full_rerun, students=students, require_isolation=args.require_isolation)
            except Exception as e:               # in a class, one grading's failure is that student's alone
                vanished = class_run and not folder.is_dir()
                if not class_run or isinstance(e, (ValueError, IsolationMissing)) and not vanished:
                    raise                        # the course's settings or the machine: every grading's
                reports[name] = {"~failed": f"the folder {shown(str(folder))} vanished before it was graded" if
                                 vanished else printable(repr(e)),   # the staff's; the student reads its kind alone
                                 "~kind": "its folder vanished" if vanished else type(e).__name__}
            seconds[name] = time.time() - started
            if args.json:                        # written at once: a later failure loses no one's results
                write_results(results_path(args.json, name, class_run), reports[name], seconds[name])
    except IsolationMissing as e:                # refused before any of the student's code ran
        if args.json and len(args.dirs) == 1 and not Path(args.json).is_dir():
            write_private(args.json, json.dumps(grader_failed("the grading machine lacks part of its sandbox",
                                                              time.time() - t)).encode())
        parser.exit(REFUSED, f"python -m course grade: {e}\n")
    except ValueError as e:
        parser.error(str(e))
    except Exception as e:                       # the grader's own failure: say so, in results.json too
        if args.command == "grade" and args.json and len(args.dirs) == 1 and not Path(args.json).is_dir():
            write_private(args.json, json.dumps(grader_failed(type(e).__name__, time.time() - t)).encode())
        raise
    report_class(reports, seconds, args.json, args.html, skipped)
    sys.exit(GRADER_FAILED if any("~failed" in report for report in reports.values()) else GRADED)


def submissions(dirs: list) -> tuple:
    """(name -> folder of each submission to grade, a line for each thing skipped): the folders given, or the
    folders inside the one given when it holds no submitted file itself (a class, as a TA downloads it), each
    named by its folder; there, a folder whose name starts with a dot, and anything not a folder, is named as
    skipped. Two submissions whose results would share a file (the same name, or names alike but for characters a
    file name cannot hold, or case) are refused, by both names, before anything is graded."""
    folders, skipped = [Path(d) for d in dirs], []
    if len(folders) == 1 and folders[0].is_dir() and not any((folders[0] / n).exists() for n in SUBMISSION_FILES):
        inside = sorted(folders[0].iterdir())
        skipped = [f"SKIPPED {shown(p.name)}: " + ("not a folder" if not p.is_dir() else "a folder whose name starts "
                   f"with a dot (grade it by naming it: grade {shown(str(p))})") for p in inside
                   if not p.is_dir() or p.name.startswith(".")]
        folders = [p for p in inside if p.is_dir() and not p.name.startswith(".")] or folders
        skipped = skipped if folders != [Path(dirs[0])] else []
    names, files = {}, {}
    for folder in folders:
        name = folder.resolve().name
        other = names.get(name) or files.get(results_name(name).casefold())
        if other is not None:
            raise ValueError(f"{shown(str(other))} and {shown(str(folder))}: two submissions whose results would be one "
                             f"file ({results_name(name)}); rename one of the folders (each is named after its student)")
        names[name] = files[results_name(name).casefold()] = folder
    return names, skipped


def results_name(name: str) -> str:
    """A submission's results file in a class run's --json folder."""
    return re.sub(r"[^\w@.+-]", "_", name) + ".json"


def results_path(json_path, name: str, class_run: bool) -> Path:
    return Path(json_path) / results_name(name) if class_run else Path(json_path)


def write_private(path, data: bytes):
    """Write beside `path`, then rename, readable by its owner alone (0600): results and the similarity page hold
    what the course staff alone read. A new temporary file each time, never a link someone planted."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)   # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(path, report: dict, seconds: float):
    """A submission's results.json (0600); where the grader failed, the student reads what kind of failure, never
    the grader's own objects."""
    write_private(path, json.dumps(grader_failed(report["~kind"], seconds) if "~failed" in report else
                                   gradescope_results(report, seconds), indent=2).encode())


def report_class(reports: dict, seconds: dict, json_path, html_path, skipped=()) -> bool:
    """Compare every pair of a class's submissions, then print each report (the staff's lines first) and write
    results.json again with the classmates' similarity, and the similarity page; a class run ends with one line per
    degraded, flagged, failed or skipped submission. A folder's name is shown as shown() writes it. Returns whether
    every check of every submission passed."""
    graded = [name for name, report in reports.items() if "~failed" not in report]
    for a, b in itertools.permutations(graded, 2):
        reports[a]["~similarity"][shown(b)] = similarity(reports[a]["~own"], reports[b]["~own"])
    class_run = len(reports) > 1 or bool(skipped)
    passed, tail = True, []
    for name, report in reports.items():     # every process the submissions started is gone by now
        if class_run:
            print(f"\n=== {shown(name)} ===")
        failed = report.get("~failed")
        if failed:
            print(f"the grader failed on this submission, not the student: {failed}")
        passed &= not failed and print_grade(report)
        if json_path and class_run and not failed:
            write_results(results_path(json_path, name, class_run), report, seconds[name])
        if failed:
            tail.append(f"GRADER FAILED {shown(name)}: {failed}")
            continue
        missing = missing_isolation(report["~sandbox"])
        tail += [f"DEGRADED {shown(name)}: its code ran without {', '.join(missing)}"] * bool(missing)
        tail += [f"FLAGGED {shown(name)}: {sim['share']:.2f} of its own code is {against}'s" for against, sim in
                 report["~similarity"].items() if sim["flagged"]]
        tail += [f"FLAGGED {shown(name)}: {line}" for line in carried(report)]
    tail += list(skipped)
    if html_path:
        pairs = [{"name": shown(name), "against": against, "share": sim["share"], "fingerprints": sim["fingerprints"],
                  "flagged": sim["flagged"], "not_compared": sim["not_compared"],
                  "exercises": {ex: row["share"] for ex, row in sim["exercises"].items() if row["fingerprints"]}}
                 for name in graded for against, sim in reports[name]["~similarity"].items()]
        rows = [{"name": shown(name), "against": against, **row, "exercise": ex} for name in graded
                for against, sim in reports[name]["~similarity"].items() if sim["flagged"] or len(graded) == 1
                for ex, row in sim["exercises"].items() if row["fingerprints"]]
        page = side_by_side(f"code similarity: {len(reports)} submission{'s' * (len(reports) > 1)}", pairs, rows,
                            who_shares(reports, graded))
        write_private(html_path, page.encode())
        tail.append(f"wrote {html_path} (every pair, then the matching code side by side)")
    if class_run:
        print("\n" + "\n".join(tail or ["no submission degraded, flagged, failed or skipped"]))
    elif tail[-1:] and tail[-1].startswith("wrote"):
        print(tail[-1])
    return passed


def who_shares(reports: dict, graded: list) -> list:
    """The similarity page's first lines: who shares with whom (each flagged pair once, and the near copies of the
    public reference), the submissions too large to compare whole, and the classmates' planted bugs each carries."""
    pairs, lines = {}, []
    for name in graded:
        for against, sim in reports[name]["~similarity"].items():
            if sim["flagged"] and against != "the public reference":
                pairs.setdefault(frozenset((shown(name), against)), []).append(f"{sim['share']:.2f} of {shown(name)}'s")
    lines += [f"who shares with whom: {' and '.join(sorted(pair))} ({', '.join(said)})" for pair, said in pairs.items()]
    lines += [f"{shown(name)} shares {sim['share']:.2f} of its own code with the public reference" +
              (f"; {'; '.join(sim['too_large'])}" if sim.get("too_large") else "")
              for name in graded for against, sim in reports[name]["~similarity"].items()
              if against == "the public reference" and sim["flagged"]]
    lines += [f"{shown(name)}: {line}" for name in graded for line in carried(reports[name])]
    return lines


def shown(name: str) -> str:
    """A folder's name as the TA's terminal shows it: as it is when it is plain (printable ASCII, no backslash or
    quote), else as Python's ascii() writes it, in quotes ('a\\nb', 'a\\\\nb', 'Jos\\xe9'): no control character
    reaches the terminal, and two names never look alike."""
    plain = all(" " <= c <= "~" for c in name) and not any(c in name for c in "\\'\"")
    return name if plain and name else ascii(name)
