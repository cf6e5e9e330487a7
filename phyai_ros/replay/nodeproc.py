"""Start the policy node as a subprocess for a replay (the CLI's ``--start-node``, the demo and
``phyai_ros.testing``): ``python -m phyai_ros.node.main --ros-args --params-file F -p k:=v ...``
with ``use_sim_time`` on, its output drained by a thread (and kept for error messages).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import yaml

from phyai_ros import share_dirs
from phyai_ros.parameters import SPECS
from phyai_ros.replay.nodeinfo import NODE_NAME, NodeInfo, load_params_file

PACKAGE_ROOT = Path(__file__).resolve().parents[2]   # folder holding the phyai_ros package


def default_params_file(name: str = "pi05_cpu_test.yaml") -> Path:
    """config/<name> of the package (``phyai_ros.share_dirs``: wheel, source tree, installed share/phyai_ros)."""
    candidates = [d / name for d in share_dirs("config")]
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(f"params file {name} not found in: " + ", ".join(map(str, candidates)))


def replay_mode_parameters(params_file, overrides: Mapping[str, Any], stepped: bool) -> Dict[str, Any]:
    """The node parameters a replay mode needs.  Stepped: one /diagnostics report per control tick (the
    replay waits for each) and the compute segments on the stamp clock, which the replay holds while the node
    infers (``control.compute_clock: stamp``: latencies and margins in simulated time, the same on every run).
    Real time: reports at 10 Hz, so the session's counters end within 0.1 s of the last message."""
    if not stepped:
        return {"diagnostics.period": 0.1}
    dt = overrides.get("control.dt")
    if dt is None:
        dt = load_params_file(params_file or default_params_file()).get("control.dt", SPECS["control.dt"].default)
    return {"diagnostics.period": dt, "control.compute_clock": "stamp"}


def with_replay_mode(params_file, overrides: Mapping[str, Any], stepped: bool) -> Dict[str, Any]:
    """``overrides`` with the parameters the replay mode needs (``replay_mode_parameters``), by one rule for every
    node the replay starts: a stepped replay's replace the user's (the player refuses a node without them), a
    real-time one's are defaults the user may change."""
    mode = replay_mode_parameters(params_file, overrides, stepped)
    out = dict(overrides)
    out.update(mode if stepped else {k: v for k, v in mode.items() if k not in out})
    return out


