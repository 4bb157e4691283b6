"""What a shortcut earns, and what a grading costs: a handout that teaches no shortcut, answers.json fields of the
wrong shape said to the student in a sentence, a forged record labelled as one, the cheap disguises of a copy seen
through (operator helpers and imports, swapped operands, padding past the budget), a hang at import paid once, and a
killed grading that leaves nothing behind."""
import ast
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import course
from course.conftest import SLOW_SANDBOX, SECRET, course_here, fill, reference_answers
from course.exercises import EXERCISES
from course.grading import grade
from course.handouts import answers_template, write_handout
from course.report import FORGED, exercises, gradescope_results
from course.similarity import own_code, own_code_within, reference_code, similarity
from course.test_course import FRESH, answers_folder, solution


# ------------------------------------------------------------------------------------------------
# The handout teaches the exercises, not their shortcuts
# ------------------------------------------------------------------------------------------------
SHORTCUTS = {  # what a fresh handout's README must not hold -> a phrase of it that the course's own documents hold
    "the fabrication recipe": ["guesses the rest", "guessed the rest"],
    "the audit's tolerances": ["within 0.05", "within 0.1", "within 0.005", "tolerance"],
    "the similarity report's blind spots": ["not flagged", "both together 0.50", "what it cannot see", "evades"],
    "the staff's document": ["STAFF.md", "BEGIN STAFF", "--rerun"],
    "E1's answer (the habit table of section 06)": ["warm start dev, greedy", "book blind when greedy",
                                                     "habit 0.3 +0.000"],
    "E4's answer (the gate's read-only rule)": ["tests_read_only"],
}


def test_a_fresh_handout_teaches_no_shortcut(tmp_path):
    """A red team's row: the handout's README printed how to make up a record the audit would pass, the audit's
    tolerances, how to disguise a copy from the similarity report, and E1's and E4's answers. A fresh handout holds
    none of them; the course's own documents (README, course/STAFF.md) still do, so each grep here can fail."""
    write_handout(tmp_path / "handout")
    handout = (tmp_path / "handout" / "README.md").read_text()
    ours = (course.REPO / "README.md").read_text() + (course.REPO / "course" / "STAFF.md").read_text()
    for what, phrases in SHORTCUTS.items():
        assert any(p in ours for p in phrases), f"the course's documents no longer hold {what}: update this test"
        found = [p for p in phrases if p in handout]
        assert not found, f"a fresh handout's README holds {what}: {found}"
    assert "## Homework" in handout and "python -m pytest -q -m homework" in handout and "E3 · The clock" in handout
    assert "ANSWER" not in handout and "STAFF" not in handout


# ------------------------------------------------------------------------------------------------
# answers.json of the wrong shape: the student's error, in a sentence
# ------------------------------------------------------------------------------------------------
BAD_FIELDS = [("exercises", [1, "returns"], '"exercises"'), ("exercises", "returns", '"exercises"'),
              ("seeds", ["0", 1, 2], '"seeds"'), ("handout", 7, '"handout"'), ("clock", [1, 2], '"clock"'),
              ("silent_bug_runs", "run", '"silent_bug_runs"'), ("silent_bug", ["x"], '"silent_bug"'),
              ("clock.runs", [1], '"clock.runs"'), ("clock.value_zero", {"a": 1}, '"clock.value_zero"'),
              ("clock.runs.value_zero", [1, 2, 3], '"clock.runs.value_zero"'), ("clock.why", 3, '"clock.why"')]


