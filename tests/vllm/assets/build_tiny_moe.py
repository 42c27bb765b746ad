"""Builds the tiny random-weight Qwen3-MoE checkpoint the real-vLLM tests serve.

Run with the vllm venv's Python (it has torch, transformers and tokenizers):

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python tests/vllm/assets/build_tiny_moe.py OUT_DIR

Nothing is downloaded. The tokenizer is a byte-level BPE trained on this Python's own
standard library sources, wrapped with ChatML special tokens and a ChatML chat template; the
model is Qwen3MoeForCausalLM (2 layers, hidden 128, 8 experts top-2, about 1M parameters,
bf16) with seeded random weights, so every build is the same checkpoint.
"""

from __future__ import annotations

import glob
import os
import sys
import sysconfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

VOCAB_SIZE = 2000
TRAINING_FILES = 200
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))[:TRAINING_FILES]
    if not files:
        raise SystemExit(f"no training text under {stdlib}")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    bpe.train(
        files,
        trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        model_max_length=1024,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast) -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
    )
    config.dtype = torch.bfloat16
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = im_end
    model.generation_config.pad_token_id = endoftext
    return model


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny Qwen3-MoE in {out_dir}: vocab {len(tokenizer)}, {params} parameters")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: build_tiny_moe.py OUT_DIR")
    main(sys.argv[1])
