"""SentencePiece prompt tokenizer with the pi-family conventions.

Why: LeRobot tokenizes with the PaliGemma tokenizer: BOS prepended, no EOS, truncated to the token budget
(the tail is cut, BOS kept), right-padded with id 0, mask True on real tokens. `SentencePieceProcessor`
with add_bos reproduces its ids exactly, without depending on transformers.
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
        self.sp = spm.SentencePieceProcessor(model_file=str(p))
        self.max_length = int(max_length)
        self.pad_id = 0

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, prompt: str) -> Tuple[List[int], bool]:
        """ids (BOS + prompt, cut to max_length) and whether it was truncated."""
        ids = self.sp.encode(prompt, add_bos=True)
        return ids[: self.max_length], len(ids) > self.max_length

    def batch(self, prompts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        """-> tokens int64 [B, max_length] (right-padded with 0), masks bool [B, max_length]."""
        tokens = np.full((len(prompts), self.max_length), self.pad_id, dtype=np.int64)
        masks = np.zeros((len(prompts), self.max_length), dtype=bool)
        for i, prompt in enumerate(prompts):
            ids, _ = self.encode(prompt)
            tokens[i, : len(ids)] = ids
            masks[i, : len(ids)] = True
        return tokens, masks
