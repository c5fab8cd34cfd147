// How fast can one loading scheme stream the Marlin NVFP4 layout? Loads only, no decode.
//
// Round 1 measured the gemv at 22-38 % of the HBM roofline at M = 1 and Nsight Compute called
// it latency-bound (NOTES.md). This program separates the loading scheme from the arithmetic:
// each mode reads exactly the bytes a M = 1 GEMM reads (weights [K/16, 8N bytes] and scale
// bytes [K/16, N]) in the order a kernel of that scheme would, folds them into one word per
// warp (so nothing is optimised away) and is timed with CUDA events over buffers rotated past
// the L2. Modes:
//   copy    every block streams a contiguous share of both arrays (16-byte loads, 4 in flight
//           per thread): what the GPU's memory gives a plain read
//   ring    the gemv's scheme: warp = one 64-column n-tile, k-tiles interleaved over the
//           block's WK warps, a register ring of U tiles (weights 16 B + scales 8 B a lane)
//           refilled as each is consumed; blocks = n-groups x k-splits, at most 2 blocks per
//           SM (the gemv's occupancy for M <= 16)
//   bulk    a producer warp copies rows of the block's n-tiles into a ring of S shared-memory
//           stages with the copy engine (cp.async.bulk, one mbarrier per stage); the 8
//           consumer warps read them from shared memory; blocks = n-groups x k-splits
// Output: one JSON object per line (shape, mode, parameters, microseconds, share of the roofline).
// Build and run (SM90): nvcc -O3 -std=c++17 -arch=sm_90a -o bw_probe bw_probe.cu && ./bw_probe
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <vector>

#include "fp4_ptx.cuh"

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

