/* A Llama-family model's decoder layers over one flat pass, in one call from Python.
 *
 * Each layer is nine kernel calls (RMSNorm, the QKV GEMM, rotary with the KV write, attention, the
 * output GEMM with its residual, RMSNorm, the gate GEMM with SiLU, the up GEMM times the gate, the down
 * GEMM with its residual). Driven from Python, each call cost its arguments' checks, `data_ptr`
 * lookups, an output's allocation and a ctypes crossing: SmolLM2 spent 3.1 of a 12.0 ms bfloat16
 * pass at 1 row outside the kernels, 3.5 of 15.6 at 8 rows (AMD EPYC, Zen 4). Here the same kernels
 * run with the same arguments, in the same order, so every output has the same bits as the Python
 * loop's (`engine/native_llama.py`); the kernels come as function pointers into their own libraries,
 * each built with its own flags.
 *
 * Per layer, the pointers of `layers[l * LAYER_POINTERS + ...]`; the hidden state [tokens, hidden]
 * updated in place (the residual stream), `scratch` the pass's intermediates. Byte offsets use
 * `element` (4 for float32, 2 for bfloat16). */
#include <stddef.h>
#include <stdint.h>

typedef void (*rms_norm_fn)(const void *x, const void *weight, void *out, int64_t rows, int64_t dim, double eps,
                            int num_threads);
typedef void (*gemm_fn)(const void *x, const void *panels, const void *bias, const void *other, void *out,
                        int64_t rows, int64_t n, int64_t k, int op, int num_threads);
typedef void (*rotary_write_fn)(void *qk, int64_t token_stride, const void *v, int64_t v_stride, const void *cos,
                                const void *sin, int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t dim,
                                int64_t value_dim, const int64_t *slots, void *key_pool, void *value_pool,
                                int64_t pool_positions, int num_threads);
typedef void (*attention_fn)(const void *q, const void *k_pool, const void *v_pool, void *out, const int64_t *tables,
                             int64_t table_stride, int64_t q_stride, const int64_t *row_first,
                             const int64_t *row_tokens, const int64_t *row_start, int64_t num_rows,
                             int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t value_dim,
                             int64_t pool_positions, int64_t block_size, double scale, int64_t few_lanes,
                             int num_threads);

enum { OP_NONE = 0, OP_ADD = 1, OP_MUL = 2, OP_SILU = 3 }; /* streamed_gemm.c's post-ops */
/* a layer's pointers, in `layer_loop.py`'s LAYER_POINTERS order (a bias may be NULL) */
enum { INPUT_NORM, QKV, QKV_BIAS, OUT, OUT_BIAS, POST_NORM, GATE, UP, DOWN, KEY_POOL, VALUE_POOL, LAYER_POINTERS };

#define POINTER(name) ((void *)layer[name])

static inline char *at(void *base, int64_t elements, int64_t element) { return (char *)base + elements * element; }

void decoder_layers(void *rms_norm_ptr, void *gemm_ptr, void *rotary_write_ptr, void *attention_ptr,
                    const uintptr_t *layers, int64_t first_layer, int64_t end_layer, void *hidden, void *scratch,
                    const void *cos, const void *sin, const int64_t *slots, const int64_t *tables,
                    int64_t table_stride, const int64_t *rows, int64_t num_rows, int64_t tokens,
                    int64_t hidden_size, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                    int64_t intermediate, int64_t pool_positions, int64_t block_size, int64_t few_lanes,
                    int64_t element, double eps, double scale, int num_threads) {
    rms_norm_fn rms_norm = (rms_norm_fn)rms_norm_ptr;
    gemm_fn gemm = (gemm_fn)gemm_ptr;
    rotary_write_fn rotary_write = (rotary_write_fn)rotary_write_ptr;
    attention_fn attention = (attention_fn)attention_ptr;
    int64_t q_dims = q_heads * head_dim, kv_dims = kv_heads * head_dim, qkv_dims = q_dims + 2 * kv_dims;
    /* the intermediates, one after another: the residual after attention, a norm's output, QKV,
     * attention's output, the gate and the gated up projection */
    char *residual = scratch, *normed = at(residual, tokens * hidden_size, element);
    char *qkv = at(normed, tokens * hidden_size, element), *attended = at(qkv, tokens * qkv_dims, element);
    char *gate = at(attended, tokens * q_dims, element), *up = at(gate, tokens * intermediate, element);
    const int64_t *row_first = rows, *row_tokens = rows + num_rows, *row_start = rows + 2 * num_rows;
    for (int64_t l = first_layer; l < end_layer; l++) {
        const uintptr_t *layer = layers + l * LAYER_POINTERS;
        rms_norm(hidden, POINTER(INPUT_NORM), normed, tokens, hidden_size, eps, num_threads);
        gemm(normed, POINTER(QKV), POINTER(QKV_BIAS), NULL, qkv, tokens, qkv_dims, hidden_size, OP_NONE, num_threads);
        rotary_write(qkv, qkv_dims, at(qkv, q_dims + kv_dims, element), qkv_dims, cos, sin, tokens, q_heads,
                     kv_heads, head_dim, head_dim, slots, POINTER(KEY_POOL), POINTER(VALUE_POOL), pool_positions,
                     num_threads);
        attention(qkv, POINTER(KEY_POOL), POINTER(VALUE_POOL), attended, tables, table_stride, qkv_dims, row_first,
                  row_tokens, row_start, num_rows, q_heads, kv_heads, head_dim, head_dim, pool_positions,
                  block_size, scale, few_lanes, num_threads);
        gemm(attended, POINTER(OUT), POINTER(OUT_BIAS), hidden, residual, tokens, hidden_size, q_dims, OP_ADD,
             num_threads);
        rms_norm(residual, POINTER(POST_NORM), normed, tokens, hidden_size, eps, num_threads);
        gemm(normed, POINTER(GATE), NULL, NULL, gate, tokens, intermediate, hidden_size, OP_SILU, num_threads);
        gemm(normed, POINTER(UP), NULL, gate, up, tokens, intermediate, hidden_size, OP_MUL, num_threads);
        gemm(up, POINTER(DOWN), NULL, residual, hidden, tokens, hidden_size, intermediate, OP_ADD, num_threads);
    }
}
