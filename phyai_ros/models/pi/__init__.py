"""The pi family (pi0.5 and pi0): PaliGemma prefix (SigLIP + Gemma) and a Gemma action expert sampled by flow
matching. What the two share is here once: the adapter base (policy.py), their sizes (config.py), normalization,
tokenization, image preprocessing, checkpoint I/O and key layouts, the stateless network (modeling/) and the
runner (runner.py). What differs is in pi05/ and pi0/: the normalizer, the prompt, the token budget and how the
expert is conditioned (adaRMS on time vs a state token and an action + time MLP)."""
