// FlashAttention-2-style causal GQA attention on the tensor cores, bf16 (in progress).
