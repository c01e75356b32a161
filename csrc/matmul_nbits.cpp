// matmul_nbits.cpp: MatMulNBits drivers (levels 0-3 float, level 4 int8): code decoding (shared by every path), A quantized to int8, and tasks on the thread pool.
#include "matmul_nbits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "dispatch.h"
#include "thread_pool.h"

namespace qmm {

void decode_nbits(const uint8_t* __restrict row, int64_t bits, int64_t count, uint8_t* __restrict out) {
  switch (bits) {
    case 8: std::memcpy(out, row, static_cast<size_t>(count)); return;
    case 4: {
      const int64_t whole = count / 2;
      for (int64_t i = 0; i < whole; ++i) {
        out[2 * i] = row[i] & 0x0F;
        out[2 * i + 1] = row[i] >> 4;
      }
      if (count % 2) out[count - 1] = row[whole] & 0x0F;
      return;
    }
    case 2: {
      const int64_t whole = count / 4;
      for (int64_t i = 0; i < whole; ++i) {
        const uint8_t b = row[i];
        out[4 * i] = b & 3;
        out[4 * i + 1] = (b >> 2) & 3;
        out[4 * i + 2] = (b >> 4) & 3;
        out[4 * i + 3] = b >> 6;
      }
      decode_nbits_range(row, bits, whole * 4, count - whole * 4, out + whole * 4);
      return;
    }
    default: {  // 3, 5, 6, 7: every 8 codes fill exactly `bits` bytes; read them as one integer
      const uint64_t mask = (uint64_t{1} << bits) - 1;
      const int64_t groups = count / 8;
      for (int64_t g = 0; g < groups; ++g) {
        uint64_t window = 0, codes = 0;
        std::memcpy(&window, row + g * bits, static_cast<size_t>(bits));  // little-endian (x86-64, ARM64)
        for (int j = 0; j < 8; ++j) codes |= ((window >> (j * bits)) & mask) << (8 * j);
        std::memcpy(out + 8 * g, &codes, 8);  // one store for 8 codes
      }
      decode_nbits_range(row, bits, groups * 8, count - groups * 8, out + groups * 8);
    }
  }
}

void decode_nbits_range(const uint8_t* row, int64_t bits, int64_t first, int64_t count, uint8_t* out) {
  if (bits == 8) {
    std::memcpy(out, row + first, static_cast<size_t>(count));
    return;
  }
  const unsigned mask = (1u << bits) - 1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t bit = (first + i) * bits, byte = bit / 8;
    const int shift = static_cast<int>(bit % 8);
    unsigned window = row[byte];
    if (shift + bits > 8) window |= static_cast<unsigned>(row[byte + 1]) << 8;  // only when needed: no over-read
    out[i] = static_cast<uint8_t>((window >> shift) & mask);
  }
}

namespace {

// Round half to even of |v| < 2^22 under the default rounding mode: adding 1.5 * 2^23 leaves no
// fraction bits, so the float32 sum is the rounded value (plus the constant), exactly as
// nearbyint rounds; unlike a libm call it vectorizes. (No -ffast-math here: the sum is not folded.)
float round_half_even_small(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

}  // namespace

void quantize_a_block(const float* a, int64_t count, int64_t block_size, int8_t* q, float& scale, float& block_sum) {
  const float tiny = 127.0f / std::numeric_limits<float>::max();  // below it 127 / max|a| overflows
  // max|a| as the largest bit pattern of |a| (non-negative floats order as their bits do): an
  // integer reduction that vectorizes, and at or above infinity's pattern the block is not finite
  uint32_t amax_bits = 0;
  for (int64_t j = 0; j < count; ++j) {
    uint32_t bits;
    std::memcpy(&bits, a + j, 4);
    amax_bits = std::max(amax_bits, bits & 0x7FFFFFFFu);
  }
  float amax;
  std::memcpy(&amax, &amax_bits, 4);
  if (amax_bits >= 0x7F800000u) {
    std::fill(q, q + block_size, int8_t{0});
    scale = block_sum = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  int32_t sum = 0;
  if (amax > 0.0f && amax < tiny) {  // 127 / amax overflows: the exact ratio, in float64
    for (int64_t j = 0; j < count; ++j) {
      q[j] = static_cast<int8_t>(std::nearbyint(static_cast<double>(a[j]) * 127.0 / amax));
      sum += q[j];
    }
  } else {
    // float32 product, round half to even; |a * inverse| <= 127 (plus rounding) < 2^22
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t j = 0; j < count; ++j) {
      q[j] = static_cast<int8_t>(round_half_even_small(a[j] * inverse));
      sum += q[j];
    }
  }
  std::fill(q + count, q + block_size, int8_t{0});
  scale = amax / 127.0f;
  block_sum = scale * static_cast<float>(sum);
}

void quantize_a_int8_rows(const float* A, int64_t m0, int64_t m1, int64_t K, int64_t block_size, int8_t* qa,
                          float* scale, float* block_sum) {
  const int64_t k_blocks = (K + block_size - 1) / block_size, padded = k_blocks * block_size;
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t b = 0; b < k_blocks; ++b)
      quantize_a_block(A + m * K + b * block_size, std::min(block_size, K - b * block_size), block_size,
                       qa + m * padded + b * block_size, scale[m * k_blocks + b], block_sum[m * k_blocks + b]);
}

