#include "ops/expert_load.h"

#include "ops/dispatch.h"

namespace mt::ops {

void expert_load_count(Context& ctx, const Tensor& offsets, const Tensor& slot_expert,
                       Tensor& load) {
  MT_CHECK(offsets.ndim() == 1 && offsets.dim(0) >= 1 && offsets.dtype() == DType::I32, ShapeError,
           "expert_load_count offsets must be i32 [slots + 1], got ", offsets.shape(), " ",
           dtype_name(offsets.dtype()));
  const int64_t S = offsets.dim(0) - 1;
  if (slot_expert.defined() && slot_expert.numel()) {
    expect_shape(slot_expert, {S}, "expert_load_count slot_expert");
    MT_CHECK(slot_expert.dtype() == DType::I32, ShapeError,
             "expert_load_count slot_expert must be i32");
  }
  MT_CHECK(load.ndim() == 1 && load.dtype() == DType::I64, ShapeError,
           "expert_load_count load must be i64 [experts], got ", load.shape(), " ",
           dtype_name(load.dtype()));
  expect_shape(load, load.shape(), "expert_load_count load");
  dispatch(MT_OP_BODIES(expert_load_count), {&offsets, &slot_expert, &load}, ctx, offsets,
           slot_expert, load);
}

void map_ids(Context& ctx, Tensor& ids, const Tensor& table) {
  MT_CHECK(ids.dtype() == DType::I32 && table.dtype() == DType::I32 && table.ndim() == 1,
           ShapeError, "map_ids: ids ", ids.shape(), " ", dtype_name(ids.dtype()), ", table ",
           table.shape(), " ", dtype_name(table.dtype()),
           "; expected i32 ids and an i32 [n] table");
  expect_shape(ids, ids.shape(), "map_ids ids");
  dispatch(MT_OP_BODIES(map_ids), {&ids, &table}, ctx, ids, table);
}

}  // namespace mt::ops
