#!/usr/bin/env python3
"""PyTorch eager baseline for issue 6's speed target: GPT-2 124M trained in bf16 on one GPU.

The model is the executor's (kernels/gpt_cpu.h): token and position embeddings, pre-LayerNorm
blocks with causal multi-head attention and a tanh-GELU MLP, a final LayerNorm and an LM head
tied to the token embedding, no dropout. Training as `parallax run --backend cuda` does it:
fp32 master weights, bf16 compute (torch.autocast), AdamW, the same micro-batch and sequence.

Prints one table line and one JSON line (prefixed "json ") with tokens/s, peak memory
(torch.cuda.max_memory_allocated and max_memory_reserved) and MFU against the GPU's dense bf16
peak. Usage on a GPU machine:

    python3 scripts/bench_gpt2_pytorch.py --batch 8 --seq 1024 --steps 30 --warmup 5
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.out = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        # eager attention written out, as the executor's kernels compute it (no fused kernel)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, max_t, c, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(max_t, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        for p in self.parameters():  # GPT-2's init: weights normal(0, 0.02), biases zero
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="dense bf16 peak of the GPU (H100/H200 SXM: 989)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpt2_pytorch: no CUDA device")
    torch.manual_seed(1234)
    dev = torch.device("cuda")
    vocab, c, layers, heads = 50257, 768, 12, 12
    model = Gpt(vocab, a.seq, c, layers, heads).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            foreach=False, fused=False)
    # learnable data: each sequence counts up from a random start, so the loss falls
    start = torch.randint(0, vocab, (a.batch, 1), device=dev)
    seqs = (start + torch.arange(a.seq + 1, device=dev)) % vocab
    x, y = seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronises
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    step_s = times[len(times) // 2]
    tokens = a.batch * a.seq
    # model FLOPs per token: 6 N for the weights plus attention's 12 L T C (PaLM's appendix B)
    flops_per_token = 6 * n_params + 12 * layers * a.seq * c
    tflops = flops_per_token * tokens / step_s / 1e12
    out = {
        "framework": "pytorch eager " + torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "params": n_params, "batch": a.batch, "seq": a.seq,
        "step_s_median": step_s, "tokens_per_s": tokens / step_s,
        "tflops_per_gpu": tflops, "mfu": tflops / a.peak_tflops,
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
        "first_loss": losses[0], "last_loss": losses[-1],
    }
    print(f"# {out['framework']} on {out['device']}: GPT-2 {n_params / 1e6:.1f}M, batch "
          f"{a.batch} x seq {a.seq}, bf16 autocast, AdamW")
    print(f"{'tokens/s':>12} {'step ms':>9} {'TFLOP/s':>8} {'MFU':>6} {'reserved GiB':>13}")
    print(f"{out['tokens_per_s']:12.0f} {1e3 * step_s:9.1f} {tflops:8.1f} {out['mfu']:6.3f} "
          f"{out['max_memory_reserved_bytes'] / 2**30:13.2f}")
    print("json " + json.dumps(out))


if __name__ == "__main__":
    main()
