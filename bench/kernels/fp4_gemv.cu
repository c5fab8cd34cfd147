// NVFP4 weight-only GEMM for few rows (M <= 64): out[M, N] = x[M, K] @ W^T, W in the Marlin
// NVFP4 layout exactly as prepare_nvfp4_layer_for_marlin leaves it (marlin_layout.py models it).
//
// Design (bench/kernels/NOTES.md has the numbers):
// * The weights are the A operand of mma.m16n8k16 (rows = 16 output columns n, 16 k), the
//   activations the B operand (8 rows m). The repack already lays each lane's 8 nibbles of one
//   int32 out as exactly such an A fragment (rows g, g+8; k 2t, 2t+1, 2t+8, 2t+9), and one
//   lane's 16 bytes as the fragments of 4 adjacent 16-column subtiles: a warp reads one
//   16 x 64 tile as 512 contiguous bytes (one 16-byte load per lane).
// * Each warp owns one 64-column n-tile and walks k-tiles; U tiles of weights and their scales
//   are in flight per warp (a register ring refilled as each tile is consumed).
// * Block = 8 warps = WN n-tiles x WK k-interleaved warps. The activations of the block's
//   k-slice pass through shared memory in chunks of 8U k-tiles, double-buffered (16-byte
//   cp.async of the next chunk while this one is consumed), read as B fragments by ldmatrix.
// * Split-K over blocks (gridDim.y): fp32 partials in a workspace, the last block of an
//   n-group (atomic counter, reset by that block) sums them in split order (deterministic).
// * Epilogue: out = acc * g * col_scale[n] + bias[n] in fp32, rounded once to the act dtype.
// FP4 pairs: bf16 with one multiply per pair (fp4_pairs), fp16 with shifts (fp4_pair).
// Block scales decode exactly (fp16: half(s*2^7) as Marlin; bf16: the byte's E5M3 placed in a
// bf16 exponent and multiplied by 2^127, valid for every scale byte, also those Marlin's bf16
// decode reads 2^-112 too small). SM80+ (mma.sync bf16, cp.async, ldmatrix).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp4_ptx.cuh"

namespace fp4k {

constexpr int kThreads = 256;
constexpr int kWarps = 8;

struct GemvParams {
  const void* x;              // [M, lda] activations (act dtype)
  const uint4* qweight;       // [K/16, 2N] int32, as 16-byte units
  const uint8_t* scales;      // [K/16, N] Marlin scale bytes
  const uint16_t* gscale;     // 1 value, act dtype bits: g * 2^(bias - 7)
  const float* col_scale;     // [n_out] or null
  const void* bias;           // [n_out] act dtype or null
  void* out;                  // [M, ldo] act dtype
  float* ws;                  // [splits, M, N] fp32 partials (splits > 1)
  int* counters;              // [gridDim.x] zero before the first call; left zero
  int M, lda, k_in, N, K, n_out, ldo, wn, kt_per_split;
  int cluster;                // SM90 copy engine: the splits of an n-group are one cluster
};

// 16 bytes global -> shared, asynchronous; src_bytes = 0 writes zeros (k beyond the input).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* src, int src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

// The B fragment (k 16 x 8 rows m) of mma.m16n8k16 from row-major [m][k] shared memory:
// matrices 0 and 1 are k 0..7 and 8..15 of the 8 rows; lanes 0..15 give the row addresses.
// `a` is a shared-window address (converted once per kernel, not per tile).
__device__ __forceinline__ uint2 ldmatrix_x2(uint32_t a) {
  uint2 r;
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "r"(a));
  return r;
}

// Two FP4 codes (nibbles at bits 12..15 and 28..31) -> two 16-bit values, fp4 * 2^-126 (bf16)
// or fp4 * 2^-14 (fp16): sign kept, exponent+mantissa bits moved into the low exponent bits.
template <bool kBf16>
__device__ __forceinline__ uint32_t fp4_pair(uint32_t v) {
  constexpr int kShift = kBf16 ? 6 : 3;
  return (v & 0x80008000u) | ((v >> kShift) & (0x70007000u >> kShift));
}

// The four A-operand pairs of one weight word in mma register order: nibbles (0, 4), (2, 6),
// (1, 5), (3, 7), with fp4_pair's values. bf16: one multiply writes a nibble twice, 12 bits up
// (its sign lands on bit 15) and 6 bits up (its magnitude on bits 6..8); the two copies do not
// overlap, so nothing carries, and a mask keeps those four bits. A pair costs and, multiply and
// and, where fp4_pair of a shifted word costs two shifts and two logic ops.
template <bool kBf16>
__device__ __forceinline__ void fp4_pairs(uint32_t q, uint32_t (&a)[4]) {
  if constexpr (kBf16) {
    constexpr uint32_t kKeep = 0x81C081C0u;  // sign and magnitude bits of both halves
    const uint32_t q8 = q >> 8;              // nibbles 2, 3 (6, 7) down to where 0, 1 are
    a[0] = ((q & 0x000F000Fu) * 0x1040u) & kKeep;  // a nibble at bit 0: copies at +12 and +6
    a[1] = ((q8 & 0x000F000Fu) * 0x1040u) & kKeep;
    a[2] = ((q & 0x00F000F0u) * 0x0104u) & kKeep;  // a nibble at bit 4: copies at +8 and +2
    a[3] = ((q8 & 0x00F000F0u) * 0x0104u) & kKeep;
  } else {  // fp16 puts the magnitude 3 bits below the sign's shift: the copies would overlap
    a[0] = fp4_pair<false>(q << 12);
    a[1] = fp4_pair<false>(q << 4);
    a[2] = fp4_pair<false>(q << 8);
    a[3] = fp4_pair<false>(q);
  }
}

