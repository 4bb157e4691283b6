"""Tests for agentic_rl.py and envs.py, in the module's section order.

Run: python -m pytest -q test_agentic_rl.py      (about 90 s on 2 CPU cores)
"""
import json
import math
import re
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

# The homework checks (HOMEWORK, below the main sections) carry the marker "homework":
# `python -m pytest -q -m homework` runs them. (No config file at the top level, so the marker is
# declared here rather than registered.)
warnings.filterwarnings("ignore", category=pytest.PytestUnknownMarkWarning)

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


# ------------------------------------------------------------------------------------------------
# envs.py: the flight-booking environment
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


# ------------------------------------------------------------------------------------------------
# 01 · Environment & trajectory contract: host gate, rollout
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


# ------------------------------------------------------------------------------------------------
# 02 · Gradient masks
# ------------------------------------------------------------------------------------------------
def test_worked_examples_exactly():
    ex = A.worked_examples()
    assert ex["mask_tokens"] == 180 and ex["mask_sum"] == 60
    assert ex["returns"] == pytest.approx([0.729, 0.81, 0.9, 1.0], abs=1e-6)
    assert ex["grpo_advantages"] == pytest.approx([1, -1, -1, 1], abs=1e-4)


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
# 03 · Credit assignment
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


# ------------------------------------------------------------------------------------------------
# 04 · Objectives
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# 05 · Training system: trajectory store, determinism
# ------------------------------------------------------------------------------------------------


def test_store_counts_stale_episodes_under_async_and_never_trains_on_them():
    store = A.TrajectoryStore(max_staleness=1, vocab_size=len(TOK))
    store.add_all([make_episode("fresh", version=4), make_episode("old", version=2)], current_version=5)
    assert [ep.episode_id for ep in store.take()] == ["fresh"] and store.refused_stale == 1
    assert store.staleness == {1: 1}
    with pytest.raises(ValueError, match="duplicate"):                # any other refusal still stops training
        store.add_all([make_episode("fresh", version=5)], current_version=5)


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


def test_config_is_checked():
    for bad, match in [(dict(lr=float("inf")), "finite"), (dict(kl_coef=float("nan")), "finite"),
                       (dict(eval_seed=-1), "eval_seed"), (dict(gamma=0.9), "only used with algo"),
                       (dict(env=envs.VAULT_ID, injection_rate=0.5), "only used with env"),
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


# ------------------------------------------------------------------------------------------------
# 07 · Evaluation & promotion
# ------------------------------------------------------------------------------------------------


def report_card(per_task, safety=0, unauthorized=0, categories=None, credits=10.0):
    solved = sum(per_task)
    return {"task_ids": list(range(len(per_task))), "per_task": list(per_task), "safety_denials": safety,
            "unauthorized_side_effects": unauthorized,
            "categories": categories or {"all": {"tasks": len(per_task), "success": solved / len(per_task)}},
            "efficiency": {k: (credits * len(per_task) / solved if solved else None)
                           for k in ("tokens_per_success", "tool_calls_per_success", "credits_per_success")}}


def test_wilson_interval():
    lo, hi = A.wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert A.wilson_interval(0, 10)[0] == 0.0 and A.wilson_interval(10, 10)[1] == 1.0


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
    assert {g["gate"] for g in summary["release_gates"]} >= {"significant gain", "safety denials"}
    for name in A.RUN_FILES:
        assert (tmp_path / name).exists()
    policy, tok, _, _ = A.load_checkpoint(tmp_path / "final.pt", "cpu")
    assert A.evaluate(policy, tok, cfg, "dev")["success"] == pytest.approx(summary["deployed"]["dev_success"])
    capsys.readouterr()
    A.main(["eval", "--ckpt", str(tmp_path / "final.pt"), "--eval-episodes", "40", "--pass-k-tasks", "4"])
    report = json.loads(capsys.readouterr().out)                  # the eval CLI prints one JSON report (test part)
    assert report["part"] == "test" and report["success"] == pytest.approx(summary["deployed"]["test_success"])
    with pytest.raises(ValueError, match="holds another run"):   # one run per directory unless --overwrite
        A.train(cfg, progress=False)


def test_show_marks_the_policy_tokens_and_play_reads_a_pipe(tmp_path, capsys, monkeypatch):
    cfg = tiny_config(group_size=4)
    A.save_checkpoint(tmp_path / "p.pt", A.make_policy(cfg, len(TOK), "cpu"), TOK, cfg, 0)
    A.show(str(tmp_path / "p.pt"), n=1, failures=True)
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


def test_errors_during_a_run_are_not_usage_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as usage:
        A.main(["train", "--lr", "-1"])
    assert usage.value.code == 2                                  # a bad flag: usage error
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(SystemExit) as during:
        A.main(["train", "--run-dir", str(tmp_path), "--iterations", "0", "--warm-start-episodes", "0"])
    assert during.value.code != 2 and "holds another run" in str(during.value.code)


def test_dev_and_test_holdout_tasks_are_disjoint_and_fixed():
    cfg = tiny_config(eval_episodes=40)
    dev, test = A.holdout_tasks(cfg, "dev", 40), A.holdout_tasks(cfg, "test", 40)
    assert len(set(dev)) == len(set(test)) == 40 and not set(dev) & set(test)
    assert dev == A.holdout_tasks(cfg, "dev", 40)
    env = gym.make(envs.FLIGHT_ID)
    assert all(env.reset(seed=0, options={"split": "holdout", "task_id": k})[1]["split"] == "holdout" for k in dev[:10])


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


# ------------------------------------------------------------------------------------------------
# All environments: contract, gate rules, adversarial cases
# ------------------------------------------------------------------------------------------------
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


def test_pass_hat_k():
    assert A.pass_hat_k([4, 2, 0], n=4, k=1) == pytest.approx(0.5)
    assert A.pass_hat_k([4, 2, 0], n=4, k=2) == pytest.approx((1 + 1 / 6 + 0) / 3)


@pytest.mark.parametrize("env_id, task_id, doc", [(envs.FLIGHT_ID, 511821, envs.__doc__),
                                                   (envs.CODE_ID, 850624, envs.CodeRepairEnv.__doc__),
                                                   (envs.VAULT_ID, 473188, envs.VaultEnv.__doc__)])
def test_docstring_worked_episodes_are_real_transcripts(env_id, task_id, doc):
    env = gym.make(env_id)                                           # the default settings, injection included
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
# Homework handout: blanks every exercise, leaks no solution, round-trips, grades each piece alone
# ------------------------------------------------------------------------------------------------
REPO = Path(A.__file__).resolve().parent


# ------------------------------------------------------------------------------------------------
# 05 · Training system: asynchronous rollout, torchrun, resume, monitors, bench
# ------------------------------------------------------------------------------------------------
MONITOR_KEYS = {"success", "reward", "turns", "truncation_rate", "clip_frac", "approx_kl", "entropy", "zero_std_groups",
                "invalid_rate", "gate_denials", "tool_errors", "tool_calls", "cost", "generated_tokens", "staleness_mean",
                "staleness_max", "refused_stale", "grad_norm", "skipped_updates", "iteration", "policy_version",
                "world_size", "rollout_seconds", "learner_seconds", "episodes_per_second", "denied_positive_advantage",
                "kept", "dpo_pairs", "groups_without_pair", "dpo_loss", "process_rewards", "learner_steps", "kl_ref",
                "elapsed_seconds", "explained_variance", "truncated_by"}


def small_run(tmp_path, name, **overrides):
    cfg = tiny_config(run_dir=str(tmp_path / name), iterations=3, eval_episodes=10, pass_k_tasks=4, **overrides)
    return A.train(cfg, progress=False), [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]


def test_async_rollout_has_staleness_one_by_schedule_and_is_reproducible(tmp_path, capsys):
    summary, metrics = small_run(tmp_path, "a1", async_rollout=True, max_staleness=1)
    assert summary["staleness_histogram"] == {"0": 1, "1": 2} and summary["refused_stale"] == 0
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
    assert done.stdout.count("config: ") == 1 and done.stdout.count("wrote ") == 1, "rank 1 must stay silent"
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [m["world_size"] for m in metrics] == [2, 2]


def test_bench_quick_writes_valid_json(tmp_path, capsys):
    report = A.bench("cpu", quick=True, out=str(tmp_path))
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["rollout"]["kv_cache_tokens_per_s"] > 0 and saved["learner"]["ms_per_step"] > 0
    assert 140_000 < saved["reference_unit"]["parameters"] < 155_000 and saved["peak_rss_mb"] > 0


# ------------------------------------------------------------------------------------------------
# 03 / 04 · Every credit signal and training route
# ------------------------------------------------------------------------------------------------
def test_step_group_advantages_hand_built_group():
    keys, returns = ["s0", "s0", "s1", "s1", "s2"], [1.0, 0.0, 1.0, 1.0, 0.0]
    assert A.step_group_advantages(keys, returns).tolist() == pytest.approx([1, -1, 0, 0, 0], abs=1e-4)
    assert A.step_group_advantages(keys, returns, std="none").tolist() == pytest.approx([0.5, -0.5, 0, 0, 0])


def test_stepgroup_credits_the_turn_where_a_shared_state_diverges():
    grpo_vs_step = A.worked_group()                 # [episode][turn] = (action, grpo, stepgroup)
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


@pytest.mark.parametrize("algo", ["grpo", "stepgroup", "gae", "reinforce", "rs_sft", "dpo"])
def test_every_route_runs_two_iterations(tmp_path, algo, capsys):
    cfg = tiny_config(algo=algo, run_dir=str(tmp_path / algo), iterations=2, eval_episodes=8, pass_k_tasks=2,
                      warm_start_episodes=30, sft_epochs=1, deny_credit="shared",
                      process_coef=0.1 if algo in A.PPO_CREDITS else 0.0)
    summary = A.train(cfg, progress=False)
    metrics = [json.loads(line) for line in open(tmp_path / algo / "metrics.jsonl")]
    assert len(metrics) == 2 and all(set(m) == MONITOR_KEYS for m in metrics)
    assert summary["algo"] == algo and (metrics[0]["kept"] is not None) == (algo == "rs_sft")
    assert (metrics[0]["dpo_pairs"] is not None) == (algo == "dpo")
    check_report(tmp_path / algo, route_has_advantages=algo in A.PPO_CREDITS)  # each route's own monitors drawn


def test_denied_turns_can_be_kept_from_positive_credit():
    cfg = tiny_config(deny_credit="nonpositive")
    ok = make_episode("good", turns=[make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa]),
                                     make_turn([TOK.obs, 9, TOK.act], [8, TOK.eoa], reward=1.0, terminated=True)])
    ok.turns[0].gate_allowed, ok.turns[0].gate_reason = False, "wrong_passenger"
    bad = make_episode("bad", turns=[make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], reward=0.0, terminated=True)])
    opt = lambda p: torch.optim.AdamW(p.parameters(), lr=1e-4)
    policy = A.make_policy(cfg, len(TOK), "cpu")
    for rule, want in (("shared", 1), ("nonpositive", 1)):
        m = A.learn(policy, opt(policy), None, TOK, replace_cfg(cfg, deny_credit=rule), A.TrajectoryStore(0, len(TOK)),
                    A.GradMonitor(), [copy_episode(ok, rule), copy_episode(bad, rule)], 0)
        assert m["denied_positive_advantage"] == want, "the denied turn of a winning episode gets +A before capping"
    adv, _, _ = A.advantages_for(A.pack([ok, bad], TOK, 32), [ok, bad], None, cfg)
    capped = torch.where(A.denied_turns([ok, bad], 2), adv.clamp(max=0.0), adv)
    assert adv[0, 0] > 0 and capped[0, 0] == 0 and capped[0, 1] == adv[0, 1]


def copy_episode(ep, suffix):
    out = __import__("copy").deepcopy(ep)
    out.episode_id += "-" + suffix
    return out


def test_compare_runs_every_route_from_one_warm_start(tmp_path, capsys):
    cfg = tiny_config(iterations=1, eval_episodes=6, pass_k_tasks=2, warm_start_episodes=20, sft_epochs=1)
    result = A.compare(cfg, [0, 1], ["grpo", "dpo"], out=str(tmp_path), progress=False)
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


# ------------------------------------------------------------------------------------------------
# What a careful reader and an attacker tried: every promise holds, every bad input is refused by name
# ------------------------------------------------------------------------------------------------
TINY_FLAGS = ["--device", "cpu", "--warm-start-episodes", "0", "--iterations", "1", "--tasks-per-iter", "2",
              "--group-size", "2", "--eval-episodes", "4", "--pass-k-tasks", "2", "--n-embd", "32", "--n-head", "2"]


@pytest.fixture(scope="module")
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


def test_evaluation_settings_never_change_the_training_run(tmp_path, capsys):
    curves = []
    for k in (1, 4):
        _, metrics = small_run(tmp_path, f"k{k}", pass_k=k, warm_start_episodes=30, sft_epochs=1)
        curves.append([{key: v for key, v in m.items() if "second" not in key} for m in metrics])
    assert curves[0] == curves[1]


def test_flags_that_would_do_nothing_are_refused():
    for bad in (dict(algo="rs_sft", kl_coef=0.1), dict(algo="dpo", kl_coef=0.1), dict(algo="dpo", process_coef=0.1),
                dict(algo="rs_sft", process_coef=0.1)):
        with pytest.raises(ValueError, match="only used with algo"):
            A.validate_config(tiny_config(**bad))


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


def test_the_last_loose_refusals_name_what_is_wrong(tmp_path, capsys):
    for mutate, match in [(lambda ep: setattr(ep, "env_id", "NotAnEnv"), "env_id 'NotAnEnv'"),
                          (lambda ep: setattr(ep, "split", "test"), "split 'test'"),
                          (lambda ep: ep.turns[0].action_tokens.__setitem__(0, 10**9), "vocabulary")]:
        ep = make_episode("odd")
        mutate(ep)
        with pytest.raises(ValueError, match=match):
            A.TrajectoryStore(0, len(TOK)).add(ep, current_version=0)
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


def edited_copy(default_runs, tmp_path) -> Path:
    """A copy of the finished default run, to edit as an attacker or an accident would."""
    __import__("shutil").copytree(default_runs / "runs" / "flightbooking-grpo-s0", tmp_path / "run")
    return tmp_path / "run"


def test_show_html_refuses_a_metrics_line_whose_drawn_value_is_not_a_number(default_runs, tmp_path, capsys):
    run = edited_copy(default_runs, tmp_path)
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    (run / "metrics.jsonl").write_text(json.dumps({**metrics[0], "iteration": "0"}) + "\n")  # was a TypeError
    with pytest.raises(SystemExit, match="metrics.jsonl line 1: iteration is '0', not a number; restore it or move it"):
        A.main(["show", "--ckpt", str(run / "final.pt"), "--n", "1", "--html"])
    (run / "metrics.jsonl").write_text(json.dumps({**metrics[0], "truncated_by": {"turn_budget": True}}) + "\n")
    with pytest.raises(ValueError, match="line 1: turn_budget is True, not a number"):
        A.curves_html([json.loads(line) for line in open(run / "metrics.jsonl")])
    (run / "metrics.jsonl").write_text(json.dumps(metrics[0]) + "\n")
    summary = json.loads((run / "summary.json").read_text())
    del summary["release_gates"][0]["value"]                                # was a KeyError from gates_html
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit, match="summary.json or metrics.jsonl lacks or mangles 'value'; restore or move it"):
        A.main(["show", "--ckpt", str(run / "final.pt"), "--n", "1", "--html"])


def test_resume_refuses_a_state_its_history_cannot_have_made_and_a_metrics_file_that_is_not_a_file(default_runs,
                                                                                                  tmp_path, capsys):
    run = edited_copy(default_runs, tmp_path)
    state = torch.load(run / "state.pt", weights_only=True)
    state["config"]["iterations"] = 2                                      # one iteration left: a run to resume
    torch.save({**state, "version": 99}, run / "state.pt")                # was resumed, as policy 99
    with pytest.raises(SystemExit, match="state.pt has version 99 after 1 iterations, one version each; it is damaged"):
        A.main(["train", "--resume", str(run)])
    torch.save(state, run / "state.pt")                                    # version 1 after 1 iteration, as written
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()                                        # was an IsADirectoryError
    with pytest.raises(SystemExit, match="its metrics.jsonl is not a file; move it away"):
        A.main(["train", "--resume", str(run)])


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


def test_every_release_gate_carries_numbers():
    inc = report_card([1] * 50 + [0] * 50)
    _, _, gates = A.promotion_decision(report_card([1] * 70 + [0] * 30, credits=9.0), inc)
    assert gates[0]["wins"] == 20 and gates[0]["losses"] == 0 and gates[0]["observed"] == pytest.approx(A.sign_test_p(20, 0))
    for g in gates:
        assert isinstance(g["observed"], (int, float)) and isinstance(g["limit"], (int, float)), g
    json.dumps(gates)                                                    # plain JSON for summary.json


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


def test_show_prints_what_there_is_when_no_episode_succeeds(tmp_path, capsys):
    cfg = tiny_config(group_size=2)
    A.save_checkpoint(tmp_path / "p.pt", A.make_policy(cfg, len(TOK), "cpu"), TOK, cfg, 0)
    A.show(str(tmp_path / "p.pt"), n=2)
    out = capsys.readouterr().out
    assert "only 0 successful episodes" in out and out.count("success=False") == 2
    with pytest.raises(ValueError, match="--n"):
        A.show(str(tmp_path / "p.pt"), n=0)


def test_each_environment_has_its_own_warm_start_length():
    cfg = tiny_config(env=envs.CODE_ID, warm_start_episodes=4)
    policy = A.make_policy(cfg, len(A.make_tokenizer(envs.CODE_ID)), "cpu")
    assert A.warm_start(policy, A.make_tokenizer(envs.CODE_ID), cfg, "cpu", progress=False)["epochs"] == 8
    assert A.SFT_EPOCHS[envs.FLIGHT_ID] == 4 and A.Config().sft_epochs == 0


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
        A.bench("cpu", quick=True, out=str(tmp_path / "file"))
    with pytest.raises(ValueError, match="seed"):
        A.play(envs.FLIGHT_ID, seed=-1, stream=iter([]))


def test_the_command_line_never_guesses(tmp_path, capsys, monkeypatch):
    for argv, match in [(["compare", "--seed", "3"], "unrecognized arguments: --seed"),
                        (["--seed", "3", "train"], "put the command first")]:
        with pytest.raises(SystemExit) as usage:
            A.main(argv)
        assert usage.value.code == 2 and match in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    A.main(["compare", "--seeds", "0", "--algos", "grpo", "--out", str(tmp_path / "c")] + TINY_FLAGS)
    assert json.loads((tmp_path / "c" / "compare.json").read_text())["routes"]["grpo"]["per_seed"][0]["seed"] == 0


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


def test_a_booking_in_another_class_is_denied_and_counted_as_unauthorized():
    env = gym.make(envs.FLIGHT_ID, injection_rate=0.0)
    _, info = env.reset(seed=3)
    t = info["task"]
    other = next(c for c in envs.CLASSES if c != t["class"])
    flight = env.unwrapped.state.task.flights[0].number
    assert A.HostGate.for_env(env).authorize(f"book {flight} {t['passenger']} {other}").reason == "wrong_class"
    env.step(f"book {flight} {t['passenger']} {other}")                  # straight to the env, no gate
    assert envs.evaluate_flight_episode(env).unauthorized_side_effects == 1


# ------------------------------------------------------------------------------------------------
# 01 / 03 · The clock is part of the task; each cut is named and credited by its rule; two views
# ------------------------------------------------------------------------------------------------
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
    policy, tok, _, _ = A.load_checkpoint(run_dir / "final.pt", "cpu")
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
    assert metrics[1]["dev_success"] is not None and "report.html" in capsys.readouterr().out
    check_report(tmp_path / "r")
    states = lambda: (torch.get_rng_state(), np.random.get_state()[1].tolist(), __import__("random").getstate())
    policy, tok, cfg, version = A.load_checkpoint(tmp_path / "r" / "final.pt", "cpu")
    before = states()
    A.write_report(tmp_path / "alone" / "report.html", policy, tok, cfg, version)  # no records: the episodes only
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
    assert chips == [(algo, a) for ep in A.worked_group() for _, g, s in ep for algo, a in (("grpo", g), ("stepgroup", s))]


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
    A.main(["show", "--ckpt", str(run / "final.pt"), "--n", "1", "--html"])
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
    A.write_page(tmp_path / "episode.html", "--html", markup("title"), A.episode_html(ep, tok, None, 1.0, 8, markup("caption")))
    nothing_live(tmp_path / "episode.html", ["word", "cut", "gate", "title", "caption"])

    record = {"test_success_mean": 0.5, "min": 0.5, "max": 0.5, "pass^k_mean": 0.5, "wall_seconds_mean": 1.0,
              "per_seed": [{"success": 0.5, "first_at_0.9": 1}]}
    result = planted({"env": envs.FLIGHT_ID, "seeds": [0], "iterations": 2, "episodes_per_iteration": 4,
                      "eval_episodes": 4, "config": {"pass_k": 1}, "routes": {"grpo": record}})
    result["routes"] = {markup("route"): {**result["routes"]["grpo"], "curves": [[0.5, 1.0]]}}  # drawn as numbers
    A.write_compare(tmp_path / "compare.html", result)
    nothing_live(tmp_path / "compare.html", ["route", "env", "seeds.0", "iterations", "episodes_per_iteration",
                                             "eval_episodes", "config.pass_k", *(f"routes.grpo.{key}" for key in record if key != "per_seed"),
                                             "routes.grpo.per_seed.0.success", "routes.grpo.per_seed.0.first_at_0.9"])


# ------------------------------------------------------------------------------------------------
# Homework checks. One table, run two ways: here by pytest (`-m homework`, in this process), and by
# `python agentic_rl.py grade DIR`, which calls a submission's code in a process of its own and runs
# every check in the grader's process. A check gets `m`, the module under test: agentic_rl itself, or
# the student's, seen through the grader. Each uses hand-computed numbers and properties of its own
# piece only; hidden checks (kept out of handouts) use other inputs and compare with the reference, A.
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
    for name, change in STORE_BAD.items():
        ep = make_episode("bad", version=1)
        change(ep)
        e = refusal(lambda: m.TrajectoryStore(1, len(TOK)).add(ep, 1))
        assert isinstance(e, ValueError) and type(e).__name__ == "ValueError", \
            f"TrajectoryStore(1, vocab_size).add(an episode with {name}, current_version=1)\n  expected " \
            f"ValueError\n  obtained {type(e).__name__ if e else 'nothing raised: admitted'}"


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


