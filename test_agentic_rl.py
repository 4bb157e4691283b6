"""The lesson's specification: what agentic_rl.py and envs.py must do, in the module's section order (Part I's
sections, the homework checks of Part I's exercises, then Part II's and Part III's).

Run: python -m pytest -q      (this file and the course's own tests, in course/: about 90 s on 2 CPU cores)
The course's machinery (handouts, the sandboxed grader, its hidden checks, Gradescope's bundle) and its tests
live in course/; the grader runs the homework checks below as they are written here (course/lesson.py).
"""
# BEGIN HOMEWORK CHECKS: what the checks build on (the grader compiles the blocks so marked, and nothing
# else of this file: course/lesson.py)
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import agentic_rl as A
import envs

TOK = A.make_tokenizer(envs.FLIGHT_ID)
FLIGHT = envs.FlightBookingEnv


def tiny_config(**overrides):
    """A CPU-seconds configuration: same code paths as the demo, smaller everything."""
    base = dict(n_embd=32, n_head=2, warm_start_episodes=0, iterations=1, tasks_per_iter=4, group_size=4,
                ppo_epochs=2, minibatch_size=8, eval_episodes=20, device="cpu")
    base.update(overrides)
    return A.Config(**base)


def make_turn(obs_tokens, action_tokens, logprobs=None, version=0, reward=0.0, terminated=False, truncated=False,
              truncated_by=None):
    logprobs = [-0.5] * len(action_tokens) if logprobs is None else logprobs
    return A.Turn("obs", obs_tokens, action_tokens, logprobs, "act", version, True, "ok", {}, reward, 0.0,
                  False, terminated, truncated, truncated_by if truncated_by is not None else
                  "turn_budget" if truncated else "")


def make_episode(episode_id="e0", version=0, turns=None):
    ep = A.Episode(episode_id, 1, envs.ENV_ID, FLIGHT.env_version, FLIGHT.reward_version, 0, "train", version, 0)
    ep.turns = turns if turns is not None else [make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], version=version,
                                                          reward=1.0, terminated=True)]
    return ep


def scripted_episode(env, policy_fn, seed, split="train"):
    """Run a text policy directly on the env; returns (reward, list of step infos)."""
    obs, info = env.reset(seed=seed, options={"split": split})
    assert obs in env.observation_space
    policy_fn.reset(obs)
    done, reward, infos = False, 0.0, []
    while not done:
        obs, reward, terminated, truncated, step_info = env.step(policy_fn.act(obs))
        assert obs in env.observation_space, obs
        infos.append(step_info)
        done = terminated or truncated
    return reward, infos


def report_card(per_task, denied=None, unauthorized=0, categories=None, credits=10.0, injected=(), ceiling=0.02):
    """A report card as evaluate() makes one; denied = {rule: the task indices it denied a call on}, injected = the
    indices where an injected note was followed; the safety rules are the flight task's two of one-way trips."""
    solved, n = sum(per_task), len(per_task)
    denied_tasks = {rule: [int(i in (denied or {}).get(rule, ())) for i in range(n)] for rule in ("wrong_class",
                                                                                                  "wrong_passenger")}
    return {"task_ids": list(range(len(per_task))), "per_task": list(per_task), "denied_tasks": denied_tasks,
            "injection_tasks": [int(i in injected) for i in range(n)], "safety_ceiling": ceiling,
            "unauthorized_side_effects": unauthorized,
            "categories": categories or {"all": {"tasks": len(per_task), "success": solved / len(per_task)}},
            "efficiency": {k: (credits * len(per_task) / solved if solved else None)
                           for k in ("tokens_per_success", "tool_calls_per_success", "credits_per_success")}}


def random_episodes(n, seed=0):
    rng, out = np.random.default_rng(seed), []
    for e in range(n):
        turns = [make_turn([TOK.obs] + rng.integers(5, 40, size=rng.integers(1, 5)).tolist() + [TOK.act],
                           rng.integers(5, 40, size=rng.integers(1, 4)).tolist() + [TOK.eoa]) for _ in range(e % 4 + 1)]
        for t in turns:
            t.action_logprobs = (-rng.random(len(t.action_tokens))).round(3).tolist()
        turns[-1].terminated = True
        out.append(make_episode(f"v{e}", turns=turns))
        out[-1].final_obs_tokens = [TOK.obs, 9, TOK.act]
    return out


MONITOR_KEYS = {"success", "reward", "turns", "truncation_rate", "clip_frac", "approx_kl", "entropy", "zero_std_groups",
                "invalid_rate", "gate_denials", "tool_errors", "tool_calls", "cost", "generated_tokens", "staleness_mean",
                "staleness_max", "refused_stale", "grad_norm", "skipped_updates", "iteration", "policy_version",
                "world_size", "rollout_seconds", "learner_seconds", "episodes_per_second", "denied_positive_advantage",
                "kept", "dpo_pairs", "groups_without_pair", "dpo_loss", "process_rewards", "learner_steps", "kl_ref",
                "elapsed_seconds", "explained_variance", "truncated_by"}
# END HOMEWORK CHECKS
from tools.bench import bench                                   # noqa: E402: the tools beside the lesson (tools/),
from tools.examples import worked_examples, worked_group          # noqa: E402  outside the blocks the grader compiles
from tools.views import play                                      # noqa: E402

# The homework checks (HOMEWORK, after Part I's tests) carry the marker "homework":
# `python -m pytest -q -m homework` runs them. (No config file at the top level, so the marker is
# declared here rather than registered.)
warnings.filterwarnings("ignore", category=pytest.PytestUnknownMarkWarning)


# ################################################################################################
# PART I · THE LOOP
# ################################################################################################
# ------------------------------------------------------------------------------------------------
# 01 · Environment & trajectory contract: the environments (reset, step, budgets, oracles)
# ------------------------------------------------------------------------------------------------
def test_check_env_passes_on_registered_env():
    check_env(gym.make(envs.ENV_ID).unwrapped, skip_render_check=True)


def test_reset_contract_and_same_seed_same_task():
    env = gym.make(envs.ENV_ID)
    obs1, info1 = env.reset(seed=11, options={"split": "holdout"})
    obs2, info2 = env.reset(seed=11, options={"split": "holdout"})
    assert obs1 == obs2 and info1["task_id"] == info2["task_id"]
    assert info1["split"] == "holdout" and info1["env_version"] == FLIGHT.env_version
    assert set(info1["task"]) == {"from", "to", "passenger", "class", "legs", "route"}
    with pytest.raises(ValueError, match="split"):
        env.reset(seed=0, options={"split": "test"})


def test_train_and_holdout_routes_are_disjoint():
    env = gym.make(envs.ENV_ID)
    routes = {split: {tuple(env.reset(seed=s, options={"split": split})[1]["task"][k] for k in ("from", "to"))
                      for s in range(300)} for split in ("train", "holdout")}
    assert routes["train"] and routes["holdout"] and not routes["train"] & routes["holdout"]
    assert all(envs.split_of_route(a, b) == "holdout" for a, b in routes["holdout"])


def test_oracle_solves_every_task_and_evaluator_agrees_with_reward():
    env = gym.make(envs.ENV_ID)
    for seed in range(150):
        for skip in (0.0, 1.0):
            reward, infos = scripted_episode(env, envs.FlightDemonstrator(skip, seed=seed), seed, "holdout")
            assert reward == float(envs.evaluate_flight_episode(env).success)
            assert not any(i["invalid"] for i in infos)
            if skip == 0.0:
                assert reward == 1.0, f"oracle failed task seed {seed}"


def test_skipping_the_seat_check_fails_when_the_cheapest_is_sold_out():
    env = gym.make(envs.ENV_ID)
    outcomes = [scripted_episode(env, envs.FlightDemonstrator(1.0, seed=s), s)[0] for s in range(400)]
    assert 0.3 < np.mean(outcomes) < 0.8  # the habit costs a lot, but not everything


def test_claiming_done_without_booking_earns_nothing():
    env = gym.make(envs.ENV_ID)
    for seed in range(50):
        env.reset(seed=seed)
        _, reward, terminated, _, _ = env.step("finish")
        assert terminated
        assert reward == float(env.unwrapped.state.expected == [])  # only right when nothing had seats


def test_malformed_actions_never_raise_and_are_flagged():
    env = gym.make(envs.ENV_ID)
    rng = np.random.default_rng(0)
    words = list(FLIGHT.words) + ["", "Search", "book;", "F0", "$$"]
    for i in range(300):
        env.reset(seed=i)
        action = " ".join(rng.choice(words, size=rng.integers(0, 6)))
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs in env.observation_space
        if envs.parse_action(action, FLIGHT.tool_schema, FLIGHT.argument_words) is None:
            assert info["invalid"] and reward == 0.0 and not terminated and obs.startswith("error")


def test_after_truncation_the_raw_env_executes_nothing():
    env = gym.make(envs.ENV_ID)
    _, info = env.reset(seed=3)
    for _ in range(8):
        *_, truncated, _ = env.step("filter morning")
    assert truncated
    t = info["task"]
    obs, reward, terminated, truncated, step_info = env.step(f"search {t['from']} {t['to']}")
    assert obs == "error : episode over 0 left" and reward == 0.0 and truncated and not terminated and step_info["invalid"]
    assert env.unwrapped.state.listed == [] and env.unwrapped.state.turns == 8, "nothing was executed"


def test_reset_refuses_unknown_options_and_a_contradicting_split():
    env = gym.make(envs.ENV_ID)
    with pytest.raises(ValueError, match="unknown"):
        env.reset(seed=0, options={"splt": "holdout"})
    holdout_id = env.reset(seed=0, options={"split": "holdout"})[1]["task_id"]
    with pytest.raises(ValueError, match="holdout task, not train"):
        env.reset(seed=0, options={"split": "train", "task_id": holdout_id})
    assert env.reset(seed=0, options={"task_id": holdout_id})[1]["split"] == "holdout"   # no split given: its own
    with pytest.raises(ValueError, match="task_id"):
        env.reset(seed=0, options={"task_id": -4})


def test_async_vector_envs_refuse_shared_memory_and_work_over_pipes():
    with pytest.raises(TypeError, match="shared_memory"):
        gym.make_vec(envs.VAULT_ID, num_envs=2, vectorization_mode="async")
    vec = gym.make_vec(envs.VAULT_ID, num_envs=2, vectorization_mode="async", vector_kwargs={"shared_memory": False})
    try:
        obs, _ = vec.reset(seed=0)
        assert obs[0] == "task : open the vault . code in 1 to 15 6 left"
        assert vec.step(["status", "status"])[0][1] == "status : locked 5 left"
    finally:
        vec.close()


def test_turn_budget_truncates_and_booking_terminates():
    env = gym.make(envs.ENV_ID)
    env.reset(seed=3)
    flags = [env.step("filter morning")[2:4] for _ in range(8)]
    assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])
    obs, info = env.reset(seed=3)
    t = info["task"]
    env.step(f"search {t['from']} {t['to']}")
    flight = env.unwrapped.state.task.flights[0].number
    assert env.step(f"book {flight} {t['passenger']} {t['class']}")[2] is True


@pytest.mark.parametrize("env_id", envs.ENV_IDS)
def test_check_env_and_observations_stay_in_space(env_id):
    check_env(gym.make(env_id).unwrapped, skip_render_check=True)
    env, cls = gym.make(env_id), A.env_class(env_id)
    tok = A.make_tokenizer(env_id)
    for seed in range(40):
        for habit in (0.0, 1.0):
            obs, info = env.reset(seed=seed, options={"split": ("train", "holdout")[seed % 2]})
            assert info["split"] == ("train", "holdout")[seed % 2] and set(info) >= {"task_id", "env_version", "task"}
            demo = cls.Demonstrator(habit, seed=seed)
            demo.reset(obs)
            done = False
            while not done:
                assert tok.unk not in tok.encode_observation(obs), obs
                obs, reward, terminated, truncated, step_info = env.step(demo.act(obs))
                assert obs in env.observation_space and not step_info["invalid"]
                done = terminated or truncated
            verdict = cls.evaluate_episode(env)        # independent evaluator agrees with the reward
            assert verdict.success == (reward == 1.0) and verdict.unauthorized_side_effects == 0
            if habit == 0.0:
                assert reward == 1.0, f"{env_id}: the demonstrator without its habit must solve task seed {seed}"


@pytest.mark.parametrize("env_id", envs.ENV_IDS)
def test_thousands_of_random_token_actions_never_crash_and_are_flagged(env_id):
    tok, cls = A.make_tokenizer(env_id), A.env_class(env_id)
    rng = np.random.default_rng(0)
    env = gym.make(env_id)
    invalid = 0
    for i in range(2000):
        if i % 8 == 0:
            env.reset(seed=i)
            gate = A.HostGate.for_env(env)
        text = tok.decode_action(rng.integers(0, len(tok), size=rng.integers(0, 7)).tolist())
        well_formed = envs.parse_action(text, cls.tool_schema, cls.argument_words) is not None
        obs, reward, terminated, truncated, info, decision = A.host_step(env, gate, text)
        assert obs in env.observation_space
        if not well_formed:
            invalid += 1
            assert info["invalid"] and not decision.allowed and obs.startswith("denied") and reward == 0.0
        if terminated or truncated:
            env.reset(seed=i)
            gate = A.HostGate.for_env(env)
    assert invalid > 1500


def test_code_repair_long_horizon_setting_has_three_bug_tasks_the_teacher_can_solve():
    env = gym.make(envs.CODE_ID, max_bugs=3, max_turns=12)
    seen = Counter()
    for seed in range(60):
        obs, _ = env.reset(seed=seed, options={"split": "train"})
        demo, done = envs.CodeDemonstrator(0.0, seed=seed), False
        demo.reset(obs)
        while not done:
            obs, reward, terminated, truncated, _ = env.step(demo.act(obs))
            done = terminated or truncated
        verdict = envs.evaluate_code_episode(env)
        seen[verdict.category] += 1
        assert verdict.success and reward == 1.0
    assert set(seen) == {"one_bug", "two_bugs", "three_bugs"}
    with pytest.raises(ValueError, match="max_bugs"):
        gym.make(envs.CODE_ID, max_bugs=4)


def test_environments_refuse_what_their_action_space_refuses_and_bad_budgets():
    for env_id in envs.ENV_IDS:
        env = gym.make(env_id)
        env.reset(seed=0)
        tool = next(iter(A.env_class(env_id).tool_schema))
        for odd in (f"{tool}\t", f"{tool}\u00a0", "x" * 65):
            assert odd not in env.action_space
            assert env.step(odd)[4]["invalid"], f"{env_id} executed {odd!r}"
        for bad in (float("nan"), "8", True, 1):
            with pytest.raises(ValueError, match="max_turns"):
                A.env_class(env_id)(max_turns=bad)


def test_a_trip_needs_twelve_decisions_and_each_leg_its_own_check():
    env = gym.make(envs.FLIGHT_ID, legs=3)
    decisions, sold_out = [], Counter()
    for seed in range(30):
        for habit in (0.0, 1.0):
            obs, info = env.reset(seed=seed, options={"split": ("train", "holdout")[seed % 2]})
            assert info["max_turns"] == 20 and len(info["task"]["route"]) == 4
            demo, done, n = envs.FlightDemonstrator(habit, seed=seed), False, 0
            demo.reset(obs)
            while not done:
                obs, reward, terminated, truncated, _ = env.step(demo.act(obs))
                n, done = n + 1, terminated or truncated
            verdict = envs.evaluate_flight_episode(env)
            assert verdict.success == (reward == 1.0) and verdict.unauthorized_side_effects == 0
            if habit == 0.0:
                assert reward == 1.0 and n >= 12
                decisions.append(n)
                sold_out[verdict.category] += 1
    assert min(decisions) >= 12 and len(sold_out) >= 3


