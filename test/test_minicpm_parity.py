"""MiniCPM-Robot parity against set A (shared/fixtures/minicpm_parity, README there: transformers 5.7.0's
MiniCPM-V 4.6 + LeRobot 0.6.1's GR00T head parts), CPU float32: through predict from the set's files, every
recorded intermediate, the preprocessing bit for bit, the gated delta rule's two forms, and the checkpoint layouts
the loader maps (released 3-D banks, single-embodiment Linears, remote-code names).
"""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from fixture_sets import minicpm_fixture_dir
from phyai_ros import predict
from phyai_ros.models import checkpoint_type
from phyai_ros.models.files import CheckpointError
from phyai_ros.models.minicpm import gated_delta
from phyai_ros.models.minicpm.adapter import MiniCpmAdapter
from phyai_ros.models.minicpm.processor import level_table, resize_pil
from phyai_ros.models.minicpm.vision import position_ids

SET = minicpm_fixture_dir()
TOL = 1e-4
pytestmark = pytest.mark.skipif(not (SET / "expected.safetensors").is_file(),
                                reason=f"MiniCPM-Robot parity set not found at {SET}")


@pytest.fixture(scope="module")
def policy():
    return MiniCpmAdapter.load(SET)


def case_facts(meta, name):
    return next(c for c in meta["cases"] if c["name"] == name)


def raw_frames(meta, name):
    cams = sorted(case_facts(meta, name)["cams"], key=lambda c: (c["item"], c["cam"]))
    return [np.asarray(Image.open(SET / c["file"]).convert("RGB")) for c in cams]


@pytest.fixture(scope="module")
def e2e(policy, meta, inp):
    """a0_e2e's prepared inputs and its eager trace."""
    facts = case_facts(meta, "a0_e2e")
    inputs = policy.prepare(raw_frames(meta, "a0_e2e"), inp["a0_e2e.state"][:, 0].numpy(),
                            [i["instruction"] for i in facts["items"]], facts["embodiment_id"])
    return inputs, policy.trace(inputs, inp["a0_e2e.noise"])


def maxabs(a, b):
    return (a.detach().float().cpu() - b.float()).abs().max().item()