// Scale bytes 0 and 2 (odd = false) or 1 and 3 (odd = true) of a word -> 16-bit pair
// (s[row g], s[row g + 8]) times 2^22 (bf16) or 2^7 (fp16).
template <bool kBf16>
__device__ __forceinline__ uint32_t scale_pair(uint32_t w, bool odd) {
  if constexpr (kBf16) {
    uint32_t bits = odd ? ((w >> 4) & 0x0FF00FF0u) : ((w << 4) & 0x0FF00FF0u);  // 2^(e5-127)(1+m/8)
    __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&bits);
    const uint32_t two127 = 0x7F007F00u;  // bf16 2^127 in both halves
    v = __hmul2(v, *reinterpret_cast<const __nv_bfloat162*>(&two127));
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    return odd ? ((w >> 1) & 0x7F807F80u) : ((w << 7) & 0x7F807F80u);  // half(s * 2^7)
  }
}

template <bool kBf16>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  if constexpr (kBf16) {
    __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
  } else {
    __half2 r = __hmul2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
  }
}

// Both halves of a 16-bit pair set to its low (hi = false) or high half. Written with the
// half-precision intrinsics so that ptxas can fold it into the multiply's operand (.H0_H0).
template <bool kBf16>
__device__ __forceinline__ uint32_t bcast(uint32_t v, bool hi) {
  if constexpr (kBf16) {
    __nv_bfloat162 b = *reinterpret_cast<__nv_bfloat162*>(&v);
    b = hi ? __high2bfloat162(b) : __low2bfloat162(b);
    return *reinterpret_cast<uint32_t*>(&b);
  } else {
    __half2 h = *reinterpret_cast<__half2*>(&v);
    h = hi ? __high2half2(h) : __low2half2(h);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// Plain asm (not volatile): the mma has no side effect, so the compiler may schedule it among
// the decode's instructions like any arithmetic.
template <bool kBf16>
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// One 16 x 64 weight tile (a lane's 16 bytes and 8 scale bytes) times the activation
// fragments of its 16 k: decode to the 16-bit operand, scale, 4 x MT mma.
template <bool kBf16, int MT>
__device__ __forceinline__ void tile_mma(float (&acc)[4][MT][4], const uint4& wq, const uint2& sq,
                                         const uint2 (&xb)[MT]) {
  const uint32_t qw[4] = {wq.x, wq.y, wq.z, wq.w};
  const uint32_t sw[2] = {sq.x, sq.y};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t sp = scale_pair<kBf16>(sw[j / 2], j % 2);
    const uint32_t lo = bcast<kBf16>(sp, false), hi = bcast<kBf16>(sp, true);
    uint32_t a[4];
    fp4_pairs<kBf16>(qw[j], a);
    a[0] = mul2<kBf16>(a[0], lo);  // rows g
    a[1] = mul2<kBf16>(a[1], hi);  // rows g + 8
    a[2] = mul2<kBf16>(a[2], lo);
    a[3] = mul2<kBf16>(a[3], hi);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mma16816<kBf16>(acc[j][mt], a, xb[mt].x, xb[mt].y);
  }
}

template <bool kBf16>
__device__ __forceinline__ float act_to_float(const void* p, int i) {
  if constexpr (kBf16) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
  } else {
    return __half2float(reinterpret_cast<const __half*>(p)[i]);
  }
}

template <bool kBf16>
__device__ __forceinline__ void store_act(void* p, size_t i, float v) {
  if constexpr (kBf16) {
    reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    reinterpret_cast<__half*>(p)[i] = __float2half_rn(v);
  }
}

// The block's sums: the WK partial sums of each n-tile reduced in a fixed order and staged as
// [rows, wn * 64] fp32 in shared memory `fsm` (row stride kCStride). Every thread of the block
// calls it (it holds the block's barriers); warps past the 8 computing ones bring no sums.
template <int MT, int kCStride>
__device__ __forceinline__ void stage_sums(const GemvParams& p, float (&acc)[4][MT][4], float* fsm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const bool computes = warp < kWarps;
  const int wn = p.wn, wk = kWarps / wn;
  const int warp_n = warp % wn, warp_k = warp / wn;
  __syncthreads();
  if (wk > 1) {
    if (computes && warp_k > 0) {
      float* dst = fsm + ((warp_k - 1) * wn + warp_n) * 16 * MT * 32 + lane;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dst[((j * MT + mt) * 4 + e) * 32] = acc[j][mt][e];
    }
    __syncthreads();
    if (computes && warp_k == 0) {
      for (int w = 1; w < wk; ++w) {
        const float* src = fsm + ((w - 1) * wn + warp_n) * 16 * MT * 32 + lane;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][mt][e] += src[((j * MT + mt) * 4 + e) * 32];
      }
    }
    __syncthreads();
  }
  if (computes && warp_k == 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int n = warp_n * 64 + j * 16 + g + (e >= 2 ? 8 : 0);
          const int m = mt * 8 + 2 * t + (e & 1);
          fsm[m * kCStride + n] = acc[j][mt][e];
        }
  }
  __syncthreads();
}

// The epilogue of one output: out = v * g * col_scale[n] + bias[n], rounded once. `gmul` is
// the global scale times the operand scale (out_gmul).
template <bool kBf16>
__device__ __forceinline__ float out_gmul(const GemvParams& p) {
  const uint16_t gb = *p.gscale;
  if constexpr (kBf16) {
    return __bfloat162float(__ushort_as_bfloat16(gb)) * 0x1p-15f;  // operand scale 2^-104
  } else {
    return __half2float(__ushort_as_half(gb));  // operand scale 2^-7
  }
}
template <bool kBf16>
__device__ __forceinline__ void store_out(const GemvParams& p, int m, int n, float v, float gmul) {
  v *= gmul;
  if (p.col_scale) v *= p.col_scale[n];
  if (p.bias) v += act_to_float<kBf16>(p.bias, n);
  store_act<kBf16>(p.out, (size_t)m * p.ldo + n, v);
}