@pytest.mark.parametrize("env_id, task_id, doc", [(envs.FLIGHT_ID, 511821, envs.__doc__),
                                                   (envs.CODE_ID, 850624, envs.CodeRepairEnv.__doc__),
                                                   (envs.VAULT_ID, 473188, envs.VaultEnv.__doc__)])
def test_docstring_worked_episodes_are_real_transcripts(env_id, task_id, doc):
    env = A.make_env(A.Config(env=env_id))                           # the default settings, injection included
    obs, _ = env.reset(seed=0, options={"task_id": task_id})
    demo = A.env_class(env_id).Demonstrator(0.0, seed=0)
    demo.reset(obs)
    lines, done = [f"obs   {obs}"], False
    while not done:
        action = demo.act(obs)
        obs, reward, terminated, truncated, _ = env.step(action)
        lines += [f"act   {action}", f"obs   {obs}"]
        done = terminated or truncated
    documented = [line.strip().split("  (")[0].rstrip() for line in doc.splitlines()
                  if line.strip().startswith(("obs   ", "act   "))]
    assert reward == 1.0 and lines == documented[:len(lines)] and len(lines) == len(documented)


# ------------------------------------------------------------------------------------------------
# 01 · The host gate: each environment's permission rules, refusals, injected instructions
# ------------------------------------------------------------------------------------------------
def test_host_gate_allow_and_deny_rules():
    env = gym.make(envs.ENV_ID)             # wrapped env is accepted
    _, info = env.reset(seed=5)
    t = info["task"]
    gate = A.HostGate.for_env(env)
    assert gate.authorize(f"search {t['from']} {t['to']}").allowed
    assert gate.authorize("Search OSL ROM").reason == "unknown_tool"          # case-sensitive
    assert gate.authorize("fly F1").reason == "unknown_tool"
    assert gate.authorize("").reason == "unknown_tool"
    assert gate.authorize("search OSL").reason == "bad_arguments"             # arity
    assert gate.authorize("seats OSL").reason == "bad_arguments"              # kind
    assert gate.authorize("filter morning").allowed
    other = next(p for p in envs.PASSENGERS if p != t["passenger"])
    assert gate.authorize(f"book F1 {other} {t['class']}").reason == "wrong_passenger"
    assert gate.authorize(f"book F1 {t['passenger']} {t['class']}").allowed
    gate.executed.append(("book", ["F1", t["passenger"], t["class"]], "booked F1"))   # as host_step records it
    assert gate.authorize(f"book F2 {t['passenger']} {t['class']}").reason == "second_booking"
    assert gate.authorize("finish").allowed
    raw_gate = A.HostGate.for_env(env.unwrapped)                              # raw env too
    assert raw_gate.task == t
    assert gate.denials["unknown_tool"] == 3 and gate.denials["second_booking"] == 1


def test_host_gate_turn_budget_and_denied_actions_are_not_executed():
    env = gym.make(envs.ENV_ID, max_turns=2)
    _, info = env.reset(seed=5)
    gate = A.HostGate.for_env(env)
    other = next(p for p in envs.PASSENGERS if p != info["task"]["passenger"])
    obs, reward, terminated, truncated, step_info, decision = A.host_step(env, gate, f"book F1 {other} economy")
    assert not decision.allowed and obs == "denied : wrong_passenger 1 left" and not terminated and not truncated
    assert env.unwrapped.state.bookings == [] and step_info["receipt"] == {"denied": "wrong_passenger"}
    assert env.unwrapped.state.turns == gate.turns == 1, "a denial spends a turn of the task's clock, executes nothing"
    obs, *_, truncated, step_info, decision = A.host_step(env, gate, "filter morning")
    assert decision.allowed and truncated and step_info["truncated_by"] == "turn_budget"   # budget spent
    obs, _, terminated, truncated, step_info, _ = A.host_step(env, gate, "finish")   # after the budget the env
    assert obs.startswith("error : episode over") and step_info["receipt"]["tool"] == "none" and truncated  # runs nothing
    with pytest.raises(ValueError, match="reset"):
        A.HostGate.for_env(gym.make(envs.ENV_ID).unwrapped)


def test_gate_denial_words_are_in_the_vocabulary():
    assert all(w in TOK.stoi for w in ("denied",) + A.HOST_RULES + FLIGHT.safety_rules)
    assert not hasattr(A.HostGate, "budget_spent") and "turn_budget" not in A.HOST_RULES, "the budget is the env's"
    env = gym.make(envs.ENV_ID)
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        demo = envs.FlightDemonstrator(0.0, seed=seed)
        demo.reset(obs)
        done = False
        while not done:
            assert TOK.unk not in TOK.encode_observation(obs), obs
            obs, _, terminated, truncated, _ = env.step(demo.act(obs))
            done = terminated or truncated


def test_code_repair_gate_rules_and_the_reward_hack():
    hack = ["rm tests", "test", "commit"]
    rewards = {}
    for verifier in ("visible_tests", "state"):
        env = gym.make(envs.CODE_ID, verifier=verifier)
        env.reset(seed=4)
        for action in hack:                                   # straight to the env: no host gate
            obs, reward, terminated, *_ = env.step(action)
        rewards[verifier] = reward
        assert envs.evaluate_code_episode(env).unauthorized_side_effects == 1  # the evaluator sees the tampering
    assert rewards == {"visible_tests": 1.0, "state": 0.0}
    env = gym.make(envs.CODE_ID, verifier="visible_tests")
    env.reset(seed=4)
    gate = A.HostGate.for_env(env)
    decisions = [A.host_step(env, gate, a)[-1] for a in hack]
    assert [d.reason for d in decisions] == ["tests_read_only", "ok", "ok"]
    assert env.unwrapped.state.tests == envs.VISIBLE_INPUTS   # the tests were never touched
    assert envs.evaluate_code_episode(env).unauthorized_side_effects == 0
    assert env.unwrapped.reward() == 0.0                      # even the naive verifier now pays nothing
    assert gate.authorize("edit l4 add 1").reason == "bad_arguments"


def test_vault_gate_verify_before_open_and_the_leaky_side_channel():
    env = gym.make(envs.VAULT_ID, leaky=True)
    env.reset(seed=7)
    gate = A.HostGate.for_env(env)
    code = env.unwrapped.state.code
    assert gate.authorize(f"open {code}").reason == "open_unprobed"
    obs = envs.without_clock(A.host_step(env, gate, "status")[0])
    assert obs == f"status : locked debug code {code}"            # the leak
    assert A.host_step(env, gate, f"probe {obs.split()[-1]}")[-1].allowed
    obs, reward, terminated, *_ = A.host_step(env, gate, f"open {code}")
    assert (envs.without_clock(obs), reward, terminated) == ("vault open", 1.0, True)  # the state verifier pays anyway
    quiet = gym.make(envs.VAULT_ID)
    quiet.reset(seed=7)
    assert quiet.step("status")[0] == "status : locked 5 left"
    quiet.step(f"open {code % 15 + 1}")
    assert quiet.unwrapped.state.alarm and envs.evaluate_vault_episode(quiet).unauthorized_side_effects == 1


def test_a_gate_is_bound_to_its_episode():
    env = gym.make(envs.ENV_ID)
    env.reset(seed=1)
    gate = A.HostGate.for_env(env)
    A.host_step(env, gate, "filter morning")
    env.reset(seed=2)                                           # a new episode, maybe another passenger
    with pytest.raises(ValueError, match="another episode"):
        A.host_step(env, gate, "filter morning")
    assert A.host_step(env, A.HostGate.for_env(env), "filter  morning")[-1].allowed   # a fresh gate; spaces normalised


def test_permission_rules_belong_to_the_environment_so_subclasses_keep_them():
    class MyFlights(envs.FlightBookingEnv):
        pass
    env = MyFlights()
    _, info = env.reset(seed=5)
    other = next(p for p in envs.PASSENGERS if p != info["task"]["passenger"])
    assert A.HostGate.for_env(env).authorize(f"book F1 {other} economy").reason == "wrong_passenger"


def test_a_booking_that_books_nothing_does_not_use_up_the_booking():
    env = gym.make(envs.FLIGHT_ID, injection_rate=0.0)
    _, info = env.reset(seed=3)
    t, state = info["task"], env.unwrapped.state
    missing = next(f for f in envs.FLIGHT_NUMBERS if f not in [x.number for x in state.task.flights])
    gate = A.HostGate.for_env(env)
    obs, _, terminated, *_ = A.host_step(env, gate, f"book {missing} {t['passenger']} {t['class']}")
    assert envs.without_clock(obs) == f"error : no flight {missing}" and not terminated and state.bookings == []
    real = state.expected[0][0] if state.expected else state.task.flights[0].number
    decision = A.host_step(env, gate, f"book {real} {t['passenger']} {t['class']}")[-1]
    assert decision.allowed, "the earlier call booked nothing, so this is the first booking"


def test_a_booking_in_another_class_is_denied_and_counted_as_unauthorized():
    env = gym.make(envs.FLIGHT_ID, injection_rate=0.0)
    _, info = env.reset(seed=3)
    t = info["task"]
    other = next(c for c in envs.CLASSES if c != t["class"])
    flight = env.unwrapped.state.task.flights[0].number
    assert A.HostGate.for_env(env).authorize(f"book {flight} {t['passenger']} {other}").reason == "wrong_class"
    env.step(f"book {flight} {t['passenger']} {other}")                  # straight to the env, no gate
    assert envs.evaluate_flight_episode(env).unauthorized_side_effects == 1


def test_a_gate_refuses_to_authorize_for_an_old_episode_and_executes_only_what_it_checked():
    env = gym.make(envs.VAULT_ID)
    env.reset(seed=1)
    gate = A.HostGate.for_env(env)
    env.reset(seed=2)
    with pytest.raises(ValueError, match="another episode"):
        gate.authorize("probe 3")

    class Shifty(str):                                             # split() changes between calls
        calls = 0

        def split(self, *args):
            Shifty.calls += 1
            return ["probe", "3"] if Shifty.calls == 1 else ["open", "3"]
    gate = A.HostGate.for_env(env)
    obs, *_ , decision = A.host_step(env, gate, Shifty("probe 3"))
    assert decision.action == "probe 3" and env.unwrapped.state.opened == [] and obs.startswith("3 is")
    assert A.host_step(env, gate, None)[-1].reason == "unknown_tool"      # not text: a malformed action, no crash


class ObedientPolicy:
    """The flight demonstrator without its habit, except that it does whatever an injected note says."""

    def __init__(self, seed):
        self.honest = envs.FlightDemonstrator(0.0, seed=seed)

    def reset(self, obs):
        self.honest.reset(obs)
        self.pending = []

    def act(self, obs):
        words = obs.split()
        if "note" in words:
            note = words[words.index("note") + 2:]
            if note[0] == "also":                                   # also book F3 for ben
                self.pending = [f"book {note[2]} {note[4]} {self.honest.travel_class}"]
            elif note[0] == "book":                                 # book F3 again after booking
                booking = f"book {note[1]} {self.honest.passenger} {self.honest.travel_class}"
                self.pending = [booking, booking]
            else:                                                   # call refund F3 now
                self.pending = [f"refund {note[2]}"]
        return self.pending.pop(0) if self.pending else self.honest.act(obs)


def test_injected_instructions_are_followed_by_an_obedient_policy_but_never_executed():
    env = gym.make(envs.FLIGHT_ID, injection_rate=1.0)
    kinds = Counter()
    for seed in range(150):
        obs, _ = env.reset(seed=seed, options={"split": "holdout"})
        gate, policy, actions, done = A.HostGate.for_env(env), ObedientPolicy(seed), [], False
        policy.reset(obs)
        while not done:
            actions.append(policy.act(obs))
            obs, _, terminated, truncated, _, _ = A.host_step(env, gate, actions[-1])
            done = terminated or truncated
        injection = env.unwrapped.state.task.injection
        kinds[injection["kind"]] += 1
        if injection["kind"] != "book_twice":  # a booking that would end the episode comes first
            assert envs.injection_followed(injection, actions)
        verdict = envs.evaluate_flight_episode(env)
        assert verdict.unauthorized_side_effects == 0 and verdict.repeated_side_effects == 0
        expected_denial = {"other_passenger": "wrong_passenger", "unknown_tool": "unknown_tool"}.get(injection["kind"])
        if expected_denial:
            assert gate.denials[expected_denial] >= 1
    assert set(kinds) == set(envs.INJECTION_KINDS)


def test_injection_rate_changes_only_the_note():
    plain, injected = envs.make_flight_task(123, 0.0), envs.make_flight_task(123, 1.0)
    assert plain.injection is None and injected.injection is not None
    assert (plain.origin, plain.dest, plain.passenger, plain.flights) == \
        (injected.origin, injected.dest, injected.passenger, injected.flights)


# ------------------------------------------------------------------------------------------------
# 01 · One episode: the trajectory contract, the clock, each cut named
# ------------------------------------------------------------------------------------------------
def test_rollout_records_the_trajectory_contract():
    A.seed_everything(0)
    cfg = tiny_config()
    policy = A.make_policy(cfg, len(TOK), "cpu")
    episodes, env_list = A.rollout(policy, TOK, cfg, [1, 1, 2], "train", greedy=False, policy_version=3,
                                   group_ids=[0, 0, 1])
    assert len({ep.episode_id for ep in episodes}) == 3
    for ep, env in zip(episodes, env_list):
        assert ep.policy_version == 3 and ep.split == "train" and ep.env_version == FLIGHT.env_version
        assert ep.terminated != ep.truncated                        # exactly one way to end
        for turn in ep.turns:
            assert len(turn.action_logprobs) == len(turn.action_tokens) <= cfg.max_action_tokens
            assert turn.obs_tokens[0] == TOK.obs and turn.obs_tokens[-1] == TOK.act
            assert turn.policy_version == 3
        assert sum(len(t.obs_tokens) + len(t.action_tokens) for t in ep.turns) <= cfg.block_size
    assert episodes[0].task_id == episodes[1].task_id                 # same seed, same task (a group)


@pytest.mark.parametrize("env_id, block_sizes", [(envs.FLIGHT_ID, [192]), (envs.VAULT_ID, range(58, 80))])
def test_play_episode_and_the_batched_rollout_give_the_same_episodes(env_id, block_sizes):
    """Part I's one-episode loop is what training's lockstep, KV-cached rollout computes: for the same seeds the same
    observations, sampled ids, gate verdicts, rewards and cuts (the token budget at every block size around a cut),
    and log-probs equal to float precision."""
    A.seed_everything(0)
    cfg, tok = tiny_config(env=env_id), A.make_tokenizer(env_id)
    policy = A.make_policy(cfg, len(tok), "cpu")
    with torch.no_grad():                                    # a sharper policy than the init: varied greedy actions
        policy.lm_head.weight.mul_(40)
    seeds, cuts = [3, 4, 5, 6], Counter()
    for block_size in block_sizes:
        cfg = replace_cfg(cfg, block_size=block_size)
        batched, _ = A.rollout(policy, tok, cfg, seeds, "train", greedy=True, policy_version=2)
        for seed, fast in zip(seeds, batched):
            one, _ = A.play_episode(policy, tok, cfg, seed, "train", greedy=True, policy_version=2)
            assert (one.task_id, one.truncated_by, one.final_obs_tokens) == (fast.task_id, fast.truncated_by,
                                                                            fast.final_obs_tokens)
            assert len(one.turns) == len(fast.turns)
            for a, b in zip(one.turns, fast.turns):
                assert (a.obs_tokens, a.action_tokens, a.gate_reason, a.reward, a.truncated) == \
                    (b.obs_tokens, b.action_tokens, b.gate_reason, b.reward, b.truncated)
                assert a.action_logprobs == pytest.approx(b.action_logprobs, abs=1e-4)
            cuts[fast.truncated_by, len(fast.turns)] += 1
    assert all(turns > 1 for _, turns in cuts)
    assert env_id == envs.FLIGHT_ID or len({turns for _, turns in cuts}) > 2    # the cut moves with the block size
    sampled, _ = A.play_episode(policy, tok, cfg, 7, "train", greedy=False, policy_version=0,
                                generator=torch.Generator().manual_seed(0))
    b = A.pack([sampled], tok, cfg.block_size)               # its stored log-probs are the policy's, token by token
    with torch.no_grad():
        recomputed, _ = A.token_logprobs(policy(b["tokens"])[0], b["tokens"])
    m = b["action_mask"].bool()
    assert torch.allclose(recomputed[m], b["old_logprobs"][m], atol=1e-5)


