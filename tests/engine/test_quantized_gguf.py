"""GGUF files of every supported block type load through PackedWeight and the torch references: the
same weights and greedy tokens as dequantizing with the gguf package (the path before packed
weights), and the same tokens as transformers loading the file; other types are refused in one line."""

import json
import shutil

import numpy as np
import pytest
import torch

from engine import Engine
from engine.errors import ModelLoadError
from engine.types import SamplingParams
from engine.weights.gguf_blocks import BLOCKS
from tests.tiny_gguf import make_tiny_gguf

KINDS = list(BLOCKS)
PROMPT_IDS = list(range(3, 30))
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One tiny Llama (hidden 256: k-quant blocks span 256 inputs) that every file is written from."""
    return tmp_path_factory.mktemp("quantized-gguf")


def _file(work, kind: str):
    path = work / kind / f"tiny-{kind}.gguf"
    if not path.exists():
        path.parent.mkdir()
        make_tiny_gguf(path, work / "model", qtype=kind, hidden=256)
    return path


def _greedy(engine: Engine) -> list[int]:
    engine.tokenizer.eos_token_ids = frozenset()  # random weights: never stop early
    return [t for ev in engine.stream_ids(PROMPT_IDS, SamplingParams(max_tokens=MAX_TOKENS)) for t in ev.token_ids]


def _with_gguf_dequantize(path, out):
    """The file as loading it dequantized it before: every tensor through gguf.quants.dequantize,
    Llama q/k rows put back in HF order, written as a float32 folder with the file's config."""
    import gguf
    from safetensors.torch import save_file

    from engine.weights.gguf import hf_config, hf_name

    reader = gguf.GGUFReader(str(path))
    cfg = hf_config(reader, path)
    tensors = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        name = hf_name(t.name)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if ".q_proj." in name else cfg["num_key_value_heads"]
            arr = arr.reshape(heads, arr.shape[0] // heads // 2, 2, *arr.shape[1:]).swapaxes(1, 2).reshape(arr.shape)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg))
    hf = path.parent.parent / "model" / "hf"  # the tokenizer the file was written with
    for f in hf.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_each_block_type_loads_as_the_gguf_package_dequantizes_it(kind, work):
    path = _file(work, kind)
    ours = Engine.load(str(path), device="cpu")
    assert ours.weights == kind
    before = Engine.load(str(_with_gguf_dequantize(path, path.parent / "dequantized")), device="cpu")
    theirs = dict(before.runner.model.named_parameters())
    for name, p in ours.runner.model.named_parameters():
        assert torch.equal(p, theirs[name]), name  # bit for bit
    tokens = _greedy(ours)
    assert tokens == _greedy(before)
    assert len(set(tokens)) > 3  # a degenerate run would prove little


def _transformers_greedy(path) -> list[int]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    x = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(PROMPT_IDS):].tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_each_block_type_gives_transformers_tokens(kind, work):
    path = _file(work, kind)
    assert _greedy(Engine.load(str(path), device="cpu")) == _transformers_greedy(path)


def test_a_prepared_copy_remembers_the_files_weight_format(work):
    path = _file(work, "Q5_K")
    Engine.load(str(path), device="cpu")
    again = Engine.load(str(path), device="cpu")  # from the prepared folder this time
    assert again.weights == "Q5_K"


def _with_one_tensor_of(work, tmp_path, qtype):
    """The Q8_0 test model with blk.1.ffn_up.weight replaced by zero bytes of `qtype`."""
    import gguf

    src = gguf.GGUFReader(str(_file(work, "Q8_0")))
    path = tmp_path / f"{qtype.name}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for field in src.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        w.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in src.tensors:
        if t.name == "blk.1.ffn_up.weight":
            rows, cols = int(t.shape[1]), int(t.shape[0])
            nbytes = gguf.quants.quant_shape_to_byte_shape((rows, cols), qtype)
            w.add_tensor(t.name, np.zeros(nbytes, dtype=np.uint8), raw_dtype=qtype)
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_type_only_gguf_reads_loads_through_its_dequantize(work, tmp_path):
    """IQ2_XS has no packed reference here: it loads as floats through gguf-py, as it did before
    packed weights existed (IQ4_XS and friends are common in the wild)."""
    import gguf

    path = _with_one_tensor_of(work, tmp_path, gguf.GGMLQuantizationType.IQ2_XS)
    e = Engine.load(str(path), device="cpu")
    reader = gguf.GGUFReader(str(path))
    raw = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    want = torch.from_numpy(gguf.quants.dequantize(np.asarray(raw.data), raw.tensor_type)).float()
    up = e.runner.model.state_dict()["model.layers.1.mlp.gate_up_proj.weight"].chunk(2)[1]
    assert torch.equal(up, want.reshape(up.shape))


