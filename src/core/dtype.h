// Element types and devices. Compute is fp32; bf16 is a storage format converted on load/store.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/names.h"

namespace mt {

// F64 holds per-step scalars that the trainer reads once a step (losses, norms), never weights.
enum class DType : uint8_t { F32, BF16, I32, I64, F64 };
enum class Device : uint8_t { CPU, CUDA };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
    case DType::F64:
      return 8;
  }
  return 0;
}

inline constexpr EnumName<DType> kDTypeNames[] = {{DType::F32, "f32"},
                                                  {DType::BF16, "bf16"},
                                                  {DType::I32, "i32"},
                                                  {DType::I64, "i64"},
                                                  {DType::F64, "f64"}};
static_assert(std::size(kDTypeNames) == static_cast<size_t>(DType::F64) + 1);

constexpr std::string_view dtype_name(DType t) {
  return name_of(kDTypeNames, t);
}

constexpr std::string_view device_name(Device d) {
  return d == Device::CPU ? "cpu" : "cuda";
}

// bf16 is the upper half of an fp32; round to nearest even, NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace mt
