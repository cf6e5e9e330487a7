"""Stateless modeling modules shared by model families (design.md §1): SigLIP, Gemma layers, the PaliGemma
prefix, the action-expert suffix context, the time embedding and the flow-matching solver. No state between
calls, no checkpoint keys, no preprocessing: those are adapter code (phyai_ros/models/)."""
