"""Cosmos3 config values are bounded before anything is allocated (issue 38, item 6): a modality margin of 1e30
loaded and then failed every predict, a base_fps of 1e12 ran, 1e5 layers cost seconds and most of a GB before
refusal. Every dimension and scale of the transformer, VAE and scheduler configs is range-checked where it is read
(models.files.Fields, as the pi family), one CheckpointError naming the file and the key."""
import time

import pytest

from phyai_ros.models.cosmos3.config import TransformerConfig, VaeConfig
from phyai_ros.models.cosmos3.unipc import UniPCConfig
from phyai_ros.models.files import CheckpointError

SMALL = TransformerConfig(hidden_size=64, head_dim=16, num_heads=4, num_kv_heads=2, intermediate_size=128,
                          num_layers=2, rope_axes_dim=(4, 2, 2), latent_channel=4, action_dim=8, num_domains=4,
                          vocab_size=300)


@pytest.mark.parametrize("key, value", [
    ("unified_3d_mrope_temporal_modality_margin", 10**30), ("base_fps", 10**12), ("num_hidden_layers", 10**5),
    ("hidden_size", 2**40), ("head_dim", 10**6), ("num_attention_heads", 10**6), ("num_key_value_heads", 10**6),
    ("intermediate_size", 10**9), ("latent_channel", 10**6), ("latent_patch_size", 1000), ("action_dim", 10**6),
    ("num_embodiment_domains", 10**7), ("vocab_size", 10**10), ("rope_theta", 1e300), ("timestep_scale", 1e30),
    ("rms_norm_eps", 5.0), ("unified_3d_mrope_temporal_modality_margin", -1)])
def test_a_transformer_value_out_of_range_is_refused_naming_file_and_key(tmp_path, key, value):
    cfg = {**SMALL.to_json(), key: value}
    t = time.monotonic()
    with pytest.raises(CheckpointError, match=f"transformer/config.json: {key} = .* is outside"):
        TransformerConfig.from_json(cfg, tmp_path / "transformer" / "config.json")
    assert time.monotonic() - t < 1.0
    assert TransformerConfig.from_json(SMALL.to_json(), "x") == SMALL


@pytest.mark.parametrize("key, value", [("base_dim", 10**7), ("z_dim", 10**6), ("num_res_blocks", 10**4),
                                        ("patch_size", 10**3), ("scale_factor_spatial", 2**40)])
def test_a_vae_value_out_of_range_is_refused_naming_file_and_key(key, value):
    with pytest.raises(CheckpointError, match=f"vae/config.json: {key} = .* is outside"):
        VaeConfig.from_json({**VaeConfig().to_json(), key: value}, "vae/config.json")


def test_vae_lists_and_scheduler_values_are_bounded():
    with pytest.raises(CheckpointError, match="vae/config.json: dim_mult"):
        VaeConfig.from_json({**VaeConfig().to_json(), "dim_mult": [1, 2, 4, 10**6]}, "vae/config.json")
    with pytest.raises(CheckpointError, match="vae/config.json: dim_mult"):
        VaeConfig.from_json({**VaeConfig().to_json(), "dim_mult": [1] * 100, "temperal_downsample": [False] * 99},
                            "vae/config.json")
    good = UniPCConfig().to_json()
    for key, value in (("num_train_timesteps", 10**12), ("flow_shift", 1e300)):
        with pytest.raises(CheckpointError, match="scheduler_config.json: .*out of range"):
            UniPCConfig.from_json({**good, key: value}, "scheduler/scheduler_config.json")
