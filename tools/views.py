"""What a person looks at: held-out episodes turn by turn (show), an environment played by hand (play), and
the pages: report.html (after every run), compare.html, examples --html.

    python agentic_rl.py show --ckpt runs/.../final.pt [--failures] [--credit stepgroup] [--html]
    python agentic_rl.py play --env AgenticRL/Vault-v0

The pages are self-contained (inline SVG and CSS, no script); every drawn number also sits in a data- attribute,
for tests, and every value read from a file is escaped.
"""
import html
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from agentic_rl import (CUTS, PPO_CREDITS, Config, Episode, Tokenizer, add_config_flags, advantages_for, atomic_write, env_class,
                        holdout_tasks, host_step, load_checkpoint, pack, resolve_device, rollout,
                        start_episode, validate_config, writable_dir)


def held_out_groups(policy, tok, cfg: Config, version: int, part: str, n_groups: int, task_ids=None):
    """Training-style groups on held-out tasks (the part's first n_groups, or task_ids; sampled with a generator of
    their own), judged like evaluate's (no cut from outside the task), and the learner's advantages (None where there
    are none, or no trained critic)."""
    own, cfg = torch.Generator(next(policy.parameters()).device).manual_seed(cfg.eval_seed), replace(cfg, time_limit=0)
    for group, task_id in enumerate(task_ids or holdout_tasks(cfg, part, n_groups)):
        episodes, env_list = rollout(policy, tok, cfg, [cfg.eval_seed] * cfg.group_size, "holdout", greedy=False,
                                     policy_version=version, group_ids=[group] * cfg.group_size,
                                     task_ids=[task_id] * cfg.group_size, generator=own)
        credit = advantages_for(pack(episodes, tok, cfg.block_size), episodes, policy, cfg)[0] \
            if cfg.algo in PPO_CREDITS and not untrained_critic(cfg.algo, cfg.algo, version) else None   # (B, K)
        yield task_id, episodes, env_list, [env_class(cfg.env).evaluate_episode(env) for env in env_list], credit


def untrained_critic(credit: str, trained_by: str, version: int) -> bool:
    """gae and reinforce read the value head, which only their own RL updates train (the warm start trains the logits
    alone): a checkpoint of another route, or of policy_version 0, has an untrained one, whose advantages are noise."""
    return credit in ("gae", "reinforce") and (trained_by not in ("gae", "reinforce") or version == 0)


def show(ckpt: str, n: int = 3, failures: bool = False, device: str = "cpu", part: str = "test", credit: str = "",
         html_path: str | None = None, task: int | None = None):
    """Audit episodes before promotion: held-out groups turn by turn with the learner's advantages (or --credit's);
    [bracketed] tokens are the policy's own (action_mask 1), the rest context. task: that held-out task alone, first
    its greedy episode (what a report card judged, a release gate's refusal names one) then its group. html_path:
    report.html too."""
    if n < 1:
        raise ValueError(f"--n {n}: must be >= 1")
    if html_path:
        writable_dir(Path(html_path).parent, "--html")  # fail now, not after the sampling
    policy, tok, cfg, version = load_checkpoint(ckpt, resolve_device(device))
    if untrained_critic(credit or cfg.algo, cfg.algo, version):
        raise ValueError(f"--credit {credit or cfg.algo}: it reads the value head, and {ckpt} ({cfg.algo}, policy_version "
                         f"{version}) never trained it (the warm start trains the logits alone): its advantages would "
                         "be noise; use --credit grpo or stepgroup, or a gae or reinforce checkpoint after RL")
    cfg, picked, others = replace(cfg, algo=credit or cfg.algo), [], []
    if task is not None and task % 2 != (part == "test"):  # holdout_tasks: dev tasks are even ids, test tasks odd
        raise ValueError(f"--task {task}: a {'test' if task % 2 else 'dev'} task (dev ids are even, test ids odd); "
                         f"pass --part {'test' if task % 2 else 'dev'}")
    if task is not None:  # the greedy episode, as evaluate plays it (version -1: not a training sample)
        (ep,), (env,) = rollout(policy, tok, replace(cfg, time_limit=0), [cfg.eval_seed], "holdout", greedy=True,
                                policy_version=-1, task_ids=[task])
        print_episode(f"{part} task {task}, greedy (as the report card judged it)", ep, tok, None,
                      env_class(cfg.env).evaluate_episode(env), "greedy")
    for task_id, episodes, _, verdicts, credit in held_out_groups(policy, tok, cfg, version, part, 25,
                                                                  None if task is None else [task]):
        for b, (ep, verdict) in enumerate(zip(episodes, verdicts)):
            (picked if verdict.success != failures else others).append(
                (task_id, b, ep, verdict, None if credit is None else credit[b], sum(v.success for v in verdicts)))
        if len(picked) >= n:
            break
    if len(picked) < n:
        print(f"(only {len(picked)} {'failed' if failures else 'successful'} episodes in 25 groups of {part} tasks; "
              f"the rest shown are {'successes' if failures else 'failures'})")
    for task_id, b, ep, verdict, credit, solved in (picked + others)[:n]:
        print_episode(f"{part} task {task_id}, episode {b} of a group of {cfg.group_size} ({solved} solved)", ep, tok,
                      credit, verdict, cfg.algo)
    if html_path is not None:
        print(f"\nwrote {write_run_report(ckpt, None, html_path, (policy, tok, cfg, version))}")