GOLDEN_P = {(20, 0): 2 ** -20, (2, 0): 0.25, (0, 0): 1.0, (30, 0): 2 ** -30, (29, 0): 2 ** -29, (38, 0): 2 ** -38}


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


GATE_NAMES = ["significant gain", "unauthorized side effects", "safety denials", "category all",
              "cost tokens_per_success", "cost tool_calls_per_success", "cost credits_per_success"]


@check("promotion")
def promotion_truth_table(m):
    inc = report_card([1] * 50 + [0] * 50)
    for name, candidate, promoted, failed in [
            ("20 more tasks solved, cheaper", report_card([1] * 70 + [0] * 30, credits=9.0), True, []),
            ("2 more tasks (p = 0.25)", report_card([1] * 52 + [0] * 48), False, ["significant gain"]),
            ("the same tasks", inc, False, ["significant gain"]),
            ("one more safety denial", report_card([1] * 70 + [0] * 30, safety=1), False, ["safety denials"]),
            ("one unauthorized side effect", report_card([1] * 70 + [0] * 30, unauthorized=1), False,
             ["unauthorized side effects"]),
            ("twice the cost per success", report_card([1] * 70 + [0] * 30, credits=20.0), False,
             ["cost tokens_per_success", "cost tool_calls_per_success", "cost credits_per_success"])]:
        ok, reason, gates = promotion(m, candidate, inc)
        same([ok, [g["gate"] for g in gates], [g["gate"] for g in gates if not g["passed"]]],
             [promoted, GATE_NAMES, failed], f"promotion_decision, candidate with {name}: [promoted, gates, failed gates]")
        assert failed == [] or failed[0] in reason, f"the reason must name the first failed gate {failed[0]!r}: {reason}"


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
    inc = report_card([1] * 50 + [0] * 50, safety=2)
    _, _, gates = promotion(m, report_card([1] * 70 + [0] * 30, credits=9.0, safety=1), inc)
    first = gates[0]
    same([first["wins"], first["losses"], first["observed"], first["limit"]], [20, 0, 2 ** -20, A.GATE_LEVEL],
         "the significant-gain gate: [wins, losses, observed p, limit]", tol=1e-9)
    same([[g["observed"], g["limit"]] for g in gates[1:3]], [[0, 0], [1, 2]],
         "[observed, limit] of the unauthorized-side-effects and safety-denials gates")
    same(gates[4]["limit"], 1.25 * 1000 / 50, "the tokens-per-success gate's limit: 1.25 x the incumbent's 20.0")


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
    curve = [round(m.get("success", -1), 4) for m in metrics]
    assert len(metrics) == config["iterations"] and curve == summary.get("train_success_curve"), \
        f"{what}: metrics.jsonl and summary.json disagree (iterations, or the training success per iteration)"
    for part in ("warm_start", "candidate"):
        dev = (summary.get(part) if isinstance(summary.get(part), dict) else {}).get("dev_success")
        assert type(dev) in (int, float) and 0 <= dev <= 1, f"{what}: summary.json's {part} dev_success is not a " \
                                                            f"number in [0, 1]\n  obtained {dev!r}"
    return summary


@check("clock", table=EXPERIMENT_CHECKS)
def clock_numbers_are_your_runs_own_records(answers, key):
    seeds = your_seeds(key)
    clock = answers.get("clock") if isinstance(answers.get("clock"), dict) else {}
    got = {k: clock.get(k) for k in CLOCK_SETTINGS}
    assert all(isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in v)
               for v in got.values()), f"answers.json: clock must map each of {list(CLOCK_SETTINGS)} to the final " \
                                       f"dev success of your seeds {seeds}\n  obtained {got}"
    assert len(str(clock.get("why", "")).split()) >= 15, "answers.json: clock.why must explain the result (15 words or more)"
    runs = clock.get("runs") if isinstance(clock.get("runs"), dict) else {}
    for setting, flags in CLOCK_SETTINGS.items():
        records = runs.get(setting)
        assert isinstance(records, list) and len(records) == 3, \
            f"answers.json: clock.runs.{setting} must hold the three runs' records (your seeds {seeds}, in order)"
        for i, record in enumerate(records):
            summary = record_of(record, f"clock.runs.{setting}[{i}]", seeds[i], **E3_RUN, **flags)
            reported = clock[setting][i]
            assert abs(reported - summary["candidate"]["dev_success"]) <= 5e-4, \
                f"answers.json: clock.{setting}[{i}] = {reported}, but that run's summary.json says candidate " \
                f"dev_success {summary['candidate']['dev_success']}"


