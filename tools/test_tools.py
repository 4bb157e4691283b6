"""The tools' specification: check-env and new-env (your own environment, the contract checked by playing),
show and play, compare, bench, and the pages (report.html, compare.html, examples --html). The lesson's own
specification is test_agentic_rl.py; this file borrows its small helpers (a tiny configuration, a finished
default run, an interrupted run).
"""
import json
import os
import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import agentic_rl as A
import envs
from envload import resolve_env
from test_agentic_rl import (TINY_FLAGS, TOK, default_runs, edited_copy, interrupted_run, make_episode, make_turn,  # noqa: F401
                             replace_cfg, small_run, tiny_config)
from test_agentic_rl import test_docstring_worked_episodes_are_real_transcripts as real_transcript
from tools import views
from tools.bench import bench
from tools.compare import compare
from tools.envcheck import LENDING_DESK, check_env_command, new_env
from tools.examples import worked_group
from tools.views import (curves_html, episode_html, held_out_groups, play, show, untrained_critic, write_compare,
                         write_page, write_report, write_run_report)


# ------------------------------------------------------------------------------------------------
# Your own environment: --env MODULE:CLASS with no edit of the project, the contract checked (check-env)
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def own_env(tmp_path, monkeypatch):
    """A working directory of its own, where the runs go and new-env writes: `desk`, a copy of the lending desk,
    importable there as `--env desk:DeskEnv`; the repository's own `library:LibraryEnv` stays importable (sys.path
    is restored afterwards, and the test's own modules forgotten)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    resolve_env.cache_clear()                          # --env strings resolve once per process: forget this test's
    new_env("desk")
    yield tmp_path
    resolve_env.cache_clear()
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "")).startswith(str(tmp_path)) or name.startswith(("broken_", "plain_env")):
            del sys.modules[name]


def test_the_lending_desk_is_a_file_check_env_passes_and_new_env_copies_it(own_env, capsys):
    import library                                   # shipped beside the lesson: from a fresh clone, no new-env first
    assert check_env_command("library:LibraryEnv", episodes=20)
    out = capsys.readouterr().out
    assert "all rules hold" in out and "FAIL" not in out and "habit 0 1.000" in out
    assert Path(library.__file__).resolve() == LENDING_DESK, "check-env checks the file new-env copies"
    copied = Path("desk.py").read_text()
    assert copied == LENDING_DESK.read_text().replace("library:LibraryEnv", "desk:DeskEnv").replace(
        "LibraryEnv", "DeskEnv").replace('"library-', '"desk-'), "the copy is library.py with its names changed"


def test_an_environment_in_its_own_file_checks_trains_evaluates_shows_and_resumes_with_no_edit(own_env, monkeypatch,
                                                                                              capsys):
    before = {f: Path(A.__file__).with_name(f).read_bytes() for f in ("agentic_rl.py", "envs.py", "library.py")}
    assert check_env_command("desk:DeskEnv", episodes=5)  # the copy passes (library.py is checked in full above)
    cfg = tiny_config(env="desk:DeskEnv", iterations=2, warm_start_episodes=40, sft_epochs=1, eval_episodes=8,
                      pass_k_tasks=2, run_dir="runs/desk")
    interrupted_run(monkeypatch, 2, cfg)                                      # Ctrl-C in iteration 2
    A.main(["train", "--resume", "runs/desk"])
    summary = json.loads(Path("runs/desk/summary.json").read_text())
    assert (summary["env"], summary["env_version"], summary["reward_version"]) == \
        ("desk:DeskEnv", "desk-1", "desk-state-1") and len(summary["train_success_curve"]) == 2
    assert Path("runs/desk/report.html").exists(), "the command line draws the run's page from its files"
    capsys.readouterr()
    A.main(["eval", "--ckpt", "runs/desk/final.pt", "--eval-episodes", "4", "--pass-k-tasks", "1"])
    assert json.loads(capsys.readouterr().out)["categories"].keys() <= {"first_good", "first_damaged"}
    A.main(["show", "--ckpt", "runs/desk/final.pt", "--n", "1", "--failures"])
    assert "=== test task" in capsys.readouterr().out
    play("desk:DeskEnv", stream=iter(["find dune"]))
    assert "desk:DeskEnv task" in capsys.readouterr().out
    assert {f: Path(A.__file__).with_name(f).read_bytes() for f in before} == before, "nothing in the project edited"
    from course.sandbox import project_imports       # the course's grader imports what the project's two files import
    assert "desk" not in project_imports(), "an environment of one's own never reaches the course's sandbox"
    sys.modules.pop("desk")                                                   # a later session, the module elsewhere:
    resolve_env.cache_clear()
    sys.path[:] = [folder for folder in sys.path if folder != os.getcwd()]
    monkeypatch.chdir(own_env.parent)
    with pytest.raises(SystemExit):
        A.main(["eval", "--ckpt", str(own_env / "runs/desk/final.pt")])
    assert "env='desk:DeskEnv': no module named 'desk' (working directory " in capsys.readouterr().err


def broken(name: str, base, **changes):
    """A subclass of `base` with one mistake (class attributes or methods), in a module of its own: MODULE:CLASS."""
    module = type(sys)(f"broken_{name}")
    setattr(module, "Env", type("Env", (base,), changes))
    sys.modules[module.__name__] = module
    return f"{module.__name__}:Env"


def test_train_names_each_mistake_of_an_environment_before_it_builds_anything(own_env, capsys):
    import library
    lib = library.LibraryEnv

    def lend_damaged_pays_minus_one(self):
        return -1.0 if self.state.lent and self.state.lent[0][1] in self.state.damaged else lib.reward(self)

    def judge_by_the_reward(env):
        return envs.Verdict(env.unwrapped.reward() == 1.0, 0, 0, 0, "")

    def no_clock(self, text):
        return text
    mistakes = {  # what is wrong -> what the refusal must name
        "a rule not declared": (dict(safety_rules=(), permission_rule=staticmethod(
            lambda task, executed, tool, args: "wrong_reader" if tool == "lend" and args[2] != task["reader"] else None)),
            "permission_rule returned 'wrong_reader', which is not in its safety_rules"),
        "a word missing": (dict(words=tuple(w for w in lib.words if w != "damaged")), "the word 'damaged' \\(in the "
                                                                                    "observation '.* damaged .* left'"),
        "max_obs_words too small": (dict(max_obs_words=5), "the longest observation has 9 words .*, above "
                                                          "max_obs_words=5: set max_obs_words = 9 or more"),
        "a reward of -1": (dict(reward=lend_damaged_pays_minus_one), "reward -1.0 after 'lend "),
        "no demonstrator": (dict(Demonstrator=None), "Env.Demonstrator = None: set a class Demonstrator"),
        "an evaluator that reads the reward": (dict(evaluate_episode=staticmethod(judge_by_the_reward)),
                                               "evaluate_episode calls reward\\(\\)"),
        "a task drawn from the env's generator": (dict(make_task=lambda self, task_id: library.draw_task(
            int(self.np_random.integers(10**6)))), "make_task and split_of must be pure functions of task_id"),
        "a split drawn from the env's generator": (dict(split_of=lambda self, task: ("train", "holdout")[
            int(self.np_random.random() < 0.2)]), "make_task and split_of must be pure functions of task_id"),
        "no holdout task": (dict(split_of=lambda self, task: "train"), "split_of gave {'train': "),
        "no clock": (dict(_with_clock=no_clock), "does not end with the turns left"),
        "a tool without its method": (dict(tool_schema={**lib.tool_schema, "renew": ("book",)}),
                                      "tool 'renew' has no method _tool_renew"),
        "a tool that raises": (dict(_tool_find=lambda self, book: 1 / 0), "raised ZeroDivisionError: division by zero "
                                                                        "\\(test_tools.py line [0-9]+"),
        "a method not written": (dict(host_view=envs.TextToolEnv.host_view), "Env does not write host_view\\(\\)"),
        "a state without the base's fields": (dict(new_state=lambda self, task: {}), "new_state returned dict: return "
                                                                                   "an object with the fields turns"),
        "a budget past the clock": (dict(max_turns=50), "Env.max_turns = 50: set an int in \\[2, 40\\]"),
        "a word with a space": (dict(words=lib.words + ("two words",)), "words must be a tuple of single words"),
        "a lending that never ends": (dict(_tool_lend=lambda self, book, shelf, reader: ("lent", False)),
                                      "solves 0 of its 3 train tasks \\(3 ended unsolved, 0 ran out"),
        "an evaluator that disagrees": (dict(evaluate_episode=staticmethod(lambda env: envs.Verdict(True, 0, 0, 0, ""))),
                                        "the evaluator and the reward disagree on [0-9]+ of the demonstrator's"),
    }
    for mistake, (changes, named) in mistakes.items():
        env = broken(re.sub(r"\W", "_", mistake), lib, **changes)
        run_dir = f"runs/{mistake.replace(' ', '_')}"
        with pytest.raises(SystemExit) as refused:
            A.main(["train", "--env", env, "--run-dir", run_dir, "--warm-start-episodes", "20"] + TINY_FLAGS[:2] + TINY_FLAGS[4:])
        assert re.search(named, f"{refused.value.code} {capsys.readouterr().err}"), mistake
        assert not Path(run_dir).exists(), f"{mistake}: refused before its run directory was made"


def test_what_is_not_a_text_tool_environment_is_refused_by_one_sentence(own_env, capsys):
    class Plain(gym.Env):
        observation_space = action_space = gym.spaces.Discrete(2)
    sys.modules["plain_env"] = type(sys)("plain_env")
    sys.modules["plain_env"].Plain, sys.modules["plain_env"].make = Plain, lambda: Plain()
    Path("needs_more.py").write_text("import nonexistent_package_xyz\n")
    for env, named in [("plain_env:Plain", "Plain is a gymnasium.Env but not an envs.TextToolEnv: subclass "
                                           "envs.TextToolEnv"),
                       ("plain_env:make", "make is not an environment class"),
                       ("plain_env:Nothing", "module plain_env has no class or registered id 'Nothing'"),
                       ("FxQuote-v0", "no gymnasium id of that name; use a registered one \\(AgenticRL/CodeRepair-v0, "
                                      "AgenticRL/FlightBooking-v0, AgenticRL/Vault-v0.*\\) or MODULE:CLASS"),
                       ("no_such_module:Env", "no module named 'no_such_module'"),
                       ("library.py:LibraryEnv", "'library.py' is not a module's name; .*no .py: library:LibraryEnv"),
                       ("elsewhere/library:LibraryEnv", "is not a module's name"),
                       ("library:LibraryENV", "has no class or registered id 'LibraryENV'; its TextToolEnv classes: "
                                              "LibraryEnv"),
                       ("library.LibraryEnv", "for class LibraryEnv of module library, write library:LibraryEnv"),
                       ("needs_more:Env", "importing needs_more failed: it imports nonexistent_package_xyz, which is "
                                          "not installed here"),
                       ("library:LibraryEnv --legs 3", "takes no `legs`")]:
        with pytest.raises(SystemExit) as refusal:
            A.main(["train", "--env"] + env.split())
        assert refusal.value.code == 2 and re.search(named, capsys.readouterr().err)
    gym.register("LendingDesk-v0", entry_point="library:LibraryEnv")  # a gymnasium id: MODULE:ID imports MODULE
    try:
        assert A.env_class("library:LendingDesk-v0").__name__ == "LibraryEnv"
        assert A.validate_config(tiny_config(env="LendingDesk-v0")).env == "LendingDesk-v0"
    finally:
        gym.registry.pop("LendingDesk-v0")
    with pytest.raises(ValueError, match="library:LibraryEnv takes no `injection_rate` .*drop --injection-rate"):
        A.validate_config(tiny_config(env="library:LibraryEnv", injection_rate=0.5))


def test_check_env_fails_a_habit_that_costs_nothing_and_notes_what_will_cost(own_env, capsys):
    import library
    lib = library.LibraryEnv

    class NoHabit(library.Librarian):  # checks the shelves whatever its habit
        def reset(self, first_obs):
            super().reset(first_obs)
            self.blind = False
    for changes, failed, said in [
            (dict(Demonstrator=NoHabit), True, "the habit costs nothing, so imitation copies nothing for RL to fix"),
            (dict(tool_cost={**lib.tool_cost, "check": 6.0}), False, "note  without its habit the demonstrator spends "
                                                                     "[0-9.]+ credits per success, with it [0-9.]+"),
            (dict(max_obs_words=150), False, "note  max_obs_words 150 is far above the longest observation played"),
            (dict(words=lib.words + tuple(f"w{i}" for i in range(2000))), False,
             "note  Env.words has 2,080 words, and the episodes played here used [0-9]+ of them")]:
        assert check_env_command(broken(re.sub(r"\W", "_", said[:12]), lib, **changes), 20) is not failed
        assert re.search(said, capsys.readouterr().out)


def test_the_meeting_scheduler_passes_check_env_and_pays_only_a_meeting_booked_without_a_denied_call(capsys):
    """tools/meeting.py, an environment of one's own with two gate rules: its reward encourages compliance (a denied
    read costs the episode's reward), its evaluator judges the meeting alone, and the gate forbids."""
    import tools
    from envload import module_file
    from tools import meeting
    from tools.meeting import earliest_free
    assert check_env_command("tools.meeting:MeetingEnv", episodes=20), capsys.readouterr().out
    assert module_file("tools.meeting", tools.__spec__) == Path(meeting.__file__).resolve(), \
        "a run's file names tools.meeting: loading it names meeting.py, not the package's __init__.py"
    cfg = A.validate_config(A.Config(env="tools.meeting:MeetingEnv"))
    for outsider, late in [(False, False), (True, False), (False, True)]:
        env, gate, _, obs = A.start_episode(cfg, 0, "train", "meet", 0, 0)
        state = env.unwrapped.state
        stranger = next(p for p in ("ana", "ben", "chen", "dara") if p not in state.invited)
        calls = [f"read {stranger}"] * outsider + [f"read {p}" for p in state.invited] + ["book 19h"] * late
        said = [A.host_step(env, gate, call)[0] for call in calls]
        assert [s.split()[:3] for s in said if s.startswith("denied")] == \
            [["denied", ":", "not_attendee"]] * outsider + [["denied", ":", "after_hours"]] * late
        _, reward, terminated, _, _, _ = A.host_step(env, gate, f"book {earliest_free(state.busy, state.invited)}")
        assert terminated and env.unwrapped.evaluate_episode(env).success, "the evaluator judges the meeting alone"
        assert reward == float(not (outsider or late)), "a call a safety rule denied costs the episode's reward"


