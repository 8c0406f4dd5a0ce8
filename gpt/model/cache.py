"""The KV cache: keys and values of the positions already processed, so that generating the next
token costs one position's work instead of the whole context's. It owns its state: attention
stores into it, the model advances it and asks it for positions and the attention mask, and a
serving engine selects and merges its rows; nothing else writes its tensors."""

from __future__ import annotations

import torch

# Each buffer has a column more than the cache ever fills. Compiled (torch.compile), a call whose
# columns reach the buffer's end exactly is a graph of its own (the slice of all columns is the
# whole tensor: inductor guards on it): a prompt or window as long as the cache, and the one-token
# step into a cache's last column, a graph for one row and one for several. A serving engine warms
# up every shape before it listens, and no short job can fill a context of thousands of tokens.
SPARE = 1


class KVCache:
    """One (B, n_kv_head, max_len + SPARE, head_dim) buffer per layer, allocated on first use in the
    dtype the layer computes in; at most max_len columns are filled. Prompts of different lengths
    share a batch by left-padding: `pad[b]` is the number of padding columns in front of row b,
    which no query ever attends to."""

    def __init__(self, n_layer: int, max_len: int, pad: torch.Tensor):
        self.max_len = max_len
        self.pad = pad  # (B,) long
        self.min_pad = int(pad.min())
        self.length = 0  # columns filled so far
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys/values at the current columns; return all columns so far."""
        if self.k[layer] is None:
            shape = (k.size(0), k.size(1), self.max_len + SPARE, k.size(3))
            self.k[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.v[layer] = torch.zeros(shape, dtype=v.dtype, device=v.device)
        end = self.length + k.size(2)
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, columns: int) -> None:
        """The columns every layer has just stored now count as filled."""
        self.length += columns

    def positions(self, columns: int, block_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids (B, T) and attention mask (B, 1, T, columns so far) for T new columns.

        Row b's first real token sits at column pad[b] and gets position 0. A query at column c
        sees columns pad[b]..c; a padding query sees only itself (its output is never used, but
        a row with nothing to attend to would turn into NaNs)."""
        start, T = self.length, columns
        if start + T > self.max_len or start + T - self.min_pad > block_size:
            raise ValueError(f"KV cache holds {start} columns; {T} more exceed its size or block_size")
        q_col = torch.arange(start, start + T, device=device)
        k_col = torch.arange(start + T, device=device)
        pad = self.pad.to(device)
        return _positions_and_mask(q_col, k_col, pad)

    # --- rows in, rows out (continuous batching) ----------------------------------------------

    def select(self, rows: list[int], max_len: int) -> KVCache:
        """The kept rows, with the padding columns every kept row has in front removed: the widest
        row then starts at column 0, so the cache is as wide as the longest row; room for
        `max_len` columns."""
        idx = torch.tensor(rows, device=self.pad.device)
        pad = self.pad[idx]
        shift = int(pad.min())
        k = [t[idx][:, :, shift : self.length] for t in self.k]
        v = [t[idx][:, :, shift : self.length] for t in self.v]
        return KVCache._holding(k, v, pad - shift, self.length - shift, max_len)

    def merge(self, other: KVCache, max_len: int) -> KVCache:
        """One cache with this one's rows then `other`'s, right-aligned (each row's newest column
        is the last); the shorter side gets more padding in front."""
        length = max(self.length, other.length)
        k, v = [], []
        for layer in range(len(self.k)):
            for mine, theirs, out in ((self.k, other.k, k), (self.v, other.v, v)):
                x, y = mine[layer][:, :, : self.length], theirs[layer][:, :, : other.length]
                both = x.new_zeros((x.size(0) + y.size(0), x.size(1), length, x.size(3)))
                both[: x.size(0), :, length - self.length :] = x
                both[x.size(0) :, :, length - other.length :] = y
                out.append(both)
        pad = torch.cat([self.pad + (length - self.length), other.pad + (length - other.length)])
        return KVCache._holding(k, v, pad, length, max_len)

    @staticmethod
    def _holding(k: list[torch.Tensor], v: list[torch.Tensor], pad: torch.Tensor, length: int, max_len: int) -> KVCache:
        """A cache holding the first `length` columns of k/v, with room for max_len columns."""
        cache = KVCache(len(k), max_len, pad)
        for layer in range(len(k)):
            shape = (k[layer].size(0), k[layer].size(1), max_len + SPARE, k[layer].size(3))
            cache.k[layer] = k[layer].new_zeros(shape)
            cache.v[layer] = v[layer].new_zeros(shape)
            cache.k[layer][:, :, :length] = k[layer][:, :, :length]
            cache.v[layer][:, :, :length] = v[layer][:, :, :length]
        cache.length = length
        return cache


class StaticKVCache:
    """A cache for one decoder's lifetime: one (B, n_kv_head, max_len, head_dim) buffer per layer,
    allocated up front, written by index at a position that is a tensor on the device.

    Why beside KVCache: KVCache's fill is a Python int and its views grow by a column a token, so
    a compiled model is guarded on the int (a graph per length, or symbolic sizes) and a CUDA graph
    cannot be captured. Here every decode step has the same shapes and the same inputs: the step
    attends over all max_len columns, the unfilled ones masked out by comparing column numbers with
    the position, on the device. The host never reads the position: the decoder counts columns
    itself and checks them against max_len before it calls the model (nothing is checked here, for
    the same reason). The serving engine, which selects and merges rows, keeps KVCache."""

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, max_len: int, pad: torch.Tensor, dtype: torch.dtype):
        shape = (pad.size(0), n_kv_head, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=pad.device) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=pad.device) for _ in range(n_layer)]
        self.max_len = max_len
        self.pad = pad  # (B,) long: padding columns in front of each row, as in KVCache
        self.pos = torch.zeros((), dtype=torch.long, device=pad.device)  # columns filled
        self.columns = torch.arange(max_len, device=pad.device)
        if pad.device.type == "cuda":  # buffers CUDA graphs may keep pointers to (reduce-overhead)
            for t in (*self.k, *self.v, self.pos, self.pad, self.columns):
                torch._dynamo.mark_static_address(t)

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this call's keys/values at the current columns; return every column."""
        at = self.pos + torch.arange(k.size(2), device=k.device)
        self.k[layer].index_copy_(2, at, k.to(self.k[layer].dtype))
        self.v[layer].index_copy_(2, at, v.to(self.v[layer].dtype))
        return self.k[layer], self.v[layer]

    def advance(self, columns: int) -> None:
        self.pos += columns  # in place: the same tensor every step

    def positions(self, columns: int, block_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids (B, T) and attention mask (B, 1, T, max_len) for T new columns; what each
        query sees is as in KVCache.positions (`block_size` is the decoder's to check)."""
        return _positions_and_mask(self.pos + torch.arange(columns, device=device), self.columns, self.pad)


def _positions_and_mask(q_col: torch.Tensor, k_col: torch.Tensor, pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both caches' rule: position ids (B, T) of the query columns q_col (T,) and the mask
    (B, 1, T, key columns k_col) given each row's padding pad (B,); see KVCache.positions."""
    pos = (q_col[None, :] - pad[:, None]).clamp(min=0)
    keys, queries = k_col[None, None, :], q_col[None, :, None]
    visible = (keys <= queries) & (keys >= pad[:, None, None])
    visible |= keys == queries
    return pos, visible[:, None]
