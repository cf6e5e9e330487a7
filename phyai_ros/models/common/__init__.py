"""Pieces shared by the pi-family policies (pi0.5 now, pi0 later): SigLIP, Gemma blocks, time embedding,
image preprocessing, normalization, tokenization, the flow-matching solver and checkpoint I/O helpers."""