def test_new_env_writes_a_real_worked_episode_and_refuses_a_bad_name(own_env):
    import library
    real_transcript("library:LibraryEnv", 2, library.__doc__)
    assert "class MyQuoteEnv(TextToolEnv)" in new_env("my_quote").read_text()
    for name, named in [("Quote", "lowercase"), ("my-env", "a module name"), ("my_quote", "exists"),
                        ("library", "a module named library is already importable"),
                        ("envs", "a module named envs is already importable"), ("numpy", "already importable")]:
        with pytest.raises(ValueError, match=named):
            new_env(name)


def test_a_run_names_its_environments_module_before_importing_it_and_only_from_here(default_runs, tmp_path,
                                                                                   monkeypatch, capsys):
    run = edited_copy(default_runs, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", sys.path + [str(tmp_path / "elsewhere")])    # importable, not from here
    monkeypatch.setenv("BROWSER", "true")  # had antigravity been imported, its browser would open nothing
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "planted_env.py").write_text("import pathlib\npathlib.Path('planted-ran').touch()\n")
    (tmp_path / "mine_env.py").write_text("from library import LibraryEnv as MineEnv\n")
    (tmp_path / "nspkg").mkdir()                                   # a folder without __init__.py: a namespace package
    (tmp_path / "nspkg" / "mine.py").write_text("from library import LibraryEnv as MineEnv\n")
    saved = {name: torch.load(run / name, weights_only=True) for name in ("final.pt", "state.pt")}
    saved["state.pt"]["config"]["iterations"] = 2                                   # one iteration left to resume
    for env in ("antigravity:X", "planted_env:X", "mine_env:MineEnv", "nspkg.mine:MineEnv"):
        module = env.partition(":")[0]
        assert module not in sys.modules
        for name, data in saved.items():
            torch.save({**data, "config": {**data["config"], "env": env}}, run / name)
        for argv in (["eval", "--ckpt", str(run / "final.pt")], ["show", "--ckpt", str(run / "final.pt")],
                     ["train", "--resume", str(run)]):
            with pytest.raises(SystemExit) as refused:
                A.main(argv)
            said = f"{refused.value.code} {capsys.readouterr().err}"
            if module in ("mine_env", "nspkg.mine"):  # in the working directory: said, then imported (then refused:
                file = module.replace(".", "/") + ".py"  # not its run)
                assert argv[0] != "eval" or re.search(f"its environment {env} is module {module}, imported from "
                                                      f"{re.escape(str(tmp_path.resolve()))}/{file}", said), said
                assert module in sys.modules and "Traceback" not in said, said
                continue
            assert re.search(f"it names environment '{env}', and module {module} is /.*{module}.py, outside the "
                             "working directory .* and this project's folder: a run's file may name only a module "
                             "there; nothing was imported", said), said
            assert module not in sys.modules and not Path("planted-ran").exists(), argv
    resolve_env.cache_clear()
    for module in ("mine_env", "nspkg.mine", "nspkg"):
        sys.modules.pop(module, None)


