"""check-env and new-env: the environment contract (envs.TextToolEnv's docstring) checked by playing, and the
smallest complete environment (library.py) copied to start your own.

    python agentic_rl.py check-env library:LibraryEnv     Gymnasium's check_env, then every rule of CONTRACT
    python agentic_rl.py new-env quote                     writes quote.py: library.py, its names changed

train runs require_contract (a few episodes of each actor) before it builds anything; check-env runs them all.
The class itself is checked first (envload.class_failures); every failure is a sentence naming the
environment, the value and the fix. Every call into the environment's code runs under a time limit, and one that
hangs or tries to end the process stops the check with its sentence (tools/envcalls.py says how, and why so).
"""
import importlib.util
import os
import sys
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

import envs
from agentic_rl import (MAX_COST_GROWTH, Config, Episode, Tokenizer, TrajectoryStore, atomic_write,
                        env_class, host_step, make_env, make_tokenizer, new_turn, start_episode, validate_config,
                        writable_dir)
from envload import HERE, class_failures, raised
from tools import envcalls
from tools.envcalls import Stop, call_limits, finish_fresh, limited, start_fresh, stop_fresh, transcripts


CONTRACT = {  # rule -> what holds when check-env passes it
    "class": "the class attributes and methods TextToolEnv's docstring lists",
    "calls": "every call into the environment returns within the limit per call, and none ends the process",
    "vocabulary": "every word of every observation and call is in words",
    "clock": "every observation is in the observation space, ends with the turns left and fits max_obs_words",
    "rewards": "rewards in [0, 1], paid only on the step that ends the episode",
    "steps": "__init__, reset and step answer every call (a malformed one with 'error : ...') and never raise",
    "endings": "terminated at an end state, truncated exactly when the budget runs out without one",
    "rules": "every rule permission_rule returned is declared in safety_rules",
    "evaluator": "evaluate_episode returns a Verdict and never calls reward()",
    "tasks": "the same task_id gives the same task, and the same seed the same episode",
    "isolation": "an episode is the same after many others in one process as in a fresh one (no state shared)",
    "processes": "the same seed gives the same episode in two processes (whatever their PYTHONHASHSEED)",
    "splits": "every task is train or holdout, and neither split is empty",
    "records": "the demonstrator's calls are well formed and every episode makes a record the store admits",
    "demonstrator": "the demonstrator solves nearly every task without its habit, and fewer with it, and no safety "
                    "rule denies it",
}
VOCABULARY_SLACK = 10  # a note when words holds more than 10 times the words played, and 1,000 more
FRESH_SEEDS = [0, 1, 2, 3, 4]  # the demonstrator's episodes played again here, and in a fresh process, to compare


def check_contract(cfg: Config, episodes: int, fresh: bool = True) -> tuple:
    """Play `episodes` episodes per split with each actor, the demonstrator without and with its habit and random
    well-formed calls (which meet the gate's rules) -> (failures {rule: [at most 3 sentences]}, facts: per habit, the
    demonstrator's train episodes, successes, cuts, denials and costs; task ids where the evaluator and the reward
    disagree; the longest observation and episode; the words played). fresh: also compare FRESH_SEEDS' episodes
    with a fresh process's (check_fresh; it starts now and plays while this one does). train() runs it with a few
    episodes before it builds anything; check-env with many; both after the class passed class_failures
    (validate_config). Each call into the environment runs under envcalls.CALL_LIMIT_S; a Stop ends the check."""
    cfg, found = replace(cfg, time_limit=0, tool_latency_ms=0.0), {}
    facts = {"demonstrator": {}, "disagree": [], "longest": (0, ""), "tokens": 0, "played": set(), "denied": {}}

    def fail(rule, text):
        if len(found.setdefault(rule, [])) < 3 and f"{cfg.env}: {text}" not in found[rule]:
            found[rule].append(f"{cfg.env}: {text}")
    started = []
    try:
        with call_limits(envcalls.CALL_LIMIT_S):
            theirs = os.environ.get("PYTHONHASHSEED", "")  # the fresh ones' seeds differ from this process's
            hash_seed = int(theirs) % 1000 + 1 if theirs.isdigit() else 0
            if fresh:  # a fresh process, another PYTHONHASHSEED, the seeds in another order than this one's
                started = [start_fresh(cfg.env, FRESH_SEEDS[::-1], hash_seed)]
            play_contract(cfg, episodes, fail, facts, found)
            if started and all(started):  # (shared state may be what the failures above come from: say it too)
                check_fresh(cfg.env, started, hash_seed, fail)
    except Stop as e:
        fail(e.rule, e.text)
        facts["stopped"] = e.rule  # the rules after it were not (all) played
    finally:
        for each in started:
            stop_fresh(each)
    return found, facts