@check("silent_bug", table=EXPERIMENT_CHECKS)
def silent_bug_answer_carries_the_runs_before_and_after_the_fix(answers, key):
    seeds = your_seeds(key)
    named, evidence = answers.get("silent_bug"), str(answers.get("silent_bug_evidence", ""))[:5000]
    assert isinstance(named, str) and named.strip(), "answers.json: silent_bug must say what the bug is and how you " \
                                                     "fixed it"
    assert len(evidence.split()) >= 20 and any(k in evidence for k in MONITOR_KEYS) and re.search(r"\d", evidence), \
        "answers.json: silent_bug_evidence must be at least 20 words that cite a metric of metrics.jsonl (e.g. " \
        f"clip_frac) and its values in your runs\n  obtained {evidence!r}"
    for field, when in (("silent_bug_runs", "with the bug"), ("silent_bug_fixed_runs", "after your fix")):
        runs = answers.get(field)
        assert isinstance(runs, list) and len(runs) == 6, f"answers.json: {field} must hold six run records {when}: " \
                                                          f"the demo and CodeRepair with gae, your seeds {seeds} each"
        for i, record in enumerate(runs):
            record_of(record, f"{field}[{i}]", seeds[i % 3], **E8_RUNS[i // 3])


# BEGIN GRADER ONLY: the hidden checks, kept out of handouts
@check("clock", hidden=True, table=EXPERIMENT_CHECKS)
def clock_numbers_show_the_effect_the_reference_runs_show(answers, key):
    """Judged on the pairs (one seed, one clock setting: both runs share the warm start) whose warm start can
    already repair: from one below WARM_ENOUGH neither setting learns (seed 43064: 0.125 -> 0.110 and 0.125),
    which says nothing about the clock; fewer than two such pairs: not checked. Measured (README, E3): on the
    eleven such pairs of seeds 0, 1, 2, 43064, 32980, 3329, valuing the budget 0 reached 1.000 every time, and
    bootstrapping it lost 0.54-1.00 of it on nine and 0.00-0.005 on two; requiring a mean loss of 0.2 fails an
    honest student with five or six such pairs about one time in 500 (those eleven losses, resampled)."""
    clock_numbers_are_your_runs_own_records(answers, key)
    clock, pairs = answers["clock"], []
    for value, boot in (("value_zero", "bootstrap_budget"), ("hidden_clock_value_zero", "hidden_clock_bootstrap_budget")):
        for i in range(3):
            warm = [clock["runs"][k][i]["summary"]["warm_start"]["dev_success"] for k in (value, boot)]
            assert warm[0] == warm[1], f"answers.json: clock.runs.{value}[{i}] and {boot}[{i}] differ in warm start " \
                                       f"({warm[0]} and {warm[1]}): one seed's warm start does not depend on the value"
            pairs += [(clock[value][i], clock[boot][i])] if warm[0] >= WARM_ENOUGH else []
    if len(pairs) < 2:
        raise NotChecked(f"only {len(pairs)} of your six (seed, clock) pairs start from a warm start that can repair "
                         f"(dev success >= {WARM_ENOUGH})")
    value, boot = (round(sum(p[j] for p in pairs) / len(pairs), 3) for j in (0, 1))
    assert value >= 0.8, f"answers.json: with the budget valued 0 the reference reaches 1.000 on every seed; " \
                         f"your {len(pairs)} pairs from a warm start that can repair: mean {value}"
    assert value - boot >= 0.2, f"answers.json: bootstrapping the budget loses 0.70 of the mean dev success in the " \
                                f"reference runs (0.2 or more expected); your pairs: {value} valued 0, {boot} bootstrapped"
    why = str(clock.get("why", "")).lower()
    assert any(w in why for w in ("bootstrap", "v(s", "value")) and any(w in why for w in ("turn", "budget", "clock")), \
        "answers.json: clock.why must say what the value after the budget does (bootstrap / V(s)) to the turns"


def numbers_in(text: str) -> list:
    """(value, decimals shown) of every number written in a text."""
    return [(float(s), len(s.split(".")[1]) if "." in s else 0) for s in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", text)]


@check("silent_bug", hidden=True, table=EXPERIMENT_CHECKS)
def silent_bug_evidence_quotes_the_runs_numbers(answers, key):
    """The evidence quotes, for every seed, a value (one iteration's, or the run's mean, to the digits
    written) of a metric it names, read from that seed's records with the bug; 24 numbers at most, so that
    it cannot list every value. It makes a made-up answer cost reading; a rerun is what proves a record."""
    silent_bug_answer_carries_the_runs_before_and_after_the_fix(answers, key)
    evidence, runs = str(answers["silent_bug_evidence"])[:5000], answers["silent_bug_runs"]
    cited, written = [k for k in MONITOR_KEYS if re.search(rf"\b{k}\b", evidence)], numbers_in(evidence)
    assert len(written) <= 24, f"answers.json: silent_bug_evidence writes {len(written)} numbers; quote at most 24 " \
                               "(a list of every value would match any run)"
    for seed in range(3):
        values = [v for i in (seed, seed + 3) for k in cited for v in [m.get(k) for m in runs[i]["metrics"]] +
                  [mean_of(runs[i]["metrics"], k) if all(isinstance(m.get(k), (int, float)) for m in runs[i]["metrics"])
                   else None] if isinstance(v, (int, float))]
        assert any(abs(v - x) <= (0.5 * 10 ** -d if d else 0) + 1e-12 for v in values for x, d in written), \
            f"answers.json: silent_bug_evidence quotes no value of {cited or 'a metric'} that your seed " \
            f"{key['seeds'][seed]}'s runs logged"


@check("silent_bug", hidden=True, table=EXPERIMENT_CHECKS)
def silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not(answers, key):
    """What running shows, whatever the answer calls the bug (a handout can be diffed against the public
    repository): the planted bug's signature is in the runs of its environment with the bug on two seeds of
    three, and in the same runs after the fix on one at most."""
    silent_bug_answer_carries_the_runs_before_and_after_the_fix(answers, key)
    assert key["silent_bug"] in SILENT_BUGS, key.get("why") or "the grader was not told which bug was planted " \
        "(grade --silent-bug ID, the bundle's silent_bug.txt, or a handout id with the course's secret)"
    env_id, signature, holds = SILENT_BUGS[key["silent_bug"]][4]
    judged = lambda r: r["summary"]["config"]["env"] == env_id and r["summary"]["warm_start"]["dev_success"] >= \
        WARM_ENOUGH    # from a warm start that cannot repair, even a fixed run stalls (truncation 0.66 at seed 43064)
    before, after = ([holds(r["metrics"]) for r in answers[field] if judged(r)]
                     for field in ("silent_bug_runs", "silent_bug_fixed_runs"))
    if min(len(before), len(after)) < 2:
        raise NotChecked(f"fewer than two runs with the bug or after the fix start from a warm start that can repair "
                         f"(dev success >= {WARM_ENOUGH})")
    assert sum(before) >= 2, f"the runs in silent_bug_runs do not show the planted bug's signature ({signature})"
    assert sum(after) <= 1, f"the runs in silent_bug_fixed_runs still show the planted bug's signature ({signature}): " \
                            "the bug is not fixed"


@check("mask", hidden=True)
def mask_matches_the_reference_on_other_episodes(m):
    mask_invariants_on_random_episodes(m, seed=int(hidden_rng(11).integers(2**31)))
    episodes = random_episodes(5, seed=int(hidden_rng(12).integers(2**31)))
    for ep in episodes:
        ep.final_obs_tokens = [TOK.obs, 9, 9, 9, TOK.act]
    same(m.pack(episodes, m.make_tokenizer(envs.FLIGHT_ID), 80), A.pack(episodes, TOK, 80),
         "pack() of five other episodes, long final observations: every field")


@check("returns", hidden=True)
def returns_match_the_reference_on_other_inputs(m):
    rng = hidden_rng(21)
    returns_satisfy_the_recursion(m, seed=int(rng.integers(2**31)))
    for rewards, gamma in [(rng.normal(size=k).round(2).tolist(), round(float(rng.random()), 2)) for k in (1, 2, 9)]:
        same(m.discounted_returns(rewards, gamma), A.discounted_returns(rewards, gamma),
             f"discounted_returns({rewards}, gamma={gamma})")


@check("gae", hidden=True)
def gae_matches_the_reference_on_other_inputs(m):
    rng = hidden_rng(31)
    for _ in range(5):
        k = int(rng.integers(1, 7))
        r, v = rng.normal(size=k).round(3).tolist(), rng.normal(size=k).round(3).tolist()
        last, boot, gamma, lam = round(float(rng.normal()), 3), bool(rng.random() < 0.5), round(float(rng.random()), 2), \
            round(float(rng.random()), 2)
        same(m.gae(r, v, last, boot, gamma, lam), A.gae(r, v, last, boot, gamma, lam),
             f"gae({r}, {v}, last_value {last}, bootstrap={boot}, gamma {gamma}, lam {lam})", tol=1e-4)


@check("grpo", hidden=True)
def grpo_matches_the_reference_on_other_inputs(m):
    rng = hidden_rng(41)
    rows = torch.tensor(rng.integers(0, 2, size=(5, 8)), dtype=torch.float32)
    for std in ("population", "unbiased", "none"):
        same(m.group_advantages(rows, std=std), A.group_advantages(rows, std=std),
             f"group_advantages(0/1 rewards {rows.tolist()}, std={std!r})", tol=1e-4)
    pair = rng.normal(size=2).round(2).tolist()
    same(m.group_advantages(pair), A.group_advantages(pair), f"group_advantages({pair})", tol=1e-4)


@check("ppo_clip", hidden=True)
def ppo_clip_matches_the_reference_on_other_inputs(m):
    g = torch.Generator().manual_seed(int(hidden_rng(51).integers(2**31)))
    logp, old = torch.randn(3, 6, generator=g) * 0.4, torch.randn(3, 6, generator=g) * 0.4
    adv, mask = torch.randn(3, 6, generator=g), (torch.rand(3, 6, generator=g) > 0.3).float()
    for eps in (0.1, 0.3):
        got, want = with_grad(m.ppo_clip_loss, 0, logp, old, adv, mask, eps), with_grad(A.ppo_clip_loss, 0, logp, old,
                                                                                       adv, mask, eps)
        same(got, want, f"ppo_clip_loss on random 3 x 6 inputs, eps {eps}: ((loss, stats), gradient)", tol=1e-4)


@check("kl_k3", hidden=True)
def kl_k3_matches_the_reference_on_other_inputs(m):
    g = torch.Generator().manual_seed(int(hidden_rng(61).integers(2**31)))
    a, b = torch.randn(2, 7, generator=g), torch.randn(2, 7, generator=g)
    same(m.kl_k3(a, b), A.kl_k3(a, b), "kl_k3 on random 2 x 7 inputs", tol=1e-5)


@check("store_refusals", hidden=True)
def store_refuses_what_cannot_happen(m):
    impossible = {"a future version": lambda ep: setattr(ep, "policy_version", 3) or setattr(ep.turns[0], "policy_version", 3),
                  "a positive log-prob": lambda ep: ep.turns[0].action_logprobs.__setitem__(0, 0.5),
                  "a reward of 5": lambda ep: setattr(ep.turns[0], "reward", 5.0),
                  "a negative cost": lambda ep: setattr(ep.turns[0], "cost", -1.0),
                  "a token id beyond the vocabulary": lambda ep: ep.turns[0].obs_tokens.append(len(TOK)),
                  "a negative token id": lambda ep: ep.turns[0].action_tokens.__setitem__(0, -1),
                  "both terminated and truncated": lambda ep: setattr(ep.turns[0], "truncated", True),
                  "no ending": lambda ep: setattr(ep.turns[0], "terminated", False),
                  "a truncated turn naming no cut": lambda ep: setattr(ep.turns[0], "terminated", False) or
                  setattr(ep.turns[0], "truncated", True),
                  "a bool reward": lambda ep: setattr(ep.turns[0], "reward", True),
                  "an id that is a number": lambda ep: setattr(ep, "episode_id", 7)}
    for name, change in impossible.items():
        ep = make_episode("odd", version=1)
        change(ep)
        e = refusal(lambda: m.TrajectoryStore(1, len(TOK)).add(ep, 1))
        assert isinstance(e, ValueError) and type(e).__name__ == "ValueError", \
            f"TrajectoryStore(1, vocab_size={len(TOK)}).add(an episode with {name}, 1)\n  expected ValueError\n  " \
            f"obtained {type(e).__name__ if e else 'nothing raised: admitted'}"
    ok = make_episode("cut", version=1, turns=[make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], version=1),
                                               make_turn([TOK.obs, 9, TOK.act], [8, TOK.eoa], version=1, truncated=True,
                                                         truncated_by="time_limit")])
    store = m.TrajectoryStore(0, len(TOK))
    store.add(ok, 1)
    same(store.staleness, {0: 1}, "a two-turn episode cut by a time limit is admitted; the staleness histogram")


@check("permission_rule", hidden=True)
def permission_rule_other_codes_and_the_other_environments_keep_their_rules(m):
    rule = m.envs.VaultEnv.permission_rule
    codes = [str(c) for c in hidden_rng(81).choice(np.arange(1, 31), size=5, replace=False)]
    probes = [("probe", [c], f"{c} is low") for c in codes[:3]]
    for code, want in [(codes[1], None), (codes[2], None), (codes[3], "open_unprobed"), (codes[4], "open_unprobed")]:
        same(rule({}, probes, "open", [code]), want, f"permission_rule after probing {', '.join(codes[:3])}: open {code}")
    same(rule({}, [("status", [], "status : locked")], "open", ["5"]), "open_unprobed", "status is not a probe")
    flight = {"passenger": "ana", "class": "economy", "legs": 1}
    same([m.envs.FlightBookingEnv.permission_rule(flight, [], "book", ["F1", "ben", "economy"]),
          m.envs.CodeRepairEnv.permission_rule({}, [], "rm", ["tests"])], ["wrong_passenger", "tests_read_only"],
         "the flight and code-repair rules still hold")


@check("sign_test", hidden=True)
def sign_test_matches_the_binomial_tail_elsewhere(m):
    for wins, losses in [(1, 0), (0, 1)] + [tuple(int(x) for x in hidden_rng(91 + i).integers(0, 50, size=2)) for i in range(3)]:
        n = wins + losses
        same(m.sign_test_p(wins, losses), sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n,
             f"sign_test_p({wins}, {losses})", tol=1e-9)


@check("promotion", hidden=True)
def promotion_matches_the_reference_on_other_report_cards(m):
    rng = hidden_rng(71)
    for _ in range(6):
        n = 60
        cats = {"a": {"tasks": 20, "success": float(rng.integers(0, 21)) / 20},
                "b": {"tasks": 40, "success": float(rng.integers(0, 41)) / 40}}
        inc = report_card(rng.integers(0, 2, size=n).tolist(), safety=int(rng.integers(0, 3)), categories=cats)
        cand = report_card(rng.integers(0, 2, size=n).tolist(), safety=int(rng.integers(0, 3)),
                           unauthorized=int(rng.random() < 0.2), credits=float(rng.integers(8, 14)),
                           categories={k: {**v, "success": min(1.0, v["success"] + float(rng.normal(0, 0.1)))}
                                       for k, v in cats.items()})
        got, want = m.promotion_decision(cand, inc), A.promotion_decision(cand, inc)
        fields_ = lambda out: [out[0], [[g["gate"], g["passed"], g["observed"], g["limit"]] for g in out[2]]]
        same(fields_(got), fields_(want), "promotion_decision on a random pair of report cards: [promoted, "
                                          "[gate, passed, observed, limit] each]", tol=1e-6)
# END GRADER ONLY


@pytest.mark.homework
@pytest.mark.parametrize("exercise, name, check_fn, hidden", HOMEWORK, ids=[f"{c[0]}-{c[1]}" for c in HOMEWORK])
def test_hw(exercise, name, check_fn, hidden):
    check_fn(A)


# BEGIN GRADER ONLY: the course's machinery (handouts, the grader, the autograder bundle) and its tests
# ================================================================================================
# The course's machinery. `python agentic_rl.py homework ...` and `python agentic_rl.py grade ...`
# land in course_main() below; it lives here, with the checks it runs, and every handout leaves it out.
# The grader treats the submission as hostile:
# - what the submission provides is read first (a link, a special file or a huge file is refused by
#   name); results are written last, after every process the submission started is gone;
# - each exercise runs in a fresh worker, forked from a server that has imported torch and nothing of
#   ours, in a session of its own, killed with everything it started, under a memory limit, with no
#   new privileges, no user namespace and no new unix socket (seccomp); as root, as an unprivileged
#   user in namespaces of its own (no network; its own IPC and process ids; a root holding its folder,
#   the system's libraries and nothing else of the machine), which can neither read the grading
#   installation (the grader refuses one it could read) nor write the results;
# - only inputs cross, on a socket of its own with length-prefixed frames (prints go elsewhere, as
#   bytes): never reference code or expected values. A piece that an exercise calls from another
#   exercise (promotion calls sign_test_p) is answered by the grader, value by value;
# - every verdict is reached in the grader's process; hidden checks carry half of each exercise's
#   points and draw their inputs from the course's secret (AGENTIC_RL_HIDDEN_SEED, or the bundle's
#   root-only hidden_seed.txt), so this public file is no answer key; the experiments are graded on
#   the runs' own records, made with seeds drawn for each student, and audited by training them again.
# ================================================================================================
import argparse
import fcntl
import hashlib
import hmac
import inspect
import os
import random
import shlex
import shutil
import socket
import stat
import struct
import tempfile
import textwrap
import threading
import time
import types
from dataclasses import fields, is_dataclass

REPO = Path(A.__file__).resolve().parent


EXERCISES = {  # id -> (points, the stub's message: what to write, the formula, shapes, returns, errors, where used)
    "mask": (10, "in pack(), per turn k build three lists as long as its tokens: its observation tokens get "
                 "mask 0, old log-prob 0.0 and turn_id -1; its action tokens get mask 1, their recorded "
                 "log-probs (0.0 each when action_logprobs is empty: demonstrations) and turn_id k. The final "
                 "observation is not in them. Every loss averages over this mask."),
    "returns": (6, "G_k = r_k + gamma * G_{k+1} with G_K = 0, backwards over the K turns; return a float tensor "
                   "(K,). gamma 0 gives the rewards back, gamma 1 the suffix sums. Used for stepgroup's returns."),
    "gae": (10, "delta_k = r_k + gamma * V(s_{k+1}) - V(s_k), where V(s_K) = last_value if bootstrap else 0; "
                "A_k = delta_k + gamma * lam * A_{k+1}; return (A, A + values), two float tensors (K,). Used by "
                "critic_credit (--algo gae; reinforce is lam = 1)."),
    "grpo": (10, "along the last dim (each row is one group): A = (r - mean) / (std + eps) with std the "
                 "population std ('population'), Bessel's n - 1 ('unbiased') or no division ('none'); a row whose "
                 "rewards are all equal gives exactly 0.0 (never NaN). Return a tensor shaped like rewards. Used "
                 "by group_credit (grpo) and step_group_advantages (stepgroup)."),
    "ppo_clip": (12, "r = exp(logprobs - old_logprobs); per token l = -min(r * A, clip(r, 1 - eps, 1 + eps) * A); "
                     "loss = sum(l * mask) / sum(mask), a 0-d tensor autograd can differentiate; return (loss, "
                     "{'clip_frac': share of masked tokens with |r - 1| > eps, 'approx_kl': masked mean of "
                     "(r - 1) - log r}), both stats Python floats. Used by ppo_step_loss."),
    "kl_k3": (6, "per token k3 = exp(d) - d - 1 with d = ref_logprobs - logprobs (mind the direction): a tensor "
                 "shaped like the inputs, >= 0, whose mean under pi is KL(pi || pi_ref). Used by ppo_step_loss "
                 "when --kl-coef > 0."),
    "store_refusals": (14, "the refusals that teach, after malformed() has refused wrong types, token ids outside "
                           "the vocabulary and impossible numbers. Raise StaleEpisode (the ValueError subclass above) "
                           "when current_version - policy_version > max_staleness (equal is fine; add_all counts "
                           "stale episodes and goes on). Raise ValueError for: a REQUIRED_FIELDS value that is None "
                           "or ''; an env_id not in envs.ENV_IDS; a split other than 'train'; an episode_id seen "
                           "before (take() keeps the ids); policy versions (the episode's and every turn's) that "
                           "differ, or exceed current_version; per turn: action_logprobs without one entry per "
                           "action token; an ending (terminated or truncated) anywhere but on the last turn, a last "
                           "turn without one, or both; truncated_by not in CUTS on a truncated turn, or not '' on "
                           "another. Used by learn() before every update."),
    "permission_rule": (8, "VaultEnv.permission_rule(task, executed, tool, args): return 'open_unprobed' when tool "
                           "is 'open' and no executed (t, a, obs) has t == 'probe' and a == args; otherwise fall "
                           "through to the return None below. Used by HostGate before anything executes."),
    "sign_test": (8, "p = P(X >= wins) for X ~ Binomial(n = wins + losses, 1/2): the sum over k = wins..n of "
                     "C(n, k) / 2^n, a Python float; 1.0 when n = 0. Used by promotion_decision."),
    "promotion": (16, "return (promoted, reason, gates). gates is a list of dicts, in this order, each with the keys "
                      "gate, value, rule, passed, observed, limit: 'significant gain' (wins / losses = paired dev "
                      "tasks the candidate alone / the incumbent alone solved, from per_task; observed "
                      "sign_test_p(wins, losses), limit GATE_LEVEL, passed observed < limit; also keys wins and "
                      "losses); 'unauthorized side effects' (observed the candidate's count, limit 0, passed =="
                      "); 'safety denials' (observed the candidate's safety_denials, limit the incumbent's, passed "
                      "<=); 'category NAME' for each of the incumbent's categories (observed the candidate's "
                      "success there, 0.0 if absent; limit the incumbent's success - max(MAX_CATEGORY_DROP, 1 / "
                      "tasks); passed observed >= limit - 1e-9); 'cost KEY' for KEY in tokens_per_success, "
                      "tool_calls_per_success, credits_per_success of efficiency (limit (1 + MAX_COST_GROWTH) x "
                      "the incumbent's, or None if that is None; passed if limit is None, or the candidate's value "
                      "is not None and <= limit). promoted = every gate passed; reason names the first failed "
                      "gate or says all passed; value and rule are free text. Used at the end of train()."),
}


EXERCISE_FILE = {ex: "envs.py" if ex == "permission_rule" else "agentic_rl.py" for ex in EXERCISES}
CALLBACKS = {"promotion": ["sign_test_p"]}   # another exercise's piece that this one calls: the grader answers
EXPERIMENTS = {"silent_bug": 20, "clock": 20}  # points of the open exercises graded from answers.json
SILENT_BUGS = {  # id -> (what a reader would call it, the function, the line as written, as planted, its signature)
    "loss_on_observations": ("the policy loss also covers observation and prompt tokens", "ppo_step_loss",
                             "ppo_clip_loss(logprobs, old_logprobs, adv, mask, cfg.clip_eps)",
                             "ppo_clip_loss(logprobs, old_logprobs, adv, (tokens > 0).float(), cfg.clip_eps)",
                             (envs.FLIGHT_ID, "mean clip_frac above 0.1", lambda ms: mean_of(ms, "clip_frac") > 0.1)),
    "ratio_always_one": ("the old log-probs are recomputed by the current policy, so the ratio starts at 1",
                         "ppo_step_loss", "ppo_clip_loss(logprobs, old_logprobs, adv, mask, cfg.clip_eps)",
                         "ppo_clip_loss(logprobs, logprobs.detach(), adv, mask, cfg.clip_eps)",
                         (envs.FLIGHT_ID, "clip_frac and approx_kl 0 in every iteration",
                          lambda ms: all(m["clip_frac"] == 0 and m["approx_kl"] == 0 for m in ms))),
    "one_group_per_batch": ("GRPO normalises rewards over the whole batch instead of each task's group",
                            "group_credit", "members = [b for b, of in enumerate(group_of) if of == g]",
                            "members = list(range(len(group_of)))",
                            (envs.FLIGHT_ID, "zero_std_groups 0 in every iteration",
                             lambda ms: all(m["zero_std_groups"] == 0 for m in ms))),
    "budget_bootstrapped": ("the value after the task's own budget is bootstrapped like an outside cut",
                            "should_bootstrap", "return ep.truncated and (", "return ep.truncated or (",
                            (envs.CODE_ID, "a training truncation_rate of 0.3 or more",
                             lambda ms: max(m["truncation_rate"] for m in ms) >= 0.3)),
}
HANDOUT_FILES = ("agentic_rl.py", "envs.py", "test_agentic_rl.py", "README.md", "requirements.txt", ".ci/run")
STRIPPED = {"test_agentic_rl.py": "# {} GRADER ONLY", "README.md": "<!-- {} ANSWER -->"}  # regions kept from handouts
MAX_REPLY_BYTES = 8 << 20           # a worker's reply; a check's message keeps MAX_MESSAGE characters of it
MAX_MESSAGE = 4000
SANDBOX_USER = "agentic_rl_student"   # made by the bundle's setup.sh; as root elsewhere, `nobody` stands in
MEMORY_LIMIT = 2 << 30                # bytes a worker may add to what torch already maps (all its processes together)
WORKER_TASKS = 64                     # processes and threads of a worker and all it starts, where a cgroup holds them
TASKS_WITHOUT_CGROUP = 8              # else the sandbox user's cap on them; each process has MEMORY_LIMIT / 8
CGROUP_ROOT = "/sys/fs/cgroup"        # where the machine mounts its cgroups (v2, or v1's memory and pids)


def mean_of(metrics, key) -> float:
    return sum(m[key] for m in metrics) / max(1, len(metrics))


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



SECRET_ENV = "AGENTIC_RL_HIDDEN_SEED"   # the course's secret: here, never on a command line, which every process reads
MAKE_A_SECRET = 'python -c "import secrets; print(secrets.token_hex(16))"'


def strong_secret(secret) -> str:
    """The course's secret, refused below 128 bits (32 hexadecimal digits): a short one (4242) is found from a
    single handout id by trying them all, and with it ids can be forged and hidden inputs computed."""
    secret = str(secret).strip()
    if not re.fullmatch(r"[0-9a-fA-F]{32,}", secret) or typed_secret(secret.lower()):
        raise ValueError(f"the course's secret holds fewer than 128 bits (it must be 32 or more hexadecimal digits, "
                         f"drawn at random, not a pattern; it has {len(secret)} characters): make one with "
                         f"{MAKE_A_SECRET} and put it in {SECRET_ENV} (a grading installation keeps it in "
                         "hidden_seed.txt, readable by root only)")
    return secret


def typed_secret(digits: str) -> bool:
    """A pattern someone typed, not drawn: fewer than 10 distinct digits, a period (42424242..., 0123...f0123...f),
    a palindrome, or 7 digits in a row that repeat or count up or down by one (0000000, 1234567, fedcba9). Drawn ones
    are refused rarely (measured: token_hex(16) 21 times in 300,000, token_hex(32) twice in 100,000): draw again."""
    steps = "".join({0: "=", 1: "+", 15: "-"}.get((int(b, 16) - int(a, 16)) % 16, ".") for a, b in zip(digits, digits[1:]))
    return (len(set(digits)) < 10 or digits == digits[::-1] or re.search(r"(=|\+|-)\1{5}", steps) is not None
            or any(digits == (digits[:p] * len(digits))[:len(digits)] for p in range(1, len(digits) // 2 + 1)))



def student_name(student) -> str:
    """A student as an id binds them: their name or email, case and spacing aside."""
    return " ".join(str(student).split()).casefold()


def mac(secret: str, *parts) -> bytes:
    """HMAC-SHA256 of these parts, keyed by the course's secret: without it nobody can compute one."""
    return hmac.new(secret.encode(), json.dumps(parts).encode(), hashlib.sha256).digest()


def handout_tag(secret: str, nonce: str, student: str, bug: str) -> str:
    """The handout id's tag: it names the student and the planted bug ('' for none) only to whoever holds the
    course's secret, and nobody without it can make one."""
    return mac(secret, "handout", nonce, student_name(student), bug).hex()[:16]


def experiment_seeds(secret: str, nonce: str, student: str) -> list:
    """The three seeds of a student's experiments (E3, E8): distinct, in [3, 100000), drawn from the secret and
    the handout, so that no published number (the README measured 0, 1, 2) and no classmate's answers them."""
    seeds, draw = [], 0
    while len(seeds) < 3:
        seed = 3 + int.from_bytes(mac(secret, "seeds", nonce, student_name(student), draw)[:8], "big") % 99_997
        seeds += [] if seed in seeds else [seed]
        draw += 1
    return seeds


def new_handout(secret: str, student: str, bug) -> tuple:
    """(id, seeds) of a handout made for one student: 'nonce-tag', bound to them and to its planted bug."""
    nonce = f"{random.SystemRandom().getrandbits(48):012x}"
    return f"{nonce}-{handout_tag(secret, nonce, student, bug or '')}", experiment_seeds(secret, nonce, student)


def issued_to(handout, secret: str, students) -> tuple:
    """(student, planted bug or '') of the handout whose id a submission carries, if this course issued it to
    one of `students`; else None."""
    nonce, _, tag = str(handout).partition("-")
    return next(((s, bug) for s in students for bug in ("", *SILENT_BUGS)
                 if hmac.compare_digest(handout_tag(secret, nonce, s, bug), tag)), None)


def answer_key(answers: dict, secret, students, silent_bug) -> dict:
    """What the experiments are graded against: this student's seeds and the bug planted in their handout,
    read from its id with the course's secret and their name; "why" says what is missing when they cannot be
    known. Without a secret (practice, no ids) the seeds are the README's and the bug is the grader's flag."""
    if not secret:
        return {"seeds": README_SEEDS, "silent_bug": silent_bug or installation_file("silent_bug.txt"), "why": ""}
    handout = answers.get("handout")
    found = issued_to(handout, secret, students) if isinstance(handout, str) else None
    if found is None:
        return {"seeds": None, "silent_bug": None, "why": "answers.json carries no handout id issued to you by this "
                "course: keep the \"handout\" your answers.json came with (a classmate's id, or an edited one, does "
                "not verify; each student's experiments have seeds of their own)"}
    student, bug = found
    return {"seeds": experiment_seeds(secret, handout.partition("-")[0], student), "silent_bug": bug or None, "why": ""}


def answers_template(handout_id=None, seeds=README_SEEDS) -> dict:
    """answers.json as a handout ships it: the keys the graded experiments (E3, E8) fill in, and the seeds
    they ask for."""
    return {**({"handout": handout_id} if handout_id else {}), "seeds": list(seeds), "silent_bug": "",
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
    grader and the open exercises' answers left out, and (--silent-bug) one realistic bug planted; with
    --student and the course's secret, answers.json carries an id bound to that student, which names the bug
    to the grader only, and the experiments' seeds drawn from it. Never in place."""
    src, out = REPO, Path(out).resolve()
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
    handout_id, seeds = (None, README_SEEDS) if student is None else new_handout(strong_secret(hidden_seed), student,
                                                                                 silent_bug)
    blanked, texts = [], {}
    for name in HANDOUT_FILES:
        texts[name] = (src / name).read_text()
        if name.endswith(".py"):
            blanked += solution_regions(texts[name], name)
            texts[name] = blank_solutions(texts[name], only, name)[0]
        if name in STRIPPED:
            texts[name] = strip_marked(texts[name], STRIPPED[name])
    if not blanked:
        raise ValueError(f"{src}: no solution regions found (is this already a handout?)")
    blanked = [ex for ex in blanked if only is None or ex in only]
    if silent_bug:
        texts["agentic_rl.py"] = plant(texts["agentic_rl.py"], silent_bug)
        texts["test_agentic_rl.py"] = strip_marked(texts["test_agentic_rl.py"], "# {} TESTS THAT NAME A SILENT BUG")
    texts["answers.json"] = json.dumps(answers_template(handout_id, seeds), indent=2) + "\n"
    try:
        for name, text in texts.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
            if (src / name).exists():
                shutil.copymode(src / name, out / name)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    return blanked


def handout_text(name: str) -> str:
    """A file as every handout has it (blanks only, nothing of a solution): what a worker imports in
    place of a student file that does not compile, so that one file's syntax error costs only its own."""
    return blank_solutions((REPO / name).read_text(), None, name)[0]



def to_wire(x, handles: dict):
    """A value as plain JSON for the grader's pipe: tensors, tuples, dicts, dataclasses tagged; any other
    object (a store, a function, a module) stays where it is and travels as a handle to it."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple)):
        items = [to_wire(v, handles) for v in x]
        return items if type(x) is list else {"~tuple": items}
    if isinstance(x, dict):
        return {"~dict": [[to_wire(k, handles), to_wire(v, handles)] for k, v in x.items()]}
    if isinstance(x, torch.Tensor):
        return {"~tensor": x.detach().cpu().tolist(), "dtype": str(x.dtype).split(".")[-1]}
    if isinstance(x, (np.ndarray, np.generic)):
        return to_wire(x.tolist(), handles)
    if is_dataclass(x) and not isinstance(x, type):
        return {"~dataclass": type(x).__name__, "fields": {f.name: to_wire(getattr(x, f.name), handles) for f in fields(x)}}
    if hasattr(x, "_wire_handle"):                    # the grader passing back a handle it was given
        return {"~handle": x._wire_handle}
    key = next((k for k, v in handles.items() if v is x), len(handles))
    handles[key] = x
    return {"~handle": key, "type": type(x).__name__}


def from_wire(x, build, handle):
    """The inverse of to_wire; build(name, fields) makes a dataclass, handle(tag) resolves a handle."""
    if isinstance(x, list):
        return [from_wire(v, build, handle) for v in x]
    if not isinstance(x, dict):
        return x
    if "~tuple" in x:
        return tuple(from_wire(v, build, handle) for v in x["~tuple"])
    if "~dict" in x:
        return {from_wire(k, build, handle): from_wire(v, build, handle) for k, v in x["~dict"]}
    if "~tensor" in x:
        return torch.tensor(x["~tensor"], dtype=getattr(torch, x["dtype"]))
    if "~dataclass" in x:
        return build(x["~dataclass"], {k: from_wire(v, build, handle) for k, v in x["fields"].items()})
    return handle(x)


# ------------------------------------------------------------------------------------------------
# The sandbox: a fork server, one worker per exercise, frames on a socket of their own
# ------------------------------------------------------------------------------------------------
def send(sock, message):
    """One frame: 8 bytes of length, then the JSON. Nothing the student prints can look like one."""
    data = json.dumps(message).encode()
    sock.sendall(struct.pack("!Q", len(data)) + data)


def receive(sock, limit: int, deadline=None):
    """The next frame's message, or None when the other side is gone; with a deadline (time.monotonic),
    TimeoutError once it passes, however slowly the bytes drip in."""
    def recv(n):
        if deadline is not None:
            sock.settimeout(max(0.0, deadline - time.monotonic()) or 1e-6)
        return sock.recv(n)
    head = b""
    while len(head) < 8:
        chunk = recv(8 - len(head))
        if not chunk:
            return None
        head += chunk
    size, data = struct.unpack("!Q", head)[0], bytearray()
    if size > limit:
        raise ValueError(f"a frame of {size} bytes (at most {limit})")
    while len(data) < size:
        chunk = recv(min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def serve(sock, callbacks):
    """The student's side, in the worker: import their agentic_rl.py and envs.py (the folder holds
    nothing else), then answer requests: getattr / call / grad on a handle (0 = agentic_rl, 1 = envs)
    with a value or what their code raised. It judges nothing and holds nothing of the reference: the
    pieces named in callbacks ask the grader for each value."""
    def raised(e):
        send(sock, {"raised": [c.__name__ for c in type(e).__mro__], "message": f"{e}"[:4000]})
    try:
        import agentic_rl as student
        import envs as student_envs
    except BaseException as e:
        return raised(e)
    table = {0: student, 1: student_envs}

    def ask_grader(name, *args):
        send(sock, {"callback": name, "args": to_wire(list(args), table)})
        reply = receive(sock, 1 << 20) or {"error": "no answer"}
        if "value" not in reply:
            raise ValueError(f"{name}{args}: {reply['error']}")
        return from_wire(reply["value"], None, None)
    for name in callbacks:
        setattr(student, name, lambda *args, _name=name: ask_grader(_name, *args))
    build = lambda name, f: getattr(student if hasattr(student, name) else student_envs, name)(**f)
    send(sock, {"ready": True})
    while (req := receive(sock, 1 << 26)) is not None:
        try:
            args = from_wire(req.get("args", []), build, lambda tag: table[tag["~handle"]])
            kwargs = from_wire(req.get("kwargs", {"~dict": []}), build, lambda tag: table[tag["~handle"]])
            target = table[req.get("target", 0)]
            if req["op"] == "getattr":
                result = getattr(target, req["name"])
            elif req["op"] == "call":
                result = target(*args, **kwargs)
            else:                                      # grad: the loss and d loss / d args[wrt]
                args[req["wrt"]] = args[req["wrt"]].detach().clone().requires_grad_()
                result = target(*args, **kwargs)
                (result[0] if isinstance(result, tuple) else result).backward()
                result = (result, args[req["wrt"]].grad)
            send(sock, {"value": to_wire(result, table)})
        except BaseException as e:                     # sys.exit too: it is an answer, not the end
            raised(e)


def worker(sock, out_fd: int, req: dict):
    """One exercise's process, set up before any student code runs: a session of its own, output to the
    grader's drain, no other descriptor, an empty session keyring of its own (not the grader's); as root,
    namespaces of its own (isolate: no network, its own System V IPC, process ids and files) and then the
    sandbox user, with a cap on processes; always a memory limit, a clean environment, no new privileges and
    a seccomp filter (lock_down). As root, its cgroup (the fork server's make_cgroup) holds it before
    anything else: memory and tasks limited for all it starts together; without one, the sandbox user's
    cap on processes and threads is lower and each process's memory limit a share of the worker's. Then
    serve(), or compile_only()."""
    import ctypes
    import resource
    try:
        os.setsid()
        ctypes.CDLL(None).syscall(250, 1, None)       # keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): a new, empty one
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.closerange(3, sock.fileno())
        os.closerange(sock.fileno() + 1, 1 << 16)
        os.chdir(req["folder"])
        for cgroup in req.get("cgroups", []):         # as root, first: all it starts is in the cgroup too
            with open(f"{cgroup}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        folder, isolation = req["folder"], "network shared, ipc shared, pids shared, files shared"
        memory, tasks = req["memory"], None           # the memory each process may add to what it maps now
        if os.getuid() == 0 and req["uid"] is not None:
            folder, isolation = isolate()
            tasks = req["tasks"] if req.get("cgroups") else req["tasks_without_cgroup"]
            memory //= 1 if req.get("cgroups") else tasks     # without a cgroup, tasks x memory is the worker's
            resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))   # the sandbox user's processes and threads
            os.setgroups([])
            os.setgid(req["gid"])
            os.setuid(req["uid"])
        torch.set_num_threads(min(torch.get_num_threads(), max(1, (tasks or 64) // 4)))  # its threads count as tasks
        mapped = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mapped + memory,) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 26,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        sys.path.insert(0, folder)
        os.environ.clear()
        os.environ.update(HOME=folder, PATH="/usr/bin:/bin", TMPDIR="/tmp")
        limits = f"memory {req['memory'] >> 20} MiB and {req['tasks']} tasks for the worker and all it starts " \
                 f"({req['cgroup']})" if req.get("cgroups") else f"memory {memory >> 20} MiB a process (no cgroup" + \
                 (f"; {tasks} tasks of the sandbox user: {tasks * memory >> 20} MiB in all)" if tasks else ")")
        isolation += ", " + limits + ", " + lock_down()
        send(sock, {"sandbox": {"uid": os.getuid(), "isolation": isolation}})
    except BaseException as e:                         # the grader's failure, reported as such
        send(sock, {"setup_failed": f"{type(e).__name__}: {e}"})
        os._exit(0)
    try:
        compile_only(sock, req["compile"]) if req.get("compile") else serve(sock, req["callbacks"])
    finally:
        os._exit(0)


def compile_only(sock, names):
    """A worker's other errand: do these files of its folder compile? Compiled here, under the worker's limits
    (a file can take the compiler minutes or gigabytes), and never run. Answers name -> None, or what the
    compiler raised (the kinds of exception, the message)."""
    found = {}
    for name in names:
        try:
            with open(name, "rb") as f:
                compile(f.read(), name, "exec")
            found[name] = None
        except Exception as e:                # SyntaxError, and what a pathological file makes of the compiler
            found[name] = {"raised": [c.__name__ for c in type(e).__mro__], "message": f"{e}"[:300]}
    send(sock, {"compiled": found})


def isolate() -> tuple:
    """As root, in the worker, before it becomes the sandbox user: namespaces of its own for the network
    (none at all), System V IPC (a shared-memory segment, semaphore or message queue it makes dies with it,
    unseen by the next exercise or student), process ids (it is process 1 of its own: it can signal nothing
    else, and when it ends the kernel kills all it started) and mounts (private_root: its folder, the
    system's libraries and nothing else of the machine). One the platform refuses stays shared. Returns
    (its folder as it now sees it, what holds: the grader's note)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    network = libc.unshare(0x40000000) == 0                  # CLONE_NEWNET
    ipc = libc.unshare(0x08000000) == 0                      # CLONE_NEWIPC
    pids = libc.unshare(0x20000000) == 0                     # CLONE_NEWPID: it takes effect for the next child
    if pids and os.fork() != 0:
        os._exit(0)           # this process stays outside; its child, process 1 inside, goes on (the fork server reaps it)
    files = libc.unshare(0x20000) == 0 and \
        libc.mount(b"none", b"/", None, 0x44000, None) == 0 and private_root(libc, pids)  # NEWNS; / MS_REC|MS_PRIVATE
    said = lambda holds, word="private": word if holds else "shared"
    return ("/tmp/work" if files else os.getcwd(),
            f"network {said(network, 'none')}, ipc {said(ipc)}, pids {said(pids)}, files {said(files)}")


def private_root(libc, own_proc: bool) -> bool:
    """The worker's whole filesystem, built in a small tmpfs mounted over /tmp and made its root: /tmp,
    /var/tmp, /dev/shm and /run/lock, writable by all and gone with it; /tmp/work, the exercise's folder
    (the current directory: the grader's copy of the submitted files), read-only; /dev's null, zero, full,
    random and urandom; /proc (with own_proc a fresh one, which shows the worker's processes alone, else
    the machine's); and, read-only, the system's programs, libraries and /etc and Python's own files
    (system_paths), each directory on the way to them with the owner and mode it has on the machine.
    Nothing else of the machine is in it: no classmate's folder, no grading installation, no socket of
    the host's services. False, with nothing changed, where the platform allows no mount; an OSError
    where one fails midway."""
    import ctypes

    def mount(source, target, fstype=None, flags=0):
        if libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags, None):
            raise OSError(f"mount {source} on {target}: errno {ctypes.get_errno()}")

    def bind(source, target):                      # MS_BIND | MS_REC, then MS_REMOUNT | MS_BIND | RDONLY | NOSUID | NODEV
        mount(source, target, flags=0x1000 | 0x4000)
        kept = os.statvfs(target).f_flag & (0x8 | 0x400 | 0x800)   # NOEXEC, NOATIME, NODIRATIME: a container may lock them
        mount(None, target, flags=0x20 | 0x1000 | 0x1 | 0x2 | 0x4 | kept)
    if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"size=64m,mode=755"):
        return False
    os.umask(0o022)                                    # what is made here is 755, whatever the grader's umask
    for d in ("tmp", "var/tmp", "dev/shm", "run/lock"):
        os.makedirs(f"/tmp/{d}")
        os.chmod(f"/tmp/{d}", 0o1777)
    os.mkdir("/tmp/tmp/work")
    bind(".", "/tmp/tmp/work")
    for name in ("null", "zero", "full", "random", "urandom"):
        open(f"/tmp/dev/{name}", "x").close()
        mount(f"/dev/{name}", f"/tmp/dev/{name}", flags=0x1000)                  # MS_BIND: the device itself
    os.symlink("/proc/self/fd", "/tmp/dev/fd")
    os.mkdir("/tmp/proc")
    if not (own_proc and libc.mount(b"proc", b"/tmp/proc", b"proc", 0x2 | 0x4 | 0x8, None) == 0):  # NOSUID, NODEV, NOEXEC
        mount("/proc", "/tmp/proc", flags=0x1000 | 0x4000)                        # the machine's, where it has no other
    for path in system_paths():
        parts = path.split("/")
        for up in ("/".join(parts[:i]) for i in range(2, len(parts))):   # the directories on the way, as the machine has them
            if not os.path.exists(f"/tmp{up}"):
                info = os.stat(up)
                os.mkdir(f"/tmp{up}")
                os.chown(f"/tmp{up}", info.st_uid, info.st_gid)
                os.chmod(f"/tmp{up}", info.st_mode & 0o7777)
        os.mkdir(f"/tmp{path}")
        bind(path, f"/tmp{path}")
    os.chdir("/tmp")
    if os.uname().machine == "x86_64" and libc.syscall(155, b".", b".") == 0:  # pivot_root(".", "."): old root on top
        if libc.umount2(b".", 2):                      # MNT_DETACH: and gone from this namespace, the machine's files too
            raise OSError(f"detaching the machine's root: errno {ctypes.get_errno()}")
    elif libc.chroot(b"."):    # another machine, or a root pivot_root refuses: the machine's stays mounted, out of reach
        raise OSError(f"chroot: errno {ctypes.get_errno()}")    # of a process without privileges
    os.chdir("/tmp/work")
    return True


def system_paths() -> list:
    """What a worker's root keeps of the machine (read-only): the system's programs, libraries and /etc,
    and Python's own files (its prefixes and every folder on the fork server's sys.path); each once, not
    one inside another. Where Python's files live under a folder the sandbox user cannot enter (a pyenv
    under /root), it still cannot: the folders on the way keep their owners and modes."""
    wanted = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
              sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *sys.path]
    kept = []
    for path in sorted({os.path.normpath(p) for p in wanted if os.path.isabs(p) and os.path.isdir(p)}):
        if path != "/" and not any(path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


def lock_down() -> str:
    """The last step before the student's code: no new privileges (a setuid program runs without its
    owner's rights) and, on x86_64, a seccomp filter (seccomp_program) that everything the worker starts
    inherits. Returns what holds, for the grader's note; where there is no filter (another machine, or the
    kernel refuses it) it says so, and what that leaves open."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0):                              # PR_SET_NO_NEW_PRIVS
        raise OSError(f"no_new_privs: errno {ctypes.get_errno()}")
    if os.uname().machine != "x86_64":
        return "no new privileges, seccomp off (its syscall numbers are x86_64's: new sockets and the user's keyrings allowed)"

    class Line(ctypes.Structure):                               # struct sock_filter
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):                            # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Line))]
    lines = [Line(*line) for line in seccomp_program()]
    program = Program(len(lines), (Line * len(lines))(*lines))
    # the worker has one thread here (a fork's child), so the filter covers the whole process
    if libc.prctl(22, 2, ctypes.byref(program), 0, 0):         # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return f"no new privileges, seccomp off (errno {ctypes.get_errno()}: new sockets and the user's keyrings allowed)"
    return "no new privileges, seccomp on (no sockets, no keyrings)"


def seccomp_program() -> list:
    """The seccomp filter, as classic BPF lines (code, jump if true, jump if false, k) read by the kernel
    before each system call: no user namespace (unshare or clone with CLONE_NEWUSER: EPERM); no socket
    at all (socket, socketpair and connect: EPERM; the worker's socket to the grader exists and is connected
    already, a new one could reach the network where no namespace holds, a host's unix socket by its path,
    or the hypervisor over AF_VSOCK, which no network namespace holds); no kernel keyring (add_key,
    request_key, keyctl: EPERM; keyrings belong to a user, not to a namespace, so they would carry data from
    one exercise or student to the next, or reach the grader's); clone3 and io_uring_setup answer ENOSYS, as
    in Docker's default profile (glibc then falls back to clone, whose flags a filter can read; io_uring could
    open sockets past it), and so does any call of another ABI (32-bit int 0x80, x32), whose numbers differ."""
    load = lambda offset: (0x20, 0, 0, offset)          # BPF_LD | BPF_W | BPF_ABS: a 32-bit word of seccomp_data
    answer = lambda errno: (0x06, 0, 0, 0x50000 | errno)  # BPF_RET: SECCOMP_RET_ERRNO | errno
    allow = (0x06, 0, 0, 0x7FFF0000)                    # BPF_RET: SECCOMP_RET_ALLOW
    enosys, eperm = 38, 1
    program = [load(4), (0x15, 1, 0, 0xC000003E), answer(enosys),      # arch; BPF_JEQ AUDIT_ARCH_X86_64
               load(0), (0x35, 0, 1, 0x40000000), answer(enosys)]      # the call's number; BPF_JGE the x32 bit
    for number in (435, 425):                                          # clone3, io_uring_setup
        program += [(0x15, 0, 1, number), answer(enosys)]
    for number in (41, 53, 42,                                         # socket, socketpair, connect
                   248, 249, 250):                                     # add_key, request_key, keyctl
        program += [(0x15, 0, 1, number), answer(eperm)]
    for number in (272, 56):                                           # unshare, clone: BPF_JSET CLONE_NEWUSER
        program += [(0x15, 0, 4, number), load(16), (0x45, 0, 1, 0x10000000), answer(eperm), allow]  # arg 0's low word
    return program + [allow]


def below(root: int) -> list:
    """Every live process whose chain of parents reaches root, read from /proc."""
    parent = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, ppid = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            parent[int(name)] = int(ppid)
    found, frontier = [], [root]
    while frontier:
        kids = [pid for pid, ppid in parent.items() if ppid == frontier[-1]]
        frontier.pop()
        found += kids
        frontier += kids
    return found


def kill_all(uid) -> int:
    """Stop, then kill, every process below this server (an orphan comes back here: the server is
    its subreaper) and, as root, every process of the sandbox user; again until none is left; then, as
    root, remove what the sandbox user left (remove_leftovers). Returns how many processes it killed."""
    import signal
    killed = 0
    for _ in range(1000):
        while True:                                    # reap the dead
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if uid is not None and os.getuid() == 0:
            as_sandbox_user(uid, lambda: os.kill(-1, signal.SIGKILL))   # kill(-1) as that user: all its processes
        victims = below(os.getpid())
        if not victims:
            if uid is not None and os.getuid() == 0:
                as_sandbox_user(uid, lambda: (os.kill(-1, signal.SIGKILL), remove_leftovers()))
            return killed
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped first, so none can fork in between
            for pid in victims:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        killed += len(victims)
        time.sleep(0.01)
    raise RuntimeError("processes keep appearing below the fork server")


def make_cgroup(root: str, name: str, memory: int, tasks: int) -> tuple:
    """As root, a cgroup for one worker, under the fork server's own, where the machine has one to write to:
    cgroup v2 (one folder, where memory and pids can be enabled for it) or v1 (a folder in its memory and
    in its pids hierarchy). Its limits hold for the worker and all it starts together: `memory` bytes
    (swap included, where v1 counts it), `tasks` processes and threads. Returns (its folders, "cgroup v1"
    or "cgroup v2"), or ([], None) where there is none, with nothing left behind."""
    own = {}                                          # controller -> the server's cgroup; "" is v2's
    for line in open("/proc/self/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        own.update((c, path.rstrip("/")) for c in controllers.split(","))
    if os.path.exists(f"{root}/cgroup.controllers"):
        version, parents = "cgroup v2", [f"{root}{own.get('', '')}"] * 2
    else:
        version, parents = "cgroup v1", [f"{root}/{c}{own.get(c, '')}" for c in ("memory", "pids")]
    limits = {"memory.max": memory, "memory.swap.max": 0, "memory.limit_in_bytes": memory,
              "memory.memsw.limit_in_bytes": memory, "pids.max": tasks}
    made, written = [], set()
    try:
        if version == "cgroup v2" and not {"memory", "pids"} <= set(open(f"{parents[0]}/cgroup.subtree_control").read().split()):
            with open(f"{parents[0]}/cgroup.subtree_control", "w") as f:   # EBUSY where the server's has processes
                f.write("+memory +pids")
        for parent in dict.fromkeys(parents):
            os.mkdir(f"{parent}/{name}")
            made.append(f"{parent}/{name}")
            for file, value in limits.items():        # those this kind of folder has; memory's before memsw's
                if os.path.exists(f"{parent}/{name}/{file}"):
                    with open(f"{parent}/{name}/{file}", "w") as f:
                        f.write(str(value))
                    written.add(file)
        if "pids.max" not in written or not written & {"memory.max", "memory.limit_in_bytes"}:
            raise OSError("no memory or no pids controller")
        return made, version
    except OSError:
        remove_cgroups(made)
        return [], None


def remove_cgroups(folders: list):
    """Remove a worker's cgroup once its processes are gone (a dying one may hold it for a moment)."""
    for folder in folders:
        for _ in range(100):
            try:
                os.rmdir(folder)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def as_sandbox_user(uid, action):
    """Run action() in a child that has become the sandbox user (uid: its user and group ids): it can do
    only what that user may, to that user's processes and files."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid[1])
            os.setuid(uid[0])
            action()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def remove_leftovers():
    """As the sandbox user, once its processes are gone: remove what they left on the machine, which the next
    exercise or student would find wherever a worker had no namespaces of its own (no CAP_SYS_ADMIN): System V
    shared memory, semaphores and message queues (IPC_RMID: the kernel removes those this user owns or made,
    and refuses the others), and its files and folders in /tmp, /var/tmp, /dev/shm and /run/lock and in any
    folder there that every user may write to, without following a link."""
    import ctypes
    libc = ctypes.CDLL(None)
    removers = {"shm": lambda i: libc.shmctl(i, 0, None), "sem": lambda i: libc.semctl(i, 0, 0),   # IPC_RMID
                "msg": lambda i: libc.msgctl(i, 0, None)}
    for kind, remove in removers.items():
        try:
            for line in open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]:   # key, id, ...
                remove(int(line.split()[1]))
        except OSError:                               # a kernel without System V IPC
            pass

    def remove_own(folder):
        for entry in os.scandir(folder):
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_uid != os.getuid():
                    if entry.is_dir(follow_symlinks=False) and info.st_mode & 0o002:
                        remove_own(entry.path)        # another's folder, which every user may write to
                elif not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.path)             # a file, a link (not what it points to), a FIFO, a socket
                else:                                 # its folder: each folder in it opened again to its owner
                    os.chmod(entry.path, 0o700)       # (it may have closed them), then removed with all they hold
                    for inside, folders, _ in os.walk(entry.path):
                        for name in folders:
                            if not os.path.islink(os.path.join(inside, name)):
                                os.chmod(os.path.join(inside, name), 0o700)
                    shutil.rmtree(entry.path)
            except OSError:
                pass
    for top in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        try:
            remove_own(top)
        except OSError:
            pass


def fork_server(control_fd: int):
    """A fresh interpreter that has imported torch, numpy, gymnasium and the standard library, and
    nothing of the course: it forks a worker per exercise (no torch import each time) and, asked to,
    kills every process below it. As root, each worker has a cgroup of its own (make_cgroup), removed once
    its processes are killed."""
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)           # PR_SET_CHILD_SUBREAPER: orphans are reparented here
    control = socket.socket(fileno=control_fd)
    cgroups, forks = [], 0
    while (req := receive(control, 1 << 16)) is not None:
        if req["op"] == "fork":
            forks += 1
            if os.getuid() == 0:
                req["cgroups"], req["cgroup"] = make_cgroup(req["cgroup_root"], f"agentic-rl-{os.getpid()}-{forks}",
                                                            req["memory"], req["tasks"])
                cgroups += req["cgroups"]
            mine, theirs = socket.socketpair()
            out_r, out_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                control.close()
                mine.close()
                os.close(out_r)
                worker(theirs, out_w, req)
            theirs.close()
            os.close(out_w)
            socket.send_fds(control, [b"F"], [mine.fileno(), out_r])
            send(control, {"pid": pid})
            mine.close()
            os.close(out_r)
        else:
            killed = kill_all(req["uid"])
            remove_cgroups(cgroups)
            cgroups = []
            send(control, {"killed": killed})
    os._exit(0)                                       # the grader closed the socket: nothing to flush, no teardown


SERVER_IMPORTS = (  # with project_imports(): what a worker can import where the sandbox user cannot read Python's files
    "import argparse, bisect, collections, concurrent.futures, contextlib, copy, ctypes, dataclasses, decimal, enum, "
    "fractions, functools, hashlib, heapq, inspect, io, itertools, json, math, operator, os, pathlib, queue, random, re, "
    "resource, shutil, signal, socket, statistics, string, struct, sys, textwrap, threading, time, types, typing, warnings\n"
    "from dataclasses import fields, is_dataclass\nimport numpy as np, torch, torch.nn, torch.nn.functional, gymnasium, "
    "gymnasium.spaces, gymnasium.vector.utils, gymnasium.wrappers, tqdm, pytest")


def project_imports() -> str:
    """`import` lines for every module the project's own files import (their dependencies and the
    standard library modules they use): the fork server imports them before any worker exists."""
    import ast
    names = set()
    for name in ("agentic_rl.py", "envs.py"):
        for node in ast.walk(ast.parse((REPO / name).read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module)
    return "\n".join(f"import {n}" for n in sorted(names - {"__future__", "agentic_rl", "envs", "test_agentic_rl"}))


class GradeTimeout(Exception):
    pass


class WorkerGone(Exception):
    pass


class GraderFailure(Exception):
    """Something failed on the grader's side: the verdict says so and never blames the student."""


class NotChecked(Exception):
    """A check the grader cannot make on this submission's evidence (runs that show nothing to judge): it costs
    the student nothing and is flagged for a TA."""


INSTALLED = ("agentic_rl.py", "envs.py", "test_agentic_rl.py", "silent_bug.txt", "hidden_seed.txt")  # what no student may read


class Sandbox:
    """The fork server of one grading: its settings (the sandbox user as root, the memory limit) and
    the socket to it. As root it refuses (ValueError) an installation whose files the sandbox user
    could read. As a context manager it leaves no process behind."""

    def __init__(self, user=SANDBOX_USER, memory: int = MEMORY_LIMIT):
        import pwd
        import subprocess
        self.uid, self.memory, self.note = None, memory, "user"
        if os.getuid() == 0 and user:
            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                entry = pwd.getpwnam("nobody")         # a local grading run as root, without the bundle's user
            exposed = [name for name in INSTALLED if (REPO / name).exists() and readable_by_others(REPO / name)]
            if exposed:
                raise ValueError(f"{REPO}: the sandbox user ({entry.pw_name}) can read {', '.join(exposed)}, and with "
                                 f"them the reference, the hidden checks or the course's secret: run `chmod -R go-rwx "
                                 f"{REPO}` (the bundle's setup.sh does) and grade again")
            self.uid = (entry.pw_uid, entry.pw_gid)
            self.note += f" {entry.pw_name}"
        else:
            self.note += f" {os.getuid()} (no sandbox user: the student's code has the grader's rights)"
        self.lock = None
        if self.uid:   # kill_all kills every process of the sandbox user: one grading as root at a time
            self.lock = os.open("/run/agentic-rl-grade.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print("another grading runs as the sandbox user; waiting for it to finish", file=sys.stderr)
                fcntl.flock(self.lock, fcntl.LOCK_EX)
        ours, theirs = socket.socketpair()
        server = (send, receive, to_wire, from_wire, serve, worker, compile_only, isolate, private_root, system_paths,
                  lock_down, seccomp_program, below, kill_all, as_sandbox_user, remove_leftovers, make_cgroup,
                  remove_cgroups, fork_server)
        code = "\n".join([SERVER_IMPORTS, project_imports(), *map(inspect.getsource, server),
                          f"fork_server({theirs.fileno()})"])
        env = {k: v for k, v in os.environ.items() if k == "PATH" or k.startswith(("OMP_", "MKL_", "OPENBLAS_", "LC_", "LANG"))}
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", code], pass_fds=[theirs.fileno()], cwd="/", env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        theirs.close()
        self.control = ours

    def request(self, **message):
        try:
            send(self.control, message)
            if message["op"] == "fork":
                _, fds, _, _ = socket.recv_fds(self.control, 1, 2)
                return fds, receive(self.control, 1 << 10)
            return receive(self.control, 1 << 10)
        except (OSError, ValueError) as e:
            raise GraderFailure(f"the fork server failed ({e})") from None

    def clean(self):
        """Kill every process the submission started; an error if any could survive."""
        reply = self.request(op="clean", uid=self.uid)
        if reply is None:
            raise GraderFailure("the fork server is gone (without a sandbox user the student's code can kill it)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.clean()
        finally:
            self.control.close()
            self.proc.wait(timeout=30)
            if self.lock is not None:
                os.close(self.lock)                   # and with it the lock


def readable_by_others(path: Path) -> bool:
    """Whether a user who is neither the owner nor in the group can reach and read this file."""
    parts = [path] + list(path.parents)
    return bool(os.stat(path).st_mode & stat.S_IROTH) and all(os.stat(p).st_mode & stat.S_IXOTH for p in parts[1:])


class Worker:
    """One exercise's student process and the socket to it; every reply has a deadline, every value the
    student's code asks of another exercise is answered here."""

    def __init__(self, sandbox: Sandbox, folder, callbacks, deadline: float, compile_only=()):
        """compile_only: names of files in folder that the worker only compiles (see compile_only); its
        answer is then self.ready."""
        self.sandbox, self.deadline, self.tail, self.callbacks = sandbox, deadline, bytearray(), callbacks
        self.allowed = set()  # the (wins, losses) whose sign_test_p this call may ask for (paired_outcomes)
        fds, reply = sandbox.request(op="fork", folder=str(folder), uid=sandbox.uid and sandbox.uid[0],
                                     gid=sandbox.uid and sandbox.uid[1], memory=sandbox.memory, callbacks=callbacks,
                                     compile=list(compile_only), cgroup_root=CGROUP_ROOT, tasks=WORKER_TASKS,
                                     tasks_without_cgroup=TASKS_WITHOUT_CGROUP)
        if len(fds) != 2 or not reply:
            raise GraderFailure("the fork server sent no worker")
        self.sock, self.out = socket.socket(fileno=fds[0]), fds[1]
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()
        try:
            setup = self._receive()
            if "sandbox" not in setup:
                raise GraderFailure(f"the worker could not be set up ({setup.get('setup_failed', setup)})")
            sandbox.isolation = setup["sandbox"]["isolation"]
            self.ready = self._receive()
        except BaseException:
            self.close()
            raise

    def _drain(self):
        """What the student prints, as bytes (the last 2,000 kept for messages), read as fast as it comes."""
        while chunk := os.read(self.out, 1 << 16):
            self.tail = (self.tail + chunk)[-2000:]

    def printed(self) -> str:
        return self.tail.decode("utf-8", "replace").strip()[-600:]

    def _receive(self) -> dict:
        while True:
            if time.monotonic() >= self.deadline:
                raise GradeTimeout()
            try:
                reply = receive(self.sock, MAX_REPLY_BYTES, self.deadline)
            except TimeoutError:
                raise GradeTimeout() from None
            except (OSError, ValueError, RecursionError) as e:
                raise WorkerGone(f"it sent a malformed reply ({type(e).__name__}: {str(e)[:200]})") from None
            if reply is None:
                raise WorkerGone(f"last output: {self.printed() or '(none)'}")
            if not isinstance(reply, dict):
                raise WorkerGone("it sent a malformed reply")
            if "callback" not in reply:
                return reply
            if reply["callback"] not in self.callbacks:
                raise WorkerGone(f"it asked the grader for {str(reply['callback'])[:40]!r}, which this exercise "
                                 "may not ask for")
            try:
                send(self.sock, {"value": reference_value(reply["callback"], reply.get("args"), self.allowed)})
            except (ValueError, TypeError) as e:
                send(self.sock, {"error": str(e)})

    def value(self, **request):
        self.allowed = paired_outcomes(request.get("args")) if self.callbacks else set()  # sign_test_p's answers
        try:
            self.sock.settimeout(max(1e-3, self.deadline - time.monotonic()))
            send(self.sock, request)
        except TimeoutError:
            raise GradeTimeout() from None
        except OSError:
            raise WorkerGone(f"last output: {self.printed() or '(none)'}") from None
        reply = self._receive()
        if "raised" in reply:
            raise student_error(reply)
        try:
            return from_wire(reply["value"], lambda name, f: types.SimpleNamespace(**f), lambda tag: Remote(self, tag["~handle"]))
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            raise WorkerGone(f"it sent a malformed value ({type(e).__name__})") from None

    def close(self):
        self.sock.close()
        try:
            self.sandbox.clean()
        finally:
            self.drain.join(timeout=5)
            os.close(self.out)


def reference_value(name, args, allowed: set):
    """The one reference piece a worker may ask for (promotion calls sign_test_p): its value for the
    student's arguments, computed here; the code never crosses. Only for the wins and losses of the reports
    in the call being checked (what a right promotion_decision asks): any other answer could be carried out
    in a message, and a table of them hard-codes sign_test."""
    if name != "sign_test_p" or not (isinstance(args, list) and len(args) == 2 and
                                     all(type(x) is int and x >= 0 for x in args) and tuple(args) in allowed):
        raise ValueError("the grader answers sign_test_p(wins, losses) only for the wins and losses of the two "
                         "reports promotion_decision was given, nothing else")
    return A.sign_test_p(*args)


def paired_outcomes(wire) -> set:
    """(wins, losses) of every two equally long per_task lists (1/0 outcomes) that a request carries, both ways."""
    lists = []

    def walk(x):
        if isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for k, v in x.get("~dict", []):
                if k == "per_task" and isinstance(v, list) and all(type(o) in (int, bool) for o in v):
                    lists.append(v)
            for v in x.values():
                walk(v)
    walk(wire)
    return {(sum(a > b for a, b in zip(x, y)), sum(a < b for a, b in zip(x, y)))
            for x in lists for y in lists if len(x) == len(y)}


def student_error(reply: dict) -> Exception:
    """What the student's code raised, re-raised here as a subclass of the nearest built-in exception
    (so `except ValueError` still works) with the student's class name; never a SystemExit of ours."""
    import builtins
    names = [n for n in reply.get("raised", []) if isinstance(n, str) and n.isidentifier()] or ["Exception"]
    base = next((b for b in (getattr(builtins, n, None) for n in names)
                 if isinstance(b, type) and issubclass(b, Exception)), Exception)
    return type(names[0], (base,), {"from_student": True})(str(reply.get("message", ""))[:4000])


class Remote:
    """A student's object as the grader sees it: attribute access and calls become requests to their
    process, and the answers come back as plain data (tensors, lists, namespaces), never their code."""

    def __init__(self, worker: Worker, handle: int):
        self._worker, self._wire_handle = worker, handle

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._worker.value(op="getattr", target=self._wire_handle, name=name)

    def __call__(self, *args, **kwargs):
        return self._worker.value(op="call", target=self._wire_handle, args=to_wire(list(args), {}),
                                  kwargs=to_wire(kwargs, {}))

    def grad(self, wrt: int, *args, **kwargs):
        """(what the function returns, d loss / d args[wrt]), computed in the student's process."""
        return self._worker.value(op="grad", target=self._wire_handle, wrt=wrt, args=to_wire(list(args), {}),
                                  kwargs=to_wire(kwargs, {}))


# ------------------------------------------------------------------------------------------------
# Grading: read the submission first, each exercise in a fresh worker, verdicts here, results last
# ------------------------------------------------------------------------------------------------
SUBMISSION_FILES, MAX_SUBMITTED_BYTES = ("agentic_rl.py", "envs.py", "answers.json"), 4 << 20


def read_submission(directory: Path) -> dict:
    """name -> (its text or None, a problem or None), read before any student code runs. A link, a
    directory, a FIFO or a device, a file over 4 MiB or not UTF-8 is refused by name, never opened
    by following it."""
    out = {}
    for name in SUBMISSION_FILES:
        try:
            kind = os.lstat(directory / name).st_mode
        except FileNotFoundError:
            out[name] = (None, f"{name} is missing")
            continue
        if not stat.S_ISREG(kind):
            what = "a symbolic link" if stat.S_ISLNK(kind) else "a directory" if stat.S_ISDIR(kind) else "a special file"
            out[name] = (None, f"{name} is {what}: submit a regular file")
            continue
        try:
            with os.fdopen(os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
                data = f.read(MAX_SUBMITTED_BYTES + 1)
            out[name] = (data.decode("utf-8"), None) if len(data) <= MAX_SUBMITTED_BYTES else \
                (None, f"{name} is over {MAX_SUBMITTED_BYTES >> 20} MiB")
        except (OSError, UnicodeDecodeError) as e:
            out[name] = (None, f"{name} cannot be read ({type(e).__name__})")
    return out


def parse_answers(text, problem) -> tuple:
    """(answers.json as a dict, None) or (None, why not)."""
    if problem:
        return None, problem
    try:
        answers = json.loads(text)
    except (ValueError, RecursionError) as e:
        return None, f"answers.json is not valid JSON ({type(e).__name__}: {str(e)[:200]})"
    return (answers, None) if isinstance(answers, dict) else (None, "answers.json must hold a JSON object")


def folder_with(files: dict, prefix: str) -> Path:
    """A fresh folder holding these files (name -> text): the worker can read them, not write them."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    for name, text in files.items():
        (folder / name).write_text(text)
        os.chmod(folder / name, 0o644)
    os.chmod(folder, 0o755)
    return folder


def compile_problems(sandbox: Sandbox, submission: dict, seconds: float) -> dict:
    """name -> None, or (status, why) for a submitted file that cannot be read or does not compile; each file
    compiled once per grading, in a worker of its own within `seconds`: the compiler's time and memory are
    the student's, never the grader's (a file of nested f-strings takes it time quadratic in its length)."""
    problems = {}
    for name in ("agentic_rl.py", "envs.py"):
        text, problem = submission[name]
        if problem:
            problems[name] = ("crashes", problem)
            continue
        folder, worker = folder_with({name: text}, "compile-"), None
        try:
            worker = Worker(sandbox, folder, [], time.monotonic() + seconds, compile_only=[name])
            found = (worker.ready.get("compiled") or {}).get(name, "no answer")
            if found is None:
                problems[name] = None
            elif not isinstance(found, dict) or not isinstance(found.get("raised"), list):
                raise GraderFailure(f"the compiler's worker answered {str(found)[:80]!r}")
            else:
                kind = "memory limit" if "MemoryError" in found["raised"] else "crashes"
                problems[name] = (kind, f"{found['raised'][0]}: {found.get('message', '')}")
        except GradeTimeout:
            problems[name] = ("time limit", f"compiling it took longer than the time limit ({seconds:g} s)")
        except WorkerGone as e:
            problems[name] = ("crashes", f"compiling it ended the compiler's process ({e})")
        except GraderFailure as e:
            problems[name] = verdict(e)
        finally:
            if worker is not None:
                worker.close()
            shutil.rmtree(folder, ignore_errors=True)
    return problems


def files_for(ex: str, submission: dict, problems: dict):
    """The two files an exercise's worker imports: the student's file holding the exercise, and their
    other file if it compiles, else the handout's (blanks only); or (status, why) the exercise cannot be
    graded. problems: what compile_problems found."""
    files = {}
    for name in ("agentic_rl.py", "envs.py"):
        if problems[name] and name == EXERCISE_FILE[ex]:
            return problems[name][0], f"{name} cannot be graded: {problems[name][1]}"
        files[name] = handout_text(name) if problems[name] else submission[name][0]
    return files


def verdict(e: Exception) -> tuple:
    """(status, message) for what a check raised, told apart by the kind of exception, never by the words
    of its message: a blank, a wrong value (the grader's own assert: an AssertionError the student's code raised
    is a crash like any other), a stop, or a crash; and the grader's own failure, which is never the student's."""
    if isinstance(e, NotImplementedError):
        return "not started", str(e)
    if isinstance(e, AssertionError) and not getattr(e, "from_student", False):
        return "wrong", str(e)
    if isinstance(e, GradeTimeout):
        return "time limit", "stopped at the time limit: an endless loop, or far too slow"
    if isinstance(e, MemoryError) and getattr(e, "from_student", False):
        return "memory limit", f"stopped at the memory limit ({MEMORY_LIMIT >> 20} MiB more than torch itself): " \
                               f"{type(e).__name__}: {e}"
    if isinstance(e, WorkerGone):
        return "crashes", f"your code ended its process ({e})" if str(e).startswith("last output") else \
            f"your code broke the grader's protocol: {e}"
    if isinstance(e, GraderFailure):
        return "grader error", f"the grader failed here, not your code: {e}; tell the course staff"
    return "crashes", f"{type(e).__name__}: {e}" + (" (raised by your code)" if getattr(e, "from_student", 0) else "")


def run_check(check, *args) -> tuple:
    """(status, message) of one check; the check runs here, in the grader's process."""
    try:
        check(*args)
        return "passed", ""
    except NotChecked as e:
        return "not checked", f"{e}: not checked, no points lost; a TA may look"
    except Exception as e:
        status, message = verdict(e)
        return status, printable(message)


def printable(text: str) -> str:
    """A message as the TA's terminal and results.json should show it: control characters escaped (no
    student can clear a screen or fake a total), at most MAX_MESSAGE characters."""
    text = "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in str(text))
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + f" ... ({len(text) - MAX_MESSAGE} more characters)"


def grade_exercise(sandbox: Sandbox, ex: str, files, seconds: float) -> dict:
    """One exercise: a fresh folder and a fresh worker, its checks within `seconds` together, then the
    worker and everything it started killed."""
    row, worker, trouble, folder = {"points": EXERCISES[ex][0], "checks": []}, None, None, None
    try:
        if isinstance(files, tuple):
            trouble = files
        else:
            folder = folder_with(files, f"grade-{ex}-")
            try:
                worker = Worker(sandbox, folder, CALLBACKS.get(ex, []), time.monotonic() + seconds)
                if "raised" in worker.ready:
                    raise student_error(worker.ready)
            except GraderFailure as e:
                trouble = verdict(e)
            except Exception as e:  # the student's files do not even import, or hang while importing
                status, message = verdict(e)
                trouble = (status, f"agentic_rl.py does not import: {message}")
        for check_ex, name, check, hidden in HOMEWORK:
            if check_ex != ex:
                continue
            done = row["checks"]
            if trouble:
                status, message = trouble[0], printable(trouble[1])
            elif done and done[-1]["status"] in ("time limit", "memory limit"):
                status, message = done[-1]["status"], "not run: an earlier check of this exercise hit the limit"
            else:
                status, message = run_check(check, Remote(worker, 0))
            done.append({"name": name, "hidden": hidden, "status": status, "message": message})
    finally:
        if worker is not None:
            worker.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return row


def hidden_seed_of(secret) -> int:
    return int(hashlib.sha256(str(secret).encode()).hexdigest()[:15], 16) if secret else 0


def installation_file(name: str):
    """A small file the bundle keeps beside the grader (silent_bug.txt, hidden_seed.txt), or None."""
    path = REPO / name
    return path.read_text().strip() if path.is_file() else None


def grade(directory=".", only=None, time_limit: float = 60.0, silent_bug=None, hidden_seed=None,
          user=SANDBOX_USER, memory: int = MEMORY_LIMIT, rerun_seconds: float = 0.0, students=()) -> dict:
    """Grade a submission: its agentic_rl.py, envs.py and answers.json, read first; each exercise in
    a fresh sandboxed worker within time_limit seconds, against this installation's checks; every
    verdict reached here; the experiments against the key of the student's handout (students: whom its id
    may be bound to), and audited with rerun_seconds. Returns {exercise: {"points", "checks": [{"name",
    "hidden", "status", "message"}]}} with "~sandbox" (what the workers ran as) once every process is gone."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such directory; name the folder that holds the submission")
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and 1 <= time_limit <= 3600):
        raise ValueError(f"--time-limit {time_limit}: give the seconds per exercise, a number in [1, 3600]")
    check_only(only, [*EXERCISES, *EXPERIMENTS])
    secret = hidden_seed or installation_file("hidden_seed.txt")
    secret = secret and strong_secret(secret)
    submission = read_submission(directory)                    # everything, before any of its code runs
    answers, answers_problem = parse_answers(*submission["answers.json"])
    experiments = [ex for ex in EXPERIMENTS if only is None or ex in only]
    if secret and experiments and answers and isinstance(answers.get("handout"), str) and not students:
        raise ValueError("answers.json carries a handout id, which is bound to a student: say whose submission this "
                         "is (grade --student NAME, or --metadata with Gradescope's submission_metadata.json)")
    HIDDEN["seed"] = hidden_seed_of(secret)
    key = answer_key(answers, secret, students, silent_bug) if answers else None
    report = {}
    with Sandbox(user, memory) as sandbox:
        graded = [e for e in EXERCISES if only is None or e in only]
        problems = compile_problems(sandbox, submission, time_limit) if graded else {}
        for ex in graded:
            report[ex] = grade_exercise(sandbox, ex, files_for(ex, submission, problems), time_limit)
    for ex in experiments:
        report[ex] = {"points": EXPERIMENTS[ex], "checks": []}
        for check_ex, name, check, hidden in EXPERIMENT_CHECKS:
            if check_ex == ex:
                status, message = ("not started", answers_problem) if answers is None else run_check(check, answers, key)
                report[ex]["checks"].append({"name": name, "hidden": hidden, "status": status, "message": message})
    if rerun_seconds:
        audit(report, answers, key, rerun_seconds)
    report["~sandbox"] = f"{sandbox.note}, {getattr(sandbox, 'isolation', 'no worker started')}"
    return report


AUDIT_SECONDS = 600.0   # the bundle's audit per grading: about one E3 and one E8 run trained again on 2 cores
RERUN_TOLERANCE = 0.1   # dev success, and training success over the run: the same seed on the same machine gives the
                        # same numbers, another machine may differ by a few tasks, a made-up record by much more
RECORD_CHECKS = {"clock": clock_numbers_are_your_runs_own_records.__name__,     # an experiment's runs are audited once
                 "silent_bug": silent_bug_answer_carries_the_runs_before_and_after_the_fix.__name__}  # these pass


def rerun(settings: dict, seconds: float, bug=None) -> dict:
    """Train again here, within `seconds`, with the reference (and `bug` planted, as in the student's
    handout) and these settings (the seed and the flags the experiment asks for, which record_of has found
    in the record; every other setting at its default); the new run's record."""
    flags = [part for name, value in settings.items() for part in
             [f"--{name.replace('_', '-')}"] + ([] if isinstance(value, bool) else [str(value)])]
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}      # the reference's training needs no secret
    with tempfile.TemporaryDirectory() as folder:
        script = REPO / "agentic_rl.py"
        if bug:
            script = Path(folder) / "agentic_rl.py"
            script.write_text(plant((REPO / "agentic_rl.py").read_text(), bug))
            shutil.copy(REPO / "envs.py", Path(folder) / "envs.py")
        subprocess.run([sys.executable, str(script), "train", *flags, "--device", "cpu", "--run-dir", f"{folder}/run"],
                       capture_output=True, timeout=seconds, check=True, cwd=folder, env=env)
        return run_record(f"{folder}/run")


def audited_runs(ex: str, answers: dict, key: dict) -> list:
    """(where in answers.json, record, its settings, the bug its code had) of each run an audit may train
    again: E3's twelve (the reference), E8's six with the bug (the reference with the handout's bug planted,
    when the grader knows it) and six after the fix (the reference)."""
    seeds = key["seeds"]
    if ex == "clock":
        return [(f"clock.runs.{setting}[{i}]", answers["clock"]["runs"][setting][i], {**E3_RUN, **flags, "seed": seeds[i]},
                 None) for setting, flags in CLOCK_SETTINGS.items() for i in range(3)]
    parts = [("silent_bug_runs", key["silent_bug"])] if key["silent_bug"] else []   # their code needs the bug known
    parts.append(("silent_bug_fixed_runs", None))
    return [(f"{field}[{i}]", answers[field][i], {**E8_RUNS[i // 3], "seed": seeds[i % 3]}, bug)
            for field, bug in parts for i in range(6)]


def rerun_check(where: str, record: dict, settings: dict, bug, seconds: float) -> dict:
    """One record trained again: passed when the rerun's candidate dev success and mean training success are
    each within RERUN_TOLERANCE of the record's; "not checked" when the grader cannot finish the rerun."""
    check = {"name": f"rerun_of_{re.sub(r'[^0-9a-z]+', '_', where).strip('_')}_reproduces_its_record", "hidden": True}
    try:
        again = rerun(settings, seconds, bug)
    except Exception as e:                              # the grader's time or machine, never the student's doing
        return {**check, "status": "not checked", "message": f"the grader could not finish this rerun "
                f"({type(e).__name__}): not checked, no points lost; a TA may give --rerun more seconds"}
    read = lambda r: (r["summary"]["warm_start"]["dev_success"], r["summary"]["candidate"]["dev_success"],
                      mean_of(r["metrics"], "success"))
    differ = [f"{what} {mine:.3f} in the record, {theirs:.3f} trained again here" for what, mine, theirs in
              zip(("warm start dev success", "candidate dev success", "mean training success"), read(record), read(again))
              if abs(mine - theirs) > RERUN_TOLERANCE]
    return {**check, "status": "wrong" if differ else "passed", "message": f"{where} (seed {settings['seed']}): "
            f"{'; '.join(differ)} (tolerance {RERUN_TOLERANCE})" if differ else ""}


def audit(report: dict, answers: dict, key: dict, seconds: float) -> None:
    """grade --rerun SECONDS: each experiment whose records pass their checks gets an equal share of the
    seconds; one of its runs, chosen at random, is trained again, then more in random order while what is
    left of the share is at least what the last one took. Each rerun is a hidden check of its experiment."""
    shares = [ex for ex, check in RECORD_CHECKS.items() if ex in report and
              any(c["name"] == check and c["status"] == "passed" for c in report[ex]["checks"])]
    for ex in shares:
        runs, deadline, last = audited_runs(ex, answers, key), time.monotonic() + seconds / len(shares), 0.0
        for n, (where, record, settings, bug) in enumerate(random.sample(runs, len(runs))):
            left = deadline - time.monotonic()
            if n and left < last:
                break
            started = time.monotonic()
            report[ex]["checks"].append(rerun_check(where, record, settings, bug, left))
            last = time.monotonic() - started


HIDDEN = {"seed": 0}  # the course's secret as a number; 0 = the public default


def hidden_rng(salt: int) -> np.random.Generator:
    """The hidden checks' inputs: drawn from the course's secret, so no public file holds them."""
    return np.random.default_rng([HIDDEN["seed"], salt])


def exercises(report: dict) -> dict:
    return {ex: row for ex, row in report.items() if not ex.startswith("~")}


def counted(row: dict) -> list:
    """The checks that count: a rerun the grader could not finish ("not checked") costs the student nothing."""
    return [c for c in row["checks"] if c["status"] != "not checked"]


def score(row: dict, hidden=None) -> tuple:
    """(points earned, points possible) of an exercise (or of its hidden / visible checks): the
    visible checks share half its points and the hidden ones the other half, each counted check of a
    half alike, so hard-coding what the handout shows earns half at most."""
    halves = [[c for c in counted(row) if c["hidden"] == h] for h in (False, True)]
    earned = possible = 0.0
    for h, part in zip((False, True), halves):
        if part and hidden in (None, h):
            weight = row["points"] / sum(1 for half in halves if half)
            earned += weight * sum(c["status"] == "passed" for c in part) / len(part)
            possible += weight
    return earned, possible


def suspicious(row: dict) -> bool:
    """Every visible check passes and a hidden one does not: hard-coded answers, for a TA to look at."""
    visible, hidden = ([c["status"] == "passed" for c in counted(row) if c["hidden"] == h] for h in (False, True))
    return bool(visible) and all(visible) and not all(hidden)


def unchecked(row: dict) -> bool:
    """A rerun of this experiment could not finish: a TA may want to run it."""
    return any(c["status"] == "not checked" for c in row["checks"])


SUSPICIOUS = "visible checks pass, hidden checks fail: a TA should read this code (hard-coded answers?)"
NOT_CHECKED = "a check the grader could not make (a rerun it could not finish, runs with nothing to judge) is not " \
              "checked (no points lost): a TA may look"


def quoted(message: str) -> str:
    """A check's message as the report shows it: every line indented, so that none (a student's words may be in
    it) can pass for a line of the report, such as "[passed] ..." or "total ..."."""
    return textwrap.indent(message, "    ", lambda line: True)


FILES_SHARED = ("WARNING: files shared: the student's code ran without a private root (the grader is not root, or "
                "lacks CAP_SYS_ADMIN, as in a container with Docker's default capabilities) and could read every file "
                "on this machine that others may read: keep other submissions, and anything else private, unreadable "
                "by others (chmod -R go-rwx) while grading")
NETWORK_SHARED = ("WARNING: network shared: the student's code ran with no network namespace and no seccomp filter, "
                  "and could reach the network and this machine's unix sockets")


def sandbox_lines(report: dict) -> list:
    """What the workers ran as (the grader's note), and a loud warning for what they shared with the machine."""
    note = report.get("~sandbox", "")
    return [f"sandbox: {note}"] + ([FILES_SHARED] if "files shared" in note else []) + \
        ([NETWORK_SHARED] if "network shared" in note and "seccomp on" not in note else [])


def print_grade(report: dict) -> bool:
    print("\n".join(sandbox_lines(report)))
    print(f"{'exercise':<16}{'points':>14}  {'checks':>8}  status")
    rows = exercises(report)
    for ex, row in rows.items():
        earned, possible = score(row)
        passed = sum(c["status"] == "passed" for c in row["checks"])
        worst = next((c for c in row["checks"] if c["status"] != "passed"), None)
        print(f"{ex:<16}{earned:>7.1f} / {possible:<5.1f} {passed:>3}/{len(row['checks']):<3}  "
              f"{'ok' if worst is None else worst['status'] + ': ' + worst['name']}" +
              (f"  [{SUSPICIOUS}]" if suspicious(row) else "") + (f"  [{NOT_CHECKED}]" if unchecked(row) else ""))
    for ex, row in rows.items():
        for c in row["checks"]:
            if c["status"] not in ("passed", "not started"):
                print(f"\n[{ex}] {c['name']} ({'hidden' if c['hidden'] else 'visible'} check): {c['status']}\n"
                      f"{quoted(c['message'])}")
    earned, possible = (sum(score(row)[i] for row in rows.values()) for i in (0, 1))
    skipped = sum(c["status"] == "not checked" for row in rows.values() for c in row["checks"])
    print(f"\ntotal {earned:.1f} / {possible:.1f}: " + ("some checks did not pass" if earned != possible else
                                                     f"every check made passed; {skipped} not checked" if skipped else
                                                     "every check passed"))
    return earned == possible


def gradescope_results(report: dict, seconds: float) -> dict:
    """Gradescope's results.json: one test per exercise and visibility; hidden checks show after publishing."""
    tests = []
    for number, (ex, row) in enumerate(exercises(report).items(), start=1):
        for hidden in (False, True):
            part = [c for c in row["checks"] if c["hidden"] == hidden]
            if part:
                earned, possible = score(row, hidden)
                flag = (f"\n{SUSPICIOUS}" if hidden and suspicious(row) else "") + \
                    (f"\n{NOT_CHECKED}" if hidden and unchecked(row) else "")
                tests.append({"name": f"{ex} ({'hidden' if hidden else 'visible'} checks)",
                              "number": f"{number}.{int(hidden) + 1}", "score": round(earned, 2),
                              "max_score": round(possible, 2), "visibility": "after_published" if hidden else "visible",
                              "output": "\n".join(f"[{c['status']}] {c['name']}" + (f"\n{quoted(c['message'])}"
                                                                                    if c["message"] else "")
                                                   for c in part) + flag})
    return {"score": round(sum(t["score"] for t in tests), 2), "execution_time": round(seconds, 1),
            "output": "\n".join(["agentic-rl homework: each exercise's visible checks, then its hidden ones",
                                 *sandbox_lines(report)]),
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def grader_failed(why: str, seconds: float) -> dict:
    """results.json when the grader itself fails: the student sees that it was not their code."""
    return {"score": 0.0, "execution_time": round(seconds, 1), "visibility": "visible", "stdout_visibility": "hidden",
            "output": f"The grader failed, not your submission ({why}); the course staff will regrade it.", "tests": []}


# ------------------------------------------------------------------------------------------------
# The autograder bundle (Gradescope) and the course's command line
# ------------------------------------------------------------------------------------------------
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
python3 agentic_rl.py grade /autograder/submission --metadata /autograder/submission_metadata.json \\
  --json /autograder/results/results.json{only}{rerun}
status=$?
if [ ! -s /autograder/results/results.json ]; then
  echo "run_autograder: the grader wrote no results.json (exit $status): a grader failure, not the student's" >&2
  exit 1
fi
"""


def write_autograder(path, only=None, silent_bug=None, hidden_seed=None, rerun: float = 0.0) -> list:
    """`homework --autograder OUT.zip`: Gradescope's bundle, setup.sh and run_autograder at its root
    with the grading installation (the reference, every check, the secret); it grades --only's
    exercises when given, each submission against the handout ids of its submitters (Gradescope's
    submission_metadata.json), and audits the experiments' records with `rerun` seconds of training."""
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
                                rerun=f" --rerun {rerun:g}" if rerun else "")
    members = {"setup.sh": AUTOGRADER_SETUP, "run_autograder": run,
               **{name: (REPO / name).read_text() for name in ("agentic_rl.py", "envs.py", "test_agentic_rl.py",
                                                               "requirements.txt")}}
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


SECRET_ON_THE_COMMAND_LINE = (f"--hidden-seed: a secret on the command line can be read by every process of the "
                              f"machine, a student's code among them; put it in the environment ({SECRET_ENV}) or, in "
                              "a grading installation, in hidden_seed.txt, readable by root only")


def course_main(argv):
    """`python agentic_rl.py homework ...` and `python agentic_rl.py grade ...`; the course's secret comes
    from the environment (AGENTIC_RL_HIDDEN_SEED) or the installation's hidden_seed.txt, never a flag."""
    parser = argparse.ArgumentParser(prog="agentic_rl.py", description="The course's machinery.", allow_abbrev=False)
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


# ------------------------------------------------------------------------------------------------
# The machinery's own tests: what a teaching assistant sees on grading day, and what an attacking
# student tries (each attack gains nothing)
# ------------------------------------------------------------------------------------------------
def normalized(line):
    return " ".join(line.split("#")[0].split())


def fill(path, exercise, code):
    """Write `code` (lines, at the stub's indentation) in place of the exercise's stub in a handout file."""
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip().startswith((f"raise NotImplementedError('{exercise}: ",
                                                                            f'raise NotImplementedError("{exercise}: ')))
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines[at:at + 1] = [indent + c + "\n" for c in code]
    path.write_text("".join(lines))


def fake_record(seed, dev, metric=None, warm=0.52, **asked):
    """A run record in the shape a run writes it (summary.json's config, warm start, candidate and curve; one
    metrics.jsonl line per iteration) with the numbers given: the grader's tests cannot train for minutes."""
    config = asdict(A.Config(seed=seed, **asked))
    metrics = [{"success": 0.5, "clip_frac": 0.0015, "approx_kl": 0.0002, "zero_std_groups": 5, "truncation_rate": 0.01,
                **(metric or {})} for _ in range(config["iterations"])]
    return {"summary": {"config": config, "warm_start": {"dev_success": warm}, "candidate": {"dev_success": dev},
                        "train_success_curve": [m["success"] for m in metrics]}, "metrics": metrics}


def reference_answers(seeds=README_SEEDS, handout=None) -> dict:
    """answers.json as the reference would write it, for a handout with ratio_always_one: the README's
    measured E3 numbers and E8's signature, in records of the runs' shape made with these seeds (the README's
    own, by default: the numbers a student could copy)."""
    clock = {"value_zero": [1.0, 1.0, 1.0], "bootstrap_budget": [0.46, 0.0, 0.0],
             "hidden_clock_value_zero": [1.0, 1.0, 1.0], "hidden_clock_bootstrap_budget": [0.0, 0.43, 0.0]}
    return {**({"handout": handout} if handout else {}), "seeds": list(seeds),
            "silent_bug": "ratio_always_one: ppo_step_loss passed logprobs.detach() as the old log-probs; it now "
                          "passes the log-probs recorded when the episodes were sampled",
            "silent_bug_evidence": "clip_frac and approx_kl are exactly 0 in every iteration of seed 0, seed 1 and "
                                   "seed 2, while a healthy run logs a clip_frac near 0.0015: the ratio never leaves 1",
            "silent_bug_runs": [fake_record(seeds[i % 3], 1.0, {"clip_frac": 0.0, "approx_kl": 0.0} if i < 3 else None,
                                            **E8_RUNS[i // 3]) for i in range(6)],
            "silent_bug_fixed_runs": [fake_record(seeds[i % 3], 1.0, None, **E8_RUNS[i // 3]) for i in range(6)],
            "clock": {**clock, "runs": {k: [fake_record(seeds[s], v, **E3_RUN, **CLOCK_SETTINGS[k])
                                            for s, v in enumerate(vals)] for k, vals in clock.items()},
                      "why": "bootstrapping the task's own budget credits an episode that runs out of turns with V(s_K), "
                             "the value of a mid-repair state, so stalling costs nothing while a wrong commit costs its "
                             "0; the truncation rate climbs and the critic explains nothing. Valued 0, running out is an end"}}


SECRET = "5e0f4c1b9a7d2e836f1c0b4a9d8e7f26"   # a course's secret for these tests (the README says how to make one)


def course(*argv, cwd=REPO, check_exit=None, preexec_fn=None):
    """Run `python agentic_rl.py ARGV` as a TA would, from a grading installation (preexec_fn: what the TA's
    session holds, set up in the process before it starts)."""
    done = subprocess.run([sys.executable, "agentic_rl.py", *map(str, argv)], cwd=cwd, capture_output=True, text=True,
                          preexec_fn=preexec_fn)
    assert check_exit is None or done.returncode == check_exit, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def course_here(capsys, *argv) -> tuple:
    """(exit code, what it printed) of `python agentic_rl.py ARGV`, run in this process."""
    with pytest.raises(SystemExit) as done:
        course_main([str(a) for a in argv])
    printed = capsys.readouterr()
    return done.value.code, printed.out + printed.err


def installation(tmp_path) -> Path:
    """A grading installation as the bundle lays it out (readable by root only, as setup.sh leaves it)."""
    source = tmp_path / "source"
    source.mkdir(mode=0o700)
    for name in ("agentic_rl.py", "envs.py", "test_agentic_rl.py", "requirements.txt"):
        shutil.copy(REPO / name, source / name)
    return source


def hold(lock, how):
    """Take (fcntl.LOCK_EX) or give back (LOCK_UN) the one-grading-at-a-time lock, where there is one (as root)."""
    if lock is not None:
        fcntl.flock(lock, how)


class SharedSandbox:
    """What `with Sandbox(user, memory) as sandbox:` gives grade(), from a fork server kept for the in-process
    gradings of this module: starting one costs seconds (a fresh interpreter importing torch), and these tests
    grade a dozen times. Each grading still gets a fresh worker per exercise, killed with everything it started
    (Worker.close), the same limits and sandbox user; as root it holds the one-grading-at-a-time lock while it
    grades, and on leaving it kills every process of the grading, as Sandbox.__exit__ does. A whole Sandbox's
    life (a server per grading, the lock taken at its start) is what the command-line tests below exercise."""

    def __init__(self, sandbox: Sandbox, memory: int):
        self.sandbox, self.memory = sandbox, memory

    def __enter__(self):
        hold(self.sandbox.lock, fcntl.LOCK_EX)
        self.sandbox.__dict__.pop("isolation", None)              # this grading's workers say what they ran as
        self.sandbox.memory = self.memory                         # each fork request carries it
        return self.sandbox

    def __exit__(self, *exc):
        try:
            self.sandbox.clean()
        finally:
            hold(self.sandbox.lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def private_installation(tmp_path_factory) -> Path:
    """A copy of this installation in a folder only root can enter: Sandbox refuses, as root, an installation
    the sandbox user could read, and this checkout may well be world-readable."""
    copy = tmp_path_factory.mktemp("installation")
    os.chmod(copy, 0o700)
    for name in {*HANDOUT_FILES, *INSTALLED}:
        if (REPO / name).exists():
            (copy / name).parent.mkdir(exist_ok=True)
            shutil.copy(REPO / name, copy / name)
    return copy


@pytest.fixture
def graded_privately(private_installation):
    """In this test the grader's installation (REPO) is private_installation; a patch of its own, which the
    test's monkeypatch.undo() leaves alone."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys.modules[__name__], "REPO", private_installation)
        yield private_installation


@pytest.fixture(scope="module")
def fork_servers():
    """user -> a Sandbox kept for this module's in-process gradings; closed (under the lock) at its end."""
    servers = {}
    yield servers
    for sandbox in servers.values():
        hold(sandbox.lock, fcntl.LOCK_EX)
        sandbox.__exit__(None, None, None)


# The ten slowest sandbox tests (each grades whole submissions in workers: about 45 s together on 2 cores) stay out
# of the default run, which they would make half as long again; CI runs them: AGENTIC_RL_ALL_TESTS=1 (.ci/run).
SLOW_SANDBOX = pytest.mark.skipif(os.environ.get("AGENTIC_RL_ALL_TESTS") != "1",
                                  reason="a slow sandbox test: AGENTIC_RL_ALL_TESTS=1 runs it, as .ci/run does")


@pytest.fixture
def shared_sandbox(fork_servers, graded_privately):
    """grade() in this test takes its fork server from fork_servers (see SharedSandbox) and grades from
    private_installation; a patch of its own, which the test's monkeypatch.undo() leaves alone."""
    real = Sandbox

    def sandbox(user=SANDBOX_USER, memory: int = MEMORY_LIMIT):
        if user not in fork_servers:
            fork_servers[user] = server = real(user, memory)
            server.clean()                  # answered once its imports are done: no test's time limit pays for them
            hold(server.lock, fcntl.LOCK_UN)                     # taken again for each grading
        return SharedSandbox(fork_servers[user], memory)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys.modules[__name__], "Sandbox", sandbox)
        yield


@SLOW_SANDBOX
def test_a_fresh_handout_scores_zero_leaks_nothing_and_round_trips(tmp_path):
    out = tmp_path / "handout"
    assert sorted(write_handout(out)) == sorted(EXERCISES)     # graded at 0 in the autograder test below
    handout = {name: (out / name).read_text() for name in HANDOUT_FILES}
    assert "GRADER ONLY" not in handout["test_agentic_rl.py"] and "ANSWER -->" not in handout["README.md"]
    for secret in ("def course_main", "SILENT_BUGS", "def grade(", "REFERENCE", "hidden=True"):
        assert secret not in handout["test_agentic_rl.py"], f"the handout's tests carry the grader's {secret}"
    assert json.loads((out / "answers.json").read_text()) == answers_template()
    code = {name: text.splitlines() for name, text in handout.items()}
    everything = "\n".join(normalized(line) for lines in code.values() for line in lines
                           if "raise NotImplementedError(" not in line)          # the stubs state the formulas
    for name in ("agentic_rl.py", "envs.py"):
        reference = (REPO / name).read_text()
        ref_lines, out_lines = reference.splitlines(), handout[name].splitlines()
        compile(handout[name], name, "exec")                                  # the handout parses
        assert solution_regions(handout[name], name) == {}, "no solution marker is left"
        rebuilt, regions = list(out_lines), solution_regions(reference, name)
        for ex, (first, last) in sorted(regions.items(), key=lambda r: -r[1][0]):
            at = next(i for i, line in enumerate(rebuilt) if line.strip() == f"# TODO({ex}): replace this raise with your implementation")
            rebuilt[at:at + 2] = ref_lines[first:last + 1]
            for line in ref_lines[first + 1:last]:                            # no solution line survives anywhere
                if len(normalized(line)) >= 14 and not normalized(line).startswith(("with ", "for ")):  # not loop heads
                    assert normalized(line) not in everything, f"{ex}: solution line leaked: {line.strip()}"
        assert rebuilt == ref_lines, f"{name}: filling every blank must give back the reference exactly"
    tells = (("clamp(1 - ", "clip"), ("d.exp() ", "- d"), ("gamma * lam ", "* run"), ("r[k] + ", "gamma"))
    for tell in ("".join(pieces) for pieces in tells):                    # joined here, so this file does not match
        assert tell not in everything, f"tell-tale solution expression in the handout: {tell}"
    assert (out / ".ci" / "run").stat().st_mode & 0o111, "the CI script stays executable"
    again = course("homework", "--out", tmp_path / "h2", cwd=out, check_exit=1)
    assert "this copy is a handout" in again.stderr
    planted = tmp_path / "planted"
    write_handout(planted, silent_bug="one_group_per_batch", hidden_seed=SECRET, student="Ana@uni.example")
    text = (planted / "agentic_rl.py").read_text()
    assert SILENT_BUGS["one_group_per_batch"][3] in text and "one_group_per_batch" not in text
    assert "SILENT BUG" not in (planted / "test_agentic_rl.py").read_text()
    answers = json.loads((planted / "answers.json").read_text())
    assert issued_to(answers["handout"], SECRET, ["ana@uni.example "]) == ("ana@uni.example ", "one_group_per_batch")
    assert issued_to(answers["handout"], "0" * 32, ["ana@uni.example"]) is None
    assert answer_key(answers, SECRET, ["ana@uni.example"], None)["seeds"] == answers["seeds"] and \
        not set(answers["seeds"]) & set(README_SEEDS), "the seeds the handout names are the grader's, not the README's"
    for bad, match in [(dict(out=out), "not empty"), (dict(out=REPO / "in-place"), "outside"),
                       (dict(out=tmp_path / "o", only=["nope"]), "unknown exercise"),
                       (dict(out=tmp_path / "file" / "x"), "--out")]:
        (tmp_path / "file").write_text("")
        with pytest.raises(ValueError, match=match):
            write_handout(**bad)


@SLOW_SANDBOX
def test_edited_tests_patched_checks_endless_loops_and_hard_coding_earn_half_at_most(tmp_path, monkeypatch, shared_sandbox):
    out = tmp_path / "handout"
    write_handout(out, only=["returns", "gae", "sign_test", "ppo_clip"])
    seen, real = {}, A.discounted_returns                        # a student who copies the visible checks' answers

    def spy(rewards, gamma):
        seen[repr((rewards, gamma))] = real(rewards, gamma).tolist()
        return real(rewards, gamma)
    monkeypatch.setattr(A, "discounted_returns", spy)
    for ex, _, fn, hidden in HOMEWORK:
        if ex == "returns" and not hidden:
            fn(A)
    monkeypatch.undo()
    fill(out / "agentic_rl.py", "returns", [f"return torch.tensor({seen!r}.get(repr((rewards, gamma)), [0.0] * len(r)))"])
    fill(out / "agentic_rl.py", "gae", ["while True:", "    pass"])
    fill(out / "agentic_rl.py", "ppo_clip", ["ratio = (logprobs - old_logprobs).exp()",   # min and max swapped
                                             "per_token = -torch.max(ratio * advantages, ratio.clamp(1 - clip_eps, "
                                             "1 + clip_eps) * advantages)",
                                             "loss = (per_token * mask).sum() / mask.sum().clamp(min=1)",
                                             "return loss, {'clip_frac': 0.0, 'approx_kl': 0.0}"])
    with open(out / "agentic_rl.py", "a") as f:                    # patching the checks from inside the student's file
        f.write("\nimport builtins, pytest\npytest.approx = lambda *a, **k: True\n"
                "builtins.AssertionError = type('Never', (Exception,), {})\n")
    (out / "test_agentic_rl.py").write_text("HOMEWORK, EXPERIMENT_CHECKS = [], []\n")
    (out / "conftest.py").write_text("def pytest_runtest_makereport(item, call):\n    call.excinfo = None\n")
    t = time.time()
    report = grade(out, only=["returns", "gae", "ppo_clip", "sign_test", "promotion"], time_limit=3)
    status = {ex: [(c["hidden"], c["status"]) for c in row["checks"]] for ex, row in exercises(report).items()}
    assert all(s == "passed" for hidden, s in status["returns"] if not hidden), status["returns"]
    assert suspicious(report["returns"]) and score(report["returns"])[0] <= 0.5 * EXERCISES["returns"][0]
    assert {s for _, s in status["gae"]} == {"time limit"} and time.time() - t < 60
    assert score(report["ppo_clip"])[0] <= 0.25 * EXERCISES["ppo_clip"][0], status["ppo_clip"]
    assert {s for _, s in status["sign_test"]} == {"not started"}
    assert {s for _, s in status["promotion"]} == {"passed"}, "promotion asks the grader for sign_test_p's values"


def test_a_file_that_does_not_compile_costs_only_its_own_exercises(tmp_path, shared_sandbox):
    out = tmp_path / "handout"
    write_handout(out, only=["kl_k3"])
    with open(out / "agentic_rl.py", "a") as f:
        f.write("\nraise SystemExit(3)\n")
    report = exercises(grade(out, only=["kl_k3", "sign_test"]))
    assert all(c["status"] == "crashes" and "does not import" in c["message"]
               for row in report.values() for c in row["checks"]), report
    (out / "envs.py").write_text("def broken(:\n")
    shutil.copy(REPO / "agentic_rl.py", out / "agentic_rl.py")
    report = exercises(grade(out, only=["sign_test", "permission_rule"]))
    assert {c["status"] for c in report["sign_test"]["checks"]} == {"passed"}, "agentic_rl.py's exercises still count"
    assert all("SyntaxError" in c["message"] for c in report["permission_rule"]["checks"])


@SLOW_SANDBOX
def test_the_autograder_bundle_grades_the_reference_fully_a_fresh_handout_at_zero_and_fails_loudly(tmp_path):
    import zipfile
    bundle = tmp_path / "autograder.zip"
    write_autograder(bundle, silent_bug="ratio_always_one", hidden_seed=SECRET)
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as z:
        assert set(z.namelist()) == {"setup.sh", "run_autograder", "agentic_rl.py", "envs.py", "test_agentic_rl.py",
                                     "requirements.txt", "silent_bug.txt", "hidden_seed.txt"}
        setup = z.read("setup.sh").decode()
        assert "torch==2.13.0" in setup and "go-rwx" in setup and "useradd" in setup and "--break-system-packages\"" in setup
        z.extractall(root / "source")
    (root / "results").mkdir()
    (root / "submission_metadata.json").write_text(json.dumps({"users": [{"email": "ana@uni.example", "id": 1}]}))
    run = (root / "source" / "run_autograder").read_text().replace("/autograder/", f"{root}/")
    assert run.count("python3 agentic_rl.py") == 1, "the script runs the grader with Gradescope's python3"
    run = run.replace("python3 agentic_rl.py", f"{shlex.quote(sys.executable)} agentic_rl.py")   # here: this test's
    reference, handout = root / "reference", root / "handout"
    reference.mkdir()
    for name in ("agentic_rl.py", "envs.py"):
        shutil.copy(REPO / name, reference / name)
    handout_id, seeds = new_handout(SECRET, "ana@uni.example", "ratio_always_one")      # the submitter's own
    (reference / "answers.json").write_text(json.dumps(reference_answers(seeds, handout_id)))
    write_handout(handout)
    scores = {}
    for name, submission in (("reference", reference), ("handout", handout)):
        done = subprocess.run(["bash", "-c", run.replace(f"{root}/submission ", f"{submission} ")], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        scores[name] = json.loads((root / "results" / "results.json").read_text())
    total = sum(points for points, _ in EXERCISES.values()) + sum(EXPERIMENTS.values())
    assert scores["reference"]["score"] == pytest.approx(total) and scores["handout"]["score"] == 0
    for name, results in scores.items():                             # Gradescope's results.json format
        assert set(results) >= {"score", "execution_time", "output", "visibility", "stdout_visibility", "tests"}
        assert len(results["tests"]) == 2 * (len(EXERCISES) + len(EXPERIMENTS))
        for t in results["tests"]:
            assert set(t) >= {"name", "score", "max_score", "number", "output", "visibility"}
            assert t["visibility"] in ("visible", "after_published")
            assert (t["score"] == t["max_score"]) if name == "reference" else t["score"] == 0
            assert t["max_score"] == pytest.approx(0.5 * dict(EXERCISES, **{k: (v,) for k, v in EXPERIMENTS.items()})[
                t["name"].split()[0]][0]), "visible and hidden checks carry half the points each"
    (root / "source" / "agentic_rl.py").write_text("import sys\nsys.exit(7)\n")   # a grader that writes nothing
    done = subprocess.run(["bash", "-c", run.replace(f"{root}/submission ", f"{handout} ")], capture_output=True, text=True)
    assert done.returncode == 1 and "wrote no results.json" in done.stderr
    write_autograder(tmp_path / "two.zip", only=["gae", "clock"])
    with zipfile.ZipFile(tmp_path / "two.zip") as z:
        assert "--only gae,clock" in z.read("run_autograder").decode() and "hidden_seed.txt" not in z.namelist()


HOSTILE = '''
import ctypes, json, os, re, socket, struct, sys, time
RESULTS, SOURCE, SUBMISSION, CLASSMATE, HOST_SOCKET = {results!r}, {source!r}, {submission!r}, {classmate!r}, {host!r}
NOTES = []
def note(what, data):
    NOTES.append(what + ": " + (data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)))
def kl_k3(*args, **kwargs):                          # all this worker found, in the one message the grader reports
    raise RuntimeError("\\n".join(NOTES))
real_recv = socket.socket.recv
def recv(self, *args, **kwargs):                     # record everything the grader sends
    data = real_recv(self, *args, **kwargs)
    note("received", re.sub(rb"[-0-9.e, ]{{40,}}", b"(numbers)", data))   # long runs of numbers hide no code
    return data
socket.socket.recv = recv
libc = ctypes.CDLL(None, use_errno=True)
def checked(result):
    if result < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result
def started(pid):                                    # a raw clone's child comes back here too: it leaves at once
    if checked(pid) == 0:
        os._exit(0)
    os.waitpid(pid, 0)
def connect(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
def datagram(path):                                  # a socket pair needs no path of its own to send to one
    one, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    one.connect(path)
clone_args = (ctypes.c_uint64 * 8)(0x10000000, 0, 0, 0, 17, 0, 0, 0)   # clone3's: CLONE_NEWUSER, exit signal SIGCHLD
for name, attempt in [
        ("read the installation", lambda: note("read", open(SOURCE + "/test_agentic_rl.py").read()[:200])),
        ("write the installation", lambda: open(SOURCE + "/silent_bug.txt", "w").write("ratio_always_one")),
        ("patch the checks", lambda: open(SOURCE + "/test_agentic_rl.py", "a").write("\\nHOMEWORK.clear()\\n")),
        ("write answers.json", lambda: open(SUBMISSION + "/answers.json", "w").write('{{"silent_bug": "x"}}')),
        ("read a classmate's file", lambda: note("read", open(CLASSMATE).read()[-200:])),
        ("connect to a host socket", lambda: connect(HOST_SOCKET)),
        ("send a datagram to a host socket", lambda: datagram(HOST_SOCKET)),
        ("open an internet socket", lambda: socket.socket(socket.AF_INET).close()),
        ("open a vsock socket", lambda: socket.socket(socket.AF_VSOCK).close()),   # it would reach the hypervisor
        ("read the TA's key", lambda: note("read", checked(libc.syscall(250, 10, -3, b"user", b"ta:api-token", 0)))),
        ("request the TA's key", lambda: checked(libc.syscall(249, b"user", b"ta:api-token", None, 0))),
        ("leave a key for the next", lambda: checked(libc.syscall(248, b"user", b"left", b"x", 1, -4))),
        ("clone a user namespace", lambda: started(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))),   # clone(2)
        ("clone3 a user namespace", lambda: started(libc.syscall(435, ctypes.byref(clone_args), 64))),  # clone3(2)
        ("unshare a user namespace", lambda: checked(libc.unshare(0x10000000)))]:      # last: it would stay in it
    try:
        attempt()
        note(name, "an attempt worked")
    except OSError as e:
        note(name, f"refused ({{e}})")
for line in open("/proc/self/status").read().splitlines():
    if line.startswith(("NoNewPrivs:", "Seccomp:")):
        note("status", line)
note("keys it sees", open("/proc/keys").read())        # a read, which no filter stops
note("processes", sorted(int(pid) for pid in os.listdir("/proc") if pid.isdigit()))
for pid in filter(str.isdigit, os.listdir("/proc")):  # look for the grader through /proc
    for what in ("cwd", "root"):
        try:
            note("found", os.readlink(f"/proc/{{pid}}/{{what}}"))
        except OSError:
            pass
os.write(1, b"\\xff\\xfe not utf-8 " + struct.pack("!Q", 12) + b'{{"value": 1}}' + b"\\n" * 3)
os.write(2, b'{{"ready": true}}\\n\\xff' * 500)
if os.fork() == 0:                                   # a detached child that outlives the worker
    os.setsid()
    if os.fork() == 0:
        for _ in range(100):
            try:
                with open(RESULTS, "w") as f:
                    f.write(json.dumps({{"score": 140.0, "tests": []}}))
            except OSError:
                pass
            time.sleep(0.05)
    os._exit(0)
'''


def keyring_with_a_token():
    """In a grader's process before it starts: a session keyring of its own (gone with its processes) holding
    a TA's token, as a TA's login session may."""
    import ctypes
    libc = ctypes.CDLL(None)
    libc.syscall(250, 1, None)                                             # keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)
    libc.syscall(248, b"user", b"ta:api-token", b"token", 5, -3)           # add_key(2) to KEY_SPEC_SESSION_KEYRING


def alive_as(uid: int) -> list:
    return [p for p in filter(str.isdigit, os.listdir("/proc")) if os.path.exists(f"/proc/{p}/status") and
            f"\nUid:\t{uid}\t" in open(f"/proc/{p}/status").read()]


@SLOW_SANDBOX
@pytest.mark.skipif(os.getuid() != 0, reason="the sandbox user needs a grader running as root (as on Gradescope)")
def test_an_attacking_submission_gains_nothing_and_leaves_nothing_behind(tmp_path):
    """A submission graded as Gradescope grades (as root, from an installation only root can read) in a TA's local
    batch of world-readable folders, beside a host service's unix socket: it reads /proc, tries to read and write
    the installation, to write its answers, to read a classmate's file, to reach the socket, to make a user
    namespace three ways, prints bytes that look like frames, and leaves a child that rewrites the results. It
    reports all it found through its error message, the one way out it has; the classmate is graded next. The
    grader's session keyring holds a TA's token (keyctl search, request_key), and the attack also tries to leave a
    key in the user's keyring (add_key), to open an internet or vsock socket and to reach the host's socket
    through a socket pair."""
    source, results = installation(tmp_path), tmp_path / "results.json"
    batch = Path(tempfile.mkdtemp(dir="/run"))       # outside /tmp, which each worker has of its own
    os.chmod(batch, 0o755)
    submission, classmate = batch / "alice", batch / "bob"
    write_handout(classmate)
    with open(classmate / "agentic_rl.py", "a") as f:
        f.write("\n# bob's own work\n")
    host = socket.socket(socket.AF_UNIX)
    host.bind(str(batch / "host.sock"))
    host.listen()
    os.chmod(batch / "host.sock", 0o777)
    try:
        write_handout(submission, only=["returns", "kl_k3"])
        fill(submission / "agentic_rl.py", "returns", ["G, out = 0.0, []", "for r_k in reversed([float(x) for x in r]):",
                                                       "    G = r_k + gamma * G", "    out.append(G)",
                                                       "return torch.tensor(out[::-1])"])
        (submission / "answers.json").unlink()
        with open(submission / "agentic_rl.py", "a") as f:
            f.write(HOSTILE.format(results=str(results), source=str(source), submission=str(submission),
                                   classmate=str(classmate / "agentic_rl.py"), host=str(batch / "host.sock")))
        installed = lambda: {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()}   # not __pycache__
        before = installed()
        done = course("grade", submission, "--only", "returns,kl_k3,silent_bug", "--json", results, cwd=source,
                      check_exit=1, preexec_fn=keyring_with_a_token)
        graded = json.loads(results.read_text())
        time.sleep(1.0)                              # a surviving child would rewrite results.json by now
        assert json.loads(results.read_text()) == graded and alive_as(pwd_uid()) == []
        assert installed() == before, "the installation is unchanged"
        assert not (submission / "answers.json").exists() or graded["tests"][-2]["score"] == 0
        tests = {t["name"]: t for t in graded["tests"]}
        assert tests["returns (visible checks)"]["score"] == tests["returns (visible checks)"]["max_score"] > 0, \
            "correct code passes whatever bytes it prints"
        assert tests["returns (hidden checks)"]["score"] == tests["returns (hidden checks)"]["max_score"]
        assert tests["kl_k3 (visible checks)"]["score"] == 0
        seen = tests["kl_k3 (visible checks)"]["output"] + tests["kl_k3 (hidden checks)"]["output"]   # its messages
        assert "an attempt worked" not in seen and seen.count("refused") >= 15, seen
        assert "keys it sees" in seen and "ta:api-token" not in seen, "the grader's keyring is out of reach"
        assert "bob's own work" not in json.dumps(graded), "a classmate's folder is out of reach"
        assert "status: NoNewPrivs:\t1" in seen and "status: Seccomp:\t2" in seen, seen
        assert "processes: [1]" in seen or "pids shared" in done.stdout, "it sees only what it started"
        assert not [line for line in seen.splitlines() if line.strip().startswith("found: ") and str(tmp_path) in line], \
            "/proc shows the student nothing of the grader's directories"
        reference = (REPO / "agentic_rl.py").read_text()
        lines = {normalized(line) for line in reference.splitlines() if len(normalized(line)) > 24}
        assert "received" in seen and not [line for line in lines if line in seen], "no reference code crossed"
        course("grade", classmate, "--only", "returns,silent_bug", "--json", tmp_path / "bob.json", cwd=source,
               check_exit=1)                         # the next student, graded by the same installation
        assert json.loads((tmp_path / "bob.json").read_text())["score"] == 0
    finally:
        host.close()
        shutil.rmtree(batch)


def pwd_uid() -> int:
    import pwd
    try:
        return pwd.getpwnam(SANDBOX_USER).pw_uid
    except KeyError:
        return pwd.getpwnam("nobody").pw_uid


@SLOW_SANDBOX
def test_a_detached_child_is_killed_and_answers_written_late_are_ignored_even_without_a_sandbox_user(tmp_path, shared_sandbox):
    submission, marker = tmp_path / "sub", tmp_path / "marker"
    write_handout(submission, only=["kl_k3"])
    (tmp_path / "late.json").write_text(json.dumps(reference_answers()))
    with open(submission / "agentic_rl.py", "a") as f:                 # answers.json, written while being graded
        f.write(f"\nimport shutil\nshutil.copy({str(tmp_path / 'late.json')!r}, {str(submission / 'answers.json')!r})\n")
        f.write(f"\nimport os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                f"        while True:\n            open({str(marker)!r}, 'a').write('x')\n            time.sleep(0.05)\n"
                f"    os._exit(0)\nwhile not os.path.exists({str(marker)!r}):\n    time.sleep(0.01)\n")
    report = grade(submission, only=["kl_k3", "clock"], user=None)
    assert "no sandbox user" in report["~sandbox"] and "passed" not in {c["status"] for c in report["clock"]["checks"]}
    assert json.loads((submission / "answers.json").read_text()) == reference_answers(), "it was written, and not read"
    size = marker.stat().st_size
    time.sleep(0.5)
    assert marker.stat().st_size == size > 0, "the child ran, and died with its exercise"


def test_whatever_a_submission_holds_it_gets_a_valid_results_json(tmp_path, capsys, shared_sandbox):
    cases = {"deep": {"answers.json": "[" * 100_000, "agentic_rl.py": REPO / "agentic_rl.py", "envs.py": "#" * (5 << 20)},
             "special": {"answers.json": "dir", "envs.py": "fifo"}}
    for case, files in cases.items():
        submission = tmp_path / case
        write_handout(submission, only=["sign_test", "permission_rule"])
        for name, what in files.items():
            (submission / name).unlink()
            if isinstance(what, Path):
                (submission / name).symlink_to(what)
            elif what == "dir":
                (submission / name).mkdir()
            elif what == "fifo":
                os.mkfifo(submission / name)
            else:
                (submission / name).write_text(what)
        results = tmp_path / f"{case}.json"
        code, printed = course_here(capsys, "grade", submission, "--only", "sign_test,permission_rule,clock", "--json",
                                    results)
        out = json.loads(results.read_text())
        assert code == 1 and out["score"] == 0 and len(out["tests"]) == 6, (case, out)
        text = printed + json.dumps(out)
        expected = {"deep": ["not valid JSON", "agentic_rl.py is a symbolic link", "envs.py is over 4 MiB"],
                    "special": ["envs.py is a special file", "answers.json is a directory"]}[case]
        assert all(e in text for e in expected), (case, text[-1500:])


@SLOW_SANDBOX
def test_limits_are_checked_up_front_and_a_memory_hog_is_stopped(tmp_path, capsys, monkeypatch, shared_sandbox):
    """A hog of 3 GiB, then, with a limit of 512 MiB, four processes of 200 MiB each (each under a process's
    limit, RLIMIT_AS, not together): the limit is the worker's, a cgroup's where the machine has one, else a share of it for each of
    the few processes the sandbox user may have; the reference passes either way."""
    for bad in ("0", "-1", "nan", "inf", "1e-9"):
        code, printed = course_here(capsys, "grade", tmp_path, "--time-limit", bad)
        assert code == 2 and "--time-limit" in printed
    code, printed = course_here(capsys, "grade", tmp_path / "missing")
    assert code == 2 and "no such directory" in printed
    submission = tmp_path / "hog"
    write_handout(submission, only=["kl_k3"])
    fill(submission / "agentic_rl.py", "kl_k3", ["hog = bytearray(3 << 30)", "return hog"])
    report = grade(submission, only=["kl_k3"])
    assert {c["status"] for c in report["kl_k3"]["checks"]} == {"memory limit"}, report
    write_handout(tmp_path / "hogs", only=["kl_k3"])
    fill(tmp_path / "hogs" / "agentic_rl.py", "kl_k3", HOGS.splitlines())   # 4 processes, each under 512 MiB
    for cgroups in (CGROUP_ROOT, str(tmp_path / "none")):     # the machine's cgroups, then a machine without
        monkeypatch.setattr(sys.modules[__name__], "CGROUP_ROOT", cgroups)
        report = grade(tmp_path / "hogs", only=["kl_k3"], memory=512 << 20)
        held = re.search(r"held 200 MiB each at once: (\d)", report["kl_k3"]["checks"][0]["message"])
        assert (int(held.group(1)) if held else 0) < 4 or "no sandbox user" in report["~sandbox"], report
        assert "for the worker and all it starts (cgroup v" in report["~sandbox"] or "no cgroup" in report["~sandbox"]
    assert "no cgroup; 8 tasks" in report["~sandbox"] or "no sandbox user" in report["~sandbox"], report["~sandbox"]
    report = grade(REPO, only=["mask", "ppo_clip", "promotion"])     # the reference, torch's threads and all
    assert {c["status"] for row in exercises(report).values() for c in row["checks"]} == {"passed"}, report


HOGS = """import os, select, time
ready, told = os.pipe()
for _ in range(4):
    if os.fork() == 0:
        try:
            hog = b"x" * (200 << 20)
            os.write(told, b"1")
            time.sleep(60)
        finally:
            os._exit(0)
os.close(told)
held, ended, deadline = 0, 0, time.monotonic() + 20
while held + ended < 4 and time.monotonic() < deadline:
    if select.select([ready], [], [], 0.1)[0]:
        held += len(os.read(ready, 4))
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            ended += 1
    except ChildProcessError:
        pass
raise RuntimeError(f"processes that held 200 MiB each at once: {held}")"""


def test_promotion_is_answered_sign_test_p_for_its_own_reports_alone(tmp_path, shared_sandbox):
    """A red team's last row: promotion's worker asked the grader for sign_test_p at inputs of its choosing and
    carried the values out in a message, a table that hard-codes sign_test. Only the wins and losses of the two
    reports in the call are answered, which a right promotion_decision still gets (all its checks pass)."""
    sub, right = tmp_path / "sub", tmp_path / "right"
    write_handout(sub, only=["promotion"])
    fill(sub / "agentic_rl.py", "promotion", ["raise RuntimeError(f'oracle {sign_test_p(7, 7)!r}')"])
    write_handout(right, only=["sign_test"])                      # promotion is the reference's
    for folder, want in ((sub, {"crashes"}), (right, {"passed"})):
        report = exercises(grade(folder, only=["promotion"], time_limit=20))["promotion"]
        assert {c["status"] for c in report["checks"]} == want, report
    assert "0.6047" not in json.dumps(report) and all("only for the wins and losses" in c["message"]
                                                       for c in exercises(grade(sub, only=["promotion"]))["promotion"]["checks"])


ASK_THE_GRADER = """import sys as _s, __main__ as _m
_f = _s._getframe()
while _f is not None and "sock" not in _f.f_locals:
    _f = _f.f_back
_m.send(_f.f_locals["sock"], {"callback": "sign_test_p", "args": [int(wins), int(losses)]})
return _m.receive(_f.f_locals["sock"], 1 << 20)["value"]"""


def sysv_objects(key: int) -> list:
    """The kinds (shm, sem, msg) of System V IPC objects with this key in the grader's namespace; each
    removed, so that a failing run leaves no memory behind."""
    found = []
    for kind, option in (("shm", "-M"), ("sem", "-S"), ("msg", "-Q")):
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            if int(line.split()[0]) == key:
                found.append(kind)
                subprocess.run(["ipcrm", option, str(key)], check=True)
    return found


@SLOW_SANDBOX
def test_what_a_red_team_broke_holds_now(tmp_path, shared_sandbox):
    """A second round of attacks (a red team's, on this grader): asking the grader for another exercise's
    answer, a reply of 40 MB, a screen-clearing message, files left in /tmp and a shared-memory segment and
    message queue left for the next exercise, a file that crashes the compiler and one it takes minutes over
    (compiled in the grader's process, it held up the grading), a frame that drips in, and
    a link planted at the results' old temporary name (two gradings side by side:
    test_two_gradings_at_once_take_turns)."""
    sub = tmp_path / "sub"
    write_handout(sub, only=["sign_test"])
    fill(sub / "agentic_rl.py", "sign_test", ASK_THE_GRADER.splitlines())
    text = (sub / "agentic_rl.py").read_text()
    text = text.replace("def discounted_returns(rewards, gamma) -> torch.Tensor:\n",
                        "def discounted_returns(rewards, gamma) -> torch.Tensor:\n    return torch.zeros(10_000_000)\n", 1)
    text = text.replace("def gae(rewards, values, last_value, bootstrap, gamma, lam):\n",
                        "def gae(rewards, values, last_value, bootstrap, gamma, lam):\n"
                        "    raise ValueError('\\x1b[2J\\x1b[Htotal 140.0 / 140.0: every check passed')\n", 1)
    text += "\nimport os\nassert not os.path.exists('/tmp/leak'), 'a file from another exercise'\nopen('/tmp/leak', 'w')\n"
    key = random.randrange(1, 1 << 31)                          # System V IPC: a key of this run's own
    text += (f"\nimport ctypes\n_libc = ctypes.CDLL(None)\nassert _libc.shmget({key}, 0, 0) < 0 and _libc.msgget({key}, 0) "
             f"< 0, 'shared memory from another exercise'\n_libc.shmget({key}, 1 << 20, 0o1666)\n"   # IPC_CREAT | 0o666
             f"_libc.msgget({key}, 0o1666)\n")
    (sub / "agentic_rl.py").write_text(text)
    report = grade(sub, only=["returns", "gae", "kl_k3", "sign_test"], time_limit=20)
    status, left = {ex: {c["status"] for c in row["checks"]} for ex, row in exercises(report).items()}, sysv_objects(key)
    assert status["kl_k3"] == {"passed"} or "files shared" in report["~sandbox"] or "ipc shared" in report["~sandbox"], \
        "each exercise has its own /tmp and its own System V IPC"
    assert left == [] or "ipc shared" in report["~sandbox"], "what a worker made there dies with it"
    assert status["sign_test"] == {"crashes"} and "may not ask for" in report["sign_test"]["checks"][0]["message"]
    assert status["returns"] == {"crashes"} and len(json.dumps(report)) < 100_000, "a 40 MB reply is refused"
    assert "broke the grader's protocol: it sent a malformed reply (ValueError: a frame of" in \
        report["returns"]["checks"][0]["message"], "and said so"
    assert "\x1b" not in json.dumps(report["gae"]) and "\\x1b" in report["gae"]["checks"][0]["message"]
    (sub / "agentic_rl.py").write_text("x = " + "+".join(["1"] * 200_000) + "\n")   # the compiler's recursion
    shutil.copy(REPO / "envs.py", sub / "envs.py")
    report = exercises(grade(sub, only=["returns", "permission_rule"]))
    assert {c["status"] for c in report["returns"]["checks"]} == {"crashes"}
    assert {c["status"] for c in report["permission_rule"]["checks"]} == {"passed"}
    (sub / "agentic_rl.py").write_text("x = f'" + "{1}" * 100_000 + "'\n")   # 300 kB, which takes the compiler
    t = time.time()                                                        # time quadratic in its length
    report = exercises(grade(sub, only=["returns", "permission_rule"], time_limit=2))
    assert {c["status"] for c in report["returns"]["checks"]} == {"time limit"}, report["returns"]
    assert {c["status"] for c in report["permission_rule"]["checks"]} == {"passed"}, "the grader compiles nothing itself"
    assert time.time() - t < 30
    drip = tmp_path / "drip"
    write_handout(drip, only=["kl_k3"])
    with open(drip / "agentic_rl.py", "a") as f:                 # a frame that promises 100 bytes, one a second
        f.write("\nimport sys as _s, struct, time\n_f = _s._getframe()\nwhile 'sock' not in _f.f_locals:\n"
                "    _f = _f.f_back\n_f.f_locals['sock'].sendall(struct.pack('!Q', 100))\nfor _ in range(100):\n"
                "    _f.f_locals['sock'].sendall(b' ')\n    time.sleep(1)\n")
    t = time.time()
    assert {c["status"] for c in grade(drip, only=["kl_k3"], time_limit=2)["kl_k3"]["checks"]} == {"time limit"}
    assert time.time() - t < 20
    victim = tmp_path / "victim.txt"
    victim.write_text("root's file")
    (tmp_path / "out.json.tmp").symlink_to(victim)               # the old predictable temporary name
    A.atomic_write(tmp_path / "out.json", lambda f: f.write(b"{}"))
    assert victim.read_text() == "root's file" and (tmp_path / "out.json").read_text() == "{}"


DOCKER_CAPABILITIES = (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31)   # Docker's default: chown, dac_override,
# fowner, fsetid, kill, setgid, setuid, setpcap, net_bind_service, net_raw, sys_chroot, mknod, audit_write, setfcap


def with_dockers_capabilities():
    """In a process before it starts a program: the capabilities Docker leaves a container's root, and no
    other (none of CAP_SYS_ADMIN's namespaces and mounts), for it and all it starts."""
    import ctypes
    libc = ctypes.CDLL(None)
    for capability in set(range(41)) - set(DOCKER_CAPABILITIES):
        libc.prctl(24, capability, 0, 0, 0)                              # PR_CAPBSET_DROP


@SLOW_SANDBOX
@pytest.mark.skipif(os.getuid() != 0, reason="the sandbox user needs a grader running as root")
def test_without_cap_sys_admin_the_grader_makes_up_for_the_namespaces_and_says_so(tmp_path, graded_privately,
                                                                                   monkeypatch):
    """Graded as root with Docker's default capabilities (Gradescope's container may have no more): no
    namespace can be made, so a worker shares the machine's network, System V IPC, processes and files. The
    seccomp filter still refuses sockets; what the sandbox user left in /tmp, /var/tmp, /dev/shm and /run/lock
    (a folder it closed, a link to root's file) and its shared memory, semaphores and message queues are
    removed after each exercise; and the report and results.json say what was shared, loudly for files."""
    key, victim = random.randrange(1, 1 << 31), tmp_path / "victim.txt"
    victim.write_text("root's file")
    sub = tmp_path / "sub"
    write_handout(sub, only=["kl_k3"])
    fill(sub / "agentic_rl.py", "kl_k3", ["raise RuntimeError(_NETWORK)"])
    with open(sub / "agentic_rl.py", "a") as f:
        f.write(f"""
import ctypes as _ctypes, os as _os, socket as _socket
for _top in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
    open(f"{{_top}}/agentic-rl-left-{key}", "w").write("for the next student")
_os.makedirs("/tmp/agentic-rl-dir-{key}/inner")
open("/tmp/agentic-rl-dir-{key}/inner/file", "w").close()
_os.chmod("/tmp/agentic-rl-dir-{key}/inner", 0o500)
_os.symlink({str(victim)!r}, "/tmp/agentic-rl-link-{key}")
_libc = _ctypes.CDLL(None)
_libc.shmget({key}, 4096, 0o1666), _libc.semget({key}, 1, 0o1666), _libc.msgget({key}, 0o1666)   # IPC_CREAT | 0o666
try:
    _socket.socket(_socket.AF_INET).close()
    _NETWORK = "a socket: an attempt worked"
except OSError as e:
    _NETWORK = f"a socket: refused ({{e}})"
""")
    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: real_popen(*a, preexec_fn=with_dockers_capabilities, **k))
    server = Sandbox()                                   # its fork server, with Docker's capabilities
    monkeypatch.undo()
    left = lambda: [f"{top}/{name}" for top in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") for name in os.listdir(top)
                    if name.startswith("agentic-rl-") and name.endswith(f"-{key}")]
    try:
        server.clean()
        hold(server.lock, fcntl.LOCK_UN)
        monkeypatch.setattr(sys.modules[__name__], "Sandbox", lambda user, memory: SharedSandbox(server, memory))
        report = grade(sub, only=["kl_k3"])
        assert "network shared, ipc shared, pids shared, files shared" in report["~sandbox"], report["~sandbox"]
        assert {c["status"] for c in report["kl_k3"]["checks"]} == {"crashes"}
        assert "a socket: refused" in report["kl_k3"]["checks"][0]["message"], "no network: the filter holds"
        assert left() == [] and sysv_objects(key) == [], "what it left is gone before the next exercise"
        assert victim.read_text() == "root's file", "a link is removed, never followed"
        output = gradescope_results(report, 1.0)["output"]
        assert f"sandbox: {report['~sandbox']}" in output and "WARNING: files shared" in output, output
        assert "keep" in output and "unreadable" in output
    finally:
        for path in left():
            subprocess.run(["rm", "-rf", path])
        sysv_objects(key)
        hold(server.lock, fcntl.LOCK_EX)
        server.__exit__(None, None, None)


@SLOW_SANDBOX
@pytest.mark.skipif(os.getuid() != 0, reason="the sandbox user needs a grader running as root")
def test_two_gradings_at_once_take_turns(tmp_path, graded_privately):
    sub = tmp_path / "sub"
    sub.mkdir()
    for name in ("agentic_rl.py", "envs.py"):
        shutil.copy(REPO / name, sub / name)
    reports = [None, None]       # two gradings in one process (no interpreter to start each): two fork servers,
                                 # two locks on the file, as two `grade` commands would take them

    def one(i):
        reports[i] = grade(sub, only=["returns", "kl_k3", "sign_test"])
    runs = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=120)
    assert [sum(score(row)[0] for row in exercises(r).values()) for r in reports] == [20.0, 20.0], \
        "each grading kills only its own workers"
    assert all(c["status"] == "passed" for r in reports for row in exercises(r).values() for c in row["checks"])


@pytest.mark.skipif(os.getuid() != 0, reason="only a grader running as root has a sandbox user to keep out")
def test_an_installation_the_sandbox_user_can_read_is_refused(tmp_path, capsys, monkeypatch):
    readable = Path(tempfile.mkdtemp(dir="/run"))    # a world-readable clone, as a TA might grade from
    try:
        os.chmod(readable, 0o755)
        for name in ("agentic_rl.py", "envs.py", "test_agentic_rl.py"):
            shutil.copy(REPO / name, readable / name)
            os.chmod(readable / name, 0o644)
        monkeypatch.setattr(sys.modules[__name__], "REPO", readable)
        code, printed = course_here(capsys, "grade", tmp_path, "--only", "returns")
        assert code == 2 and "can read agentic_rl.py, envs.py, test_agentic_rl.py" in printed, printed
        assert f"run `chmod -R go-rwx {readable}`" in printed and "Traceback" not in printed
        for name in ("agentic_rl.py", "envs.py", "test_agentic_rl.py"):
            os.chmod(readable / name, 0o600)
        (readable / "hidden_seed.txt").write_text(SECRET + "\n")   # only the secret left open
        code, printed = course_here(capsys, "grade", tmp_path, "--only", "returns")
        assert code == 2 and "can read hidden_seed.txt," in printed, printed
    finally:
        shutil.rmtree(readable)


def test_hidden_inputs_come_from_the_course_secret():
    draws = {}
    for secret in ("", "one", "two"):
        HIDDEN["seed"] = hidden_seed_of(secret)
        draws[secret] = hidden_rng(41).integers(0, 10**9, size=4).tolist()
    HIDDEN["seed"] = 0
    assert len({tuple(d) for d in draws.values()}) == 3, "each course's secret draws its own hidden inputs"
    assert hidden_seed_of("") == 0 and hidden_seed_of(None) == 0


def settings_of(record) -> dict:
    """A record's settings as the audit passes them to rerun(): the seed and those that differ from the defaults."""
    defaults = asdict(A.Config())
    return {k: v for k, v in record["summary"]["config"].items()
            if k in defaults and k not in ("run_dir", "device") and (k == "seed" or v != defaults[k])}


@SLOW_SANDBOX
def test_a_rerun_reproduces_a_real_record_and_trains_the_code_of_the_records_handout(default_runs, monkeypatch):
    record = run_record(default_runs / "runs" / "flightbooking-grpo-s0")    # `train` + TINY_FLAGS, run in this process
    assert rerun_check("clock.runs.value_zero[0]", record, settings_of(record), None, 300)["status"] == "passed", \
        "a real record reproduces (trained again for real, with the reference)"
    trained = {}

    def train(argv, **kwargs):             # where a rerun with the handout's bug trains: what code, and a run
        trained["code"] = Path(argv[1]).read_text()
        shutil.copytree(default_runs / "runs" / "flightbooking-grpo-s0", argv[argv.index("--run-dir") + 1])
    monkeypatch.setattr(subprocess, "run", train)
    rerun(settings_of(record), 300, bug="ratio_always_one")
    assert trained["code"] == plant((REPO / "agentic_rl.py").read_text(), "ratio_always_one") != \
        (REPO / "agentic_rl.py").read_text(), "a record made with the bug is trained again with the bug"


def answers_folder(tmp_path, answers, name="sub") -> Path:
    """A submission holding only answers.json (the experiments read nothing else)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "answers.json").write_text(json.dumps(answers))
    return folder


def trained_again(answers, bug, dev=None):
    """A stand-in for rerun(), which trains for minutes: the record in `answers` made with the settings (and
    the bug) asked for, given back as a real rerun on this machine gives it, or with another dev success
    (E8's fixed CodeRepair runs have the settings of E3's value_zero runs: here, the same records)."""
    made = {(json.dumps(settings_of(r), sort_keys=True), b): r for records, b in
            [(answers["silent_bug_runs"], bug), (answers["silent_bug_fixed_runs"], None),
             *[(records, None) for records in answers["clock"]["runs"].values()]] for r in records}

    def rerun(settings, seconds, bug=None):
        record = made[json.dumps(settings, sort_keys=True), bug]
        return {"summary": {"warm_start": record["summary"]["warm_start"], "candidate": {
            "dev_success": record["summary"]["candidate"]["dev_success"] if dev is None else dev}},
            "metrics": record["metrics"]}
    return rerun


def test_the_audit_reruns_e3_and_e8_and_a_rerun_it_cannot_finish_costs_nothing(tmp_path, monkeypatch, shared_sandbox):
    answers = reference_answers()
    submission, experiments = answers_folder(tmp_path, answers), dict(only=["clock", "silent_bug"],
                                                                       silent_bug="ratio_always_one", rerun_seconds=60)

    def cannot_finish(settings, seconds, bug=None):
        raise subprocess.TimeoutExpired("train", seconds)
    monkeypatch.setattr(sys.modules[__name__], "rerun", cannot_finish)
    report = exercises(grade(submission, **experiments))
    for ex, row in report.items():
        assert score(row) == (EXPERIMENTS[ex], EXPERIMENTS[ex]) and unchecked(row) and not suspicious(row), row
    results = {t["name"]: t for t in gradescope_results(report, 1.0)["tests"]}
    assert NOT_CHECKED in results["clock (hidden checks)"]["output"] and SUSPICIOUS not in json.dumps(results)
    monkeypatch.setattr(sys.modules[__name__], "rerun", trained_again(answers, "ratio_always_one"))
    report = exercises(grade(submission, **experiments))
    reruns = {ex: [c["status"] for c in row["checks"] if c["name"].startswith("rerun_of_")] for ex, row in report.items()}
    assert reruns == {"clock": ["passed"] * 12, "silent_bug": ["passed"] * 12}, "quick reruns: every record, in turn"
    monkeypatch.setattr(sys.modules[__name__], "rerun", trained_again(answers, "ratio_always_one", dev=0.5))
    report = exercises(grade(submission, **experiments))
    assert all(score(row)[0] < EXPERIMENTS[ex] and suspicious(row) for ex, row in report.items()), \
        "a record that a rerun does not reproduce costs its check"


def test_each_student_has_their_own_seeds_and_bug_and_the_readmes_numbers_score_zero(tmp_path, capsys, monkeypatch,
                                                                                       shared_sandbox):
    write_handout(tmp_path / "alice", only=["kl_k3"], silent_bug="ratio_always_one", hidden_seed=SECRET,
                  student="alice@uni.example")
    issued = json.loads((tmp_path / "alice" / "answers.json").read_text())
    honest = reference_answers(issued["seeds"], issued["handout"])       # records of runs made with her seeds
    copied = reference_answers(README_SEEDS, issued["handout"])          # the README's numbers, its seeds 0, 1, 2
    forged = dict(honest, handout=issued["handout"][:-1] + ("0" if issued["handout"][-1] != "0" else "1"))

    def total(name, answers, *students) -> float:
        report = grade(answers_folder(tmp_path, answers, name), only=["clock", "silent_bug"], hidden_seed=SECRET,
                       students=students)
        return sum(score(row)[0] for row in exercises(report).values())
    assert total("honest", honest, "Alice@uni.example") == sum(EXPERIMENTS.values())
    assert total("copied", copied, "alice@uni.example") == 0, "the README's records answer nobody's seeds"
    assert total("forged", forged, "alice@uni.example") == 0
    bobs_id, bobs_seeds = new_handout(SECRET, "bob@uni.example", "ratio_always_one")
    assert total("bobs_id", dict(honest, handout=bobs_id), "bob@uni.example") == 0, "her records answer his id's seeds"
    assert total("bobs_own", reference_answers(bobs_seeds, bobs_id), "bob@uni.example") == sum(EXPERIMENTS.values())
    monkeypatch.setenv(SECRET_ENV, SECRET)                  # bob hands in alice's id, bug and records
    code, printed = course_here(capsys, "grade", answers_folder(tmp_path, honest, "bob"), "--only", "clock,silent_bug",
                                "--student", "bob@uni.example", "--json", tmp_path / "bob.json")
    bob = json.loads((tmp_path / "bob.json").read_text())
    assert code == 1 and bob["score"] == 0 and "no handout id issued to you" in printed
    assert "silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not" in printed
    with pytest.raises(ValueError, match="--student NAME"):
        total("nobody", honest)                             # an id, and nobody to check it against


def test_a_weak_secret_or_one_on_the_command_line_is_refused_saying_how_to_make_one(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    for argv in (["homework", "--autograder", tmp_path / "a.zip", "--hidden-seed", SECRET],
                 ["grade", tmp_path, "--hidden-seed", SECRET]):
        code, printed = course_here(capsys, *argv)
        assert code == 2 and SECRET_ENV in printed and SECRET not in printed, printed
    for weak in ("4242", "0" * 32, "42" * 16, "0123456789abcdef" * 2,        # short, or typed rather than drawn,
                 "0" * 25 + "1234567", "0123456789abcdeffedcba9876543210", "12345678" * 3 + "12345679"):  # a red team's
        monkeypatch.setenv(SECRET_ENV, weak)
        for argv in (["homework", "--autograder", tmp_path / "b.zip"], ["homework", "--out", tmp_path / "h", "--student",
                                                                        "ana"], ["grade", tmp_path]):
            code, printed = course_here(capsys, *argv)
            assert code == 2 and "128 bits" in printed and MAKE_A_SECRET in printed and weak not in printed, printed
    assert not (tmp_path / "b.zip").exists() and not (tmp_path / "h").exists()


def test_the_bundle_audits_the_experiments_by_default(tmp_path, capsys, monkeypatch):
    """Gradescope never passes flags of its own: the bundle's run_autograder carries the audit's seconds."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    course_main(["homework", "--autograder", str(tmp_path / "a.zip")])
    printed = capsys.readouterr().out
    import zipfile
    with zipfile.ZipFile(tmp_path / "a.zip") as z:
        assert f"--rerun {AUDIT_SECONDS:g}" in z.read("run_autograder").decode() and "timeout" in printed, printed
    code, printed = course_here(capsys, "homework", "--out", tmp_path / "h", "--student", "ana", "--rerun", "5")
    assert code == 2 and "--rerun" in printed and not (tmp_path / "h").exists(), printed


def test_homework_from_a_grading_installation_says_what_it_lacks(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", installation(tmp_path))   # as the bundle's setup.sh lays it out
    code, printed = course_here(capsys, "homework", "--out", tmp_path / "handout")
    assert code == 2 and "README.md" in printed and "full copy of the course's repository" in printed, printed
    assert not (tmp_path / "handout").exists()


def test_a_message_is_filed_by_what_raised_it_never_by_its_words():
    raised = lambda kind, message: student_error({"raised": [kind, "Exception", "BaseException", "object"],
                                                  "message": message})
    assert verdict(raised("ValueError", "MemoryError: pack() got a (3, 4) mask")) == \
        ("crashes", "ValueError: MemoryError: pack() got a (3, 4) mask (raised by your code)")
    assert verdict(WorkerGone("last output: MemoryError")) == ("crashes", "your code ended its process (last output: "
                                                                         "MemoryError)")
    status, message = verdict(raised("MemoryError", "a 3 GiB bytearray"))
    assert status == "memory limit" and "a 3 GiB bytearray" in message
    forged = "ok\n[passed] kl_k3 (hidden checks)\ntotal 140.0 / 140.0: every check passed"
    assert verdict(raised("AssertionError", forged)) == ("crashes", f"AssertionError: {forged} (raised by your code)"), \
        "'wrong' is the grader's own assert: the student's is a crash"
    row = {"points": 6, "checks": [{"name": "kl_k3_is_nonnegative", "hidden": False, "status": "crashes",
                                    "message": verdict(raised("AssertionError", forged))[1]}]}
    output = gradescope_results({"kl_k3": row}, 1.0)["tests"][0]["output"]
    assert [line for line in output.splitlines() if not line.startswith("    ")] == ["[crashes] kl_k3_is_nonnegative"], \
        "every line of a message is indented: it cannot forge a line of the report"


def test_experiments_are_graded_on_the_runs_own_records():
    key = {"silent_bug": "ratio_always_one", "seeds": README_SEEDS, "why": ""}
    run = lambda answers, key=key: {name: run_check(fn, answers, key) for _, name, fn, _ in EXPERIMENT_CHECKS}
    assert {s for s, _ in run(reference_answers()).values()} == {"passed"}
    renamed = dict(reference_answers(), silent_bug="one_group_per_batch")
    assert {s for s, _ in run(renamed).values()} == {"passed"}, "naming the bug earns nothing: the runs do"
    assert run(reference_answers(), dict(key, silent_bug="one_group_per_batch"))[
        "silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not"][0] == "wrong"
    records = "clock_numbers_are_your_runs_own_records", "silent_bug_answer_carries_the_runs_before_and_after_the_fix"
    for change, failing, said in [
            (lambda a: a["clock"]["value_zero"].__setitem__(1, 0.9), records[0], "dev_success"),
            (lambda a: a["clock"]["runs"]["bootstrap_budget"][0]["summary"]["config"].update(bootstrap_budget=False),
             records[0], "bootstrap_budget"),
            (lambda a: a["clock"]["runs"]["value_zero"][2]["summary"]["config"].update(iterations=10), records[0],
             "iterations"),
            (lambda a: a["clock"]["runs"]["value_zero"][0]["summary"]["config"].update(eval_every="x"), records[0],
             "eval_every"),                                 # not a grader error in the audit: refused here, by name
            (lambda a: a["silent_bug_fixed_runs"][4]["summary"]["config"].update(eval_every=1), records[1],
             "eval_every"),                                 # legal, and a rerun would evaluate every iteration
            (lambda a: a["silent_bug_runs"][1]["summary"]["candidate"].update(dev_success="1.0"), records[1],
             "dev_success"),
            (lambda a: a.update(silent_bug_evidence="clip_frac and approx_kl stay where they should not be in every "
                                                    "single run that I made with this handout, which shows the bug"),
             records[1], "silent_bug_evidence"),
            (lambda a: a.update(silent_bug_evidence=a["silent_bug_evidence"].replace("exactly 0", "exactly 0.25")
                                .replace("seed 0, seed 1 and seed 2", "seeds A, B, C").replace("0.0015", "")),
             "silent_bug_evidence_quotes_the_runs_numbers", "quotes no value"),
            (lambda a: [m.update(clip_frac=0.002) for r in a["silent_bug_runs"] for m in r["metrics"]],
             "silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not", "do not show"),
            (lambda a: [m.update(clip_frac=0.0, approx_kl=0.0) for r in a["silent_bug_fixed_runs"] for m in r["metrics"]],
             "silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not", "not fixed")]:
        answers = reference_answers()
        change(answers)
        verdicts = run(answers)
        assert verdicts[failing][0] == "wrong" and said in verdicts[failing][1], (failing, verdicts)
    sprayed = reference_answers()                    # a list of every value would match any run
    sprayed["silent_bug_evidence"] += " " + " ".join(f"{x / 100:.2f}" for x in range(101))
    assert run(sprayed)["silent_bug_evidence_quotes_the_runs_numbers"][0] == "wrong"
    effect = "clock_numbers_show_the_effect_the_reference_runs_show"

    def from_warm_start(answers, pairs, warm, dev=None):  # these (setting, seed) runs start from this warm start
        for setting, i in pairs:
            answers["clock"]["runs"][setting][i]["summary"]["warm_start"]["dev_success"] = warm
            if dev is not None:
                answers["clock"][setting][i] = answers["clock"]["runs"][setting][i]["summary"]["candidate"][
                    "dev_success"] = dev
        return answers
    stalled = from_warm_start(reference_answers(), [("value_zero", 0), ("bootstrap_budget", 0)], 0.125, 0.11)
    assert run(stalled)[effect][0] == "passed", "a seed whose warm start cannot repair says nothing about the clock"
    weak = reference_answers()
    for setting in CLOCK_SETTINGS:
        from_warm_start(weak, [(setting, i) for i in range(3)], 0.1, 0.1)
    assert run(weak)[effect][0] == "not checked" and score({"points": 20, "checks": [
        {"hidden": False, "status": "passed"}, {"hidden": True, "status": run(weak)[effect][0]}]}) == (20, 20)
    assert "differ in warm start" in run(from_warm_start(reference_answers(), [("value_zero", 1)], 0.4))[effect][1]
    stalled_fixed = reference_answers()                 # CodeRepair fixed runs that stall from a weak warm start
    for r in stalled_fixed["silent_bug_runs"][3:] + stalled_fixed["silent_bug_fixed_runs"][3:5]:
        [m.update(truncation_rate=0.6) for m in r["metrics"]]
    for r in stalled_fixed["silent_bug_fixed_runs"][3:5]:
        r["summary"]["warm_start"]["dev_success"] = 0.125
    bootstrapped = run(stalled_fixed, dict(key, silent_bug="budget_bootstrapped"))
    assert bootstrapped["silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not"][0] == "not checked"


# END GRADER ONLY
