// Test-data helpers that run between timed ops (never inside a timed region): the stand-in
// "experts" that turn dispatched tokens into combine inputs, and an order-independent digest of
// output rows used to compare every measured iteration with the one checked on the host.
#include "common.cuh"

// Expert output of a row: bf16(dequant(x) * factor). The test data are chosen so that every
// step is exact in f32 and bf16 (hw/src/data.rs), so the host can predict each bit.
DEVICE u16 expert_value(const u8* row, const float* scales, int h, int fp8, float factor) {
    float v;
    if (fp8) {
        v = e4m3_to_f32(row[h]) * scales[h / 128];
    } else {
        v = bf16_to_f32(((const u16*)row)[h]);
    }
    return f32_to_bf16(v * factor);
}

// Normal mode: rows [0, num_rows) of one rank's recv_x -> bf16 combine input.
extern "C" __global__ void make_expert_output_normal(const u8* recv_x, const float* recv_scales,
                                                     int num_rows, int hidden, int fp8,
                                                     float factor, u16* out) {
    const int row_bytes = fp8 ? hidden : 2 * hidden;
    const int num_scales = hidden / 128;
    const u64 total = (u64)num_rows * hidden;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / hidden;
        const int h = (int)(i % hidden);
        out[i] = expert_value(recv_x + r * row_bytes, recv_scales + r * num_scales, h, fp8, factor);
    }
}

// Low-latency mode: the packed rows of each local expert of one rank; the factor depends on the
// global expert (8 + e % 7) / 8. Rows past the expert's count are left alone.
extern "C" __global__ void make_expert_output_ll(const u8* packed_x, const float* packed_scales,
                                                 const int* packed_count, int capacity,
                                                 int num_local_experts, int expert_base, int hidden,
                                                 int fp8, u16* out) {
    const int row_bytes = fp8 ? hidden : 2 * hidden;
    const int num_scales = hidden / 128;
    const u64 total = (u64)num_local_experts * capacity * hidden;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / hidden;
        const int h = (int)(i % hidden);
        const int le = (int)(r / capacity), row = (int)(r % capacity);
        if (row >= packed_count[le]) continue;
        const float factor = (float)(8 + (expert_base + le) % 7) / 8.0f;
        out[i] = expert_value(packed_x + r * row_bytes, packed_scales + r * num_scales, h, fp8, factor);
    }
}

DEVICE u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Sum over rows of a hash of each row's words: independent of row order (low-latency packing
// order varies from run to run), sensitive to every word's value and position in its row.
// With `row_count_per_group`, row r counts only if r % rows_per_group < count[r / rows_per_group]
// (the packed rows of each local expert).
extern "C" __global__ void digest_rows(const u32* data, u64 num_rows, int row_words,
                                       u64 row_stride_words, const int* row_count_per_group,
                                       int rows_per_group, u64* out) {
    const int lane = threadIdx.x % 32;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const u64 num_warps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 r = warp; r < num_rows; r += num_warps) {
        if (row_count_per_group != nullptr &&
            (int)(r % rows_per_group) >= row_count_per_group[r / rows_per_group])
            continue;
        const u32* row = data + r * row_stride_words;
        u64 h = 0x9e3779b97f4a7c15ull * (u64)(lane + 1);
        for (int w = lane; w < row_words; w += 32) h = mix64(h ^ ((u64)row[w] << 20 ^ (u64)w));
        u32 lo = (u32)h, hi = (u32)(h >> 32);
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            lo += __shfl_xor_sync(0xffffffffu, lo, m);
            hi += __shfl_xor_sync(0xffffffffu, hi, m);
        }
        if (lane == 0) atomicAdd((unsigned long long*)out, (unsigned long long)mix64(((u64)hi << 32) | lo));
    }
}