@pytest.mark.parametrize("env_id", envs.ENV_IDS)
def test_every_observation_shows_the_turns_left_and_a_refusal_spends_one(env_id):
    env = gym.make(env_id)
    obs, info = env.reset(seed=2)
    tok, budget = A.make_tokenizer(env_id), info["max_turns"]
    assert obs.endswith(f" {budget} left") and "part of the task" in info["budget"]
    gate = A.HostGate.for_env(env)
    for k, action in enumerate(["nonsense", "finish"], start=1):
        obs = A.host_step(env, gate, action)[0]
        assert obs.endswith(f" {budget - k} left") and tok.unk not in tok.encode_observation(obs), obs
    hidden = gym.make(env_id, show_clock=False)
    assert not hidden.reset(seed=2)[0].endswith(" left") and "hidden" in hidden.reset(seed=2)[1]["budget"]


def test_each_cut_is_recorded_by_name():
    A.seed_everything(0)
    cfg = tiny_config(env=envs.VAULT_ID, max_turns=3)
    tok = A.make_tokenizer(envs.VAULT_ID)
    policy = A.make_policy(cfg, len(tok), "cpu")                     # untrained: almost every call is malformed
    ends = lambda c: Counter(ep.truncated_by for ep in A.rollout(policy, tok, c, list(range(8)), "train", greedy=False,
                                                                 policy_version=0)[0])
    assert ends(cfg) == {"turn_budget": 8}
    wrapped = gym.wrappers.TimeLimit(gym.make(envs.VAULT_ID), 2)    # an outside cut, counted in executed calls
    wrapped.reset(seed=0)
    gate = A.HostGate.for_env(wrapped)
    results = [A.host_step(wrapped, gate, a) for a in ("probe 8", "probe 4")]
    assert results[-1][3] and results[-1][4]["truncated_by"] == "time_limit"
    small = replace_cfg(tiny_config(env=envs.VAULT_ID), block_size=2 * (envs.VaultEnv.max_obs_words + 2) + 6)
    episodes, _ = A.rollout(A.make_policy(small, len(tok), "cpu"), tok, small, list(range(4)), "train", greedy=False,
                            policy_version=0)
    assert {ep.truncated_by for ep in episodes} == {"token_budget"}
    batch = A.pack(episodes, tok, small.block_size)                 # the whole final observation still fits
    assert all(int(batch["tokens"][b, batch["last_pos"][b]]) == tok.act for b in range(4))


# ------------------------------------------------------------------------------------------------
# 02 · Gradient masks
# ------------------------------------------------------------------------------------------------
def test_worked_examples_exactly():
    ex = worked_examples()
    assert ex["mask_tokens"] == 180 and ex["mask_sum"] == 60
    assert ex["returns"] == pytest.approx([0.729, 0.81, 0.9, 1.0], abs=1e-6)
    assert ex["grpo_advantages"] == pytest.approx([1, -1, -1, 1], abs=1e-4)


def test_part_one_opens_with_its_worked_episode_and_marks_every_definition_first_or_second_reading():
    source = Path(A.__file__).read_text()
    part_one = source[source.index("# PART I · THE LOOP"):source.index("# PART II · THE SYSTEM")]
    ex = worked_examples()
    assert "".join(f"#     {line}\n" for line in ex["episode"]) in part_one, "the record is what examples computes"
    assert ex["episode"][-3].startswith("terminated after 5 turns, reward 1; pack: 18 of its 100 tokens")
    assert ex["episode"][-1].endswith("/ 63 tokens = -0.143"), "its group's PPO loss at ratio 1: -9/63"
    lines, untagged = part_one.split("\n"), []
    for i, line in enumerate(lines):
        if re.match(r"(def|class) ", line):
            above = next(lines[j] for j in range(i - 1, 0, -1) if not lines[j].startswith("@"))
            untagged += [] if re.match(r"# (first|second) reading\b", above) else [line]
    assert not untagged, f"Part I definitions without '# first reading' or '# second reading' above: {untagged}"
    assert "# first reading" in part_one.split("def train(")[0][-200:], "the loop itself is on the first reading"
    for file, line, owner, name in re.findall(r"#   (\S+\.py) line (\d+) +(\w+)\.(\w+):", part_one):
        text = (REPO / file).read_text().split("\n")      # the places outside Part I a first reading needs, by line
        owners = [t for t in text[:int(line)] if t.startswith("class ")]
        assert text[int(line) - 1].strip().startswith(f"def {name}(") and owners[-1].startswith(f"class {owner}"), \
            f"Part I points a first reading at {file} line {line} for {owner}.{name}: it is not there any more"


def test_sampled_logprobs_match_a_full_forward_recompute():
    A.seed_everything(1)
    cfg = tiny_config()
    policy = A.make_policy(cfg, len(TOK), "cpu")
    episodes, _ = A.rollout(policy, TOK, cfg, list(range(6)), "train", greedy=False, policy_version=0)
    b = A.pack(episodes, TOK, cfg.block_size)
    with torch.no_grad():
        recomputed, _ = A.token_logprobs(policy(b["tokens"])[0], b["tokens"])
    m = b["action_mask"].bool()
    assert m.sum() > 20
    assert torch.allclose(recomputed[m], b["old_logprobs"][m], atol=1e-5)


# ------------------------------------------------------------------------------------------------
# 03 · Credit assignment: returns, GRPO, step groups, the critic routes, the cut's value
# ------------------------------------------------------------------------------------------------
def test_broadcast_per_episode_and_per_turn():
    turn_id = torch.tensor([[-1, 0, 0, -1, 1, -1], [-1, 0, -1, -1, -1, -1]])
    per_episode = A.broadcast_to_tokens(torch.tensor([2.0, -1.0]), turn_id)
    assert per_episode.tolist() == [[0, 2, 2, 0, 2, 0], [0, -1, 0, 0, 0, 0]]
    per_turn = A.broadcast_to_tokens(torch.tensor([[0.5, 0.7], [0.3, 9.0]]), turn_id)
    assert torch.allclose(per_turn, torch.tensor([[0, .5, .5, 0, .7, 0], [0, .3, 0, 0, 0, 0]]))


@pytest.mark.parametrize("call, match", [
    (lambda: A.discounted_returns([0, 1], gamma=1.5), "gamma"),
    (lambda: A.gae([0, 1], [0, 0], 0.0, True, gamma=0.9, lam=-0.1), "lam"),
    (lambda: A.gae([0, 1], [0, 0, 0], 0.0, True, 0.9, 0.9), "same length"),
    (lambda: A.group_advantages([1, 0], std="bessel"), "std"),
    (lambda: A.group_advantages([1.0]), "groups of at least 2"),
    (lambda: A.discounted_returns("abc", 0.9), "rewards"),
    (lambda: A.discounted_returns([0, float("nan")], 0.9), "NaN"),
    (lambda: A.ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3)), "shapes"),
    (lambda: A.ppo_clip_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2)), "mask"),
    (lambda: A.kl_k3(torch.zeros(3), torch.zeros(4)), "shapes"),
])
def test_bad_input_raises_a_named_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_step_group_advantages_hand_built_group():
    keys, returns = ["s0", "s0", "s1", "s1", "s2"], [1.0, 0.0, 1.0, 1.0, 0.0]
    assert A.step_group_advantages(keys, returns).tolist() == pytest.approx([1, -1, 0, 0, 0], abs=1e-4)
    assert A.step_group_advantages(keys, returns, std="none").tolist() == pytest.approx([0.5, -0.5, 0, 0, 0])


def test_stepgroup_credits_the_turn_where_a_shared_state_diverges():
    grpo_vs_step = worked_group()[0]              # [episode][turn] = (action, grpo, stepgroup)
    assert [[g for _, g, _ in ep] for ep in grpo_vs_step] == [[1.0] * 5, [-1.0] * 3, [-1.0] * 4, [1.0] * 5]
    blind = grpo_vs_step[2][3]                         # booking F4 after "F4 : sold out next F1"
    assert blind[0] == "book F4 chen business" and blind[2] == pytest.approx(-1 - math.sqrt(2), abs=1e-3)
    assert grpo_vs_step[0][3][2] == pytest.approx(1 + math.sqrt(2) / 2, abs=1e-3)   # checking F1 there instead
    assert grpo_vs_step[0][4][2] == pytest.approx(1.0, abs=1e-3)                      # the last shared state: no step term


# BEGIN TESTS THAT NAME A SILENT BUG (a silent-bug handout leaves these out, whichever bug it plants)
def test_grpo_groups_come_from_group_id_and_shuffling_changes_no_advantage():
    cfg = tiny_config()
    episodes = []
    for g, rewards in enumerate([[1, 0, 0, 1], [0, 0, 1, 1], [1, 1, 1, 1]]):
        for i, r in enumerate(rewards):
            ep = make_episode(f"g{g}-{i}", turns=[make_turn([TOK.obs, 7 + i, TOK.act], [8, TOK.eoa], reward=float(r),
                                                           terminated=True)])
            ep.group_id = g
            episodes.append(ep)
    adv = lambda eps: A.advantages_for(A.pack(eps, TOK, 32), eps, None, cfg)
    base, _, stats = adv(episodes)
    assert stats["zero_std_groups"] == 1 and base[:, 0].tolist() == pytest.approx([1, -1, -1, 1, -1, -1, 1, 1, 0, 0, 0, 0], abs=1e-4)
    order = np.random.default_rng(0).permutation(len(episodes))
    shuffled, _, _ = adv([episodes[i] for i in order])
    assert torch.allclose(shuffled[:, 0], base[order, 0])
# END TESTS THAT NAME A SILENT BUG


def test_reinforce_equals_gae_with_gamma_and_lambda_one():
    rewards, values = [0.0, 0.3, 0.0, 1.0], [0.2, 0.5, 0.1, 0.7]
    gae_adv, _ = A.gae(rewards, values, last_value=0.9, bootstrap=False, gamma=1.0, lam=1.0)
    mc = A.discounted_returns(rewards, 1.0) - torch.tensor(values)        # A_t = G_t - V(s_t)
    assert gae_adv.tolist() == pytest.approx(mc.tolist(), abs=1e-6)
    A.seed_everything(0)
    cfg = tiny_config(algo="reinforce")
    policy = A.make_policy(cfg, len(TOK), "cpu")
    episodes = [make_episode(f"t{i}", turns=[make_turn([TOK.obs, 7 + i, TOK.act], [8, TOK.eoa], reward=0.5 * i),
                                             make_turn([TOK.obs, 9, TOK.act], [8, TOK.eoa], reward=1.0 - i % 2,
                                                       terminated=True)]) for i in range(4)]
    batch = A.pack(episodes, TOK, cfg.block_size)
    reinforce, _, _ = A.advantages_for(batch, episodes, policy, cfg)
    as_gae, _, _ = A.advantages_for(batch, episodes, policy, replace_cfg(cfg, algo="gae", lam=1.0))
    assert reinforce.abs().sum() > 0 and torch.allclose(reinforce, as_gae, atol=1e-5)


# BEGIN TESTS THAT NAME A SILENT BUG (a silent-bug handout leaves these out, whichever bug it plants)
def test_the_value_after_the_last_turn_follows_the_cut():
    ends = {"terminated": make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], terminated=True),
            "turn_budget": make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], truncated=True),
            "token_budget": make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], truncated=True, truncated_by="token_budget"),
            "time_limit": make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], truncated=True, truncated_by="time_limit")}
    episodes = {name: make_episode(name, turns=[t]) for name, t in ends.items()}
    assert {n: A.should_bootstrap(ep) for n, ep in episodes.items()} == \
        {"terminated": False, "turn_budget": False, "token_budget": True, "time_limit": True}
    assert A.should_bootstrap(episodes["turn_budget"], bootstrap_budget=True) and \
        not A.should_bootstrap(episodes["terminated"], bootstrap_budget=True)
    for ep in episodes.values():
        ep.final_obs_tokens = [TOK.obs, 9, TOK.act]

    class Critic(torch.nn.Module):                                    # V = 0.8 wherever the token is <act>
        def forward(self, tokens):
            return None, torch.where(tokens == TOK.act, 0.8, 0.0)
    eps = list(episodes.values())
    batch = A.pack(eps, TOK, 32)
    cfg = tiny_config(algo="reinforce")
    _, returns, _ = A.critic_credit(batch, eps, Critic(), cfg)
    assert returns[:, 0].tolist() == pytest.approx([0.0, 0.0, 0.8, 0.8]), "value targets: 0, 0, V(s_K), V(s_K)"
    _, returns, _ = A.critic_credit(batch, eps, Critic(), replace_cfg(cfg, bootstrap_budget=True))
    assert returns[:, 0].tolist() == pytest.approx([0.0, 0.8, 0.8, 0.8])
    with pytest.raises(ValueError, match="names its cut"):
        bad = make_episode("unnamed", turns=[make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], truncated=True,
                                                       truncated_by="")])
        A.TrajectoryStore(0, len(TOK)).add(bad, current_version=0)
# END TESTS THAT NAME A SILENT BUG


def test_the_critic_routes_report_explained_variance():
    for algo in ("gae", "grpo"):
        cfg = tiny_config(algo=algo)
        A.seed_everything(0)
        policy = A.make_policy(cfg, len(TOK), "cpu")
        m = one_iteration(policy, torch.optim.AdamW(policy.parameters(), lr=1e-3), cfg)
        assert (m["explained_variance"] is None) == (algo == "grpo")
        assert algo == "grpo" or m["explained_variance"] <= 1.0
    m = one_iteration(policy, torch.optim.AdamW(policy.parameters(), lr=1e-3), tiny_config(trajectory_view="per_call"))
    assert m["learner_steps"] == 4, "per_call makes the same optimizer steps as concat: a minibatch is episodes"


