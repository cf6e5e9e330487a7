#!/usr/bin/env python3
"""Onboard-node benchmark (not a test): the real node, real DDS, the small random-weight pi0.5 on CPU.

A camera process publishes three 480x640 rgb8 cameras (sensor_msgs/Image) plus joint states at
--rate Hz, stamped with the system clock; this process runs ``PolicyNode`` exactly as ``main()``
does (SingleThreadedExecutor on one thread, inference on the loop's worker thread), once per RTC
mode, for --seconds each, and prints:

* action-timer jitter: |tick time - its slot on the timer's grid| (time.monotonic at the entry of
  every action-timer callback; rcl timers are drift-free, so the grid has period dt and the phase
  most ticks have), p50/p99 over ticks during which an inference was running, and over the others
  for comparison; plus ticks the timer lost (rcl skips a slot when a call is over a period late).
* node overhead L_noninf = L_observe + L_transfer + L_queue + L_actuate (DESIGN.md §2) p50/p99 per
  chunk, with its segments. L_observe includes DDS transport of three ~0.9 MB frames and cv_bridge
  conversion; L_transfer is the time the newest frame waited for the RTC trigger (up to one camera
  period when no frame is lost), so it reflects the camera rate more than the node; the node's own
  processing is observe + queue + actuate (also printed).
* chunk-boundary discontinuity, RTC off vs guided. At each chunk switch, t* is the first tick that
  executes an action the new chunk computed freely (its first executed index, or the end of its
  frozen prefix d if later, since frozen actions are the old chunk's). Printed: the jump
  |a_new(t*) - a_old(t*)|_inf (departure from the plan being executed) and the executed step
  |cmd(t*) - cmd(t* - dt)|_inf next to the same step between ticks inside a chunk, p50/p95, in
  action units. (Random weights give noisy chunks, so the executed steps are noise-dominated; the
  jump is the figure that separates the modes. They do not say how smooth a trained policy is.)

    .venv/bin/python scripts/bench_node.py [--seconds 20] [--rate 30] [--dt 0.02] [--horizon 50]
        [--modes guided off] [--image-size 224] [--large-shm] [--json out.json]

Also printed: camera frames the node actually received per second. With Fast DDS defaults, best-
effort 0.9 MB frames exceed the 512 KB shared-memory segment, go over UDP and many are lost (the
node then acts on older frames, which shows in L_transfer); --large-shm runs both processes with a
profile whose segment holds whole frames.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FIXTURES = Path(os.environ.get("PHYAI_PARITY_FIXTURES") or REPO.parent / "shared" / "fixtures" / "lerobot_parity")
TOKENIZER = FIXTURES / "tokenizer" / "tokenizer.model"
CPU_CONFIG = REPO / "config" / "pi05_cpu_test.yaml"
SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
# Fast DDS (Jazzy: 2.14) profile: shared memory with a 32 MB segment (whole 0.9 MB frames fit), UDP kept
# for discovery and other hosts.
LARGE_SHM_PROFILE = (REPO / "config" / "fastdds_large_shm.xml").read_text()


# ----------------------------------------------------------------------------- camera process
def run_publisher(args) -> None:
    """Three rgb8 cameras + joint states at args.rate Hz and a latched instruction, until SIGINT."""
    import rclpy
    import yaml
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String

    p = yaml.safe_load(CPU_CONFIG.read_text())["phyai_policy"]["ros__parameters"]
    rclpy.init()
    node = rclpy.create_node("bench_cameras")
    h, w = args.hw
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8).tobytes() for _ in p["cameras"]["topics"]]
    cams = [node.create_publisher(Image, t, qos_profile_sensor_data) for t in p["cameras"]["topics"]]
    state = node.create_publisher(JointState, p["state"]["topic"], qos_profile_sensor_data)
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    node.create_publisher(String, p["instruction"]["topic"], latched).publish(String(data="pick up the red cup"))
    names = list(p["state"]["joint_names"])

    def publish():
        stamp = node.get_clock().now().to_msg()
        for pub, data in zip(cams, frames):
            msg = Image(height=h, width=w, encoding="rgb8", step=w * 3, data=data)
            msg.header.stamp = stamp
            pub.publish(msg)
        js = JointState(name=names, position=[0.0] * len(names))
        js.header.stamp = stamp
        state.publish(js)

    node.create_timer(1.0 / args.rate, publish)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
        pass
    finally:
        rclpy.try_shutdown()


# ----------------------------------------------------------------------------- the node under test
def make_checkpoint(directory: Path, horizon: int, image_size: int) -> Path:
    from phyai_ros.testing import make_small_checkpoint
    return make_small_checkpoint(directory, horizon=horizon, image_size=image_size, token_budget=48,
                                 cameras=SLOTS)


def run_node(args, ckpt: Path, mode: str) -> dict:
    """One PolicyNode run; returns raw per-tick and per-chunk records."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from phyai_ros.node.main import PolicyNode

    overrides = {"model.checkpoint": f"'{ckpt}'", "model.tokenizer": f"'{TOKENIZER}'", "rtc.mode": f"'{mode}'",
                 "control.dt": repr(args.dt), "control.horizon": str(args.horizon),
                 "cameras.compressed": "[false, false, false]", "model.warmup_runs": "2"}
    cli = ["--ros-args", "--params-file", str(CPU_CONFIG)]
    for k, v in overrides.items():
        cli += ["-p", f"{k}:={v}"]
    context = rclpy.Context()
    rclpy.init(context=context)
    node = PolicyNode(context=context, cli_args=cli)
    loop = node.loop
    ticks, reports = [], []
    tick = loop.tick

    def timed_tick():
        t = time.monotonic_ns()
        busy = loop.inference_in_flight
        em = tick()
        ticks.append((t, busy, em))
        return em

    loop.tick = timed_tick
    on_margin = loop.on_margin

    def record_margin(report):
        reports.append(report)
        on_margin(report)

    loop.on_margin = record_margin
    chunks = {}
    on_chunk = loop.on_chunk

    def record_chunk(chunk):
        chunks[chunk.seq] = chunk
        on_chunk(chunk)

    loop.on_chunk = record_chunk
    frames = []
    on_image = loop.on_image

    def count_frame(slot, image, stamp_ns):
        frames.append(time.monotonic_ns())
        return on_image(slot, image, stamp_ns)

    loop.on_image = count_frame
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        # Wait for the first chunk, then measure for args.seconds.
        deadline = time.monotonic() + 60
        while loop.counters()["chunks"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        if loop.counters()["chunks"] == 0:
            raise RuntimeError("no chunk within 60 s: is the camera process publishing?")
        start = len(ticks), len(reports), len(frames)
        time.sleep(args.seconds)
        counters = loop.counters()
        received = len(frames) - start[2]
        return {"ticks": ticks[start[0]:], "reports": reports[start[1]:], "counters": counters, "chunks": chunks,
                "frames_per_s": received / args.seconds / len(SLOTS)}
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)
        spinner.join(5)


