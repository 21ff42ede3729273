"""The model zoo: small multi-branch models written the way their users write them in PyTorch.

Each family is a tiny version (hidden 16-32, sequences of 6-8, a few hundred to a few thousand
parameters) of a model shape people train and would hand to graphpipe: encoder-decoders, speech
front ends, recommendation models with embedding tables and feature interactions, dual encoders,
mixtures of experts, multi-task heads, latent cross-attention, a GPT, an LSTM. They use standard
`torch.nn` modules with PyTorch's defaults and nothing graphpipe-specific (no export-friendly
rewrites); the only deviation from the defaults is `dropout=0.0` everywhere, so that PyTorch's
training-mode losses are deterministic and can be compared with graphpipe's step for step.

What the zoo measures (export_zoo.py, run_zoo.py): does each family, exported the three ways users
export (torch 2.x's default `dynamo=True`, the TorchScript exporter's defaults `dynamo=False`, and
`graphpipe.export`), import into graphpipe and train exactly as PyTorch trains it, on one process
and on a pipeline of 3+ stages, or is it refused with a message, and never trained differently
without a word.

The loss. graphpipe's importer appends the loss itself (docs/onnx.md, "Loss"): for a [B, C] output
with C >= 2 `cross_entropy` against an int64 `label` [B], for one logit per sample [B, 1]
`bce_with_logits` against a float 0/1 `target` [B, 1], for any other output `mse_loss` against a
float `target` of the output's shape; with several outputs `label_k` / `target_k` and the losses
summed. (No family here has a [B, 1] output; the rule is mirrored for models added later.)
The reference is computed with exactly that loss (`loss_kinds`, `reference_losses`), even where the
model's natural loss is another one (a GPT's [B, S, V] logits get MSE, not a per-token
cross-entropy); the result table says which loss each family was trained with.

Usage (a library; export_zoo.py and run_zoo.py import it):
    from families import FAMILIES, by_name
    fam = by_name("dlrm"); model = fam.build(); data = fam.data(); targets = fam.targets(data)
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

N_TRAIN = 32        # rows of training data per family
BATCH = 8           # mini-batch of the reference and of `graphpipe train`
STEPS = 5           # optimizer steps (step 4 wraps around to rows 0..7 again)
EXAMPLE_BATCH = 5   # batch of the export's example inputs: no other dimension of any model is 5,
                    # so an exporter that bakes the example's batch into a shape is noticed
OPTIMIZER = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9}


# ---------------------------------------------------------------------------------------------
# The models. Each class is written as its users write it; comments say which parts matter to an
# importer (what the exporters will make of them), not how to make them easier to import.
# ---------------------------------------------------------------------------------------------

class T5Style(nn.Module):
    """Encoder-decoder on `nn.Transformer(batch_first=True)`: source and target token embeddings
    with learned positions, a causal target mask from `generate_square_subsequent_mask`, and a
    vocabulary head: logits [B, S_tgt, V] (so graphpipe appends MSE)."""

    def __init__(self, vocab=20, d=16, heads=2, ffn=32, src_len=8, tgt_len=6):
        super().__init__()
        self.src_emb = nn.Embedding(vocab, d)
        self.tgt_emb = nn.Embedding(vocab, d)
        self.src_pos = nn.Embedding(src_len, d)
        self.tgt_pos = nn.Embedding(tgt_len, d)
        self.transformer = nn.Transformer(d_model=d, nhead=heads, num_encoder_layers=1, num_decoder_layers=1,
                                          dim_feedforward=ffn, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        s = self.src_emb(src) + self.src_pos(torch.arange(src.size(1), device=src.device))
        t = self.tgt_emb(tgt) + self.tgt_pos(torch.arange(tgt.size(1), device=tgt.device))
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        return self.head(self.transformer(s, t, tgt_mask=mask))


class WhisperStyle(nn.Module):
    """Whisper's shape in small: a Conv1d front end over a log-mel spectrogram [B, mel, T] (two
    convolutions with GELU, the second strided), learned positions, a pre-LN encoder, and a decoder
    whose `nn.TransformerDecoderLayer` self-attends causally over the tokens and cross-attends to
    the audio encoding; logits [B, S, V] (MSE)."""

    def __init__(self, mel=8, frames=16, vocab=24, d=16, heads=2, ffn=32, text_len=6):
        super().__init__()
        self.conv1 = nn.Conv1d(mel, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.audio_pos = nn.Parameter(torch.randn(frames // 2, d) * 0.02)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True), num_layers=1)
        self.ln_audio = nn.LayerNorm(d)
        self.tok = nn.Embedding(vocab, d)
        self.text_pos = nn.Parameter(torch.randn(text_len, d) * 0.02)
        self.decoder = nn.TransformerDecoderLayer(d, heads, ffn, dropout=0.0, activation="gelu", batch_first=True,
                                                  norm_first=True)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, mel, tokens):
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x))            # [B, d, frames/2]
        x = x.permute(0, 2, 1) + self.audio_pos
        audio = self.ln_audio(self.encoder(x))
        t = self.tok(tokens) + self.text_pos
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.size(1), device=tokens.device)
        y = self.decoder(t, audio, tgt_mask=mask)
        return self.head(self.ln(y))


class DLRM(nn.Module):
    """DLRM with dot interactions: a bottom MLP over the dense features, three embedding tables
    (two `nn.EmbeddingBag(mode="sum")` over multi-hot bags, one `nn.Embedding` over a single id),
    the pairwise dot products `bmm(z, z^T)` of the four vectors, their upper triangle taken with
    `torch.triu_indices` advanced indexing, and a top MLP over [dense, interactions]; 2 logits."""

    def __init__(self, dense=8, d=8, rows=(20, 30, 10), classes=2):
        super().__init__()
        self.bot = nn.Sequential(nn.Linear(dense, 16), nn.ReLU(), nn.Linear(16, d), nn.ReLU())
        self.emb_a = nn.EmbeddingBag(rows[0], d, mode="sum")
        self.emb_b = nn.EmbeddingBag(rows[1], d, mode="sum")
        self.emb_c = nn.Embedding(rows[2], d)
        n = 4
        self.n_pairs = n * (n - 1) // 2
        self.top = nn.Sequential(nn.Linear(d + self.n_pairs, 16), nn.ReLU(), nn.Linear(16, classes))

    def forward(self, dense, bag_a, bag_b, id_c):
        x = self.bot(dense)
        z = torch.stack([x, self.emb_a(bag_a), self.emb_b(bag_b), self.emb_c(id_c)], dim=1)   # [B, 4, d]
        zz = torch.bmm(z, z.transpose(1, 2))                                                 # [B, 4, 4]
        li, lj = torch.triu_indices(z.size(1), z.size(1), offset=1)
        inter = zz[:, li, lj]                                                                # [B, 6]
        return self.top(torch.cat([x, inter], dim=1))


class DLRMDot(nn.Module):
    """DLRM's dot interaction as facebookresearch/dlrm's `interact_features` writes it: the bottom
    MLP's vector and one vector per sparse feature (here an `nn.Embedding` per feature reading its
    column of the id matrix) stacked, `torch.bmm(T, T.transpose(1, 2))`, the strictly lower triangle
    by `li`, `lj` index lists built in forward, `Z[:, li, lj]`, concatenated with the dense vector;
    a top MLP to one click logit [B, 1] (BCE-with-logits)."""

    def __init__(self, dense=8, d=8, rows=(20, 30, 10)):
        super().__init__()
        self.bot = nn.Sequential(nn.Linear(dense, 16), nn.ReLU(), nn.Linear(16, d), nn.ReLU())
        self.emb = nn.ModuleList([nn.Embedding(r, d) for r in rows])
        ni = len(rows) + 1
        self.top = nn.Sequential(nn.Linear(d + ni * (ni - 1) // 2, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, ids):
        x = self.bot(dense)
        ly = [e(ids[:, k]) for k, e in enumerate(self.emb)]
        (batch_size, d) = x.shape
        T = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
        Z = torch.bmm(T, torch.transpose(T, 1, 2))
        _, ni, nj = Z.shape
        li = torch.tensor([i for i in range(ni) for j in range(i)])
        lj = torch.tensor([j for i in range(nj) for j in range(i)])
        Zflat = Z[:, li, lj]
        return self.top(torch.cat([x, Zflat], dim=1))


class DCN(nn.Module):
    """Deep & Cross Network (v2's cross layer): embedded categorical ids and dense features form x0;
    two cross layers x_{l+1} = x0 * (W x_l + b) + x_l beside a deep MLP; both concatenated into a
    2-class head."""

    def __init__(self, dense=8, n_cat=2, rows=10, d=4, classes=2):
        super().__init__()
        self.emb = nn.Embedding(rows, d)
        width = dense + n_cat * d
        self.cross = nn.ModuleList([nn.Linear(width, width) for _ in range(2)])
        self.deep = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(width + 16, classes)

    def forward(self, dense, cat):
        x0 = torch.cat([dense, self.emb(cat).flatten(1)], dim=1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return self.head(torch.cat([x, self.deep(x0)], dim=1))


class TwoTower(nn.Module):
    """Two-tower retrieval: a user tower over the user's history (an `nn.EmbeddingBag(mode="mean")`
    bag of item ids) and an item tower over the item's tags, each an MLP; the score is the dot
    product of the two embeddings, one number per pair [B] (regressed: MSE against a target [B])."""

    def __init__(self, users_rows=30, items_rows=40, d=16, out=8):
        super().__init__()
        self.user_bag = nn.EmbeddingBag(users_rows, d, mode="mean")
        self.item_bag = nn.EmbeddingBag(items_rows, d, mode="mean")
        self.user_mlp = nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, out))
        self.item_mlp = nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, out))

    def forward(self, history, item_tags):
        u = self.user_mlp(self.user_bag(history))
        v = self.item_mlp(self.item_bag(item_tags))
        return (u * v).sum(dim=-1)


class WideAndDeep(nn.Module):
    """Wide & Deep: a linear (wide) model over the dense and one-hot-ish features beside a deep MLP
    over embedded categorical ids and the dense features; the two logits are added."""

    def __init__(self, dense=10, n_cat=3, rows=20, d=8, classes=2):
        super().__init__()
        self.wide = nn.Linear(dense, classes)
        self.emb = nn.Embedding(rows, d)
        self.deep = nn.Sequential(nn.Linear(n_cat * d + dense, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                                  nn.Linear(16, classes))

    def forward(self, dense, cat):
        deep_in = torch.cat([self.emb(cat).flatten(1), dense], dim=1)
        return self.wide(dense) + self.deep(deep_in)


class CLIPStyle(nn.Module):
    """CLIP-style dual encoder used as a classifier: a conv image tower (Conv-BatchNorm-ReLU twice,
    max and adaptive average pooling) and a text transformer (token embedding, learned positions,
    one encoder layer, mean over tokens), each projected to a joint space; the two embeddings and
    their product are concatenated into a 4-class head. BatchNorm trains with batch statistics."""

    def __init__(self, vocab=30, text_len=8, d=16, joint=16, classes=4):
        super().__init__()
        self.image = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.image_proj = nn.Linear(16, joint)
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, text_len, d) * 0.02)
        self.text = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.text_proj = nn.Linear(d, joint)
        self.head = nn.Linear(3 * joint, classes)

    def forward(self, image, text):
        i = self.image_proj(self.image(image))
        t = self.text_proj(self.text(self.tok(text) + self.pos).mean(dim=1))
        return self.head(torch.cat([i, t, i * t], dim=1))


class SoftMoE(nn.Module):
    """A dense (soft) mixture of experts: a softmax gate over 4 expert MLPs, the experts' outputs
    stacked and summed weighted by the gate, then a 3-class head."""

    def __init__(self, d_in=12, hidden=16, d_out=8, experts=4, classes=3):
        super().__init__()
        self.gate = nn.Linear(d_in, experts)
        self.experts = nn.ModuleList(
            [nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out)) for _ in range(experts)])
        self.head = nn.Linear(d_out, classes)

    def forward(self, x):
        w = torch.softmax(self.gate(x), dim=-1)                       # [B, E]
        y = torch.stack([e(x) for e in self.experts], dim=1)           # [B, E, d_out]
        return self.head((w.unsqueeze(-1) * y).sum(dim=1))


class MMoE(nn.Module):
    """Multi-gate mixture of experts for two tasks: 3 shared expert MLPs, one softmax gate and one
    tower per task; two outputs, [B, 2] and [B, 3] logits (two cross-entropies, summed)."""

    def __init__(self, d_in=12, hidden=16, experts=3, classes=(2, 3)):
        super().__init__()
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU()) for _ in range(experts)])
        self.gates = nn.ModuleList([nn.Linear(d_in, experts) for _ in classes])
        self.towers = nn.ModuleList([nn.Sequential(nn.Linear(hidden, 8), nn.ReLU(), nn.Linear(8, c)) for c in classes])

    def forward(self, x):
        e = torch.stack([expert(x) for expert in self.experts], dim=1)      # [B, E, hidden]
        outs = []
        for gate, tower in zip(self.gates, self.towers):
            w = torch.softmax(gate(x), dim=-1).unsqueeze(-1)               # [B, E, 1]
            outs.append(tower((w * e).sum(dim=1)))
        return tuple(outs)


class TabTransformer(nn.Module):
    """TabTransformer (as lucidrains/tab-transformer-pytorch writes it): the categorical columns share
    one embedding table, each column's ids offset by a registered buffer of column offsets, a
    transformer encoder over the column embeddings, flattened and concatenated with the
    LayerNorm-ed continuous features, then an MLP to 2 classes."""

    def __init__(self, categories=(5, 4, 6, 3), n_cont=6, d=16, classes=2):
        super().__init__()
        offsets = torch.tensor([0] + list(categories[:-1])).cumsum(0)
        self.register_buffer("categories_offset", offsets)
        self.emb = nn.Embedding(sum(categories), d)
        self.transformer = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True), num_layers=1)
        self.norm = nn.LayerNorm(n_cont)
        self.mlp = nn.Sequential(nn.Linear(len(categories) * d + n_cont, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, x_categ, x_cont):
        x = self.transformer(self.emb(x_categ + self.categories_offset))
        return self.mlp(torch.cat([x.flatten(1), self.norm(x_cont)], dim=1))


class Perceiver(nn.Module):
    """Perceiver-style latent bottleneck: a learned latent array [4, 16] cross-attends
    (`nn.MultiheadAttention(batch_first=True)`, latents as the query) to the projected input array
    [B, 8, 12], then one self-attention layer over the latents, mean over latents, 3 classes."""

    def __init__(self, d_in=12, d=16, latents=4, classes=3):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.latents = nn.Parameter(torch.randn(latents, d) * 0.02)
        self.cross = nn.MultiheadAttention(d, 2, batch_first=True)
        self.ln = nn.LayerNorm(d)
        self.process = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        kv = self.inp(x)
        q = self.latents.unsqueeze(0).expand(x.size(0), -1, -1)
        attended, _ = self.cross(q, kv, kv)
        z = self.process(self.ln(attended + q))
        return self.head(z.mean(dim=1))


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: one packed c_attn, heads split batch-first, flash SDPA with is_causal."""

    def __init__(self, d, heads):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head, self.n_embd = heads, d

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    """nanoGPT's pre-LN block: x + attn(ln_1(x)), x + mlp(ln_2(x)), MLP 4x with exact GELU."""

    def __init__(self, d, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT (Karpathy) in small: token + learned position embeddings, 2 blocks, final LayerNorm,
    an LM head tied to the token embedding (`wte.weight = lm_head.weight`), nanoGPT's init (normal
    0.02, zero biases, scaled c_proj); returns the logits [B, S, V] (MSE: graphpipe's default for a
    rank-3 output, not the per-token cross-entropy nanoGPT trains with)."""

    def __init__(self, vocab=32, block_size=8, n_layer=2, n_head=2, n_embd=16):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


class GPTLM(GPT):
    """nanoGPT's own forward with targets: it returns its loss, `F.cross_entropy(logits.view(-1,
    logits.size(-1)), targets.view(-1), ignore_index=-1)` (positions with target -1 are not counted)."""

    def forward(self, idx, targets):
        logits = super().forward(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class LSTMPlusMLP(nn.Module):
    """A sequence branch (`nn.LSTM(batch_first=True)`, the last layer's final hidden state h_n[-1])
    joined with an MLP branch over static features, concatenated into a 3-class head."""

    def __init__(self, d_seq=6, d_static=10, hidden=16, classes=3):
        super().__init__()
        self.lstm = nn.LSTM(d_seq, hidden, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d_static, 16), nn.ReLU())
        self.head = nn.Linear(hidden + 16, classes)

    def forward(self, seq, static):
        _, (h_n, _) = self.lstm(seq)
        return self.head(torch.cat([h_n[-1], self.mlp(static)], dim=1))


# ---------------------------------------------------------------------------------------------
# Families: a model, its inputs, its data, and the loss graphpipe appends.
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Input:
    """One forward argument: per-sample shape, "float" (standard normal), "ids" (int64 in [0, high)) or
    "targets" (ids, about one in eight -1: ignored by the model's own loss)."""
    name: str
    shape: Tuple[int, ...]
    kind: str = "float"
    high: int = 0


@dataclasses.dataclass(frozen=True)
class Family:
    """A zoo entry. `build()` is seeded (the same weights every call); `data()` is deterministic
    NumPy (N_TRAIN rows per input); `targets()` the label/target arrays of graphpipe's appended
    loss; `batchnorm` says the model normalises with batch statistics, so a pipeline must keep the
    whole mini-batch in one micro-batch to train as the mini-batch does (docs/onnx.md)."""
    name: str
    summary: str
    ctor: Callable[[], nn.Module]
    inputs: Tuple[Input, ...]
    seed: int
    batchnorm: bool = False

    def build(self) -> nn.Module:
        torch.manual_seed(self.seed)
        model = self.ctor()
        model.train()
        return model

    def data(self, n: int = N_TRAIN) -> Dict[str, np.ndarray]:
        rng = np.random.default_rng(1000 + self.seed)
        out = {}
        for inp in self.inputs:
            if inp.kind == "ids":
                out[inp.name] = rng.integers(0, inp.high, size=(n,) + inp.shape, dtype=np.int64)
            elif inp.kind == "targets":  # next-token targets, about one in eight ignored (-1)
                t = rng.integers(0, inp.high, size=(n,) + inp.shape, dtype=np.int64)
                out[inp.name] = np.where(rng.random(t.shape) < 0.125, -1, t)
            else:
                out[inp.name] = rng.standard_normal((n,) + inp.shape).astype(np.float32)
        return out

    def example_inputs(self) -> Tuple[torch.Tensor, ...]:
        """The export's example: the first EXAMPLE_BATCH rows of the training data."""
        data = self.data()
        return tuple(torch.from_numpy(data[i.name][:EXAMPLE_BATCH].copy()) for i in self.inputs)

    def input_names(self) -> List[str]:
        return [i.name for i in self.inputs]

    def output_shapes(self) -> List[Tuple[int, ...]]:
        """Per output, its per-sample shape (the batch dim dropped); None for a scalar (the model's loss)."""
        with torch.no_grad():
            y = self.build()(*self.example_inputs())
        ys = y if isinstance(y, (tuple, list)) else (y,)
        return [None if t.dim() == 0 else tuple(t.shape[1:]) for t in ys]  # None: a scalar (its own loss)

    def targets(self, n: int = N_TRAIN) -> Dict[str, np.ndarray]:
        """The appended losses' target arrays, named as graphpipe names the inputs it adds."""
        rng = np.random.default_rng(2000 + self.seed)
        out = {}
        for (kind, name), shape in zip(loss_kinds(self.output_shapes()), self.output_shapes()):
            if kind == "own":
                continue
            if kind == "cross_entropy":
                out[name] = rng.integers(0, shape[0], size=(n,), dtype=np.int64)
            elif kind == "bce_with_logits":
                out[name] = rng.integers(0, 2, size=(n,) + shape).astype(np.float32)
            else:
                out[name] = rng.standard_normal((n,) + shape).astype(np.float32)
        return out

    def losses(self) -> List[str]:
        return [k for k, _ in loss_kinds(self.output_shapes())]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.build().parameters())


def loss_kinds(per_sample_shapes: Sequence[Tuple[int, ...]]) -> List[Tuple[str, str]]:
    """graphpipe's importer rule (docs/onnx.md "Loss"; onnx_import.cpp): per output, (loss, target
    input name): a [B, C] output with C >= 2 gets cross_entropy vs int64 `label`, a [B, 1] output
    bce_with_logits vs float `target`, anything else mse vs `target`; with several outputs the names
    get `_k`."""
    out = []
    for k, shape in enumerate(per_sample_shapes):
        suffix = "" if len(per_sample_shapes) == 1 else f"_{k}"
        if shape is None:  # a scalar output, the module's own loss: nothing appended
            out.append(("own", ""))
        elif len(shape) == 1 and shape[0] >= 2:
            out.append(("cross_entropy", "label" + suffix))
        elif tuple(shape) == (1,):
            out.append(("bce_with_logits", "target" + suffix))
        else:
            out.append(("mse", "target" + suffix))
    return out


LOSS_FUNCTIONS = {"cross_entropy": F.cross_entropy, "bce_with_logits": F.binary_cross_entropy_with_logits,
                  "mse": F.mse_loss}


def reference_losses(family: Family, steps: int = STEPS, batch: int = BATCH, lr: float = OPTIMIZER["lr"],
                     momentum: float = OPTIMIZER["momentum"]) -> List[float]:
    """PyTorch's own training of a fresh `family.build()` in training mode: SGD with momentum, step k
    on rows [k*batch, (k+1)*batch) modulo N in file order (as `graphpipe train --data` without
    --shuffle), the loss graphpipe appends (a sum over outputs); returns the per-step losses."""
    model = family.build()
    data = {k: torch.from_numpy(v) for k, v in family.data().items()}
    targets = {k: torch.from_numpy(v) for k, v in family.targets().items()}
    kinds = loss_kinds(family.output_shapes())
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    n = next(iter(data.values())).shape[0]
    losses = []
    for step in range(steps):
        idx = torch.tensor([(step * batch + j) % n for j in range(batch)])
        opt.zero_grad()
        y = model(*(data[i.name][idx] for i in family.inputs))
        ys = y if isinstance(y, (tuple, list)) else (y,)
        loss = sum(out if kind == "own" else LOSS_FUNCTIONS[kind](out, targets[name][idx])
                   for out, (kind, name) in zip(ys, kinds))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


FAMILIES: List[Family] = [
    Family("t5", "T5-style encoder-decoder: nn.Transformer(batch_first=True), 1+1 layers d16 h2, src/tgt "
           "nn.Embedding + learned positions, causal tgt mask (generate_square_subsequent_mask), vocab head",
           T5Style, (Input("src", (8,), "ids", 20), Input("tgt", (6,), "ids", 20)), seed=1),
    Family("whisper", "Whisper-style: Conv1d front end on a [B, 8 mel, 16] spectrogram (GELU, stride 2), pre-LN "
           "encoder layer, token decoder layer with causal self-attention and cross-attention to the audio, vocab head",
           WhisperStyle, (Input("mel", (8, 16)), Input("tokens", (6,), "ids", 24)), seed=2),
    Family("dlrm", "DLRM: bottom MLP, two nn.EmbeddingBag(sum) + one nn.Embedding, bmm(z, z^T) dot interactions, "
           "upper triangle via torch.triu_indices indexing, top MLP, 2 classes",
           DLRM, (Input("dense", (8,)), Input("bag_a", (3,), "ids", 20), Input("bag_b", (2,), "ids", 30),
                  Input("id_c", (), "ids", 10)), seed=3),
    Family("dlrm_dot", "DLRM as facebookresearch/dlrm writes its interaction: bottom MLP, an nn.Embedding per sparse "
           "column, bmm(T, T^T), Z[:, li, lj] with index lists built in forward, top MLP, one click logit (BCE)",
           DLRMDot, (Input("dense", (8,)), Input("ids", (3,), "ids", 10)), seed=14),
    Family("dcn", "Deep & Cross Network: embedded ids + dense as x0, 2 cross layers x0 * (W x + b) + x beside a "
           "deep MLP, concatenated, 2 classes",
           DCN, (Input("dense", (8,)), Input("cat", (2,), "ids", 10)), seed=4),
    Family("two_tower", "Two-tower retrieval: nn.EmbeddingBag(mean) user history and item tags, an MLP tower each, "
           "dot-product score [B]",
           TwoTower, (Input("history", (4,), "ids", 30), Input("item_tags", (3,), "ids", 40)), seed=5),
    Family("wide_deep", "Wide & Deep: linear wide part on dense features + deep MLP on embedded ids and dense "
           "features, logits added, 2 classes",
           WideAndDeep, (Input("dense", (10,)), Input("cat", (3,), "ids", 20)), seed=6),
    Family("clip", "CLIP-style dual encoder: conv image tower (Conv-BatchNorm-ReLU x2, pools) and text encoder "
           "layer (embedding + learned positions, mean), both projected, [i, t, i*t] concatenated, 4 classes",
           CLIPStyle, (Input("image", (3, 12, 12)), Input("text", (8,), "ids", 30)), seed=7, batchnorm=True),
    Family("soft_moe", "Soft mixture of experts: softmax gate over 4 expert MLPs, gate-weighted sum, 3 classes",
           SoftMoE, (Input("x", (12,)),), seed=8),
    Family("mmoe", "Multi-task MMoE: 3 shared experts, a softmax gate and a tower per task, two heads "
           "(2 and 3 classes)",
           MMoE, (Input("x", (12,)),), seed=9),
    Family("tab_transformer", "TabTransformer: 4 categorical columns in one nn.Embedding (ids + a buffer of "
           "column offsets), encoder layer, flattened + LayerNorm-ed continuous features, MLP, 2 classes",
           TabTransformer, (Input("x_categ", (4,), "ids", 3), Input("x_cont", (6,))), seed=10),
    Family("perceiver", "Perceiver-style: a learned latent array [4, 16] as the query of nn.MultiheadAttention"
           "(batch_first) over the projected input [B, 8, 12], a self-attention layer on the latents, mean, 3 classes",
           Perceiver, (Input("x", (8, 12)),), seed=11),
    Family("gpt", "nanoGPT: token + position nn.Embedding, 2 pre-LN blocks (packed c_attn, SDPA is_causal, "
           "GELU MLP), ln_f, LM head tied to wte, logits [B, 8, 32]",
           GPT, (Input("idx", (8,), "ids", 32),), seed=12),
    Family("gpt_lm", "nanoGPT returning its own loss: forward(idx, targets) -> F.cross_entropy(logits.view(-1, V), "
           "targets.view(-1), ignore_index=-1), 1 in 8 targets ignored",
           GPTLM, (Input("idx", (8,), "ids", 32), Input("targets", (8,), "targets", 32)), seed=15),
    Family("lstm_mlp", "nn.LSTM(batch_first=True) over [B, 7, 6] (h_n[-1]) joined with an MLP over static "
           "features, concatenated, 3 classes",
           LSTMPlusMLP, (Input("seq", (7, 6)), Input("static", (10,))), seed=13),
]


def by_name(name: str) -> Family:
    for fam in FAMILIES:
        if fam.name == name:
            return fam
    raise KeyError(f"no family {name!r}; families: {', '.join(f.name for f in FAMILIES)}")
