import sys, time, statistics, ctypes, mmap
import torch
from transformers import AutoModelForCausalLM
from specbatch.engine.forward import PagedModel
from specbatch.engine.gguf_models import model_dir
from specbatch.engine.loading import kv_shape
from specbatch.engine.native_llama import NativeLlama
from specbatch.engine.paged_cache import ATTENTION_NAME, PagedKVCache
libc = ctypes.CDLL("libc.so.6"); libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
HUGE = 2 << 20
def thp_like(t):
    n = t.numel() * t.element_size()
    buf = torch.empty(n + HUGE, dtype=torch.uint8)
    off = (-buf.data_ptr()) % HUGE
    region = buf[off:off + n]
    size = (n + HUGE - 1) // HUGE * HUGE
    assert libc.madvise(region.data_ptr(), min(size, n + HUGE - off), 14) == 0
    out = region.view(t.dtype).view(t.shape)
    out.copy_(t)
    out._keep = buf
    return out
dtype = getattr(torch, sys.argv[1]); context = 256
model = AutoModelForCausalLM.from_pretrained(model_dir("smollm2-135m"), dtype=dtype, attn_implementation=ATTENTION_NAME).eval()
shape = kv_shape(model)
rows_list = [int(r) for r in sys.argv[2].split(",")]
nb = max(rows_list) * -(-(context + 16) // 16)
def make(thp):
    cache = PagedKVCache(shape.num_layers, nb, 16, shape.num_kv_heads, shape.head_dim, dtype, "cpu")
    nat = NativeLlama(model)
    if thp:
        cache.keys = [thp_like(k) for k in cache.keys]; cache.values = [thp_like(v) for v in cache.values]
        lins = [nat.lm_head] + [getattr(L, r) for L in nat.layers for r in ("qkv", "out", "gate", "up", "down")]
        for lin in lins:
            if lin.panels is not None: lin.panels.data = thp_like(lin.panels.data)
            if lin.packed is not None: pass
    return PagedModel(model, cache, native=nat)
B, A = make(True), make(False)
print([l.strip() for l in open('/proc/self/smaps_rollup') if 'AnonHuge' in l])
perm = torch.randperm(nb, generator=torch.Generator().manual_seed(0)).tolist()
for rows in rows_list:
    per = -(-(context + 16) // 16)
    tables = [perm[r * per:(r + 1) * per] for r in range(rows)]
    for m in (A, B):
        m.forward(tables, [0] * rows, [[11] * context for _ in range(rows)], keep_logits=False)
    chunks = [[17] for _ in range(rows)]
    ta, tb = [], []
    for i in range(25):
        for m, acc in ((B, tb), (A, ta)):
            t = time.perf_counter(); m.forward(tables, [context] * rows, chunks); acc.append(time.perf_counter() - t)
    a, b = statistics.median(ta[3:]) * 1000, statistics.median(tb[3:]) * 1000
    print(f"{sys.argv[1]} rows {rows}: 4K pages {a:.2f} ms, huge {b:.2f} ms, huge/4K {b/a:.3f}")