@pytest.mark.parametrize("env_id, moves, paid", [
    (envs.FLIGHT_ID, ["search OSL ROM", "seats F1", "seats F1"], None),
    (envs.CODE_ID, ["test", "edit l1 add 1", "test", "test", "spec l1"], [0, 0, 1, 0, 0]),
    (envs.VAULT_ID, ["probe 8", "probe 8", "status"], None),
])
def test_process_reward_is_paid_only_for_the_rule_it_names(env_id, moves, paid):
    env = gym.make(env_id)
    _, info = env.reset(seed=4, options={"split": "train"})
    state = env.unwrapped.state
    if env_id == envs.FLIGHT_ID:
        t = state.task
        morning = next(f.number for f in t.flights if f.hour in envs.MORNING_HOURS)
        later = next(f.number for f in t.flights if f.hour not in envs.MORNING_HOURS)
        moves, paid = [f"search {t.origin} {t.dest}", f"seats {morning}", f"seats {morning}", f"seats {later}",
                       "filter morning"], [0, 1, 1, 0, 0]        # repeats pay too: a naive, farmable step verifier
    if env_id == envs.VAULT_ID:
        paid = [1, 0, 0]                                           # the second probe of 8 tells nothing new
    got = [env.step(m)[4]["process_reward"] for m in moves]
    assert got == paid


def test_a_denied_turn_never_shares_a_successful_episodes_positive_credit_by_default(monkeypatch):
    """05: the reward may encourage compliance, the gate forbids. A denied call executes nothing, so the episode can
    still succeed after it; learn caps that turn's advantage at 0 unless --deny-credit shared."""
    cfg = tiny_config()
    assert cfg.deny_credit == A.Config.deny_credit == "nonpositive"
    ok = make_episode("good", turns=[make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa]),
                                     make_turn([TOK.obs, 9, TOK.act], [8, TOK.eoa], reward=1.0, terminated=True)])
    ok.turns[0].gate_allowed, ok.turns[0].gate_reason = False, "wrong_passenger"
    bad = make_episode("bad", turns=[make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], reward=0.0, terminated=True)])
    opt = lambda p: torch.optim.AdamW(p.parameters(), lr=1e-4)
    policy = A.make_policy(cfg, len(TOK), "cpu")
    trained_with, broadcast = [], A.broadcast_to_tokens
    monkeypatch.setattr(A, "broadcast_to_tokens", lambda adv, turn_id: trained_with.append(adv) or broadcast(adv, turn_id))
    for rule in ("nonpositive", "shared"):
        m = A.learn(policy, opt(policy), None, TOK, replace_cfg(cfg, deny_credit=rule), A.TrajectoryStore(0, len(TOK)),
                    A.GradMonitor(), [copy_episode(ok, rule), copy_episode(bad, rule)], 0)
        assert m["denied_positive_advantage"] == 1, "the denied turn of a winning episode gets +A before capping"
    capped, shared = trained_with                                       # (B, K): the advantages the loss used
    assert capped[0, 0] == 0 and shared[0, 0] > 0 and capped[0, 1] == shared[0, 1] > 0
    assert torch.equal(capped[1], shared[1]) and capped[1, 0] < 0      # a failure's turns keep their credit


def copy_episode(ep, suffix):
    out = __import__("copy").deepcopy(ep)
    out.episode_id += "-" + suffix
    return out


# ------------------------------------------------------------------------------------------------
# 05 · Training system: the store, the warm start, one iteration, every route
# ------------------------------------------------------------------------------------------------
def test_store_counts_stale_episodes_under_async_and_never_trains_on_them():
    store = A.TrajectoryStore(max_staleness=1, vocab_size=len(TOK))
    store.add_all([make_episode("fresh", version=4), make_episode("old", version=2)], current_version=5)
    assert [ep.episode_id for ep in store.take()] == ["fresh"] and store.refused_stale == 1
    assert store.staleness == {1: 1}
    with pytest.raises(ValueError, match="duplicate"):                # any other refusal still stops training
        store.add_all([make_episode("fresh", version=5)], current_version=5)
    broken = make_episode("stale-and-broken", version=2)                # stale, and a log-prob short: broken first
    broken.turns[0].action_logprobs.pop()
    with pytest.raises(ValueError, match="one log-prob per action token") as refused:
        store.add_all([broken], current_version=5)
    assert type(refused.value) is ValueError and store.refused_stale == 1, "a broken episode is never merely stale"
    with pytest.raises(ValueError, match=r"admitted none of the 2 episodes offered to version 5 \(max_staleness=1\): "
                                         r"sample them with a newer policy, or raise --max-staleness"):
        A.learn(None, None, None, TOK, tiny_config(max_staleness=1), store, A.GradMonitor(),  # refused before packing
                [make_episode("late", version=3), make_episode("later", version=2)], 5)


def test_the_store_refuses_impossible_episodes_by_name():
    cases = [(lambda ep: setattr(ep, "policy_version", 7) or setattr(ep.turns[0], "policy_version", 7), "future"),
             (lambda ep: setattr(ep, "policy_version", "0") or setattr(ep.turns[0], "policy_version", "0"), "ints"),
             (lambda ep: setattr(ep, "episode_id", ["unhashable"]), "str"),
             (lambda ep: ep.turns[0].action_logprobs.__setitem__(0, 5.0), "above 0"),
             (lambda ep: setattr(ep.turns[0], "reward", 5.0), "reward"),
             (lambda ep: ep.turns[0].action_tokens.__setitem__(0, len(TOK) + 3), "vocabulary"),
             (lambda ep: setattr(ep.turns[0], "truncated", True), "only it, ends"),
             (lambda ep: setattr(ep.turns[0], "terminated", False), "ends the episode")]
    for mutate, match in cases:
        ep = make_episode("odd")
        mutate(ep)
        with pytest.raises(ValueError, match=match) as refused:
            A.TrajectoryStore(max_staleness=1, vocab_size=len(TOK)).add(ep, current_version=0)
        assert type(refused.value) is ValueError, "only a too-old episode is a StaleEpisode"


def test_the_store_bounds_the_vocabulary_and_refuses_a_negative_policy_version_by_name():
    with pytest.raises(ValueError, match=r"vocab_size=1000000000000 must be at most 2\*\*20 \(pass len\(tok\)"):
        A.TrajectoryStore(0, 10**12)
    assert A.TrajectoryStore(0, 2**20).vocab_size == 2**20
    for where in ("episode", "turn"):
        ep = make_episode(f"from-version-{where}", version=-5 if where == "episode" else 0)
        ep.turns[0].policy_version = -5
        with pytest.raises(ValueError, match="policy_version -5 is negative") as refused:
            A.TrajectoryStore(max_staleness=10, vocab_size=len(TOK)).add(ep, current_version=0)
        assert type(refused.value) is ValueError, "refused by name, not counted as merely too stale"


def test_each_environment_has_its_own_warm_start_length():
    cfg = tiny_config(env=envs.CODE_ID, warm_start_episodes=4)
    policy = A.make_policy(cfg, len(A.make_tokenizer(envs.CODE_ID)), "cpu")
    assert A.warm_start(policy, A.make_tokenizer(envs.CODE_ID), cfg, "cpu", progress=False)["epochs"] == 8
    assert envs.FlightBookingEnv.warm_start_epochs == 4 and A.Config().sft_epochs == 0


def one_iteration(policy, opt, cfg, store=None, version=0):
    episodes = A.collect(policy, TOK, cfg, version, 0)
    return A.learn(policy, opt, None, TOK, cfg, store or A.TrajectoryStore(0, len(TOK)), A.GradMonitor(), episodes, version)


def first_iteration_metrics(seed):
    cfg = tiny_config(seed=seed)
    A.seed_everything(seed)
    policy = A.make_policy(cfg, len(TOK), "cpu")
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    return {k: v for k, v in one_iteration(policy, opt, cfg).items() if k != "learner_seconds"}  # the clock's own


def test_same_seed_same_first_iteration_metrics():
    first = first_iteration_metrics(3)
    assert first == first_iteration_metrics(3)
    assert first != first_iteration_metrics(4)


def test_gae_algorithm_runs_an_update_with_a_value_loss():
    cfg = tiny_config(algo="gae", gamma=0.95)
    A.seed_everything(0)
    policy = A.make_policy(cfg, len(TOK), "cpu")
    before = policy.value_head.weight.detach().clone()
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    m = one_iteration(policy, opt, cfg)
    assert m["zero_std_groups"] is None and math.isfinite(m["approx_kl"])
    assert not torch.equal(before, policy.value_head.weight)       # the critic was trained


@pytest.mark.parametrize("algo", ["grpo", "stepgroup", "gae", "reinforce", "rs_sft", "dpo"])
def test_every_route_runs_two_iterations(tmp_path, algo, capsys):
    cfg = tiny_config(algo=algo, run_dir=str(tmp_path / algo), iterations=2, eval_episodes=8, pass_k_tasks=2,
                      warm_start_episodes=30, sft_epochs=1,
                      process_coef=0.1 if algo in A.PPO_CREDITS else 0.0)
    summary = A.train(cfg, progress=False)
    weak = summary["warm_start"]["dev_success"] < summary["demonstrator_success"] / 2   # train says so, and what to try
    assert ("note: imitation is weak" in capsys.readouterr().out) == weak
    metrics = [json.loads(line) for line in open(tmp_path / algo / "metrics.jsonl")]
    assert len(metrics) == 2 and all(set(m) == MONITOR_KEYS for m in metrics)
    assert summary["algo"] == algo and (metrics[0]["kept"] is not None) == (algo == "rs_sft")
    assert (metrics[0]["dpo_pairs"] is not None) == (algo == "dpo")
    from tools.test_tools import check_report     # the page the command line draws from the run's files (tools/)
    from tools.views import write_run_report
    write_run_report(tmp_path / algo / "final.pt", "cpu")
    check_report(tmp_path / algo, route_has_advantages=algo in A.PPO_CREDITS)  # each route's own monitors drawn


# ------------------------------------------------------------------------------------------------
# Other routes and views: rs_sft, trajectory DPO, the per-call view
# ------------------------------------------------------------------------------------------------
def test_train_stops_on_a_demonstrator_that_a_rule_denies_or_that_solves_nothing():
    import library
    rude = type("Rude", (library.Librarian,), {"act": lambda self, obs: library.Librarian.act(self, obs).replace(
        f" {self.reader}", " ana" if self.reader != "ana" else " ben")})          # lends to someone else
    idle = type("Idle", (library.Librarian,), {"act": lambda self, obs: "finish"})
    for demonstrator, named in [(rude, "the gate denied the demonstrator [0-9]+ times by wrong_reader in its 20 "
                                       "warm-start episodes \\(first on task [0-9]+\\)"),
                                (idle, "the demonstrator solves 0 of its 20 warm-start episodes")]:
        module = type(sys)(f"demo_{demonstrator.__name__.lower()}")
        module.Env = type("Env", (library.LibraryEnv,), {"Demonstrator": demonstrator})
        sys.modules[module.__name__] = module
        cfg = tiny_config(env=f"{module.__name__}:Env", warm_start_episodes=20)
        tok = A.make_tokenizer(cfg.env)
        with pytest.raises(ValueError, match=named):
            A.warm_start(A.make_policy(cfg, len(tok), "cpu"), tok, cfg, "cpu", progress=False)
        del sys.modules[module.__name__]


def test_dpo_loss_hand_computed():
    loss = A.dpo_loss(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]), torch.tensor([-1.5, -2.0]),
                      torch.tensor([-1.5, -2.0]), beta=0.1)
    # margins 0.1 * ((0.5) - (-0.5)) = 0.1 and 0.1 * ((-1) - (1)) = -0.2; -log sigmoid: 0.644397, 0.798139
    assert loss.item() == pytest.approx((0.644397 + 0.798139) / 2, abs=1e-6)
    with pytest.raises(ValueError, match="shapes"):
        A.dpo_loss(torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2))


def test_dpo_pairs_come_from_the_same_task_and_unpaired_groups_are_counted():
    eps = []
    for g, rewards in enumerate([[1, 0, 0], [1, 1, 1], [0, 1, 0]]):
        for i, r in enumerate(rewards):
            ep = make_episode(f"p{g}{i}")
            ep.group_id, ep.turns[0].reward = g, float(r)
            eps.append(ep)
    chosen, rejected, without = A.dpo_pairs(eps)
    assert [e.episode_id for e in chosen] == ["p00", "p21"] and [e.episode_id for e in rejected] == ["p01", "p20"]
    assert without == 1


def test_rs_sft_trains_only_on_verified_episodes():
    cfg = tiny_config(algo="rs_sft")
    policy = A.make_policy(cfg, len(TOK), "cpu")
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    failed = [make_episode(f"f{i}", turns=[make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], reward=0.0, terminated=True)])
              for i in range(3)]
    before = [p.detach().clone() for p in policy.parameters()]
    m = A.learn(policy, opt, None, TOK, cfg, A.TrajectoryStore(0, len(TOK)), A.GradMonitor(), failed, 0)
    assert m["kept"] == 0 and m["learner_steps"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters())), "nothing verified, nothing learned"
    mixed = failed[:1] + [make_episode("ok")]
    for ep in mixed:
        ep.episode_id += "-again"
    m = A.learn(policy, opt, None, TOK, cfg, A.TrajectoryStore(0, len(TOK)), A.GradMonitor(), mixed, 0)
    assert m["kept"] == 1 and m["learner_steps"] >= 1


# BEGIN TESTS THAT NAME A SILENT BUG (a silent-bug handout leaves these out, whichever bug it plants)
def test_concat_and_per_call_views_give_the_same_loss_and_gradients():
    episodes = random_episodes(6)
    cfg = tiny_config(algo="gae")
    A.seed_everything(0)
    policy = A.make_policy(cfg, len(TOK), "cpu")
    adv = torch.randn(6, 4)
    returns = torch.randn(6, 4)
    results = []
    for view in (A.pack(episodes, TOK, 64), A.pack_per_call(episodes, TOK, 64)):
        token_adv = A.broadcast_to_tokens(adv[view["episode"]], view["turn_id"])
        loss, _ = A.ppo_step_loss(policy, None, view, token_adv, returns[view["episode"]], cfg)(torch.arange(6))
        policy.zero_grad()
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in policy.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, abs=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads_a, grads_b))
# END TESTS THAT NAME A SILENT BUG


def test_per_call_rows_carry_each_steps_own_advantage_and_nothing_else():
    """SkyRL #1492: with step-wise rows, every step's advantage must land on that step's own action
    tokens; a broadcast with the last step's mask trains (N-1)/N of the rows wrong."""
    episodes = random_episodes(8, seed=1)                              # 1 to 4 turns each
    rows = A.pack_per_call(episodes, TOK, 64)
    assert len(rows["episode"]) == sum(len(ep.turns) for ep in episodes)
    adv = torch.tensor([[10.0 * b + k + 1 for k in range(4)] for b in range(8)])   # a distinct number per step
    token_adv = A.broadcast_to_tokens(adv[rows["episode"]], rows["turn_id"])
    for r, (b, k) in enumerate((b, k) for b, ep in enumerate(episodes) for k in range(len(ep.turns))):
        mask = rows["action_mask"][r].bool()
        assert rows["tokens"][r][mask].tolist() == episodes[b].turns[k].action_tokens, "its own action tokens only"
        assert (token_adv[r][mask] == adv[b, k]).all() and (token_adv[r][~mask] == 0).all()
        assert rows["old_logprobs"][r][mask].tolist() == pytest.approx(episodes[b].turns[k].action_logprobs)
    concat = A.pack(episodes, TOK, 64)
    together = A.broadcast_to_tokens(adv, concat["turn_id"])[concat["action_mask"].bool()]
    assert sorted(together.tolist()) == sorted(token_adv[rows["action_mask"].bool()].tolist())


# ------------------------------------------------------------------------------------------------
# 07 · Evaluation & promotion: held-out tasks, pass^k, the report card, release gates
# ------------------------------------------------------------------------------------------------
def test_wilson_interval():
    lo, hi = A.wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert A.wilson_interval(0, 10)[0] == 0.0 and A.wilson_interval(10, 10)[1] == 1.0


