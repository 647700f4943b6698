"""KernelOptions: the measured winners by default, the LOCALCHAT_* switches read in one place, a
bad value one line naming the variable; the engine builds its target with the batch invariance
a draft needs, and nothing flips it later."""

from __future__ import annotations

import dataclasses

import pytest

from engine.errors import UserError
from engine.options import KernelOptions


def test_defaults_are_the_winners_and_the_environment_turns_them_off():
    default = KernelOptions()
    assert KernelOptions.from_env({}) == default and not default.batch_invariant
    switches = {"LOCALCHAT_PDL": "pdl", "LOCALCHAT_FUSE": "fuse", "LOCALCHAT_FUSE_INVARIANT": "fuse_invariant",
                "LOCALCHAT_GATED_MLP": "gated_mlp", "LOCALCHAT_NORM_TAIL": "norm_tail",
                "LOCALCHAT_ROPE_IN_ATTENTION": "rope_in_attention", "LOCALCHAT_ROPE_IN_VERIFY": "rope_in_verify",
                "LOCALCHAT_FUSED_DRAFT": "fused_draft",
                "LOCALCHAT_LEAN_DRAFT": "lean_draft", "LOCALCHAT_TOKEN_ATTENTION": "token_attention",
                "LOCALCHAT_MTP_GRAPH": "mtp_graph", "LOCALCHAT_NORM_STATS": "norm_stats",
                "LOCALCHAT_PACKED_ROW": "packed_row", "LOCALCHAT_SHARE_SMS": "share_sms",
                "LOCALCHAT_PACKED_ONE_LAUNCH": "packed_one_launch", "LOCALCHAT_PACKED_ROUNDED_X": "packed_rounded_x",
                "LOCALCHAT_PACKED_ROUNDED_O": "packed_rounded_o", "LOCALCHAT_PACKED_EMBED": "packed_embed",
                "LOCALCHAT_PACKED_SHORT_TILES": "packed_short_tiles"}
    for name, field in switches.items():
        assert getattr(default, field) is True
        assert KernelOptions.from_env({name: "0"}) == dataclasses.replace(default, **{field: False}), name
        assert KernelOptions.from_env({name: "1"}) == default
    # each_row is off unless asked for (its verify rows cost more than its plain steps save)
    assert default.each_row is False and KernelOptions.from_env({"LOCALCHAT_EACH_ROW": "0"}) == default
    assert KernelOptions.from_env({"LOCALCHAT_EACH_ROW": "1"}) == dataclasses.replace(default, each_row=True)
    # runners-up for sampled answers: off unless asked for (on the demo they cost more than they win)
    assert default.sampled_runners_up is False and KernelOptions.from_env({"LOCALCHAT_SAMPLED_RUNNERS_UP": "0"}) == default
    assert KernelOptions.from_env({"LOCALCHAT_SAMPLED_RUNNERS_UP": "1"}) == dataclasses.replace(default,
                                                                                             sampled_runners_up=True)
    # a tree level in one launch: on since timed on a GPU (LOCALCHAT_TREE_LEVEL=0 the torch ops)
    assert default.tree_level is True and KernelOptions.from_env({"LOCALCHAT_TREE_LEVEL": "1"}) == default
    assert KernelOptions.from_env({"LOCALCHAT_TREE_LEVEL": "0"}) == dataclasses.replace(default, tree_level=False)
    # the tree step's switches: on since timed on a GPU together (LOCALCHAT_*=0 turns each off)
    for name, field in {"LOCALCHAT_ROPE_IN_TREE": "rope_in_tree", "LOCALCHAT_DRAFT_ROWS": "draft_rows",
                        "LOCALCHAT_TREE_KV_MOVE": "tree_kv_move",
                        "LOCALCHAT_TREE_SELECT_PASSES": "tree_select_passes",
                        "LOCALCHAT_TREE_LEVEL_KEYS": "tree_level_keys",
                        "LOCALCHAT_TREE_LEVEL_SPLIT": "tree_level_split"}.items():
        assert getattr(default, field) is True and KernelOptions.from_env({name: "1"}) == default
        assert KernelOptions.from_env({name: "0"}) == dataclasses.replace(default, **{field: False}), name
    # not yet timed on a GPU: off unless asked for
    assert default.tree_select_blocks is False and KernelOptions.from_env({"LOCALCHAT_TREE_SELECT_BLOCKS": "0"}) == default
    assert KernelOptions.from_env({"LOCALCHAT_TREE_SELECT_BLOCKS": "1"}) == dataclasses.replace(default,
                                                                                            tree_select_blocks=True)
    assert KernelOptions.from_env({"LOCALCHAT_ROW_GEMV": "cublas"}).qkv_gemv is False
    assert KernelOptions.from_env({"LOCALCHAT_ROW_GEMV": "qkv"}).qkv_gemv is True
    assert default.packed_prefill == "fused"
    assert default.packed_row_x == "int8" and default.packed_invariant_x == "bf16"
    for way in ("int8", "bf16"):
        assert KernelOptions.from_env({"LOCALCHAT_PACKED_ROW_X": way}).packed_row_x == way
        assert KernelOptions.from_env({"LOCALCHAT_PACKED_INVARIANT_X": way}).packed_invariant_x == way
    for way in ("dequant", "fused", "torch"):
        assert KernelOptions.from_env({"LOCALCHAT_PACKED_PREFILL": way}).packed_prefill == way
    # the one-row packed kernel's PDL: the next kernel launched after its stores (2) by default
    assert default.packed_row_pdl == 2 and default.packed_gemv_pdl == 1
    for value in (0, 1, 2):
        assert KernelOptions.from_env({"LOCALCHAT_PACKED_ROW_PDL": str(value)}).packed_row_pdl == value
        assert KernelOptions.from_env({"LOCALCHAT_PACKED_GEMV_PDL": str(value)}).packed_gemv_pdl == value
    assert default.packed_gemv_pdl_k == 2048
    assert KernelOptions.from_env({"LOCALCHAT_PACKED_GEMV_PDL_K": "65536"}).packed_gemv_pdl_k == 65536
    # its first step's weights before the wait: on by default
    assert default.packed_row_early_weights
    assert not KernelOptions.from_env({"LOCALCHAT_PACKED_ROW_EARLY_WEIGHTS": "0"}).packed_row_early_weights
    assert default.row_stats == ()
    for value, want in {"none": (), "down": ("down",), "o_proj, down": ("o_proj", "down")}.items():
        assert KernelOptions.from_env({"LOCALCHAT_ROW_STATS": value}).row_stats == want
    alts = {"": None, "auto": "auto", "0": 0, "3": 3, "2,1": (2, 1), " 2, 1, 0 ": (2, 1, 0)}
    for value, want in alts.items():
        assert KernelOptions.from_env({"LOCALCHAT_SPEC_ALTS": value}).spec_alts == want