@pytest.mark.parametrize("field, value, named", BAD_FIELDS, ids=[f"{f}={json.dumps(v)}" for f, v, _ in BAD_FIELDS])
def test_an_answers_field_of_the_wrong_shape_is_the_students_error_said_in_a_sentence(tmp_path, field, value, named,
                                                                                      shared_sandbox):
    """A red team's row: "exercises": [1, "returns"] crashed the grader ("The grader failed, not your submission").
    Every field of the wrong shape is now the student's error: the experiment's checks are "wrong", with a sentence
    naming the field and the fix; never a grader error, never a crash of the grader's checks."""
    answers = reference_answers()
    *path, last = field.split(".")
    at = answers
    for part in path:
        at = at[part]
    at[last] = value
    for secret, students in ((None, ()), (SECRET, ("ana@uni.example",))):
        answers["handout"] = answers.get("handout") if field == "handout" else "0123456789ab-0123456789abcdef"
        report = exercises(grade(answers_folder(tmp_path, answers, f"sub-{bool(secret)}"), only=["clock", "silent_bug"],
                                 hidden_seed=secret, students=students))
        statuses = {c["status"] for row in report.values() for c in row["checks"]}
        assert statuses <= {"passed", "wrong", "not checked"} and "wrong" in statuses, report
        said = " ".join(c["message"] for row in report.values() for c in row["checks"])
        if secret is None or field not in ("exercises", "handout"):   # with the secret, the id does not verify first
            assert named in said and "as in the answers.json your handout came with" in said, said
        assert "Error" not in said.split("handout came with")[0][-200:], said


def test_an_edited_exercises_list_never_crashes_the_handout_id():
    from course.ids import answer_key, new_handout
    handout, _ = new_handout(SECRET, "ana@uni.example", None, ["returns"])
    for listed in ([1, "returns"], "returns", [["returns"]], {"a": 1}, None, ["returns"]):
        key = answer_key({"handout": handout, "exercises": listed}, SECRET, ["ana@uni.example"], None)
        assert (key["seeds"] is not None) == (listed == ["returns"]), (listed, key)


# ------------------------------------------------------------------------------------------------
# A forged record: "record does not match a rerun"; the exit status: graded or the grader failed
# ------------------------------------------------------------------------------------------------
def test_a_forged_record_is_labelled_as_one_and_grade_exits_0_whenever_it_graded(tmp_path, capsys, monkeypatch,
                                                                                   shared_sandbox):
    """A red team's rows: a forged record read "hard-coded answers?", and grade exited 1 whenever a check failed, so a
    script could not tell a normal class from a grader that failed. Now a contradicted record is labelled "record does
    not match a rerun", and grade exits 0 when it graded (whatever the scores), 1 when the grader failed, 2 refused."""
    monkeypatch.setattr(course.audit, "demonstrator_success", lambda warm: 0.5)       # no record's demonstrations
    monkeypatch.setattr(course.audit, "rerun", lambda *a, **k: (_ for _ in ()).throw(subprocess.TimeoutExpired("t", 1)))
    submission = answers_folder(tmp_path, reference_answers())
    code, printed = course_here(capsys, "grade", submission, "--only", "clock,silent_bug", "--silent-bug",
                                "ratio_always_one", "--json", tmp_path / "r.json")
    results = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and results["score"] == 0 and FORGED in printed and "hard-coded" not in printed, printed
    assert FORGED in results["tests"][-1]["output"]
    monkeypatch.setattr(course.cli, "grade", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    (tmp_path / "class").mkdir()
    for name in ("a", "b"):
        answers_folder(tmp_path / "class", answers_template(), name)
    code, printed = course_here(capsys, "grade", tmp_path / "class", "--rerun", "0")
    assert code == 1 and "GRADER FAILED a" in printed, printed
    monkeypatch.undo()
    assert course_here(capsys, "grade", tmp_path / "nowhere")[0] == 2


# ------------------------------------------------------------------------------------------------
# Similarity that survives the cheap attacks
# ------------------------------------------------------------------------------------------------
OPERATORS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.Pow: "pow", ast.Lt: "lt",
             ast.Gt: "gt", ast.LtE: "le", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
MIRROR = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}