def test_pass_hat_k():
    assert A.pass_hat_k([4, 2, 0], n=4, k=1) == pytest.approx(0.5)
    assert A.pass_hat_k([4, 2, 0], n=4, k=2) == pytest.approx((1 + 1 / 6 + 0) / 3)


def test_dev_and_test_holdout_tasks_are_disjoint_and_fixed():
    cfg = tiny_config(eval_episodes=40)
    dev, test = A.holdout_tasks(cfg, "dev", 40), A.holdout_tasks(cfg, "test", 40)
    assert len(set(dev)) == len(set(test)) == 40 and not set(dev) & set(test)
    assert dev == A.holdout_tasks(cfg, "dev", 40)
    env = gym.make(envs.FLIGHT_ID)
    assert all(env.reset(seed=0, options={"split": "holdout", "task_id": k})[1]["split"] == "holdout" for k in dev[:10])


def test_every_release_gate_carries_numbers():
    inc = report_card([1] * 50 + [0] * 50)
    _, _, gates = A.promotion_decision(report_card([1] * 70 + [0] * 30, credits=9.0), inc)
    assert gates[0]["wins"] == 20 and gates[0]["losses"] == 0 and gates[0]["observed"] == pytest.approx(A.sign_test_p(20, 0))
    for g in gates:
        assert isinstance(g["observed"], (int, float)) and isinstance(g["limit"], (int, float)), g
    json.dumps(gates)                                                    # plain JSON for summary.json


def test_short_training_run_beats_the_untrained_policy_on_holdout(tmp_path, capsys):
    """A few seconds of warm start + two GRPO iterations, with the real train() pipeline."""
    cfg = A.Config(run_dir=str(tmp_path), device="cpu", warm_start_episodes=1000, sft_epochs=2, sft_batch_size=8,
                   iterations=2, pass_k_tasks=4, tasks_per_iter=4, group_size=4, eval_episodes=40, seed=0)
    # 250 warm-start steps of 8 episodes: the number of steps, not the batch, teaches copying a name
    A.seed_everything(0)
    untrained = A.evaluate(A.make_policy(cfg, len(TOK), "cpu"), TOK, cfg, "dev")
    summary = A.train(cfg, progress=False)
    assert summary["candidate"]["dev_success"] > untrained["success"] + 0.2
    assert summary["reports"]["candidate"]["dev"]["unauthorized_side_effects"] == 0
    assert {g["gate"] for g in summary["release_gates"]} >= {"significant gain", "safety wrong_passenger",
                                                             "injection following"}
    for name in set(A.RUN_FILES) - {"report.html"}:                 # the command line draws report.html from these
        assert (tmp_path / name).exists()
    policy, tok, _, _ = A.load_checkpoint(tmp_path / "final.pt", "cpu")
    assert A.evaluate(policy, tok, cfg, "dev")["success"] == pytest.approx(summary["deployed"]["dev_success"])
    capsys.readouterr()
    A.main(["eval", "--ckpt", str(tmp_path / "final.pt"), "--eval-episodes", "40", "--pass-k-tasks", "4"])
    report = json.loads(capsys.readouterr().out)                  # the eval CLI prints one JSON report (test part)
    assert report["part"] == "test" and report["success"] == pytest.approx(summary["deployed"]["test_success"])
    with pytest.raises(ValueError, match="holds another run"):   # one run per directory unless --overwrite
        A.train(cfg, progress=False)


# BEGIN HOMEWORK CHECKS: the checks (the grader compiles these blocks alone: course/lesson.py)
# ------------------------------------------------------------------------------------------------
# Homework checks. One table, run two ways: here by pytest (`-m homework`, in this process), and by
# the course's grader (`python -m course grade DIR`), which calls a submission's code in a process of its
# own and runs every check in the grader's process. A check gets `m`, the module under test: agentic_rl
# itself, or the student's, seen through the grader. Each uses hand-computed numbers and properties of its
# own piece only; the hidden checks (course/checks.py) use other inputs and compare with the reference.
# Messages say what was called, what was expected and what was obtained, in full.
# ------------------------------------------------------------------------------------------------
HOMEWORK, EXPERIMENT_CHECKS = [], []


def check(exercise, hidden=False, table=HOMEWORK):
    def register(fn):
        table.append((exercise, fn.__name__, fn, hidden))
        return fn
    return register


def plain(x):
    """Tensors, tuples and namespaces as lists and dicts, for comparing and printing."""
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if hasattr(x, "__dict__") and not callable(x):
        return plain(vars(x))
    return x


def near(a, b, tol) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(near(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(near(a[k], b[k], tol) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=tol, abs_tol=tol) or (math.isnan(a) and math.isnan(b))
    return a == b


def same(got, want, what, tol=1e-5):
    got, want = plain(got), plain(want)
    assert near(got, want, tol), f"{what}\n  expected {want}\n  obtained {got}"


def as_tensor(x):
    return torch.tensor(plain(x))


def refusal(call):
    """The exception a call raises (None if it raises none); a blank still counts as not started."""
    try:
        call()
    except NotImplementedError:
        raise
    except Exception as e:
        return e
    return None


def with_grad(fn, wrt, *args):
    """(fn(*args), d loss / d args[wrt]) where the loss is fn's (first) output; through the grader, the
    student's process computes both."""
    if hasattr(fn, "grad"):
        return fn.grad(wrt, *args)
    args = list(args)
    args[wrt] = args[wrt].detach().clone().requires_grad_()
    out = fn(*args)
    (out[0] if isinstance(out, tuple) else out).backward()
    return out, args[wrt].grad


@check("mask")
def mask_golden_two_turn_episode(m):
    o, a, e = TOK.obs, TOK.act, TOK.eoa
    ep = make_episode(turns=[make_turn([o, 10, 11, a], [20, 21, e], [-0.1, -0.2, -0.3]),
                             make_turn([o, 12, a], [22, e], [-0.4, -0.5], reward=1.0, terminated=True)])
    ep.final_obs_tokens = [o, 13, a]
    short = make_episode("e1", turns=[make_turn([o, 10, a], [23, e], [-0.6, -0.7], terminated=True)])
    b = m.pack([ep, short], m.make_tokenizer(envs.FLIGHT_ID), 32)
    what = "pack() of a two-turn episode (obs 4 + act 3, obs 3 + act 2, final obs 3) and a one-turn one"
    same(b["tokens"][0], [o, 10, 11, a, 20, 21, e, o, 12, a, 22, e, o, 13, a], what + ": tokens[0]")
    same(b["action_mask"][0], [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0], what + ": action_mask[0]")
    same(b["old_logprobs"][0], [0, 0, 0, 0, -.1, -.2, -.3, 0, 0, 0, -.4, -.5, 0, 0, 0], what + ": old_logprobs[0]")
    same(b["turn_id"][0], [-1, -1, -1, -1, 0, 0, 0, -1, -1, -1, 1, 1, -1, -1, -1], what + ": turn_id[0]")
    same(b["action_mask"][1], [0, 0, 0, 1, 1] + [0] * 10, what + ": action_mask[1] (right padding is 0)")
    same(b["turn_id"][1], [-1, -1, -1, 0, 0] + [-1] * 10, what + ": turn_id[1]")


@check("mask")
def mask_invariants_on_random_episodes(m, seed=0):
    episodes = random_episodes(6, seed=seed)
    b = m.pack(episodes, m.make_tokenizer(envs.FLIGHT_ID), 64)
    for row, ep in enumerate(episodes):
        mask, tokens = as_tensor(b["action_mask"][row]).bool(), as_tensor(b["tokens"][row])
        actions = [x for t in ep.turns for x in t.action_tokens]
        where = f"pack() of random episode {row} (seed {seed}), {len(ep.turns)} turns"
        same(tokens[mask], actions, f"{where}: the tokens under mask 1, in order, must be the action tokens")
        same(as_tensor(b["old_logprobs"][row])[mask], [x for t in ep.turns for x in t.action_logprobs],
             f"{where}: old_logprobs under the mask")
        same(as_tensor(b["old_logprobs"][row])[~mask].abs().sum(), 0.0, f"{where}: old_logprobs off the mask")
        same(as_tensor(b["turn_id"][row])[mask], [k for k, t in enumerate(ep.turns) for _ in t.action_tokens],
             f"{where}: turn_id on the action tokens")
        same((as_tensor(b["turn_id"][row]) >= 0).tolist(), mask.tolist(), f"{where}: turn_id >= 0 exactly on mask 1")


@check("mask")
def mask_demonstrations_have_no_logprobs_but_are_still_actions(m):
    ep = make_episode(turns=[make_turn([TOK.obs, 10, TOK.act], [20, TOK.eoa], logprobs=[], terminated=True)])
    b = m.pack([ep], m.make_tokenizer(envs.FLIGHT_ID), 16)
    same(b["action_mask"][0], [0, 0, 0, 1, 1], "pack() of a demonstration (action_logprobs []): action_mask")
    same(b["old_logprobs"][0], [0, 0, 0, 0, 0], "pack() of a demonstration: old_logprobs are 0.0")


@check("returns")
def returns_chapter_example(m):
    same(m.discounted_returns([0, 0, 0, 1], 0.9), [0.729, 0.81, 0.9, 1.0], "discounted_returns([0, 0, 0, 1], gamma=0.9)")


@check("returns")
def returns_hand_cases(m):
    for rewards, gamma, want in [([1, 1, 1], 0.5, [1.75, 1.5, 1.0]), ([1, 2, 3], 1.0, [6, 5, 3]),
                                 ([0.3, 0.1, 0.5], 0.0, [0.3, 0.1, 0.5])]:
        same(m.discounted_returns(rewards, gamma), want, f"discounted_returns({rewards}, gamma={gamma})")


@check("returns")
def returns_satisfy_the_recursion(m, seed=1):
    rng = np.random.default_rng(seed)
    for _ in range(4):
        r, gamma = rng.normal(size=rng.integers(1, 9)).round(3).tolist(), round(float(rng.random()), 3)
        g = torch.tensor(plain(m.discounted_returns(r, gamma)), dtype=torch.float64)
        what = f"discounted_returns({r}, gamma={gamma}) = {g.tolist()}"
        same(g[-1], r[-1], what + ": the last return is the last reward", tol=1e-4)
        same(g[:-1] - gamma * g[1:], r[:-1], what + ": G_k - gamma * G_k+1 must be r_k", tol=1e-4)


@check("gae")
def gae_hand_cases(m):
    for gamma, lam, bootstrap, want in [(1.0, 1.0, False, [0.5, 0.5]), (1.0, 1.0, True, [1.5, 1.5]),
                                        (1.0, 0.0, False, [0.0, 0.5]), (0.5, 0.5, False, [-0.125, 0.5])]:
        call = f"gae([0, 1], values [0.5, 0.5], last_value 1.0, bootstrap={bootstrap}, gamma={gamma}, lam={lam})"
        same(m.gae([0.0, 1.0], [0.5, 0.5], 1.0, bootstrap, gamma, lam), [want, [x + 0.5 for x in want]],
             call + " -> (advantages, returns = advantages + values)")


@check("gae")
def gae_four_turn_golden(m):
    for bootstrap, want in [(False, [0.584333, 0.97824, 0.192, 0.6]), (True, [0.853071, 1.351488, 0.7104, 1.32])]:
        adv, _ = m.gae([0.0, 0.5, 0.0, 1.0], [0.3, 0.2, 0.6, 0.4], 0.8, bootstrap, 0.9, 0.8)
        same(adv, want, f"gae(rewards [0, 0.5, 0, 1], values [0.3, 0.2, 0.6, 0.4], last_value 0.8, "
                        f"bootstrap={bootstrap}, gamma 0.9, lam 0.8): advantages")


@check("gae")
def gae_last_value_matters_only_when_bootstrapped(m):
    for bootstrap, want in [(False, [-0.5, -0.5]), (True, [-0.5, 0.5])]:
        got = [plain(m.gae([0.0], [0.5], v, bootstrap, 1.0, 1.0)[0])[0] for v in (0.0, 1.0)]
        same(got, want, f"gae([0], [0.5], last_value 0.0 and 1.0, bootstrap={bootstrap}, 1, 1): A_0 for each "
                        "(after an end there is no V(s_K); after an outside cut there is)")


@check("gae")
def gae_properties(m):
    same(m.gae([0, 0, 0, 1], [0, 0, 0, 0], 0.0, False, 0.9, 1.0)[0], [0.729, 0.81, 0.9, 1.0],
         "gae with lam 1 and values 0 is the discounted return")
    r, v = [0.3, -1.2, 0.5, 0.8, -0.1], [0.2, -0.4, 1.1, 0.0, 0.6]
    base = plain(m.gae(r, v, 0.0, False, 1.0, 1.0)[0])
    shifted = plain(m.gae(r, [x + 0.7 for x in v], 0.0, False, 1.0, 1.0)[0])
    same([a - b for a, b in zip(base, shifted)], [0.7] * 5, f"gae({r}, values +0.7, gamma=lam=1): every A drops by 0.7")


@check("grpo")
def grpo_chapter_example_and_std_options(m):
    for rewards, std, want in [([1, 0, 0, 1], "population", [1, -1, -1, 1]),
                               ([1, 0, 0, 1], "unbiased", [0.866025, -0.866025, -0.866025, 0.866025]),
                               ([1, 0, 0, 1], "none", [0.5, -0.5, -0.5, 0.5]),
                               ([1, 0, 0, 0], "unbiased", [1.5, -0.5, -0.5, -0.5]),
                               ([1, 0, 0, 0], "population", [1.732051, -0.57735, -0.57735, -0.57735])]:
        same(m.group_advantages(rewards, std=std), want, f"group_advantages({rewards}, std={std!r})", tol=1e-4)


@check("grpo")
def grpo_all_equal_groups_are_exactly_zero(m):
    for std in ("population", "unbiased", "none"):
        for rewards in ([0.1] * 7, [1000.1] * 3, [0.0, 0.0], [1.0] * 8):
            got = plain(m.group_advantages(rewards, std=std))
            assert got == [0.0] * len(rewards), f"group_advantages({rewards}, std={std!r})\n  expected exactly " \
                                                f"{[0.0] * len(rewards)} (all-equal rewards carry no signal)\n  obtained {got}"


@check("grpo")
def grpo_properties(m, seed=3):
    rows = torch.tensor(np.random.default_rng(seed).normal(size=(4, 6)).round(3), dtype=torch.float32)
    adv = torch.tensor(plain(m.group_advantages(rows)))
    what = f"group_advantages(rows {rows.tolist()})"
    same(adv.mean(-1), [0.0] * 4, what + ": each row is centred", tol=1e-4)
    same(adv.std(-1, unbiased=False), [1.0] * 4, what + ": population std 1 per row", tol=1e-3)
    same(m.group_advantages(rows * 3 + 5), adv, what + ": the same after x 3 + 5", tol=1e-3)
    same(m.group_advantages(rows[:, [5, 0, 1, 2, 3, 4]]), adv[:, [5, 0, 1, 2, 3, 4]], what + ": permuted rows", tol=1e-5)
    same(m.group_advantages(rows[2]), adv[2], what + ": row 2 alone", tol=1e-5)


@check("ppo_clip")
def ppo_clip_three_tokens_hand_computed(m):
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 5.0]]))        # old_logprobs = 0, so r = these
    loss, stats = m.ppo_clip_loss(logp, torch.zeros(1, 4), torch.tensor([[1.0, -1.0, 1.0, 1.0]]),
                                  torch.tensor([[1.0, 1.0, 1.0, 0.0]]), 0.2)
    what = "ppo_clip_loss(r = [1.5, 0.5, 1, 5], A = [1, -1, 1, 1], mask [1, 1, 1, 0], eps 0.2)"
    same(loss, (-1.2 + 0.8 - 1.0) / 3, what + ": loss (per token -1.2, +0.8, -1, mean over the mask)", tol=1e-6)
    same(stats["clip_frac"], 2 / 3, what + ": clip_frac (2 of the 3 masked tokens have |r - 1| > 0.2)")
    same(stats["approx_kl"], 0.095894, what + ": approx_kl (mean k3 over the 3 masked tokens)", tol=1e-5)


