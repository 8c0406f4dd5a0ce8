"""Chat: the template (special tokens, rendering, loss mask; gpt.chat.template), conversation
data and batches (gpt.chat.data), scoring replies (gpt.chat.scoring) and a synthetic suite to
show it all on a CPU (gpt.chat.synthetic). `tinygpt chat` and /v1/chat/completions use them."""
