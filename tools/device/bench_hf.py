#!/usr/bin/env python3
"""bench_hf.py MODEL_DIR: the baseline vlmd's engine is compared with, in the
same run on the same GPU: Hugging Face transformers (bf16, its default
attention) on the checkpoint make_random_qwen.py wrote. Measures what
vlmd-bench-engine does: decode at batch 1, 32 and 128 (512-token prompts, 256
new tokens, end-of-sequence ignored) and the prefill of one 8192-token prompt.
Prints one "HF ..." line per measure."""
import sys, time
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16, device_map="cuda").eval()
vocab = model.config.vocab_size
gen = torch.Generator(device="cuda").manual_seed(0)


def ids(batch, n):
    return torch.randint(0, vocab, (batch, n), device="cuda", generator=gen)


@torch.no_grad()
def prefill(n):
    x = ids(1, n)
    model(x)  # warm-up
    torch.cuda.synchronize()
    t = time.perf_counter()
    model(x, logits_to_keep=1)
    torch.cuda.synchronize()
    return time.perf_counter() - t


@torch.no_grad()
def decode(batch, prompt=512, new=256):
    x = ids(batch, prompt)
    mask = torch.ones_like(x)
    kw = dict(attention_mask=mask, do_sample=False, min_new_tokens=new, max_new_tokens=new,
              pad_token_id=0)
    model.generate(x, **{**kw, "min_new_tokens": 4, "max_new_tokens": 4})  # warm-up
    torch.cuda.synchronize()
    t = time.perf_counter()
    model.generate(x, **{**kw, "max_new_tokens": 1, "min_new_tokens": 1})
    torch.cuda.synchronize()
    t_prefill = time.perf_counter() - t
    t = time.perf_counter()
    model.generate(x, **kw)
    torch.cuda.synchronize()
    total = time.perf_counter() - t
    step = (total - t_prefill) / (new - 1)
    return step, batch / step


s = prefill(8192)
print(f"HF prefill 1 x 8192: {s:.3f} s ({8192 / s:.0f} tokens/s)", flush=True)
for b in (1, 32, 128):
    step, rate = decode(b)
    print(f"HF decode batch {b}, prompt 512, gen 256: {step * 1e3:.2f} ms/step, {rate:.1f} tokens/s",
          flush=True)
