// NVFP4 Marlin layout -> 16-bit weights [rows, K] (row = output column n), for the prefill path:
// dequantize a chunk of columns into bounded scratch, then a cuBLAS GEMM reads it.
//
// out[n - n0, k] = fp4(n, k) * block_scale(n, k / 16) * row_scale[n] * mult, rounded once to the
// act dtype (fp32 arithmetic; without row_scale and with mult = 1 it is exact: a 2-bit by
// 4-bit significand product). The global scale stays out (the GEMM's alpha), so the bf16 chunk
// holds the exact checkpoint products.
//
// Block: 8 warps over one 64-column n-tile x 8 k-tiles (128 k). Warp w reads k-tile 8b + w:
// 512 contiguous bytes (one 16-byte load per lane) and its 8 scale bytes, decodes its 32 values
// into a shared [64][128 + 8] tile (conflict-free 4-byte writes), then the block writes 64 rows
// of 256 bytes with 16-byte stores.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace fp4k {

constexpr int kDqThreads = 256;
constexpr int kDqKTiles = 8;
constexpr int kDqRow = kDqKTiles * 16 + 8;  // 16-bit elements per shared row (padded)

__device__ __forceinline__ float fp4_value(uint32_t code) {
  // E2M1 magnitude bits into the fp32 exponent's low bits: fp4 * 2^-126 (denormal for 0.5,
  // kept: no flush-to-zero in this file), then * 2^126.
  const uint32_t bits = ((code & 8u) << 28) | ((code & 7u) << 22);
  return __uint_as_float(bits) * 0x1p126f;
}

__device__ __forceinline__ float scale_value(uint32_t byte) {
  // sign-less E5M3 byte = high byte of half(s * 2^7) << 1
  return __half2float(__ushort_as_half(static_cast<unsigned short>(byte << 7))) * 0x1p-7f;
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <bool kBf16>
__global__ void __launch_bounds__(kDqThreads) fp4_dequant_kernel(
    const uint4* __restrict__ qweight, const uint8_t* __restrict__ scales,
    const float* __restrict__ row_scale, float mult, int N, int K, int n0, int k_out,
    uint16_t* __restrict__ out, int ldo) {
  __shared__ __align__(16) uint32_t tile[64 * kDqRow / 2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int nt = n0 / 64 + blockIdx.y;
  const int kt = blockIdx.x * kDqKTiles + warp;
  if (kt < K / 16) {
    const uint4 q = qweight[(size_t)kt * (N / 2) + nt * 32 + lane];
    const uint2 sb = *reinterpret_cast<const uint2*>(scales + (size_t)kt * N + nt * 64 + g * 8);
    const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // scale bytes of subtile j: rows g and g + 8 (marlin_layout.KERNEL_SCALE_BYTE)
      const uint32_t word = j < 2 ? sb.x : sb.y;
      const int sh = (j % 2) * 8;
      float s_lo = scale_value((word >> sh) & 0xFF) * mult;
      float s_hi = scale_value((word >> (16 + sh)) & 0xFF) * mult;
      const int row_lo = j * 16 + g, row_hi = row_lo + 8;
      if (row_scale) {
        s_lo *= row_scale[nt * 64 + row_lo];
        s_hi *= row_scale[nt * 64 + row_hi];
      }
      const uint32_t w = qw[j];
      // nibble p: (k, row) = (2t, g) (2t+8, g) (2t, g+8) (2t+8, g+8) (2t+1, g) (2t+9, g) ...
      auto nib = [&](int p) { return (w >> (4 * p)) & 0xFu; };
      const int col = (warp * 16 + 2 * t) / 2;  // 32-bit word of (k, k+1) in the shared row
      tile[row_lo * (kDqRow / 2) + col] = pack2<kBf16>(fp4_value(nib(0)) * s_lo, fp4_value(nib(4)) * s_lo);
      tile[row_lo * (kDqRow / 2) + col + 4] = pack2<kBf16>(fp4_value(nib(1)) * s_lo, fp4_value(nib(5)) * s_lo);
      tile[row_hi * (kDqRow / 2) + col] = pack2<kBf16>(fp4_value(nib(2)) * s_hi, fp4_value(nib(6)) * s_hi);
      tile[row_hi * (kDqRow / 2) + col + 4] = pack2<kBf16>(fp4_value(nib(3)) * s_hi, fp4_value(nib(7)) * s_hi);
    }
  }
  __syncthreads();
  // 64 rows x 16 chunks of 16 bytes
  const int k_base = blockIdx.x * kDqKTiles * 16;
  for (int c = threadIdx.x; c < 64 * 16; c += kDqThreads) {
    const int row = c / 16, ch = c % 16;
    const int k = k_base + ch * 8;
    if (k >= k_out) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(&tile[row * (kDqRow / 2) + ch * 4]);
    *reinterpret_cast<uint4*>(out + (size_t)(blockIdx.y * 64 + row) * ldo + k) = v;
  }
}

}  // namespace fp4k

extern "C" {

// Rows [n0, n1) of the layout (n0, n1 multiples of 64) into out[n1 - n0, ldo] (k < k_out).
// row_scale: float32 [N] or null; mult: a host factor (1 to keep the chunk exact).
// 0 on success, a cudaError_t, or -1 for arguments it refuses.
int fp4_dequant(const void* qweight, const void* scales, const float* row_scale, float mult,
                int N, int K, int n0, int n1, int k_out, void* out, int ldo, int is_bf16,
                void* stream) {
  if (N % 64 || K % 16 || n0 % 64 || n1 % 64 || n0 < 0 || n1 > N || n1 <= n0 || k_out > K ||
      k_out % 8 || ldo % 8 || ldo < k_out || (reinterpret_cast<uintptr_t>(out) & 15) ||
      (reinterpret_cast<uintptr_t>(qweight) & 15) || (reinterpret_cast<uintptr_t>(scales) & 7))
    return -1;
  dim3 grid((K / 16 + fp4k::kDqKTiles - 1) / fp4k::kDqKTiles, (n1 - n0) / 64);
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  auto q = reinterpret_cast<const uint4*>(qweight);
  auto s = reinterpret_cast<const uint8_t*>(scales);
  auto o = reinterpret_cast<uint16_t*>(out);
  if (is_bf16) {
    fp4k::fp4_dequant_kernel<true><<<grid, fp4k::kDqThreads, 0, st>>>(q, s, row_scale, mult, N, K, n0, k_out, o, ldo);
  } else {
    fp4k::fp4_dequant_kernel<false><<<grid, fp4k::kDqThreads, 0, st>>>(q, s, row_scale, mult, N, K, n0, k_out, o, ldo);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
