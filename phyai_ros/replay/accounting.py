"""Accounting: what became of every input message the replay played into the node.

Each node input (camera, joint state, instruction) ends in exactly one category:

* ``used``       - it was the newest valid message of its topic, young enough, when the node
                   took an inference snapshot (so the chunk was computed from it);
* ``superseded`` - a newer valid message of the same topic arrived before any snapshot took
                   it, while it was still young enough to be used;
* ``stale``      - never used and not replaced in time: it aged past the node's max age while
                   it was the newest (reason ``aged out``), was dropped when the clock jumped
                   back (``clock reset``), or was still the newest, and fresh, when the bag
                   ended (``end of bag``);
* ``rejected``   - the node refuses it (bad image, bad state, missing joint, out-of-order or
                   future stamp, type mismatch) or it cannot be decoded at all (not published);
* ``not_played`` - the replay stopped before reaching it (normally 0).

So per topic: played (= messages in the bag for that topic) = used + superseded + stale +
rejected + not_played, always.  ``used`` counts messages, not snapshots: a message that stayed the
newest of its topic over several snapshots (a 15 Hz camera, a 20 Hz trigger) is one used message
taken by each of them; ``snapshot_uses`` counts the snapshots that took a message of the topic.

How it is attributed.  The node publishes, per chunk, the *oldest* sensor stamp of its
snapshot (``ActionChunk.observation_stamp``) and, per chunk, the latency segments from which
the snapshot time follows exactly (``stamp + L_observe + L_transfer`` of the matching
``ControlMargin``).  The replay knows when it published every message on the same clock.  The
used message of each topic is the newest valid one published at or before the snapshot time
(within the node's max age); the anchor topic's choice is *verified* against the published
observation stamp.  In real time a message published just before the snapshot may not have
reached the node yet, and a node starved of CPU takes its inputs late (its timer runs before the
inputs waiting for it): when the newest-message choice does not explain the observation stamp, the
anchor is looked for among the older messages of each topic still young enough to be used, fewest
messages back first (counted as ``races``, resolved races; in stepped mode, where the replay waits
for the node, never).  What the node's outputs cannot verify: the choice on a non-anchor topic
(its newest message is assumed taken).  Exact per-snapshot attribution would need the node to publish the
stamp of every source in the snapshot.  Predicted rejections are
checked against the node's own counters (from /diagnostics).
"""
from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from phyai_ros.control.clock import NS_PER_S
from phyai_ros.replay.scan import Item, Session

CATEGORIES = ("used", "superseded", "stale", "rejected", "not_played")
# Predicted rejections the node counts itself (counter names of phyai_ros.control.loop).
NODE_COUNTED = ("bad_image", "bad_state", "missing_joint", "out_of_order", "future_stamp")


@dataclass(frozen=True)
class Snapshot:
    """One inference snapshot of the node, reconstructed from its outputs (replay clock, ns)."""

    taken_ns: int
    anchor_ns: int
    chunk_seq: int
    epoch: int = 0
    exact: bool = True   # taken_ns from the matched ControlMargin (else t0 - dt)


@dataclass
class Verdict:
    category: str
    reason: str = ""


@dataclass
class Accounting:
    per_topic: Dict[str, Dict[str, int]]
    reasons: Dict[str, Dict[str, int]]
    verdicts: Dict[int, Verdict]                 # play index -> verdict (node inputs only)
    snapshots: int = 0
    verified: int = 0
    races: int = 0      # snapshots where a message published before had not reached the node
    snapshot_uses: Dict[str, int] = field(default_factory=dict)   # topic -> snapshots that took one of its messages
    unexplained: List[str] = field(default_factory=list)
    rejection_check: Dict[str, Dict[str, Optional[int]]] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def totals(self) -> Dict[str, int]:
        out = Counter()
        for row in self.per_topic.values():
            out.update(row)
        return dict(out)

    def to_dict(self, items: Optional[Sequence[Item]] = None) -> dict:
        d = {"per_topic": self.per_topic, "reasons": self.reasons, "snapshots": self.snapshots,
             "verified": self.verified, "races": self.races, "snapshot_uses": self.snapshot_uses,
             "unexplained": self.unexplained,
             "rejection_check": self.rejection_check, "problems": self.problems, "ok": self.ok}
        if items is not None:
            by_index = {i.index: i for i in items}
            d["not_used"] = [{"index": k, "topic": by_index[k].topic, "category": v.category, "reason": v.reason,
                              "bag_time_ns": by_index[k].log_ns}
                             for k, v in sorted(self.verdicts.items()) if v.category in ("stale", "rejected")]
        return d


