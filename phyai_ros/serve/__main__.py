"""Start the served policy: ``python -m phyai_ros.serve --checkpoint DIR --tokenizer FILE [--port 8000]``.

Starts (or joins, with ``--address``) a Ray instance, runs the application with one replica per GPU (CPU
replicas without CUDA) and serves HTTP until interrupted. Beyond loopback (``--host``) a token is required:
``--token-file FILE`` or the environment variable PHYAI_SERVE_TOKEN (never on the command line, which every
user of the machine can read); clients send it as ``Authorization: Bearer TOKEN`` (the node: policy.token).

SIGINT (Ctrl-C) or SIGTERM stops it within seconds: Serve is shut down with a bound (``SHUTDOWN_S``; its own
shutdown could take over half a minute on a busy machine), then Ray, and the process exits.
"""
from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path

from .client import TOKEN_ENV
from .engine import BODY_TIMEOUT_S, MAX_BODY_BYTES, MAX_CLIENT_REQUESTS, ServeConfig


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m phyai_ros.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--norm-stats", default="")
    ap.add_argument("--type", default="", help="model type (empty: the checkpoint's)")
    ap.add_argument("--model-id", default="")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--token-bucket", type=int, default=0)
    ap.add_argument("--options", default="", help="the family's run settings, 'key=value;...'")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--batch-wait-ms", type=float, default=0.0,
                    help="how long a batch's first request waits for more (0: a request that finds the replica "
                         "idle runs at once; batches form from what arrives while it computes)")
    ap.add_argument("--replicas", type=int, default=0, help="0: one per GPU (1 without CUDA)")
    ap.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per CPU replica")
    ap.add_argument("--max-body-mb", type=float, default=MAX_BODY_BYTES / 2**20,
                    help="larger request bodies are refused (413) before they are read")
    ap.add_argument("--max-image-pixels", type=int, default=ServeConfig.max_image_pixels,
                    help="larger frames (width x height) are refused (400) from the request's tensor header")
    ap.add_argument("--body-timeout-s", type=float, default=BODY_TIMEOUT_S,
                    help="a request body not received within this is refused (408)")
    ap.add_argument("--max-client-requests", type=int, default=MAX_CLIENT_REQUESTS,
                    help="HTTP requests in flight per client address and replica; more are refused (429)")
    ap.add_argument("--token-file", default="", help="a file holding the token clients must send (default: "
                                                     "$PHYAI_SERVE_TOKEN); required with a --host beyond loopback")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    return ap.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> ServeConfig:
    return ServeConfig(checkpoint=a.checkpoint, tokenizer=a.tokenizer, norm_stats=a.norm_stats, model_type=a.type,
                       model_id=a.model_id, device=a.device, dtype=a.dtype, cuda_graphs=not a.no_cuda_graphs,
                       token_bucket=a.token_bucket, options=a.options, max_batch_size=a.max_batch_size,
                       batch_wait_s=a.batch_wait_ms / 1e3, max_body_bytes=int(a.max_body_mb * 2**20),
                       max_image_pixels=a.max_image_pixels, body_timeout_s=a.body_timeout_s,
                       max_client_requests=a.max_client_requests)


def read_token(a: argparse.Namespace) -> str:
    """The token from --token-file (the whole file, stripped), else PHYAI_SERVE_TOKEN, else empty."""
    if a.token_file:
        token = Path(a.token_file).read_text().strip()
        if not token:
            raise SystemExit(f"--token-file {a.token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV, "").strip()


SHUTDOWN_S = 10.0   # how long Serve's and then Ray's shutdown may take each before the process exits anyway


def _bounded(fn, seconds: float) -> bool:
    """fn() in a daemon thread, waited for at most ``seconds``: whether it finished."""
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


def main(argv=None) -> None:
    import ray
    from ray import serve

    from .app import run_local
    a = parse_args(argv)
    endpoint = run_local(config_from_args(a), a.port, a.host, a.replicas, a.num_cpus, token=read_token(a),
                         ray_init={"address": a.address})
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):   # from here on a signal ends the wait below, and only that
        signal.signal(signum, lambda *_: stop.set())
    print(f"serving {a.checkpoint} at {endpoint}/ (GET /info); Ctrl-C stops", flush=True)
    while not stop.is_set():
        time.sleep(0.2)
    print("stopping: shutting Serve down", flush=True)
    if not _bounded(serve.shutdown, SHUTDOWN_S):
        print(f"Serve did not shut down within {SHUTDOWN_S:g} s; stopping Ray", flush=True)
    _bounded(ray.shutdown, SHUTDOWN_S)


if __name__ == "__main__":
    main()