def play_contract(cfg: Config, episodes: int, fail, facts: dict, found: dict):
    """check_contract's episodes: the splits, then each actor on each split, then what their episodes say."""
    cls, tok = env_class(cfg.env), make_tokenizer(cfg.env)
    try:
        raw = limited("__init__", make_env, cfg).unwrapped
        splits = [limited(f"make_task({t}) or split_of", lambda t: raw.split_of(raw.make_task(int(t))), t)
                  for t in np.random.default_rng(0).integers(0, 10**6, 50 * episodes)]
    except Exception as e:
        raise Stop("steps", f"the environment cannot be made: {raised(e)}") from None
    if set(splits) != {"train", "holdout"}:
        return fail("splits", f"split_of gave {dict(Counter(splits))} on {len(splits)} task ids: it must say 'train' "
                              "or 'holdout', and both (report cards judge holdout tasks alone)")
    random_calls = np.random.default_rng(0)

    def random_call(_obs):
        tool = list(cls.tool_schema)[random_calls.integers(len(cls.tool_schema))]
        return " ".join([tool] + [str(random_calls.choice(cls.argument_words[k])) for k in cls.tool_schema[tool]])
    for split in ("train", "holdout"):
        for habit in (0.0, 1.0, None):  # None: random calls
            played = []
            for i in range(episodes):
                try:
                    demo = None if habit is None else limited("Demonstrator", cls.Demonstrator, habit, seed=i)
                except Exception as e:  # every demonstrator episode needs one
                    raise Stop("records", f"Demonstrator({habit}, seed={i}) raised {raised(e)}") from None
                played.append(probe_episode(cfg, tok, i, split, demo, random_call, fail, facts))
                if played[-1] is not None and demo is not None and i < 2:  # the same seed, the same episode;
                    replay_episode(cfg, tok, i, split, played[-1], fail)    # the same task_id, the same task
            if habit is not None:
                count_denials(cls, [ep for ep in played if ep is not None], facts["denied"].setdefault(habit, {}))
            if habit is not None and split == "train":
                facts["demonstrator"][habit] = demonstrator_facts([ep for ep in played if ep is not None])
    words, longest = facts["longest"]
    if words > cls.max_obs_words:
        fail("clock", f"the longest observation has {words} words ({shown(longest)}), above max_obs_words="
                      f"{cls.max_obs_words}: set max_obs_words = {words} or more (the host keeps that much room)")
    if facts["disagree"] and "evaluator" not in found:
        fail("evaluator", f"the evaluator and the reward disagree on {len(facts['disagree'])} of the demonstrator's "
                          f"episodes (task ids {facts['disagree'][:5]}): one of them misjudges the final state")
    best = facts["demonstrator"].get(0.0)
    if best and not best["wins"]:
        fail("demonstrator", f"without its habit the demonstrator solves 0 of its {best['episodes']} train tasks "
                             f"({best['episodes'] - best['truncated']} ended unsolved, {best['truncated']} ran out of "
                             f"turns; the gate denied {best['denied']} of its calls): "
                             "imitation cannot start from it; find what stops it (Demonstrator.act, the call that "
                             "should end the episode, permission_rule)")
    for habit, rules in facts["denied"].items():
        for rule, (count, task_id, call) in rules.items():
            fail("demonstrator", f"{'with' if habit else 'without'} its habit the demonstrator's calls were denied "
                                 f"{count} times by the safety rule {rule} (the first: {call!r} in task {task_id}): "
                                 "its habit must cost the outcome, never break a rule (the warm start would teach "
                                 "the policy to break it); make Demonstrator.act keep permission_rule's rules")


