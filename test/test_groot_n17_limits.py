"""GR00T N1.7 under hostile prompts (issue 22): the byte-level BPE costs O(n log n) in a word's length (it was
quadratic: a 16k-letter word took 14 s), the task has a token budget (cut at a word, reported by fit_task), and
the runner keeps a bounded set of prompt-length buckets, the least recently used evicted. CPU, float32, the
fixture checkpoint."""
import random

import numpy as np
import pytest

from fixture_sets import groot_fixture_dir, load_groot_fixture

GROOT = groot_fixture_dir()
pytestmark = pytest.mark.skipif(not (GROOT / "checkpoint").is_dir(), reason=f"no GR00T N1.7 fixture at {GROOT}")


@pytest.fixture(scope="module")
def policy():
    from phyai_ros.models.groot_n17 import GrootAdapter
    return GrootAdapter.from_files(GROOT / "checkpoint")


def _rescan_bpe(tok, piece: str) -> tuple:
    """The merge rule stated plainly (rescan every pair, merge the lowest rank, leftmost first): the reference."""
    symbols = list(piece)
    while len(symbols) > 1:
        ranked = [(tok.ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in tok.ranks]
        if not ranked:
            break
        _, i = min(ranked)
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    return tuple(tok.vocab[s] for s in symbols)


class _CountingRanks(dict):
    lookups = 0

    def get(self, key, default=None):
        _CountingRanks.lookups += 1
        return super().get(key, default)

    def __contains__(self, key):
        _CountingRanks.lookups += 1
        return super().__contains__(key)

    def __getitem__(self, key):
        _CountingRanks.lookups += 1
        return super().__getitem__(key)


def test_bpe_merges_as_the_rule_says_at_n_log_n_cost(policy):
    tok = policy.processor.tokenizer
    rng = random.Random(0)
    for _ in range(500):
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz etaoinshr") for _ in range(rng.randint(1, 60)))
        for piece in tok._pieces(word):
            assert tok._bpe(piece) == _rescan_bpe(tok, piece), piece
    ranks = tok.ranks
    tok.ranks = _CountingRanks(ranks)
    try:
        cost = {}
        for n in (2000, 8000):
            word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))   # one piece
            _CountingRanks.lookups = 0
            tok.encode(word)
            cost[n] = _CountingRanks.lookups
    finally:
        tok.ranks = ranks
    # 4x the letters: ~4x the merge-table lookups (a rescan per merge made it ~16x: 8000 letters, 10^7 lookups)
    assert cost[8000] < 6 * cost[2000] and cost[8000] < 20 * 8000, cost


def test_a_long_task_is_cut_to_the_token_budget_at_a_word(policy):
    long_task = "pick up the red cup and put it in the sink " * 200
    text, cut = policy.fit_task(long_task)
    assert cut, "a 2000-token task was taken whole"
    from phyai_ros.models.groot_n17.processor import TASK_TOKENS, formalize_language
    short = "Pick up the cup!"
    assert policy.fit_task(short) == (formalize_language(short), False)
    tok = policy.processor.tokenizer
    assert policy.token_budget == TASK_TOKENS
    assert long_task.startswith(text) and long_task[len(text)] == " "   # cut between words
    assert TASK_TOKENS - 12 <= len(tok.encode(text)) <= TASK_TOKENS
    assert policy.processor.language(long_task) == text                  # what the model reads is the cut task
    word = "x" * 16000                                                   # one word past the budget: nothing of it
    assert policy.fit_task("grasp " + word) == ("grasp", True)


def test_the_runner_keeps_a_bounded_set_of_prompt_length_buckets(policy):
    """Tasks of six lengths (six prompt-length buckets) through a runner that keeps three: three stay, and a bucket
    made again after its eviction computes what it computed before."""
    from phyai_ros.runtime.stage_runner import StageRunner
    fx = load_groot_fixture(GROOT)
    images = {k: v[0].numpy() for k, v in fx["images"].items()}
    state = fx["inp"]["raw.observation.state"][0].numpy()
    noise = fx["inp"]["noise"][0]
    runner = policy.runner
    try:
        policy.runner = StageRunner(policy.model, use_graphs=False, max_buckets=3)
        tasks = ["pick " + "up the cup " * i for i in range(6)]
        first = [policy.predict(images, state, t, noise=noise.clone()) for t in tasks]
        assert len(policy.runner.buckets()) == 3 and len({k for k in policy.runner.buckets()}) == 3
        again = policy.predict(images, state, tasks[0], noise=noise.clone())   # evicted, made again
        np.testing.assert_array_equal(again, first[0])
        assert len(policy.runner.buckets()) == 3
    finally:
        policy.runner = runner
    from phyai_ros.runtime.stage_runner import MAX_BUCKETS
    assert MAX_BUCKETS >= 4 and StageRunner(policy.model, max_buckets=5).max_buckets == 5