// The block's end through global memory: with one split the outputs directly; with several,
// this split's partials into the workspace, and the last block of the n-group (atomic
// counter, reset by that block) sums the splits in split order.
template <bool kBf16, int MT, int kCStride>
__device__ __forceinline__ void finish(const GemvParams& p, float (&acc)[4][MT][4], float* fsm,
                                       const int rows) {
  stage_sums<MT, kCStride>(p, acc, fsm);
  const int cols = p.wn * 64;
  const int n_base = blockIdx.x * cols;
  const float gmul = out_gmul<kBf16>(p);
  const int splits = gridDim.y;
  const int quads = cols / 4;  // the block's outputs go four columns at a time (16 bytes)
  if (splits > 1) {
    float* part = p.ws + (size_t)blockIdx.y * p.M * p.N;
    for (int idx = threadIdx.x; idx < rows * quads; idx += blockDim.x) {
      const int m = idx / quads, nl = (idx % quads) * 4;
      if (n_base + nl < p.N)
        *reinterpret_cast<float4*>(part + (size_t)m * p.N + n_base + nl) =
            *reinterpret_cast<const float4*>(fsm + m * kCStride + nl);
    }
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) last = atomicAdd(p.counters + blockIdx.x, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
  }
  // The last block sums the splits in split order. Round 4 measured this sum as the cost that
  // grows with M (one scalar load chain per output); each thread now has up to 8 splits' 16-byte
  // loads in flight at once, and the additions keep their order (the same bits).
  for (int idx = threadIdx.x; idx < rows * quads; idx += blockDim.x) {
    const int m = idx / quads, nl = (idx % quads) * 4, n = n_base + nl;
    if (n >= p.n_out) continue;
    float v[4];
    if (splits > 1) {
      v[0] = v[1] = v[2] = v[3] = 0.f;
      const float* src = p.ws + (size_t)m * p.N + n;
      const size_t stride = (size_t)p.M * p.N;
      for (int s0 = 0; s0 < splits; s0 += 8) {
        float4 r[8];
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (s0 + j < splits) r[j] = __ldcg(reinterpret_cast<const float4*>(src + (s0 + j) * stride));
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (s0 + j < splits) {
            v[0] += r[j].x;
            v[1] += r[j].y;
            v[2] += r[j].z;
            v[3] += r[j].w;
          }
      }
    } else {
      const float4 f = *reinterpret_cast<const float4*>(fsm + m * kCStride + nl);
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (n + e < p.n_out) store_out<kBf16>(p, m, n + e, v[e], gmul);
  }
  if (splits > 1 && threadIdx.x == 0) p.counters[blockIdx.x] = 0;
}

// The block's end through the cluster (SM90): the splits of an n-group are one cluster of
// gridDim.y blocks (cluster rank = split), each with its sums staged in its own shared memory;
// block q sums the q-th slice of the n-group's outputs from every block's shared memory, in
// split order. The same additions in the same order as finish's workspace path, so the same
// bits, without the workspace's global traffic (at M = 16 and 16 splits as many bytes again as
// the weights), the atomic counter, or one block summing every split alone.
template <bool kBf16, int MT, int kCStride>
__device__ __forceinline__ void finish_cluster(const GemvParams& p, float (&acc)[4][MT][4], float* fsm,
                                               const int rows) {
  stage_sums<MT, kCStride>(p, acc, fsm);
  const int quads = p.wn * 16;  // float4s per output row of the block
  const int n_base = blockIdx.x * p.wn * 64;
  const float gmul = out_gmul<kBf16>(p);
  const int splits = gridDim.y, total = rows * quads;
  const int lo = blockIdx.y * total / splits, hi = (blockIdx.y + 1) * total / splits;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(fsm));
  cluster_sync();  // every block's sums staged (and every block of the cluster running)
  for (int idx = lo + threadIdx.x; idx < hi; idx += blockDim.x) {
    const int m = idx / quads, c = (idx % quads) * 4;
    const uint32_t a = base + 4u * (m * kCStride + c);
    float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int r = 0; r < splits; ++r) {
      const float4 w = ld_cluster_f4(cluster_map(a, r));
      v[0] += w.x;
      v[1] += w.y;
      v[2] += w.z;
      v[3] += w.w;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (n_base + c + e < p.n_out) store_out<kBf16>(p, m, n_base + c + e, v[e], gmul);
  }
  cluster_sync();  // no block leaves while another still reads its shared memory
}

// Shared memory, in 32-bit words, for MT m-blocks of 8 rows and a chunk of 8 * U k-tiles.
template <int MT, int U>
struct Smem {
  static constexpr int kChunkTiles = 8 * U;
  // Activations: two buffers (double-buffered cp.async) of 8*MT rows x the chunk's k, rows
  // padded by 16 bytes so that ldmatrix's 8 row reads fall in distinct banks.
  static constexpr int kXRow = kChunkTiles * 16 + 8;  // 16-bit elements per row
  static constexpr int kXBuf = 8 * MT * kXRow / 2;    // words per buffer
  static constexpr int kX = 2 * kXBuf;
  static constexpr int kRed = (kWarps - 1) * 16 * MT * 32;
  // Widest block: 8 n-tiles, 4 for MT = 8 (keeps the staged output within 99 KB: SM86/89).
  static constexpr int kMaxWn = MT >= 8 ? 4 : 8;
  static constexpr int kCStride = kMaxWn * 64 + 4;  // one row of the block's columns
  static constexpr int kC = 8 * MT * kCStride;
  static constexpr int kWords = kX > kRed ? (kX > kC ? kX : kC) : (kRed > kC ? kRed : kC);
  static constexpr int kBytes = kWords * 4;
};