# ----------------------------------------------------------------------------- figures
def pct(values, q):
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def analyse(run: dict, dt: float) -> dict:
    ticks = run["ticks"]
    t = np.array([x[0] for x in ticks], dtype=np.int64)
    busy = np.array([x[1] for x in ticks], dtype=bool)
    dt_ns = int(round(dt * 1e9))
    # Jitter = how far each tick is from its slot on the timer's grid (rcl timers are drift-free and
    # fire late, never early; a call more than a period late makes rcl skip the slot: a lost tick).
    # The grid's phase is the most common tick phase; deviations are taken in [-dt/4, 3dt/4).
    phase = (t - t[0]) % dt_ns
    hist, edges = np.histogram(phase, bins=400, range=(0, dt_ns))
    on_time = edges[np.argmax(hist)] + (edges[1] - edges[0]) / 2
    jitter_ms = np.abs((phase - on_time + dt_ns / 4) % dt_ns - dt_ns / 4) / 1e6
    gaps = np.diff(t) / dt_ns
    steady = [r for r in run["reports"] if r.in_window]
    noninf = [(r.latency_observe + r.latency_transfer + r.latency_queue + r.latency_actuate) * 1e3 for r in steady]
    processing = [(r.latency_observe + r.latency_queue + r.latency_actuate) * 1e3 for r in steady]
    seg = {name: [getattr(r, name) * 1e3 for r in steady]
           for name in ("L_observe", "L_transfer", "L_queue", "L_inference", "L_actuate")}
    # Chunk switches. t* = the first tick that executes an action the new chunk computed freely (its
    # first emitted index, or the end of its frozen prefix if later: frozen actions are the old ones).
    # jump = |a_new(t*) - a_old(t*)|_inf, the departure from the plan being executed; step = the executed
    # change |cmd(t*) - cmd(t* - dt)|_inf, against the same step between ticks inside one chunk.
    ems = [e for _, _, e in ticks if e is not None and e.kind == "chunk"]
    chunks = run["chunks"]
    jumps, switch_steps, inside = [], [], []
    switch_slots = set()
    for a, b in zip(ems, ems[1:]):
        if b.chunk_seq == a.chunk_seq or a.chunk_seq not in chunks or b.chunk_seq not in chunks:
            continue
        old, new = chunks[a.chunk_seq], chunks[b.chunk_seq]
        j = max(b.index, new.d)
        if j >= new.horizon:
            continue
        t_star = new.time_of(j)
        planned = old.actions[min(max((t_star - old.t0_ns) // dt_ns, 0), old.horizon - 1)]
        jumps.append(float(np.max(np.abs(new.actions[j].astype(np.float64) - planned))))
        switch_slots.add(t_star)
    for a, b in zip(ems, ems[1:]):
        if b.slot_ns - a.slot_ns != dt_ns:
            continue
        step = float(np.max(np.abs(b.action.astype(np.float64) - a.action)))
        if b.slot_ns in switch_slots:
            switch_steps.append(step)
        elif b.chunk_seq == a.chunk_seq:
            inside.append(step)
    return {
        "ticks": int(len(t)), "ticks_during_inference": int(busy.sum()),
        "jitter_ms_during_inference_p50": pct(jitter_ms[busy], 50),
        "jitter_ms_during_inference_p99": pct(jitter_ms[busy], 99),
        "jitter_ms_idle_p50": pct(jitter_ms[~busy], 50), "jitter_ms_idle_p99": pct(jitter_ms[~busy], 99),
        "jitter_ms_max": float(jitter_ms.max()), "lost_ticks": int(np.sum(np.maximum(np.round(gaps) - 1, 0))),
        "chunks": len(steady), "L_noninf_ms_p50": pct(noninf, 50), "L_noninf_ms_p99": pct(noninf, 99),
        "processing_ms_p50": pct(processing, 50), "processing_ms_p99": pct(processing, 99),
        **{f"{n}_ms_p50": pct(v, 50) for n, v in seg.items()}, **{f"{n}_ms_p99": pct(v, 99) for n, v in seg.items()},
        "switches": len(jumps), "switch_jump_p50": pct(jumps, 50), "switch_jump_p95": pct(jumps, 95),
        "switch_step_p50": pct(switch_steps, 50), "switch_step_p95": pct(switch_steps, 95),
        "inside_step_p50": pct(inside, 50), "inside_step_p95": pct(inside, 95),
        "deadline_misses": run["counters"]["deadline_misses"], "late_chunks": run["counters"]["late_chunks"],
        "frames_per_s_per_camera": run["frames_per_s"],
    }


def report(results: dict, args) -> None:
    import torch
    print(f"\nbench_node: {args.seconds:.0f} s per mode, dt {args.dt * 1e3:.0f} ms, H {args.horizon}, "
          f"3 cameras {args.hw[0]}x{args.hw[1]} rgb8 @ {args.rate:.0f} Hz, small pi0.5 ({args.image_size} px) on "
          f"CPU, torch threads {torch.get_num_threads()}, {os.cpu_count()} cores, "
          f"load avg {os.getloadavg()[0]:.2f}, DDS: {'large SHM segment' if args.large_shm else 'Fast DDS defaults'}")
    modes = list(results)
    rows = [
        ("frames received per camera per s", lambda r: f"{r['frames_per_s_per_camera']:.1f}"),
        ("ticks (during inference)", lambda r: f"{r['ticks']} ({r['ticks_during_inference']})"),
        ("timer jitter during inference p50/p99 ms",
         lambda r: f"{r['jitter_ms_during_inference_p50']:.3f} / {r['jitter_ms_during_inference_p99']:.3f}"),
        ("timer jitter otherwise p50/p99 ms",
         lambda r: f"{r['jitter_ms_idle_p50']:.3f} / {r['jitter_ms_idle_p99']:.3f}"),
        ("timer jitter max ms / lost ticks", lambda r: f"{r['jitter_ms_max']:.2f} / {r['lost_ticks']}"),
        ("chunks measured", lambda r: str(r["chunks"])),
        ("L_noninf p50/p99 ms", lambda r: f"{r['L_noninf_ms_p50']:.2f} / {r['L_noninf_ms_p99']:.2f}"),
        ("  L_observe p50/p99 ms", lambda r: f"{r['L_observe_ms_p50']:.2f} / {r['L_observe_ms_p99']:.2f}"),
        ("  L_transfer p50/p99 ms", lambda r: f"{r['L_transfer_ms_p50']:.2f} / {r['L_transfer_ms_p99']:.2f}"),
        ("  L_queue p50/p99 ms", lambda r: f"{r['L_queue_ms_p50']:.2f} / {r['L_queue_ms_p99']:.2f}"),
        ("  L_actuate p50/p99 ms", lambda r: f"{r['L_actuate_ms_p50']:.2f} / {r['L_actuate_ms_p99']:.2f}"),
        ("  observe+queue+actuate p50/p99 ms",
         lambda r: f"{r['processing_ms_p50']:.2f} / {r['processing_ms_p99']:.2f}"),
        ("L_inference p50/p99 ms", lambda r: f"{r['L_inference_ms_p50']:.1f} / {r['L_inference_ms_p99']:.1f}"),
        ("switch jump |a_new-a_old| p50/p95 (n)",
         lambda r: f"{r['switch_jump_p50']:.3f} / {r['switch_jump_p95']:.3f} ({r['switches']})"),
        ("executed step at switch p50/p95", lambda r: f"{r['switch_step_p50']:.3f} / {r['switch_step_p95']:.3f}"),
        ("executed step inside chunks p50/p95", lambda r: f"{r['inside_step_p50']:.3f} / {r['inside_step_p95']:.3f}"),
        ("deadline misses / late chunks", lambda r: f"{r['deadline_misses']} / {r['late_chunks']}"),
    ]
    print(f"{'':44s}" + "".join(f"{'rtc ' + m:>24s}" for m in modes))
    for label, fmt in rows:
        print(f"{label:44s}" + "".join(f"{fmt(results[m]):>24s}" for m in modes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per RTC mode")
    ap.add_argument("--rate", type=float, default=30.0, help="camera / joint-state rate (Hz)")
    ap.add_argument("--hw", type=int, nargs=2, default=(480, 640), help="camera height width")
    ap.add_argument("--dt", type=float, default=0.02, help="action period (s)")
    ap.add_argument("--horizon", type=int, default=50, help="actions per chunk")
    ap.add_argument("--image-size", type=int, default=224, help="the model's SigLIP input size")
    ap.add_argument("--modes", nargs="+", default=["guided", "off"], choices=["guided", "off"])
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--large-shm", action="store_true",
                    help="run both processes with a Fast DDS profile whose shared-memory segment holds whole "
                         "frames (the default 512 KB segment sends a 0.9 MB frame over UDP, where best-effort "
                         "frames get lost)")
    ap.add_argument("--publisher", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.publisher:
        return run_publisher(args)
    if not TOKENIZER.is_file():
        sys.exit(f"tokenizer not found at {TOKENIZER} (set PHYAI_PARITY_FIXTURES)")
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.setdefault("ROS_DOMAIN_ID", str(random.Random(os.getpid()).randint(1, 101)))
    tmp_dir = tempfile.TemporaryDirectory()
    if args.large_shm:
        profile = Path(tmp_dir.name) / "fastdds_large_shm.xml"
        profile.write_text(LARGE_SHM_PROFILE)
        os.environ["FASTRTPS_DEFAULT_PROFILES_FILE"] = str(profile)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cam = subprocess.Popen([sys.executable, __file__, "--publisher", "--rate", str(args.rate),
                            "--hw", *map(str, args.hw)], cwd=REPO, env=env)
    results = {}
    try:
        ckpt = make_checkpoint(Path(tmp_dir.name) / "pi05_small", args.horizon, args.image_size)
        for mode in args.modes:
            print(f"rtc {mode}: measuring {args.seconds:.0f} s ...", flush=True)
            results[mode] = analyse(run_node(args, ckpt, mode), args.dt)
    finally:
        cam.send_signal(signal.SIGINT)
        try:
            cam.wait(10)
        except subprocess.TimeoutExpired:
            cam.kill()
        tmp_dir.cleanup()
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
