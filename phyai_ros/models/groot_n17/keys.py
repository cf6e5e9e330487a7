"""GR00T N1.7's names in LeRobot's files: weight key prefixes and processor step names (one home for the
loader, the stages and the quantizer)."""

POLICY_TYPE = "groot"                       # config.json "type" of LeRobot's GR00T checkpoints
PREFIX = "_groot_model."
VIS = "backbone.model.model.visual."
LLM = "backbone.model.model.language_model."
EMBED = "backbone.model.lm_head.weight"     # the tied token table: LeRobot's file keeps this name only
HEAD = "action_head."
DIT = HEAD + "model."
VLSA = HEAD + "vl_self_attention.transformer_blocks."
UNUSED = (LLM + "norm.weight",)             # final RMSNorm: the features are taken before it
PACK_STEP = "groot_n1_7_pack_inputs_v1"
VLM_STEP = "groot_n1_7_vlm_encode_v1"
UNNORM_STEP = "groot_action_unpack_unnormalize_v2"
DECODE_STEP = "groot_n1_7_action_decode_v1"