class Attack(ast.NodeTransformer):
    """A copier's short ast script, one trick: "star" (operators as add(a, b) after `from operator import *`),
    "dunder" (op = __import__('operator'); op.add(a, b)), "helpers" (the student's own def add(a, b): return a + b,
    and calls of it), "swapped" (the operands of + and * swapped, a < b as b > a)."""

    def __init__(self, trick):
        self.trick = trick

    def call(self, op, *args):
        name = OPERATORS[type(op)]
        f = ast.Attribute(ast.Name("op", ast.Load()), name, ast.Load()) if self.trick == "dunder" else \
            ast.Name(name if self.trick == "star" else f"my_{name}", ast.Load())
        return ast.Call(f, list(args), [])

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if self.trick == "swapped":
            if isinstance(node.op, (ast.Add, ast.Mult)):
                node.left, node.right = node.right, node.left
            return node
        return self.call(node.op, node.left, node.right) if type(node.op) in OPERATORS else node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) != 1 or type(node.ops[0]) not in OPERATORS:
            return node
        if self.trick == "swapped":
            if type(node.ops[0]) in MIRROR:
                return ast.Compare(node.comparators[0], [MIRROR[type(node.ops[0])]()], [node.left])
            return node
        return self.call(node.ops[0], node.left, node.comparators[0])


class Methods(ast.NodeTransformer):
    """torch.F(x, ...) as x.F(...), and x.F(...) as torch.F(x, ...): the same torch call spelled the other way."""
    NAMES = {"exp", "log", "sum", "mean", "abs", "clamp", "min", "max", "std", "sqrt"}

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch" and \
                f.attr in self.NAMES and node.args:
            return ast.Call(ast.Attribute(node.args[0], f.attr, ast.Load()), node.args[1:], node.keywords)
        if isinstance(f, ast.Attribute) and f.attr in self.NAMES and not (isinstance(f.value, ast.Name) and
                                                                          f.value.id in ("torch", "np", "math")):
            return ast.Call(ast.Attribute(ast.Name("torch", ast.Load()), f.attr, ast.Load()), [f.value, *node.args],
                            node.keywords)
        return node


def attacked(lines: list, trick: str) -> list:
    tree = ast.parse("\n".join(lines))
    for one in trick.split("+"):
        tree = Methods().visit(tree) if one == "methods" else Attack(one).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)).splitlines()


PREAMBLE = {"star": "from operator import *\n", "dunder": "op = __import__('operator')\n", "swapped": "",
            "helpers": "".join(f"\n\ndef my_{name}(a, b):\n    '''{name}, my own'''\n    return a {symbol} b\n"
                               for name, symbol in [("add", "+"), ("sub", "-"), ("mul", "*"), ("truediv", "/"),
                                                    ("pow", "**"), ("lt", "<"), ("gt", ">"), ("le", "<="),
                                                    ("ge", ">="), ("eq", "=="), ("ne", "!=")])}
FOUR = ["returns", "gae", "grpo", "ppo_clip"]


def submitted(tmp_path, name, code: dict, after="", before="") -> dict:
    write_handout(tmp_path / name, only=FOUR)
    for ex in FOUR:
        fill(tmp_path / name / "agentic_rl.py", ex, code[ex] if isinstance(code[ex], list) else code[ex].splitlines())
    text = (tmp_path / name / "agentic_rl.py").read_text()
    at = text.index("\nimport ")                                    # after the module's docstring
    return {"agentic_rl.py": text[:at + 1] + before + text[at + 1:] + after}


