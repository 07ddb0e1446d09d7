#!/usr/bin/env python3
"""Write a llama2.c checkpoint (../shared/models/*.bin, legacy format) as an f32 GGUF file that
llama.cpp loads as LLM_ARCH_LLAMA. Pure Python (struct only): no numpy, no gguf-py.

    python3 llama2c_to_gguf.py enbytes-1m.bin enbytes-1m.gguf [--arch llama|qwen2|qwen3|gemma2|gemma3]
        [--swa W:P] [--softcap C] [--bias]

The vocabulary is byte-level: token i is byte i (GPT-2 byte-to-unicode spelling, tokenizer model
"gpt2", no merges), which is exactly the enbytes-1m model's (vocab 256, no BOS). Another vocab size
gets byte tokens for ids < 256 and placeholder tokens above (use token ids, as for stories260K).

llama2.c keeps Meta's interleaved RoPE pairs (2i, 2i+1), which is llama.cpp's LLAMA_ROPE_TYPE_NORM,
so Q and K are written unpermuted. Matrices are [out][in] row-major = ggml ne [in, out].

--arch qwen2 / qwen3 write the same weights under those architectures (port tests of their graph
path): Q and K rows are permuted within each head from interleaved to NEOX pairs (i, i + hd/2),
which qwen2/qwen3 rotate, so the attention scores are those of the llama file; qwen3's
attn_q_norm/attn_k_norm are ones (an RMS norm of q and k per head: a different model, the same
shapes). No biases.

--arch gemma3 writes them as a Gemma 3 graph: NEOX pairs as for qwen, q/k norms and the post-attention
and post-FFN norms all ones; llama.cpp's gemma3 graph also scales the embeddings by sqrt(dim), uses a
GELU-gated FFN and scales q by 1/sqrt(head_dim) itself: a different model again, on the same
weights. --swa W:P gives it sliding-window layers (gemma3.attention.sliding_window = W,
sliding_window_pattern = P: layer l is global iff (l+1) % P == 0, the others see W keys); without
--swa every layer is global.

--arch gemma2 is gemma3 without the q/k norms, plus attention logit soft-capping: --softcap C
(gemma2.attn_logit_softcapping; Gemma 2 ships 50, and llama.cpp's gemma2 caps always). Its
layers are always windowed (llama.cpp's default W 4096, period 2), so give --swa W:P to see it.

--bias (qwen2) adds q/k/v biases, as Qwen2 checkpoints have: b[j] = 0.1 sin(0.7 j + layer + 1),
0.2 cos(...) and 0.3 sin(...) for q, k and v (deterministic; again another model).
"""
import math
import struct
import sys

ALIGN = 32


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class Writer:
    def __init__(self):
        self.kv = []
        self.tensors = []  # (name, ne list, bytes)

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def u32(self, k, v):
        self.kv.append(self._str(k) + struct.pack("<II", 4, v))

    def f32(self, k, v):
        self.kv.append(self._str(k) + struct.pack("<If", 6, v))

    def bool(self, k, v):
        self.kv.append(self._str(k) + struct.pack("<IB", 7, 1 if v else 0))

    def str(self, k, v):
        self.kv.append(self._str(k) + struct.pack("<I", 8) + self._str(v))

    def arr_str(self, k, vals):
        body = b"".join(self._str(v) for v in vals)
        self.kv.append(self._str(k) + struct.pack("<IIQ", 9, 8, len(vals)) + body)

    def arr_i32(self, k, vals):
        self.kv.append(self._str(k) + struct.pack("<IIQ", 9, 5, len(vals)) + struct.pack("<%di" % len(vals), *vals))

    def tensor(self, name, ne, data):
        n = 1
        for d in ne:
            n *= d
        assert len(data) == 4 * n, (name, ne, len(data))
        self.tensors.append((name, ne, data))

    def write(self, path):
        out = bytearray(b"GGUF")
        out += struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for kv in self.kv:
            out += kv
        off = 0
        offs = []
        for name, ne, data in self.tensors:
            offs.append(off)
            out += self._str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
            out += struct.pack("<IQ", 0, off)  # GGML_TYPE_F32
            off += (len(data) + ALIGN - 1) // ALIGN * ALIGN
        out += b"\0" * (-len(out) % ALIGN)
        for (name, ne, data), o in zip(self.tensors, offs):
            out += data
            out += b"\0" * (-len(data) % ALIGN)
        with open(path, "wb") as f:
            f.write(out)


