"""Byte-level BPE tokenizer reading a Hugging Face `tokenizer.json` (Qwen2 / Qwen3-VL layout, or a bare GPT-2
style ByteLevel pre-tokenizer).

Why our own: the backbone's tokenizer is a plain byte-level BPE (NFC normalizer, one regex split, GPT-2 byte
mapping, ranked merges, special tokens matched verbatim), and reading it here keeps the `tokenizers` package
(and the hub client it pulls in) off the robot. Only what Qwen's tokenizer.json uses is supported; anything
else is refused at load time, naming the file, rather than tokenized differently.

Python's `re` has no `\\p{L}` / `\\p{N}`: the split pattern's Unicode classes are expanded into explicit
code-point ranges from `unicodedata` once per process.
"""
from __future__ import annotations

import functools
import heapq
import json
import re
import sys
import unicodedata
from pathlib import Path
from typing import Dict, Iterator, List, Tuple


class TokenizerError(ValueError):
    """tokenizer.json uses a feature this reader does not implement, or is malformed."""


@functools.lru_cache(maxsize=None)
def _unicode_class(letter: str) -> str:
    """Code-point ranges (regex class body, no brackets) of every character whose category starts with
    `letter` ('L' letters, 'N' numbers)."""
    ranges, start, prev = [], None, None
    for cp in range(sys.maxunicode + 1):
        hit = unicodedata.category(chr(cp))[0] == letter
        if hit and start is None:
            start = cp
        if not hit and start is not None:
            ranges.append((start, prev))
            start = None
        prev = cp
    if start is not None:
        ranges.append((start, prev))
    esc = lambda c: "\\U%08x" % c  # noqa: E731
    return "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}" for a, b in ranges)