@check("ppo_clip")
def ppo_clip_single_token_loss_and_gradient(m):
    for r, a, want_loss, want_grad in [(1.0, 1.0, -1.0, -1.0), (1.5, 1.0, -1.2, 0.0), (0.5, 1.0, -0.5, -0.5),
                                       (0.5, -1.0, 0.8, 0.0), (1.5, -1.0, 1.5, 1.5)]:
        (loss, _), grad = with_grad(m.ppo_clip_loss, 0, torch.tensor([[math.log(r)]]), torch.zeros(1, 1),
                                    torch.tensor([[a]]), torch.ones(1, 1), 0.2)
        what = f"ppo_clip_loss one token, r = {r}, A = {a}, eps 0.2"
        same(loss, want_loss, what + ": loss", tol=1e-6)
        same(grad, [[want_grad]], what + ": d loss / d logprob (0 where the clip is active)", tol=1e-6)


@check("ppo_clip")
def ppo_clip_mask_and_mean_properties(m):
    g = torch.Generator().manual_seed(0)
    logp, old, adv = torch.randn(2, 5, generator=g) * 0.1, torch.randn(2, 5, generator=g) * 0.1, torch.randn(2, 5, generator=g)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.float)
    (loss, _), grad = with_grad(m.ppo_clip_loss, 0, logp, old, adv, mask)
    what = "ppo_clip_loss on random 2 x 5 inputs with a mask"
    same(torch.tensor(plain(grad))[mask == 0], [0.0] * 3, what + ": tokens off the mask get no gradient")
    same(m.ppo_clip_loss(torch.where(mask.bool(), logp, logp + 3.0), old, adv, mask)[0], loss,
         what + ": changing tokens off the mask changes nothing")
    same(m.ppo_clip_loss(logp.repeat(1, 2), old.repeat(1, 2), adv.repeat(1, 2), mask.repeat(1, 2))[0], loss,
         what + ": a token mean, so every token twice gives the same loss")
    same(m.ppo_clip_loss(old, old, adv, mask)[0], -(adv * mask).sum() / mask.sum(), what + ": at r = 1, -mean(A) over the mask")


@check("ppo_clip")
def ppo_clip_gradient_matches_finite_differences(m):
    logp = torch.tensor([[0.1, -0.3, 0.05], [0.4, -0.05, 0.0]], dtype=torch.float64)
    old = torch.tensor([[0.0, 0.0, 0.1], [0.0, 0.1, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -0.5, 2.0], [-1.0, 0.7, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    _, grad = with_grad(m.ppo_clip_loss, 0, logp, old, adv, mask)
    h, numeric = 1e-4, torch.zeros_like(logp)
    for i in range(2):
        for j in range(3):
            e = torch.zeros_like(logp)
            e[i, j] = h
            up, down = (float(plain(m.ppo_clip_loss(logp + s * e, old, adv, mask)[0])) for s in (1, -1))
            numeric[i, j] = (up - down) / (2 * h)
    same(grad, numeric, "ppo_clip_loss: autograd's gradient against central differences of your loss", tol=1e-3)


@check("kl_k3")
def kl_k3_values(m):
    same(m.kl_k3(torch.zeros(3), torch.zeros(3)), [0.0] * 3, "kl_k3 of identical policies")
    same(m.kl_k3(torch.zeros(2), torch.tensor([math.log(2), -math.log(2)])), [0.306853, 0.193147],
         "kl_k3(logprobs 0, ref_logprobs +-ln 2): d = ref - logp", tol=1e-5)
    same(m.kl_k3(torch.tensor([-1.0, -1.5]), torch.tensor([-1.5, -1.0])), [0.106531, 0.148721],
         "kl_k3([-1, -1.5], [-1.5, -1])", tol=1e-5)


@check("kl_k3")
def kl_k3_is_nonnegative_and_unbiased_for_kl(m):
    g = torch.Generator().manual_seed(4)
    k = torch.tensor(plain(m.kl_k3(torch.randn(100, generator=g), torch.randn(100, generator=g))))
    assert (k >= 0).all(), f"kl_k3 on random pairs: k3 is never negative\n  obtained {k.tolist()}"
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1])
    same((p * torch.tensor(plain(m.kl_k3(p.log(), q.log())))).sum(), 0.510826,
         "sum_x pi(x) k3(x) with pi = [0.5, 0.5], ref = [0.9, 0.1]: KL(pi || ref) (1.266952 would be reversed)", tol=1e-5)


def store_refuses_each(m, changes: dict):
    """Each change (a name -> what it does to a good episode) makes one the store refuses with a plain ValueError."""
    for name, change in changes.items():
        ep = make_episode("bad", version=1)
        change(ep)
        e = refusal(lambda: m.TrajectoryStore(1, len(TOK)).add(ep, 1))
        assert isinstance(e, ValueError) and type(e).__name__ == "ValueError", \
            f"TrajectoryStore(1, vocab_size={len(TOK)}).add(an episode with {name}, current_version=1)\n  expected " \
            f"ValueError\n  obtained {type(e).__name__ if e else 'nothing raised: admitted'}"


STORE_BAD = {  # a name -> a change that the store must refuse with a plain ValueError
    "missing env_version": lambda ep: setattr(ep, "env_version", None),
    "empty episode_id": lambda ep: setattr(ep, "episode_id", ""),
    "no turns": lambda ep: setattr(ep, "turns", []),
    "mixed versions": lambda ep: setattr(ep.turns[0], "policy_version", 0),
    "a log-prob missing": lambda ep: ep.turns[0].action_logprobs.pop(),
    "a NaN log-prob": lambda ep: ep.turns[0].action_logprobs.__setitem__(0, float("nan")),
    "an infinite reward": lambda ep: setattr(ep.turns[0], "reward", float("inf")),
    "log-probs not a list": lambda ep: setattr(ep.turns[0], "action_logprobs", None),
    "turns not a list": lambda ep: setattr(ep, "turns", None),
    "a turn that is not a Turn": lambda ep: setattr(ep, "turns", ["not a turn"]),
    "a reward as text": lambda ep: setattr(ep.turns[0], "reward", "1"),
    "a version as text": lambda ep: setattr(ep, "policy_version", "0") or setattr(ep.turns[0], "policy_version", "0"),
}


@check("store_refusals")
def store_accepts_a_good_episode_and_refuses_each_bad_one_as_a_plain_value_error(m):
    store = m.TrajectoryStore(1, len(TOK))
    store.add(make_episode("ok", version=1), 1)
    same([ep.episode_id for ep in store.take()], ["ok"], "a good episode is admitted, then taken")
    store_refuses_each(m, STORE_BAD)


@check("store_refusals")
def store_staleness_is_a_stale_episode_at_the_bound_plus_one(m):
    store = m.TrajectoryStore(2, len(TOK))
    store.add(make_episode("two-old", version=3), 5)
    e = refusal(lambda: store.add(make_episode("three-old", version=2), 5))
    assert e is not None and type(e).__name__ == "StaleEpisode" and isinstance(e, ValueError), \
        "max_staleness 2, version 2, current 5\n  expected StaleEpisode (a ValueError)\n  obtained " \
        f"{type(e).__name__ if e else 'nothing raised'} (version 3 at current 5 must be admitted: the bound is inclusive)"
    store.add_all([make_episode("fresh", version=5), make_episode("old", version=0)], 5)
    same([store.refused_stale, [ep.episode_id for ep in store.take()]], [1, ["two-old", "fresh"]],
         "add_all([fresh, too stale]): [refused_stale, admitted ids] (a stale episode is counted and skipped)")


@check("store_refusals")
def store_duplicates_even_after_take_and_a_refusal_changes_nothing(m):
    store = m.TrajectoryStore(0, len(TOK))
    store.add(make_episode("dup"), 0)
    assert isinstance(refusal(lambda: store.add(make_episode("dup"), 0)), ValueError), "a duplicate id must be refused"
    store.take()
    assert isinstance(refusal(lambda: store.add(make_episode("dup"), 0)), ValueError), \
        "a duplicate id must be refused also after take()"
    bad = make_episode("fixable")
    bad.turns[0].reward = float("nan")
    assert isinstance(refusal(lambda: store.add(bad, 0)), ValueError), "a NaN reward must be refused"
    store.add(make_episode("fixable"), 0)
    same([ep.episode_id for ep in store.take()], ["fixable"], "a refused id was never recorded, so its fix is admitted")


@check("permission_rule")
def permission_rule_vault_open_needs_that_probe(m):
    rule = m.envs.VaultEnv.permission_rule
    for executed, tool, args, want in [([], "open", ["4"], "open_unprobed"),
                                       ([("probe", ["3"], "3 is low : code in 4 to 15")], "open", ["4"], "open_unprobed"),
                                       ([("probe", ["4"], "4 is right")], "open", ["4"], None),
                                       ([], "probe", ["4"], None), ([], "status", [], None)]:
        same(rule({}, executed, tool, args), want, f"VaultEnv.permission_rule({{}}, executed={executed}, {tool!r}, {args})")


@check("permission_rule")
def permission_rule_a_denied_open_is_never_executed(m):
    env = m.envs.gym.make(envs.VAULT_ID)
    env.reset(seed=7)
    code = env.unwrapped.state.code
    gate = m.HostGate.for_env(env)
    obs, _, terminated, _, _, decision = m.host_step(env, gate, f"open {code}")
    same([decision.reason, terminated, env.unwrapped.state.opened], ["open_unprobed", False, []],
         f"host_step(open {code}) with nothing probed: [gate reason, terminated, codes tried on the lock]")
    m.host_step(env, gate, f"probe {code}")
    obs, reward, terminated, *_ = m.host_step(env, gate, f"open {code}")
    same([reward, terminated], [1.0, True], f"probe {code} then open {code}: [reward, terminated]")


@check("sign_test")
def sign_test_hand_cases(m):
    for wins, losses, want in [(3, 1, 5 / 16), (10, 0, 1 / 1024), (0, 0, 1.0), (5, 5, 0.623047), (0, 4, 1.0)]:
        same(m.sign_test_p(wins, losses), want, f"sign_test_p({wins}, {losses})", tol=1e-6)


@check("sign_test")
def sign_test_properties(m):
    ps = [m.sign_test_p(w, 10 - w) for w in range(11)]
    same(ps, sorted(ps, reverse=True), "sign_test_p(w, 10 - w) for w = 0..10: more wins, smaller p")
    for w, l in [(4, 2), (7, 3), (12, 9)]:
        same(m.sign_test_p(w, l) + m.sign_test_p(l, w), 1 + math.comb(w + l, w) / 2 ** (w + l),
             f"sign_test_p({w}, {l}) + sign_test_p({l}, {w}): the two tails overlap at X = wins", tol=1e-9)


GOLDEN_P = {(20, 0): 2 ** -20, (2, 0): 0.25, (0, 0): 1.0, (30, 0): 2 ** -30, (29, 0): 2 ** -29, (38, 0): 2 ** -38,
            (1, 0): 0.5, (5, 0): 2 ** -5, (0, 10): 1.0, (0, 9): 1.0, (0, 1): 1.0}


def promotion(m, candidate, incumbent):
    """promotion_decision, with a stand-in for sign_test_p when run here, so that a blank sign_test does
    not hide a right promotion (the grader swaps in the reference sign_test_p itself)."""
    if not isinstance(m, type(A)):
        return m.promotion_decision(candidate, incumbent)
    real, m.sign_test_p = m.sign_test_p, lambda wins, losses: GOLDEN_P[(wins, losses)]
    try:
        return m.promotion_decision(candidate, incumbent)
    finally:
        m.sign_test_p = real


GATE_NAMES = ["significant gain", "unauthorized side effects", "safety wrong_class", "safety wrong_passenger",
              "injection following", "category all", "cost tokens_per_success", "cost tool_calls_per_success",
              "cost credits_per_success"]


@check("promotion")
def promotion_truth_table(m):
    inc = report_card([1] * 50 + [0] * 50)
    for name, candidate, promoted, failed in [
            ("20 more tasks solved, cheaper", report_card([1] * 70 + [0] * 30, credits=9.0), True, []),
            ("2 more tasks (p = 0.25)", report_card([1] * 52 + [0] * 48), False, ["significant gain"]),
            ("the same tasks", inc, False, ["significant gain"]),
            ("one task newly denied (p = 0.5: not evidence)", report_card([1] * 70 + [0] * 30,
                                                                         denied={"wrong_class": [3]}), True, []),
            ("five tasks newly denied by one rule (p = 1/32)", report_card([1] * 70 + [0] * 30, denied={
                "wrong_passenger": range(5)}), False, ["safety wrong_passenger"]),
            ("five injected notes newly followed", report_card([1] * 70 + [0] * 30, injected=range(5)), False,
             ["injection following"]),
            ("one unauthorized side effect", report_card([1] * 70 + [0] * 30, unauthorized=1), False,
             ["unauthorized side effects"]),
            ("twice the cost per success", report_card([1] * 70 + [0] * 30, credits=20.0), False,
             ["cost tokens_per_success", "cost tool_calls_per_success", "cost credits_per_success"])]:
        ok, reason, gates = promotion(m, candidate, inc)
        same([ok, [g["gate"] for g in gates], [g["gate"] for g in gates if not g["passed"]]],
             [promoted, GATE_NAMES, failed], f"promotion_decision, candidate with {name}: [promoted, gates, failed gates]")
        assert failed == [] or failed[0] in reason, f"the reason must name the first failed gate {failed[0]!r}: {reason}"


@check("promotion")
def promotion_judges_each_safety_rule_on_its_own_by_evidence(m):
    better = [1] * 70 + [0] * 30                                 # 20 more tasks solved: the gain gate passes
    for name, inc_denied, cand_denied, failed in [
            ("a new kind of denial (5 tasks) while another rule's 10 fell to 0", {"wrong_class": range(10)},
             {"wrong_passenger": range(10, 15)}, ["safety wrong_passenger"]),
            ("the same 3 of 100 tasks denied as before: over the 0.02 ceiling, p = 1", {"wrong_class": range(3)},
             {"wrong_class": range(3)}, ["safety wrong_class"]),
            ("10 tasks denied before, 1 of them still", {"wrong_class": range(10)}, {"wrong_class": [0]}, [])]:
        ok, reason, gates = promotion(m, report_card(better, denied=cand_denied), report_card([1] * 50 + [0] * 50,
                                                                                               denied=inc_denied))
        same([ok, [g["gate"] for g in gates if not g["passed"]]], [not failed, failed],
             f"promotion_decision, {name}: [promoted, failed gates]")
        assert not failed or (failed[0] in reason and "task" in reason), f"the reason names the rule and a task: {reason}"


@check("promotion")
def promotion_category_drops_and_the_one_task_allowance(m):
    cats = lambda a, b: {"sold_out": {"tasks": 40, "success": a}, "seats": {"tasks": 60, "success": b}}
    inc = report_card([1] * 50 + [0] * 50, categories=cats(0.5, 0.5))
    for drop, promoted in [(0.1, False), (0.025, True)]:
        ok, _, gates = promotion(m, report_card([1] * 80 + [0] * 20, categories=cats(0.5 - drop, 0.9)), inc)
        same([ok, [g["gate"] for g in gates if not g["passed"]]], [promoted, [] if promoted else ["category sold_out"]],
             f"sold_out (40 tasks) drops by {drop}: [promoted, failed gates] (one task of 40 is allowed)")
    small = {"high": {"tasks": 8, "success": 0.75}}
    ok, _, gates = promotion(m, report_card([1] * 80 + [0] * 20, categories={"high": {"tasks": 8, "success": 0.625}}),
                             report_card([1] * 50 + [0] * 50, categories=small))
    same([ok, next(g for g in gates if g["gate"] == "category high")["limit"]], [True, 0.625],
         "a category of 8 tasks drops by one task (0.75 -> 0.625): [promoted, its limit 0.75 - max(0.05, 1/8)]")
    e = refusal(lambda: m.promotion_decision({**inc, "task_ids": [5] * 100}, inc))
    assert isinstance(e, ValueError), "reports on different tasks must be refused with a ValueError"


@check("promotion")
def promotion_gates_carry_their_numbers(m):
    inc = report_card([1] * 50 + [0] * 50, denied={"wrong_class": [0, 1]})
    _, _, gates = promotion(m, report_card([1] * 70 + [0] * 30, credits=9.0, denied={"wrong_class": [1]}), inc)
    first = gates[0]
    same([first["wins"], first["losses"], first["observed"], first["limit"]], [20, 0, 2 ** -20, A.GATE_LEVEL],
         "the significant-gain gate: [wins, losses, observed p, limit]", tol=1e-9)
    same([[g["observed"], g["limit"]] for g in gates[1:3]], [[0, 0], [0.01, 0.02]],
         "[observed, limit] of the unauthorized-side-effects gate and wrong_class's (its share of tasks, the ceiling)")
    same([gates[2]["p"], gates[2]["task"]], [1.0, 1], "wrong_class's gate: [p of 0 new and 1 gone, the task to inspect]")
    same(gates[6]["limit"], 1.25 * 1000 / 50, "the tokens-per-success gate's limit: 1.25 x the incumbent's 20.0")


CLOCK_SETTINGS = {"value_zero": {}, "bootstrap_budget": {"bootstrap_budget": True},  # E3: the flags of each setting
                  "hidden_clock_value_zero": {"hide_clock": True},
                  "hidden_clock_bootstrap_budget": {"bootstrap_budget": True, "hide_clock": True}}
E3_RUN, E8_RUNS = {"env": envs.CODE_ID, "algo": "gae"}, ({}, {"env": envs.CODE_ID, "algo": "gae"})  # on top of defaults
README_SEEDS = [0, 1, 2]  # the seeds the README measured; a handout with an id carries its own (answers.json's "seeds")
WARM_ENOUGH = 0.3         # a warm start's dev success from which RL can learn (CodeRepair: 0.52 at seeds 0-2)


def run_record(run_dir) -> dict:
    """A run's evidence for answers.json, as the run wrote it: summary.json and every line of metrics.jsonl.
    python -c "import json, test_agentic_rl as t; print(json.dumps(t.run_record('runs/DIR')))" """
    run_dir = Path(run_dir)
    return {"summary": json.loads((run_dir / "summary.json").read_text()),
            "metrics": [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]}


def your_seeds(key) -> list:
    """The three seeds the experiments ask of this student (the grader's key says which, and why not when it
    cannot know them)."""
    assert key.get("seeds"), f"answers.json: {key.get('why') or 'the grader does not know your seeds'}"
    return key["seeds"]


def record_of(record, what, seed, **asked) -> dict:
    """The record's own settings must be the command asked for (these flags and the seed, every other
    setting at its default, eval_every included, but where the run goes and on which device), and its parts
    must agree with each other."""
    summary, metrics = (record.get("summary"), record.get("metrics")) if isinstance(record, dict) else (None, None)
    assert isinstance(summary, dict) and isinstance(summary.get("config"), dict) and isinstance(metrics, list) and \
        all(isinstance(m, dict) for m in metrics), f"{what}: a run record is {{'summary': summary.json, 'metrics': " \
                                                   "[each line of metrics.jsonl]}} (run_record(RUN_DIR) makes one)"
    config, defaults = summary["config"], asdict(A.Config())
    wanted = {**{k: v for k, v in defaults.items() if k not in ("run_dir", "overwrite", "device")}, **asked, "seed": seed}
    wrong = {k: config.get(k) for k, v in wanted.items() if config.get(k) != v}
    assert not wrong, f"{what}: the run's settings are not the command asked for ({', '.join(f'{k}={v!r}' for k, v in asked.items()) or 'the defaults'}, seed {seed})\n  obtained {wrong}"
    assert all(type(m.get("success")) in (int, float) and 0 <= m["success"] <= 1 and
               all(math.isfinite(v) for v in m.values() if type(v) is float) for m in metrics), \
        f"{what}: each line of metrics.jsonl holds that iteration's success in [0, 1], and finite numbers only"
    curve = [round(m["success"], 4) for m in metrics]
    assert len(metrics) == config["iterations"] and curve == summary.get("train_success_curve"), \
        f"{what}: metrics.jsonl and summary.json disagree (iterations, or the training success per iteration)"
    for part in ("warm_start", "candidate"):
        dev = (summary.get(part) if isinstance(summary.get(part), dict) else {}).get("dev_success")
        assert type(dev) in (int, float) and 0 <= dev <= 1, f"{what}: summary.json's {part} dev_success is not a " \
                                                            f"number in [0, 1]\n  obtained {dev!r}"
    run_only = (summary.get("demonstrator_success"), summary["warm_start"].get("sft_loss"))   # what only a run knows
    assert all(type(x) is float and math.isfinite(x) and x >= 0 for x in run_only), \
        f"{what}: summary.json lacks the demonstrator's success or the warm start's sft_loss, which every run of this " \
        f"version writes\n  obtained {run_only}"
    return summary


def copies_among(records: dict):
    """Runs whose warm starts differ (another seed, environment or clock) end them with different SFT losses: the
    same loss, to the last digit, in two of them says that one record is a copy of the other's run."""
    seen = {}
    for where, summary in records.items():
        warm = tuple(summary["config"][k] for k in ("seed", "env", "hide_clock"))
        loss = summary["warm_start"]["sft_loss"]
        first, its_warm = seen.setdefault(loss, (where, warm))
        assert its_warm == warm, f"answers.json: {where} and {first} end their warm starts with the same SFT loss " \
                                 f"({loss!r}) though their seeds or clocks differ: one is a copy of the other's run"


@check("clock", table=EXPERIMENT_CHECKS)
def clock_numbers_are_your_runs_own_records(answers, key):
    seeds = your_seeds(key)
    clock = answers.get("clock") if isinstance(answers.get("clock"), dict) else {}
    got = {k: clock.get(k) for k in CLOCK_SETTINGS}
    assert all(isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in v)
               for v in got.values()), f"answers.json: clock must map each of {list(CLOCK_SETTINGS)} to the final " \
                                       f"dev success of your seeds {seeds}\n  obtained {got}"
    runs, summaries = clock.get("runs") if isinstance(clock.get("runs"), dict) else {}, {}
    for setting, flags in CLOCK_SETTINGS.items():
        records = runs.get(setting)
        assert isinstance(records, list) and len(records) == 3, \
            f"answers.json: clock.runs.{setting} must hold the three runs' records (your seeds {seeds}, in order)"
        for i, record in enumerate(records):
            summaries[f"clock.runs.{setting}[{i}]"] = summary = \
                record_of(record, f"clock.runs.{setting}[{i}]", seeds[i], **E3_RUN, **flags)
            reported = clock[setting][i]
            assert abs(reported - summary["candidate"]["dev_success"]) <= 5e-4, \
                f"answers.json: clock.{setting}[{i}] = {reported}, but that run's summary.json says candidate " \
                f"dev_success {summary['candidate']['dev_success']}"
    copies_among(summaries)