# ------------------------------------------------------------------------------------------------
# show and play
# ------------------------------------------------------------------------------------------------
def test_show_marks_the_policy_tokens_and_play_reads_a_pipe(tmp_path, capsys, monkeypatch):
    cfg = tiny_config(group_size=4)
    A.save_checkpoint(tmp_path / "p.pt", A.make_policy(cfg, len(TOK), "cpu"), TOK, cfg, 0)
    show(str(tmp_path / "p.pt"), n=1, failures=True)
    out = capsys.readouterr().out
    assert "success=False" in out and "[" in out and "advantage" in out and "gate" in out
    env = gym.make(envs.FLIGHT_ID)
    _, info = env.reset(seed=3, options={"split": "train"})
    t, state = info["task"], env.unwrapped.state
    moves = [f"search {t['from']} {t['to']}", "filter morning", "book F1 nobody economy"]
    expected = state.expected[0][0] if state.expected else None
    moves += [f"seats {expected}", f"book {expected} {t['passenger']} {t['class']}"] if expected else ["finish"]
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("\n".join(moves) + "\n"))
    A.main(["play", "--seed", "3"])
    out = capsys.readouterr().out
    assert "denied : bad_arguments" in out and "verdict: success=True" in out


def test_show_prints_what_there_is_when_no_episode_succeeds(tmp_path, capsys):
    cfg = tiny_config(group_size=2)
    A.save_checkpoint(tmp_path / "p.pt", A.make_policy(cfg, len(TOK), "cpu"), TOK, cfg, 0)
    show(str(tmp_path / "p.pt"), n=2)
    out = capsys.readouterr().out
    assert "only 0 successful episodes" in out and out.count("success=False") == 2
    with pytest.raises(ValueError, match="--n"):
        show(str(tmp_path / "p.pt"), n=0)