@pytest.mark.parametrize("env,says", [({"LOCALCHAT_PDL": "off"}, "LOCALCHAT_PDL='off': use 1"),
                                      ({"LOCALCHAT_FUSE": "all"}, "LOCALCHAT_FUSE='all': use 1"),
                                      ({"LOCALCHAT_EACH_ROW": "yes"}, r"use 1 \(on\) or 0 \(off, the default\)"),
                                      ({"LOCALCHAT_MTP_GRAPH": "on"}, r"LOCALCHAT_MTP_GRAPH=.on.: use 1 \(on, the default\) or 0"),
                                      ({"LOCALCHAT_NORM_STATS": "2"}, r"LOCALCHAT_NORM_STATS=.2.: use 1 \(on, the default\) or 0"),
                                      ({"LOCALCHAT_PACKED_PREFILL": "cublas"}, "LOCALCHAT_PACKED_PREFILL='cublas': use fused or dequant or torch"),
                                      ({"LOCALCHAT_PACKED_ROW": "yes"}, r"LOCALCHAT_PACKED_ROW=.yes.: use 1 \(on, the default\)"),
                                      ({"LOCALCHAT_PACKED_ROW_X": "fp8"}, "LOCALCHAT_PACKED_ROW_X='fp8': use int8 or bf16"),
                                      ({"LOCALCHAT_PACKED_ROW_PDL": "late"}, "LOCALCHAT_PACKED_ROW_PDL='late': use a count from 0"),
                                      ({"LOCALCHAT_PACKED_ROW_PDL": "3"}, "LOCALCHAT_PACKED_ROW_PDL='3': use a count from 0"),
                                      ({"LOCALCHAT_PACKED_GEMV_PDL": "3"}, "LOCALCHAT_PACKED_GEMV_PDL='3': use a count from 0"),
                                      ({"LOCALCHAT_PACKED_GEMV_PDL_K": "-1"}, "LOCALCHAT_PACKED_GEMV_PDL_K='-1': use a count"),
                                      ({"LOCALCHAT_PACKED_INVARIANT_X": "int4"}, "LOCALCHAT_PACKED_INVARIANT_X='int4': use int8 or bf16"),
                                      ({"LOCALCHAT_ROW_GEMV": "layers"}, "LOCALCHAT_ROW_GEMV=layers was removed"),
                                      ({"LOCALCHAT_ROW_STATS": "qkv"}, "LOCALCHAT_ROW_STATS='qkv': use none"),
                                      ({"LOCALCHAT_ROW_STATS": ","}, "LOCALCHAT_ROW_STATS=','"),
                                      ({"LOCALCHAT_ROW_GEMV": "x"}, "use qkv .* or cublas"),
                                      ({"LOCALCHAT_SPEC_ALTS": "2,x"}, "LOCALCHAT_SPEC_ALTS='2,x'"),
                                      ({"LOCALCHAT_TREE_LOOKUP": "16"}, "LOCALCHAT_TREE_LOOKUP='16': use a count from 0 .off. to 15"),
                                      ({"LOCALCHAT_TREE_LOOKUP": "-1"}, "LOCALCHAT_TREE_LOOKUP='-1': use a count from 0")])