@check("silent_bug", table=EXPERIMENT_CHECKS)
def silent_bug_answer_carries_the_runs_before_and_after_the_fix(answers, key):
    seeds = your_seeds(key)
    evidence = str(answers.get("silent_bug_evidence", ""))[:5000]    # silent_bug, its account, is a person's to read
    assert len(evidence.split()) >= 20 and any(k in evidence for k in MONITOR_KEYS) and re.search(r"\d", evidence), \
        "answers.json: silent_bug_evidence must be at least 20 words that cite a metric of metrics.jsonl (e.g. " \
        f"clip_frac) and its values in your runs\n  obtained {evidence!r}"
    summaries = {}
    for field, when in (("silent_bug_runs", "with the bug"), ("silent_bug_fixed_runs", "after your fix")):
        runs = answers.get(field)
        assert isinstance(runs, list) and len(runs) == 6, f"answers.json: {field} must hold six run records {when}: " \
                                                          f"the demo and CodeRepair with gae, your seeds {seeds} each"
        for i, record in enumerate(runs):
            summaries[f"{field}[{i}]"] = record_of(record, f"{field}[{i}]", seeds[i % 3], **E8_RUNS[i // 3])
    copies_among(summaries)
# END HOMEWORK CHECKS


@pytest.mark.homework
@pytest.mark.parametrize("exercise, name, check_fn, hidden", HOMEWORK, ids=[f"{c[0]}-{c[1]}" for c in HOMEWORK])
def test_hw(exercise, name, check_fn, hidden):
    check_fn(A)


# ################################################################################################
# PART II · THE SYSTEM
# ################################################################################################
# ------------------------------------------------------------------------------------------------
# Checks on settings, inputs and records (every bad input refused by name)
# ------------------------------------------------------------------------------------------------
def test_config_is_checked():
    for bad, match in [(dict(lr=float("inf")), "finite"), (dict(kl_coef=float("nan")), "finite"),
                       (dict(eval_seed=-1), "eval_seed"), (dict(gamma=0.9), "only used with algo"),
                       (dict(env=envs.VAULT_ID, injection_rate=0.5), "Vault-v0 takes no `injection_rate`"),
                       (dict(iterations=2.5), "iterations"), (dict(max_turns=1), "max_turns")]:
        with pytest.raises(ValueError, match=match):
            A.validate_config(tiny_config(**bad))
    with pytest.raises(ValueError, match="group_size"):
        A.validate_config(tiny_config(group_size=1))
    with pytest.raises(ValueError, match="algo"):
        A.validate_config(tiny_config(algo="ppo2"))
    with pytest.raises(SystemExit):
        A.main(["train", "--no-such-flag", "1"])
    with pytest.raises(SystemExit):
        A.main(["train", "--iterations", "many"])


def test_flags_that_would_do_nothing_are_refused():
    for bad in (dict(algo="rs_sft", kl_coef=0.1), dict(algo="dpo", kl_coef=0.1), dict(algo="dpo", process_coef=0.1),
                dict(algo="rs_sft", process_coef=0.1)):
        with pytest.raises(ValueError, match="only used with algo"):
            A.validate_config(tiny_config(**bad))


def test_settings_that_would_fail_late_are_refused_up_front(tmp_path):
    for bad, match in [(dict(max_action_tokens=200), "max_action_tokens"), (dict(eval_episodes=10**9), "eval_episodes"),
                       (dict(n_embd=4096, n_head=4, n_layer=48), "parameters"), (dict(seed=2**32), "seed"),
                       (dict(max_turns=1000), "max_turns")]:
        with pytest.raises(ValueError, match=match):
            A.validate_config(tiny_config(**bad))
    short = tiny_config(block_size=32, max_action_tokens=6, warm_start_episodes=5)
    with pytest.raises(ValueError, match="--block-size"):
        A.warm_start(A.make_policy(short, len(TOK), "cpu"), TOK, short, "cpu", progress=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="cannot write"):
        bench("cpu", quick=True, out=str(tmp_path / "file"))
    with pytest.raises(ValueError, match="seed"):
        play(envs.FLIGHT_ID, seed=-1, stream=iter([]))


def test_the_last_loose_refusals_name_what_is_wrong(tmp_path, capsys):
    for mutate, match in [(lambda ep: setattr(ep, "env_id", "NotAnEnv"), "env_id 'NotAnEnv', but this store holds"),
                          (lambda ep: setattr(ep, "split", "test"), "split 'test'"),
                          (lambda ep: ep.turns[0].action_tokens.__setitem__(0, 10**9), "vocabulary"),
                          (lambda ep: setattr(ep.turns[0], "reward", -1.0), "FlightBooking-v0.* reward -1.0")]:
        store = A.TrajectoryStore(0, len(TOK))
        store.add(make_episode("first"), current_version=0)   # the store now holds FlightBooking's episodes
        ep = make_episode("odd")
        mutate(ep)
        with pytest.raises(ValueError, match=match):
            store.add(ep, current_version=0)
    for args, match in [(("1", len(TOK)), "max_staleness='1'"), ((float("nan"), len(TOK)), "max_staleness=nan"),
                        ((0, None), "vocab_size=None"), ((-1, len(TOK)), "max_staleness=-1")]:
        with pytest.raises(ValueError, match=match):
            A.TrajectoryStore(*args)
    for version in ("3", None, float("nan"), -1):
        with pytest.raises(ValueError, match="current_version"):
            A.TrajectoryStore(0, len(TOK)).add(make_episode("v"), current_version=version)
    cfg = tiny_config()
    policy = A.make_policy(cfg, len(TOK), "cpu")
    A.save_checkpoint(tmp_path / "ok.pt", policy, TOK, cfg, 0)
    good = torch.load(tmp_path / "ok.pt", weights_only=True)
    (tmp_path / "run").mkdir()
    torch.save({**good, **{k: [] for k in A.STATE_KEYS if k not in good}, "version": "2"}, tmp_path / "run" / "state.pt")
    with pytest.raises(ValueError, match="version '2'"):
        A.load_run_state(str(tmp_path / "run"))
    for limit in (8, 9):  # the flight task's own budget is 8 turns: a time limit of 8 or more never cuts
        with pytest.raises(ValueError, match="time_limit"):
            A.validate_config(tiny_config(time_limit=limit))
    A.validate_config(tiny_config(time_limit=7))
    for argv in (["compare", "--algos", "grpo,grpo", "--seeds", "0"], ["compare", "--seeds", "0,0"]):
        with pytest.raises(SystemExit) as usage:
            A.main(argv)
        assert usage.value.code == 2 and "each value once" in capsys.readouterr().err


def test_evaluation_settings_never_change_the_training_run(tmp_path, capsys):
    curves = []
    for k in (1, 4):
        _, metrics = small_run(tmp_path, f"k{k}", pass_k=k, warm_start_episodes=30, sft_epochs=1)
        curves.append([{key: v for key, v in m.items() if "second" not in key} for m in metrics])
    assert curves[0] == curves[1]


# ------------------------------------------------------------------------------------------------
# The async actor, tool latency, torchrun, resume, checkpoints, run directories, monitors
# ------------------------------------------------------------------------------------------------
def small_run(tmp_path, name, **overrides):
    cfg = tiny_config(run_dir=str(tmp_path / name), iterations=3, eval_episodes=10, pass_k_tasks=4, **overrides)
    return A.train(cfg, progress=False), [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]


def test_async_rollout_has_staleness_one_by_schedule_and_is_reproducible(tmp_path, capsys):
    summary, metrics = small_run(tmp_path, "a1", async_rollout=True, max_staleness=1)
    batch = 4 * 4                                                     # tasks_per_iter x group_size: one batch
    assert summary["staleness_histogram"] == {"0": batch, "1": 2 * batch} and summary["refused_stale"] == 0
    assert [m["staleness_max"] for m in metrics] == [0, 1, 1] and all(set(m) == MONITOR_KEYS for m in metrics)
    again, metrics2 = small_run(tmp_path, "a2", async_rollout=True, max_staleness=1, eval_every=1)
    drop = lambda ms: [{k: v for k, v in m.items() if "second" not in k and k != "dev_success"} for m in ms]
    assert drop(metrics2) == drop(metrics), "own generator: same seed, same run; greedy checks draw no randomness"
    assert [x[1] for x in again["dev_success_by_wall_clock"]] == [m["dev_success"] for m in metrics2]
    assert len(again["dev_success_by_wall_clock"]) == 3 and again["dev_success_by_wall_clock"][-1][1] == again["candidate"]["dev_success"]
    with pytest.raises(ValueError, match="max_staleness"):
        A.validate_config(tiny_config(async_rollout=True))


def test_tool_latency_overlaps_calls_without_changing_the_episodes():
    cfg = tiny_config()
    A.seed_everything(0)
    policy = A.make_policy(cfg, len(TOK), "cpu")
    runs = []
    for latency in (0.0, 2.0):
        torch.manual_seed(1)
        episodes, _ = A.rollout(policy, TOK, replace_cfg(cfg, tool_latency_ms=latency), list(range(8)), "train",
                                greedy=False, policy_version=0)
        runs.append([(t.action_text, t.receipt.get("result")) for ep in episodes for t in ep.turns])
    assert runs[0] == runs[1]


def test_an_interrupted_async_run_stops_its_actor_and_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    import threading
    interrupted_run(monkeypatch, 2, tiny_config(run_dir=str(tmp_path / "async"), iterations=3, eval_episodes=10,
                                                pass_k_tasks=4, async_rollout=True, max_staleness=1))
    assert "async-actor" not in [t.name for t in threading.enumerate()], "the actor thread was joined"
    assert not list((tmp_path / "async").glob("*.tmp"))

    def failing(f):
        f.write(b"half")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        A.atomic_write(tmp_path / "state.pt", failing)
    assert not (tmp_path / "state.pt").exists() and not list(tmp_path.glob("state.pt*tmp"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "state.pt.x1y2.tmp").write_text("left by a crash")
    A.prepare_run_dir(tiny_config(run_dir=str(tmp_path / "run"), overwrite=True))
    assert not list((tmp_path / "run").glob("state.pt*tmp"))


REPO = Path(A.__file__).resolve().parent


def test_torchrun_two_cpu_ranks_keep_identical_parameters_and_rank_zero_alone_writes(tmp_path):
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "agentic_rl.py"),
           "train", "--device", "cpu", "--run-dir", str(run), "--iterations", "2", "--warm-start-episodes", "0",
           "--n-embd", "32", "--n-head", "2", "--tasks-per-iter", "2", "--group-size", "4", "--minibatch-size", "8",
           "--eval-episodes", "8", "--pass-k-tasks", "2"]
    for attempt in (1, 2):  # torchrun failed once in six whole CI runs on this machine (not reproduced in 8 more)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        if done.returncode == 0 or attempt == 2:
            break
        warnings.warn(f"torchrun failed once and was started again; its error: {done.stderr[-1500:]}")
        shutil.rmtree(run, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(summary["param_hashes"]) == 2
    assert summary["param_hashes"][0] == summary["param_hashes"][1], "DDP replicas diverged"
    assert sorted(p.name for p in run.iterdir()) == sorted(A.RUN_FILES)
    assert done.stdout.count("config: ") == 1 and done.stdout.count("wrote ") == 2, "rank 1 must stay silent"  # summary, page
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [m["world_size"] for m in metrics] == [2, 2]


def replace_cfg(cfg, **changes):
    return A.validate_config(__import__("dataclasses").replace(cfg, **changes))


def interrupted_run(monkeypatch, at: int, cfg):
    """train(cfg), with a Ctrl-C during iteration `at` (in the learner)."""
    calls, real_learn = [], A.learn

    def interrupted_learn(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt
        return real_learn(*args, **kwargs)
    monkeypatch.setattr(A, "learn", interrupted_learn)
    with pytest.raises(KeyboardInterrupt):
        A.train(cfg, progress=False)
    monkeypatch.setattr(A, "learn", real_learn)


def test_resume_after_an_interruption_matches_an_uninterrupted_run(tmp_path, monkeypatch, capsys):
    base = dict(iterations=4, eval_episodes=10, pass_k_tasks=4, warm_start_episodes=40, sft_epochs=1)
    straight = A.train(tiny_config(run_dir=str(tmp_path / "straight"), **base), progress=False)
    interrupted_run(monkeypatch, 3, tiny_config(run_dir=str(tmp_path / "cut"), **base))   # Ctrl-C in iteration 3
    assert not (tmp_path / "cut" / "summary.json").exists()
    resumed = A.main(["train", "--resume", str(tmp_path / "cut")]) or json.loads((tmp_path / "cut" / "summary.json").read_text())
    strip = lambda curve: [{k: v for k, v in m.items() if "second" not in k} for m in curve]   # timings differ
    metrics = lambda d: strip([json.loads(line) for line in open(tmp_path / d / "metrics.jsonl")])
    assert metrics("cut") == metrics("straight") and len(metrics("cut")) == 4
    a = torch.load(tmp_path / "straight" / "candidate.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "candidate.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a), "2 + 2 resumed iterations end with the same parameters as 4"
    assert resumed["candidate"] == straight["candidate"]
    with pytest.raises(ValueError, match="already finished"):
        A.load_run_state(str(tmp_path / "cut"))


def test_a_resumed_run_continues_in_the_directory_given_and_takes_no_other_flag(tmp_path, monkeypatch, capsys):
    base = dict(iterations=3, eval_episodes=6, pass_k_tasks=2, warm_start_episodes=30, sft_epochs=1, algo="dpo")
    straight = A.train(tiny_config(run_dir=str(tmp_path / "straight"), **base), progress=False)
    interrupted_run(monkeypatch, 2, tiny_config(run_dir=str(tmp_path / "cut"), **base))
    __import__("shutil").copytree(tmp_path / "cut", tmp_path / "moved")
    with pytest.raises(SystemExit) as refused:
        A.main(["train", "--resume", str(tmp_path / "moved"), "--lr", "0.01"])
    assert "drop --lr" in str(refused.value.code)
    A.main(["train", "--resume", str(tmp_path / "moved")])
    resumed = json.loads((tmp_path / "moved" / "summary.json").read_text())
    assert not (tmp_path / "cut" / "summary.json").exists(), "it writes where it was told, not where it was started"
    strip = lambda d: [{k: v for k, v in json.loads(line).items() if "second" not in k}
                       for line in open(tmp_path / d / "metrics.jsonl")]
    assert strip("moved") == strip("straight"), "the dpo reference after a resume is still the warm start"
    assert resumed["candidate"] == straight["candidate"]
    capsys.readouterr()
    interrupted_run(monkeypatch, 1, tiny_config(run_dir=str(tmp_path / "early")))   # before any iteration ended
    assert "interrupted after 0 iterations; none ended, so there is nothing to resume" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no state.pt there: a run writes it when its first iteration ends"):
        A.main(["train", "--resume", str(tmp_path / "early")])


def test_checkpoints_load_without_running_code_and_refuse_foreign_ones(tmp_path):
    cfg = tiny_config()
    policy = A.make_policy(cfg, len(TOK), "cpu")
    A.save_checkpoint(tmp_path / "ok.pt", policy, TOK, cfg, 3)
    assert A.load_checkpoint(tmp_path / "ok.pt", "cpu")[3] == 3
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))
    torch.save({"format": A.CHECKPOINT_FORMAT, "model": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="safely"):
        A.load_checkpoint(tmp_path / "evil.pt", "cpu")
    assert not marker.exists(), "the embedded code must never run"
    good = torch.load(tmp_path / "ok.pt", weights_only=True)
    for change, match in [({"format": "agentic-rl-checkpoint-1"}, "format"), ({"env_id": "Other-v0"}, "environment"),
                          ({"env_version": "flight-1"}, "retrain"), ({"vocab": good["vocab"][:-1]}, "vocabulary")]:
        torch.save({**good, **change}, tmp_path / "bad.pt")
        with pytest.raises(ValueError, match=match):
            A.load_checkpoint(tmp_path / "bad.pt", "cpu")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "ok.pt").read_bytes()[:1000])
    with pytest.raises(ValueError, match="safely"):
        A.load_checkpoint(tmp_path / "cut.pt", "cpu")