def main():
    args = sys.argv[1:]
    arch = "llama"
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i:i + 2]
    swa = None
    softcap = 50.0
    bias = "--bias" in args
    if bias:
        args.remove("--bias")
    if "--softcap" in args:
        i = args.index("--softcap")
        softcap = float(args[i + 1])
        del args[i:i + 2]
    if "--swa" in args:
        i = args.index("--swa")
        swa = [int(x) for x in args[i + 1].split(":")]
        del args[i:i + 2]
    if len(args) != 2 or arch not in ("llama", "qwen2", "qwen3", "gemma2", "gemma3") or \
            (swa is not None and (not arch.startswith("gemma") or len(swa) != 2 or swa[0] < 1)) or \
            (bias and arch != "qwen2"):
        sys.exit("usage: llama2c_to_gguf.py CHECKPOINT.bin OUT.gguf [--arch llama|qwen2|qwen3|gemma2|gemma3] "
                 "[--swa W:P (gemma)] [--softcap C (gemma2)] [--bias (qwen2)]")
    raw = open(args[0], "rb").read()
    dim, hidden, L, nh, nkv, vocab, seq_len = struct.unpack_from("<7i", raw, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // nh
    pos = 28

    def take(n):
        nonlocal pos
        b = raw[pos:pos + 4 * n]
        assert len(b) == 4 * n, "checkpoint truncated"
        pos += 4 * n
        return b

    def per_layer(n):
        return [take(n) for _ in range(L)]

    emb = take(vocab * dim)
    rms_att = per_layer(dim)
    wq = per_layer(nh * hd * dim)
    wk = per_layer(nkv * hd * dim)
    wv = per_layer(nkv * hd * dim)
    wo = per_layer(dim * nh * hd)
    rms_ffn = per_layer(dim)
    w1 = per_layer(hidden * dim)
    w2 = per_layer(dim * hidden)
    w3 = per_layer(hidden * dim)
    rms_final = take(dim)
    take(seq_len * hd // 2)
    take(seq_len * hd // 2)
    cls = emb if shared else take(vocab * dim)

    def neox(rows_bytes, n_heads):
        # interleaved pairs (2i, 2i+1) -> NEOX pairs (i, i + hd/2): output row j of a head takes
        # input row 2j (j < hd/2) or 2(j - hd/2) + 1
        if arch == "llama":
            return rows_bytes
        rb = 4 * dim
        out = bytearray()
        for h in range(n_heads):
            for j in range(hd):
                src = 2 * j if j < hd // 2 else 2 * (j - hd // 2) + 1
                o = (h * hd + src) * rb
                out += rows_bytes[o:o + rb]
        return bytes(out)

    w = Writer()
    w.str("general.architecture", arch)
    w.str("general.name", args[0].rsplit("/", 1)[-1])
    w.u32(arch + ".context_length", seq_len)
    w.u32(arch + ".embedding_length", dim)
    w.u32(arch + ".block_count", L)
    w.u32(arch + ".feed_forward_length", hidden)
    w.u32(arch + ".attention.head_count", nh)
    w.u32(arch + ".attention.head_count_kv", nkv)
    w.u32(arch + ".rope.dimension_count", hd)
    w.f32(arch + ".rope.freq_base", 10000.0)
    w.f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5)
    w.u32(arch + ".vocab_size", vocab)
    if arch == "qwen3":
        w.u32(arch + ".attention.key_length", hd)
        w.u32(arch + ".attention.value_length", hd)
    if swa is not None:
        w.u32(arch + ".attention.sliding_window", swa[0])
        w.u32(arch + ".attention.sliding_window_pattern", swa[1])
    if arch == "gemma2":
        w.f32(arch + ".attn_logit_softcapping", softcap)
    w.u32("general.file_type", 0)  # all f32

    b2u = bytes_to_unicode()
    toks = [b2u[i] for i in range(min(vocab, 256))] + ["<t%d>" % i for i in range(256, vocab)]
    w.str("tokenizer.ggml.model", "gpt2")
    w.str("tokenizer.ggml.pre", "default")
    w.arr_str("tokenizer.ggml.tokens", toks)
    w.arr_i32("tokenizer.ggml.token_type", [1] * vocab)
    w.arr_str("tokenizer.ggml.merges", [])
    w.u32("tokenizer.ggml.bos_token_id", 0)
    w.u32("tokenizer.ggml.eos_token_id", 0)  # byte NUL: never in text
    w.bool("tokenizer.ggml.add_bos_token", False)
    w.bool("tokenizer.ggml.add_eos_token", False)

    w.tensor("token_embd.weight", [dim, vocab], emb)
    for i in range(L):
        w.tensor("blk.%d.attn_norm.weight" % i, [dim], rms_att[i])
        w.tensor("blk.%d.attn_q.weight" % i, [dim, nh * hd], neox(wq[i], nh))
        w.tensor("blk.%d.attn_k.weight" % i, [dim, nkv * hd], neox(wk[i], nkv))
        if arch in ("qwen3", "gemma3"):
            ones = struct.pack("<%df" % hd, *([1.0] * hd))
            w.tensor("blk.%d.attn_q_norm.weight" % i, [hd], ones)
            w.tensor("blk.%d.attn_k_norm.weight" % i, [hd], ones)
        if arch in ("gemma2", "gemma3"):
            ones = struct.pack("<%df" % dim, *([1.0] * dim))
            w.tensor("blk.%d.post_attention_norm.weight" % i, [dim], ones)
            w.tensor("blk.%d.post_ffw_norm.weight" % i, [dim], ones)
        w.tensor("blk.%d.attn_v.weight" % i, [dim, nkv * hd], wv[i])
        if bias:
            for name, n, f in (("attn_q", nh * hd, lambda x: 0.1 * math.sin(x)),
                               ("attn_k", nkv * hd, lambda x: 0.2 * math.cos(x)),
                               ("attn_v", nkv * hd, lambda x: 0.3 * math.sin(x))):
                vals = [f(0.7 * j + i + 1) for j in range(n)]
                w.tensor("blk.%d.%s.bias" % (i, name), [n], struct.pack("<%df" % n, *vals))
        w.tensor("blk.%d.attn_output.weight" % i, [nh * hd, dim], wo[i])
        w.tensor("blk.%d.ffn_norm.weight" % i, [dim], rms_ffn[i])
        w.tensor("blk.%d.ffn_gate.weight" % i, [dim, hidden], w1[i])
        w.tensor("blk.%d.ffn_down.weight" % i, [hidden, dim], w2[i])
        w.tensor("blk.%d.ffn_up.weight" % i, [dim, hidden], w3[i])
    w.tensor("output_norm.weight", [dim], rms_final)
    if not shared:
        w.tensor("output.weight", [dim, vocab], cls)
    w.write(args[1])


if __name__ == "__main__":
    main()