def test_a_type_gguf_cannot_read_is_refused_in_one_line(work, tmp_path):
    """Q8_1 (llama.cpp's activation type) is refused before any tensor is read."""
    import gguf

    path = _with_one_tensor_of(work, tmp_path, gguf.GGMLQuantizationType.Q8_1)
    with pytest.raises(ModelLoadError) as e:
        Engine.load(str(path), device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and "Q8_1" in msg and "blk.1.ffn_up.weight" in msg and "not supported" in msg


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_K", "Q6_K", "Q8_0", "F32"])
def test_projections_kept_packed_decode_as_the_dequantized_model(kind, work, monkeypatch):
    """With packing on (a GPU's default; forced here on the CPU, where a PackedLinear dequantizes
    for each call), every decoder-layer projection is a PackedLinear over the file's blocks, and
    the logits and greedy tokens are those of the model dequantized at load, bit for bit; the
    engine without its draft shares the packed weights."""
    import engine.loader as loader
    from engine.packed_linear import PackedEmbedding, PackedLinear

    path = _file(work, kind)
    plain = Engine.load(str(path), device="cpu")
    monkeypatch.setattr(loader, "packs_weights", lambda device, dtype, options, *rest: True)
    packed = Engine.load(str(path), device="cpu")
    layer = packed.runner.model.model.layers[0]
    assert not any(p.is_meta for p in packed.runner.model.parameters())  # built on meta, all filled
    if kind == "F32":  # nothing to pack: the projections built on meta got their floats
        assert packed.runs_as == "fp32" and isinstance(layer.self_attn.qkv_proj, torch.nn.Linear)
        assert _greedy(packed) == _greedy(plain)
        return
    assert packed.weights == packed.runs_as == kind and plain.runs_as == "fp32"
    linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    assert all(isinstance(m, PackedLinear) and m.format == kind for m in linears)
    assert isinstance(packed.runner.model.lm_head, PackedLinear)  # untied here: packed too
    embed = packed.runner.model.model.embed_tokens
    assert isinstance(embed, PackedEmbedding) and embed.format == kind
    ids = torch.tensor([[5, 0, 5], [383, 17, 2]])
    assert torch.equal(embed(ids), plain.runner.model.model.embed_tokens(ids))
    hidden = torch.randn(5, layer.self_attn.qkv_proj.in_features, generator=torch.Generator().manual_seed(0))
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj"):
        ours, theirs = layer.get_submodule(name), plain.runner.model.model.layers[0].get_submodule(name)
        assert torch.equal(ours(hidden), theirs(hidden)), name  # the same floats, bit for bit
    assert _greedy(packed) == _greedy(plain)
    twin = packed.runner.model.with_options(packed.runner.model.ops.options)
    shared = twin.model.layers[0].self_attn.qkv_proj
    assert isinstance(shared, PackedLinear) and shared.q0.data_ptr() == layer.self_attn.qkv_proj.q0.data_ptr()


def test_packing_is_asked_for_or_needed(monkeypatch):
    """A GPU packs quantized projections when told to (LOCALCHAT_PACKED_WEIGHTS=1), never when told
    not to, and by default only when the dense model (weights, KV cache, 1 GiB) would not fit in
    its free memory; the CPU never does."""
    import engine.loader as loader
    from engine.config import ModelConfig
    from engine.options import KernelOptions
    from engine.errors import UserError

    cfg = ModelConfig.from_hf({"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 256,
                               "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "max_position_embeddings": 64}, "tiny")
    dense = loader.dense_bytes(cfg, torch.bfloat16)
    assert dense == 2 * (2 * (256 * (256 + 2 * 128) + 256 * 256 + 3 * 256 * 512) + 2 * 1000 * 256)
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    monkeypatch.setattr(loader, "_has_triton", lambda: True)
    for free, want in ((dense + 2**30, True), (10 * dense + 2 * 2**30, False)):  # + a KV cache and 1 GiB
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, free=free: (free, 100 * dense))
        assert loader.packs_weights(cuda, bf16, KernelOptions(), cfg) is want
        assert loader.packs_weights(cuda, bf16, KernelOptions(packed_weights=True), cfg) is True
        assert loader.packs_weights(cuda, bf16, KernelOptions(packed_weights=False), cfg) is False
        assert loader.packs_weights(torch.device("cpu"), torch.float32, KernelOptions(packed_weights=True), cfg) is False
    assert KernelOptions.from_env({}).packed_weights is None
    assert KernelOptions.from_env({"LOCALCHAT_PACKED_WEIGHTS": "1"}).packed_weights is True
    assert KernelOptions.from_env({"LOCALCHAT_PACKED_WEIGHTS": "0"}).packed_weights is False
    with pytest.raises(UserError):
        KernelOptions.from_env({"LOCALCHAT_PACKED_WEIGHTS": "yes"})


def test_with_no_draft_a_model_the_one_row_kernel_runs_packs_even_where_it_fits(monkeypatch, tmp_path):
    """Auto, with no draft loaded (batch_invariant off) and the one-row kernel on, a model at least
    three quarters of whose projection weights that kernel would run (any GGUF block type, AWQ or
    GPTQ, a K that fills its steps) packs though the dense model fits; with a draft, the one-row
    kernel off, or a smaller share, only the memory rule packs. The shares: GGUF by tensor type
    and K, AWQ/GPTQ by K, FP8 none."""
    from types import SimpleNamespace as NS

    import engine.loader as loader
    from engine.config import ModelConfig
    from engine.options import KernelOptions
    cfg = ModelConfig.from_hf({"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 256,
                               "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "max_position_embeddings": 64}, "tiny")
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    monkeypatch.setattr(loader, "_has_triton", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**40, 2**40))  # the dense model fits
    assert loader.packs_weights(cuda, bf16, KernelOptions(), cfg, None, 0.75) is True
    assert loader.packs_weights(cuda, bf16, KernelOptions(), cfg, None, 0.74) is False
    assert loader.packs_weights(cuda, bf16, KernelOptions(batch_invariant=True), cfg, None, 1.0) is False
    assert loader.packs_weights(cuda, bf16, KernelOptions(packed_row=False), cfg, None, 1.0) is False
    assert loader.packs_weights(cuda, bf16, KernelOptions(packed_weights=False), cfg, None, 1.0) is False
    assert loader.packs_weights(torch.device("cpu"), torch.float32, KernelOptions(), cfg, None, 1.0) is False

    def tensor(name, shape, kind):  # as gguf-py lists it: (K, N)
        return NS(name=name, shape=shape, n_elements=int(np.prod(shape)), tensor_type=NS(name=kind))

    def file(kinds, k=4096, down_k=14336, layers=32):  # kinds: the layers' q and up, down, lm_head
        blk = [[tensor(f"blk.{i}.attn_q.weight", (k, k), kinds[0]), tensor(f"blk.{i}.ffn_up.weight", (k, down_k), kinds[0]),
                tensor(f"blk.{i}.ffn_down.weight", (down_k, k), kinds[1]), tensor(f"blk.{i}.attn_norm.weight", (k,), "F32")]
               for i in range(layers)]
        return NS(tensors=[tensor("token_embd.weight", (k, 32000), "Q4_K"), tensor("output.weight", (k, 32000), kinds[2]),
                           *(t for ts in blk for t in ts)])

    one = file(["Q4_K", "Q4_K", "F16"], layers=1)
    assert loader.gguf_one_row_share(one) == pytest.approx((4096 * 4096 + 2 * 4096 * 14336)
                                                           / (4096 * 36096 + 2 * 4096 * 14336))
    # every block type counts (an 8B's Q4_K_M mix, Q8_0), over K of 2,048 and more (Qwen2.5-7B's
    # 3,584 too); float tensors do not, nor a small model's K
    assert loader.gguf_one_row_share(file(["Q4_K", "Q6_K", "Q6_K"])) == 1.0
    assert loader.gguf_one_row_share(file(["Q8_0", "Q8_0", "Q8_0"])) == 1.0
    assert loader.gguf_one_row_share(file(["Q4_K", "Q4_K", "Q4_K"], k=3584, down_k=18944)) == 1.0
    assert loader.gguf_one_row_share(file(["Q4_K", "F16", "F16"])) < loader.ONE_ROW_SHARE
    assert loader.gguf_one_row_share(file(["Q4_0", "Q4_0", "Q4_0"], k=576, down_k=1536)) == 0.0  # K too short
    tiny = make_tiny_gguf(tmp_path / "tiny-q4.gguf", tmp_path / "work", qtype="Q4_0", hidden=64)
    from engine.weights.gguf import open_gguf
    assert loader.gguf_one_row_share(open_gguf(tiny)) == 0.0  # a real file's tensor list; K = 64 too short

    def folder(method, hidden, inter, group=128):
        quant = {"quant_method": method, "bits": 4, "group_size": group, "version": "gemm", "zero_point": True}
        if method == "fp8":
            quant = {"quant_method": "fp8", "activation_scheme": "dynamic"}
        return ModelConfig.from_hf({"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": hidden,
                                    "intermediate_size": inter, "num_hidden_layers": 2, "num_attention_heads": 32,
                                    "num_key_value_heads": 8, "max_position_embeddings": 64,
                                    "quantization_config": quant}, "folder")

    assert loader.quant_one_row_share(folder("awq", 4096, 14336)) == 1.0
    assert loader.quant_one_row_share(folder("awq", 3584, 18944)) == 1.0
    assert loader.quant_one_row_share(folder("awq", 576, 1536)) == 0.0
    # FP8: one scale a row, the kernel's chunks 512 wide; on a GPU without FP8 it is dequantized
    assert loader.quant_one_row_share(folder("fp8", 4096, 14336)) == 1.0
    assert loader.quant_one_row_share(folder("fp8", 3584, 18944)) == 1.0
    assert loader.quant_one_row_share(folder("fp8", 4096, 14336), fp8=False) == 0.0
    assert loader.quant_one_row_share(folder("fp8", 576, 1536)) == 0.0
    assert loader.quant_one_row_share(cfg) == 0.0


@pytest.mark.parametrize("kind", ["Q4_K", "Q8_0", "F32"])
def test_tied_embeddings_kept_packed_serve_as_lm_head_too(kind, tmp_path, monkeypatch):
    """A file without output.weight (lm_head tied to token_embd): packed, the embeddings are one
    PackedEmbedding and lm_head a PackedLinear over the very same blocks; the greedy tokens are
    those of the model dequantized at load; a float token_embd in such a file is allocated and
    still tied."""
    import engine.loader as loader
    from engine.packed_linear import PackedEmbedding, PackedLinear

    path = tmp_path / f"tied-{kind}.gguf"
    make_tiny_gguf(path, tmp_path / "model", qtype=kind, hidden=256, tied=True)
    plain = Engine.load(str(path), device="cpu")
    assert plain.runner.model.config.tie_word_embeddings
    monkeypatch.setattr(loader, "packs_weights", lambda device, dtype, options, *rest: True)
    packed = Engine.load(str(path), device="cpu")
    model = packed.runner.model
    if kind == "F32":  # built on meta for packing, filled with floats: allocated, and lm_head still reads it
        assert model.lm_head.weight is model.model.embed_tokens.weight and not model.lm_head.weight.is_meta
        assert _greedy(packed) == _greedy(plain)
        return
    assert isinstance(model.model.embed_tokens, PackedEmbedding) and isinstance(model.lm_head, PackedLinear)
    assert model.lm_head.q0.data_ptr() == model.model.embed_tokens.q.data_ptr()  # one table, not two
    assert _greedy(packed) == _greedy(plain)
    twin = model.with_options(model.ops.options)
    assert twin.model.embed_tokens.q.data_ptr() == model.model.embed_tokens.q.data_ptr()
    assert twin.lm_head.q0.data_ptr() == model.model.embed_tokens.q.data_ptr()


def test_a_draft_speculates_over_packed_tied_embeddings(tmp_path, monkeypatch):
    """An EAGLE-3 head that reads its target's embeddings, over a target whose embeddings (and tied
    lm_head) are kept packed: greedy speculation gives plain decoding's tokens, and the head's
    embeddings are the target's PackedEmbedding."""
    import engine.loader as loader
    from engine.options import KernelOptions
    from engine.packed_linear import PackedEmbedding
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    path = tmp_path / "tied-Q8_0.gguf"
    make_tiny_gguf(path, tmp_path / "model", qtype="Q8_0", hidden=256, tied=True)
    cfg = read_config(tmp_path / "model" / "hf")
    # the target's width: the head owns no embeddings and reads the target's
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(256, 256, 3, cfg["vocab_size"], 200, seed=3),
                      256, (0, 1, 2))
    monkeypatch.setattr(loader, "packs_weights", lambda device, dtype, options, *rest: True)
    engine = Engine.load(str(path), draft=str(head), device="cpu", options=KernelOptions(spec_alts=1))
    assert isinstance(engine.runner.model.model.embed_tokens, PackedEmbedding)
    assert engine.speculator.embed is engine.runner.model.model.embed_tokens
    engine.tokenizer.eos_token_ids = frozenset()
    params = SamplingParams(max_tokens=MAX_TOKENS)
    plain = [t for ev in engine.stream_ids(PROMPT_IDS, params, speculative=False) for t in ev.token_ids]
    events = list(engine.stream_ids(PROMPT_IDS, params, speculative=True))
    assert [t for ev in events for t in ev.token_ids] == plain and events[-1].stats.verify_steps > 0