def count_denials(cls, played: list, denied: dict):
    """Add the calls of these demonstrator episodes that one of the environment's safety rules denied (the host's own
    rules, unknown_tool and bad_arguments, are the records rule's) -> denied {rule: (count, first task id, call)}."""
    for ep in played:
        for turn in ep.turns:
            if not turn.gate_allowed and turn.gate_reason in cls.safety_rules:
                count, task_id, call = denied.get(turn.gate_reason, (0, ep.task_id, turn.action_text))
                denied[turn.gate_reason] = (count + 1, task_id, call)


def check_fresh(env: str, started: list, hash_seed: int, fail):
    """No state shared across episodes, and no order that changes with PYTHONHASHSEED: the demonstrator's episodes
    of FRESH_SEEDS, played here after the whole check, must be those a fresh process played first, in reverse order
    (started: start_fresh with PYTHONHASHSEED hash_seed). Where they differ, a second fresh process (hash_seed + 1,
    the same order; appended to started) tells why: if the two fresh ones differ too, the order of a set (or of
    what was built from one) reached the episode; if only this process differs, state did."""
    try:
        here = transcripts(env, FRESH_SEEDS)
    except Exception:  # what raised was said by the episodes above
        return
    wait_s = 3 * (envcalls.LIMIT[0] or envcalls.CALL_LIMIT_S) + 30  # its own calls are limited too
    there = finish_fresh(started[0], wait_s)
    if "error" in there:
        return fail("isolation", f"played first in a fresh process, the demonstrator's episodes failed where "
                                 f"they passed here: {there['error']}")
    seed = next((seed for seed in map(str, FRESH_SEEDS) if here[seed] != there[seed]), None)
    if seed is None:
        return
    started.append(start_fresh(env, FRESH_SEEDS[::-1], hash_seed + 1))
    other = finish_fresh(started[-1], wait_s)
    if "error" not in other and other[seed] != there[seed]:
        return fail("processes", f"seed {seed}'s episode differs between two fresh processes (PYTHONHASHSEED="
                                 f"{hash_seed} and {hash_seed + 1}): {difference(there[seed], other[seed])}: the "
                                 "iteration order of a set of str changes with PYTHONHASHSEED; sort it (sorted("
                                 "...)) before it reaches an observation, a call or a verdict")
    fail("isolation", f"seed {seed}'s episode, played here after the whole check, differs from a fresh process's: "
                      f"{difference(here[seed], there[seed])}: state is carried across episodes (a module-level or "
                      "class-level list or dict the environment writes to; keep an episode's state in "
                      "new_state(task)), or something other than self.np_random draws")


def difference(a: list, b: list) -> str:
    """Where two transcripts (envcalls.transcripts) part: the task, a turn, or the verdict."""
    if a[0] != b[0]:
        return f"task {a[0]} vs task {b[0]}"
    for turn, (x, y) in enumerate(zip(a[1], b[1])):
        if x != y:
            show = lambda row: f"{row[0] or 'reset'} -> {shown(row[1])}, reward {row[2]}" + \
                (", terminated" if row[3] else "") + (", truncated" if row[4] else "")
            return f"task {a[0]}, turn {turn}: {show(x)} vs {show(y)}"
    return f"task {a[0]}: {len(a[1])} vs {len(b[1])} turns" if len(a[1]) != len(b[1]) else \
        f"task {a[0]}, the verdict: {a[2]} vs {b[2]}"


def shown(text, words: int = 12) -> str:
    """An observation in a sentence: whole if short, else its first words and its true length (a million words of
    it must not become a million-word line)."""
    if not isinstance(text, str) or len(text) <= 120:
        return repr(text)
    return f"{' '.join(text[:40 * words].split()[:words])!r}... ({len(text.split()):,} words, {len(text):,} characters)"


def demonstrator_facts(played: list) -> dict:
    """The demonstrator's train episodes of one habit: how many, solved, cut by the budget, denied calls, and the
    cost of a solved task (tool calls, action tokens, credits per success), as the release gates count them."""
    wins, turns = sum(ep.reward >= 1 for ep in played), [t for ep in played for t in ep.turns]
    per_win = lambda total: total / wins if wins else None
    return {"episodes": len(played), "wins": wins, "success": wins / max(1, len(played)),
            "truncated": sum(ep.truncated for ep in played), "denied": sum(not t.gate_allowed for t in turns),
            "tool_calls_per_success": per_win(sum(t.gate_allowed for t in turns)),
            "tokens_per_success": per_win(sum(len(t.action_tokens) for t in turns)),
            "credits_per_success": per_win(sum(t.cost for t in turns))}


