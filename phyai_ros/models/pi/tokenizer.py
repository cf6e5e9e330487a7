"""SentencePiece prompt tokenizer with the pi-family conventions.

Why: LeRobot tokenizes with the PaliGemma tokenizer: BOS prepended, no EOS, truncated to the token budget
(the tail is cut, BOS kept), right-padded with id 0, mask True on real tokens. `SentencePieceProcessor`
with add_bos reproduces its ids exactly, without depending on transformers. LeRobot's cut would drop the
end of the prompt, which for pi0.5 is the state; `fit` cuts the task instead (see there).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np


class PromptTokenizer:
    def __init__(self, model_path, max_length: int):
        import sentencepiece as spm
        p = Path(model_path)
        if not p.is_file():
            raise FileNotFoundError(f"tokenizer model not found: {p}")
        if p.stat().st_size == 0:
            raise ValueError(f"tokenizer model {p} is empty")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(p))
        except (RuntimeError, OSError) as exc:  # SentencePiece's own words rarely name the file
            raise ValueError(f"tokenizer model {p}: not a SentencePiece model, corrupt or truncated ({exc})") from None
        self.max_length = int(max_length)
        self.pad_id = 0

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, prompt: str) -> Tuple[List[int], bool]:
        """ids (BOS + prompt, cut to max_length) and whether it was truncated."""
        ids = self.sp.encode(prompt, add_bos=True)
        return ids[: self.max_length], len(ids) > self.max_length

    def fit(self, head: str, task: str, tail: str) -> Tuple[str, bool]:
        """The task to put between ``head`` and ``tail`` so that the prompt fits ``max_length``, and whether it
        had to be cut. A prompt that fits is left exactly as it is (token parity with LeRobot); otherwise the
        task keeps its longest token prefix that fits, so the template around it (pi0.5: the state and
        "Action:") is never cut. ValueError when head and tail alone exceed the budget."""
        if len(self.sp.encode(head + task + tail, add_bos=True)) <= self.max_length:
            return task, False
        ids = self.sp.encode(task)[: self.max_length]

        def prefix(k: int) -> str:  # a cut inside a multi-byte character decodes to U+FFFD: drop it
            return self.sp.decode(ids[:k]).rstrip("\ufffd")

        def fits(k: int) -> bool:
            return len(self.sp.encode(head + prefix(k) + tail, add_bos=True)) <= self.max_length

        if not fits(0):
            raise ValueError(f"the prompt without its task ({head!r} + {tail!r}) needs more than the "
                             f"{self.max_length}-token budget")
        lo, hi = 0, len(ids)  # fits(lo) holds; binary search for the longest prefix that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return prefix(lo), True

    def batch(self, prompts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        """-> tokens int64 [B, max_length] (right-padded with 0), masks bool [B, max_length]."""
        tokens = np.full((len(prompts), self.max_length), self.pad_id, dtype=np.int64)
        masks = np.zeros((len(prompts), self.max_length), dtype=bool)
        for i, prompt in enumerate(prompts):
            ids, _ = self.encode(prompt)
            tokens[i, : len(ids)] = ids
            masks[i, : len(ids)] = True
        return tokens, masks
