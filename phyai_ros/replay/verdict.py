"""The report's verdict, as data: its level (OK / WARN / ERROR), the headline and the facts under it, and
the caveat of the replay mode, all from the numbers of ``analysis.analyze``.  ``render`` lays it out.

The order follows docs/design.md §5: overload, deadline misses and watchdog ERRORs lead; the roofline
position is stated as an average next to them.  Every count comes from ``analysis`` (one number per
concept: chunks and counters of the session, margin samples of the same span).  A stepped replay is judged
in simulated time, where inference takes none: its verdict is about the control logic.
"""
from __future__ import annotations

from phyai_ros.replay.analysis import LEVEL_NAMES
from phyai_ros.replay.render import fmt


def verdict(num: dict) -> dict:
    """Headline, level and the facts under it.  The text follows the data: misses and
    silence lead; the roofline is said as measured, with what contradicts it."""
    r, mg, acc = num["roofline"], num["margin"], num.get("accounting")
    lat, cmd, health = num["latency_ms"], num["commands_delivery"], num["health"]
    stepped = num["mode"] == "stepped"
    misses, expired = num["deadline_misses"], num["expired_chunks"]
    horizon_ms = (num["horizon"] or 0) * (num["dt"] or 0) * 1e3
    overloaded = bool(horizon_ms) and lat["inference"]["p50"] >= horizon_ms
    level = mg["level"]
    if misses and level == 0:
        level = 1
    if health["worst_level"] == 2:
        level = 2
    bound_text = {
        "environment-bound": f"environment-bound (X = {fmt(r['X'])} > 1: inference is shorter than a chunk's "
                             "execution on average)",
        "inference-bound": f"inference-bound (X = {fmt(r['X'])} < 1: the robot waits on the model)",
        "balanced": f"balanced (X = {fmt(r['X'])} ~ 1)",
    }.get(r["bound"], "inference-bound (inference is longer than a chunk covers: no chunk cycle to average X "
                      "over)" if overloaded else "not placed on the roofline (fewer than two adopted chunks)")
    chunks = num["chunks"]
    if stepped:
        head = (f"Stepped replay, judged in simulated time: {chunks} chunks, {misses} deadline misses. Inference "
                "takes no simulated time here, so this checks the control logic (triggers, budgets, inputs, "
                "deadline policy), not this machine's speed.")
    elif overloaded:
        head = (f"Overloaded (inference-bound): inference p50 {fmt(lat['inference']['p50'], 0)} ms is longer than "
                f"the {horizon_ms:.0f} ms a chunk covers; {misses} deadline misses, {expired} chunks expired.")
    elif misses:
        head = (f"{misses} deadline misses in {chunks} chunks ({expired} expired); on average {bound_text}, "
                "but not every chunk arrived in time.")
    elif r["bound"] == "environment-bound":
        head = f"Environment-bound: X = {fmt(r['X'])} > 1. Every chunk arrived in time; the loop waits on the robot."
    elif r["bound"] == "inference-bound":
        head = f"Inference-bound: X = {fmt(r['X'])} < 1. The robot waits on the model; faster inference pays off."
    elif r["bound"] == "balanced":
        head = f"Balanced: X = {fmt(r['X'])} ~ 1. Inference and execution take about equally long."
    else:
        head = "Not enough chunk cycles to place this run on the roofline."
    facts = [
        f"Control margin {LEVEL_NAMES[mg['level']]}: P(M_ctrl >= 0) = {fmt(mg['p_hat'], 3)} over n = {mg['n']} margin "
        "samples (the session's chunks that replaced an executing one or expired); "
        + (f"its lower bound {fmt(mg['p_lower'], 3)} ({mg['bound_label']}) meets the target "
           f"{mg['target']:.3f}." if mg["level"] == 0 else f"{mg['why']}."),
        f"Margin p50 {fmt(mg['p50_ms'], 0)} ms, worst {fmt(mg['min_ms'], 0)} ms; inference p50 "
        f"{fmt(lat['inference']['p50'], 1)} ms, p99 {fmt(lat['inference']['p99'], 1)} ms;"
        f" L_critical p99 {fmt(lat['critical']['p99'], 1)} ms.",
        f"Roofline: {bound_text}; Y = {fmt(r['Y'], 3)} of the control time was spent acting (roof "
        f"{fmt(r['Y_roof'], 3)}, sequential {fmt(r['Y_seq'], 3)}), over {r['cycles']} chunk cycles.",
        f"Deadline misses: {misses} (chunks that reached the action timer after the executing chunk ran out), of "
        f"which {expired} expired (never executed); run-outs {num['counters'].get('run_outs', 0)}, "
        f"deadline-policy ticks {num['counters'].get('deadline_policy_ticks', 0)}.",
        f"Commands: {cmd['n']} published; missed slots {num['counters'].get('missed_slots', 0)} (timer ran late); "
        f"delivery delay p50 {fmt(cmd['delay_p50_ms'], 2)} ms, p99 {fmt(cmd['delay_p99_ms'], 2)} ms, max "
        f"{fmt(cmd['delay_max_ms'], 2)} ms; longest silence {fmt(cmd['longest_silence_s'], 2)} s.",
    ]
    if mg["node_errors"]:
        level = 2
        facts.append(f"The node's control-margin status was ERROR in {mg['node_errors']} of {num['margins']} "
                     f"ControlMargin reports, e.g. \"{mg['node_error_example']}\".")
    if health["errors"]:
        facts.append(f"The node's watchdog said ERROR in {health['errors']} of {health['reports']} /diagnostics "
                     f"reports, e.g. \"{health['worst_message']}\".")
    if mg["n"] and mg["min_ms"] < 0:
        if overloaded:
            cause = ("inference itself is longer than the horizon: every chunk is late by construction, whatever "
                     "the tail")
        elif lat["inference"]["p99"] > 1.5 * lat["inference"]["p50"]:
            cause = (f"the latency tail (inference p99 {fmt(lat['inference']['p99'], 0)} ms vs p50 "
                     f"{fmt(lat['inference']['p50'], 0)} ms), not the average, sets the margin")
        else:
            cause = (f"inference p50 {fmt(lat['inference']['p50'], 0)} ms and p99 {fmt(lat['inference']['p99'], 0)}"
                     " ms are close: the average itself is too long for the budget")
        facts.append(f"{misses} chunk(s) missed their deadline, the worst by {-mg['min_ms']:.0f} ms: {cause}.")
    if mg.get("negative_budgets"):
        facts.append(f"B_ctrl < 0 for {mg['negative_budgets']} chunk(s) (down to {fmt(mg['budget_min_ms'] / 1e3, 2)} "
                     "s): their observation was taken after the executing chunk had already run out, so the budget "
                     "was spent before inference began (a run-out was in progress).")
    if acc:
        tot = {c: sum(row[c] for row in acc["per_topic"].values()) for c in
               ("played", "used", "superseded", "stale", "rejected", "not_played")}
        facts.append(f"Inputs: {tot['played']} messages played, all accounted for: {tot['used']} used, "
                     f"{tot['superseded']} superseded, {tot['stale']} stale messages (too old when a snapshot was "
                     f"taken), {tot['rejected']} rejected"
                     + (f", {tot['not_played']} not played" if tot["not_played"] else "")
                     + ("" if acc.get("ok", True) else " - with problems: " + "; ".join(acc.get("problems", []))) + ".")
        facts.append(f"Stale snapshots (triggers refused because an input was missing or too old): "
                     f"{num['counters'].get('stale_snapshots', 0)}.")
        end_of_bag = sum(n for rs in acc.get("reasons", {}).values() for r2, n in rs.items() if r2 == "stale: end of bag")
        if acc.get("ok") is False or tot["rejected"] or tot["stale"] - end_of_bag or tot["not_played"]:
            level = max(level, 1)
    if num.get("margin_sample_misses", misses) != misses:
        level = max(level, 1)
        facts.append(f"The node counted {misses} deadline misses, but {num['margin_sample_misses']} of the session's "
                     "ControlMargin samples are below zero: a margin message was lost or is another node's.")
    shared = [e["detail"] for e in num["events"] if e.get("kind") == "shared_domain"]
    if shared:
        level = max(level, 1)
        facts.append("Not alone on the DDS domain, so the recording may mix in other nodes: " + "; ".join(shared) + ".")
    foreign = sum(n for n in (num.get("foreign_reports") or {}).values())
    if foreign:
        facts.append(f"Judged node {num['node']}: {foreign} /diagnostics reports of other nodes on the DDS domain "
                     "were left out.")
    n_events = len([e for e in num["events"] if e.get("source") != "node"])
    if n_events:
        facts.append(f"{n_events} events in the bag or the replay (listed below).")
    caveat = None
    if stepped:
        caveat = ("Stepped (deterministic) replay: the replay holds /clock while the node infers and the node "
                  "measures its compute on that clock (control.compute_clock: stamp), so inference takes no "
                  "simulated time and every latency, margin and X here is simulated time, the same on every run. "
                  "Replay in real time (--mode realtime) to measure this machine.")
    elif num.get("rate") not in (None, 1, 1.0):
        caveat = (f"Replayed at {num['rate']:g}x real time: the robot's time runs {num['rate']:g}x faster than this "
                  "machine's, so latencies in robot time are scaled by that factor (measured on the monotonic "
                  "clock, converted at the node's measured clock rate).")
    return {"headline": head, "level": level, "facts": facts, "caveat": caveat}


__all__ = ["verdict"]