void quantize_a_int8(NBitsQuantizeA rows, const float* A, int64_t M, int64_t K, int64_t block_size, int8_t* qa,
                     float* scale, float* block_sum) {
  if (!rows) rows = quantize_a_int8_rows;
  // Rows are independent: spread them when there are enough (about 256 KiB of A per task: the AVX2
  // rows quantize about 2 values per nanosecond on Zen 4, so a task is some 30 us, about what
  // waking a helper costs on a VM). The caller's ParallelRegion has the helpers awake by now, but
  // smaller tasks measured no better (64 and 32 KiB: 1-3 % at 64-256 rows of 384-1536, 0.92x at
  // 4x4096x4096 on 2 threads, Zen 4).
  const int64_t rows_per_task = std::max<int64_t>(1, 65536 / std::max<int64_t>(K, 1));
  const int64_t tasks = (M + rows_per_task - 1) / rows_per_task;
  if (tasks <= 1) return rows(A, 0, M, K, block_size, qa, scale, block_sum);
  parallel_for(tasks, [&](int64_t task) {
    const int64_t m0 = task * rows_per_task;
    rows(A, m0, std::min(M, m0 + rows_per_task), K, block_size, qa, scale, block_sum);
  });
}

void matmul_nbits_int8(const float* A, int64_t M, const NBitsWeight& w, const float* bias, float* Y) {
  matmul_nbits_int8(nbits_kernels(), A, M, w, bias, Y);  // one entry for the preparation and the products
}

