"""Chat: the template (special tokens, rendering, loss mask; gpt.chat.template), conversation
data and batches (gpt.data.chat), scoring replies (gpt.evals.chat) and a synthetic suite to
show it all on a CPU (gpt.chat.synthetic). `tinygpt chat` and /v1/chat/completions use them."""
