"""The hidden checks: half of each exercise's points, on inputs drawn from the course's secret and compared with the
reference, so that no public file is an answer key; and the experiments' hidden checks (the effect E3's runs
show, E8's signature in the runs). They build on the visible checks (course/lesson.py) and join them in one
table per kind: HOMEWORK (each exercise's visible checks, then its hidden ones) and EXPERIMENT_CHECKS."""
import math
import re

import numpy as np
import torch

import agentic_rl as A
import envs
from course.exercises import SILENT_BUGS, mean_of
from course import lesson
from course.lesson import (MONITOR_KEYS, TOK, WARM_ENOUGH, check, clock_numbers_are_your_runs_own_records,
                           make_episode, make_turn, mask_invariants_on_random_episodes, random_episodes,
                           report_card, returns_satisfy_the_recursion, same, store_refuses_each,
                           silent_bug_answer_carries_the_runs_before_and_after_the_fix, with_grad)


class NotChecked(Exception):
    """A check the grader cannot make on this submission's evidence (runs that show nothing to judge): it costs
    the student nothing and is flagged for a TA."""


HIDDEN = {"seed": 0}  # the course's secret as a number; 0 = the public default
HIDDEN_CHECKS, HIDDEN_EXPERIMENT_CHECKS = [], []


def hidden_rng(salt: int) -> np.random.Generator:
    """The hidden checks' inputs: drawn from the course's secret, so no public file holds them."""
    return np.random.default_rng([HIDDEN["seed"], salt])


@check("clock", hidden=True, table=HIDDEN_EXPERIMENT_CHECKS)
def clock_numbers_show_the_effect_the_reference_runs_show(answers, key):
    """Judged on the pairs (one seed, one clock setting: both runs share the warm start) whose warm start can
    already repair: from one below WARM_ENOUGH neither setting learns (seed 43064: 0.125 -> 0.110 and 0.110),
    which says nothing about the clock; fewer than two such pairs: not checked. Measured (README, E3, at 1
    thread): on the eleven such pairs of seeds 0, 1, 2, 43064, 32980, 3329, valuing the budget 0 reached 1.000
    every time, and bootstrapping it lost 0.54-1.00 of it on eight and 0.00-0.38 on three; requiring a mean
    loss of 0.2 fails an honest student with five such pairs about one time in 400, with six one in 900
    (those eleven losses, resampled)."""
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
    assert value - boot >= 0.2, f"answers.json: bootstrapping the budget loses 0.69 of the mean dev success in the " \
                                f"reference runs (0.2 or more expected); your pairs: {value} valued 0, {boot} bootstrapped"