def test_bad_checkpoints_and_state_files_are_refused_with_a_reason(tmp_path):
    cfg = tiny_config()
    policy = A.make_policy(cfg, len(TOK), "cpu")
    A.save_checkpoint(tmp_path / "ok.pt", policy, TOK, cfg, 0)
    good = torch.load(tmp_path / "ok.pt", weights_only=True)
    (tmp_path / "empty.pt").write_bytes(b"")
    nan_model = {k: v * float("nan") for k, v in good["model"].items()}
    config_without_lr = {k: v for k, v in good["config"].items() if k != "lr"}
    cases = [("empty.pt", None, "safely"), ("wide.pt", {"config": {**good["config"], "n_embd": 64}}, "do not fit"),
             ("nan.pt", {"model": nan_model}, "NaN"), ("nolr.pt", {"config": config_without_lr}, "lacks \\['lr'\\]"),
             ("heads.pt", {"config": {**good["config"], "n_head": 0}}, "n_head"),
             ("env.pt", {"env_id": envs.VAULT_ID}, "but its config says")]
    for name, change, match in cases:
        if change is not None:
            torch.save({**good, **change}, tmp_path / name)
        with pytest.raises(ValueError, match=match):
            A.load_checkpoint(tmp_path / name, "cpu")
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"format": A.CHECKPOINT_FORMAT, "config": good["config"]}, run / "state.pt")
    with pytest.raises(ValueError, match="lacks"):
        A.load_run_state(str(run))


def test_run_directory_is_never_mixed_and_unwritable_fails_fast(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="overwrite"):
        A.prepare_run_dir(tiny_config(run_dir=str(run)))
    A.prepare_run_dir(tiny_config(run_dir=str(run), overwrite=True))
    assert not (run / "summary.json").exists(), "the old run's summary is gone before the new run starts"
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(ValueError, match="cannot write"):
        A.prepare_run_dir(tiny_config(run_dir=str(blocked / "run")))


def test_a_non_finite_gradient_is_never_applied_even_first_and_never_enters_the_window():
    monitor = A.GradMonitor()
    assert not monitor.allows(float("nan")) and not monitor.allows(float("inf")) and monitor.skipped == 2
    for _ in range(12):
        assert monitor.allows(1.0)
    assert not monitor.allows(float("nan")) and not monitor.allows(50.0) and monitor.allows(5.0)
    assert all(math.isfinite(n) for n in monitor.norms)
    cfg = tiny_config(ppo_epochs=1)
    policy = A.make_policy(cfg, len(TOK), "cpu")
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    nan_loss = lambda idx: (sum(p.sum() for p in policy.parameters()) * float("nan"), {})
    stats = A.optimizer_steps(policy, opt, A.GradMonitor(), cfg, 8, nan_loss)
    assert stats["learner_steps"] == 1 and all(torch.isfinite(p).all() for p in policy.parameters())


# ################################################################################################
# PART III · THE TOOLS
# ################################################################################################
# ------------------------------------------------------------------------------------------------
# The command line, show, play, compare, bench
# ------------------------------------------------------------------------------------------------
TINY_FLAGS = ["--device", "cpu", "--warm-start-episodes", "0", "--iterations", "1", "--tasks-per-iter", "2",
              "--group-size", "2", "--eval-episodes", "4", "--pass-k-tasks", "2", "--n-embd", "32", "--n-head", "2"]


@pytest.fixture(scope="session")  # one run for this file and tools/test_tools.py
def default_runs(tmp_path_factory):
    """A folder where `train` + TINY_FLAGS ran once with no --run-dir (so into runs/flightbooking-grpo-s0): the
    default-command test runs it a second time there; the grader's rerun test trains that record again."""
    folder = tmp_path_factory.mktemp("default-runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        A.main(["train"] + TINY_FLAGS)
    return folder


def test_the_default_command_works_twice_and_an_explicit_run_dir_is_still_protected(default_runs, monkeypatch, capsys):
    tmp_path = default_runs                                     # the first `train` ran here
    monkeypatch.chdir(tmp_path)
    A.main(["train"] + TINY_FLAGS)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["flightbooking-grpo-s0", "flightbooking-grpo-s0-2"]
    summary = json.loads((tmp_path / "runs" / "flightbooking-grpo-s0-2" / "summary.json").read_text())
    assert summary["config"]["run_dir"] == str(Path("runs") / "flightbooking-grpo-s0-2")
    with pytest.raises(SystemExit) as refused:
        A.main(["train", "--run-dir", "runs/flightbooking-grpo-s0"] + TINY_FLAGS)
    assert "holds another run" in str(refused.value.code)


def test_the_command_line_never_guesses(tmp_path, capsys, monkeypatch):
    for argv, match in [(["compare", "--seed", "3"], "unrecognized arguments: --seed"),
                        (["--seed", "3", "train"], "put the command first")]:
        with pytest.raises(SystemExit) as usage:
            A.main(argv)
        assert usage.value.code == 2 and match in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    A.main(["compare", "--seeds", "0", "--algos", "grpo", "--out", str(tmp_path / "c")] + TINY_FLAGS)
    assert json.loads((tmp_path / "c" / "compare.json").read_text())["routes"]["grpo"]["per_seed"][0]["seed"] == 0


def test_errors_during_a_run_are_not_usage_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as usage:
        A.main(["train", "--lr", "-1"])
    assert usage.value.code == 2                                  # a bad flag: usage error
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(SystemExit) as during:
        A.main(["train", "--run-dir", str(tmp_path), "--iterations", "0", "--warm-start-episodes", "0"])
    assert during.value.code != 2 and "holds another run" in str(during.value.code)


def edited_copy(default_runs, tmp_path) -> Path:
    """A copy of the finished default run, to edit as an attacker or an accident would."""
    __import__("shutil").copytree(default_runs / "runs" / "flightbooking-grpo-s0", tmp_path / "run")
    return tmp_path / "run"


def test_resume_refuses_a_state_its_history_cannot_have_made_and_a_metrics_file_that_is_not_a_file(default_runs,
                                                                                                  tmp_path, capsys):
    run = edited_copy(default_runs, tmp_path)
    state = torch.load(run / "state.pt", weights_only=True)
    state["config"]["iterations"] = 2                                      # one iteration left: a run to resume
    torch.save({**state, "version": 99}, run / "state.pt")                # was resumed, as policy 99
    with pytest.raises(SystemExit, match="state.pt has version 99 after 1 iterations, one version each; it is damaged"):
        A.main(["train", "--resume", str(run)])
    torch.save({**state, "env_version": ["flight-0", "state-0"]}, run / "state.pt")  # another version of the task
    with pytest.raises(SystemExit, match="it ran AgenticRL/FlightBooking-v0 flight-0/state-0, this version of it is "
                                         "flight-"):
        A.main(["train", "--resume", str(run)])
    torch.save(state, run / "state.pt")                                    # version 1 after 1 iteration, as written
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()                                        # was an IsADirectoryError
    with pytest.raises(SystemExit, match="its metrics.jsonl is not a file; move it away"):
        A.main(["train", "--resume", str(run)])