def test_show_refuses_a_critics_advantages_from_a_value_head_never_trained_and_judges_without_outside_cuts(
        tmp_path, capsys, monkeypatch):
    cfg = tiny_config(group_size=2)
    policy = A.make_policy(cfg, len(TOK), "cpu")
    for algo, version, credit in [("grpo", 3, "gae"), ("grpo", 3, "reinforce"), ("gae", 0, ""), ("gae", 0, "gae")]:
        A.save_checkpoint(tmp_path / "p.pt", policy, TOK, replace_cfg(cfg, algo=algo), version)
        with pytest.raises(ValueError, match=f"{algo}, policy_version {version}\\) never trained it"):
            show(str(tmp_path / "p.pt"), n=1, credit=credit)
    A.save_checkpoint(tmp_path / "p.pt", policy, TOK, replace_cfg(cfg, algo="gae"), 2)   # after RL: its own critic
    show(str(tmp_path / "p.pt"), n=1, credit="gae", failures=True)
    assert "advantage" in capsys.readouterr().out
    seen, real = [], views.rollout          # show's and report.html's groups are judged as evaluate judges, with no cut
    monkeypatch.setattr(views, "rollout", lambda policy, tok, cfg, *a, **k: seen.append(cfg.time_limit) or
                        real(policy, tok, cfg, *a, **k))
    next(held_out_groups(policy, TOK, replace_cfg(cfg, time_limit=3), 0, "test", 1))
    assert seen == [0]


