#!/usr/bin/env python3
"""The host's time per operation in PyTorch eager on a GPU: the figure the time model's host
bound takes as `host.kernel_issue_s` (docs/time_model.md, "Host overhead"), which the bundled
profiles assume (10 us) for want of a measurement.

Each case issues many operations on tensors so small that the GPU finishes each long before the
host issues the next, so the host's wall time over the operations is its time per operation:
  - plain: an elementwise add on a 1024-element tensor, no autograd;
  - forward: a chain of the ops a transformer block issues (linear, layer_norm, gelu, add,
    softmax, dropout at p 0.1) on tensors that require gradients, under torch.autocast in bf16,
    each counted as the kernels the profiler saw it launch;
  - backward: that chain's backward, per kernel launched.
The kernels are counted with torch.profiler (CUDA activities) on one repetition, then the
repetitions are timed without it. Prints a table and one JSON line (prefixed "json ") with the
seconds per kernel of each case; scripts/gpu_session.sh stores it under results/gpu/. Usage:

    python3 scripts/bench_torch_dispatch.py --reps 200
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def plain(x):
    for _ in range(100):
        x = x + 1.0
    return x


def chain(x, w1, b1, w2, b2, g, bn):
    """One small block's forward: what a transformer's modules issue, op by op."""
    y = F.layer_norm(x, (x.shape[-1],), g, bn)
    y = F.linear(y, w1, b1)
    y = F.gelu(y, approximate="tanh")
    y = F.linear(y, w2, b2)
    y = F.dropout(y, p=0.1, training=True)
    x = x + y
    s = torch.softmax(x @ x.transpose(-1, -2), dim=-1)
    return x + s @ x


def kernels_of(fn):
    """CUDA kernels fn launches (memcpy and memset included), counted by the profiler."""
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        torch.cuda.synchronize()
    # kineto lists the kernels as device-side events, older profilers as each CPU op's kernels
    events = prof.events()
    device = sum(1 for e in events if str(getattr(e, "device_type", "")).endswith("CUDA"))
    attached = sum(len(getattr(e, "kernels", None) or []) for e in events)
    return max(device, attached)


def host_s(fn, reps):
    """Host wall time of reps calls, the GPU drained before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return t1 - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_torch_dispatch: no CUDA device")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    n, c = 16, 64
    x0 = torch.randn(1024, device=dev)
    params = [(torch.randn(s, device=dev) * 0.1).requires_grad_()
              for s in ((4 * c, c), (4 * c,), (c, 4 * c), (c,), (c,), (c,))]
    xin = torch.randn(n, c, device=dev, requires_grad=True)

    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return chain(xin, *params).float().sum()

    def fwd_bwd():
        fwd().backward()

    cases = {}
    for _ in range(3):  # warm-up: the caching allocator, cuBLAS handles, lazy module loads
        plain(x0), fwd_bwd()
    k_plain = kernels_of(lambda: plain(x0))
    k_fwd = kernels_of(fwd)
    k_all = kernels_of(fwd_bwd)
    if min(k_plain, k_fwd, k_all - k_fwd) < 1:
        raise SystemExit(f"bench_torch_dispatch: the profiler counted {k_plain}, {k_fwd} and "
                         f"{k_all - k_fwd} kernels: no per-kernel figure")
    t_plain = host_s(lambda: plain(x0), a.reps)
    t_fwd = host_s(fwd, a.reps)
    t_all = host_s(fwd_bwd, a.reps)
    cases["plain"] = t_plain / (a.reps * k_plain)
    cases["forward"] = t_fwd / (a.reps * k_fwd)
    cases["backward"] = (t_all - t_fwd) / (a.reps * (k_all - k_fwd))
    name = torch.cuda.get_device_name(0)
    print(f"# torch {torch.__version__} on {name}: host seconds per kernel launched, "
          f"{a.reps} repetitions")
    print(f"{'case':<10} {'kernels':>8} {'us/kernel':>10}")
    for case, k in (("plain", k_plain), ("forward", k_fwd), ("backward", k_all - k_fwd)):
        print(f"{case:<10} {k:>8} {cases[case] * 1e6:>10.2f}")
    print("json " + json.dumps({"framework": f"pytorch eager {torch.__version__}", "device": name,
                                "reps": a.reps, "kernels": {"plain": k_plain, "forward": k_fwd,
                                                            "backward": k_all - k_fwd},
                                "host_s_per_kernel": cases}))


if __name__ == "__main__":
    main()