void matmul_nbits_int8(const NBitsDispatch& kernels, const float* A, int64_t M, const NBitsWeight& w, const float* bias,
                       float* Y) {
  const NBitsInt8Tiling& tiling = kernels.int8_tiling;
  const bool tiled = tiling.min_rows > 0 && M >= tiling.min_rows;
  const int64_t padded = w.k_blocks * w.block_size;
  const int64_t rows = tiled ? (M + tiling.row_group - 1) / tiling.row_group * tiling.row_group : M;
  // Untiled: tasks of contiguous runs of 16-column calls, up to 256 columns while that leaves four
  // tasks per thread, so that each thread streams long runs of the weight (a one-row call at 2
  // threads, weights from memory: 4-18 % faster than tasks of 16 columns taken in turn).
  const int64_t step = tiled ? tiling.columns : 16;
  const int64_t run = w.N / (4 * static_cast<int64_t>(get_num_threads())) / 16 * 16;
  const int64_t columns = tiled ? tiling.columns : std::max<int64_t>(16, std::min<int64_t>(256, run));
  const int64_t column_tasks = (w.N + columns - 1) / columns;
  // Tiled: ranges of whole row groups (the last one takes the rows left over) where the column tasks
  // alone would leave threads idle, since each range decodes its columns' codes again.
  const int64_t groups = tiled ? M / tiling.row_group : 0;
  const int64_t wanted = (2 * static_cast<int64_t>(get_num_threads()) + column_tasks - 1) / column_tasks;
  const int64_t ranges = std::max<int64_t>(1, std::min(groups, wanted));
  // About 30 multiply-adds per nanosecond on one thread (AVX2 on a decode; wider tables do more):
  // a small call stays on fewer threads.
  const double task_ns = static_cast<double>(columns) * static_cast<double>(w.K) * static_cast<double>(M) /
                         static_cast<double>(ranges) / 30.0;
  const int64_t per_thread = tasks_worth_a_thread(task_ns);
  // The helpers the products want, woken before A's quantization (on the caller alone below 256
  // KiB of A): their wake-up overlaps it instead of following it (64x384x384 on 2 threads 1.30x).
  const ParallelRegion region(
      static_cast<int>(std::min<int64_t>(get_num_threads(), column_tasks * ranges / per_thread)));
  std::vector<int8_t> qa(static_cast<size_t>(rows * padded));  // zeros: the rows past M stay so
  std::vector<float> scale(static_cast<size_t>(M * w.k_blocks)), block_sum(scale.size());
  quantize_a_int8(kernels.quantize_a, A, M, w.K, w.block_size, qa.data(), scale.data(), block_sum.data());
  if (kernels.prepare_int8) {
    // Tiled: in ranges of whole row groups on the threads, at least 64 K values each (the entry
    // rearranges each group on its own; the last range takes the rows past the last whole group,
    // so each has at least min_rows rows). At M = 128, K = 4096 the AMX entry's tile layout moves
    // 512 KB twice: on the caller alone while the helpers waited.
    const int64_t full_groups = tiled ? M / tiling.row_group : 0;
    const int64_t parts =
        std::max<int64_t>(1, std::min({full_groups, static_cast<int64_t>(get_num_threads()), M * padded / 65536}));
    parallel_for(parts, [&](int64_t part) {
      const int64_t m0 = full_groups * part / parts * tiling.row_group;
      const int64_t m1 = part + 1 == parts ? M : full_groups * (part + 1) / parts * tiling.row_group;
      kernels.prepare_int8(qa.data() + m0 * padded, m1 - m0, w);
    });
  }
  const NBitsRowsInt8 rows_int8 = kernels.rows_int8;
  const QuantizedA a{qa.data(), scale.data(), block_sum.data(), M, padded};
  parallel_for(
      column_tasks * ranges,
      [&](int64_t task) {
        const int64_t n0 = task / ranges * columns, range = task % ranges;
        const int64_t m0 = range * groups / ranges * tiling.row_group;
        const int64_t m1 = range + 1 == ranges ? M : (range + 1) * groups / ranges * tiling.row_group;
        const QuantizedA view{a.qa + m0 * padded, a.scale + m0 * w.k_blocks, a.block_sum + m0 * w.k_blocks, m1 - m0,
                              padded};
        for (int64_t c0 = n0; c0 < std::min(w.N, n0 + columns); c0 += step)
          rows_int8(view, w, c0, std::min(w.N, c0 + step), bias, Y + m0 * w.N);
      },
      per_thread);
}

namespace {

constexpr int64_t kQuadsMaxBlockSize = 4096;  // 127 * 255 * 4096 < 2^31

int64_t quads_packed_bytes(const NBitsWeight& w) {
  if (w.g_idx || w.block_size > kQuadsMaxBlockSize || w.block_size % 8) return 0;
  return (w.N + kQuadsPanel - 1) / kQuadsPanel * w.k_blocks * quads_block_bytes(w);
}

void quads_pack(const NBitsWeight& w, int64_t p0, int64_t p1, uint8_t* codes, float* floats) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, S = quads_storage_bits(w.bits), Q = 8 / S;
  const int64_t groups = bs / 4 / Q;  // groups of Q quads per block: 64 bytes each
  std::vector<uint8_t> columns(static_cast<size_t>(kQuadsPanel * padded));
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t c = 0; c < kQuadsPanel; ++c) {
      const int64_t n = p * kQuadsPanel + c;
      uint8_t* column = columns.data() + c * padded;
      if (n < w.N) decode_nbits(w.codes + n * w.row_bytes, w.bits, padded, column);
      else std::memset(column, 0, static_cast<size_t>(padded));  // past N: code 0 (scale 0 there: quads_block_data)
      if (w.bits == 8)
        for (int64_t k = 0; k < padded; ++k) column[k] ^= 0x80;
    }
    float* const scales = floats + (p - p0) * quads_panel_floats(w);
    float* const rest = scales + kQuadsPanel * kb;
    quads_block_data(w, p * kQuadsPanel, scales, rest, reinterpret_cast<uint8_t*>(rest));
    const int64_t used = kQuadsPanel * kb + (w.zero_points_u8 ? 4 : kQuadsPanel) * kb;
    std::fill(scales + used, scales + quads_panel_floats(w), 0.0f);  // the rounding up to 64 bytes
    uint8_t* out = codes + (p - p0) * kb * quads_block_bytes(w);
    for (int64_t b = 0; b < kb; ++b)
      for (int64_t g = 0; g < groups; ++g, out += 64)
        for (int64_t c = 0; c < kQuadsPanel; ++c)
          for (int64_t i = 0; i < 4; ++i) {
            const uint8_t* column = columns.data() + c * padded + b * bs + i;
            unsigned byte = 0;
            for (int64_t j = 0; j < Q; ++j) byte |= unsigned{column[4 * (g * Q + j)]} << (S * j);
            out[4 * c + i] = static_cast<uint8_t>(byte);
          }
  }
}