def param_arg(name: str, value: Any) -> str:
    """``name:=value`` typed the way rcl's YAML parser reads it."""
    def fmt(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return "'" + str(v).replace("'", "''") + "'"
    return f"{name}:={fmt(value)}"


def parse_param_args(items) -> Dict[str, Any]:
    """['name:=value', ...] (as after -p) -> dict, values parsed as YAML like rcl does."""
    out = {}
    for item in items or ():
        name, sep, value = item.partition(":=")
        if not sep or not name:
            raise ValueError(f"bad parameter {item!r}: expected NAME:=VALUE")
        out[name.strip()] = yaml.safe_load(value)
    return out


def node_info_for(params_file=None, overrides: Optional[Mapping[str, Any]] = None, use_sim_time: bool = True
                  ) -> NodeInfo:
    """What a PolicyNodeProcess with these arguments will be, known before starting it (so a bag can be
    checked against it first)."""
    params_file = Path(params_file) if params_file else default_params_file()
    params = {**load_params_file(params_file), **dict(overrides or {})}
    if use_sim_time:
        params["use_sim_time"] = True
    return NodeInfo.from_params(params, source=f"params file {params_file} + overrides")


def _die_with_parent() -> None:
    """In the child: get SIGINT when the parent dies, so a killed replay leaves no node behind."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort
        pass


class DrainedProcess:
    """A child process whose output a thread drains (so it never blocks on a full pipe), kept for error
    messages and optionally mirrored to a log file; ``stop`` interrupts it as Ctrl-C would."""

    def _start(self, args: List[str], env: Mapping[str, str], log_path=None, cwd=None) -> None:
        self.args = list(args)
        self._log = open(log_path, "w") if log_path else None
        self.proc = subprocess.Popen(args, env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        self._lines: List[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self._lines.append(line)
            if self._log is not None:
                self._log.write(line)
                self._log.flush()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self, last: Optional[int] = None) -> str:
        lines = self._lines if last is None else self._lines[-last:]
        return "".join(lines)

    def wait_exit(self, timeout: float) -> Optional[int]:
        """Exit status, or None if it is still running after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 15.0) -> str:
        """Ctrl-C the process, wait (kill if it hangs) and return everything it printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5.0)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.output()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def node_ros_args(params_file, overrides: Optional[Mapping[str, Any]] = None,
                  remaps: Optional[Mapping[str, str]] = None, use_sim_time: bool = False) -> List[str]:
    """The arguments after ``--ros-args`` for the node: params file, ``-p`` overrides, sim time,
    ``-r`` remappings (node name -> new name).  Also what an in-process node takes."""
    args = ["--params-file", str(params_file)]
    for name, value in (overrides or {}).items():
        args += ["-p", param_arg(name, value)]
    if use_sim_time:
        args += ["-p", "use_sim_time:=true"]
    for src, dst in (remaps or {}).items():
        args += ["-r", f"{src}:={dst}"]
    return args


class PolicyNodeProcess(DrainedProcess):
    """The policy node in a subprocess: the one driver of the node for the replay tool, users' tests
    (``phyai_ros.testing``) and the project's node tests.

    ``info`` describes it (from the params file + overrides, without asking the live node).
    ``ros_args``: a ready-made argument list instead (e.g. a launch file's), with ``params`` what it
    amounts to."""

    def __init__(self, params_file=None, *, overrides: Optional[Mapping[str, Any]] = None,
                 remaps: Optional[Mapping[str, str]] = None, use_sim_time: bool = True,
                 env: Optional[Mapping[str, str]] = None, log_path=None, module: str = "phyai_ros.node.main",
                 ros_args: Optional[List[str]] = None, params: Optional[Mapping[str, Any]] = None, cwd=None):
        self.params_file = Path(params_file) if params_file else default_params_file()
        self.overrides = dict(overrides or {})
        if ros_args is None:
            ros_args = node_ros_args(self.params_file, self.overrides, remaps, use_sim_time)
            self.info = node_info_for(self.params_file, self.overrides, use_sim_time)
        else:
            info_params = dict(params or {})
            if use_sim_time:
                info_params["use_sim_time"] = True
            self.info = NodeInfo.from_params(info_params, source="given parameters")
        full_env = dict(os.environ if env is None else env)
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), full_env.get("PYTHONPATH")]))
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self._start([sys.executable, "-m", module, "--ros-args", *ros_args], full_env, log_path, cwd=cwd)

    @property
    def name(self) -> str:
        return NODE_NAME


class PolicyNode(PolicyNodeProcess):
    """The policy node in a subprocess, ready to be replayed into.

    ``params_file``: default ``config/pi05_cpu_test.yaml``; ``checkpoint`` / ``tokenizer``: set
    ``model.checkpoint`` / ``model.tokenizer``; ``overrides``: more ``-p`` parameters; ``stepped``
    (default True): one /diagnostics report per control tick and the compute measured on the stamp clock, which
    stepped replay needs (these replace the overrides' values; ``with_replay_mode``); with ``stepped=False``
    (real-time replay) it reports at 10 Hz unless the overrides say otherwise."""

    def __init__(self, params_file=None, *, checkpoint=None, tokenizer=None,
                 overrides: Optional[Mapping[str, Any]] = None, remaps: Optional[Mapping[str, str]] = None,
                 stepped: bool = True, log_path=None):
        params_file = Path(params_file) if params_file else default_params_file()
        ov: Dict[str, Any] = dict(overrides or {})
        if checkpoint is not None:
            ov["model.checkpoint"] = str(checkpoint)
        if tokenizer is not None:
            ov["model.tokenizer"] = str(tokenizer)
        super().__init__(params_file, overrides=with_replay_mode(params_file, ov, stepped), remaps=remaps,
                         use_sim_time=True, log_path=log_path)


__all__ = ["DrainedProcess", "PolicyNodeProcess", "PolicyNode", "node_info_for", "node_ros_args", "default_params_file",
           "replay_mode_parameters", "with_replay_mode", "param_arg", "parse_param_args", "PACKAGE_ROOT"]