def test_show_task_replays_the_greedy_episode_a_report_card_judged(default_runs, capsys):
    """A release gate's refusal names a task: show --task plays it again as evaluate did (greedy, the eval seed, no
    cut from outside), so what it shows is the episode the card counted, then that task's sampled group."""
    run = default_runs / "runs" / "flightbooking-grpo-s0"
    card = json.loads((run / "summary.json").read_text())["reports"]["candidate"]["dev"]
    for task_id, solved in zip(card["task_ids"], card["per_task"]):
        A.main(["show", "--ckpt", str(run / "candidate.pt"), "--part", "dev", "--task", str(task_id), "--n", "1"])
        out = capsys.readouterr().out
        greedy = re.search(f"=== dev task {task_id}, greedy \\(as the report card judged it\\) \\| verdict: "
                           "success=(True|False)", out)
        assert greedy and greedy.group(1) == str(bool(solved)), out
        assert f"=== dev task {task_id}, episode " in out, "then its group, with the learner's advantages"
    for task_id, part, said in [(card["task_ids"][0] + 1, "dev", "a test task (dev ids are even, test ids odd); "
                                                                  "pass --part test"),
                                (None, "test", "is a train task, not holdout")]:
        if task_id is None:  # a training task's id: found by the environment's own split rule
            raw = gym.make(envs.FLIGHT_ID).unwrapped
            task_id = next(t for t in range(1, 10**6, 2) if raw.split_of(raw.make_task(t)) == "train")
        with pytest.raises(SystemExit) as refused:
            A.main(["show", "--ckpt", str(run / "candidate.pt"), "--part", part, "--task", str(task_id)])
        assert said in str(refused.value.code) + capsys.readouterr().err


def test_show_html_refuses_a_metrics_line_whose_drawn_value_is_not_a_number(default_runs, tmp_path, capsys):
    run = edited_copy(default_runs, tmp_path)
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    (run / "metrics.jsonl").write_text(json.dumps({**metrics[0], "iteration": "0"}) + "\n")  # was a TypeError
    with pytest.raises(SystemExit, match="metrics.jsonl line 1: iteration is '0', not a number; restore it or move it"):
        A.main(["show", "--ckpt", str(run / "final.pt"), "--n", "1", "--failures", "--html"])
    (run / "metrics.jsonl").write_text(json.dumps({**metrics[0], "truncated_by": {"turn_budget": True}}) + "\n")
    with pytest.raises(ValueError, match="line 1: turn_budget is True, not a number"):
        curves_html([json.loads(line) for line in open(run / "metrics.jsonl")])
    (run / "metrics.jsonl").write_text(json.dumps(metrics[0]) + "\n")
    summary = json.loads((run / "summary.json").read_text())
    del summary["release_gates"][0]["value"]                                # was a KeyError from gates_html
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit, match="summary.json or metrics.jsonl lacks or mangles 'value'; restore or move it"):
        A.main(["show", "--ckpt", str(run / "final.pt"), "--n", "1", "--failures", "--html"])