void quads_unpack(const NBitsWeight& w, const uint8_t* packed_codes, uint8_t* codes) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, S = quads_storage_bits(w.bits), Q = 8 / S;
  const int64_t bytes = quads_block_bytes(w);
  const unsigned mask = (1u << S) - 1;
  std::memset(codes, 0, static_cast<size_t>(w.N * w.row_bytes));
  for (int64_t n = 0; n < w.N; ++n) {
    const uint8_t* panel = packed_codes + n / kQuadsPanel * kb * bytes;
    const int64_t c = n % kQuadsPanel;
    uint8_t* row = codes + n * w.row_bytes;
    for (int64_t k = 0; k < padded; ++k) {
      const int64_t quad = (k % bs) / 4;
      unsigned code = (panel[k / bs * bytes + 64 * (quad / Q) + 4 * c + k % 4] >> (S * (quad % Q))) & mask;
      if (w.bits == 8) code ^= 0x80;
      encode_nbits_code(row, w.bits, k, code);
    }
  }
}

void quads_unpack_floats(const NBitsWeight& w, float* scales, void* zero_points) {
  const int64_t kb = w.k_blocks;
  for (int64_t n = 0; n < w.N; ++n)
    for (int64_t b = 0; b < kb; ++b) {
      float zp;
      block_scale_and_zero_point(w, n, b, scales[n * kb + b], zp);
      if (w.packed->u8_zero_points) static_cast<uint8_t*>(zero_points)[n * kb + b] = static_cast<uint8_t>(zp);
      else static_cast<float*>(zero_points)[n * kb + b] = zp;
    }
}

}  // namespace

const NBitsLayout kNBitsQuads16 = {.name = "quads x16",
                                   .panel_columns = kQuadsPanel,
                                   .packed_bytes = quads_packed_bytes,
                                   .pack = quads_pack,
                                   .panel_floats = quads_panel_floats,
                                   .unpack = quads_unpack,
                                   .unpack_floats = quads_unpack_floats};

NBitsWeight packed_nbits_weight(const PackedNBits& packed, const NBitsPacked& view) {
  NBitsWeight w{};
  w.N = packed.N;
  w.K = packed.K;
  w.bits = packed.bits;
  w.block_size = packed.block_size;
  w.k_blocks = packed.k_blocks;
  w.row_bytes = packed.row_bytes;
  w.packed = &view;
  return w;
}

void unpack_nbits_weight(const PackedNBits& packed, uint8_t* codes) {
  const NBitsPacked view = packed.view();
  packed.layout->unpack(packed_nbits_weight(packed, view), packed.codes.get(), codes);
}

void unpack_nbits_floats(const PackedNBits& packed, float* scales, void* zero_points) {
  const NBitsPacked view = packed.view();
  packed.layout->unpack_floats(packed_nbits_weight(packed, view), scales, zero_points);
}

PackedNBits pack_nbits_weight(const NBitsLayout* layout, const NBitsWeight& w) {
  PackedNBits packed;
  const int64_t bytes = layout ? layout->packed_bytes(w) : 0;
  if (bytes == 0) return packed;
  const int64_t panels = (w.N + layout->panel_columns - 1) / layout->panel_columns;
  const int64_t per_panel = bytes / panels;
  packed.layout = layout;
  packed.N = w.N;
  packed.K = w.K;
  packed.bits = w.bits;
  packed.block_size = w.block_size;
  packed.k_blocks = w.k_blocks;
  packed.row_bytes = w.row_bytes;
  packed.u8_zero_points = w.zero_points_u8 != nullptr;
  packed.code_bytes = bytes;
  packed.codes = alloc_buffer<uint8_t>(static_cast<size_t>(bytes));
  const int64_t floats_per_panel = layout->panel_floats(w);
  packed.float_count = panels * floats_per_panel;
  packed.floats = alloc_buffer<float>(static_cast<size_t>(packed.float_count));
  // Tasks of whole panels, about 64 KB of codes each.
  const int64_t step = std::max<int64_t>(1, 65536 / std::max<int64_t>(per_panel, 1));
  parallel_for((panels + step - 1) / step, [&](int64_t task) {
    const int64_t p0 = task * step, p1 = std::min(panels, p0 + step);
    layout->pack(w, p0, p1, packed.codes.get() + p0 * per_panel, packed.floats.get() + p0 * floats_per_panel);
  });
  return packed;
}