def expand_unicode_classes(pattern: str) -> str:
    """Rewrite `\\p{L}` / `\\p{N}` into explicit ranges (bare inside [...], bracketed outside)."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        if pattern.startswith("\\p{", i):
            end = pattern.index("}", i)
            name = pattern[i + 3:end]
            if name not in ("L", "N"):
                raise TokenizerError(f"unsupported Unicode class \\p{{{name}}} in the split pattern")
            body = _unicode_class(name)
            out.append(body if in_class else f"[{body}]")
            i = end + 1
            continue
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# The split of a bare ByteLevel pre-tokenizer with use_regex (GPT-2's, as the tokenizers package has it).
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


MAX_ID = 2**31 - 1   # token ids (an embedding row each)


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID


def _require(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise TokenizerError(f"{path}: unsupported tokenizer.json ({what})")


class ByteLevelBPE:
    """encode(text) -> ids exactly as `tokenizers.Tokenizer.from_file(path).encode(text,
    add_special_tokens=False)` for Qwen's byte-level BPE tokenizers."""

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {self.path}")
        try:
            spec = json.loads(self.path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokenizerError(f"{self.path}: not valid JSON ({exc})") from None
        try:
            self._load(spec)
        except TokenizerError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError, IndexError, re.error) as exc:
            # a field missing or of the wrong type anywhere in the spec: one error naming the file
            raise TokenizerError(f"{self.path}: malformed tokenizer.json ({type(exc).__name__}: {exc})"[:500]) from None

    def _load(self, spec) -> None:
        _require(isinstance(spec, dict), self.path, f"a JSON {type(spec).__name__}, not an object")
        model = spec.get("model") or {}
        _require(model.get("type") == "BPE", self.path, f"model type {model.get('type')!r}, BPE expected")
        _require(not model.get("byte_fallback") and not model.get("continuing_subword_prefix")
                 and not model.get("end_of_word_suffix"), self.path, "BPE options other than byte-level")
        self.vocab: Dict[str, int] = dict(model["vocab"])
        _require(all(isinstance(k, str) and _is_id(v) for k, v in self.vocab.items()), self.path,
                 f"model.vocab must map strings to ids in [0, {MAX_ID}]")
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        _require(all(len(m) == 2 and all(isinstance(p, str) for p in m) for m in merges), self.path,
                 "model.merges must be 'a b' strings or [a, b] pairs")
        self.ranks: Dict[Tuple[str, str], int] = {m: r for r, m in enumerate(merges)}
        self.special: Dict[str, int] = {t["content"]: t["id"] for t in spec.get("added_tokens") or []}
        _require(all(isinstance(k, str) and k and _is_id(v) for k, v in self.special.items()), self.path,
                 f"added_tokens must have a non-empty 'content' and an 'id' in [0, {MAX_ID}]")
        self.vocab_size = max([*self.vocab.values(), *self.special.values()]) + 1
        self.nfc = self._normalizer(spec.get("normalizer"))
        self.split = re.compile(self._split_pattern(spec.get("pre_tokenizer")))
        alternation = "|".join(re.escape(t) for t in sorted(self.special, key=len, reverse=True))
        self.special_re = re.compile(f"({alternation})") if self.special else None
        self.bytes_map = byte_to_unicode()

    def _normalizer(self, spec) -> bool:
        _require(spec is None or spec.get("type") == "NFC", self.path, f"normalizer {spec}")
        return spec is not None

    def _split_pattern(self, spec) -> str:
        if spec is not None and spec.get("type") == "ByteLevel":   # GPT-2 style: the byte level's own regex
            _require(not spec.get("add_prefix_space") and spec.get("use_regex", True), self.path,
                     "a ByteLevel pre_tokenizer with a prefix space or without its regex")
            return expand_unicode_classes(GPT2_SPLIT)
        _require(spec is not None and spec.get("type") == "Sequence", self.path,
                 "pre_tokenizer must be a Sequence or ByteLevel")
        steps = spec["pretokenizers"]
        _require(len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel",
                 self.path, "pre_tokenizer must be Split(regex) + ByteLevel")
        split, byte_level = steps
        _require(split.get("behavior") == "Isolated" and not split.get("invert") and "Regex" in split["pattern"],
                 self.path, "Split must be an isolated regex")
        _require(not byte_level.get("add_prefix_space") and not byte_level.get("use_regex"), self.path,
                 "ByteLevel with its own prefix space / regex")
        return expand_unicode_classes(split["pattern"]["Regex"])

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str) -> List[int]:
        ids: List[int] = []
        parts = self.special_re.split(text) if self.special_re else [text]
        for part in parts:
            if not part:
                continue
            if part in self.special:
                ids.append(self.special[part])
                continue
            if self.nfc:
                part = unicodedata.normalize("NFC", part)
            for piece in self._pieces(part):
                ids.extend(self._bpe(piece))
        return ids

    def _spans(self, text: str) -> Iterator[Tuple[int, int]]:
        """Isolated regex split: (start, end) of the matches and of the gaps between them."""
        pos = 0
        for m in self.split.finditer(text):
            if m.start() > pos:
                yield pos, m.start()
            if m.end() > m.start():
                yield m.start(), m.end()
            pos = m.end()
        if pos < len(text):
            yield pos, len(text)

    def _bytes(self, piece: str) -> str:
        return "".join(self.bytes_map[b] for b in piece.encode("utf-8"))

    def _pieces(self, text: str) -> List[str]:
        """The split's pieces, each mapped to byte-level characters."""
        return [self._bytes(text[a:b]) for a, b in self._spans(text)]

    def cut_to(self, text: str, budget: int) -> Tuple[str, bool]:
        """(``text`` up to the end of its last piece whose tokens still fit ``budget``, whether anything was cut).
        Tokenising stops at the first piece beyond the budget, so a long text costs only what fits. For plain text
        (no special tokens); NFC-normalized first, as ``encode`` does."""
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        used = 0
        for a, b in self._spans(text):
            used += len(self._bpe(self._bytes(text[a:b])))
            if used > budget:
                return text[:a], True
        return text, False

    @functools.lru_cache(maxsize=65536)
    def _bpe(self, piece: str) -> Tuple[int, ...]:
        """Merge the lowest-ranked adjacent pair (leftmost first) until none is in the merge table.

        The symbols are a linked list and the candidate pairs a heap keyed (rank, position), so a piece of n
        characters costs O(n log n): rescanning every pair after each merge was quadratic (a 16k-letter word took
        14 s). A heap entry whose pair has changed since it was pushed is stale and skipped (a pair's rank is
        unique, so an unchanged rank means an unchanged pair); positions keep the list's order, so the merge order
        is the rescan's: lowest rank, leftmost first."""
        symbols = list(piece)
        n = len(symbols)
        if n > 1:
            nxt, prv, alive = list(range(1, n + 1)), list(range(-1, n - 1)), [True] * n
            rank = self.ranks.get
            heap = [(r, i) for i in range(n - 1) if (r := rank((symbols[i], symbols[i + 1]), -1)) >= 0]
            heapq.heapify(heap)
            while heap:
                r, i = heapq.heappop(heap)
                j = nxt[i]
                if not alive[i] or j >= n or rank((symbols[i], symbols[j]), -1) != r:
                    continue
                symbols[i] += symbols[j]
                alive[j] = False
                nxt[i] = nxt[j]
                if nxt[i] < n:
                    prv[nxt[i]] = i
                    if (r2 := rank((symbols[i], symbols[nxt[i]]), -1)) >= 0:
                        heapq.heappush(heap, (r2, i))
                if prv[i] >= 0 and (r2 := rank((symbols[prv[i]], symbols[i]), -1)) >= 0:
                    heapq.heappush(heap, (r2, prv[i]))
            symbols = [sym for sym, live in zip(symbols, alive) if live]
        try:
            return tuple(self.vocab[s] for s in symbols)
        except KeyError as exc:
            raise TokenizerError(f"{self.path}: piece {exc} of {piece!r} is not in the vocabulary") from None

    def token_id(self, token: str) -> int:
        if token in self.special:
            return self.special[token]
        if token in self.vocab:
            return self.vocab[token]
        raise TokenizerError(f"{self.path}: no token {token!r}")