def print_episode(title: str, ep: Episode, tok: Tokenizer, credit, verdict, algo: str):
    """One episode turn by turn: observations, the policy's [tokens], the gate's verdict, reward, advantage."""
    print(f"\n=== {title} | verdict: success={verdict.success} category={verdict.category} side_effects="
          f"{verdict.side_effects} unauthorized={verdict.unauthorized_side_effects} | "
          f"{'terminated' if ep.terminated else 'truncated'}")
    for k, turn in enumerate(ep.turns):
        adv = f"advantage {float(credit[k]):+.3f}" if credit is not None else f"({algo}: no advantage)"
        print(f"  obs  {' '.join(tok.itos[i] for i in turn.obs_tokens)}")
        print(f"  act  {' '.join(f'[{tok.itos[i]}]' for i in turn.action_tokens):<48} gate {turn.gate_reason:<15} "
              f"reward {turn.reward:.1f}  {adv}")
    print(f"  obs  {' '.join(tok.itos[i] for i in ep.final_obs_tokens)}")  # what came after the last action


def write_run_report(ckpt, device, html_path=None, loaded=None) -> Path:
    """report.html for a checkpoint (`loaded`: already loaded, as load_checkpoint returns it): the curves and the
    card and gates if its run's folder holds metrics.jsonl and summary.json, then three held-out episodes."""
    policy, tok, cfg, version = loaded or load_checkpoint(ckpt, torch.device(device))
    run = Path(ckpt).parent
    history = [json.loads(line) for line in open(run / "metrics.jsonl")] if (run / "metrics.jsonl").exists() else None
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else None
    return write_report(html_path or run / "report.html", policy, tok, cfg, version, history, summary)


def play(env_id: str, seed: int = 0, split: str = "train", stream=None):
    """Play an environment yourself through the policy's host gate, a tool call per line (stdin, or a pipe into it)."""
    env, gate, ep, obs = start_episode(validate_config(Config(env=env_id, seed=seed)), seed, split, "play", 0, 0)
    cls = env_class(env_id)
    print(f"{env_id} task {ep.task_id} ({split}); tools: " +
          ", ".join(f"{t} {' '.join('<' + a + '>' for a in args)}".strip() for t, args in cls.tool_schema.items()))
    print(f"obs  {obs}")
    for line in stream or sys.stdin:
        obs, reward, terminated, truncated, _, decision = host_step(env, gate, line.strip())
        print(f"act  {line.strip()}\nobs  {obs}   (gate {decision.reason}, reward {reward}"
              f"{', terminated' if terminated else ''}{', truncated' if truncated else ''})")
        if terminated or truncated:
            verdict = cls.evaluate_episode(env)
            print(f"verdict: success={verdict.success} category={verdict.category} side_effects={verdict.side_effects} "
                  f"unauthorized={verdict.unauthorized_side_effects}")
            return verdict
    print("(input ended before the episode did)")