# ------------------------------------------------------------------------------------------------
# compare and bench
# ------------------------------------------------------------------------------------------------
def test_compare_runs_every_route_from_one_warm_start(tmp_path, capsys):
    cfg = tiny_config(iterations=1, eval_episodes=6, pass_k_tasks=2, warm_start_episodes=20, sft_epochs=1)
    result = compare(cfg, [0, 1], ["grpo", "dpo"], out=str(tmp_path), progress=False)
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert set(saved["routes"]) == {"warm start", "grpo", "dpo"} == set(result["routes"])
    assert saved["routes"]["grpo"]["env_episodes"] == saved["routes"]["dpo"]["env_episodes"] == 16
    assert len(saved["routes"]["grpo"]["curves"][0]) == 1
    page = self_contained(tmp_path / "compare.html")       # compare.html: the mean and spread of each route's curves
    drawn, rows = drawn_series(page), {e["data-route"]: page.inside(e, "td") for e in page.elements if "data-route" in e}
    for route in ("grpo", "dpo"):
        curves = np.array(saved["routes"][route]["curves"])                                # (seeds, iterations)
        assert [(x, y, float(c["data-lo"]), float(c["data-hi"])) for x, y, _, c in drawn[route]] == \
            [(x, float(np.mean(col)), float(np.min(col)), float(np.max(col))) for x, col in enumerate(curves.T)]
    for route, r in saved["routes"].items():
        assert [td["text"] for td in rows[route][:4]] == [route] + [f"{r[k]:.3f}" for k in ("test_success_mean", "min", "max")]


def test_compare_gives_a_setting_to_the_routes_that_use_it_and_refuses_one_that_none_uses(monkeypatch, capsys):
    import tools.compare
    asked = []
    monkeypatch.setattr(tools.compare, "compare", lambda *ready: asked.append(ready))     # the runs are not the point
    A.main(["compare", "--seeds", "0", "--algos", "grpo,rs_sft,dpo", "--deny-credit", "shared", "--kl-coef", "0.1"])
    (cfg, seeds, algos, out), = asked
    said = capsys.readouterr().out
    assert "note: deny_credit=shared applies to grpo; the other routes run without it" in said
    routes = {algo: tools.compare.route_config(cfg, algo) for algo in algos}
    assert (routes["grpo"].deny_credit, routes["grpo"].kl_coef) == ("shared", 0.1)
    assert all((routes[a].deny_credit, routes[a].kl_coef) == (A.Config.deny_credit, 0.0) for a in ("rs_sft", "dpo"))
    with pytest.raises(SystemExit) as usage:                  # refused before a warm start, not at its route
        A.main(["compare", "--seeds", "0", "--algos", "rs_sft,dpo", "--deny-credit", "shared"])
    assert usage.value.code == 2 and "deny_credit=shared: only used with algo in grpo/stepgroup/gae/reinforce" in \
        capsys.readouterr().err and len(asked) == 1


def test_bench_quick_writes_valid_json(tmp_path, capsys):
    report = bench("cpu", quick=True, out=str(tmp_path))
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["rollout"]["kv_cache_tokens_per_s"] > 0 and saved["learner"]["ms_per_step"] > 0
    assert 140_000 < saved["reference_unit"]["parameters"] < 155_000 and saved["peak_rss_mb"] > 0


# ------------------------------------------------------------------------------------------------
# Pictures: report.html, compare.html and examples --html draw exactly the records, and nothing else
# ------------------------------------------------------------------------------------------------
class Page(__import__("html.parser").parser.HTMLParser):
    """Every element of a page: its tag, attributes, all the text inside it and its open ancestors."""

    def __init__(self, text):
        super().__init__()
        self.elements, self.open = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append({"tag": tag, **dict(attrs), "text": "", "in": list(self.open)})
        if tag not in ("meta", "br"):
            self.open.append(self.elements[-1])

    def handle_startendtag(self, tag, attrs):
        self.elements.append({"tag": tag, **dict(attrs), "text": "", "in": list(self.open)})

    def handle_endtag(self, tag):
        while self.open and self.open.pop()["tag"] != tag:
            pass

    def handle_data(self, data):
        for el in self.open:
            el["text"] += data

    def inside(self, parent, tag):
        return [e for e in self.elements if e["tag"] == tag and any(a is parent for a in e["in"])]


def self_contained(path) -> Page:
    """The page opens from disk alone: no script, no link or source but a '#' anchor, nothing fetched."""
    text = Path(path).read_text()
    page = Page(text)
    assert "http" not in text.lower() and "<script" not in text and "url(" not in text and "@import" not in text
    assert all(e[a].startswith("#") for e in page.elements for a in ("src", "href") if a in e)
    return page


def drawn_series(page) -> dict:
    """data-key -> the points of its line, [(x, y, cy, circle)], as drawn."""
    return {g["data-key"]: [(int(c["data-x"]), float(c["data-y"]), float(c["cy"]), c) for c in page.inside(g, "circle")]
            for g in page.elements if g["tag"] == "g" and "data-key" in g}


def check_heights(points):
    """A larger value is drawn higher (smaller cy), an equal one at the same height."""
    for _, y1, cy1, _ in points:
        for _, y2, cy2, _ in points:
            assert (y1 > y2) == (cy1 < cy2) and (y1 == y2) == (cy1 == cy2)


