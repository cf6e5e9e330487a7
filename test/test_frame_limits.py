"""One frame rule (control.observation.FrameLimits, issue 40 item 5): the node's image converter (before and after
decoding), its observation buffer, the serve wire (from the tensor header) and the serve engine all refuse a camera
frame with that one rule and its words, so a frame means the same on every path."""
from types import SimpleNamespace

import numpy as np
import pytest

from phyai_ros.control import ControlConfig
from phyai_ros.control.observation import MAX_IMAGE_PIXELS, BadImageError, FrameLimits
from phyai_ros.control.testing import make_sim
from phyai_ros.serve import engine as engine_module
from phyai_ros.serve.engine import BatchEngine, ServeConfig
from phyai_ros.serve.wire import BadRequest, Request, decode_request, encode_request

MS = 1_000_000
PIXELS = 40 * 40   # a small limit, so a frame over it is cheap to make
GOOD = np.zeros((30, 40, 3), np.uint8)


def sim(max_pixels: int = PIXELS):
    return make_sim(ControlConfig(dt=0.01, horizon=10, action_dim=2, cameras=("front",), state_dim=3, rtc_overlap=2,
                                  max_image_pixels=max_pixels), latency_ns=5 * MS, feed=False)


def loop_refusal(frame, max_pixels: int = PIXELS) -> str:
    """What the node's loop says when a frame is put into its observation buffer."""
    s = sim(max_pixels)
    assert not s.loop.on_image("front", frame, s.clock.now())
    kind, detail = s.events[-1]
    assert kind == "bad_image"
    return detail


def wire_refusal(frame, max_pixels: int = PIXELS) -> str:
    with pytest.raises(BadRequest) as err:
        decode_request(encode_request(Request("arm", {"front": frame}, np.zeros(3, np.float32), "pick")), max_pixels)
    return str(err.value)


@pytest.fixture
def engine(monkeypatch):
    """The serve engine with a stand-in adapter (a square 224 input): its own intake, no model loaded."""
    monkeypatch.setattr(engine_module, "load_adapter", lambda cfg: SimpleNamespace(
        family="stand_in", image_size=224, state_dim=3, quantized_weights=list))
    return BatchEngine(ServeConfig("unused", device="cpu", max_image_pixels=PIXELS))


def engine_refusal(engine, frame) -> str:
    with pytest.raises(BadImageError) as err:
        engine.check_intake(Request("arm", {"front": frame}, np.zeros(3, np.float32), "pick"))
    return str(err.value)


def converter_refusal(frame_hw, max_pixels: int = PIXELS) -> str:
    """What the node's image converter says of a raw rgb8 message of that size (checked before decoding)."""
    from sensor_msgs.msg import Image

    from phyai_ros.node.images import ImageConverter, ImageDecodeError
    h, w = frame_hw
    msg = Image(height=h, width=w, encoding="rgb8", step=w * 3, data=bytes(h * w * 3))
    with pytest.raises(ImageDecodeError) as err:
        ImageConverter(max_pixels).from_image(msg)
    return str(err.value)


# ------------------------------------------------------------------------------------- one rule, every path
SENTINEL = "refused by the one frame rule"


def test_every_path_refuses_with_the_one_rule(monkeypatch, engine):
    """With the rule made to refuse everything, every path refuses a good frame, in the rule's words: none of them
    checks a frame by a rule of its own."""
    monkeypatch.setattr(FrameLimits, "_fault", lambda self, shape, dtype: SENTINEL)
    assert f"camera 'front': {SENTINEL}" in loop_refusal(GOOD)
    assert f"arm: camera 'front': {SENTINEL}" in wire_refusal(GOOD)
    assert f"camera 'front': {SENTINEL}" in engine_refusal(engine, GOOD)
    assert SENTINEL in converter_refusal(GOOD.shape[:2])


