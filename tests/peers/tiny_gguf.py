#!/usr/bin/env python3
"""Write a tiny llama-architecture GGUF with seeded random weights: test support for
tests/llama.rs, which serves it with llama-cpp-python's server (never product code).

    tiny_gguf.py OUT.gguf [--seed N]

What llama.cpp's loader needs of a llama model (src/models/llama.cpp, src/llama-model.cpp,
src/llama-vocab.cpp): the hyperparameters under `llama.*`; token_embd, output_norm and per block
attn_norm, attn_q/k/v, attn_output, ffn_norm, ffn_gate/up/down (output is optional and given
here); and a SentencePiece-style vocabulary (`tokenizer.ggml.model = "llama"`) with scores and
token types, whose byte tokens `<0x00>`..`<0xFF>` let any text be tokenized (byte fallback) and
give the newline token. The chat template (`tokenizer.chat_template`, ChatML) is what a
server reads to turn `/v1/chat/completions` messages into a prompt.

The output rows of the control tokens (`<unk>`, `<s>`, `</s>`, `<|im_start|>`, `<|im_end|>`)
are zero while every other token's are large, so the model never ends its answer early: it
speaks random pieces until the request's max_tokens. Word pieces are weighted above the bytes,
so the text is mostly words, with some raw bytes (a stray UTF-8 lead byte among them) as a
real model's sampler can give.
"""

import argparse

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WORDS = (
    "the box is on a note todo list file read write owner model turn "
    "tool memory session root private secret inbox web ok yes no and to of in it"
).split()

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_LAYER = 2
N_CTX = 8192


def vocabulary():
    """Tokens, scores and types: the SentencePiece specials, the 256 bytes, single
    characters, words with their prefixes (SentencePiece marks a word's leading space with
    U+2581), and the ChatML markers."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    pieces += list("0123456789.,:;!?'\"-_/()[]{}<>=+*#@%&`~|\\")
    # A word and every prefix of it, so that SentencePiece's pairwise merges can reach it.
    words = {"\u2581" + w[:n] for w in WORDS for n in range(1, len(w) + 1)}
    pieces += sorted(words - set(pieces))
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    tokens += ["<|im_start|>", "<|im_end|>"]
    types += [TokenType.CONTROL, TokenType.CONTROL]
    # Longer pieces win the merges; the specials and bytes never merge.
    scores = [0.0 if t != TokenType.NORMAL else -10.0 + len(tok) for tok, t in zip(tokens, types)]
    return tokens, scores, types


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=25)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    head_dim = N_EMBD // N_HEAD

    w = GGUFWriter(args.out, "llama")
    w.add_name("boxmaker-tiny-test-model")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(LlamaFileType.ALL_F32)

    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML)

    def rand(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    # numpy shapes are ggml's dimensions reversed: a {n_embd, n_vocab} tensor is (n_vocab, n_embd).
    w.add_tensor("token_embd.weight", rand(n_vocab, N_EMBD, scale=1.0))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    # After the RMS norm each of the N_EMBD components is about 1, so a row of scale s gives
    # logits of about s * sqrt(N_EMBD): words around 6, bytes around 3, the controls 0.
    out = rand(n_vocab, N_EMBD, scale=0.75)
    for i, t in enumerate(types):
        if t in (TokenType.CONTROL, TokenType.UNKNOWN):
            out[i] = 0.0
        elif t == TokenType.BYTE:
            out[i] *= 0.5
    w.add_tensor("output.weight", out)
    proj = 1.0 / np.sqrt(N_EMBD)
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(N_HEAD * head_dim, N_EMBD, scale=proj))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(N_HEAD_KV * head_dim, N_EMBD, scale=proj))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(N_HEAD_KV * head_dim, N_EMBD, scale=proj))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand(N_EMBD, N_HEAD * head_dim, scale=proj))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(N_FF, N_EMBD, scale=proj))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD, scale=proj))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(N_EMBD, N_FF, scale=1.0 / np.sqrt(N_FF)))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