def probe_episode(cfg: Config, tok: Tokenizer, seed: int, split: str, demo, random_call, fail, facts):
    """One episode through the host gate, each step checked against the contract -> its Episode, or None."""
    try:
        env, gate, ep, obs = limited(f"reset(seed={seed}, options={{'split': {split!r}}})", start_episode, cfg, seed,
                                     split, f"check-{split}-{seed}", 0, 0)
    except Exception as e:
        return fail("steps", f"reset(seed={seed}, options={{'split': {split!r}}}) raised {raised(e)}")
    raw, known = env.unwrapped, set(tok.itos)
    for _ in range(raw.max_turns + 1):
        check_observation(raw, obs, known, fail, facts)
        try:
            if demo is not None and not ep.turns:
                limited("Demonstrator.reset", demo.reset, obs)
            text = random_call(obs) if demo is None else limited("Demonstrator.act", demo.act, obs)
        except Exception as e:
            return fail("records", f"the demonstrator raised {raised(e)} on the observation {shown(obs)}")
        if demo is not None and envs.parse_action(text, raw.tool_schema, raw.argument_words) is None:
            fail("records", f"the demonstrator's call {shown(text)} (after {shown(obs)}) is not a well-formed call of "
                            "tool_schema")
        facts["played"].update(text.split() if isinstance(text, str) else ())
        try:  # the gate's permission_rule, then the tool
            next_obs, reward, terminated, truncated, info, decision = limited(f"the call {text!r}", host_step, env,
                                                                              gate, text)
        except Exception as e:  # the gate's ValueError: a rule permission_rule returned that safety_rules lacks
            return fail("rules", str(e)) if "safety_rules" in str(e) else fail("steps", f"the call {text!r} raised "
                                                                              f"{raised(e)}: answer it, never raise")
        if not isinstance(reward, float) or not 0 <= reward <= 1:
            fail("rewards", f"reward {reward!r} after {text!r}: a reward is a float in [0, 1] (1: the task done)")
        elif reward and not terminated:
            fail("rewards", f"reward {reward} after {text!r} while the episode goes on: pay only on the step that "
                            "ends it (an outcome, no shaping)")
        if truncated != (not terminated and raw.state.turns >= raw.max_turns):
            fail("endings", f"after {text!r} at turn {raw.state.turns} of {raw.max_turns}: terminated={terminated}, "
                            f"truncated={truncated}; truncated exactly when the budget runs out without an end state")
        action = tok.encode_action(text)
        ep.turns.append(new_turn(obs, tok.encode_observation(obs), action, [-1.0] * len(action), text, 0, reward,
                                 terminated, truncated, info, decision))
        obs = next_obs
        if terminated or truncated:
            break
    else:
        return fail("endings", f"an episode went past its budget of {raw.max_turns} turns without ending")
    check_observation(raw, obs, known, fail, facts)
    ep.final_obs_tokens = tok.encode_observation(obs)
    facts["tokens"] = max(facts["tokens"], sum(len(t.obs_tokens) + len(t.action_tokens) for t in ep.turns) +
                          len(ep.final_obs_tokens))
    check_verdict(env, ep, demo is not None, fail, facts)
    try:
        if split == "train" and all(0 <= t.reward <= 1 for t in ep.turns):  # the store takes training episodes only;
            TrajectoryStore(0, len(tok)).add(ep, 0)                            # a bad reward is said once, above
    except ValueError as e:
        fail("records", f"the store refuses its episode: {e}")
    return ep


