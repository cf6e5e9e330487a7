"""Camera frames to RGB: every supported encoding, padded rows, compressed formats, and clear
errors (ImageDecodeError, which the node counts as bad_image) for frames that cannot be used."""
import numpy as np
import pytest

from phyai_ros.node.images import ImageConverter, ImageDecodeError

H, W = 5, 7
RGB = np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)


def image(encoding, pixels, pad=0, **fields):
    from sensor_msgs.msg import Image
    rows = pixels.reshape(pixels.shape[0], -1)
    data = np.concatenate([rows, np.full((rows.shape[0], pad), 77, np.uint8)], axis=1)
    return Image(height=pixels.shape[0], width=pixels.shape[1], encoding=encoding, step=data.shape[1],
                 data=data.tobytes(), **fields)


def alpha(rgb):
    return np.dstack([rgb, np.full(rgb.shape[:2], 200, np.uint8)])


@pytest.mark.parametrize("pad", [0, 5])
@pytest.mark.parametrize("encoding, pixels, expected", [
    ("rgb8", RGB, RGB),
    ("bgr8", RGB[..., ::-1], RGB),
    ("rgba8", alpha(RGB), RGB),
    ("bgra8", alpha(RGB[..., ::-1]), RGB),
    ("mono8", RGB[..., 0], np.repeat(RGB[..., :1], 3, axis=2)),
])
def test_raw_encodings_to_rgb(encoding, pixels, expected, pad):
    out = ImageConverter().from_image(image(encoding, np.ascontiguousarray(pixels), pad=pad))
    assert out.dtype == np.uint8 and out.shape == (H, W, 3)
    np.testing.assert_array_equal(out, expected)


def test_big_endian_flag_is_meaningless_for_8_bit():
    np.testing.assert_array_equal(ImageConverter().from_image(image("rgb8", RGB, is_bigendian=1)), RGB)


@pytest.mark.parametrize("ext, fmt", [(".png", "png"), (".jpg", "rgb8; jpeg compressed bgr8")])
def test_compressed_to_rgb(ext, fmt):
    import cv2
    from sensor_msgs.msg import CompressedImage
    y, x = np.mgrid[0:32, 0:48]
    smooth = np.stack([np.full_like(x, 200), 40 + x, 90 + y], axis=-1).astype(np.uint8)  # distinct channels
    ok, buf = cv2.imencode(ext, smooth[..., ::-1])
    out = ImageConverter().from_compressed(CompressedImage(format=fmt, data=buf.tobytes()))
    assert ok and out.shape == smooth.shape
    tolerance = 0 if ext == ".png" else 8  # jpeg is lossy
    assert np.abs(out.astype(int) - smooth).max() <= tolerance


@pytest.mark.parametrize("msg, match", [
    (lambda: image("16UC1", np.zeros((H, W, 2), np.uint8)), "unsupported image encoding '16UC1'"),
    (lambda: image("yuv422", np.zeros((H, W, 2), np.uint8)), "unsupported image encoding"),
    (lambda: _short(), "expected step\\*height"),
    (lambda: _step_too_small(), "too small"),
    (lambda: _empty(), "empty image"),
])
def test_bad_raw_frames_raise_decode_errors(msg, match):
    with pytest.raises(ImageDecodeError, match=match):
        ImageConverter().from_image(msg())


def _short():
    m = image("rgb8", RGB)
    m.data = bytes(m.data)[:-1]
    return m


def _empty():
    from sensor_msgs.msg import Image
    return Image(height=0, width=0, encoding="rgb8", step=0, data=b"")


def _step_too_small():
    m = image("rgb8", RGB)
    m.step = W * 3 - 1
    return m


@pytest.mark.parametrize("data", [b"", b"\xff\xd8 not a jpeg at all" * 4])
def test_bad_compressed_frames_raise_decode_errors(data):
    from sensor_msgs.msg import CompressedImage
    with pytest.raises(ImageDecodeError):
        ImageConverter().from_compressed(CompressedImage(format="jpeg", data=data))


# ------------------------------------------------------------------ sizes before decoding (issue 22)
def _encoded(ext, hw, params=()):
    import cv2
    ok, buf = cv2.imencode(ext, np.zeros(hw, np.uint8), list(params))
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("ext,params,fmt", [(".png", (), "png"), (".jpg", (), "jpeg"),
                                            (".jpg", (2, 1), "jpeg")], ids=["png", "jpeg", "progressive_jpeg"])
def test_the_size_is_read_from_the_compressed_header(ext, params, fmt):   # (2, 1): IMWRITE_JPEG_PROGRESSIVE on
    from phyai_ros.node.images import compressed_size
    assert compressed_size(_encoded(ext, (37, 53, 3), params)) == (fmt, 53, 37)


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_a_decompression_bomb_is_refused_before_decoding(ext):
    """A 6000x6000 frame that compresses to little (zeros) is refused from its header: never decoded."""
    from sensor_msgs.msg import CompressedImage
    data = _encoded(ext, (6000, 6000))
    assert len(data) < 2_000_000
    converter = ImageConverter()

    class NoDecoding:
        def compressed_imgmsg_to_cv2(self, *a, **k):
            raise AssertionError("decoded before its size was checked")
    converter._bridge = NoDecoding()
    with pytest.raises(ImageDecodeError, match="image 6000x6000 .* 36,000,000 pixels, more than the limit"):
        converter.from_compressed(CompressedImage(format=ext[1:], data=data))


def test_a_raw_frame_over_the_limit_is_refused_before_conversion():
    from sensor_msgs.msg import Image
    msg = Image(height=300, width=400, encoding="mono8", step=400, data=bytes(120_000))
    with pytest.raises(ImageDecodeError, match="image 400x300 .* 120,000 pixels, more than the limit of 100,000"):
        ImageConverter(max_pixels=100_000).from_image(msg)
    assert ImageConverter(max_pixels=120_000).from_image(msg).shape == (300, 400, 3)


def test_compressed_formats_whose_size_cannot_be_read_first_are_refused():
    from sensor_msgs.msg import CompressedImage
    with pytest.raises(ImageDecodeError, match="neither PNG nor JPEG"):
        ImageConverter().from_compressed(CompressedImage(format="bmp", data=_encoded(".bmp", (8, 8, 3))))