def account(session: Session, snapshots: Sequence[Snapshot], *, played: int, end_sim_ns: int,
            end_epoch: int = 0, node_counters: Optional[Dict[str, int]] = None,
            race_window_ns: int = 0) -> Accounting:
    """Classify every node input of ``session``.

    ``played``: how many items (in play order) were played; ``end_sim_ns`` / ``end_epoch``: the
    replay clock at the last played message (the end of the session; what happens in the replay's
    tail after it is not the session's doing); ``node_counters``: the node's counter increments during
    the replay (None: unknown); ``race_window_ns``: publish-to-receive uncertainty (0 in stepped
    mode: no race, every snapshot's messages are the newest published; > 0 in real time, where the node
    may not have taken the newest yet)."""
    node = session.node
    inputs = session.inputs()
    verdicts: Dict[int, Verdict] = {}
    valid: Dict[tuple, List[Item]] = defaultdict(list)  # (topic, epoch) -> valid played items by sim time
    for it in inputs:
        if it.index >= played:
            verdicts[it.index] = Verdict("not_played", "replay stopped before it")
        elif it.verdict != "ok":
            verdicts[it.index] = Verdict("rejected", it.verdict)
        else:
            valid[(it.out_topic, it.epoch)].append(it)
    for lst in valid.values():
        lst.sort(key=lambda i: (i.sim_ns, i.index))
    sims = {k: [i.sim_ns for i in v] for k, v in valid.items()}

    sensor_topics = [c.topic for c in node.cameras] + [node.state_topic]
    used: Dict[int, int] = {}
    uses: Counter = Counter()
    n_verified = n_races = 0
    unexplained: List[str] = []

    def held(topic: str, epoch: int, t: int, back: int = 0) -> Optional[Item]:
        key = (topic, epoch)
        if key not in valid:
            return None
        j = bisect.bisect_right(sims[key], t) - 1 - back
        return valid[key][j] if j >= 0 else None

    def fresh(it: Optional[Item], t: int) -> bool:
        if it is None:
            return False
        age = node.max_age(it.out_topic)
        return age is None or it.stamp_ns is None or t - it.stamp_ns <= age * NS_PER_S

    for snap in snapshots:
        t, e = snap.taken_ns, snap.epoch
        choice: Dict[str, Optional[Item]] = {}
        for topic in sensor_topics + [node.instruction_topic]:
            it = held(topic, e, t)
            choice[topic] = it if it is not None and (topic == node.instruction_topic or fresh(it, t)) else None

        def anchor_of(ch: Dict[str, Optional[Item]]) -> Optional[int]:
            stamps = [it.stamp_ns for tp, it in ch.items()
                      if it is not None and tp != node.instruction_topic and it.stamp_ns is not None]
            return min(stamps) if stamps else None

        if anchor_of(choice) != snap.anchor_ns and race_window_ns > 0:
            # the node had not taken the newest messages: the anchor is an older one, still young enough,
            # of some topic (the one fewest messages back); the other topics keep their newest
            alternatives = []
            for topic in sensor_topics:
                back = 1
                while (prev := held(topic, e, t, back=back)) is not None and fresh(prev, t):
                    if prev.stamp_ns == snap.anchor_ns:
                        alt = {**choice, topic: prev}
                        if anchor_of(alt) == snap.anchor_ns:
                            alternatives.append((back, alt))
                        break
                    back += 1
            if alternatives:
                choice = min(alternatives, key=lambda a: a[0])[1]
                n_races += 1
        if anchor_of(choice) == snap.anchor_ns:
            n_verified += 1
        else:
            unexplained.append(f"chunk {snap.chunk_seq}: observation stamp {snap.anchor_ns} not explained by the "
                               f"messages published before its snapshot at {t}")
        for it in choice.values():
            if it is not None:
                used[it.index] = snap.chunk_seq
                uses[it.topic] += 1

    for (topic, epoch), lst in valid.items():
        age = node.max_age(topic)
        for k, it in enumerate(lst):
            if it.index in used:
                verdicts[it.index] = Verdict("used", f"chunk {used[it.index]}")
                continue
            nxt = lst[k + 1] if k + 1 < len(lst) else None
            limit = None if age is None or it.stamp_ns is None else it.stamp_ns + int(age * NS_PER_S)
            if nxt is not None and (limit is None or nxt.sim_ns <= limit):
                verdicts[it.index] = Verdict("superseded")
            elif nxt is not None:
                verdicts[it.index] = Verdict("stale", "aged out")
            elif epoch < end_epoch:
                verdicts[it.index] = Verdict("stale", "aged out" if limit is not None and _epoch_end(
                    session, epoch) > limit else "clock reset")
            elif limit is not None and end_sim_ns > limit:
                verdicts[it.index] = Verdict("stale", "aged out")
            else:
                verdicts[it.index] = Verdict("stale", "end of bag")

    per_topic: Dict[str, Dict[str, int]] = {}
    reasons: Dict[str, Dict[str, int]] = {}
    for it in inputs:
        v = verdicts[it.index]
        row = per_topic.setdefault(it.topic, {"played": 0, **{c: 0 for c in CATEGORIES}})
        row["played"] += 1
        row[v.category] += 1
        if v.category in ("stale", "rejected", "not_played"):
            r = reasons.setdefault(it.topic, {})
            key = f"{v.category}: {v.reason}"
            r[key] = r.get(key, 0) + 1

    acc = Accounting(per_topic=per_topic, reasons=reasons, verdicts=verdicts, snapshots=len(snapshots),
                     verified=n_verified, races=n_races, snapshot_uses=dict(uses), unexplained=unexplained)
    # totals must add up (by construction; checked anyway)
    for topic, row in per_topic.items():
        if sum(row[c] for c in CATEGORIES) != row["played"]:
            acc.problems.append(f"{topic}: categories do not add up to {row['played']}")
    if unexplained:
        acc.problems.append(f"{len(unexplained)} of {len(snapshots)} chunks have an observation stamp the replayed "
                            "messages do not explain")
    predicted = Counter(it.verdict for it in inputs if it.index < played and it.verdict in NODE_COUNTED)
    for kind in NODE_COUNTED:
        got = None if node_counters is None else int(node_counters.get(kind, 0))
        acc.rejection_check[kind] = {"predicted": predicted.get(kind, 0), "node": got}
        if got is not None and got != predicted.get(kind, 0):
            acc.problems.append(f"node counted {got} {kind}, the replay predicted {predicted.get(kind, 0)}")
    return acc


def _epoch_end(session: Session, epoch: int) -> int:
    """Replay-clock value just before the backward jump that ends ``epoch``."""
    backs = [j for j in session.time_map.jumps if j[2] < j[1]]
    return backs[epoch][1] if epoch < len(backs) else session.end_sim


__all__ = ["Snapshot", "Accounting", "Verdict", "account", "CATEGORIES", "NODE_COUNTED"]