def check_observation(raw, obs, known: set, fail, facts: dict):
    """The vocabulary and the clock, on one observation."""
    if not isinstance(obs, str) or len(obs) > raw.observation_space.max_length:  # nothing more can be read from it
        raise Stop("clock", f"an observation of {shown(obs) if isinstance(obs, str) else repr(obs)[:100]} is "
                            f"{'past' if isinstance(obs, str) else 'not text, unlike'} the observation space (at most "
                            f"{raw.observation_space.max_length} characters of envs.CHARSET): a policy reads it whole")
    words = obs.split()
    facts["played"].update(words)
    if obs not in raw.observation_space:
        return fail("clock", f"the observation {obs!r} is not in the observation space (text of envs.CHARSET, at "
                             "most 400 characters)")
    for w in words:
        if w not in known and w not in facts.setdefault("missing", set()):  # each missing word once
            facts["missing"].add(w)
            fail("vocabulary", f"the word {w!r} (in the observation {shown(obs)}) is not in {type(raw).__name__}.words: "
                               "add it (the policy would read <unk>)")
    left = raw.max_turns - raw.state.turns
    if raw.show_clock and words[-2:] != [str(left), "left"]:
        fail("clock", f"the observation {shown(obs)} does not end with the turns left ('{left} left'): return the text "
                      "from _tool_<name> and let the base append the clock")
    facts["longest"] = max(facts["longest"], (len(words), obs))


def check_verdict(env, ep: Episode, by_demonstrator: bool, fail, facts: dict):
    """The evaluator, on one finished episode: a Verdict, reached without calling reward()."""
    raw, calls = env.unwrapped, []
    raw.reward = lambda: calls.append(1) or 0.0  # an instance attribute: shadows the method until deleted
    try:
        verdict = limited("evaluate_episode", type(raw).evaluate_episode, env)
    except Exception as e:
        return fail("evaluator", f"evaluate_episode raised {raised(e)}")
    finally:
        del raw.reward
    if calls:
        fail("evaluator", "evaluate_episode calls reward(): re-derive success from the final state with code of its "
                          "own, so that a bug in the verifier is not repeated by the judge")
    counts = [getattr(verdict, k, None) for k in ("side_effects", "unauthorized_side_effects", "repeated_side_effects")]
    if not isinstance(getattr(verdict, "success", None), bool) or not isinstance(getattr(verdict, "category", None), str) \
            or not all(type(c) is int and c >= 0 for c in counts):
        return fail("evaluator", f"evaluate_episode returned {shown(repr(verdict))}: return envs.Verdict(success (a bool), "
                                 "side_effects, unauthorized_side_effects, repeated_side_effects (ints >= 0), category)")
    if by_demonstrator and verdict.success != (ep.reward >= 1):
        facts["disagree"].append(ep.task_id)


def replay_episode(cfg: Config, tok: Tokenizer, seed: int, split: str, ep: Episode, fail):
    """The same seed gives the same episode (the same calls, the same observations); its task_id, the same task."""
    try:
        env, gate, again, obs = limited(f"reset(seed={seed})", start_episode, cfg, seed, split, "replay", 0, 0)
        seen = [obs] + [limited(f"the call {t.action_text!r}", host_step, env, gate, t.action_text)[0] for t in ep.turns]
    except Exception as e:
        return fail("tasks", f"replaying seed {seed}'s episode raised {raised(e)}: the same calls must play the same")
    first = [t.observation for t in ep.turns]
    if again.task_id != ep.task_id or seen[:-1] != first:
        fail("tasks", f"seed {seed} gave two different episodes (task {ep.task_id}, then {again.task_id}; "
                      f"{first[:2]} vs {seen[:2]}): draw only from self.np_random and np.random.default_rng(task_id)")
    made = []  # the same task_id, made by two environments reset with two seeds: what a host sees of it must agree
    for other in (seed, seed + 1):
        try:
            made.append(limited(f"reset(seed={other}), make_task({ep.task_id})", made_again, cfg, other, ep.task_id))
        except Exception as e:
            return fail("tasks", f"making task {ep.task_id} again raised {raised(e)}: the same task_id, the same task")
    if made[0] != made[1]:
        fail("tasks", f"task_id {ep.task_id} was made twice as {made[0]} and {made[1]}: make_task and split_of must "
                      "be pure functions of task_id (draw from np.random.default_rng(task_id), never self.np_random)")


def made_again(cfg: Config, seed: int, task_id: int) -> tuple:
    """Task task_id made by an environment reset with `seed`: what a host sees of it."""
    raw = make_env(cfg).unwrapped
    raw.reset(seed=seed)
    task = raw.make_task(task_id)
    return raw.prompt(task), raw.host_view(task), raw.split_of(task)


