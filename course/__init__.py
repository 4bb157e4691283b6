"""The course's machinery around the lesson, for an instructor and their teaching assistants:

    python -m course homework --out DIR [--student NAME] [--silent-bug ID]   a student's handout
    python -m course homework --autograder OUT.zip                           Gradescope's bundle
    python -m course grade DIR [--student NAME] [--json results.json]       grade one submission

Its modules, by what they do: exercises (what the course asks), ids (the course's secret, ids bound to a
student), handouts, lesson (the visible checks, as test_agentic_rl.py writes them), checks (the hidden ones),
sandbox (where a student's code runs), grading (verdicts, the audit, the report), bundle (Gradescope), cli.
Its own tests: test_course.py (what a TA sees) and test_sandbox.py (what an attacking student tries). The
lesson's files never import it, and a handout holds nothing of it.

The grader treats the submission as hostile:
- what the submission provides is read first (a link, a special file or a huge file is refused by name);
  results are written last, after every process the submission started is gone;
- each exercise runs in a fresh worker, forked from a server that has imported torch and nothing of ours, in
  a session of its own, killed with everything it started, under a memory limit, with no new privileges, no
  user namespace and no new socket (seccomp); as root, as an unprivileged user in namespaces of its own (no
  network; its own IPC and process ids; a root holding its folder, the system's libraries and nothing else of
  the machine), which can neither read the grading installation (the grader refuses one it could read) nor
  write the results;
- only inputs cross, on a socket of its own with length-prefixed frames (prints go elsewhere, as bytes):
  never reference code or expected values. A piece that an exercise calls from another exercise (promotion
  calls sign_test_p) is answered by the grader, value by value;
- every verdict is reached in the grader's process; hidden checks carry half of each exercise's points and
  draw their inputs from the course's secret (AGENTIC_RL_HIDDEN_SEED, or the bundle's root-only
  hidden_seed.txt), so no public file is an answer key; the experiments are graded on the runs' own records,
  made with seeds drawn for each student, and no automatic point rests on evidence a guess can match: their
  points are contradicted (a number that does not drift disagrees: 0) or pending, for a person, with the
  audit's evidence beside each record (course/audit.py); a near copy of the public reference is pending too.
"""
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent   # the installation: the lesson's files, with this package beside them