HAND = {  # what still evades (STAFF.md): the reference's four solutions rewritten by hand, about five minutes'
        # work: the same computation, statements reordered and split, loops and torch calls written another way
"returns": """G = torch.zeros_like(r)
acc = 0.0
k = len(r) - 1
while k >= 0:
    acc = acc * gamma + r[k]
    G[k] = acc
    k -= 1
return G""",
"gae": """values_next = torch.cat([v[1:], torch.tensor([last_value if bootstrap else 0.0])])
deltas = r + gamma * values_next - v
A = torch.zeros_like(r)
carry = 0.0
for k in range(len(r) - 1, -1, -1):
    carry = deltas[k] + gamma * lam * carry
    A[k] = carry
returns = A + v
return A, returns""",
"grpo": """mean = r.mean(dim=-1, keepdim=True)
same = (r == r[..., :1]).all(dim=-1, keepdim=True)
out = torch.where(same, torch.zeros_like(r), r - mean)
if std != "none":
    out = out / (r.std(dim=-1, keepdim=True, unbiased=std == "unbiased") + eps)
return out""",
"ppo_clip": """lr = logprobs - old_logprobs
r = torch.exp(lr)
unclipped = advantages * r
clipped = advantages * torch.clamp(r, min=1 - clip_eps, max=1 + clip_eps)
objective = torch.minimum(unclipped, clipped)
loss = -(objective * mask).sum() / n
with torch.no_grad():
    deviation = (r - 1).abs()
    clip_frac = ((deviation > clip_eps).float() * mask).sum() / n
    approx_kl = (((r - 1) - lr) * mask).sum() / n
return loss, {"clip_frac": float(clip_frac), "approx_kl": float(approx_kl)}"""}

@SLOW_SANDBOX
def test_the_cheap_disguises_of_a_copy_are_flagged_and_fresh_solutions_are_not(tmp_path, capsys):
    """A red team's rows: the student's own operator helpers, `from operator import *`, `__import__('operator')` and
    swapped operands took a verbatim copy below every flag at full marks; one padding line (a 100,000-word comment, 800
    empty functions, 40,000 one-line statements) pushed it past the budget, "not compared". Each is flagged now, the
    padded ones too large to compare whole and their exercises compared alone; fresh solutions are not flagged, and
    neither is a thoughtful hand rewrite of the reference (STAFF.md: what still evades it, these shares)."""
    reference = reference_code(tuple(sorted(FOUR)))
    copies = {trick: submitted(tmp_path, trick, {ex: attacked(solution(ex), trick) for ex in FOUR},
                               before=PREAMBLE[trick] if trick != "helpers" else "", after=PREAMBLE[trick]
                               if trick == "helpers" else "") for trick in ("star", "dunder", "helpers", "swapped")}
    copies["methods+swapped"] = submitted(tmp_path, "methods", {ex: attacked(solution(ex), "methods+swapped")
                                                                for ex in FOUR})
    verbatim = {ex: solution(ex) for ex in FOUR}
    padding = {"a 100,000-word comment": "# " + " ".join(["word"] * 100_000) + "\n",
               "800 empty functions": "".join(f"\ndef pad_{i}():\n    pass\n" for i in range(800)),
               "40,000 one-line statements": "".join(f"x_{i} = {i}\n" for i in range(40_000))}
    copies.update({pad: submitted(tmp_path, f"pad{i}", verbatim, after=text) for i, (pad, text) in
                   enumerate(padding.items())})
    for name, files in copies.items():
        own = own_code_within(files, FOUR)
        sim = similarity(own, reference)
        with capsys.disabled():
            print(f"\n{name}: whole {sim['share']:.2f}; " + ", ".join(f"{ex} {r['share']:.2f}" for ex, r in
                                                                     sim["exercises"].items()) +
                  (f"; {sim['too_large']}" if sim["too_large"] else ""))
        assert sim["flagged"] and min(r["share"] for r in sim["exercises"].values()) >= 0.9, (name, sim["exercises"])
        assert not sim["not_compared"], sim["not_compared"]
    own = {}
    for student, code in [*FRESH.items(), ("a hand rewrite", HAND)]:
        own[student] = own_code(submitted(tmp_path, f"fresh-{len(own)}", code), FOUR)
        sim = similarity(own[student], reference)
        with capsys.disabled():
            print(f"\n{student}: whole {sim['share']:.2f}; " + ", ".join(f"{ex} {r['share']:.2f}" for ex, r in
                                                                        sim["exercises"].items()))
        assert not sim["flagged"], (student, sim["share"], {ex: r["share"] for ex, r in sim["exercises"].items()})
    sim = similarity(own["terse"], own["textbook"])
    with capsys.disabled():
        print(f"\nterse against textbook: whole {sim['share']:.2f}; " +
              ", ".join(f"{ex} {r['share']:.2f}" for ex, r in sim["exercises"].items()))
    assert not sim["flagged"]