def require_contract(cfg: Config):
    """Before a model is built: a few episodes of check_contract; a broken environment stops here, each rule said.
    The fresh process (check_fresh, about 0.3 s) plays only an environment of your own: the ones shipped beside the
    lesson pass check-env, which always runs it."""
    module = sys.modules[env_class(cfg.env).__module__]
    shipped = Path(getattr(module, "__file__", None) or "/").resolve().parent == HERE
    failures, _ = check_contract(cfg, episodes=3, fresh=not shipped)
    if failures:
        raise ValueError(f"env={cfg.env!r} breaks the environment contract (TextToolEnv's docstring; python "
                         f"agentic_rl.py check-env {cfg.env} checks it all):\n  " +
                         "\n  ".join(text for texts in failures.values() for text in texts))


def check_env_command(env: str, episodes: int = 200) -> bool:
    """check-env ENV: Gymnasium's check_env, then the chapter's environment contract by playing (check_contract:
    `episodes` episodes per split and actor), then what the demonstrator's episodes say of its habit and of the
    release gates. One line per rule, each failure a sentence naming the environment, the value and the fix; notes
    for what is allowed but will cost you. Returns whether every rule held."""
    from gymnasium.utils.env_checker import check_env
    cls = envcalls.within_limit(f"importing {env}", env_class, env)
    print(f"check-env {env}: {cls.__module__}.{cls.__name__} ({cls.env_version or '?'} / {cls.reward_version or '?'})")
    failures, facts, notes = {}, {}, []
    for rule, text in class_failures(cls):
        failures.setdefault(rule, []).append(f"{env}: {text}")
    cfg = None
    if not failures:  # a block_size that fits the declared observations: check-env judges the environment alone
        with call_limits(envcalls.CALL_LIMIT_S):
            try:  # validate_config makes one environment (its max_turns)
                cfg = limited("__init__", validate_config, Config(
                    env=env, block_size=max(Config.block_size, 2 * (cls.max_obs_words + 2) + 6)))
            except ValueError as e:
                failures["steps"] = [f"{env}: {e}"]
            except Stop as e:
                failures[e.rule] = [f"{env}: {e.text}"]
    if cfg:
        more, facts = check_contract(cfg, episodes)
        failures.update(more)
    checked = {"class"} | (set(CONTRACT) if cfg and not facts.get("stopped") else set())  # what ran to its end
    if cfg and not failures.keys() & {"calls", "steps", "clock"}:  # gymnasium's would meet those again
        checked.add("gymnasium")
        with warnings.catch_warnings(record=True) as caught, call_limits(envcalls.CALL_LIMIT_S):
            warnings.simplefilter("always")
            try:
                limited("gymnasium's check_env (its __init__, reset and step)", lambda: check_env(
                    make_env(cfg).unwrapped, skip_render_check=True))
            except Exception as e:
                failures["gymnasium"] = [f"{env}: gymnasium's check_env: {raised(e)}"]
            except Stop as e:
                failures[e.rule] = [f"{env}: {e.text}"]
        notes += [f"gymnasium: {shown(str(w.message))}" for w in dict.fromkeys(str(w.message) for w in caught)]
    off, on = (facts.get("demonstrator", {}).get(habit) for habit in (0.0, 1.0))
    if off and on and off["wins"]:
        if off["success"] < 0.9:
            failures.setdefault("demonstrator", []).append(
                f"{env}: without its habit the demonstrator solves {off['success']:.3f} of train tasks ({off['truncated']} "
                f"of {off['episodes']} ran out of turns; the gate denied {off['denied']} of its calls): imitation starts "
                "from what it shows; make it solve nearly every task")
        if on["success"] >= off["success"] - 0.02:
            failures.setdefault("demonstrator", []).append(
                f"{env}: with its habit the demonstrator solves {on['success']:.3f}, without it {off['success']:.3f}: "
                "the habit costs nothing, so imitation copies nothing for RL to fix (or reward() pays for its mistakes)")
        for key in ("tool_calls_per_success", "tokens_per_success", "credits_per_success"):
            if on[key] and off[key] > (1 + MAX_COST_GROWTH) * on[key]:
                notes.append(f"without its habit the demonstrator spends {off[key]:.3g} {key.replace('_', ' ')}, with it "
                             f"{on[key]:.3g}: a policy that drops the habit may fail that release gate (at most "
                             f"{1 + MAX_COST_GROWTH:g} x the incumbent's); price the tools for what a call costs")
    if facts.get("longest", (0,))[0] and cls.max_obs_words > 2 * facts["longest"][0] + 4:
        notes.append(f"max_obs_words {cls.max_obs_words} is far above the longest observation played ({facts['longest'][0]} "
                     "words): the host keeps that much room free in every context; lower it")
    vocabulary, played = set(cls.words), facts.get("played", set())
    if played and len(vocabulary) > VOCABULARY_SLACK * len(vocabulary & played) + 1000:
        notes.append(f"{cls.__name__}.words has {len(vocabulary):,} words, and the episodes played here used "
                     f"{len(vocabulary & played):,} of them: each word is a row of the policy's embedding and of its "
                     "output layer, learned only if played; list the words an observation or a call can hold")
    if facts.get("tokens", 0) > Config.block_size:
        notes.append(f"an episode played here has {facts['tokens']} tokens, more than the default block_size "
                     f"{Config.block_size}: train with --block-size {facts['tokens']} or more")
    for rule, holds in {"gymnasium": "gymnasium's check_env", **CONTRACT}.items():
        for text in failures.get(rule, []) or ([None] if rule in checked else []):  # one never reached: not "ok"
            print(f"  {'FAIL' if text else 'ok  '}  {text or holds}")
    unreached = [rule for rule in ("gymnasium", *CONTRACT) if rule not in checked and rule not in failures]
    if unreached:
        print(f"  --    not checked, the check stopped at its failure: {', '.join(unreached)}")
    for note in notes:
        print(f"  note  {note}")
    if off and on:
        print(f"demonstrator success on train tasks: habit 0 {off['success']:.3f}, habit 1 {on['success']:.3f}; the "
              f"evaluator and the reward disagree on {len(facts['disagree'])} of its episodes; the longest observation "
              f"has {facts['longest'][0]} words (max_obs_words {cls.max_obs_words})")
    print("all rules hold" if not failures else f"{sum(map(len, failures.values()))} failure(s)")
    return not failures