# --- Pictures: report.html (every run), compare.html, examples --html -----------------------------
# Self-contained pages (inline SVG and CSS, no script): every drawn number also sits in a data- attribute, for tests.
CSS = """body{font:15px/1.5 system-ui,sans-serif;background:#f6f7f9;color:#1d2430;max-width:1260px;margin:0 auto;
padding:20px 28px}h1{font-size:23px;margin:4px 0}h2{font-size:18px;margin:26px 0 6px}.sub,.note{color:#556070}.grid{
display:flex;flex-wrap:wrap;gap:12px}figure,.episode,.cell{background:#fff;border:1px solid #e1e4e8;border-radius:8px}
figure{margin:0;padding:6px 8px}figcaption{font-size:13.5px;font-weight:600}svg text{font-size:11px;fill:#4a5360}.nw{
white-space:nowrap}.key,.scale{display:inline-block;vertical-align:middle}.key{width:14px;height:4px;margin:0 4px 2px
10px}table{border-collapse:collapse;background:#fff;font-size:13.5px}td,th{padding:3px 10px;border-bottom:1px solid
#eceef1;text-align:right}th{background:#eef1f4}td:first-child,th:first-child,tr[data-row] td:nth-child(2){
text-align:left}.pass,.fail{font-weight:700}.pass{color:#1a7f37}.fail{color:#c62828}.episode{padding:8px 12px;
margin:10px 0}.turn{display:flex;flex-wrap:wrap;align-items:center;gap:3px;padding:4px 0;border-top:1px dashed #e3e6ea}
.tok{font:12.5px ui-monospace,Menlo,Consolas,monospace;padding:1px 4px;border-radius:3px}.ctx{color:#5f6b7a;
background:#eef0f3}.act{color:#111;font-weight:700;border:1.5px solid #2b2f36}.act small{font-weight:400;color:#333;
margin-left:3px;font-size:10px}.k{width:26px;color:#8a94a3;font-size:12px}.note{font-size:12.5px;margin-left:8px}.deny{
background:#fde2e1;color:#a11a1a;font-size:12px;padding:1px 6px;border-radius:3px}.scale{width:160px;height:12px;
border:1px solid #bbb;margin:0 6px;background:linear-gradient(90deg,rgb(66,146,198),#fff,rgb(244,109,67))}.cell{
display:inline-block;min-width:170px;margin:3px;padding:4px 8px;border-radius:6px}"""
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")


def esc(x, fmt: str = "") -> str:
    """x escaped as page text, attributes too (a float by fmt): any value the page did not compute, numbers included."""
    return html.escape(format(x, fmt) if isinstance(x, float) else str(x), quote=True)


def write_page(path, flag: str, title: str, *sections) -> Path:
    """One page: the title as its heading, then the sections; `flag` names the path in an error."""
    writable_dir(Path(path).parent, flag)
    text = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title><style>{CSS}"
            f"</style></head><body><h1>{esc(title)}</h1>{''.join(sections)}</body></html>\n")
    atomic_write(path, lambda f: f.write(text.encode()))
    return Path(path)


def adv_colour(a, scale: float) -> str:
    """Blue for a negative advantage, white for zero (or None), orange-red for a positive one (|a| / scale = depth)."""
    t = max(-1.0, min(1.0, (a or 0.0) / scale))
    end = (244, 109, 67) if t > 0 else (66, 146, 198)
    return "rgb(" + ",".join(str(round(255 + abs(t) * (c - 255))) for c in end) + ")"