template <bool kBf16, int MT, int U>
__global__ void __launch_bounds__(kThreads, MT <= 2 ? 2 : 1) fp4_gemv_kernel(const GemvParams p) {
  using S = Smem<MT, U>;
  extern __shared__ uint32_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int wn = p.wn, wk = kWarps / wn;
  const int warp_n = warp % wn, warp_k = warp / wn;
  const int n_tiles = p.N / 64, k_tiles = p.K / 16;
  const int nt = blockIdx.x * wn + warp_n;
  const bool n_ok = nt < n_tiles;
  const int kt0 = blockIdx.y * p.kt_per_split;
  const int kt1 = min(k_tiles, kt0 + p.kt_per_split);
  const int rows = min(p.M, 8 * MT);

  // The warp's i-th k-tile is kt0 + warp_k + wk * i; a chunk of 8U k-tiles holds U * wn of them.
  const uint4* wptr = p.qweight + (size_t)nt * 32 + lane;
  const size_t w_row = (size_t)p.N / 2;  // 16-byte units per k-tile row
  const uint8_t* sptr = p.scales + (size_t)nt * 64 + g * 8;

  uint4 wq[U];
  uint2 sq[U];
#pragma unroll
  for (int s = 0; s < U; ++s) {
    const int kt = kt0 + warp_k + wk * s;
    const bool ok = n_ok && kt < kt1;
    wq[s] = make_uint4(0, 0, 0, 0);
    sq[s] = make_uint2(0, 0);
    ld_weights(wq[s], wptr + (ok ? kt : 0) * w_row, ok);
    ld_scales(sq[s], sptr + (size_t)(ok ? kt : 0) * p.N, ok);
  }

  float acc[4][MT][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][mt][e] = 0.f;

  // Activations: rows >= M stay zero (written once); chunk c of the block's k-slice is copied
  // (cp.async) into buffer c % 2 while chunk c - 1 is consumed.
  {
    uint4* z = reinterpret_cast<uint4*>(smem);
    for (int idx = threadIdx.x; idx < S::kX / 4; idx += kThreads) z[idx] = make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  const uint16_t* xg = reinterpret_cast<const uint16_t*>(p.x);
  auto fill = [&](int cb, int buf) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(smem + buf * S::kXBuf);
    const int per_row = S::kChunkTiles * 2;  // 16-byte pieces of one row
    for (int idx = threadIdx.x; idx < rows * per_row; idx += kThreads) {
      const int m = idx / per_row, piece = idx % per_row;
      const int k = cb * 16 + piece * 8;
      const bool in = k < p.k_in;
      cp_async16(dst + m * S::kXRow + piece * 8, xg + (in ? (size_t)m * p.lda + k : 0), in ? 16 : 0);
    }
    cp_async_commit();
  };
  // ldmatrix row address of this lane (rows g of m-block 0; lanes 8..15: k + 8) as a
  // shared-window byte address, converted once here rather than per tile.
  const uint32_t lm_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) +
                           2u * ((lane % 8) * S::kXRow + ((lane / 8) % 2) * 8);
  // Next refill: the warp's k-tile U ahead, as 32-bit byte offsets from the tile-row-0
  // pointers (the host refuses weights too large for them), one add each per tile.
  int kn = kt0 + warp_k + wk * U;
  const char* wbase = reinterpret_cast<const char*>(wptr);
  const char* sbase = reinterpret_cast<const char*>(sptr);
  uint32_t woff = (uint32_t)kn * (uint32_t)p.N * 8u, soff = (uint32_t)kn * (uint32_t)p.N;
  const uint32_t wstep = (uint32_t)wk * (uint32_t)p.N * 8u, sstep = (uint32_t)wk * (uint32_t)p.N;

  // One k-tile from ring slot s: its activation fragment, decode and mma; then the slot is
  // refilled with the warp's k-tile U ahead (after its last use: no copies).
  auto tile = [&](const int s, const uint32_t xaddr) {
    uint2 xb[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) xb[mt] = ldmatrix_x2(xaddr + mt * 16u * S::kXRow);
    tile_mma<kBf16, MT>(acc, wq[s], sq[s], xb);
    const bool more = kn < kt1;
    ld_weights(wq[s], reinterpret_cast<const uint4*>(wbase + woff), more);
    ld_scales(sq[s], reinterpret_cast<const uint8_t*>(sbase + soff), more);
    kn += wk;
    woff += wstep;
    soff += sstep;
  };

  if (kt0 < kt1) fill(kt0, 0);
  for (int cb = kt0, c = 0; cb < kt1; cb += S::kChunkTiles, ++c) {
    if (cb + S::kChunkTiles < kt1) {
      fill(cb + S::kChunkTiles, (c + 1) % 2);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // chunk c is in buffer c % 2 for every thread
    const uint32_t xbuf = lm_base + (c % 2) * 4u * S::kXBuf;
    // Every tile is tested, also in chunks whose tiles all exist: the test ends a basic block
    // per tile, which keeps each refill load in its own tile. Without it (one straight-line
    // block per chunk) ptxas sinks all U refills to the block's end, so the next chunk's first
    // tiles wait for loads issued a tile earlier instead of U tiles earlier (bench NOTES).
    for (int r = 0; r < wn; ++r) {
      const int lt0 = warp_k + wk * r * U;  // chunk-local k-tile of slot 0
#pragma unroll
      for (int s = 0; s < U; ++s)
        if (n_ok && cb + lt0 + wk * s < kt1) tile(s, xbuf + 32u * (lt0 + wk * s));
    }
    __syncthreads();  // buffer c % 2 is consumed before chunk c + 2 is copied into it
  }

  finish<kBf16, MT, S::kCStride>(p, acc, reinterpret_cast<float*>(smem), rows);
}

// Which loader fp4_gemv uses: -1 (default) and 1 the copy engine where the GPU has one
// (SM90) and the register ring below it; 0 the ring everywhere; 2 the copy engine with the
// splits summed through the global workspace (round 3's end) instead of the cluster. Set by
// fp4_gemv_loader (benchmarks); a GPU without the copy engine never gets its kernel.
inline int g_loader = -1;