namespace {

using fp4k::ld_scales;
using fp4k::ld_weights;

constexpr int kWarps = 8;
constexpr double kRooflineBytesPerUs = 4.25e6;  // 4.25 TB/s, the benchmark's roofline

struct Layout {
  const uint4* w;     // [K/16][N/2] 16-byte units
  const uint8_t* s;   // [K/16][N]
  int N, K;
};

__global__ void copy_kernel(Layout l, uint32_t* sink) {
  const size_t w_units = (size_t)l.K / 16 * l.N / 2, s_units = (size_t)l.K / 16 * l.N / 16;
  const uint4* s4 = reinterpret_cast<const uint4*>(l.s);
  const size_t all = w_units + s_units, per = (all + gridDim.x - 1) / gridDim.x;
  const size_t lo = blockIdx.x * per, hi = min(all, lo + per);
  uint32_t acc = 0;
  for (size_t i = lo + threadIdx.x; i < hi; i += 4 * blockDim.x) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const size_t j = i + u * blockDim.x;
      v[u] = make_uint4(0, 0, 0, 0);
      const bool ok = j < hi;
      ld_weights(v[u], (ok && j >= w_units) ? s4 + (j - w_units) : l.w + (ok ? j : 0), ok);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

template <int U>
__global__ void ring_kernel(Layout l, int wn, int kt_per_split, uint32_t* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int wk = kWarps / wn, warp_n = warp % wn, warp_k = warp / wn;
  const int nt = blockIdx.x * wn + warp_n, k_tiles = l.K / 16;
  const bool n_ok = nt < l.N / 64;
  const int kt0 = blockIdx.y * kt_per_split, kt1 = min(k_tiles, kt0 + kt_per_split);
  const uint4* wp = l.w + (size_t)nt * 32 + lane;
  const uint8_t* sp = l.s + (size_t)nt * 64 + g * 8;
  const size_t w_row = (size_t)l.N / 2;
  // The gemv's ring prologue, line for line (fp4_gemv.cu keeps it inline: moved into a shared
  // function, ptxas scheduled the ring kernel differently, and the rounds measured this code).
  uint4 wq[U];
  uint2 sq[U];
#pragma unroll
  for (int s = 0; s < U; ++s) {
    const int kt = kt0 + warp_k + wk * s;
    const bool ok = n_ok && kt < kt1;
    wq[s] = make_uint4(0, 0, 0, 0);
    sq[s] = make_uint2(0, 0);
    ld_weights(wq[s], wp + (ok ? kt : 0) * w_row, ok);
    ld_scales(sq[s], sp + (size_t)(ok ? kt : 0) * l.N, ok);
  }
  uint32_t acc = 0;
  for (int base = kt0 + warp_k; base < kt1; base += wk * U) {
#pragma unroll
    for (int s = 0; s < U; ++s) {
      if (base + wk * s < kt1) {
        acc ^= wq[s].x ^ wq[s].y ^ wq[s].z ^ wq[s].w ^ sq[s].x ^ sq[s].y;
        const int kn = base + wk * (s + U);
        const bool ok = n_ok && kn < kt1;
        ld_weights(wq[s], wp + (size_t)(ok ? kn : 0) * w_row, ok);
        ld_scales(sq[s], sp + (size_t)(ok ? kn : 0) * l.N, ok);
      }
    }
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

// --- bulk: the copy engine fills a shared-memory ring, consumers read it -------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

constexpr int kStageRows = 8;  // k-tile rows per stage

// Shared memory of the bulk kernel for wn n-tiles and S stages, in bytes.
inline size_t bulk_smem(int wn, int stages) {
  return (size_t)stages * kStageRows * 576 * wn + 2 * 8 * (size_t)stages;
}

__global__ void bulk_kernel(Layout l, int wn, int stages, int kt_per_split, uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int row_w = 512 * wn, row_s = 64 * wn;  // bytes of one k-tile row of the block's n-tiles
  uint8_t* wbuf = sm;
  uint8_t* sbuf = sm + (size_t)stages * kStageRows * row_w;
  uint64_t* full = reinterpret_cast<uint64_t*>(sbuf + (size_t)stages * kStageRows * row_s);
  uint64_t* empty = full + stages;
  const int k_tiles = l.K / 16, n_tiles = l.N / 64;
  const int nt0 = blockIdx.x * wn, nts = min(wn, n_tiles - nt0);
  const int kt0 = blockIdx.y * kt_per_split, kt1 = min(k_tiles, kt0 + kt_per_split);
  const int n_stages = (kt1 - kt0 + kStageRows - 1) / kStageRows;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      fp4k::mbar_init(smem_u32(&full[s]), 1);
      fp4k::mbar_init(smem_u32(&empty[s]), kWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (warp == kWarps) {  // producer
    if (lane == 0) {
      const char* wsrc = reinterpret_cast<const char*>(l.w) + (size_t)nt0 * 512;
      const uint8_t* ssrc = l.s + (size_t)nt0 * 64;
      for (int i = 0; i < n_stages; ++i) {
        const int st = i % stages;
        if (i >= stages) fp4k::mbar_wait(smem_u32(&empty[st]), ((i / stages) - 1) & 1);
        const int r0 = kt0 + i * kStageRows, rows = min(kStageRows, kt1 - r0);
        const uint32_t bar = smem_u32(&full[st]);
        fp4k::mbar_expect_tx(bar, (uint32_t)rows * (512 + 64) * nts);
        for (int r = 0; r < rows; ++r) {
          const size_t kt = r0 + r;
          fp4k::bulk_copy(smem_u32(wbuf + ((size_t)st * kStageRows + r) * row_w), wsrc + kt * l.N * 8, 512 * nts, bar);
          fp4k::bulk_copy(smem_u32(sbuf + ((size_t)st * kStageRows + r) * row_s), ssrc + kt * l.N, 64 * nts, bar);
        }
      }
    }
    return;
  }
  const int wk = kWarps / wn, warp_n = warp % wn, warp_k = warp / wn;
  uint32_t acc = 0;
  for (int i = 0; i < n_stages; ++i) {
    const int st = i % stages;
    fp4k::mbar_wait(smem_u32(&full[st]), (i / stages) & 1);
    const int rows = min(kStageRows, kt1 - (kt0 + i * kStageRows));
    if (warp_n < nts) {
      for (int r = warp_k; r < rows; r += wk) {
        const uint4 v = *reinterpret_cast<const uint4*>(wbuf + ((size_t)st * kStageRows + r) * row_w +
                                                        warp_n * 512 + lane * 16);
        const uint2 q = *reinterpret_cast<const uint2*>(sbuf + ((size_t)st * kStageRows + r) * row_s +
                                                        warp_n * 64 + g * 8);
        acc ^= v.x ^ v.y ^ v.z ^ v.w ^ q.x ^ q.y;
      }
    }
    __syncwarp();
    if (lane == 0) fp4k::mbar_arrive(smem_u32(&empty[st]));
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

struct Shape {
  const char* name;
  int N, K;
};
const Shape kShapes[] = {{"qkv_8b", 6144, 4096},      {"o_8b", 4096, 4096},       {"gate_up_8b", 28672, 4096},
                         {"down_8b", 4096, 14336},    {"qkv_70b", 10240, 8192},   {"o_70b", 8192, 8192},
                         {"gate_up_70b", 57344, 8192}, {"down_70b", 8192, 28672}};

// Copies of the layer's arrays, together well past the L2, cycled through launch by launch.
struct Buffers {
  std::vector<Layout> copies;
  std::vector<void*> mem;
  explicit Buffers(const Shape& sh) {
    const size_t wb = (size_t)sh.K / 16 * sh.N * 8, sb = (size_t)sh.K / 16 * sh.N;
    const int n = (int)std::max<size_t>(2, (512u << 20) / (wb + sb) + 1);
    for (int i = 0; i < n; ++i) {
      void *w, *s;
      CHECK(cudaMalloc(&w, wb));
      CHECK(cudaMalloc(&s, sb));
      CHECK(cudaMemset(w, i + 1, wb));
      CHECK(cudaMemset(s, i + 7, sb));
      mem.push_back(w);
      mem.push_back(s);
      copies.push_back({reinterpret_cast<const uint4*>(w), reinterpret_cast<const uint8_t*>(s), sh.N, sh.K});
    }
  }
  ~Buffers() {
    for (void* p : mem) cudaFree(p);
  }
};

template <class Launch>
double time_us(Buffers& b, Launch launch) {
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  const int n = (int)b.copies.size(), reps = std::max(20, 2 * n);
  for (int i = 0; i < 3; ++i) launch(b.copies[i % n]);
  CHECK(cudaEventRecord(t0));
  for (int i = 0; i < reps; ++i) launch(b.copies[i % n]);
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  CHECK(cudaGetLastError());
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  CHECK(cudaEventDestroy(t0));
  CHECK(cudaEventDestroy(t1));
  return 1e3 * ms / reps;
}

void emit(const Shape& sh, const char* mode, int wn, int splits, int depth, int blocks, double us) {
  const double bytes = (double)sh.K / 16 * sh.N * 9;  // 8 weight bytes + 1 scale byte per 16 x 1
  printf(
      "{\"shape\": \"%s\", \"mode\": \"%s\", \"wn\": %d, \"splits\": %d, \"depth\": %d, \"blocks\": %d, "
      "\"us\": %.3f, \"roofline_us\": %.3f, \"roofline_share\": %.4f}\n",
      sh.name, mode, wn, splits, depth, blocks, us, bytes / kRooflineBytesPerUs, bytes / kRooflineBytesPerUs / us);
  fflush(stdout);
}

template <int U>
void run_ring(const Shape& sh, Buffers& b, uint32_t* sink, int wn, int splits) {
  const int groups = (sh.N / 64 + wn - 1) / wn, k_tiles = sh.K / 16;
  const int per = (k_tiles + splits - 1) / splits;
  dim3 grid(groups, (k_tiles + per - 1) / per);
  // Dynamic shared memory only to hold the gemv's 2 blocks per SM.
  constexpr int kSmem = 100 * 1024;
  CHECK(cudaFuncSetAttribute(ring_kernel<U>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const double us = time_us(b, [&](const Layout& l) { ring_kernel<U><<<grid, 256, kSmem>>>(l, wn, per, sink); });
  emit(sh, "ring", wn, splits, U, grid.x * grid.y, us);
}

void run_bulk(const Shape& sh, Buffers& b, uint32_t* sink, int wn, int splits, int stages) {
  const size_t smem = bulk_smem(wn, stages);
  if (smem > 227 * 1024) return;
  CHECK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const int groups = (sh.N / 64 + wn - 1) / wn, k_tiles = sh.K / 16;
  const int per = (k_tiles + splits - 1) / splits;
  dim3 grid(groups, (k_tiles + per - 1) / per);
  const double us = time_us(b, [&](const Layout& l) {
    bulk_kernel<<<grid, (kWarps + 1) * 32, smem>>>(l, wn, stages, per, sink);
  });
  emit(sh, "bulk", wn, splits, stages, grid.x * grid.y, us);
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint32_t* sink;
  CHECK(cudaMalloc(&sink, 1 << 20));
  for (const Shape& sh : kShapes) {
    Buffers b(sh);
    for (int blocks : {sms, 2 * sms, 4 * sms, 8 * sms}) {
      const double us = time_us(b, [&](const Layout& l) { copy_kernel<<<blocks, 256>>>(l, sink); });
      emit(sh, "copy", 0, 0, 4, blocks, us);
    }
    const int n_tiles = sh.N / 64;
    for (int wn : {1, 2, 4}) {
      for (int splits : {1, 2, 3, 4, 6, 8}) {
        const int blocks = (n_tiles + wn - 1) / wn * splits;
        if (blocks < sms || blocks > 16 * sms || sh.K / 16 / splits / (kWarps / wn) < 8) continue;
        run_ring<4>(sh, b, sink, wn, splits);
        run_ring<8>(sh, b, sink, wn, splits);
        run_ring<16>(sh, b, sink, wn, splits);
        for (int stages : {4, 8, 16, 32}) run_bulk(sh, b, sink, wn, splits, stages);
      }
    }
  }
  CHECK(cudaFree(sink));
  return 0;
}
