"""Writes a tiny random-weight llama GGUF with a real SentencePiece-style ("llama") vocabulary.

The vocabulary: <unk>, <s>, </s>, the 256 byte tokens, "▁", the letters a-z, and every
"▁"-prefix of each given word, so that llama.cpp's tokenizer merges "▁" + letters step by step
into "▁word" (longer pieces score higher). Each given word is then one token after a space,
every other word several. The weights are random (fixed seed): the answers mean nothing, the
serving path is real.
"""

from __future__ import annotations

import numpy as np


def write_tiny_llama(path: str, words, seed: int = 1234, n_embd: int = 32, n_head: int = 2,
                     n_layer: int = 1, n_ff: int = 64, n_ctx: int = 512) -> int:
    """Writes the model to `path`; returns the vocabulary size."""
    import gguf

    tokens, scores, types = [], [], []

    def add(text, score, kind):
        tokens.append(text)
        scores.append(float(score))
        types.append(int(kind))

    T = gguf.TokenType
    add("<unk>", 0.0, T.UNKNOWN)
    add("<s>", 0.0, T.CONTROL)
    add("</s>", 0.0, T.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, T.BYTE)
    add("\u2581", -1.0, T.NORMAL)
    for c in "abcdefghijklmnopqrstuvwxyz":
        add(c, -1.0, T.NORMAL)
    seen = set(tokens)
    for w in words:
        for k in range(1, len(w) + 1):
            piece = "\u2581" + w[:k]
            if piece not in seen:
                seen.add(piece)
                add(piece, float(k), T.NORMAL)
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)  # all f32
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)

    rng = np.random.default_rng(seed)

    def mat(rows, cols):  # numpy shape (rows, cols) = ggml ne [cols, rows]
        return (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)

    ones = np.ones(n_embd, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", ones.copy())
    w.add_tensor("output.weight", mat(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones.copy())
        w.add_tensor(p + "attn_q.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "ffn_norm.weight", ones.copy())
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n_vocab