def test_normalization_undoes_operator_imports_helpers_swaps_and_filler():
    """Each trick, on a few lines, normalizes to the tokens of the original (names alike: the fingerprints')."""
    from course.similarity import normalized_module, normalized_tokens
    tokens = lambda text: [t for t, _ in normalized_tokens(normalized_module(text)[0]["f"])]
    original = "import torch\n\ndef f(a, b, c):\n    if a < b:\n        return (a + b) * c - 1\n    return a\n"
    for trick in ("star", "dunder", "helpers", "swapped"):
        body = "\n".join(attacked(original.splitlines(), trick))
        text = PREAMBLE[trick] + body if trick != "helpers" else body + PREAMBLE[trick]
        text += "\n\ndef unused():\n    '''nothing'''\n    pass\n"
        text = text.replace("return a\n", "return a\n    x = 1\n    return x\n") + "\nif False:\n    y = 2\n"
        assert tokens(text) == tokens(original), (trick, text)
        assert "unused" not in normalized_module(text)[0]


@SLOW_SANDBOX
def test_a_submission_near_1_00_against_the_reference_keeps_its_points_pending(tmp_path, shared_sandbox):
    """A near copy of the public reference (1.00) keeps its points pending until a person decides, and the staff see
    it; a fresh solution scores as it passes."""
    from course.report import pending_points, score, state
    for name, code in (("copy", {"returns": solution("returns"), "gae": solution("gae")}),
                       ("fresh", {"returns": FRESH["terse"]["returns"], "gae": FRESH["terse"]["gae"]})):
        write_handout(tmp_path / name, only=["returns", "gae"])
        for ex, lines in code.items():
            fill(tmp_path / name / "agentic_rl.py", ex, lines if isinstance(lines, list) else lines.splitlines())
        report = grade(tmp_path / name, only=["returns", "gae"], time_limit=20)
        rows = exercises(report)
        staff = gradescope_results(report, 1.0)["tests"][-1]["output"]
        if name == "copy":
            assert all(state(r) == "pending" and score(r)[0] == 0 and pending_points(r) == r["points"]
                       for r in rows.values()), rows
            assert "near copy" in staff and "held for a person: pending" in staff, staff
        else:
            assert all(state(r) is None and score(r)[0] == r["points"] for r in rows.values()), rows


# ------------------------------------------------------------------------------------------------
# A hang costs each exercise its limit once; a killed grading leaves nothing behind
# ------------------------------------------------------------------------------------------------
@SLOW_SANDBOX
def test_an_endless_loop_at_import_costs_one_time_limit_not_one_per_exercise(tmp_path, shared_sandbox):
    """A red team's row: a submission that hangs at import took every exercise's time limit, one after the other
    (STAFF.md: the seconds). Its files are imported once: the first exercise pays the limit, the
    others read that they were not run again."""
    write_handout(tmp_path / "sub", only=["returns", "gae", "grpo"])
    with open(tmp_path / "sub" / "agentic_rl.py", "a") as f:
        f.write("\nwhile True:\n    pass\n")
    started = time.monotonic()
    report = exercises(grade(tmp_path / "sub", only=["returns", "gae", "grpo"], time_limit=3))
    seconds = time.monotonic() - started
    statuses = [c["status"] for row in report.values() for c in row["checks"]]
    assert set(statuses) == {"time limit"} and seconds < 3 * 2 + 4, (statuses, seconds)
    assert "not run again" in report["grpo"]["checks"][0]["message"], report["grpo"]