def test_a_bad_switch_is_one_line(env, says):
    with pytest.raises(UserError, match=says) as e:
        KernelOptions.from_env(env)
    assert "\n" not in str(e.value)


def test_tree_lookup_is_a_count():
    assert KernelOptions.from_env({}).tree_lookup == 12
    assert KernelOptions.from_env({"LOCALCHAT_TREE_LOOKUP": "0"}).tree_lookup == 0
    assert KernelOptions.from_env({"LOCALCHAT_TREE_LOOKUP": "12"}).tree_lookup == 12


def test_fields_are_validated_and_frozen():
    with pytest.raises(ValueError, match="spec_alts"):
        KernelOptions(spec_alts=-1)
    with pytest.raises(ValueError, match="row_tiles"):
        KernelOptions(row_tiles=(((4096, 4096), "fast"),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        KernelOptions().pdl = False


def test_the_target_gets_batch_invariance_exactly_when_a_draft_comes(tiny_models, tmp_path, monkeypatch):
    """Engine.load builds the target with batch_invariant when (and only when) a draft is loaded;
    the draft's own kernels never need it; the other switches come from the environment."""
    from engine.engine import Engine
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    monkeypatch.setenv("LOCALCHAT_NORM_TAIL", "0")
    plain = Engine.load(str(tiny_models["llama"]), device="cpu")
    assert plain.runner.model.ops.options == KernelOptions(norm_tail=False)
    cfg = read_config(tiny_models["llama"])
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64, (0, 1, 2))
    with_draft = Engine.load(str(tiny_models["llama"]), draft=str(head), device="cpu",
                             options=KernelOptions(spec_alts=1))
    assert with_draft.runner.model.ops.options == KernelOptions(spec_alts=1, batch_invariant=True)
    assert with_draft.speculator.draft.ops.options == KernelOptions(spec_alts=1)
    assert with_draft.speculator.alts == (1,) * with_draft.speculator.k