def test_the_node_converter_holds_the_decoded_frame_to_the_rule(monkeypatch):
    """The header passes and the decoded array is refused: the converter checks what cv_bridge made too."""
    from sensor_msgs.msg import Image

    from phyai_ros.node.images import ImageConverter, ImageDecodeError
    calls = []
    real = FrameLimits._fault

    def second_call_refuses(self, shape, dtype):
        calls.append((shape, dtype))
        return SENTINEL if len(calls) == 2 else real(self, shape, dtype)
    monkeypatch.setattr(FrameLimits, "_fault", second_call_refuses)
    msg = Image(height=30, width=40, encoding="mono8", step=40, data=bytes(1200))
    with pytest.raises(ImageDecodeError, match=f"mono8 did not decode to a usable RGB frame: {SENTINEL}"):
        ImageConverter().from_image(msg)
    assert calls == [((30, 40, 3), "uint8"), ((30, 40, 3), "uint8")]


# ------------------------------------------------------------------------------------- the same words
@pytest.mark.parametrize("frame, says", [
    (np.zeros((30, 40, 3), np.float32), "image dtype must be uint8, got float32"),
    (np.zeros((30, 40, 2), np.uint8), "image shape must be [H, W, 3], got [30, 40, 2]"),
    (np.zeros((30, 40), np.uint8), "image shape must be [H, W, 3], got [30, 40]"),
    (np.zeros((0, 40, 3), np.uint8), "empty image 40x0 (WxH)"),
    (np.zeros((41, 40, 3), np.uint8), "image 40x41 (WxH) has 1,640 pixels, more than the limit of 1,600"),
], ids=["float", "two_channels", "grey", "empty", "over_the_limit"])
def test_a_bad_frame_is_refused_in_the_same_words_everywhere(frame, says, engine):
    assert f"camera 'front': {says}" in loop_refusal(frame)
    assert f"arm: camera 'front': {says}" in wire_refusal(frame)
    assert f"camera 'front': {says}" in engine_refusal(engine, frame)


def test_the_size_limit_is_named_where_it_is_set(engine):
    """Over the limit, each path says which setting holds it (the node's parameter, the server's option)."""
    big = (41, 40)
    assert "1,640 pixels, more than the limit of 1,600 (cameras.max_pixels), not decoded" in converter_refusal(big)
    assert "more than the limit of 1,600 (the server's max_image_pixels)" in wire_refusal(np.zeros((*big, 3), np.uint8))
    assert "more than the limit of 1,600 (the server's max_image_pixels)" in engine_refusal(
        engine, np.zeros((*big, 3), np.uint8))


def test_an_empty_raw_message_is_refused_by_the_rule():
    assert "rgb8: empty image 40x0 (WxH), not decoded" in converter_refusal((0, 40))


def test_the_engine_refuses_what_the_models_resize_cannot_take(engine):
    """The aspect rule with the model's square input: the same words as the node's loop with that input size."""
    thin = np.zeros((1, 300, 3), np.uint8)
    with pytest.raises(BadImageError) as err:
        FrameLimits(input_size=224).check(thin)
    assert "too elongated" in str(err.value) and f"camera 'front': {err.value}" in engine_refusal(engine, thin)


@pytest.mark.parametrize("dtype, shown", [("F32", "float32"), ("BF16", "BF16"), (["U8"], "['U8']")])
def test_a_wire_dtype_is_named_in_numpys_words_or_as_sent(dtype, shown):
    """safetensors' names become numpy's; one numpy lacks, or any JSON a sender put there, is shown as it is."""
    from phyai_ros.serve.wire import _check_request_tensors
    with pytest.raises(BadRequest) as err:
        _check_request_tensors("arm", MAX_IMAGE_PIXELS)({"image.front": (dtype, (30, 40, 3))})
    assert str(err.value) == f"arm: camera 'front': image dtype must be uint8, got {shown}"


def test_a_header_that_declares_a_huge_frame_costs_nothing():
    """The rule reads the declared shape alone: a 10^6 x 10^6 header is refused without any array."""
    with pytest.raises(BadImageError, match="1,000,000,000,000 pixels"):
        FrameLimits().check_layout((10**6, 10**6, 3))