inline bool use_copy_engine() {
  if (g_loader == 0) return false;
  static int major = -1;  // the process's device generation, asked once
  if (major < 0) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      major = 0;
  }
  return major >= 9;
}
// ---- SM90: the copy engine streams the weights -------------------------------------------
// The register ring above keeps at most U tiles per warp in flight, and a loads-only probe of
// that scheme (bw_probe.cu) streams the layout at 58-72 % of the roofline even with no decode;
// a producer warp that hands whole rows of the block's n-tiles to the copy engine
// (cp.async.bulk into a ring of shared-memory stages, one mbarrier pair per stage) reached
// 81-101 % on the large shapes. Here the 8 computing warps read their tiles from those stages
// (weights, scale bytes and the activations of the stage's k-range arrive by the same copies),
// with the decode, mma and end of the ring kernel.

constexpr int kStageRows = 8;             // k-tile rows per stage
constexpr int kStageBudget = 72 * 1024;   // bytes of stages per block: 3 blocks per SM at wn 4
constexpr int kBarBytes = 128;            // full[8] and empty[8] mbarriers, before the stages

__host__ __device__ constexpr int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }
__host__ __device__ constexpr int clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

template <int MT>
struct TmaSmem {
  static constexpr int kXRow = kStageRows * 16 + 8;  // halves per activation row (+16 B: banks)
  static constexpr int kXBytes = 8 * MT * kXRow * 2;
  static constexpr int kMaxWn = MT >= 8 ? 4 : 8;
  static constexpr int kCStride = kMaxWn * 64 + 4;
  __host__ __device__ static constexpr int stage_bytes(int wn) { return kStageRows * 576 * wn + kXBytes; }
  __host__ __device__ static constexpr int stages(int wn) { return clamp(kStageBudget / stage_bytes(wn), 2, 8); }
  static constexpr int bytes(int wn) {
    return kBarBytes + max3(stages(wn) * stage_bytes(wn), (kWarps - wn) * 16 * MT * 32 * 4, 8 * MT * kCStride * 4);
  }
};