LENDING_DESK = Path(__file__).resolve().parent.parent / "library.py"  # the smallest complete environment, shipped


def new_env(name: str, out: str = ".") -> Path:
    """new-env NAME: write NAME.py, a copy of library.py (the lending desk) with its module and class renamed."""
    if not name.isidentifier() or not name.islower():
        raise ValueError(f"new-env {name!r}: a module name, lowercase letters, digits and _ (e.g. quote)")
    path, cls = Path(out) / f"{name}.py", "".join(w.capitalize() for w in name.split("_")).removesuffix("Env") + "Env"
    if path.exists():
        raise ValueError(f"new-env {name}: {path} exists; choose another name or move it away")
    if name in sys.modules or importlib.util.find_spec(name) is not None:  # `import NAME` would find that one
        raise ValueError(f"new-env {name}: a module named {name} is already importable here (`import {name}` would "
                         "find it, not your file); choose another name")
    text = LENDING_DESK.read_text().replace("library:LibraryEnv", f"{name}:{cls}")
    text = text.replace("LibraryEnv", cls).replace('"library-', f'"{name}-')
    writable_dir(out, "--out")
    atomic_write(path, lambda f: f.write(text.encode()))
    print(f"wrote {path}: class {cls}, a copy of the lending desk (library.py) to make your own. Next: python "
          f"agentic_rl.py check-env {name}:{cls}, then python agentic_rl.py train --env {name}:{cls}")
    return path


# --- Their commands: python agentic_rl.py check-env ENV [--episodes N], new-env NAME [--out DIR] ------------------
def add_arguments(command: str, parser):
    if command == "check-env":
        parser.add_argument("env", help="a gymnasium id (AgenticRL/Vault-v0) or MODULE:CLASS (my_env:QuoteEnv)")
        parser.add_argument("--episodes", type=int, default=200, help="episodes per split and actor (default 200)")
    else:
        parser.add_argument("name", help="the module's name (NAME.py; the class is its CamelCase + Env)")
        parser.add_argument("--out", default=".", help="the folder to write it in (default: here)")


def prepare(command: str, args):
    if command == "check-env" and not 1 <= args.episodes <= 10**4:
        raise ValueError(f"--episodes {args.episodes}: must be in [1, 10000]")


def run(command: str, args, ready):
    if command == "check-env":
        sys.exit(0 if check_env_command(args.env, args.episodes) else 1)
    new_env(args.name, args.out)