@pytest.mark.parametrize("case", ["a0_e2e", "a1_head_only"])
def test_predict_from_the_sets_files(case, tmp_path, capsys):
    """The issue's command: raw PNGs -> PIL resize -> processor -> backbone -> head, the set's key names out."""
    out = tmp_path / "out.safetensors"
    rc = predict.main(["--checkpoint", str(SET), "--inputs", str(SET / "inputs.safetensors"), "--tasks-json",
                       str(SET / "config.json"), "--expected", str(SET / "expected.safetensors"), "--case", case,
                       "--output", str(out), "--tolerance", str(TOL)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert f"max-abs actions vs {case}.actions:" in printed
    got, want = load_file(str(out)), load_file(str(SET / "expected.safetensors"))
    assert maxabs(got[f"{case}.actions"], want[f"{case}.actions"]) <= TOL
    if case == "a0_e2e":
        assert maxabs(got["a0_e2e.vl_embs"], want["a0_e2e.vl_embs"]) <= TOL
        assert torch.equal(got["a0_e2e.proc.input_ids"], want["a0_e2e.proc.input_ids"])


def test_the_set_is_recognised_as_minicpm():
    """An untyped config.json beside a MiniCPM-V backbone config is this family's, not pi0.5's (which loads
    untyped configs too)."""
    assert checkpoint_type(SET) == "minicpm_robot"


def test_preprocessing_bit_for_bit(policy, meta, exp, e2e):
    inputs, _ = e2e
    for cam in case_facts(meta, "a0_e2e")["cams"]:
        raw = np.asarray(Image.open(SET / cam["file"]).convert("RGB"))
        resized = np.asarray(Image.open(SET / cam["resized_file"]).convert("RGB"))
        assert np.array_equal(resize_pil(raw, policy.settings), resized), cam["file"]
    table = level_table(policy.settings)
    assert torch.equal(table[0], exp["a0_e2e.proc.pixel_values_lut"])
    # the packed NaViT layout of the reference, from our uint8 frames and level table
    frames = inputs.frames.permute(0, 3, 1, 2).long()
    pixels = torch.stack([table[c][frames[:, c]] for c in range(3)], 1)       # [F, 3, H, W]
    f, _, h, w = pixels.shape
    p = 14
    packed = pixels.reshape(f, 3, h // p, p, w // p, p).permute(1, 3, 0, 2, 4, 5).reshape(3, p, -1)
    digest = hashlib.sha256(packed[None].contiguous().numpy().astype(np.float32).tobytes()).hexdigest()
    assert digest == case_facts(meta, "a0_e2e")["pixel_values_f32_sha256"]
    assert torch.equal(inputs.input_ids.cpu(), exp["a0_e2e.proc.input_ids"])
    assert inputs.prompts == case_facts(meta, "a0_e2e")["prompt_text"]


def test_vision_intermediates(e2e, exp):
    _, trace = e2e
    assert torch.equal(position_ids(32, 32, 8).repeat(2), exp["a0_e2e.vision.pos_ids"])
    pairs = {"vision.embeddings": "vision.embeddings", "vision.vit_merger": "vision.vit_merger",
             "vision.post_layernorm": "vision.post_layernorm", "vision.merger_features": "vision.merger_features"}
    pairs.update({f"vision.layer{i}": f"vision.layer{i}" for i in range(4)})
    for ours, theirs in pairs.items():
        want = exp["a0_e2e." + theirs]
        got = trace[ours].reshape(want.shape)
        assert maxabs(got, want) <= TOL * max(1.0, want.abs().max().item()), ours


def test_text_intermediates(e2e, exp):
    _, trace = e2e
    keys = [k[len("a0_e2e."):] for k in exp if k.startswith("a0_e2e.text.")]
    assert len(keys) > 60
    for key in keys:
        want = exp["a0_e2e." + key]
        got = trace[key].reshape(want.shape)
        assert maxabs(got, want) <= TOL * max(1.0, want.abs().max().item()), key


@pytest.mark.parametrize("case", ["a0_e2e", "a1_head_only"])
def test_head_intermediates(case, policy, e2e, exp, inp):
    if case == "a0_e2e":
        _, trace = e2e
    else:
        trace = {}
        obs = {"attention_mask": torch.ones(1, 9, dtype=torch.int64), "state": inp[case + ".state"][:, 0],
               "embodiment_id": inp[case + ".embodiment_id"]}
        policy._head_trace(obs, inp[case + ".vl_embs"], inp[case + ".noise"], trace)
    keys = [k[len(case) + 1:] for k in exp if k.startswith(case + ".head.")]
    assert len(keys) == 4 * (10 + 4)   # 10 records per step, 4 blocks
    for key in keys:
        want = exp[f"{case}.{key}"]
        if want.dtype == torch.int64:
            assert torch.equal(trace[key], want), key
            continue
        assert maxabs(trace[key], want) <= TOL * max(1.0, want.abs().max().item()), key
    assert maxabs(trace["actions"], exp[case + ".actions"]) <= TOL


def _torch_chunk_reference(q, k, v, g, beta, chunk=64):
    """The chunked rule as the reference writes it (row-by-row triangular solve), for the check below."""
    q, k = gated_delta.l2norm(q), gated_delta.l2norm(k)
    q, k, v, beta, g = [x.transpose(1, 2).float() for x in (q, k, v, beta, g)]
    b, h, s, dk = k.shape
    pad = (-s) % chunk
    q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = torch.nn.functional.pad(beta, (0, pad)), torch.nn.functional.pad(g, (0, pad))
    q = q * dk ** -0.5
    vb, kb = v * beta[..., None], k * beta[..., None]
    q, k, v, kb, vb = (x.reshape(b, h, -1, chunk, x.shape[-1]) for x in (q, k, v, kb, vb))
    g = g.reshape(b, h, -1, chunk).cumsum(-1)
    decay = ((g[..., :, None] - g[..., None, :]).tril().exp()).tril()
    attn = -((kb @ k.transpose(-1, -2)) * decay).masked_fill(torch.ones(chunk, chunk, dtype=torch.bool).triu(), 0)
    for i in range(1, chunk):
        row, sub = attn[..., i, :i].clone(), attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row[..., None] * sub).sum(-2)
    attn = attn + torch.eye(chunk)
    value, kcum = attn @ vb, attn @ (kb * g.exp()[..., None])
    st = torch.zeros(b, h, dk, v.shape[-1])
    out = torch.zeros_like(value)
    for i in range(value.shape[2]):
        a = q[:, :, i] @ k[:, :, i].transpose(-1, -2) * decay[:, :, i]
        fresh = value[:, :, i] - kcum[:, :, i] @ st
        out[:, :, i] = (q[:, :, i] * g[:, :, i, :, None].exp()) @ st + a @ fresh
        st = st * g[:, :, i, -1, None, None].exp() + (k[:, :, i] * (g[:, :, i, -1, None] - g[:, :, i]).exp()[..., None]
                                                      ).transpose(-1, -2) @ fresh
    return out.reshape(b, h, -1, v.shape[-1])[:, :, :s].transpose(1, 2)


@pytest.mark.parametrize("shape", [(1, 197, 2, 8, 8), (2, 130, 4, 32, 16), (1, 64, 1, 16, 8), (1, 3, 2, 8, 8)])
def test_gated_delta_rule_forms_agree(shape):
    """Our chunked form (matrix-product inverse) = the reference's row-by-row chunked form = the recurrence, over
    several chunks, a chunk exactly, and less than one."""
    b, s, h, dk, dv = shape
    gen = torch.Generator().manual_seed(s)
    q, k = torch.randn(b, s, h, dk, generator=gen), torch.randn(b, s, h, dk, generator=gen)
    v = torch.randn(b, s, h, dv, generator=gen)
    g, beta = -torch.rand(b, s, h, generator=gen) * 2, torch.rand(b, s, h, generator=gen)
    chunked, state_c = gated_delta.chunked(q, k, v, g, beta)
    recurrent, state_r = gated_delta.recurrent(q, k, v, g, beta)
    reference = _torch_chunk_reference(q, k, v, g, beta)
    assert maxabs(chunked, reference) < 1e-5
    assert maxabs(chunked, recurrent) < 1e-5
    assert maxabs(state_c, state_r) < 1e-5


def test_unit_lower_inverse():
    gen = torch.Generator().manual_seed(0)
    for c in (1, 2, 5, 64, 100):
        lower = (torch.randn(3, c, c, generator=gen) * 0.3).tril(-1)
        inv = gated_delta.unit_lower_inverse(lower)
        exact = torch.linalg.solve_triangular(torch.eye(c) + lower, torch.eye(c).expand(3, c, c), upper=False)
        assert maxabs(inv, exact) < 1e-5 * max(1.0, exact.abs().max().item())


def _copy_set(tmp_path) -> Path:
    dst = tmp_path / "set"
    shutil.copytree(SET, dst)
    for f in dst.rglob("*"):
        f.chmod(0o644 if f.is_file() else 0o755)
    return dst


def test_released_layouts_load_to_the_same_model(tmp_path, exp, inp):
    """Remote-code backbone names (mapped, unverified against a real checkpoint) and a single-embodiment
    checkpoint whose bank layers are Linears give the same actions as the set's own names and bank."""
    dst = _copy_set(tmp_path)
    sd = load_file(str(dst / "weights.safetensors"))
    renamed = {}
    for k, v in sd.items():
        for new, old in (("vlm.vpm.", "model.vision_tower."), ("vlm.resampler.", "model.merger."),
                         ("vlm.llm.model.", "model.language_model.")):
            if k.startswith(old):
                k = new + k[len(old):]
        renamed[k] = v
    bank = int(inp["a1_head_only.embodiment_id"][0])
    for layer in ("action_encoder.W1", "action_encoder.W2", "action_encoder.W3", "action_decoder.layer1",
                  "action_decoder.layer2"):
        w, b = renamed.pop(f"action_head.{layer}.W"), renamed.pop(f"action_head.{layer}.b")
        renamed[f"action_head.{layer}.weight"] = w[bank].t().contiguous()
        renamed[f"action_head.{layer}.bias"] = b[bank].clone()
    (dst / "weights.safetensors").unlink()
    save_file(renamed, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["head"]["num_embodiments"] = 1
    (dst / "config.json").write_text(json.dumps(cfg))
    policy = MiniCpmAdapter.load(dst)
    assert policy.config.head.num_embodiments == 1
    trace = {}
    obs = {"attention_mask": torch.ones(1, 9, dtype=torch.int64), "state": inp["a1_head_only.state"][:, 0],
           "embodiment_id": torch.zeros(1, dtype=torch.int64)}
    actions = policy._head_trace(obs, inp["a1_head_only.vl_embs"], inp["a1_head_only.noise"], trace)
    assert maxabs(actions, exp["a1_head_only.actions"]) <= TOL


def test_bad_checkpoints_name_what_is_wrong(tmp_path):
    dst = _copy_set(tmp_path)
    sd = load_file(str(dst / "weights.safetensors"))
    sd["action_head.action_encoder.W2.W"] = sd["action_head.action_encoder.W2.W"][:, :-1].contiguous()
    save_file(sd, str(dst / "weights.safetensors"))
    with pytest.raises(CheckpointError, match="action_encoder.W2.W"):
        MiniCpmAdapter.load(dst)
    dst2 = _copy_set(tmp_path / "b")
    cfg = json.loads((dst2 / "backbone_config.json").read_text())
    cfg["text_config"]["num_hidden_layers"] = 10 ** 6
    (dst2 / "backbone_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="num_hidden_layers"):
        MiniCpmAdapter.load(dst2)
    dst3 = _copy_set(tmp_path / "c")
    sd = load_file(str(dst3 / "weights.safetensors"))
    sd["model.language_model.norm.weight"][0] = float("nan")
    save_file(sd, str(dst3 / "weights.safetensors"))
    with pytest.raises(CheckpointError, match="non-finite"):
        MiniCpmAdapter.load(dst3)


def test_predict_refuses_a_tampered_frame(tmp_path, capsys):
    dst = _copy_set(tmp_path)
    frame = dst / "frames" / "a0_e2e_item0_cam1.png"
    Image.fromarray(np.zeros((240, 320, 3), np.uint8)).save(frame)
    rc = predict.main(["--checkpoint", str(dst), "--inputs", str(dst / "inputs.safetensors"), "--tasks-json",
                       str(dst / "config.json"), "--case", "a0_e2e", "--output", str(tmp_path / "o.safetensors")])
    assert rc == 2
    assert "sha256" in capsys.readouterr().err


def test_predict_refuses_a_camera_file_outside_the_set_and_an_oversized_one(tmp_path, capsys):
    """A case's file names come from outside: one leading out of the set's folder, or a PNG whose header says it is
    larger than a frame may be, is refused on one line before anything is decoded."""
    dst = _copy_set(tmp_path)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["cases"][0]["cams"][0]["file"] = "../outside.png"
    cfg["cases"][0]["cams"][0].pop("sha256")
    (dst / "config.json").write_text(json.dumps(cfg))
    argv = ["--checkpoint", str(dst), "--inputs", str(dst / "inputs.safetensors"), "--tasks-json",
            str(dst / "config.json"), "--case", "a0_e2e", "--output", str(tmp_path / "o.safetensors")]
    assert predict.main(argv) == 2
    assert "not inside" in capsys.readouterr().err
    Image.new("RGB", (9000, 1)).save(dst / "frames" / "huge.png")
    cfg["cases"][0]["cams"][0]["file"] = "frames/huge.png"
    (dst / "config.json").write_text(json.dumps(cfg))
    assert predict.main(argv) == 2
    assert "larger than 8192 px" in capsys.readouterr().err


def test_views_of_extreme_aspect_and_size_still_make_finite_chunks():
    """Any frame the node's intake accepts is usable: every view is squashed to 448 x 448, whatever its shape."""
    policy = MiniCpmAdapter.load(SET, camera_names=["a", "b"])
    rng = np.random.default_rng(0)
    for shapes in (((1, 300), (300, 1)), ((2160, 4096), (2, 2))):
        images = {n: rng.integers(0, 256, (*s, 3), dtype=np.uint8) for n, s in zip("ab", shapes)}
        assert np.isfinite(policy.predict(images, np.zeros(6, np.float32), "pick")).all()