// Block = 8 computing warps (WN n-tiles x WK k-interleaved, as the ring kernel) + 1 producer
// warp. Stage i of the block's k-slice holds k-tile rows kt0 + 8i .. + 7 of its n-tiles, their
// scale bytes and the activations of those 128 k; rows >= M are zero (written once), as are
// activations past k_in (written by the producer before it hands the stage to the copies).
template <bool kBf16, int MT, int WN>
__global__ void __launch_bounds__(kThreads + 32, MT <= 2 ? 2 : 1) fp4_gemv_tma_kernel(const GemvParams p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  using S = TmaSmem<MT>;
  extern __shared__ __align__(128) uint32_t smem[];
  constexpr int wn = WN, wk = kWarps / WN;
  constexpr int stages = S::stages(WN);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_tiles = p.N / 64, k_tiles = p.K / 16;
  const int nt0 = blockIdx.x * wn, nts = min(wn, n_tiles - nt0);
  const int kt0 = blockIdx.y * p.kt_per_split;
  const int kt1 = min(k_tiles, kt0 + p.kt_per_split);
  const int n_stages = (kt1 - kt0 + kStageRows - 1) / kStageRows;
  const int rows = min(p.M, 8 * MT);
  constexpr int row_w = 512 * wn, row_s = 64 * wn;  // bytes of one k-tile row of the block's n-tiles
  constexpr int w_bytes = kStageRows * row_w, s_bytes = kStageRows * row_s;
  constexpr int stage_bytes = S::stage_bytes(wn);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t stage0 = base + kBarBytes;
  auto full = [&](int st) { return base + 8u * st; };
  auto empty = [&](int st) { return base + 8u * (8 + st); };
  uint8_t* sm = reinterpret_cast<uint8_t*>(smem);

  for (int st = 0; st < stages; ++st) {  // activation rows >= M: zero for good
    uint8_t* xs = sm + kBarBytes + st * stage_bytes + w_bytes + s_bytes;
    for (int idx = threadIdx.x; idx < S::kXBytes / 16; idx += blockDim.x)
      if (idx / (S::kXRow / 8) >= rows) reinterpret_cast<uint4*>(xs)[idx] = make_uint4(0, 0, 0, 0);
  }
  if (threadIdx.x == 0) {
    for (int st = 0; st < stages; ++st) {
      mbar_init(full(st), 1);
      mbar_init(empty(st), kWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  float acc[4][MT][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][mt][e] = 0.f;

  if (warp == kWarps) {  // the producer
    const char* wsrc = reinterpret_cast<const char*>(p.qweight) + (size_t)nt0 * 512;
    const uint8_t* ssrc = p.scales + (size_t)nt0 * 64;
    const char* xsrc = reinterpret_cast<const char*>(p.x);
    for (int i = 0; i < n_stages; ++i) {
      const int st = i % stages;
      if (i >= stages) mbar_wait(empty(st), ((i / stages) - 1) & 1);
      const int r0 = kt0 + i * kStageRows, nr = min(kStageRows, kt1 - r0);
      const int kvalid = max(0, min(nr * 16, p.k_in - r0 * 16));  // activations that exist
      const uint32_t sb = stage0 + st * stage_bytes, xs = sb + w_bytes + s_bytes;
      const int pieces = (nr * 16 - kvalid) / 8;  // 16-byte pieces past k_in, per row
      if (pieces > 0) {
        uint8_t* xg = sm + kBarBytes + st * stage_bytes + w_bytes + s_bytes;
        for (int idx = lane; idx < rows * pieces; idx += 32)
          *reinterpret_cast<uint4*>(xg + (idx / pieces) * S::kXRow * 2 + kvalid * 2 + (idx % pieces) * 16) =
              make_uint4(0, 0, 0, 0);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      }
      __syncwarp();
      if (lane == 0) {
        mbar_expect_tx(full(st), (uint32_t)(nr * 576 * nts + rows * kvalid * 2));
        for (int r = 0; r < nr; ++r) {
          const size_t kt = r0 + r;
          bulk_copy(sb + r * row_w, wsrc + kt * p.N * 8, 512 * nts, full(st));
          bulk_copy(sb + w_bytes + r * row_s, ssrc + kt * p.N, 64 * nts, full(st));
        }
        if (kvalid > 0)
          for (int m = 0; m < rows; ++m)
            bulk_copy(xs + m * S::kXRow * 2, xsrc + ((size_t)m * p.lda + r0 * 16) * 2, kvalid * 2, full(st));
      }
      __syncwarp();
    }
  } else {
    const int warp_n = warp % wn, warp_k = warp / wn;
    const bool n_ok = warp_n < nts;
    const int g = lane / 4;
    // ldmatrix row address of this lane inside a stage's activations (as the ring kernel's).
    const uint32_t lm = w_bytes + s_bytes + 2u * ((lane % 8) * S::kXRow + ((lane / 8) % 2) * 8);
    for (int i = 0; i < n_stages; ++i) {
      const int st = i % stages;
      mbar_wait(full(st), (i / stages) & 1);
      const int nr = min(kStageRows, kt1 - (kt0 + i * kStageRows));
      const uint32_t sb = stage0 + st * stage_bytes;
      // This warp's tiles of the stage: rows warp_k, warp_k + WK, ... (WN of 8 in a full stage:
      // unrolled, every shared address an offset of one base register).
      const uint32_t wq0 = sb + warp_k * row_w + warp_n * 512 + lane * 16;
      const uint32_t sq0 = sb + w_bytes + warp_k * row_s + warp_n * 64 + g * 8;
      const uint32_t xq0 = sb + lm + 32u * warp_k;
      auto one = [&](const int j) {
        const uint4 q = lds128(wq0 + j * wk * row_w);
        const uint2 sc = lds64(sq0 + j * wk * row_s);
        uint2 xb[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) xb[mt] = ldmatrix_x2(xq0 + mt * 16u * S::kXRow + 32u * wk * j);
        tile_mma<kBf16, MT>(acc, q, sc, xb);
      };
      if (n_ok && nr == kStageRows) {
#pragma unroll
        for (int j = 0; j < kStageRows / wk; ++j) one(j);
      } else if (n_ok) {
        for (int j = 0; warp_k + wk * j < nr; ++j) one(j);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty(st));
    }
  }
  // Every copy has landed (the computing warps waited for each stage): the stages' memory is
  // free for the end's reduction and staging.
  float* fsm = reinterpret_cast<float*>(sm + kBarBytes);
  if (p.cluster) {
    finish_cluster<kBf16, MT, S::kCStride>(p, acc, fsm, rows);
  } else {
    finish<kBf16, MT, S::kCStride>(p, acc, fsm, rows);
  }
#else
  __trap();  // launched only on SM90 (fp4_gemv picks the ring kernel below it)
#endif
}

constexpr int kMaxCluster = 16;  // blocks per cluster on SM90 (8 portable, 16 allowed)
// Shared memory a cluster launch asks for at least: more than a third of an SM's 228 KB, so
// at most 2 blocks share an SM. Clusters are placed GPC by GPC; where 3 fit (MT = 1, wn 4:
// 62 KB, 64 registers), round 4's first run measured the cluster end 10-22 % slower than the
// workspace end at the same (wn, splits) at M = 1 (o_8b, down_8b), and faster where 2 fit.
constexpr int kClusterSmem = 76 * 1024;
constexpr int cluster_bytes(int bytes) { return bytes > kClusterSmem ? bytes : kClusterSmem; }

template <bool kBf16, int MT, int WN>
cudaError_t tma_attributes() {  // once per instantiation: its shared memory, clusters of 16
  static const cudaError_t e = [] {
    const auto kernel = fp4_gemv_tma_kernel<kBf16, MT, WN>;
    cudaError_t r = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         cluster_bytes(TmaSmem<MT>::bytes(WN)));  // either launch
    if (r == cudaSuccess) r = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return r;
  }();
  return e;
}

template <bool kBf16, int MT, int WN>
cudaLaunchConfig_t tma_config(dim3 grid, int splits, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads + 32);
  cfg.dynamicSmemBytes = cluster_bytes(TmaSmem<MT>::bytes(WN));
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = 1;
  attr->val.clusterDim.y = splits;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Blocks of this kernel resident at once when the `splits` blocks of each n-group form one
// cluster (clusters place on one GPC: fewer than 2 per SM may fit); 0 where none fits.
template <bool kBf16, int MT, int WN>
int tma_cluster_blocks(int splits) {
  static int known[kMaxCluster + 1] = {};  // per cluster size: blocks + 1, 0 = not asked yet
  if (splits < 2 || splits > kMaxCluster) return 0;
  if (!known[splits]) {
    int clusters = 0;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = tma_config<kBf16, MT, WN>(dim3(1, splits), splits, nullptr, &attr);
    if (tma_attributes<kBf16, MT, WN>() != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&clusters, fp4_gemv_tma_kernel<kBf16, MT, WN>, &cfg) != cudaSuccess) {
      cudaGetLastError();  // a size this GPU refuses: the workspace path
      clusters = 0;
    }
    known[splits] = clusters * splits + 1;
  }
  return known[splits] - 1;
}

// The blocks resident at once (bf16's kernel; fp16's has the same resources): for the plan
// and cluster_end.
inline int tma_cluster_slots(int mt, int wn, int splits) {
  if (wn == 4)
    return mt == 1   ? tma_cluster_blocks<true, 1, 4>(splits)
           : mt == 2 ? tma_cluster_blocks<true, 2, 4>(splits)
           : mt == 4 ? tma_cluster_blocks<true, 4, 4>(splits)
                     : tma_cluster_blocks<true, 8, 4>(splits);
  return mt == 1   ? tma_cluster_blocks<true, 1, 8>(splits)
         : mt == 2 ? tma_cluster_blocks<true, 2, 8>(splits)
         : mt == 4 ? tma_cluster_blocks<true, 4, 8>(splits)
                   : 0;
}

// Whether a copy-engine call sums its `splits` splits through the cluster: the loader allows it
// and clusters of that size fit this GPU. fp4_gemv and fp4_gemv_end both ask here.
inline bool cluster_end(int mt, int wn, int splits) { return g_loader != 2 && tma_cluster_slots(mt, wn, splits) > 0; }

template <bool kBf16, int MT, int WN>
cudaError_t launch_tma_wn(GemvParams p, int splits, cudaStream_t stream) {
  const cudaError_t e = tma_attributes<kBf16, MT, WN>();
  if (e != cudaSuccess) return e;
  const dim3 grid((p.N / 64 + WN - 1) / WN, splits);
  p.cluster = cluster_end(MT, WN, splits);
  if (!p.cluster) {
    fp4_gemv_tma_kernel<kBf16, MT, WN><<<grid, kThreads + 32, TmaSmem<MT>::bytes(WN), stream>>>(p);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = tma_config<kBf16, MT, WN>(grid, splits, stream, &attr);
  return cudaLaunchKernelEx(&cfg, fp4_gemv_tma_kernel<kBf16, MT, WN>, p);
}

// The copy-engine kernel is built for blocks of 4 and 8 n-tiles (rows of 2 and 4 KB; narrower
// rows stream slower, bw_probe.cu); MT = 8 takes 4 at most, as the ring kernel.
template <bool kBf16, int MT>
cudaError_t launch_tma(const GemvParams& p, int splits, cudaStream_t stream) {
  if (p.wn == 4) return launch_tma_wn<kBf16, MT, 4>(p, splits, stream);
  if constexpr (MT < 8) {
    if (p.wn == 8) return launch_tma_wn<kBf16, MT, 8>(p, splits, stream);
  }
  return cudaErrorInvalidValue;
}

template <bool kBf16, int MT, int U>
cudaError_t launch(const GemvParams& p, int splits, cudaStream_t stream) {
  using S = Smem<MT, U>;
  if (p.wn > S::kMaxWn) return cudaErrorInvalidValue;
  static bool attr_set = false;  // one per instantiation
  if (!attr_set) {
    cudaError_t e = cudaFuncSetAttribute(fp4_gemv_kernel<kBf16, MT, U>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes);
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  const int groups = (p.N / 64 + p.wn - 1) / p.wn;
  dim3 grid(groups, splits);
  fp4_gemv_kernel<kBf16, MT, U><<<grid, kThreads, S::kBytes, stream>>>(p);
  return cudaGetLastError();
}

// k-tiles per split for `splits` requested over `k_tiles`; `splits` becomes the count launched
// (none left empty). fp4_gemv and fp4_gemv_end both split here.
inline int split_k(int k_tiles, int& splits) {
  const int per_split = (k_tiles + splits - 1) / splits;
  splits = (k_tiles + per_split - 1) / per_split;
  return splits == 1 ? k_tiles : per_split;
}

// Which template serves M rows: m-blocks of 8 rounded up to 1, 2, 4 or 8; fewer tiles in
// flight as the accumulators grow.
constexpr int kMaxM = 64;
inline int mt_for(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

}  // namespace fp4k

extern "C" {


// Select the gemv's loader (-1 or 1: the copy engine where the GPU has one, 0: the register
// ring, 2: the copy engine with round 3's workspace end); returns the one now in effect
// (0 ring, 1 copy engine, 2 copy engine + workspace end).
int fp4_gemv_loader(int which) {
  fp4k::g_loader = which < -1 || which > 2 ? -1 : which;
  return fp4k::use_copy_engine() ? (fp4k::g_loader == 2 ? 2 : 1) : 0;
}

// Kernel shape for (M, N, K) on `sms` multiprocessors: wn n-tiles per block and k-splits over
// blocks. The copy engine: wn 4 or 8, one wave; the ring: wn 1-8, full waves of blocks, >= 16
// k-tiles per warp, few splits.
int fp4_gemv_plan(int M, int N, int K, int sms, int* wn_out, int* splits_out) {
  if (M < 1 || M > fp4k::kMaxM || N % 64 || K % 16 || sms < 1) return 1;
  const int mt = fp4k::mt_for(M);
  const int n_tiles = N / 64, k_tiles = K / 16;
  const bool copy_engine = fp4k::use_copy_engine();
  double best = -1.0;
  int best_wn = copy_engine ? 4 : 8, best_s = 1;  // K too short for any candidate
  if (copy_engine) {
    // Round 3's sweep (reports/h200/kernels/round-3): one wave of blocks at 2 per SM, rows of
    // 8 n-tiles where N allows (4 KB copies), splits from a short list (even stages). With the
    // cluster end, the blocks a wave holds are those whose clusters fit (the runtime says).
    const bool cluster = fp4k::g_loader != 2;
    for (int s : {1, 2, 3, 4, 6, 8, 12, 16}) {
      if (k_tiles < 16 * s) break;
      for (int wn = mt >= 8 ? 4 : 8; wn >= 4; wn /= 2) {
        const int slots = cluster && s > 1 ? fp4k::tma_cluster_slots(mt, wn, s) : 2 * sms;
        if (slots < 1) continue;
        const int blocks = ((n_tiles + wn - 1) / wn) * s;
        const int waves = (blocks + slots - 1) / slots;
        const double score = (double)blocks / ((double)waves * slots) * (wn == 8 ? 1.0 : 0.9) -
                             0.001 * s - 0.1 * (waves - 1);
        if (score > best + 1e-9) {
          best = score;
          best_wn = wn;
          best_s = s;
        }
      }
    }
    *wn_out = best_wn;
    *splits_out = best_s;
    return 0;
  }
  const int slots = sms * (mt <= 2 ? 2 : 1);
  for (int s = 1; s <= k_tiles; ++s) {
    for (int wn = mt >= 8 ? 4 : 8; wn >= 1; wn /= 2) {
      const int wk = 8 / wn;
      const int blocks = ((n_tiles + wn - 1) / wn) * s;
      const double warp_kt = (double)k_tiles / s / wk;
      if (warp_kt < 8.0) continue;
      const int waves = (blocks + slots - 1) / slots;
      double score = (double)blocks / ((double)waves * slots);  // fill of the last wave
      if (warp_kt < 16.0) score *= 0.8;                         // short pipelines
      score -= 0.01 * (s - 1) * (M > 8 ? 2 : 1);                // partial sums cost
      if (score > best + 1e-9) {
        best = score;
        best_wn = wn;
        best_s = s;
      }
    }
  }
  *wn_out = best_wn;
  *splits_out = best_s;
  return 0;
}

// Which end a (M, N, K, wn, splits) call of fp4_gemv runs with the loader in effect and 16-byte
// aligned scales: 0 the register ring, 1 the copy engine summing its splits through the cluster,
// 2 the copy engine summing them through the workspace (or with one split: none); -1 refused.
int fp4_gemv_end(int M, int N, int K, int wn, int splits) {
  if (M < 1 || M > fp4k::kMaxM || N % 64 || K % 16 || splits < 1 || splits > K / 16) return -1;
  if (!fp4k::use_copy_engine() || !(wn == 4 || wn == 8)) return 0;
  if (fp4k::mt_for(M) == 8 && wn == 8) return -1;  // the copy engine's MT = 8 kernel takes wn 4
  fp4k::split_k(K / 16, splits);
  return fp4k::cluster_end(fp4k::mt_for(M), wn, splits) ? 1 : 2;
}

// Floats of workspace and ints of counters a (M, N, K, wn, splits) call needs.
void fp4_gemv_workspace(int M, int N, int wn, int splits, long long* ws_floats, int* counters) {
  *ws_floats = splits > 1 ? (long long)splits * M * N : 0;
  *counters = (N / 64 + wn - 1) / wn;
}

// 0 on success, a cudaError_t, or -1 for arguments it refuses (shape, alignment, sizes).
int fp4_gemv(const void* x, int lda, int M, int k_in, const void* qweight, const void* scales,
             const void* gscale, const float* col_scale, const void* bias, void* out, int ldo,
             int N, int K, int n_out, float* ws, long long ws_floats, int* counters,
             int n_counters, int is_bf16, int wn, int splits, void* stream) {
  if (M < 1 || M > fp4k::kMaxM || N % 64 || K % 16 || k_in > K || k_in % 16 || n_out > N)
    return -1;
  if (lda % 8 || (reinterpret_cast<uintptr_t>(x) & 15) || (reinterpret_cast<uintptr_t>(qweight) & 15) ||
      (reinterpret_cast<uintptr_t>(scales) & 7))
    return -1;
  if (!(wn == 1 || wn == 2 || wn == 4 || wn == 8) || splits < 1 || splits > K / 16) return -1;
  // The kernel steps 32-bit byte offsets through the weights, up to 64 k-tiles past the end.
  if ((long long)(K / 16 + 64) * N * 8 >= (1LL << 32)) return -1;
  const int groups = (N / 64 + wn - 1) / wn;
  if (splits > 1 && (ws_floats < (long long)splits * M * N || n_counters < groups)) return -1;
  if (splits > 1 && (reinterpret_cast<uintptr_t>(ws) & 15)) return -1;  // read 16 bytes at a time
  fp4k::GemvParams p;
  p.x = x;
  p.qweight = reinterpret_cast<const uint4*>(qweight);
  p.scales = reinterpret_cast<const uint8_t*>(scales);
  p.gscale = reinterpret_cast<const uint16_t*>(gscale);
  p.col_scale = col_scale;
  p.bias = bias;
  p.out = out;
  p.ws = ws;
  p.counters = counters;
  p.M = M;
  p.lda = lda;
  p.k_in = k_in;
  p.N = N;
  p.K = K;
  p.n_out = n_out;
  p.ldo = ldo;
  p.wn = wn;
  p.kt_per_split = fp4k::split_k(K / 16, splits);
  p.cluster = 0;  // launch_tma_wn decides
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const int mt = fp4k::mt_for(M);
  cudaError_t e;
  // The copy engine reads 16-byte aligned rows (the scale bytes' start must be too) of 4 or
  // 8 n-tiles; other widths (explicit wn 1, 2) run the ring kernel.
  if (fp4k::use_copy_engine() && (reinterpret_cast<uintptr_t>(scales) & 15) == 0 && (wn == 4 || wn == 8)) {
    if (is_bf16) {
      e = mt == 1 ? fp4k::launch_tma<true, 1>(p, splits, st)
        : mt == 2 ? fp4k::launch_tma<true, 2>(p, splits, st)
        : mt == 4 ? fp4k::launch_tma<true, 4>(p, splits, st)
                  : fp4k::launch_tma<true, 8>(p, splits, st);
    } else {
      e = mt == 1 ? fp4k::launch_tma<false, 1>(p, splits, st)
        : mt == 2 ? fp4k::launch_tma<false, 2>(p, splits, st)
        : mt == 4 ? fp4k::launch_tma<false, 4>(p, splits, st)
                  : fp4k::launch_tma<false, 8>(p, splits, st);
    }
  } else if (is_bf16) {
    e = mt == 1 ? fp4k::launch<true, 1, 8>(p, splits, st)
      : mt == 2 ? fp4k::launch<true, 2, 8>(p, splits, st)
      : mt == 4 ? fp4k::launch<true, 4, 8>(p, splits, st)
                : fp4k::launch<true, 8, 4>(p, splits, st);
  } else {
    e = mt == 1 ? fp4k::launch<false, 1, 8>(p, splits, st)
      : mt == 2 ? fp4k::launch<false, 2, 8>(p, splits, st)
      : mt == 4 ? fp4k::launch<false, 4, 8>(p, splits, st)
                : fp4k::launch<false, 8, 4>(p, splits, st);
  }
  return static_cast<int>(e);
}

const char* fp4k_error_string(int code) {
  if (code == -1) return "fp4 kernels: argument refused (shape, alignment or workspace size)";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // extern "C"
