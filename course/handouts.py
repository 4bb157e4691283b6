"""Handouts: the project with each exercise's solution blanked to a stub that says what to write, the open
exercises' answers left out, and (--silent-bug) one realistic bug planted; nothing of course/ goes in one."""
import json
import re
import shutil
from pathlib import Path

import course
from course.exercises import EXERCISES, SILENT_BUGS
from course.ids import MAKE_A_SECRET, SECRET_ENV, new_handout, strong_secret, student_name
from course.lesson import CLOCK_SETTINGS, README_SEEDS


HANDOUT_FILES = ("agentic_rl.py", "envs.py", "test_agentic_rl.py", "README.md", "requirements.txt", ".ci/run", "envload.py",
                 "library.py", *(f"tools/{p.name}" for p in sorted((course.REPO / "tools").glob("*.py"))))  # the lesson's
# own files (envs.py and agentic_rl.py, whose marked regions are blanked) and what its command line needs beside it
STRIPPED = {"README.md": ("<!-- {} ANSWER -->", "<!-- {} STAFF -->")}  # regions kept from handouts: the open exercises'
ANSWER_LINE = "<!-- ANSWER LINE -->"   # answers, and what the course staff alone read (course/STAFF.md); a line ending
                                       # with ANSWER_LINE (a table's row that answers an open exercise) too


def solution_regions(text: str, name: str = "file") -> dict:
    """id -> (first, last) line index of each `# BEGIN SOLUTION id` ... `# END SOLUTION id` pair."""
    regions, open_id = {}, None
    for i, line in enumerate(text.splitlines()):
        words = line.split()
        if words[1:3] not in (["BEGIN", "SOLUTION"], ["END", "SOLUTION"]) or words[0] != "#":
            continue
        ex = words[3] if len(words) == 4 else None
        if ex not in EXERCISES:
            raise ValueError(f"{name}:{i + 1}: marker needs one known exercise id ({', '.join(EXERCISES)})")
        if words[1] == "BEGIN":
            if open_id or ex in regions:
                raise ValueError(f"{name}:{i + 1}: '{ex}' is nested in '{open_id}' or appears twice")
            open_id, regions[ex] = ex, (i, None)
        elif open_id != ex:
            raise ValueError(f"{name}:{i + 1}: END SOLUTION {ex} without its BEGIN")
        else:
            open_id, regions[ex] = None, (regions[ex][0], i)
    if open_id:
        raise ValueError(f"{name}: BEGIN SOLUTION {open_id} is never closed")
    return regions


def blank_solutions(text: str, only=None, name: str = "file") -> tuple:
    """Replace each solution region by a stub that raises, at the marker's indentation; the rest of
    the file (signatures, docstrings, validation) stays byte-identical. Returns (text, blanked ids)."""
    lines, regions = text.splitlines(keepends=True), solution_regions(text, name)
    blanked = [ex for ex in regions if only is None or ex in only]
    for ex in sorted(blanked, key=lambda e: -regions[e][0]):      # bottom up, so indices stay valid
        first, last = regions[ex]
        indent = lines[first][:len(lines[first]) - len(lines[first].lstrip())]
        stub = [f"{indent}# TODO({ex}): replace this raise with your implementation\n",
                f"{indent}raise NotImplementedError({f'{ex}: {EXERCISES[ex][1]}'!r})\n"]
        lines[first:last + 1] = stub
    return "".join(lines), blanked


