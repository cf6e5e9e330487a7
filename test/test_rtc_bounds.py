"""Magnitudes of RTC prefixes are bounded and no chunk that is not finite reaches a robot (issue 38, item 4).

A finite prefix of 1e38 passed every check and the guided solver made a non-finite chunk of it, which the server
answered with 200. Now a prefix beyond ``MAX_ABS_ACTION`` is refused where it enters (the wire, the engine's
intake, the loop's adoption of the chunks prefixes are cut from), and a chunk with NaN/inf is never returned
(the engine answers 500) nor adopted (the loop counts a bad chunk). The small fixture pi0.5 runs for real."""
import numpy as np
import pytest

from phyai_ros.control.rtc import MAX_ABS_ACTION, RtcRequest, check_action_magnitudes
from phyai_ros.control.testing import make_sim
from phyai_ros.fixtures import make_small_checkpoint, require_tokenizer
from phyai_ros.serve.engine import ServeConfig
from phyai_ros.serve.wire import BadRequest, Failure, Reply, Request, decode_request, encode_request
from serve_drills import NON_FINITE, DrillEngine
from test_control_robustness import H, cfg

HORIZON = 20


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    ckpt = make_small_checkpoint(tmp_path_factory.mktemp("rtc_bounds") / "pi05", horizon=HORIZON)
    return DrillEngine(ServeConfig(str(ckpt), str(require_tokenizer()), device="cpu"))


def _request(robot: str, task: str = "pick up the cup", prefix_value=None) -> Request:
    rng = np.random.default_rng(0)
    images = {"base_0_rgb": rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)}
    rtc = None
    if prefix_value is not None:
        rtc = RtcRequest("guided", "linear", np.full((12, 7), prefix_value, np.float32), 3, HORIZON, 0, 20_000_000)
    return Request(robot, images, np.zeros(8, np.float32), task, 1, rtc)


def test_the_bound_names_what_it_refuses():
    check_action_magnitudes(np.full((3, 2), MAX_ABS_ACTION))
    with pytest.raises(ValueError, match=r"RTC prefix holds 1 of 6 values beyond \+-1e\+06 .*largest 1e\+38"):
        check_action_magnitudes(np.array([[0, 0], [0, 1e38], [0, 0]], np.float32))
    with pytest.raises(ValueError, match="chunk contains NaN or inf"):
        check_action_magnitudes(np.array([np.inf]), "chunk")


def test_a_huge_rtc_prefix_is_refused_by_the_engine_not_answered_with_a_non_finite_chunk(engine):
    ok, huge = engine.run([_request("ok", prefix_value=0.5), _request("huge", prefix_value=1e38)])
    assert isinstance(ok, Reply) and np.isfinite(ok.actions).all()
    assert isinstance(huge, Failure) and huge.status == 400, huge
    assert "robot 'huge'" in huge.message and "MAX_ABS_ACTION" in huge.message, huge.message


def test_a_huge_rtc_prefix_is_refused_by_the_wire():
    with pytest.raises(BadRequest, match="r7: rtc.prefix holds 84 of 84 values beyond"):
        decode_request(encode_request(_request("r7", prefix_value=-3e37)))
    with pytest.raises(BadRequest, match="rtc.prefix contains NaN or inf"):
        decode_request(encode_request(_request("r7", prefix_value=np.nan)))


def test_the_engine_never_returns_a_non_finite_chunk(engine):
    good, spoiled = engine.run([_request("good"), _request("spoiled", task=NON_FINITE)])
    assert isinstance(good, Reply) and np.isfinite(good.actions).all()
    assert isinstance(spoiled, Failure) and spoiled.status == 500, spoiled
    assert "non-finite" in spoiled.message and "spoiled" in spoiled.message


@pytest.mark.parametrize("value", [1e38, -2e6])
def test_the_loop_adopts_no_chunk_beyond_the_bound(value):
    """A chunk beyond MAX_ABS_ACTION (a remote server's, or a model's) is never commanded, nor cut into the next
    RTC prefix: counted as a bad chunk, and the next good chunk acts."""
    def make(snap, rtc, call):
        if rtc is not None:
            check_action_magnitudes(rtc.prefix)   # what the adapters hold every prefix to
        return np.full((H, 2), value, np.float32) if call == 1 else np.zeros((H, 2), np.float32)
    sim = make_sim(cfg(), make=make, latency_ns=5_000_000)
    sim.driver.run(40)
    assert sim.loop.counters()["bad_chunks"] == 1 and sim.loop.counters()["inference_errors"] == 0
    assert "MAX_ABS_ACTION" in dict(sim.events)["bad_chunk"]
    assert all(np.abs(ch.actions).max() <= MAX_ABS_ACTION for ch in sim.chunks) and len(sim.chunks) >= 3
    assert all(abs(e.action).max() <= MAX_ABS_ACTION for _, e in sim.driver.ticks if e is not None)
