"""Evaluation: perplexity and bits per byte (perplexity), log-likelihood scoring (scoring), the
zero-shot tasks (tasks), replies to held-out conversations (chat), and EleutherAI's harness
adapter (harness)."""