void matmul_nbits_f32(const float* A, int64_t M, const NBitsWeight& w, const float* bias, float* Y) {
  matmul_nbits_f32(nbits_kernels(), A, M, w, bias, Y);  // one entry for the preparation and the products
}

void matmul_nbits_f32(const NBitsDispatch& kernels, const float* A, int64_t M, const NBitsWeight& w, const float* bias,
                      float* Y) {
  // Few rows: wider tasks, so that per-task preparation of A (a reordering) is amortized: 64
  // columns; at levels 0/1 without g_idx (the "quads x16" kernels, which pad A's rows and sum its
  // blocks per task) up to 512 where that still leaves four tasks per thread (at M = 1, K = N = 4096,
  // one thread, that preparation took 12 % of the kernel's time in tasks of 64: Zen 4). More rows:
  // the entry's panel width.
  const bool quads_rows = w.operands == NBitsOperands::kFloat32 && !w.g_idx;
  const int64_t few_columns = quads_rows ? std::clamp<int64_t>(w.N / (4 * get_num_threads()) / 64 * 64, 64, 512) : 64;
  const int64_t columns_per_task = M <= 12                            ? few_columns
                                   : kernels.rows_prefill_columns > 0 ? kernels.rows_prefill_columns
                                                                      : 16;
  const int64_t tasks = (w.N + columns_per_task - 1) / columns_per_task;
  // About 15 multiply-adds per nanosecond on one thread (AVX2 level 0 on a decode).
  const double task_ns =
      static_cast<double>(columns_per_task) * static_cast<double>(w.K) * static_cast<double>(M) / 15.0;
  const int64_t per_thread = tasks_worth_a_thread(task_ns);

  // A rounded to the operand type (levels 2/3) and reordered for the entry's kernels (prepare_f32),
  // once per call, in parts on the threads of at least 64 K floats each (a serial pass would not
  // scale with them: at M = 128, K = 4096 A is 2 MB); below two parts by the caller alone. The
  // helpers the products want are woken first (a ParallelRegion), so that their wake-up overlaps
  // these steps and the jobs follow one another without one each.
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), M * w.K / 65536));
  const bool rounds = w.operands != NBitsOperands::kFloat32;
  const bool reorders = kernels.prepare_f32 && M > 1 && kernels.prepare_f32(A, M, w, nullptr, 0, 1);
  const ParallelRegion region(static_cast<int>(std::min<int64_t>(get_num_threads(), tasks / per_thread)));
  const NBitsRows rows = kernels.rows;
  std::unique_ptr<float[]> rounded;  // levels 2/3: A rounded to the operand type
  if (rounds) {
    rounded.reset(new float[static_cast<size_t>(M * w.K)]);
    const int64_t count = M * w.K;
    parallel_for(parts, [&](int64_t part) {
      int64_t first, last;
      prepare_share(count, part, parts, first, last);
      std::copy(A + first, A + last, rounded.get() + first);
      if (kernels.round_operands) kernels.round_operands(rounded.get() + first, last - first, w.operands);
      else
        for (int64_t i = first; i < last; ++i) rounded[i] = round_operand(rounded[i], w.operands);
    });
    A = rounded.get();
  }
  std::unique_ptr<float[]> prepared;  // uninitialized: the hook writes all of it
  if (reorders) {
    prepared.reset(new float[static_cast<size_t>(M * w.K)]);
    parallel_for(parts, [&](int64_t part) { kernels.prepare_f32(A, M, w, prepared.get(), part, parts); });
    A = prepared.get();
  }
  parallel_for(
      tasks,
      [&](int64_t task) {
        const int64_t n0 = task * columns_per_task;
        rows(A, M, w, n0, std::min(w.N, n0 + columns_per_task), bias, Y);
      },
      per_thread);
}

}  // namespace qmm
