"""The policy served on Ray Serve (shared edge serving, RL rollouts) and its clients.

``wire`` (one request / reply and their binary encoding) and ``client`` (HTTP client, the node's remote bridge)
import no Ray; ``app`` (the deployment), ``engine`` (the batch path) and ``rollout`` (the in-process RL client)
need the ``serve`` extra (``pip install '.[serve]'``). Start: ``python -m phyai_ros.serve --checkpoint DIR ...``.
"""