def check_report(run_dir, route_has_advantages=True):
    """report.html against the run's own files: every plotted point is its metrics.jsonl value, every gate and
    report-card line is summary.json's, and the policy tokens' log-probs are the deployed policy's own."""
    page = self_contained(run_dir / "report.html")
    metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    summary = json.loads((run_dir / "summary.json").read_text())
    series = drawn_series(page)
    for key in ("success", "dev_success", "clip_frac", "approx_kl", "entropy", "zero_std_groups", "explained_variance",
                "kl_ref", "kept", "dpo_loss"):
        measured = [(m["iteration"], m[key]) for m in metrics if m.get(key) is not None]
        assert [(x, y) for x, y, _, _ in series.get(key, [])] == measured, key
        check_heights(series.get(key, []))
    for key, points in series.items():
        if key.startswith("truncated_by."):
            assert [(x, y) for x, y, _, _ in points] == [(m["iteration"], m["truncated_by"].get(key[13:], 0)) for m in metrics]
    assert ("truncated_by" in series) == (not any(m["truncated_by"] for m in metrics))
    gates = [e for e in page.elements if "data-gate" in e]
    assert [g["data-gate"] for g in gates] == [g["gate"] for g in summary["release_gates"]]
    for row, gate in zip(gates, summary["release_gates"]):
        cells = [td["text"] for td in page.inside(row, "td")]
        assert cells[:3] == [gate["gate"], gate["value"], gate["rule"]] and cells[5] == ("pass" if gate["passed"] else "FAIL")
        for cell, number in zip(cells[3:5], (gate["observed"], gate["limit"])):
            assert cell == "\u2013" if number is None else float(cell) == pytest.approx(number, rel=1e-3, abs=1e-12)
    reports = summary["reports"]
    for row in (e for e in page.elements if "data-row" in e and e["data-row"] in ("success", "mean_turns", "safety_denials")):
        cells = [td["text"] for td in page.inside(row, "td")][2:]
        want = [reports[who][part][row["data-row"]] for part in ("dev", "test") for who in ("incumbent", "candidate")]
        assert cells == [f"{v:.3f}" if isinstance(v, float) else str(v) for v in want]
    policy, tok, cfg, version = A.load_checkpoint(run_dir / "final.pt", "cpu")
    if untrained_critic(cfg.algo, cfg.algo, version):  # a critic route rolled back: its value head never trained
        route_has_advantages = False
    episodes = [e for e in page.elements if e["tag"] == "div" and e.get("class") == "episode"]
    assert len(episodes) == min(3, summary["config"]["group_size"])
    for ep in episodes:
        assert ep["data-ending"] in ["terminated"] + [f"truncated by {c}" for c in A.CUTS]
        spans = [s for s in page.inside(ep, "span") if "data-id" in s]
        assert all(s["text"].startswith(tok.itos[int(s["data-id"])]) for s in spans)
        ids = torch.tensor([[int(s["data-id"]) for s in spans]])
        with torch.no_grad():
            logp = torch.log_softmax(policy(ids)[0][0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        acts = [(p, s) for p, s in enumerate(spans) if "act" in s["class"]]
        assert acts and all(float(s["data-logp"]) == pytest.approx(float(logp[p - 1]), abs=2e-4) for p, s in acts)
        for _, s in acts:
            if not route_has_advantages:
                assert s["data-adv"] == "None"
                continue
            r, _, b = (int(c) for c in s["style"].split("rgb(")[1].rstrip(")").split(","))
            a = float(s["data-adv"])
            assert (a > 0) <= (r > b) and (a < 0) <= (b > r)


def test_report_html_draws_the_records_and_changes_no_random_state(tmp_path, capsys):
    summary, metrics = small_run(tmp_path, "r", eval_every=2, warm_start_episodes=300)  # some success: signs to draw
    assert metrics[1]["dev_success"] is not None           # the command line draws the page after train(), so:
    assert write_run_report(tmp_path / "r" / "final.pt", "cpu") == tmp_path / "r" / "report.html"
    check_report(tmp_path / "r")
    states = lambda: (torch.get_rng_state(), np.random.get_state()[1].tolist(), __import__("random").getstate())
    policy, tok, cfg, version = A.load_checkpoint(tmp_path / "r" / "final.pt", "cpu")
    before = states()
    write_report(tmp_path / "alone" / "report.html", policy, tok, cfg, version)  # no records: the episodes only
    assert all(torch.equal(a, b) if torch.is_tensor(a) else a == b for a, b in zip(before, states()))
    assert (tmp_path / "alone" / "report.html").read_text().count("class='episode'") == 3
    A.main(["show", "--ckpt", str(tmp_path / "r" / "final.pt"), "--n", "1", "--html"])  # default: beside the checkpoint
    check_report(tmp_path / "r")
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="--html"):
        A.main(["examples", "--html", str(tmp_path / "file" / "examples.html")])


def test_examples_html_draws_the_worked_mask_and_group(tmp_path, capsys):
    A.main(["examples", "--html", str(tmp_path / "ex.html")])
    page = self_contained(tmp_path / "ex.html")
    mask = [int(e["data-mask"]) for e in page.elements if "data-mask" in e]
    assert len(mask) == 180 and sum(mask) == 60
    chips = [(e["data-algo"], float(e["data-adv"])) for e in page.elements if "data-algo" in e]
    assert chips == [(algo, a) for ep in worked_group()[0] for _, g, s in ep for algo, a in (("grpo", g), ("stepgroup", s))]


def markup(where: str) -> str:
    """Markup that would run script in a browser if a page drew it live; `where` names the field it was planted in."""
    return f"<script>alert(1)</script><img src=x onerror=alert(1) data-plant='{where}'>"


def planted(record, where=""):
    """A JSON record with every value (numbers too) and every category name replaced by a plant naming its place."""
    if isinstance(record, dict):
        return {markup(f"{where}.{k}") if where.endswith("categories") else k: planted(v, f"{where}.{k}".lstrip("."))
                for k, v in record.items()}
    if isinstance(record, list):
        return [planted(v, f"{where}.{i}") for i, v in enumerate(record)]
    return markup(where)


def nothing_live(path, drawn) -> str:
    """The page runs nothing it was handed: no script, no element and no attribute a plant brought; yet each place
    in `drawn` was drawn, as text (so the page did read the planted field). Returns the page's text."""
    page = self_contained(path)  # no "<script" anywhere in the file
    assert not [e for e in page.elements if e["tag"] in ("script", "img") or any(a.startswith("on") or a == "data-plant"
                                                                                 for a in e)], "live planted markup"
    text = __import__("html").unescape(Path(path).read_text())
    assert [w for w in drawn if markup(w) not in text] == [], "these planted fields were not drawn at all"
    return text


def test_no_page_runs_markup_planted_in_the_files_it_draws(default_runs, tmp_path, capsys):
    """show --html reads back summary.json, metrics.jsonl and the checkpoint's config from a run directory anyone
    can edit (here one whose very name is markup); compare.html and the episodes draw records and words. Markup
    planted in every field of them comes out as text, never as an element or attribute that runs."""
    run = tmp_path / "<img src=x onerror=alert('run-dir')>"
    __import__("shutil").copytree(default_runs / "runs" / "flightbooking-grpo-s0", run)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(planted(summary)))
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    (run / "metrics.jsonl").write_text("".join(json.dumps({**m, markup("key"): markup("value"), "truncated_by":
                                               {**m["truncated_by"], markup("cut"): 1}}) + "\n" for m in metrics))
    ckpt = torch.load(run / "final.pt", weights_only=True)
    ckpt["config"]["run_dir"] = str(run) + markup("config.run_dir")  # the only free-text setting (the rest are choices)
    torch.save(ckpt, run / "final.pt")
    A.main(["show", "--ckpt", str(run / "final.pt"), "--n", "1", "--failures", "--html"])
    gates = [f"release_gates.{i}.{key}" for i in range(len(summary["release_gates"]))
             for key in ("gate", "value", "rule", "observed", "limit")]
    text = nothing_live(run / "report.html", ["config.run_dir", "deployed.is", "deployed.test_success",
                                              "warm_start.test_success", "wall_seconds", "promotion_reason", *gates,
                                              "reports.incumbent.dev.success", "reports.candidate.test.ci95.0"])
    assert "onerror=alert('run-dir')" in text and markup("reports.incumbent.dev.categories.seats") in text

    tok = A.Tokenizer([markup("word")])                   # an observation, an action, a gate's reason, a cut's name
    word = tok.stoi[markup("word")]
    ep = make_episode("planted", turns=[make_turn([tok.obs, word, tok.act], [word, tok.eoa], truncated=True,
                                                  truncated_by=markup("cut"))])
    ep.turns[0].gate_allowed, ep.turns[0].gate_reason = False, markup("gate")
    write_page(tmp_path / "episode.html", "--html", markup("title"), episode_html(ep, tok, None, 1.0, 8, markup("caption")))
    nothing_live(tmp_path / "episode.html", ["word", "cut", "gate", "title", "caption"])

    record = {"test_success_mean": 0.5, "min": 0.5, "max": 0.5, "pass^k_mean": 0.5, "wall_seconds_mean": 1.0,
              "per_seed": [{"success": 0.5, "first_at_0.9": 1}]}
    result = planted({"env": envs.FLIGHT_ID, "seeds": [0], "iterations": 2, "episodes_per_iteration": 4,
                      "eval_episodes": 4, "config": {"pass_k": 1}, "routes": {"grpo": record}})
    result["routes"] = {markup("route"): {**result["routes"]["grpo"], "curves": [[0.5, 1.0]]}}  # drawn as numbers
    write_compare(tmp_path / "compare.html", result)
    nothing_live(tmp_path / "compare.html", ["route", "env", "seeds.0", "iterations", "episodes_per_iteration",
                                             "eval_episodes", "config.pass_k", *(f"routes.grpo.{key}" for key in record if key != "per_seed"),
                                             "routes.grpo.per_seed.0.success", "routes.grpo.per_seed.0.first_at_0.9"])