def numbers_in(text: str) -> list:
    """(value, decimals shown) of every number written in a text."""
    return [(float(s), len(s.split(".")[1]) if "." in s else 0) for s in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", text)]


@check("silent_bug", hidden=True, table=HIDDEN_EXPERIMENT_CHECKS)
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


@check("silent_bug", hidden=True, table=HIDDEN_EXPERIMENT_CHECKS)
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


@check("mask", hidden=True, table=HIDDEN_CHECKS)
def mask_matches_the_reference_on_other_episodes(m):
    mask_invariants_on_random_episodes(m, seed=int(hidden_rng(11).integers(2**31)))
    episodes = random_episodes(5, seed=int(hidden_rng(12).integers(2**31)))
    for ep in episodes:
        ep.final_obs_tokens = [TOK.obs, 9, 9, 9, TOK.act]
    same(m.pack(episodes, m.make_tokenizer(envs.FLIGHT_ID), 80), A.pack(episodes, TOK, 80),
         "pack() of five other episodes, long final observations: every field")


@check("returns", hidden=True, table=HIDDEN_CHECKS)
def returns_match_the_reference_on_other_inputs(m):
    rng = hidden_rng(21)
    returns_satisfy_the_recursion(m, seed=int(rng.integers(2**31)))
    for rewards, gamma in [(rng.normal(size=k).round(2).tolist(), round(float(rng.random()), 2)) for k in (1, 2, 9)]:
        same(m.discounted_returns(rewards, gamma), A.discounted_returns(rewards, gamma),
             f"discounted_returns({rewards}, gamma={gamma})")


@check("gae", hidden=True, table=HIDDEN_CHECKS)
def gae_matches_the_reference_on_other_inputs(m):
    rng = hidden_rng(31)
    for _ in range(5):
        k = int(rng.integers(1, 7))
        r, v = rng.normal(size=k).round(3).tolist(), rng.normal(size=k).round(3).tolist()
        last, boot, gamma, lam = round(float(rng.normal()), 3), bool(rng.random() < 0.5), round(float(rng.random()), 2), \
            round(float(rng.random()), 2)
        same(m.gae(r, v, last, boot, gamma, lam), A.gae(r, v, last, boot, gamma, lam),
             f"gae({r}, {v}, last_value {last}, bootstrap={boot}, gamma {gamma}, lam {lam})", tol=1e-4)


@check("grpo", hidden=True, table=HIDDEN_CHECKS)
def grpo_matches_the_reference_on_other_inputs(m):
    rng = hidden_rng(41)
    rows = torch.tensor(rng.integers(0, 2, size=(5, 8)), dtype=torch.float32)
    for std in ("population", "unbiased", "none"):
        same(m.group_advantages(rows, std=std), A.group_advantages(rows, std=std),
             f"group_advantages(0/1 rewards {rows.tolist()}, std={std!r})", tol=1e-4)
    pair = rng.normal(size=2).round(2).tolist()
    same(m.group_advantages(pair), A.group_advantages(pair), f"group_advantages({pair})", tol=1e-4)


@check("ppo_clip", hidden=True, table=HIDDEN_CHECKS)
def ppo_clip_matches_the_reference_on_other_inputs(m):
    g = torch.Generator().manual_seed(int(hidden_rng(51).integers(2**31)))
    logp, old = torch.randn(3, 6, generator=g) * 0.4, torch.randn(3, 6, generator=g) * 0.4
    adv, mask = torch.randn(3, 6, generator=g), (torch.rand(3, 6, generator=g) > 0.3).float()
    for eps in (0.1, 0.3):
        got, want = with_grad(m.ppo_clip_loss, 0, logp, old, adv, mask, eps), with_grad(A.ppo_clip_loss, 0, logp, old,
                                                                                       adv, mask, eps)
        same(got, want, f"ppo_clip_loss on random 3 x 6 inputs, eps {eps}: ((loss, stats), gradient)", tol=1e-4)


@check("kl_k3", hidden=True, table=HIDDEN_CHECKS)
def kl_k3_matches_the_reference_on_other_inputs(m):
    g = torch.Generator().manual_seed(int(hidden_rng(61).integers(2**31)))
    a, b = torch.randn(2, 7, generator=g), torch.randn(2, 7, generator=g)
    same(m.kl_k3(a, b), A.kl_k3(a, b), "kl_k3 on random 2 x 7 inputs", tol=1e-5)


@check("store_refusals", hidden=True, table=HIDDEN_CHECKS)
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
    store_refuses_each(m, impossible)
    ok = make_episode("cut", version=1, turns=[make_turn([TOK.obs, 7, TOK.act], [8, TOK.eoa], version=1),
                                               make_turn([TOK.obs, 9, TOK.act], [8, TOK.eoa], version=1, truncated=True,
                                                         truncated_by="time_limit")])
    store = m.TrajectoryStore(0, len(TOK))
    store.add(ok, 1)
    same(store.staleness, {0: 1}, "a two-turn episode cut by a time limit is admitted; the staleness histogram")


@check("permission_rule", hidden=True, table=HIDDEN_CHECKS)
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


@check("sign_test", hidden=True, table=HIDDEN_CHECKS)
def sign_test_matches_the_binomial_tail_elsewhere(m):
    for wins, losses in [(1, 0), (0, 1)] + [tuple(int(x) for x in hidden_rng(91 + i).integers(0, 50, size=2)) for i in range(3)]:
        n = wins + losses
        same(m.sign_test_p(wins, losses), sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n,
             f"sign_test_p({wins}, {losses})", tol=1e-9)


@check("promotion", hidden=True, table=HIDDEN_CHECKS)
def promotion_matches_the_reference_on_other_report_cards(m):
    rng = hidden_rng(71)
    for _ in range(6):
        n = 60
        cats = {"a": {"tasks": 20, "success": float(rng.integers(0, 21)) / 20},
                "b": {"tasks": 40, "success": float(rng.integers(0, 41)) / 40}}
        denied = lambda: {rule: rng.choice(n, size=int(rng.integers(0, 6)), replace=False).tolist()
                          for rule in ("wrong_class", "wrong_passenger")}    # a few tasks each, sometimes the same
        inc = report_card(rng.integers(0, 2, size=n).tolist(), denied=denied(), categories=cats)
        cand = report_card(rng.integers(0, 2, size=n).tolist(), denied=denied(),
                           unauthorized=int(rng.random() < 0.2), credits=float(rng.integers(8, 14)),
                           categories={k: {**v, "success": min(1.0, v["success"] + float(rng.normal(0, 0.1)))}
                                       for k, v in cats.items()})
        got, want = m.promotion_decision(cand, inc), A.promotion_decision(cand, inc)
        fields_ = lambda out: [out[0], [[g["gate"], g["passed"], g["observed"], g["limit"]] for g in out[2]]]
        same(fields_(got), fields_(want), "promotion_decision on a random pair of report cards: [promoted, "
                                          "[gate, passed, observed, limit] each]", tol=1e-6)


HOMEWORK = lesson.HOMEWORK + HIDDEN_CHECKS       # per exercise: its visible checks, then its hidden ones
EXPERIMENT_CHECKS = lesson.EXPERIMENT_CHECKS + HIDDEN_EXPERIMENT_CHECKS
