"""The chapter's worked examples, computed by the functions training uses: `python agentic_rl.py examples`
prints them (the demo too, first), `--html` draws them; the lesson's tests assert each number.

    02 the mask: 60 of 180 tokens are the policy's      03 returns, gamma 0.9: [0.729, 0.81, 0.9, 1]
    03 GRPO, rewards [1, 0, 0, 1]: [+1, -1, -1, +1]     01 one flight episode, the record Part I opens with
"""
from dataclasses import replace

import envs
from agentic_rl import (Config, Episode, Turn, advantages_for, broadcast_to_tokens, discounted_returns,
                        group_advantages, make_tokenizer, pack, ppo_clip_loss, scripted_episode, start_episode)
from tools.views import write_examples


def worked_examples() -> dict:
    """The chapter's three hand calculations, and one episode to follow, computed by the functions training uses."""
    tok = make_tokenizer(envs.FLIGHT_ID)
    filler = [tok.stoi["flight"]]
    ep = Episode("example", 0, envs.FLIGHT_ID, "example", "example", 0, "train", 0, 0)
    ep.turns = [Turn("", [tok.obs] + filler * 28 + [tok.act], filler * 14 + [tok.eoa], [0.0] * 15, "", 0, True, "ok",
                     {}, 0.0, 0.0, False, False, False) for _ in range(4)]  # 4 x (30 context + 15 policy): 120 + 60
    batch = pack([ep], tok, block_size=180)
    step_credit, episode = worked_group()
    return {"mask_tokens": int(batch["tokens"].shape[1]), "mask_sum": int(batch["action_mask"].sum()),
            "mask": batch["action_mask"][0].int().tolist(), "step_credit": step_credit, "episode": episode,
            "returns": [round(x, 6) for x in discounted_returns([0, 0, 0, 1], gamma=0.9).tolist()],
            "grpo_advantages": [round(x, 6) for x in group_advantages([1, 0, 0, 1]).tolist()]}


def worked_group() -> tuple:
    """A flight group (task 511821: F4, the cheapest morning flight, is sold out; F1 has seats): four episodes share
    `search` and `filter`, then check seats or book blind. -> (per episode and turn: action, advantage under grpo,
    under stepgroup; episode 0 turn by turn, as lines: the record Part I opens with). A scripted plan, played through
    the host gate with injected notes off (injection_rate 0): its action ids are the ones a policy would sample and
    store, its old log-probs placeholders 0.0, so the group's PPO loss is the one at ratio 1 (new = old log-probs)."""
    cfg, tok = Config(injection_rate=0.0), make_tokenizer(envs.FLIGHT_ID)
    tails = (["seats F4", "seats F1", "book F1 chen business"], ["book F4 chen business"],
             ["seats F4", "book F4 chen business"])
    plans = (["search PAR ATH", "filter morning"] + tails[j] for j in (0, 1, 2, 0))  # episodes 0 and 3 alike
    episodes = [scripted_episode(*start_episode(cfg, 0, "train", f"worked-{i}", 0, 0, task_id=511821),
                                 lambda _obs, plan=iter(plan): next(plan), tok) for i, plan in enumerate(plans)]
    batch = pack(episodes, tok, cfg.block_size)
    credit = {algo: advantages_for(batch, episodes, None, replace(cfg, algo=algo))[0] for algo in ("grpo", "stepgroup")}
    first, rewards = episodes[0], ", ".join(f"{ep.reward:g}" for ep in episodes)
    seen = [t.observation for t in first.turns] + [" ".join(tok.itos[i] for i in first.final_obs_tokens[1:-1])]
    lines = [f"obs  {seen[0]}"]
    for t, obs in zip(first.turns, seen[1:]):
        lines += [f"act  {t.action_text:<22} ids {str(t.action_tokens):<19} gate {t.gate_reason}  reward {t.reward:g}",
                  f"obs  {obs}"]
    lines += [f"{'terminated' if first.terminated else 'truncated'} after {len(first.turns)} turns, reward "
              f"{first.reward:g}; pack: {int(batch['action_mask'][0].sum())} of its {int(batch['last_pos'][0]) + 1} "
              "tokens are the policy's (action_mask 1)",
              f"its group's rewards [{rewards}] give it grpo's advantage {float(credit['grpo'][0, 0]):+.2f} on every turn"]
    mask, token_adv = batch["action_mask"], broadcast_to_tokens(credit["grpo"], batch["turn_id"])   # (B, T)
    loss, _ = ppo_clip_loss(batch["old_logprobs"], batch["old_logprobs"], token_adv, mask)          # ratio 1
    terms = " ".join(f"{float(credit['grpo'][b, 0]):+.2f}x{int(mask[b].sum())}" for b in range(len(episodes)))
    lines.append(f"the group's PPO loss at ratio 1: -({terms}) / {int(mask.sum())} tokens = {float(loss):.3f}")
    return [[(t.action_text, round(float(credit["grpo"][b, k]), 3), round(float(credit["stepgroup"][b, k]), 3))
             for k, t in enumerate(ep.turns)] for b, ep in enumerate(episodes)], lines


def print_examples(html_path: str | None = None):
    ex = worked_examples()
    print("worked examples (computed by the functions training uses):")
    print("  01 one episode (flight task 511821, episode 0 of the group below), the record Part I opens with:")
    print("\n".join(f"     {line}" for line in ex["episode"]))
    print(f"  02 mask: {ex['mask_sum']} of {ex['mask_tokens']} tokens are in the policy-loss mask")
    print(f"  03 returns, reward 1 at turn 4, gamma 0.9: {ex['returns']}")
    print(f"  03 GRPO, rewards [1, 0, 0, 1], population std: {ex['grpo_advantages']}")
    print("  03 step credit on one flight group (F4 sold out): advantage per turn, grpo -> stepgroup")
    for b, turns in enumerate(ex["step_credit"]):
        print(f"     episode {b}: " + " | ".join(f"{a} {g:+.2f} -> {s:+.2f}" for a, g, s in turns))
    if html_path is not None:
        print(f"wrote {write_examples(html_path, ex)}")
    return ex


# --- Its command: python agentic_rl.py examples [--html [PATH]] ---------------------------------------------------
def add_arguments(command: str, parser):
    parser.add_argument("--html", nargs="?", const="runs/examples.html", default=None,
                        help="also draw them (default runs/examples.html)")


def run(command: str, args, ready):
    print_examples(args.html)
