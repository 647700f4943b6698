"""Writes a tiny random-weight Llama whose tokenizer is word-level over plain English words and Markdown marks,
for measuring the chat app's cost to the engine on a CPU (bench_ui.py):

    python benchmarks/tiny_words_model.py /tmp/words
    OMP_NUM_THREADS=1 python benchmarks/bench_ui.py --model /tmp/words --device cpu --no-spec

Decoding it takes about a millisecond a token on one core, about what the demo model takes on an H200, so
the app's per-answer and per-token overhead shows as it does there (on a CPU it costs the engine more: the
engine thread holds the GIL most of the time). Greedy output decodes to valid text (random words, lists,
headings), never ends early and never holds back partial characters, unlike a random byte-level model.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORDS = """the a of and to in is it that was he for on are as with his they at be this from have or by one had
not but what all were when we there can an your which their said if do will each about how up out them then
she many some so these would other into has more her two like him see time could no make than first been its
who now people my made over did down only way find use may water long little very after words called just
where most know get through back much go good new write our me man too any day same right look think also
around another came come work three word must because does part even place well such here take why things
help put years different away again off went old number great tell men say small every found still between
name should home big give air line set own under read last never us left end along while might next sound
below saw something thought both few those always looked show large often together asked house world going
want school important until form food keep children feet land side without boy once animals life enough took
sometimes four head above kind began almost live page got earth need far hand high year mother light parts
country father let night following picture being study second eyes soon times story boys since white days
ever paper hard near sentence better best across during today others however sure means knew try told young
miles sun ways thing whole hear example heard several change answer room sea against top turned learn point
city play toward five using himself usually robot paint rainbow autumn leaves poem colour sky rain""".split()
MARKS = ["\n", "\n\n", "#", "##", "-", "*", "**", "1.", "2.", "`", ",", ".", "!", "?", ":"]


def make(folder: Path, hidden: int = 128, layers: int = 4) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.tiny import CHAT_TEMPLATE

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for w in MARKS + WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    cfg = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.2,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight[:3] = 0  # special tokens score 0: greedy decoding never picks them
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


if __name__ == "__main__":
    print(make(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-words")))