@SLOW_SANDBOX
def test_a_killed_grading_leaves_no_cgroup_and_no_server_behind(tmp_path, private_installation):
    """A red team's row: a grading killed mid-exercise (Gradescope's timeout, a TA's kill -9) left its workers' empty
    cgroups behind. The fork server sees its grader gone, kills what the exercise started and removes the cgroups;
    one it could not (the server killed too) the next grading removes."""
    if os.getuid() != 0:
        pytest.skip("cgroups are made as root only")
    write_handout(tmp_path / "sub", only=["kl_k3"])
    fill(tmp_path / "sub" / "agentic_rl.py", "kl_k3", ["import time", "time.sleep(600)"])
    before = set(cgroups())
    grading = subprocess.Popen([sys.executable, "-m", "course", "grade", tmp_path / "sub", "--only", "kl_k3",
                                "--rerun", "0"], cwd=private_installation, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not set(cgroups()) - before and time.monotonic() < deadline and grading.poll() is None:
        time.sleep(0.2)
    made = set(cgroups()) - before
    if not made:
        grading.kill()
        printed = grading.communicate()[0]
        if "cgroup v" not in printed:
            pytest.skip(f"no cgroup on this machine: {printed[-300:]}")
        pytest.fail(f"the grading made no cgroup that this test could see: {printed[-2000:]}")
    servers = {path.rsplit("/", 1)[1].split("-")[2] for path in made}
    grading.send_signal(signal.SIGKILL)
    grading.wait()
    deadline = time.monotonic() + 30
    while (set(cgroups()) & made or any(os.path.exists(f"/proc/{pid}") for pid in servers)) and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(cgroups()) & made and not any(os.path.exists(f"/proc/{pid}") for pid in servers)


def cgroups() -> list:
    import glob
    return glob.glob("/sys/fs/cgroup/**/agentic-rl-*-*", recursive=True)


def test_the_oom_killer_taking_a_compilers_worker_is_the_memory_limit(monkeypatch):
    """A red team's row: when the kernel's OOM killer took a worker where the grader did not expect it (the
    compiler's), the grading failed or read as another verdict. It is the memory limit, the student's file's alone."""
    from course import grading
    from course.sandbox import WorkerOutOfMemory

    def killed(*args, **kwargs):
        raise WorkerOutOfMemory("the kernel killed your code at the memory limit")
    monkeypatch.setattr(grading, "Worker", killed)
    problems = grading.compile_problems(None, {"agentic_rl.py": ("x = 1\n", None), "envs.py": ("y = 2\n", None)}, 5)
    assert {name: problem[0] for name, problem in problems.items()} == {"agentic_rl.py": "memory limit",
                                                                         "envs.py": "memory limit"}, problems


def test_a_worker_the_oom_killer_took_is_the_memory_limit_however_the_grader_learns_of_it(tmp_path):
    """The worker's socket closed under a request, or its deadline passed while a frame came in: where its cgroup
    counts an OOM kill, the verdict is the memory limit, never "your code ended its process" or "an endless loop"."""
    import socket
    import types
    from course.sandbox import GradeTimeout, Worker, WorkerGone, WorkerOutOfMemory
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    for oom_kill, expected in ((1, WorkerOutOfMemory), (0, WorkerGone)):
        (tmp_path / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
        worker = object.__new__(Worker)
        ours, theirs = socket.socketpair()
        theirs.close()
        ours.shutdown(socket.SHUT_WR)
        worker.__dict__.update(sock=ours, cgroups=[str(tmp_path)], deadline=time.monotonic() + 5, callbacks=[],
                               tail=bytearray(), asked=0, allowed=set(), broken="",
                               sandbox=types.SimpleNamespace(clean=lambda: None, memory=1 << 30))
        with pytest.raises(expected):
            worker.value(op="call", target=0, args=[])
    quiet, peer = socket.socketpair()                  # nothing comes in, and nothing closes
    worker.__dict__.update(deadline=time.monotonic() - 1, sock=quiet)
    (tmp_path / "memory.oom_control").write_text("oom_kill 1\n")
    with pytest.raises(WorkerOutOfMemory):
        worker._wait_for_a_frame()
    (tmp_path / "memory.oom_control").write_text("oom_kill 0\n")
    with pytest.raises(GradeTimeout):
        worker._wait_for_a_frame()


def test_the_similarity_page_says_who_shares_with_whom_and_who_carries_a_classmates_bug():
    """A red team's row: the page lacked the planted-bug flag, the strongest sign of a copy, and a pair of classmates
    had to be read off the index. Its first lines now say who shares with whom, each near copy of the reference and
    each submission carrying a classmate's planted bug."""
    from course.cli import who_shares
    from course.similarity import side_by_side
    sim = lambda share, flagged, large=(): {"share": share, "flagged": flagged, "too_large": list(large)}
    reports = {"ana": {"~similarity": {"the public reference": sim(0.1, False), "bob": sim(0.81, True),
                                       "cy": sim(0.2, False)}, "~bugs": {"own": None, "others": []}},
               "bob": {"~similarity": {"the public reference": sim(0.97, True, ["agentic_rl.py: too large"]),
                                       "ana": sim(0.79, True), "cy": sim(0.1, False)},
                       "~bugs": {"own": "ratio_always_one", "others": ["one_group_per_batch"]}},
               "cy": {"~similarity": {"the public reference": sim(0.05, False), "ana": sim(0.2, False),
                                      "bob": sim(0.1, False)}, "~bugs": {"own": None, "others": []}}}
    lines = who_shares(reports, list(reports))
    assert lines[0] == "who shares with whom: ana and bob (0.81 of ana's, 0.79 of bob's)" and len(lines) == 3, lines
    assert "bob shares 0.97 of its own code with the public reference; agentic_rl.py: too large" in lines
    assert any(line.startswith("bob: its agentic_rl.py carries the silent bug 'one_group_per_batch'") for line in lines)
    page = side_by_side("class", [], [], lines)
    assert "who shares with whom: ana and bob" in page and "carries the silent bug &#x27;one_group_per_batch&#x27;" in page


@SLOW_SANDBOX
def test_the_public_code_with_computed_demonstrations_and_guessed_records_earns_no_automatic_point(
        tmp_path, monkeypatch, shared_sandbox):
    """The issue's "done when": the public code, with E3's and E8's records whose demonstrations are computed (the
    audit's own recomputation, so no record is contradicted) and every other number the README's, earns 0 automatic
    experiment points under the default audit (its warm starts not trained here: the evidence, not the points, is
    what they add), and its code points wait for a person: a near copy of the reference."""
    from course.audit import AUDIT_SECONDS, audited_runs, demonstrator_success
    from course.report import pending_points, score, state
    answers = reference_answers()
    for ex in ("clock", "silent_bug"):
        for _, record, settings, _ in audited_runs(ex, answers, {"seeds": [0, 1, 2], "silent_bug": "ratio_always_one"}):
            warm = json.dumps({k: v for k, v in settings.items() if k not in ("algo", "bootstrap_budget")}, sort_keys=True)
            record["summary"]["demonstrator_success"] = demonstrator_success(warm)
    sub = answers_folder(tmp_path, answers)
    for name in ("agentic_rl.py", "envs.py"):
        (sub / name).write_text((course.REPO / name).read_text())
    monkeypatch.setattr(course.audit, "rerun", lambda *a, **k: (_ for _ in ()).throw(subprocess.TimeoutExpired("t", 1)))
    rows = exercises(grade(sub, silent_bug="ratio_always_one", rerun_seconds=AUDIT_SECONDS))
    assert sum(score(row)[0] for row in rows.values()) == 0, {ex: score(row) for ex, row in rows.items()}
    assert {ex: state(row) for ex, row in rows.items()} == {ex: "pending" for ex in rows}
    assert sum(pending_points(row) for row in rows.values()) == 132
