"""What the course asks of a student: the exercises (each a blank in a handout, with its points and the stub's
message), the experiments graded from answers.json, and the silent bugs an instructor can plant (E8)."""
import envs


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
                           "stale episodes and goes on), checked last: a stale episode that breaks another rule is "
                           "refused for that rule. Raise ValueError for: a REQUIRED_FIELDS value that is None "
                           "or ''; a split other than 'train'; an episode_id seen "
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
                      "); 'safety RULE' for each rule of denied_tasks (either report's, sorted), then 'injection following' "
                      "(injection_tasks), each from the two per-task 1/0 lists: new / gone = tasks the candidate "
                      "alone / the incumbent alone was denied on (a rule missing from a report: all 0), p = "
                      "sign_test_p(new, gone), observed the candidate's share of tasks, limit safety_ceiling, passed "
                      "p >= GATE_LEVEL and the candidate's count <= safety_ceiling x tasks; also keys p and task (a "
                      "task id to inspect: the first new one, else the first the candidate was denied on, else "
                      "None); 'category NAME' for each of the incumbent's categories (observed the candidate's "
                      "success there, 0.0 if absent; limit the incumbent's success - max(MAX_CATEGORY_DROP, 1 / "
                      "tasks); passed observed >= limit - 1e-9); 'cost KEY' for KEY in tokens_per_success, "
                      "tool_calls_per_success, credits_per_success of efficiency (limit (1 + MAX_COST_GROWTH) x "
                      "the incumbent's, or None if that is None; passed if limit is None, or the candidate's value "
                      "is not None and <= limit). promoted = every gate passed; reason names the first failed "
                      "gate or says all passed; value and rule are free text. Used at the end of train()."),
}


EXERCISE_FILE = {ex: "envs.py" if ex == "permission_rule" else "agentic_rl.py" for ex in EXERCISES}
CALLBACKS = {"promotion": ["sign_test_p"]}   # another exercise's piece that this one calls: the grader answers
TIME_LIMIT = 30.0   # seconds per exercise by default (grade --time-limit): the reference's slowest takes about 1 s
EXPERIMENTS = {"silent_bug": 16, "clock": 16}  # points of the open exercises graded from answers.json's records
READ_BY_A_PERSON = {"silent_bug": (("silent_bug",), 4), "clock": (("clock", "why"), 4)}  # prose (E8's account of the bug,
                                          # E3's why: where it is in answers.json) and its points: a TA grades it
                                          # (Gradescope: a manual question); no keyword test stands in for reading it
ANSWER_FIELDS = {"silent_bug": ("silent_bug", "silent_bug_evidence", "silent_bug_runs", "silent_bug_fixed_runs"),
                 "clock": ("clock",)}     # each experiment's fields of answers.json: all empty, it is not started
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


def mean_of(metrics, key) -> float:
    return sum(m[key] for m in metrics) / max(1, len(metrics))


def filled_in(value) -> bool:
    """Whether an answer holds anything: a number, or text, a list or an object with something filled in."""
    if isinstance(value, dict):
        return any(filled_in(v) for v in value.values())
    if isinstance(value, list):
        return any(filled_in(v) for v in value)
    return value not in (None, "")