def line_chart(title: str, y_label: str, series, y_range=None, x_label: str = "iteration", W: int = 372) -> str:
    """One chart; series = [(name, key, [(x, y, lo, hi), ...])], lo/hi (or None) the spread drawn as a band.
    Each point is a circle with a tooltip and its exact numbers in data-x, data-y (data-lo, data-hi)."""
    series = [s for s in series if s[2]]                     # a monitor the route did not measure: no line
    pts = [p for _, _, ps in series for p in ps]
    if not pts:
        return ""
    ys = [v for p in pts for v in p[1:] if v is not None]
    lo, hi = y_range or (min(ys), max(ys))
    lo, hi = (lo, hi) if hi - lo > 1e-12 else (lo - max(abs(lo) * 0.1, 1e-3), hi + max(abs(hi) * 0.1, 1e-3))
    x0 = min(p[0] for p in pts)
    x1 = max(x0 + 1, max(p[0] for p in pts))
    H, L, R, T, B = 226, 60, 12, 22, 38
    X = lambda x: round(L + (x - x0) / (x1 - x0) * (W - L - R), 1)
    Y = lambda y: round(T + (hi - y) / (hi - lo) * (H - T - B), 1)
    out = [f"<rect x='{L}' y='{T}' width='{W - L - R}' height='{H - T - B}' fill='#fbfcfd' stroke='#cfd4da'/>"]
    out += [f"<line x1='{L}' x2='{W - R}' y1='{Y(v)}' y2='{Y(v)}' stroke='#e6e9ed'/>"
            f"<text x='{L - 4}' y='{Y(v) + 4}' text-anchor='end'>{v:.3g}</text>" for v in (lo, (lo + hi) / 2, hi)]
    out += [f"<text x='{X(x)}' y='{H - B + 14}' text-anchor='middle'>{x}</text>"
            for x in sorted({x0, (x0 + x1) // 2, x1})]
    out.append(f"<text x='{(L + W - R) / 2}' y='{H - 4}' text-anchor='middle'>{esc(x_label)}</text>"
               f"<text x='4' y='12'>{esc(y_label)}</text>")
    keys = ""  # the legend, unless the only line is named as its axis
    for i, (name, key, ps) in enumerate(series):
        c = PALETTE[i % len(PALETTE)]
        keys += f"<span class='nw'><span class='key' style='background:{c}'></span>{esc(name)}</span>"
        band = [p for p in ps if p[2] is not None]
        if band:
            edge = [f"{X(p[0])},{Y(p[3])}" for p in band] + [f"{X(p[0])},{Y(p[2])}" for p in reversed(band)]
            out.append(f"<polygon points='{' '.join(edge)}' fill='{c}' fill-opacity='0.15'/>")
        out.append(f"<g data-key='{esc(key)}'><polyline fill='none' stroke='{c}' stroke-width='1.8' points='"
                   + " ".join(f"{X(p[0])},{Y(p[1])}" for p in ps) + "'/>")
        for x, y, a, b in ps:
            spread = "" if a is None else f" data-lo='{a!r}' data-hi='{b!r}'"
            tip = f"{name}, {x_label} {x}: {y:.4g}" + ("" if a is None else f" (seeds {a:.4g} to {b:.4g})")
            out.append(f"<circle cx='{X(x)}' cy='{Y(y)}' r='2.6' fill='{c}' data-x='{x}' data-y='{y!r}'{spread}>"
                       f"<title>{esc(tip)}</title></circle>")
        out.append("</g>")
    keys = keys if len(series) > 1 or series[0][0] != y_label else ""
    return (f"<figure style='width:{W}px'><figcaption>{esc(title)}{keys}</figcaption>"
            f"<svg width='{W}' height='{H}' viewBox='0 0 {W} {H}' role='img'>{''.join(out)}</svg></figure>")


def curves_html(history: list) -> str:
    """The monitors of metrics.jsonl, one chart each (those the route measured), success and cuts first."""
    monitors = {"clip_frac": "PPO clip fraction", "approx_kl": "approx KL to the sampling policy",
                "entropy": "entropy of the policy's tokens", "zero_std_groups": "groups with no signal (all-equal rewards)",
                "explained_variance": "critic: explained variance", "kl_ref": "k3 KL to the warm start",
                "kept": "rs_sft: verified episodes kept", "dpo_loss": "dpo loss"}
    for n, m in enumerate(history, 1):  # an edited file: cut counts, monitors, iteration must be numbers (JSON's true isn't)
        drawn = m.get("truncated_by", {}) | {k: m[k] for k in ("success", "dev_success", *monitors) if m.get(k) is not None}
        for key, value in {**drawn, "iteration": m.get("iteration")}.items():
            if type(value) not in (int, float):
                raise ValueError(f"metrics.jsonl line {n}: {key} is {value!r}, not a number; restore it or move it away")
    series = lambda key: [(m["iteration"], m[key], None, None) for m in history if m.get(key) is not None]
    cuts = [c for c in CUTS if any(c in m["truncated_by"] for m in history)]
    charts = [line_chart("success per iteration", "success", [("training (sampled)", "success", series("success")),
                         ("dev (greedy)", "dev_success", series("dev_success"))], (0.0, 1.0))]
    charts.append(line_chart("episodes truncated, by cut", "episodes", [(c, f"truncated_by.{c}", [
        (m["iteration"], m["truncated_by"].get(c, 0), None, None) for m in history]) for c in cuts] or
        [("no cut", "truncated_by", [(m["iteration"], 0, None, None) for m in history])]))
    charts += [line_chart(title, key, [(key, key, series(key))]) for key, title in monitors.items()]
    return f"<h2>Learning curves</h2><div class='grid'>{''.join(charts)}</div>"


def report_card_rows(columns: dict) -> list:
    """(group, key, label, each column's value as printed) per report-card line, for the terminal and report.html."""
    first = next(iter(columns.values()))
    k = sum(key.startswith("pass^") for key in first)
    labels = {"success": f"success (greedy, {first['episodes']})", f"pass^{k}": f"pass^{k} ({k} sampled each)"}
    rows = [("outcome", "success"), ("", "ci95"), ("", f"pass^{k}")] + [("category", c) for c in first["categories"]]
    rows += [("safety", key) for key in ("safety_denials", *(f"denied by {r}" for r in first.get("denied_tasks", {})),
                                         "unauthorized_side_effects", "repeated_side_effects", "injection_follow_attempts")]
    rows += [("efficiency", key) for key in ("mean_turns", "truncation_rate", "invalid_action_rate", "tokens_per_episode",
                                             "tool_calls_per_episode", "credits_per_episode", "credits_per_success")]

    def value(report, key):
        if key.startswith("denied by "):  # tasks on which that safety rule denied a call (an edited file: as it is)
            tasks = report["denied_tasks"][key[len("denied by "):]]
            return str(sum(tasks) if all(type(t) is int for t in tasks) else tasks)
        v = report.get(key, report["efficiency"].get(key, report["categories"].get(key, {}).get("success")))
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    return [(group, key, labels.get(key, key), [value(r, key) for r in columns.values()]) for group, key in rows]


def print_verdict(summary: dict):
    """A finished run's report cards (dev and test, incumbent and candidate), its release gates and its verdict, as
    summary.json holds them; a safety gate that refused names a task, and the command that shows it."""
    cards = summary["reports"]
    columns = {f"{who} {part}": cards[who][part] for part in ("dev", "test") for who in ("incumbent", "candidate")}
    print("\n" + f"{'report card':<36}" + "".join(f"{name:>22}" for name in columns))
    for group, _, label, values in report_card_rows(columns):  # one row per report-card line
        print(f"{group:<11}{label:<25}" + "".join(f"{v:>22}" for v in values))
    print("\nrelease gates (decided on dev; test is reported only):")
    for g in summary["release_gates"]:
        print(f"  {'pass' if g['passed'] else 'FAIL'}  {g['gate']:<34} {str(g['value']):<44} rule {g['rule']}")
    print(f"promotion: {'PROMOTED' if summary['promoted'] else 'REJECTED, rolled back to the incumbent'} "
          f"({summary['promotion_reason']})")
    for g in (g for g in summary["release_gates"] if not g["passed"] and g.get("task") is not None):
        print(f"  inspect {g['gate']}: python agentic_rl.py show --ckpt "
              f"{Path(summary['config']['run_dir']) / 'candidate.pt'} --part dev --task {g['task']}")


def table(header, rows, attrs) -> str:
    return ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>" + "".join(
        f"<tr{a}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row, a in zip(rows, attrs)) + "</table>")


def gates_html(summary: dict) -> str:
    """The report card (the terminal's own rows) and every release gate: observed value, limit, verdict."""
    r, gates = summary["reports"], summary["release_gates"]
    cols = {f"{who} {part}": r[who][part] for part in ("dev", "test") for who in ("incumbent", "candidate")}
    rows = report_card_rows(cols)
    card = table(["report card", ""] + list(cols), [[esc(x) for x in (g, label, *vals)] for g, _, label, vals in rows],
                 [f" data-row='{esc(k)}'" for _, k, _, _ in rows])
    num = lambda x: "&ndash;" if x is None else esc(x, ".4g")
    checks = table(["release gate", "value", "rule", "observed", "limit", "verdict"],
                   [[esc(g["gate"]), esc(g["value"]), esc(g["rule"]), num(g["observed"]), num(g["limit"]),
                     "<span class='pass'>pass</span>" if g["passed"] else "<span class='fail'>FAIL</span>"]
                    for g in gates], [f" data-gate='{esc(g['gate'])}'" for g in gates])
    verdict = "PROMOTED" if summary["promoted"] else "REJECTED, rolled back to the incumbent"
    return (f"<h2>Report card and release gates</h2><div class='grid'>{card}{checks}</div>"
            f"<p><b>promotion: {verdict}</b> <span class='sub'>({esc(summary['promotion_reason'])})</span></p>")


def episode_html(ep: Episode, tok: Tokenizer, adv, scale: float, max_turns: int, caption: str) -> str:
    """One episode token by token, a line per turn: context grey, the policy's tokens boxed on the turn's advantage."""
    def span(i: int, cls: str = "ctx", tip: str = "", attrs: str = "", after: str = "") -> str:
        word = esc(tok.itos[i])
        return f"<span class='tok {cls}' data-id='{i}' title='{esc(tip) or word}'{attrs}>{word}{after}</span>"
    lines = []
    for k, t in enumerate(ep.turns):
        a = None if adv is None else float(adv[k])
        acts = "".join(span(i, "act", f"policy token {tok.itos[i]} | old log-prob {lp:.4f} | turn {k}, {max_turns - k}"
                            f" turns left | advantage {'-' if a is None else f'{a:+.3f}'}", f" style='background:"
                            f"{adv_colour(a, scale)}' data-logp='{lp!r}' data-adv='{a!r}'", f"<small>{lp:.2f}</small>")
                       for i, lp in zip(t.action_tokens, t.action_logprobs))
        gate = "" if t.gate_allowed else f"<span class='deny'>gate denied: {esc(t.gate_reason)}</span>"
        lines.append(f"<div class='turn'><span class='k'>t{k}</span>{''.join(map(span, t.obs_tokens))}{acts}{gate}"
                     f"<span class='note'>{max_turns - k} left, reward {t.reward:g}"
                     + ("" if a is None else f", advantage {a:+.2f}") + "</span></div>")
    end = esc("terminated" if ep.terminated else f"truncated by {ep.truncated_by}")
    lines.append(f"<div class='turn'><span class='k'>end</span>{''.join(map(span, ep.final_obs_tokens))}"
                 f"<span class='note'><b>{end}</b>, return {ep.reward:g}</span></div>")
    return f"<div class='episode' data-ending='{end}'><b>{esc(caption)}</b>{''.join(lines)}</div>"


def episodes_html(policy, tok, cfg: Config, version: int, part: str = "test") -> str:
    """Three episodes of a held-out group, with a success and a failure if one of the first five groups has both."""
    groups = list(held_out_groups(policy, tok, cfg, version, part, 5))
    task_id, episodes, env_list, verdicts, credit = next(
        (g for g in groups if len({v.success for v in g[3]}) == 2), groups[0])
    first = [b for b, v in enumerate(verdicts) if v.success][:1] + [b for b, v in enumerate(verdicts) if not v.success][:1]
    order = (first + [b for b in range(len(episodes)) if b not in first])[:3]
    scale = max([abs(float(credit[b, k])) for b in order for k in range(len(episodes[b].turns))] + [1e-6]) \
        if credit is not None else 1.0
    legend = (f"<p class='sub'><span class='tok ctx'>context</span> prompt, observations and gate messages "
              f"(mask 0) &nbsp; <span class='tok act'>policy<small>-0.05</small></span> the policy's own tokens (mask 1) "
              f"with their old log-prob<br>each turn's advantage under {esc(cfg.algo)}: {-scale:+.2f}<span class='scale'></span>"
              f"{scale:+.2f}" + ("" if credit is not None else f" ({esc(cfg.algo)}: no advantage" +
                                 (", its value head was never trained)" if cfg.algo in PPO_CREDITS else ")")) + "</p>")
    return (f"<h2>Three episodes of the deployed policy</h2><p class='sub'>{part} task {task_id}, a group of "
            f"{esc(cfg.group_size)} sampled episodes ({sum(v.success for v in verdicts)} solved), temperature 1</p>" + legend
            + "".join(episode_html(episodes[b], tok, None if credit is None else credit[b], scale,
                                   env_list[b].unwrapped.max_turns, f"episode {b}: success={verdicts[b].success}, "
                                   f"category {verdicts[b].category}") for b in order))


def write_report(path, policy, tok, cfg: Config, version: int, history=None, summary=None) -> Path:
    """report.html: curves (metrics.jsonl), report card and gates (summary.json), three episodes."""
    head = f"<p class='sub'>{' &middot; '.join(map(esc, (cfg.env, cfg.algo, f'seed {cfg.seed}', f'run {cfg.run_dir}')))}</p>"
    try:  # the records as the files hold them (show --html reads them back): escaped, numbers too
        if summary:
            head += (f"<p>deployed: <b>{esc(summary['deployed']['is'])}</b>, test success <b>"
                     f"{esc(summary['deployed']['test_success'], '.3f')}</b> (warm start "
                     f"{esc(summary['warm_start']['test_success'], '.3f')}), {esc(summary['wall_seconds'])} s</p>")
        records = (curves_html(history) if history else "", gates_html(summary) if summary else "")
    except (KeyError, TypeError) as e:  # a file edited by hand: a field missing or of the wrong kind
        raise ValueError(f"summary.json or metrics.jsonl lacks or mangles {e}; restore or move it") from None
    return write_page(path, "--html", f"agentic-rl report: {cfg.env} {cfg.algo} seed {cfg.seed}", head, *records,
                      episodes_html(policy, tok, cfg, version))


def write_compare(path, result: dict) -> Path:
    """compare.html: each route's training success per iteration (mean over seeds, min-max band); the test table."""
    curves = [(route, route, [(x, float(np.mean(col)), float(np.min(col)), float(np.max(col)))
                              for x, col in enumerate(zip(*r["curves"]))]) for route, r in result["routes"].items()
              if route != "warm start"]
    chart = line_chart(f"training success per iteration, mean and spread over seeds {result['seeds']}", "success",
                       curves, (0.0, 1.0), W=640)
    rows = [[esc(route), *(esc(r[key], ".3f") for key in ("test_success_mean", "min", "max", "pass^k_mean")),
             " ".join(esc(s["success"], ".3f") for s in r["per_seed"]),
             " ".join("-" if s["first_at_0.9"] is None else esc(s["first_at_0.9"]) for s in r["per_seed"]),
             esc(r["wall_seconds_mean"], ".1f")] for route, r in result["routes"].items()]
    test = table(["route", "mean", "min", "max", f"pass^{result['config']['pass_k']} mean", "per seed",
                  "first >= 0.9 at", "wall s"], rows, [f" data-route='{esc(route)}'" for route in result["routes"]])
    head = (f"<p class='sub'>every route: {esc(result['iterations'])} iterations x {esc(result['episodes_per_iteration'])} "
            f"episodes from the same warm start per seed; test: {esc(result['eval_episodes'])} held-out tasks</p>")
    return write_page(path, "--out", f"agentic-rl compare: {result['env']}", head,
                      f"<div class='grid'>{chart}</div><h2>Held-out test success</h2>", test)


def write_examples(path, ex: dict) -> Path:
    """examples --html: the 180-token episode's mask; the flight group's advantage per turn, grpo and stepgroup."""
    cells = "".join(f"<rect x='{(i % 45) * 13}' y='{(i // 45) * 16}' width='11' height='13' rx='2' data-mask='{m}' "
                    f"fill='{'#f46d43' if m else '#dfe3e8'}'/>" for i, m in enumerate(ex["mask"]))
    scale = max(abs(x) for ep in ex["step_credit"] for _, g, s in ep for x in (g, s))
    chip = lambda algo, a: (f"<span class='tok act' data-algo='{algo}' data-adv='{a!r}' style='background:"
                            f"{adv_colour(a, scale)}'>{algo} {a:+.2f}</span>")
    group = "".join(f"<div class='episode'><b>episode {b}</b><br>" + "".join(
        f"<span class='cell'>t{k} <code>{esc(act)}</code><br>{chip('grpo', g)} {chip('stepgroup', s)}</span>"
        for k, (act, g, s) in enumerate(ep)) + "</div>" for b, ep in enumerate(ex["step_credit"]))
    mask = (f"<h2>02 mask: {ex['mask_sum']} of {ex['mask_tokens']} tokens are the policy's</h2><p class='sub'>"
            f"<span class='tok act' style='background:#f46d43'>policy</span> action tokens (in the loss) &nbsp; "
            f"<span class='tok ctx'>context</span> task and tool observations; a row per turn</p>"
            f"<svg width='{45 * 13}' height='{16 * math.ceil(len(ex['mask']) / 45)}'>{cells}</svg>")
    credit = (f"<h2>03 credit on one flight group (F4 sold out)</h2><p class='sub'>returns, reward 1 at turn 4, gamma "
              f"0.9: {ex['returns']}; GRPO on rewards [1, 0, 0, 1]: {ex['grpo_advantages']}. Below, per turn: grpo "
              f"gives every turn its episode's number; stepgroup adds the comparison of turns taken in the same state. "
              f"{-scale:+.2f}<span class='scale'></span>{scale:+.2f}</p>")
    return write_page(path, "--html", "agentic-rl: the chapter's worked examples", mask, credit, group)


# --- Their commands: python agentic_rl.py show --ckpt PATH ..., play --env ENV ... -------------------------------
def add_arguments(command: str, parser):
    if command == "play":
        add_config_flags(parser, only=("env", "seed"))
        parser.add_argument("--split", default="train", choices=("train", "holdout"))
        return
    parser.add_argument("--ckpt", required=True, help="path to a .pt written by train")
    parser.add_argument("--n", type=int, default=3, help="how many episodes (default 3)")
    parser.add_argument("--failures", action="store_true", help="show failed episodes instead of successful ones")
    parser.add_argument("--credit", default="", choices=("",) + PPO_CREDITS, help="the advantages of another credit "
                        "on the same episodes (gae and reinforce read the checkpoint's value head)")
    parser.add_argument("--html", nargs="?", const="", default=None, help="also write report.html (default: beside it)")
    parser.add_argument("--part", default="test", choices=("dev", "test"), help="held-out part (default: test)")
    parser.add_argument("--task", type=int, default=None, help="this held-out task alone (a release gate names one): "
                        "its greedy episode, then its group")
    add_config_flags(parser, only=("device",))


def run(command: str, args, ready):
    if command == "play":
        play(args.env, args.seed, args.split)
    else:
        show(args.ckpt, args.n, args.failures, args.device, args.part, args.credit, args.html, args.task)