def strip_marked(text: str, marker: str) -> str:
    """Drop every region from a line starting marker.format('BEGIN') to one starting marker.format('END')."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.strip().startswith((marker.format("BEGIN"), marker.format("END"))):
            inside = line.strip().startswith(marker.format("BEGIN"))
        elif not inside:
            out.append(line)
    return "".join(out)


def function_spans(text: str) -> dict:
    """qualname -> (first, last) line (1-based, decorators included) of every function in a source."""
    import ast
    spans = {}

    def visit(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")
            elif isinstance(node, ast.FunctionDef):
                spans[prefix + node.name] = (min([d.lineno for d in node.decorator_list] + [node.lineno]), node.end_lineno)
    visit(ast.parse(text).body, "")
    return spans


def answers_template(handout_id=None, seeds=README_SEEDS, exercises=tuple(EXERCISES)) -> dict:
    """answers.json as a handout ships it: the exercises it hands out (grade grades those), the keys the graded
    experiments (E3, E8) fill in, and the seeds they ask for."""
    return {**({"handout": handout_id} if handout_id else {}), "exercises": list(exercises), "seeds": list(seeds),
            "silent_bug": "",
            "silent_bug_evidence": "", "silent_bug_runs": [], "silent_bug_fixed_runs": [],
            "clock": {**{k: [] for k in CLOCK_SETTINGS}, "why": "", "runs": {}}}


def check_only(only, ids):
    unknown = set(only or ()) - set(ids)
    if unknown:
        raise ValueError(f"--only {sorted(unknown)}: unknown exercise; use {', '.join(ids)}")


def plant(text: str, bug: str) -> str:
    """agentic_rl.py's text with a silent bug planted: its line, in its function, replaced (once)."""
    _, function, written, planted, _ = SILENT_BUGS[bug]
    start, end = function_spans(text)[function]
    lines = text.splitlines(keepends=True)
    body = "".join(lines[start - 1:end])
    if body.count(written) != 1:
        raise ValueError(f"--silent-bug {bug}: its line is not in {function}() exactly once")
    return "".join(lines[:start - 1]) + body.replace(written, planted) + "".join(lines[end:])


def write_handout(out, only=None, silent_bug=None, hidden_seed=None, student=None) -> list:
    """`homework --out DIR`: copy the project with the solution regions blanked, the hidden checks, the
    grader and the open exercises' answers left out, and (--silent-bug) one realistic bug planted; its answers.json
    names the exercises handed out (grade grades those), and with
    --student and the course's secret, answers.json carries an id bound to that student, which names the bug
    to the grader only, and the experiments' seeds drawn from it. Never in place."""
    src, out = course.REPO, Path(out).resolve()
    if out == src or src in out.parents:
        raise ValueError(f"--out {out}: must be outside this repository (the reference is never overwritten)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out}: is not empty (or not a directory); choose a new directory")
    missing = [name for name in HANDOUT_FILES if not (src / name).is_file()]
    if missing:
        raise ValueError(f"{src} lacks {', '.join(missing)}: a grading installation holds only what grading needs; "
                         "write handouts from a full copy of the course's repository")
    check_only(only, EXERCISES)
    if silent_bug not in (None, *SILENT_BUGS):
        raise ValueError(f"--silent-bug {silent_bug}: use one of {', '.join(SILENT_BUGS)}")
    if student is not None and not (student_name(student) and hidden_seed):
        raise ValueError(f"--student {student!r}: an id bound to a student needs their name or email and the course's "
                         f"secret in {SECRET_ENV} (make one with {MAKE_A_SECRET})")
    handed = [ex for ex in EXERCISES if only is None or ex in only]
    handout_id, seeds = (None, README_SEEDS) if student is None else new_handout(strong_secret(hidden_seed), student,
                                                                                 silent_bug, handed)
    blanked, texts = [], {}
    for name in HANDOUT_FILES:
        texts[name] = (src / name).read_text()
        if name.endswith(".py"):
            blanked += solution_regions(texts[name], name)
            texts[name] = blank_solutions(texts[name], only, name)[0]
        for marker in STRIPPED.get(name, ()):
            texts[name] = strip_marked(texts[name], marker)
        if name in STRIPPED:                   # and no run of blank lines where a region was
            texts[name] = re.sub(r"\n{3,}", "\n\n", "".join(line for line in texts[name].splitlines(keepends=True)
                                                          if ANSWER_LINE not in line))
    if not blanked:
        raise ValueError(f"{src}: no solution regions found (is this already a handout?)")
    blanked = [ex for ex in blanked if only is None or ex in only]
    if silent_bug:
        texts["agentic_rl.py"] = plant(texts["agentic_rl.py"], silent_bug)
        texts["test_agentic_rl.py"] = strip_marked(texts["test_agentic_rl.py"], "# {} TESTS THAT NAME A SILENT BUG")
    texts["answers.json"] = json.dumps(answers_template(handout_id, seeds, handed), indent=2) + "\n"
    try:
        for name, text in texts.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
            if (src / name).exists():
                shutil.copymode(src / name, out / name)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    return blanked


def handout_text(name: str, only=None) -> str:
    """A file as every handout has it (blanks only, nothing of a solution): what a worker imports in
    place of a student file that does not compile, so that one file's syntax error costs only its own;
    with `only`, as a handout of those exercises has it (the similarity report's base)."""
    return blank_solutions((course.REPO / name).read_text(), only, name)[0]
