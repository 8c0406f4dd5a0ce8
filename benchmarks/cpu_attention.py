"""Whether a CPU should compute short attention in fp32 under bf16 autocast (the policy behind
gpt.runtime.devices.CPU_FP32_ATTENTION_BELOW): forward+backward of causal SDPA at a few shapes,
in bf16 against upcast to fp32, medians of 30 after 5 warm-up calls. Run it alone (timings).

    python benchmarks/cpu_attention.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

SHAPES = [(12, 3, 64, 16), (12, 4, 64, 32), (12, 6, 128, 64), (8, 6, 256, 64), (4, 12, 1024, 64)]  # (B, heads, T, head_dim)


def median_ms(B: int, H: int, T: int, D: int, upcast: bool, reps: int = 30) -> float:
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def once() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if upcast:  # what gpt.model.attention._sdpa does below the threshold
                with torch.autocast("cpu", enabled=False):
                    y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).to(v.dtype)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.sum().backward()

    for _ in range(5):
        once()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return sorted(times)[reps // 2] * 1000


def main() -> None:
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for B, H, T, D in SHAPES:
        bf16, fp32 = median_ms(B, H, T, D, False), median_ms(B, H, T, D, True)
        print(f"batch {B}, {H} heads of {D}, {T} positions: bf16 {bf16:.2f} ms, fp32 {fp32:.2f} ms ({bf16 / fp32:.2f}x)")


if __name__ == "__main__":
    main()
